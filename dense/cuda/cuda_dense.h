// Dense layers on CUDA: Linear forward/backward through cuBLASLt (bias and
// ReLU fused into the GEMM epilogue) with a cuBLAS fallback, in fp32 or
// (PRECISION_BF16) with bf16 inputs and fp32 accumulation, the DLRM dot
// interaction, the device interaction layers' interface and DCN's cross
// network, BCE-with-logits and the dense
// optimizers. Each is the device twin of the CPU function named in its
// comment, with the same layouts (row-major, weights [out x in]). All
// pointers are device pointers; work is queued on the context's stream.
// Built when CUDA is enabled (DLRM_WITH_CUDA).
#pragma once

#include <cuda_runtime_api.h>

#include <compare>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/cuda/cuda_raii.h"
#include "dense/bf16_round.h"
#include "dense/interaction.h"
#include "dlrm/config.pb.h"

namespace dlrm::dense::cuda {

struct GemmOptions {
  // Let float GEMMs run on the tensor cores in TF32 (10-bit mantissa
  // products, float accumulation): several times faster on A100/H100, with
  // relative errors near 1e-3 instead of 1e-6. Default: false (results
  // match the CPU backend within float tolerance); the CUDA dense backend
  // sets it from ModelConfig.gpu_disable_tf32, which leaves it on.
  bool allow_tf32 = false;
  // Use cuBLASLt with the bias/ReLU epilogue for Linear forward; false runs
  // cuBLAS plus a separate bias/ReLU kernel. Default: true.
  bool use_lt_epilogue = true;
  // cuBLASLt workspace, bytes. Default: 32 MiB (what cuBLAS uses on Hopper).
  size_t workspace_bytes = size_t{32} << 20;

  absl::Status Validate() const;
};

namespace internal {
class LtPlanCache;
}  // namespace internal

// The handles and scratch one stream's dense work needs, and the cuBLASLt
// plans LinearForward and LinearForwardBf16 have made (one per shape, data
// type and pointer alignments, see internal::LtPlanKey). Not thread-safe:
// one per stream (per rank's compute stream).
class BlasContext {
 public:
  ~BlasContext();

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
  // The cuBLASLt plans made so far (cuda_linear.cc).
  internal::LtPlanCache& lt_plans() { return *lt_plans_; }
  // How many plans are cached: LinearForward adds one per new key, keeping
  // the internal::kMaxLtPlans most recently used.
  size_t lt_plan_count() const;

