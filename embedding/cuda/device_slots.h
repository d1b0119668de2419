// A cache's slots in device memory (SlotStorage over a CudaEmbeddingTable
// whose rows are slots), and the device tier's cached store: those slots in
// front of the whole table in host memory or RocksDB (CachedStore over a
// HostStore or a RocksDbCachedStore).
// Built when CUDA is enabled (DLRM_WITH_CUDA); this header itself needs no
// CUDA headers.
#pragma once

#include <cstdint>
#include <memory>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "data/batch.h"
#include "embedding/cached_store.h"
#include "embedding/embedding_store.h"

namespace dlrm::embedding::cuda {

// Slots in the memory of CUDA device 0, driven by the CUDA kernels
// (embedding_kernels.h) on one stream, the one given at creation or one of
// its own. ReadSlots / WriteSlots move records through pinned host staging
// and device packing buffers in chunks of at most 16 MiB, two used in turn
// (an event each), with the GatherRows / ScatterRows kernels: ReadSlots
// unpacks chunk k while chunk k + 1's copy runs and returns once all are
// done; WriteSlots packs chunk k + 1 while chunk k's copy runs and returns
// once all are queued.
// MapHostTable pins a host table's arrays and maps them for the device;
// LoadRows / StoreRows then only queue the LoadRecords / StoreRecords
// kernels, which read and write those arrays over the bus, after the
// row and slot numbers' upload (two pinned index buffers used in turn, each
// refilled only once its last upload is done).
// SetBatch queues the slot ids' upload (StagedSparseFeature: it waits only
// for the batch before the previous one to release its id slot). Forward and
// BackwardUpdate only queue their kernels, as CudaStore's do: `out` and
// `grad` are device memory (InvalidArgument otherwise). Not thread-safe.
class DeviceSlots final : public SlotStorage {
 public:
  // `slots` slots of `spec`'s dim, pooling and optimizer, uninitialised
  // (CachedStore writes a slot before anything reads it). `stream` (a
  // cudaStream_t of device 0) is borrowed until the slots are destroyed; null:
  // they create their own. InvalidArgument for a bad spec, slots not positive
  // or a dim over the kernels' MaxDim; FailedPrecondition naming
  // CudaUnavailableReason() without a device; ResourceExhausted when device
  // memory runs out; Internal on other CUDA errors.
  static absl::StatusOr<std::unique_ptr<DeviceSlots>> Create(
      const TableSpec& spec, int64_t slots, void* stream = nullptr);

  // Waits for the stream's work before the device memory goes.
  ~DeviceSlots() override;

  MemorySpace memory_space() const override { return MemorySpace::kDevice; }
  int64_t slots() const override;
  absl::Status ReadSlots(const int64_t* slots, int64_t n,
                         float* records) override;
  absl::Status WriteSlots(const int64_t* slots, int64_t n,
                          const float* records) override;
  // Registers the pages of the table's non-empty arrays
  // (dlrm::cuda::HostRegistration; arrays that share a page as one range)
  // until the slots are destroyed or map another table. Where a
  // registration fails (a system that will not pin that much, a page
  // registered already by another table's cache) it writes one line to
  // stderr naming the table and the error, and returns false.
  bool MapHostTable(EmbeddingTable& table) override;
  // Internal on CUDA errors, also an earlier kernel's fault;
  // ResourceExhausted when the index buffers cannot grow.
  absl::Status LoadRows(const EmbeddingTable& table, const int64_t* rows,
                        const int64_t* slots, int64_t n) override;
  absl::Status StoreRows(const int64_t* slots, const int64_t* rows, int64_t n,
                         EmbeddingTable& table) override;
  // InvalidArgument for more than 2^31 - 1 ids or bags (the kernels'
  // limit); Internal on CUDA errors, also an earlier kernel's fault.
  absl::Status SetBatch(const data::SparseFeature& slot_ids) override;
  absl::Status Forward(float* out, int64_t out_stride) const override;
  absl::Status BackwardUpdate(const float* grad, int64_t grad_stride) override;
  absl::Status Synchronize() override;
  int64_t step() const override;
  void set_step(int64_t step) override;
  void set_optimizer(const OptimizerConfig& optimizer) override;

 private:
  struct Impl;
  explicit DeviceSlots(const TableSpec& spec);
  // Rows of one staging chunk.
  int64_t ChunkRows() const;
  // Waits until chunk k's (0 or 1) host buffers are no longer used by
  // queued work.
  absl::Status WaitForChunk(int k);
  // WaitForChunk(k), then sizes chunk k for `rows` rows and queues the
  // copy of slots[0, rows) to its device index buffer.
  absl::Status StageIndex(int k, const int64_t* slots, int64_t rows);
  // For each staging chunk of slots[0, n) in order, chunk k = 0, 1, 0, ...
  // holding rows [done, done + rows): StageIndex(k, slots + done, rows),
  // then chunk(k, done, rows). The first error stops it and is returned.
  absl::Status ForEachChunk(
      const int64_t* slots, int64_t n,
      absl::FunctionRef<absl::Status(int k, int64_t done, int64_t rows)> chunk);
  // FailedPrecondition unless `table` is the mapped table.
  absl::Status CheckMapped(const EmbeddingTable& table) const;
  // Queues the upload of a[0, n) then b[0, n) through the next of the two
  // pinned index buffers; returns the device copy (2n entries), valid for
  // work queued on the stream before the buffer's next use.
  absl::StatusOr<const int64_t*> UploadPairs(const int64_t* a, const int64_t* b,
                                             int64_t n);

  TableSpec spec_;
  std::unique_ptr<Impl> impl_;
};

// The device tier with a cache (StoreOptions::device_cache.cache_rows >
// 0): a CachedStore of `cache` (at most spec.rows slots) over DeviceSlots
// on `stream` (as DeviceSlots::Create) and `backing`, a store of `spec`
// holding every row (null: a HostStore of `spec`). A HostStore's arrays
// are pinned and mapped for the slots (the direct path) when
// cache.direct_host_access; where that fails the store moves rows through
// staged copies instead (DeviceSlots::MapHostTable logs why). Errors as
// DeviceSlots::Create and CachedStore::Create.
absl::StatusOr<std::unique_ptr<CachedStore>> CreateDeviceCachedStore(
    const TableSpec& spec, const CacheOptions& cache, void* stream = nullptr,
    std::unique_ptr<EmbeddingStore> backing = nullptr);

}  // namespace dlrm::embedding::cuda
