// Dense layers on CUDA: Linear forward/backward through cuBLASLt (bias and
// ReLU fused into the GEMM epilogue) with a cuBLAS fallback, the DLRM dot
// interaction and BCE-with-logits. Each is the device twin of the CPU
// function named in its comment, with the same layouts (row-major,
// weights [out x in]). All pointers are device pointers; work is queued on
// the context's stream. Built when CUDA is enabled (DLRM_WITH_CUDA).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/cuda/cuda_raii.h"
#include "dense/interaction.h"
#include "optim/rules.h"

namespace dlrm::dense::cuda {

struct GemmOptions {
  // Let float GEMMs run on the tensor cores in TF32 (10-bit mantissa
  // products, float accumulation): several times faster on A100/H100, with
  // relative errors near 1e-3 instead of 1e-6. Default: false (results
  // match the CPU backend within float tolerance).
  bool allow_tf32 = false;
  // Use cuBLASLt with the bias/ReLU epilogue for Linear forward; false runs
  // cuBLAS plus a separate bias/ReLU kernel. Default: true.
  bool use_lt_epilogue = true;
  // cuBLASLt workspace, bytes. Default: 32 MiB (what cuBLAS uses on Hopper).
  size_t workspace_bytes = size_t{32} << 20;

  absl::Status Validate() const;
};

// The handles and scratch one stream's dense work needs. Not thread-safe:
// one per stream (per rank's compute stream).
class BlasContext {
 public:
  // Handles bound to `stream` (borrowed; must outlive the context).
  // InvalidArgument for bad options; Internal on CUDA/cuBLAS errors.
  static absl::StatusOr<std::unique_ptr<BlasContext>> Create(
      cudaStream_t stream, const GemmOptions& options = {});

  cudaStream_t stream() const { return stream_; }
  const GemmOptions& options() const { return options_; }
  cublasHandle_t cublas() const { return cublas_.get(); }
  cublasLtHandle_t lt() const { return lt_.get(); }
  void* lt_workspace() const { return workspace_.data(); }
  // Reusable float scratch of at least `floats` elements (valid until the
  // next call).
  absl::StatusOr<float*> Scratch(size_t floats);

 private:
  BlasContext() = default;
  cudaStream_t stream_ = nullptr;
  GemmOptions options_;
  dlrm::cuda::CublasHandle cublas_;
  dlrm::cuda::CublasLtHandle lt_;
  dlrm::cuda::RawDeviceBuffer workspace_;
  dlrm::cuda::DeviceBuffer<float> scratch_;
};

// dense::Linear::Forward: y [batch x out] = act(x [batch x in] W^T + b),
// W [out x in], act ReLU when `relu`. InvalidArgument for non-positive
// in/out or negative batch; Internal on cuBLAS errors.
absl::Status LinearForward(BlasContext* ctx, const float* x, int64_t batch,
                           int in, int out, const float* w, const float* b,
                           bool relu, float* y);

// dense::Linear::Backward: with x, y this layer's forward input and output,
// overwrites dy with the gradient wrt the pre-activation (ReLU mask), writes
// dw [out x in], db [out] and, unless null, dx [batch x in]. db is summed in
// the CPU kernel's order (blocks of 64 rows, then blocks in order), so it
// matches it bitwise. A batch of 0 zeroes dw and db.
absl::Status LinearBackward(BlasContext* ctx, const float* x, const float* y,
                            float* dy, int64_t batch, int in, int out,
                            const float* w, bool relu, float* dw, float* db,
                            float* dx);

// dense::DotInteractionForward: t [batch x n x d] -> z [batch x
// DotInteractionDim(n, d)], in the CPU reference's order of operations
// (equal up to the host compiler's fused multiply-adds). InvalidArgument
// when n * d floats do not fit in 48 KiB of shared memory.
absl::Status DotInteractionForward(const float* t, int64_t batch, int n, int d,
                                   float* z, cudaStream_t stream);

// dense::DotInteractionBackward: writes dt [batch x n x d] from dz, in the
// CPU reference's order of operations.
absl::Status DotInteractionBackward(const float* t, const float* dz,
                                    int64_t batch, int n, int d, float* dt,
                                    cudaStream_t stream);

// dense::InteractionForward / InteractionBackward: the interaction of
// `shape` on the device (each interaction's case is in dense_kernels.cu).
// Queue nothing for an identity interaction (never called for one).
// InvalidArgument as that interaction's kernel.
absl::Status InteractionForward(const InteractionShape& shape, const float* t,
                                int64_t batch, float* z, cudaStream_t stream);
absl::Status InteractionBackward(const InteractionShape& shape, const float* t,
                                 const float* dz, int64_t batch, float* dt,
                                 cudaStream_t stream);

// dense::BceWithLogits: writes dlogits (unless null) and the mean loss to
// *loss_device (one double, device memory), in double precision like the
// CPU version; the sum runs in a fixed order, so it is deterministic (not
// the CPU's order: agreement is within double rounding). A batch of 0 gives
// loss 0.
absl::Status BceWithLogits(const float* logits, const float* labels,
                           int64_t batch, float grad_scale, float* dlogits,
                           double* loss_device, cudaStream_t stream);

// dense::DenseOptimizer::Step for one parameter of n floats: applies the
// rule of `step` (its constants, from optim::MakeStep; the rule's
// DenseElement, optim/rules.h, the function the CPU runs) to `param` from
// `grad`, with state1 / state2 its kDenseState arrays (null where the rule
// has fewer). InvalidArgument for n < 0.
absl::Status DenseOptimizerUpdate(const optim::AnyStep& step, float* param,
                                  const float* grad, float* state1,
                                  float* state2, int64_t n,
                                  cudaStream_t stream);

// Kernels the GEMM code uses (dense_kernels.cu).
namespace internal {
// y[r, :] = act(y[r, :] + b) for `rows` rows of width `out`.
absl::Status AddBiasAct(float* y, const float* b, int64_t rows, int out,
                        bool relu, cudaStream_t stream);
// Masks dy by y > 0 when `relu` and writes column sums in the CPU's block
// order to db; `partial` holds ceil(rows / 64) * out floats.
absl::Status MaskAndBiasGrad(float* dy, const float* y, int64_t rows, int out,
                             bool relu, float* partial, float* db,
                             cudaStream_t stream);
// The number of row blocks MaskAndBiasGrad sums separately.
int64_t BiasGradBlocks(int64_t rows);
}  // namespace internal

}  // namespace dlrm::dense::cuda