 private:
  BlasContext();
  cudaStream_t stream_ = nullptr;
  GemmOptions options_;
  dlrm::cuda::CublasHandle cublas_;
  dlrm::cuda::CublasLtHandle lt_;
  dlrm::cuda::RawDeviceBuffer workspace_;
  dlrm::cuda::DeviceBuffer<float> scratch_;
  std::unique_ptr<internal::LtPlanCache> lt_plans_;
};

// dense::Linear::Forward: y [batch x out] = act(x [batch x in] W^T + b),
// W [out x in], act ReLU when `relu`; no bias when b is null. InvalidArgument
// for non-positive in/out or negative batch; Internal on cuBLAS errors.
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

// dense::Sgemm: row-major C [m x n] = op(A) [m x k] op(B) [k x n] + beta *
// C, op 'N' or 'T', through cuBLAS in the context's math mode (TF32 only
// when its options allow). InvalidArgument for sizes outside [0, 2^31);
// Internal on cuBLAS errors.
absl::Status Gemm(BlasContext* ctx, char trans_a, char trans_b, int64_t m,
                  int64_t n, int64_t k, const float* a, int64_t lda,
                  const float* b, int64_t ldb, float beta, float* c,
                  int64_t ldc);

// dense::Linear::ForwardBf16: y [batch x out] = act(x W^T + b) with x
// [batch x in] and W [out x in] in bf16, fp32 accumulation, fp32 bias and
// output; y's bf16 copy (dense/bf16_round.h's rounding) into y_bf16 unless
// null. cuBLASLt with CUDA_R_16BF A and B, fp32 C/D, CUBLAS_COMPUTE_32F and
// the bias/ReLU epilogue, or cublasGemmEx plus the bias/ReLU kernel where
// cuBLASLt has no algorithm (or use_lt_epilogue is off). Errors as
// LinearForward.
absl::Status LinearForwardBf16(BlasContext* ctx, const Bf16* x, int64_t batch,
                               int in, int out, const Bf16* w, const float* b,
                               bool relu, float* y, Bf16* y_bf16);

// dense::Linear::BackwardBf16: as LinearBackward (dy masked in place, db in
// the CPU's order from the fp32 masked dy), with the masked dy also
// rounded into dy_bf16 ([batch x out], scratch), and dw = dy_bf16^T x, dx =
// dy_bf16 W (unless dx is null) as GemmBf16 with x and W in bf16.
absl::Status LinearBackwardBf16(BlasContext* ctx, const Bf16* x, const float* y,
                                float* dy, int64_t batch, int in, int out,
                                const Bf16* w, bool relu, float* dw, float* db,
                                float* dx, Bf16* dy_bf16);

// dense::Bgemm: row-major C [m x n] = op(A) op(B) + beta * C with bf16 A and
// B and fp32 C, as one cublasGemmEx (CUBLAS_COMPUTE_32F: fp32
// accumulation). Errors as Gemm.
absl::Status GemmBf16(BlasContext* ctx, char trans_a, char trans_b, int64_t m,
                      int64_t n, int64_t k, const Bf16* a, int64_t lda,
                      const Bf16* b, int64_t ldb, float beta, float* c,
                      int64_t ldc);

// out[i] = ToBf16(in[i]) (dense/bf16_round.h) for i in [0, n), on `stream`.
// InvalidArgument for n < 0.
absl::Status RoundToBf16(const float* in, int64_t n, Bf16* out,
                         cudaStream_t stream);

// A parameter of a device layer: its value and gradient (device memory,
// the layer's) and its floats.
struct DeviceParamRef {
  float* value = nullptr;
  float* grad = nullptr;
  int64_t size = 0;
};

// The device twin of a dense::InteractionLayer (an interaction with
// parameters; dense::cuda::CreateDeviceInteractionLayer makes the config's):
// the same passes with the same contracts on ctx's stream, every pointer
// device memory. Not thread-safe.
class DeviceInteractionLayer {
 public:
  virtual ~DeviceInteractionLayer() = default;

  // At PRECISION_BF16, queues on `stream` the rewrite of the bf16 weight
  // copies from the fp32 weights; call after they change. Nothing at
  // PRECISION_FP32. Internal on a CUDA error.
  virtual absl::Status SyncBf16Weights(cudaStream_t stream) = 0;
  // Its parameters in the host layer's order (InteractionParamSpecs').
  virtual std::vector<DeviceParamRef> Parameters() const = 0;

  // dense::InteractionLayer::Forward / Backward / Infer (x unchanged from
  // Forward to Backward; Infer keeps nothing, growing `scratch`).
  // InvalidArgument for a negative batch; Internal on CUDA/cuBLAS errors.
  virtual absl::Status Forward(BlasContext* ctx, const float* x, int64_t batch,
                               float* out) = 0;
  virtual absl::Status Backward(BlasContext* ctx, const float* x,
                                const float* dout, int64_t batch,
                                float* dx) = 0;
  virtual absl::Status Infer(
      BlasContext* ctx, const float* x, int64_t batch, float* out,
      dlrm::cuda::DeviceBuffer<float>* scratch) const = 0;
};

// dense::CrossNet on the device (DCN's low-rank cross network): per layer
// V [r x N], W [N x r] and the bias [N] with their gradients, the last
// training forward's activations and the backward's buffers. The two maps
// of a layer are Linear layers without and with a bias (cuBLASLt), the
// product and residual a kernel; the bias gradient is summed in the CPU's
// block order. At PRECISION_BF16 the products run as dense::CrossNet's
// bf16 passes (LinearForwardBf16, LinearBackwardBf16, GemmBf16 on bf16
// copies of V, W, x_l, p_l and the gradients flowing into them).
// INTERACTION_DCN's DeviceInteractionLayer. Not thread-safe.
class DeviceCrossNet final : public DeviceInteractionLayer {
 public:
  // `num_layers` layers (>= 0) of width N >= 1 and rank r >= 1,
  // parameters uninitialised (the backend uploads the host view's).
  // Internal on a CUDA error.
  static absl::StatusOr<std::unique_ptr<DeviceCrossNet>> Create(
      int width, int num_layers, int rank,
      DensePrecision precision = PRECISION_FP32);

