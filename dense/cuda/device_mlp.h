// An MLP on the device for the CUDA dense backend (cuda_backend.cc): its
// layers' buffers, and its training forward and backward and its
// inference forward, layer by layer through cuda_linear.cc (fp32, or at
// PRECISION_BF16 the bf16 layers reading bf16 copies of the weights).
// All pointers are device pointers; work is queued on the BlasContext's
// stream.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/cuda/cuda_raii.h"
#include "core/status.h"
#include "dense/cuda/cuda_dense.h"
#include "dense/linear.h"

namespace dlrm::dense::cuda {

// Grows `b` to at least `n` elements (contents lost when it grows) and
// returns its data.
template <typename T>
absl::StatusOr<T*> Sized(dlrm::cuda::DeviceBuffer<T>& b, int64_t n) {
  if (static_cast<int64_t>(b.size()) < n) {
    RETURN_IF_ERROR(b.Resize(static_cast<size_t>(n)));
  }
  return b.data();
}

// One Linear layer on the device: weights, gradients and its last training
// forward's output; at PRECISION_BF16 also the weights' bf16 copy and the
// output's (the next layer's input; not kept for the last layer).
struct DeviceLayer {
  int in = 0, out = 0;
  bool relu = false;
  dlrm::cuda::DeviceBuffer<float> w, b, dw, db, y;
  dlrm::cuda::DeviceBuffer<Bf16> wb, yb;
};

// An MLP on the device: its layers and, at PRECISION_BF16, its input's
// bf16 copy from the last training forward (the first layer's backward
// reads it).
struct DeviceMlp {
  std::vector<DeviceLayer> layers;
  dlrm::cuda::DeviceBuffer<Bf16> x_bf16;
};

// The scratch the passes below grow and reuse, shared by a backend's MLPs.
struct MlpScratch {
  // MlpTrainBackward's: alternate layers' input gradients, and at
  // PRECISION_BF16 the output gradient's bf16 copy.
  dlrm::cuda::DeviceBuffer<float> grad_a, grad_b;
  dlrm::cuda::DeviceBuffer<Bf16> dy_bf16;
  // MlpInfer's: the hidden outputs in turns, and at PRECISION_BF16 the
  // input and hidden outputs in bf16.
  dlrm::cuda::DeviceBuffer<float> infer;
  dlrm::cuda::DeviceBuffer<Bf16> infer_bf16;
};

// Allocates the device twin of `mlp`'s layers into `out` (with the bf16
// weight copies when `bf16`); the weights are not copied. Internal on CUDA
// errors.
absl::Status AllocateMlp(const Mlp& mlp, bool bf16, DeviceMlp* out);

// The training forward of `mlp` from x (device memory): each layer's
// output in its `y` (and, when `bf16`, the input's and each hidden layer's
// bf16 copies, as dense::Mlp::Forward); returns the last one's.
absl::StatusOr<const float*> MlpTrainForward(BlasContext* blas, bool bf16,
                                             DeviceMlp& mlp, const float* x,
                                             int64_t batch);

// The backward of MlpTrainForward(mlp, x, batch): dy is the gradient wrt
// the output (overwritten); fills every layer's gradients, and dx [batch x
// in] unless null. When `bf16`, the layers' bf16 backward, reading the
// forward's bf16 copies (x is then not read).
absl::Status MlpTrainBackward(BlasContext* blas, bool bf16, DeviceMlp& mlp,
                              const float* x, float* dy, int64_t batch,
                              float* dx, MlpScratch* scratch);

// The inference forward of `mlp` into `out`, keeping no activations; when
// `bf16` the training forward's bf16 arithmetic.
absl::Status MlpInfer(BlasContext* blas, bool bf16, const DeviceMlp& mlp,
                      const float* x, int64_t batch, float* out,
                      MlpScratch* buffers);

// Queues the rewrite of every layer's bf16 weight copy from its fp32
// weights (at PRECISION_BF16, after the weights change).
absl::Status SyncMlpBf16(DeviceMlp& mlp, cudaStream_t stream);

}  // namespace dlrm::dense::cuda
