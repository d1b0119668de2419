// An embedding table in device memory: weights and optimizer state in GPU
// memory, driven by the CUDA kernels (embedding_kernels.h) with the same
// semantics as EmbeddingTable on the CPU, which it loads from and saves to
// (whole, or by row ranges); CudaStore (cuda_store.h) is the storage tier
// over it. Built when CUDA is enabled (DLRM_WITH_CUDA).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/cuda/cuda_raii.h"
#include "data/batch.h"
#include "embedding/cuda/embedding_kernels.h"
#include "embedding/embedding_table.h"

namespace dlrm::embedding::cuda {

// One table's ids for a batch, copied to the device. Not thread-safe.
class DeviceSparseFeature {
 public:
  // Copies `feature` (offsets must be well formed, as Batch::Validate
  // checks) to the device on `stream`, after the work queued there, and
  // returns when the copy is done; buffers grow and are reused (work still
  // reading the previous upload must be done before the call: a buffer may
  // be freed and reallocated). Internal or ResourceExhausted on CUDA errors.
  absl::Status Upload(const data::SparseFeature& feature,
                      cudaStream_t stream = nullptr);
  // A view of the uploaded ids, valid until the next Upload.
  DeviceBags bags() const;

 private:
  dlrm::cuda::DeviceBuffer<int64_t> offsets_, ids_;
  int64_t num_bags_ = 0, num_ids_ = 0;
};

// One table's ids for a sequence of batches, copied to the device without
// the host waiting for the device: two slots, each with page-locked host
// staging and device buffers, used in turn. A slot is refilled only once
// the device work queued while it was last current has finished (an event
// recorded when the other slot takes over), so the host prepares batch
// k + 1 while batch k's kernels still read the other slot. Not
// thread-safe.
class StagedSparseFeature {
 public:
  // Copies `feature` (offsets well formed, as Batch::Validate checks) into
  // the next slot and queues its upload on `stream`, after waiting (on the
  // host) for the work queued while that slot was last current; returns
  // without waiting for the upload. Work reading bags() must be queued on
  // `stream` (or ordered after it) until the next Upload. Internal or
  // ResourceExhausted on CUDA errors (bags() is then empty).
  absl::Status Upload(const data::SparseFeature& feature, cudaStream_t stream);
  // A view of the last uploaded ids, valid until the next Upload.
  DeviceBags bags() const;

 private:
  struct Slot {
    dlrm::cuda::PinnedBuffer<int64_t> staging;  // offsets, then ids
    dlrm::cuda::DeviceBuffer<int64_t> offsets, ids;
    dlrm::cuda::CudaEvent
        released;         // recorded when the slot stops being current
    bool in_use = false;  // `released` recorded and not waited for
    int64_t num_bags = 0, num_ids = 0;
  };
  Slot slots_[2];
  int current_ = -1;  // -1: no upload yet, or the last one failed
};

// One table (or shard) in device memory. Forward may run concurrently with
// other Forwards on any stream; BackwardUpdate needs exclusive access (its
// workspace is shared).
class CudaEmbeddingTable {
 public:
  // Copies `table`'s weights, optimizer state and step counter to the
  // current CUDA device. InvalidArgument for a dim the kernels do not take
  // (over MaxDim) or an optimizer they do not know; ResourceExhausted when
  // device memory runs out; Internal on other CUDA errors.
  static absl::StatusOr<std::unique_ptr<CudaEmbeddingTable>> FromHost(
      const EmbeddingTable& table);

  // A `rows` x `dim` table with its optimizer state in the current CUDA
  // device's memory, step 0. Weights and state start uninitialised: the
  // caller writes every row (WriteRowRange) before the kernels use it.
  // `table_index` names the table in errors. InvalidArgument for rows or
  // dim not positive, a dim over MaxDim or an unknown optimizer;
  // ResourceExhausted when device memory runs out; Internal on other CUDA
  // errors.
  static absl::StatusOr<std::unique_ptr<CudaEmbeddingTable>> Create(
      int table_index, int64_t rows, int dim, Pooling pooling,
      const OptimizerConfig& optimizer);