  DensePrecision precision() const { return precision_; }
  // At PRECISION_BF16, queues on `stream` the rewrite of V's and W's bf16
  // copies from the fp32 weights; call after they change. Nothing at
  // PRECISION_FP32. Internal on a CUDA error.
  absl::Status SyncBf16Weights(cudaStream_t stream) override;
  // V, W and the bias, layer by layer.
  std::vector<DeviceParamRef> Parameters() const override;

  int width() const { return width_; }
  int num_layers() const { return static_cast<int>(layers_.size()); }
  int rank() const { return rank_; }
  // Layer l's parameters and gradients (device memory), dense::CrossNet's
  // shapes.
  float* v(int l) const { return layers_[l].v.data(); }
  float* w(int l) const { return layers_[l].w.data(); }
  float* bias(int l) const { return layers_[l].b.data(); }
  float* v_grad(int l) const { return layers_[l].dv.data(); }
  float* w_grad(int l) const { return layers_[l].dw.data(); }
  float* bias_grad(int l) const { return layers_[l].db.data(); }

  // dense::CrossNet::Forward / Backward / Infer on ctx's stream, every
  // pointer device memory, with the same contracts (x0 unchanged from
  // Forward to Backward; Infer keeps nothing, growing `scratch`).
  // InvalidArgument for a negative batch; Internal on CUDA/cuBLAS errors.
  absl::Status Forward(BlasContext* ctx, const float* x0, int64_t batch,
                       float* out) override;
  absl::Status Backward(BlasContext* ctx, const float* x0, const float* dout,
                        int64_t batch, float* dx0) override;
  absl::Status Infer(BlasContext* ctx, const float* x0, int64_t batch,
                     float* out,
                     dlrm::cuda::DeviceBuffer<float>* scratch) const override;

 private:
  struct Layer {
    dlrm::cuda::DeviceBuffer<float> v, w, b, dv, dw, db;
    dlrm::cuda::DeviceBuffer<Bf16> vb, wb;  // PRECISION_BF16's copies
  };
  DeviceCrossNet() = default;

  absl::Status ForwardBf16(BlasContext* ctx, const float* x0, int64_t batch,
                           float* out);
  absl::Status InferBf16(BlasContext* ctx, const float* x0, int64_t batch,
                         float* out,
                         dlrm::cuda::DeviceBuffer<float>* scratch) const;

