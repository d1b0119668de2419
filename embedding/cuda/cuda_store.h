// The device-memory tier as an EmbeddingStore: every row of a table (or
// shard) and its optimizer state in the memory of CUDA device 0, pooled
// and updated by the CUDA kernels (embedding_kernels.h). Built when CUDA is
// enabled (DLRM_WITH_CUDA); this header itself needs no CUDA headers, so
// CPU files (CreateEmbeddingStore) include it under that switch.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "data/batch.h"
#include "embedding/embedding_store.h"

namespace dlrm::cuda {
class CudaStream;
}  // namespace dlrm::cuda

namespace dlrm::embedding::cuda {

class CudaEmbeddingTable;
class StagedSparseFeature;

// InvalidArgument naming `spec`'s table and `what` unless `ptr` is memory
// of a CUDA device (or managed memory): a kernel given a host pointer would
// fault, and the fault would end every later CUDA call of the process.
absl::Status CheckDevicePointer(const TableSpec& spec, const void* ptr,
                                const char* what);

// Makes CUDA device 0 current for `spec`'s device-tier store.
// FailedPrecondition naming the table and CudaUnavailableReason() when no
// CUDA device is usable; Internal on other CUDA errors.
absl::Status UseDeviceZero(const TableSpec& spec);

// InvalidArgument naming `spec`'s table when `ids` has more than 2^31 - 1
// ids or bags (the device kernels' limit).
absl::Status CheckKernelLimits(const TableSpec& spec,
                               const data::SparseFeature& ids);

// Rows in device memory, behaving as a HostStore of the same spec: the same
// initial rows, the same records (ReadRows / WriteRows), the same step
// counter; pooled values and updates equal the CPU's up to float rounding
// (docs/cuda.md "Numerics"). memory_space() is kDevice: Forward's `out` and
// BackwardUpdate's `grad` are device memory (InvalidArgument otherwise).
//
// Synchronisation: all work runs in order on one stream, the one given at
// creation or one the store owns.
// - Prepare checks the ids on the host and queues their upload
//   (StagedSparseFeature: two id slots used in turn, so it waits only for
//   the batch before the previous one to be done with the slot it
//   refills, never for the previous batch's kernels) and returns.
// - Forward and BackwardUpdate only queue their kernels and return. `out`
//   holds the pooled rows once the stream passes that point: after
//   Synchronize(), or for work the caller queues later on the same stream
//   (pass its stream at creation to order its work after the store's
//   without a host wait). `grad` must be complete for work queued on the
//   stream at the call (written by earlier work on that stream, or its
//   writer synchronised) and unchanged until the stream has passed the
//   update. A fault in queued work is returned by the next call that waits.
// - ReadRows, WriteRows and Synchronize wait for the stream: they see, and
//   come after, every earlier update. step() counts queued updates.
// Thread safety as EmbeddingStore: one caller at a time.
class CudaStore final : public EmbeddingStore {
 public:
  // A store for `spec` with every row at HostStore's initial record
  // (InitialRow, the optimizer's initial state), step 0. `stream` is a
  // cudaStream_t of device 0 the store queues its work on, borrowed until
  // the store is destroyed; null: the store creates its own.
  // InvalidArgument for a bad spec or a dim the kernels do not take
  // (MaxDim); FailedPrecondition naming CudaUnavailableReason() when no
  // CUDA device is usable; ResourceExhausted when device memory runs out;
  // Internal on other CUDA errors.
  static absl::StatusOr<std::unique_ptr<CudaStore>> Create(
      const TableSpec& spec, void* stream = nullptr);

  // Waits for the stream's work before the device memory goes.
  ~CudaStore() override;