  // Copies weights, state and step back into `table`, which must have the
  // same rows, dim and optimizer (InvalidArgument otherwise). Waits for all
  // queued device work first.
  absl::Status CopyToHost(EmbeddingTable* table) const;

  // EmbeddingTable::Forward on the device: pooled rows of `bags` into `out`
  // (device, row s at out + s * out_stride).
  absl::Status Forward(const DeviceBags& bags, float* out, int64_t out_stride,
                       cudaStream_t stream) const;

  // EmbeddingTable::BackwardUpdate on the device: one optimizer step on
  // every row in `bags` with its summed gradient from `grad` (device, row s
  // at grad + s * grad_stride). Counts a step even for an empty batch, as
  // the CPU table does, once the update is queued (a refused call counts
  // none).
  absl::Status BackwardUpdate(const DeviceBags& bags, const float* grad,
                              int64_t grad_stride, cudaStream_t stream);

  // Copies rows [begin, begin + count) out to host arrays, each row-major:
  // `weights` count x dim, `state1` / `state2` count x state_floats(0 / 1)
  // (null where that is 0). Queued on `stream` after its earlier work;
  // returns when the copy is done. InvalidArgument for a range outside
  // [0, rows); Internal on CUDA errors (also an earlier kernel's fault).
  absl::Status ReadRowRange(int64_t begin, int64_t count, float* weights,
                            float* state1, float* state2,
                            cudaStream_t stream) const;
  // Sets rows [begin, begin + count) from host arrays laid out as
  // ReadRowRange writes them; ordered and waited for as ReadRowRange.
  absl::Status WriteRowRange(int64_t begin, int64_t count, const float* weights,
                             const float* state1, const float* state2,
                             cudaStream_t stream);

  // Copies rows index[0, n) (device memory, distinct, in [0, rows); one
  // outside is skipped) into packed device arrays: `weights` n x dim,
  // `state1` / `state2` n x state_floats(0 / 1) (null where that is 0).
  // Queued on `stream`; InvalidArgument for n < 0, Internal on a launch
  // error.
  absl::Status GatherRows(const int64_t* index, int64_t n, float* weights,
                          float* state1, float* state2,
                          cudaStream_t stream) const;
  // Sets rows index[0, n) from packed device arrays laid out as GatherRows
  // writes them; queued and checked as GatherRows.
  absl::Status ScatterRows(const int64_t* index, int64_t n,
                           const float* weights, const float* state1,
                           const float* state2, cudaStream_t stream);

  int64_t rows() const { return rows_; }
  int dim() const { return dim_; }
  // Floats per row of state array k (0 or 1): the optimizer's kSparseState
  // arrays as EmbeddingTable keeps them (0 where the optimizer has none).
  int state_floats(int k) const { return state_floats_[k]; }
  int64_t step() const { return step_; }
  // As EmbeddingTable::set_optimizer: the constants of the next
  // BackwardUpdate on (queued after the updates before).
  void set_optimizer(const OptimizerConfig& optimizer) {
    optimizer_ = optimizer;
  }
  // For restores: the next BackwardUpdate is step `step` + 1.
  void set_step(int64_t step) { step_ = step; }
  // rows x dim, row-major, device memory.
  float* weights() { return weights_.data(); }
  const float* weights() const { return weights_.data(); }
  // State array k (0 or 1): rows x state_floats(k), device memory; null
  // where state_floats(k) is 0.
  float* state(int k) {
    if (state_floats_[k] == 0) return nullptr;
    return k == 0 ? state1_.data() : state2_.data();
  }

 private:
  CudaEmbeddingTable() = default;
  // state_floats_ from optimizer_ and dim_.
  void SetStateFloats();
  // InvalidArgument unless rows [begin, begin + count) lie in [0, rows).
  absl::Status CheckRows(int64_t begin, int64_t count) const;

  int64_t rows_ = 0;
  int dim_ = 0;
  bool mean_ = false;
  OptimizerConfig optimizer_;
  int state_floats_[2] = {0, 0};
  int64_t step_ = 0;
  dlrm::cuda::DeviceBuffer<float> weights_, state1_, state2_;
  BackwardWorkspace workspace_;
};

}  // namespace dlrm::embedding::cuda