  int width_ = 0, rank_ = 0;
  DensePrecision precision_ = PRECISION_FP32;
  std::vector<Layer> layers_;
  // As dense::CrossNet's: x_[l - 1] = x_l for l in [1, L); p_[l], q_[l]
  // (at PRECISION_BF16 p_[l] is the fp32 sum p_bf16_[l] is rounded from).
  std::vector<dlrm::cuda::DeviceBuffer<float>> x_, p_, q_;
  dlrm::cuda::DeviceBuffer<float> g_[2], h_, dp_;
  // PRECISION_BF16's, as dense::CrossNet's: x_l in bf16 for l in [0, L),
  // p_l in bf16, the backward's h and dp in bf16.
  std::vector<dlrm::cuda::DeviceBuffer<Bf16>> x_bf16_, p_bf16_;
  dlrm::cuda::DeviceBuffer<Bf16> h_bf16_, dp_bf16_;
};

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

// dense::InteractionForward / InteractionBackward / InteractionInfer: the
// interaction of `shape` on ctx's stream, through `layer` (the device
// interaction layer) when there is one, else the interaction's case in
// dense_kernels.cu. Queue nothing for an identity interaction (never
// called for one). InvalidArgument as that interaction's kernel; Internal
// on CUDA/cuBLAS errors.
absl::Status InteractionForward(BlasContext* ctx, const InteractionShape& shape,
                                const float* t, int64_t batch, float* z,
                                DeviceInteractionLayer* layer);
absl::Status InteractionBackward(BlasContext* ctx,
                                 const InteractionShape& shape, const float* t,
                                 const float* dz, int64_t batch, float* dt,
                                 DeviceInteractionLayer* layer);
absl::Status InteractionInfer(BlasContext* ctx, const InteractionShape& shape,
                              const float* t, int64_t batch, float* z,
                              const DeviceInteractionLayer* layer,
                              dlrm::cuda::DeviceBuffer<float>* scratch);

// dense::BceWithLogits: writes dlogits (unless null) and the mean loss to
// *loss_device (one double, device memory), in double precision like the
// CPU version; the sum runs in a fixed order, so it is deterministic (not
// the CPU's order: agreement is within double rounding). A batch of 0 gives
// loss 0.
absl::Status BceWithLogits(const float* logits, const float* labels,
                           int64_t batch, float grad_scale, float* dlogits,
                           double* loss_device, cudaStream_t stream);

// dense::DenseOptimizer::Step for one parameter of n floats: applies the
// element-wise rule of `type` (its DenseElement, optim/rules.h, the
// function the CPU runs) to `param` from `grad`, with state1 / state2 its
// kDenseState arrays (null where the rule has fewer). The step's constants
// are read on the device, when the kernel runs, from `constants`: device
// memory holding the rule's Step (optim::MakePackedStep's bytes for a
// config of this type), so the launch is the same every step and a
// captured graph of it reads each step's constants. InvalidArgument for
// n < 0, a type with no element-wise rule, or (n > 0) a null or misaligned
// `constants`.
absl::Status DenseOptimizerUpdate(OptimizerConfig::Type type,
                                  const void* constants, float* param,
                                  const float* grad, float* state1,
                                  float* state2, int64_t n,
                                  cudaStream_t stream);

// dense::DenseOptimizer::Step for one parameter of n floats under the
// layer-wise rule of `type` (LAMB, LARS), as one layer: when `adapt`
// (AdaptsLayerWise) ||param|| and the norm of the rule's NormTerm in
// double, summed in a fixed order (not the CPU's: agreement within double
// rounding); the tensor's constants by the rule's MakeLayer on the device;
// then LayerElement per element. The step's constants are read on the
// device from `constants`, as DenseOptimizerUpdate's. No host
// synchronisation. `scratch` (device memory) grows to
// LayerScratchDoubles(n) if smaller, and may be shared by the calls of one
// stream. InvalidArgument for n < 0, a null scratch, a type with no
// layer-wise rule, or (n > 0) a null or misaligned `constants`.
absl::Status LayerOptimizerUpdate(OptimizerConfig::Type type,
                                  const void* constants, bool adapt,
                                  float* param, const float* grad,
                                  float* state1, float* state2, int64_t n,
                                  dlrm::cuda::DeviceBuffer<double>* scratch,
                                  cudaStream_t stream);
// Doubles of scratch LayerOptimizerUpdate needs for a parameter of n floats.
int64_t LayerScratchDoubles(int64_t n);

namespace internal {

// What a cuBLASLt plan (matmul descriptor, layouts, algorithm) depends on:
// a column-major D [m x n] = op(A) [m x k] op(B) [k x n] (+ bias) with its
// leading dimensions, transposes, epilogue (a cublasLtEpilogue_t), compute
// type (TF32 or not), the data type of A and B (a cudaDataType_t:
// CUDA_R_32F, or CUDA_R_16BF for the bf16 layers; C and D are fp32 either
// way), and the alignment in bytes of the A, B, C/D and bias
// pointers (PointerAlignment; 0 for no bias). The algorithm the heuristic
// picks for some alignments may need them, so each alignment gets its own.
struct LtPlanKey {
  int64_t m = 0, n = 0, k = 0;
  int64_t lda = 0, ldb = 0, ldd = 0;
  bool trans_a = false, trans_b = false;
  int epilogue = 0;
  bool tf32 = false;
  int data_type = CUDA_R_32F;
  int align_a = 0, align_b = 0, align_d = 0, align_bias = 0;