  const TableSpec& spec() const override { return spec_; }
  MemorySpace memory_space() const override { return MemorySpace::kDevice; }
  // Returns &ids. InvalidArgument, naming the table, for malformed offsets
  // (offsets[0] != 0, decreasing, or the last not ids.size()), an id
  // outside [0, rows) (a device gather would read or write outside the
  // table) or more than 2^31 - 1 ids or bags (the kernels' limit); Internal
  // on CUDA errors, also an earlier queued kernel's fault.
  absl::StatusOr<const data::SparseFeature*> Prepare(
      const data::SparseFeature& ids) override;
  // Queued (see above). FailedPrecondition when `prepared` is not the last
  // successful Prepare's `ids`; InvalidArgument for an `out` that is not
  // device memory or a stride below dim.
  absl::Status Forward(const data::SparseFeature& prepared, float* out,
                       int64_t out_stride) const override;
  // Queued (see above); errors as Forward, for `grad`.
  absl::Status BackwardUpdate(const data::SparseFeature& prepared,
                              const float* grad, int64_t grad_stride) override;
  absl::Status Synchronize() override;
  // Every row is resident: nothing to stage.
  absl::Status Prefetch(const data::SparseFeature& next_ids) override {
    return absl::OkStatus();
  }
  // FailedPrecondition: the rows are read through the stream, which the
  // store's caller owns; they are not read beside it.
  absl::Status PoolReadOnly(const data::SparseFeature& ids, float* out,
                            int64_t out_stride) const override;
  absl::Status ReadRows(int64_t begin, int64_t count, float* out) override;
  absl::Status WriteRows(int64_t begin, int64_t count,
                         const float* records) override;
  // No backing tier: nothing to write.
  absl::Status Flush() override { return absl::OkStatus(); }
  int64_t step() const override;
  void set_step(int64_t step) override;
  absl::Status SetOptimizer(const OptimizerConfig& optimizer) override;
  // All zero: nothing is ever missed, evicted or read.
  StoreMetrics metrics() const override { return {}; }
  StoreCapabilities capabilities() const override {
    StoreOptions options;
    options.kind = StoreKind::kDevice;
    return TierCapabilities(options, spec_.rows);
  }
  // The rows and optimizer state, in device memory.
  StoreBytes MemoryBytes() const override {
    return {.device = spec_.rows * spec_.RecordFloats() *
                      static_cast<int64_t>(sizeof(float))};
  }
  // A host copy through ReadRows (SaveHostCopy).
  absl::Status Save(RowsSink& sink) override {
    return SaveHostCopy(*this, sink);
  }

 private:
  explicit CudaStore(const TableSpec& spec);

  // FailedPrecondition unless `prepared` is the last successful Prepare's.
  absl::Status CheckPrepared(const data::SparseFeature& prepared) const;
  // Floats of one record: dim weights + state.
  int64_t RecordFloats() const;
  // Rows per host staging chunk of ReadRows / WriteRows, and the staging
  // arrays sized for it.
  int64_t ChunkRows() const;
  void SizeStaging(int64_t rows);
  // Checks rows [begin, begin + count), sizes the staging arrays and calls
  // `chunk(done, rows)` for each staging chunk [begin + done, begin + done +
  // rows) in order; the first error stops it and is returned.
  absl::Status ForEachChunk(
      int64_t begin, int64_t count,
      absl::FunctionRef<absl::Status(int64_t done, int64_t rows)> chunk);
  // Writes the staged weights and state of rows [begin, begin + count).
  absl::Status WriteStaged(int64_t begin, int64_t count);

  TableSpec spec_;
  std::unique_ptr<CudaEmbeddingTable> table_;
  std::unique_ptr<StagedSparseFeature> ids_;
  // The stream every call uses (a cudaStream_t); owned_stream_ when the
  // store made it.
  void* stream_ = nullptr;
  std::unique_ptr<dlrm::cuda::CudaStream> owned_stream_;
  // The `ids` of the last successful Prepare, null after a failed one.
  const data::SparseFeature* prepared_ = nullptr;
  // Host staging of weights and state arrays for record copies.
  std::vector<float> weights_stage_, state_stage_[2];
};

}  // namespace dlrm::embedding::cuda
