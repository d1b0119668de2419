// The device-memory tier of an embedding table: weights and optimizer state
// in GPU memory, driven by the CUDA kernels (embedding_kernels.h) with the
// same semantics as EmbeddingTable on the CPU, which it loads from and
// saves to. Built when CUDA is enabled (DLRM_WITH_CUDA).
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
  // checks) to the device, synchronously; buffers grow and are reused.
  // Internal or ResourceExhausted on CUDA errors.
  absl::Status Upload(const data::SparseFeature& feature);
  // A view of the uploaded ids, valid until the next Upload.
  DeviceBags bags() const;

 private:
  dlrm::cuda::DeviceBuffer<int64_t> offsets_, ids_;
  int64_t num_bags_ = 0, num_ids_ = 0;
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
  // the CPU table does.
  absl::Status BackwardUpdate(const DeviceBags& bags, const float* grad,
                              int64_t grad_stride, cudaStream_t stream);

  int64_t rows() const { return rows_; }
  int dim() const { return dim_; }
  int64_t step() const { return step_; }
  // rows x dim, row-major, device memory.
  float* weights() { return weights_.data(); }
  const float* weights() const { return weights_.data(); }

 private:
  CudaEmbeddingTable() = default;

  int64_t rows_ = 0;
  int dim_ = 0;
  bool mean_ = false;
  OptimizerConfig optimizer_;
  int64_t step_ = 0;
  dlrm::cuda::DeviceBuffer<float> weights_, state1_, state2_;
  BackwardWorkspace workspace_;
};

}  // namespace dlrm::embedding::cuda