  auto operator<=>(const LtPlanKey&) const = default;
};

// The largest power of two <= kMaxPointerAlignment that divides the
// address; kMaxPointerAlignment for null.
constexpr int kMaxPointerAlignment = 256;
int PointerAlignment(const void* p);

// Plans a BlasContext keeps: past this many keys, a new key's plan replaces
// the least recently used one's.
constexpr size_t kMaxLtPlans = 512;

// The key of LinearForward's cuBLASLt call for y [batch x out] = act(x
// [batch x in] W^T + b) (row-major; no bias when b is null): column-major D
// [out x batch] = W^T x^T, A = W (transposed), B = x, D = y. x and W are
// fp32, or bf16 when `data_type` is CUDA_R_16BF (then never TF32).
LtPlanKey LinearForwardKey(const void* x, int64_t batch, int in, int out,
                           const void* w, const float* b, bool relu, bool tf32,
                           float* y, cudaDataType_t data_type = CUDA_R_32F);

// What a plan does with cuBLASLt's heuristic answer (its status and how
// many algorithms it found): kUse its algorithm only on a success with
// one; kNone ("not supported", or a success with none: cuBLASLt says "no
// algorithm" either way) and kError (any other status) both leave the plan
// without an algorithm, so LinearForward falls back to cublasGemmEx, which
// reports its own errors; kError is also logged.
enum class HeuristicAnswer { kUse, kNone, kError };
HeuristicAnswer ClassifyHeuristic(cublasStatus_t status, int found);

// Kernels the GEMM code uses (dense_kernels.cu).
// y[r, :] = act(y[r, :] + b) for `rows` rows of width `out`; b may be null
// (no bias).
absl::Status AddBiasAct(float* y, const float* b, int64_t rows, int out,
                        bool relu, cudaStream_t stream);
// Masks dy by y > 0 when `relu` and writes column sums in the CPU's block
// order to db; `partial` holds ceil(rows / 64) * out floats.
absl::Status MaskAndBiasGrad(float* dy, const float* y, int64_t rows, int out,
                             bool relu, float* partial, float* db,
                             cudaStream_t stream);
// The number of row blocks MaskAndBiasGrad sums separately.
int64_t BiasGradBlocks(int64_t rows);
// One cross layer's product and residual over `count` floats: x_next = x0 *
// q + xl (dense::CrossNet's forward pass after its GEMMs).
absl::Status CrossCombine(const float* x0, const float* q, const float* xl,
                          int64_t count, float* x_next, cudaStream_t stream);
// One cross layer's elementwise backward over `count` floats, from g (the
// gradient wrt x_{l+1}): h = g * x0; dx0 = g * q when `first` (the last
// layer, visited first), else dx0 + g * q; then + g when `last` (layer 0),
// else g_next = g (dense::CrossNet::Backward's pass).
absl::Status CrossBackwardElementwise(const float* g, const float* x0,
                                      const float* q, int64_t count, bool first,
                                      bool last, float* h, float* dx0,
                                      float* g_next, cudaStream_t stream);
}  // namespace internal

}  // namespace dlrm::dense::cuda
