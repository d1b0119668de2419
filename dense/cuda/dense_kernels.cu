// Element-wise and per-sample kernels of the dense layers: bias + ReLU,
// ReLU mask + bias gradient, the fp32 -> bf16 rounding of PRECISION_BF16,
// the dot interaction, the cross network's elementwise passes,
// BCE-with-logits, the dense optimizers (element-wise and layer-wise) and
// the interaction dispatchers.
//
// Float operations use the non-fusing round-to-nearest intrinsics in the
// CPU kernels' order: sums (the bias gradient) and elementwise products
// match the CPU bitwise; where the host compiler fuses multiply-adds
// (dots), results differ by ulps.
#include <algorithm>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "core/cuda/launch.cuh"
#include "core/status.h"
#include "dense/cuda/cuda_dense.h"
#include "optim/optimizer.h"

namespace dlrm::dense::cuda {
namespace {

using dlrm::cuda::CeilDiv;
using dlrm::cuda::LaunchKernel;

// Rows per bias-gradient block: the CPU kernel's kRowBlock (linear.cc).
constexpr int64_t kRowBlock = 64;

// max(v, 0) on the bits, as the CPU's Relu (linear.cc): -0 gives +0.
__device__ __forceinline__ float Relu(float v) {
  const int bits = __float_as_int(v);
  return __int_as_float(bits & ~(bits >> 31));
}
// The CPU's Positive: the sign-and-magnitude bits as an int are > 0.
__device__ __forceinline__ bool Positive(float v) {
  return __float_as_int(v) > 0;
}

__global__ void AddBiasActKernel(float* __restrict__ y,
                                 const float* __restrict__ b, int64_t total,
                                 int out, bool relu) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= total) return;
  const float v = b == nullptr ? y[i] : __fadd_rn(y[i], b[i % out]);
  y[i] = relu ? Relu(v) : v;
}

// out[i] = ToBf16(in[i]): dense/bf16_round.h's function, the CPU's.
__global__ void RoundToBf16Kernel(const float* __restrict__ in, int64_t n,
                                  Bf16* __restrict__ out) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  out[i] = ToBf16(in[i]);
}

// x_next = x0 * q + xl, rounded after the product and after the sum as the
// CPU loop (host code is built without FMA contraction).
__global__ void CrossCombineKernel(const float* __restrict__ x0,
                                   const float* __restrict__ q,
                                   const float* __restrict__ xl, int64_t count,
                                   float* __restrict__ x_next) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= count) return;
  x_next[i] = __fadd_rn(__fmul_rn(x0[i], q[i]), xl[i]);
}

// dense::CrossNet::Backward's pass, one element per thread, in the CPU
// loop's order of roundings. dx0 is not read when kFirst, g_next not
// written when kLast; they alias nothing else.
template <bool kFirst, bool kLast>
__global__ void CrossBackwardKernel(const float* __restrict__ g,
                                    const float* __restrict__ x0,
                                    const float* __restrict__ q, int64_t count,
                                    float* __restrict__ h,
                                    float* __restrict__ dx0,
                                    float* __restrict__ g_next) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= count) return;
  const float gv = g[i];
  h[i] = __fmul_rn(gv, x0[i]);
  float d = __fmul_rn(gv, q[i]);
  if (!kFirst) d = __fadd_rn(dx0[i], d);
  if (kLast) {
    d = __fadd_rn(d, gv);
  } else {
    g_next[i] = gv;
  }
  dx0[i] = d;
}

// Block (column tile, row block): masks the block's rows of dy and sums
// each column over them, from 0 in row order.
__global__ void MaskAndPartialKernel(float* __restrict__ dy,
                                     const float* __restrict__ y, int64_t rows,
                                     int out, bool relu,
                                     float* __restrict__ partial) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= out) return;
  const int64_t blk = blockIdx.y;
  const int64_t end = min(rows, (blk + 1) * kRowBlock);
  float sum = 0.0f;
  for (int64_t r = blk * kRowBlock; r < end; ++r) {
    float g = dy[r * out + c];
    if (relu) {
      g = Positive(y[r * out + c]) ? g : 0.0f;
      dy[r * out + c] = g;
    }
    sum = __fadd_rn(sum, g);
  }
  partial[blk * out + c] = sum;
}

__global__ void SumPartialsKernel(const float* __restrict__ partial,
                                  int64_t blocks, int out,
                                  float* __restrict__ db) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= out) return;
  float sum = partial[c];
  for (int64_t blk = 1; blk < blocks; ++blk) {
    sum = __fadd_rn(sum, partial[blk * out + c]);
  }
  db[c] = sum;
}

__device__ __forceinline__ int PairIndex(int i, int j) {
  return i * (i - 1) / 2 + j;
}

// Shared-memory row stride of DotForwardKernel: d rounded up to odd. A
// warp's threads read element k of up to 32 consecutive rows j at once; at
// a stride of d = 128 (any multiple of 32) those all sit in one bank and
// the reads serialise 32 ways, at an odd stride they fall in 32 banks.
__host__ __device__ __forceinline__ int DotRowStride(int d) { return d | 1; }

// One block per sample: the sample's n x d vectors in shared memory (rows
// DotRowStride(d) apart), one thread per output dot (in k order from 0, as
// the reference).
__global__ void DotForwardKernel(const float* __restrict__ t, int n, int d,
                                 float* __restrict__ z) {
  extern __shared__ float ts[];
  const int64_t b = blockIdx.x;
  const int nd = n * d;
  const int ds = DotRowStride(d);
  const int zdim = d + n * (n - 1) / 2;
  const float* tb = t + b * nd;
  float* zb = z + b * zdim;
  for (int x = threadIdx.x; x < nd; x += blockDim.x) {
    ts[(x / d) * ds + x % d] = tb[x];
  }
  __syncthreads();
  for (int x = threadIdx.x; x < d; x += blockDim.x) zb[x] = ts[x];
  const int pairs = n * (n - 1) / 2;
  for (int p = threadIdx.x; p < pairs; p += blockDim.x) {
    // Invert p = i (i - 1) / 2 + j; the float estimate is corrected.
    int i = static_cast<int>((1.0f + sqrtf(1.0f + 8.0f * p)) * 0.5f);
    while (PairIndex(i, 0) > p) --i;
    while (PairIndex(i + 1, 0) <= p) ++i;
    const int j = p - PairIndex(i, 0);
    float dot = 0.0f;
    for (int k = 0; k < d; ++k) {
      dot = __fadd_rn(dot, __fmul_rn(ts[i * ds + k], ts[j * ds + k]));
    }
    zb[d + p] = dot;
  }
}

// One block per sample; thread per element (m, k) of dt. The reference adds
// the terms of element (m, k) for pairs (m, j), j < m, then (i, m), i > m:
// that is j = 0 .. n - 1 in order, which this loop follows.
__global__ void DotBackwardKernel(const float* __restrict__ t,
                                  const float* __restrict__ dz, int n, int d,
                                  float* __restrict__ dt) {
  extern __shared__ float smem[];
  const int nd = n * d;
  const int zdim = d + n * (n - 1) / 2;
  float* ts = smem;
  float* gs = smem + nd;
  const int64_t b = blockIdx.x;
  for (int x = threadIdx.x; x < nd; x += blockDim.x) ts[x] = t[b * nd + x];
  for (int x = threadIdx.x; x < zdim; x += blockDim.x) gs[x] = dz[b * zdim + x];
  __syncthreads();
  for (int e = threadIdx.x; e < nd; e += blockDim.x) {
    const int m = e / d, k = e % d;
    float acc = m == 0 ? gs[k] : 0.0f;
    for (int j = 0; j < n; ++j) {
      if (j == m) continue;
      const float g = gs[d + (j < m ? PairIndex(m, j) : PairIndex(j, m))];
      acc = __fadd_rn(acc, __fmul_rn(g, ts[j * d + k]));
    }
    dt[b * nd + e] = acc;
  }
}

constexpr int kLossThreads = 1024;

// One block: each thread sums its strided share of the batch in order, then
// a shared-memory tree; a fixed order, so the same bits every run. Launched
// with kLossThreads threads: the bounds hold the compiler to the registers
// that many threads may have (tests/cuda_resource_test.sh checks them).
__global__ void __launch_bounds__(kLossThreads)
    BceKernel(const float* __restrict__ logits,
              const float* __restrict__ labels, int64_t batch, float grad_scale,
              float* __restrict__ dlogits, double* __restrict__ loss) {
  __shared__ double sums[kLossThreads];
  double total = 0.0;
  for (int64_t i = threadIdx.x; i < batch; i += blockDim.x) {
    const double z = logits[i];
    const double y = labels[i];
    const double e = exp(-fabs(z));
    total = __dadd_rn(
        total, __dadd_rn(__dsub_rn(fmax(z, 0.0), __dmul_rn(z, y)), log1p(e)));
    if (dlogits != nullptr) {
      const double sigmoid = z >= 0 ? __ddiv_rn(1.0, __dadd_rn(1.0, e))
                                    : __ddiv_rn(e, __dadd_rn(1.0, e));
      dlogits[i] = __double2float_rn(
          __dmul_rn(__dsub_rn(sigmoid, y), static_cast<double>(grad_scale)));
    }
  }
  sums[threadIdx.x] = total;
  __syncthreads();
  for (int half = blockDim.x / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) {
      sums[threadIdx.x] =
          __dadd_rn(sums[threadIdx.x], sums[threadIdx.x + half]);
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    *loss = batch > 0 ? __ddiv_rn(sums[0], static_cast<double>(batch)) : 0.0;
  }
}

// One element per thread: the rule's DenseElement, the CPU's function, with
// the step's constants read from device memory (a register copy, so the
// stores below cannot make the compiler reload them).
template <typename Rule>
__global__ void DenseOptimizerKernel(
    const typename Rule::Step* __restrict__ constants, float* __restrict__ p,
    const float* __restrict__ g, float* __restrict__ s1, float* __restrict__ s2,
    int64_t n) {
  const int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k >= n) return;
  const typename Rule::Step step = *constants;
  Rule::DenseElement(step, g[k], p, s1, s2, k);
}

// The layer-wise optimizers' norms: block b of kNormThreads threads sums
// the squares of elements [b kNormChunk, (b + 1) kNormChunk), thread t
// those at t, t + kNormThreads, ... in order, then a shared-memory tree;
// one block of kFinishThreads adds the blocks' sums the same way. A fixed
// order for a given n, whatever the GPU: the same bits every run.
constexpr int kNormThreads = 256;
constexpr int kNormPerThread = 16;
constexpr int64_t kNormChunk = int64_t{kNormThreads} * kNormPerThread;
constexpr int kFinishThreads = 1024;

// Adds sums_a[i + half] into sums_a[i] (and b) for half = blockDim.x / 2,
// ..., 1; blockDim.x a power of two. Leaves the totals at index 0.
__device__ void TreeSum(double* sums_a, double* sums_b) {
  __syncthreads();
  for (int half = blockDim.x / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) {
      sums_a[threadIdx.x] =
          __dadd_rn(sums_a[threadIdx.x], sums_a[threadIdx.x + half]);
      sums_b[threadIdx.x] =
          __dadd_rn(sums_b[threadIdx.x], sums_b[threadIdx.x + half]);
    }
    __syncthreads();
  }
}

// Per block: the sums of w^2 and of the rule's NormTerm^2 over the block's
// chunk, in double (float squares are exact in double), to partials[2 b]
// and partials[2 b + 1].
template <typename Rule>
__global__ void LayerNormPartialsKernel(
    const typename Rule::Step* __restrict__ constants,
    const float* __restrict__ p, const float* __restrict__ g,
    const float* __restrict__ s1, const float* __restrict__ s2, int64_t n,
    double* __restrict__ partials) {
  __shared__ double w2s[kNormThreads];
  __shared__ double t2s[kNormThreads];
  const typename Rule::Step step = *constants;
  const int64_t begin = static_cast<int64_t>(blockIdx.x) * kNormChunk;
  double w2 = 0.0, t2 = 0.0;
  for (int j = 0; j < kNormPerThread; ++j) {
    const int64_t k = begin + int64_t{j} * kNormThreads + threadIdx.x;
    if (k >= n) break;
    const double w = p[k];
    const double t =
        Rule::NormTerm(step, step.weight_decay, g[k], p, s1, s2, k);
    w2 = __dadd_rn(w2, __dmul_rn(w, w));
    t2 = __dadd_rn(t2, __dmul_rn(t, t));
  }
  w2s[threadIdx.x] = w2;
  t2s[threadIdx.x] = t2;
  TreeSum(w2s, t2s);
  if (threadIdx.x == 0) {
    partials[2 * blockIdx.x] = w2s[0];
    partials[2 * blockIdx.x + 1] = t2s[0];
  }
}

// One block: adds the `blocks` partial sums, takes the square roots and
// writes the tensor's constants, Rule::MakeLayer (the CPU's function), to
// *layer. With blocks = 0 the norms are 0 (a tensor without adaptation).
// Launched with kFinishThreads threads, hence the bounds (as BceKernel's).
template <typename Rule>
__global__ void __launch_bounds__(kFinishThreads)
    LayerFinishKernel(const typename Rule::Step* __restrict__ constants,
                      bool adapt, const double* __restrict__ partials,
                      int64_t blocks,
                      typename Rule::Layer* __restrict__ layer) {
  __shared__ double w2s[kFinishThreads];
  __shared__ double t2s[kFinishThreads];
  double w2 = 0.0, t2 = 0.0;
  for (int64_t b = threadIdx.x; b < blocks; b += blockDim.x) {
    w2 = __dadd_rn(w2, partials[2 * b]);
    t2 = __dadd_rn(t2, partials[2 * b + 1]);
  }
  w2s[threadIdx.x] = w2;
  t2s[threadIdx.x] = t2;
  TreeSum(w2s, t2s);
  if (threadIdx.x == 0) {
    *layer = Rule::MakeLayer(*constants, adapt, __dsqrt_rn(w2s[0]),
                             __dsqrt_rn(t2s[0]));
  }
}

// One element per thread: the rule's LayerElement with the tensor's
// constants from LayerFinishKernel.
template <typename Rule>
__global__ void LayerElementKernel(
    const typename Rule::Step* __restrict__ constants,
    const typename Rule::Layer* __restrict__ layer, float* __restrict__ p,
    const float* __restrict__ g, float* __restrict__ s1, float* __restrict__ s2,
    int64_t n) {
  const int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k >= n) return;
  const typename Rule::Step step = *constants;
  Rule::LayerElement(step, *layer, g[k], p, s1, s2, k);
}

constexpr int kSmemLimit = 48 * 1024;

absl::Status CheckInteraction(const char* what, int64_t batch, int n, int d,
                              size_t smem) {
  if (batch < 0 || n < 1 || d < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": batch ", batch, ", n ", n, ", d ", d, " must be positive"));
  }
  if (smem > kSmemLimit) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": n ", n, " x d ", d, " needs ", smem,
                     " bytes of shared memory, over ", kSmemLimit));
  }
  return absl::OkStatus();
}

}  // namespace

namespace internal {

int64_t BiasGradBlocks(int64_t rows) { return CeilDiv(rows, kRowBlock); }

absl::Status AddBiasAct(float* y, const float* b, int64_t rows, int out,
                        bool relu, cudaStream_t stream) {
  const int64_t total = rows * out;
  return LaunchKernel("AddBiasActKernel", AddBiasActKernel,
                      dim3(static_cast<unsigned>(CeilDiv<int64_t>(total, 256))),
                      dim3(256), 0, stream, y, b, total, out, relu);
}

absl::Status MaskAndBiasGrad(float* dy, const float* y, int64_t rows, int out,
                             bool relu, float* partial, float* db,
                             cudaStream_t stream) {
  const int64_t blocks = BiasGradBlocks(rows);
  if (blocks > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        "MaskAndBiasGrad: ", rows, " rows; at most ", 65535 * kRowBlock));
  }
  constexpr int kCols = 128;
  RETURN_IF_ERROR(
      LaunchKernel("MaskAndPartialKernel", MaskAndPartialKernel,
                   dim3(CeilDiv(out, kCols), static_cast<unsigned>(blocks)),
                   dim3(kCols), 0, stream, dy, y, rows, out, relu, partial));
  return LaunchKernel("SumPartialsKernel", SumPartialsKernel,
                      dim3(CeilDiv(out, kCols)), dim3(kCols), 0, stream,
                      static_cast<const float*>(partial), blocks, out, db);
}

absl::Status CrossCombine(const float* x0, const float* q, const float* xl,
                          int64_t count, float* x_next, cudaStream_t stream) {
  return LaunchKernel("CrossCombineKernel", CrossCombineKernel,
                      dim3(static_cast<unsigned>(CeilDiv<int64_t>(count, 256))),
                      dim3(256), 0, stream, x0, q, xl, count, x_next);
}

absl::Status CrossBackwardElementwise(const float* g, const float* x0,
                                      const float* q, int64_t count, bool first,
                                      bool last, float* h, float* dx0,
                                      float* g_next, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(CeilDiv<int64_t>(count, 256)));
  if (first && last) {
    return LaunchKernel("CrossBackwardKernel", CrossBackwardKernel<true, true>,
                        grid, dim3(256), 0, stream, g, x0, q, count, h, dx0,
                        g_next);
  }
  if (first) {
    return LaunchKernel("CrossBackwardKernel", CrossBackwardKernel<true, false>,
                        grid, dim3(256), 0, stream, g, x0, q, count, h, dx0,
                        g_next);
  }
  if (last) {
    return LaunchKernel("CrossBackwardKernel", CrossBackwardKernel<false, true>,
                        grid, dim3(256), 0, stream, g, x0, q, count, h, dx0,
                        g_next);
  }
  return LaunchKernel("CrossBackwardKernel", CrossBackwardKernel<false, false>,
                      grid, dim3(256), 0, stream, g, x0, q, count, h, dx0,
                      g_next);
}

}  // namespace internal

absl::Status RoundToBf16(const float* in, int64_t n, Bf16* out,
                         cudaStream_t stream) {
  if (n < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("RoundToBf16: n ", n, " is negative"));
  }
  if (n == 0) return absl::OkStatus();
  return LaunchKernel("RoundToBf16Kernel", RoundToBf16Kernel,
                      dim3(static_cast<unsigned>(CeilDiv<int64_t>(n, 256))),
                      dim3(256), 0, stream, in, n, out);
}

absl::Status DotInteractionForward(const float* t, int64_t batch, int n, int d,
                                   float* z, cudaStream_t stream) {
  const size_t smem = sizeof(float) * n * DotRowStride(d);
  RETURN_IF_ERROR(CheckInteraction("DotInteractionForward", batch, n, d, smem));
  return LaunchKernel("DotForwardKernel", DotForwardKernel,
                      dim3(static_cast<unsigned>(batch)), dim3(128), smem,
                      stream, t, n, d, z);
}

absl::Status DotInteractionBackward(const float* t, const float* dz,
                                    int64_t batch, int n, int d, float* dt,
                                    cudaStream_t stream) {
  const size_t smem = sizeof(float) * (n * d + d + n * (n - 1) / 2);
  RETURN_IF_ERROR(
      CheckInteraction("DotInteractionBackward", batch, n, d, smem));
  return LaunchKernel("DotBackwardKernel", DotBackwardKernel,
                      dim3(static_cast<unsigned>(batch)), dim3(128), smem,
                      stream, t, dz, n, d, dt);
}

// The interactions without parameters are the cases below; one with
// parameters is its DeviceInteractionLayer.
absl::Status InteractionForward(BlasContext* ctx, const InteractionShape& s,
                                const float* t, int64_t batch, float* z,
                                DeviceInteractionLayer* layer) {
  if (layer != nullptr) return layer->Forward(ctx, t, batch, z);
  switch (s.kind) {
    case INTERACTION_DOT:
      return DotInteractionForward(t, batch, s.num_vectors, s.dim, z,
                                   ctx->stream());
    case INTERACTION_CAT:  // the identity: not called
    default:               // refused by ValidateModelConfig
      return absl::OkStatus();
  }
}

absl::Status InteractionBackward(BlasContext* ctx, const InteractionShape& s,
                                 const float* t, const float* dz, int64_t batch,
                                 float* dt, DeviceInteractionLayer* layer) {
  if (layer != nullptr) return layer->Backward(ctx, t, dz, batch, dt);
  switch (s.kind) {
    case INTERACTION_DOT:
      return DotInteractionBackward(t, dz, batch, s.num_vectors, s.dim, dt,
                                    ctx->stream());
    case INTERACTION_CAT:  // the identity: not called
    default:               // refused by ValidateModelConfig
      return absl::OkStatus();
  }
}

absl::Status InteractionInfer(BlasContext* ctx, const InteractionShape& s,
                              const float* t, int64_t batch, float* z,
                              const DeviceInteractionLayer* layer,
                              dlrm::cuda::DeviceBuffer<float>* scratch) {
  if (layer != nullptr) return layer->Infer(ctx, t, batch, z, scratch);
  switch (s.kind) {
    case INTERACTION_DOT:  // keeps nothing either way
      return DotInteractionForward(t, batch, s.num_vectors, s.dim, z,
                                   ctx->stream());
    case INTERACTION_CAT:  // the identity: not called
    default:               // refused by ValidateModelConfig
      return absl::OkStatus();
  }
}

// InvalidArgument unless `constants` is non-null and aligned for Step.
template <typename Step>
absl::Status CheckConstants(const char* what, const void* constants) {
  if (constants == nullptr ||
      reinterpret_cast<uintptr_t>(constants) % alignof(Step) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": constants 0x",
                     absl::Hex(reinterpret_cast<uintptr_t>(constants)),
                     " must be non-null and aligned to ", alignof(Step)));
  }
  return absl::OkStatus();
}

// DenseOptimizerUpdate for the element-wise `Rule`, n > 0.
template <typename Rule>
absl::Status ElementUpdate(const void* constants, float* param,
                           const float* grad, float* state1, float* state2,
                           int64_t n, cudaStream_t stream) {
  using Step = typename Rule::Step;
  RETURN_IF_ERROR(CheckConstants<Step>("DenseOptimizerUpdate", constants));
  return LaunchKernel("DenseOptimizerKernel", DenseOptimizerKernel<Rule>,
                      dim3(static_cast<unsigned>(CeilDiv<int64_t>(n, 256))),
                      dim3(256), 0, stream, static_cast<const Step*>(constants),
                      param, grad, state1, state2, n);
}

absl::Status DenseOptimizerUpdate(OptimizerConfig::Type type,
                                  const void* constants, float* param,
                                  const float* grad, float* state1,
                                  float* state2, int64_t n,
                                  cudaStream_t stream) {
  if (n < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("DenseOptimizerUpdate: n ", n, " is negative"));
  }
  decltype(&ElementUpdate<optim::Sgd>) update = nullptr;
  optim::VisitElementWise(
      type, [&](auto rule) { update = &ElementUpdate<decltype(rule)>; });
  if (update == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "DenseOptimizerUpdate: type ", OptimizerConfig::Type_Name(type), " (",
        static_cast<int>(type), ") has no element-wise rule"));
  }
  if (n == 0) return absl::OkStatus();
  return update(constants, param, grad, state1, state2, n, stream);
}

int64_t LayerScratchDoubles(int64_t n) {
  return 2 * CeilDiv<int64_t>(std::max<int64_t>(n, 0), kNormChunk) + 1;
}

// LayerOptimizerUpdate for the layer-wise `Rule`: the norms' partial sums
// per chunk, the tensor's constants, then the elements; three launches.
template <typename Rule>
absl::Status LayerUpdate(const void* constants, bool adapt, float* param,
                         const float* grad, float* state1, float* state2,
                         int64_t n, dlrm::cuda::DeviceBuffer<double>* scratch,
                         cudaStream_t stream) {
  using Step = typename Rule::Step;
  using Layer = typename Rule::Layer;
  static_assert(sizeof(Layer) <= sizeof(double) &&
                alignof(Layer) <= alignof(double));
  if (n == 0) return absl::OkStatus();
  RETURN_IF_ERROR(CheckConstants<Step>("LayerOptimizerUpdate", constants));
  const auto* step = static_cast<const Step*>(constants);
  const int64_t blocks = adapt ? CeilDiv<int64_t>(n, kNormChunk) : 0;
  const size_t doubles = static_cast<size_t>(LayerScratchDoubles(n));
  if (scratch->size() < doubles) RETURN_IF_ERROR(scratch->Resize(doubles));
  double* partials = scratch->data();
  // The double after the partial sums holds the tensor's constants.
  auto* layer = reinterpret_cast<Layer*>(partials + 2 * blocks);
  RETURN_IF_ERROR(LaunchKernel(
      "LayerNormPartialsKernel", LayerNormPartialsKernel<Rule>,
      dim3(static_cast<unsigned>(blocks)), dim3(kNormThreads), 0, stream, step,
      static_cast<const float*>(param), grad, static_cast<const float*>(state1),
      static_cast<const float*>(state2), n, partials));
  RETURN_IF_ERROR(LaunchKernel("LayerFinishKernel", LayerFinishKernel<Rule>,
                               dim3(1), dim3(kFinishThreads), 0, stream, step,
                               adapt, static_cast<const double*>(partials),
                               blocks, layer));
  return LaunchKernel("LayerElementKernel", LayerElementKernel<Rule>,
                      dim3(static_cast<unsigned>(CeilDiv<int64_t>(n, 256))),
                      dim3(256), 0, stream, step,
                      static_cast<const Layer*>(layer), param, grad, state1,
                      state2, n);
}

absl::Status LayerOptimizerUpdate(OptimizerConfig::Type type,
                                  const void* constants, bool adapt,
                                  float* param, const float* grad,
                                  float* state1, float* state2, int64_t n,
                                  dlrm::cuda::DeviceBuffer<double>* scratch,
                                  cudaStream_t stream) {
  if (n < 0 || scratch == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "LayerOptimizerUpdate: n ", n, " must be >= 0 and scratch non-null"));
  }
  decltype(&LayerUpdate<optim::Lamb>) update = nullptr;
  optim::Visit(type, [&](auto rule) {
    using Rule = decltype(rule);
    if constexpr (Rule::kLayerWise) update = &LayerUpdate<Rule>;
  });
  if (update == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "LayerOptimizerUpdate: type ", OptimizerConfig::Type_Name(type), " (",
        static_cast<int>(type), ") has no layer-wise rule"));
  }
  return update(constants, adapt, param, grad, state1, state2, n, scratch,
                stream);
}

absl::Status BceWithLogits(const float* logits, const float* labels,
                           int64_t batch, float grad_scale, float* dlogits,
                           double* loss_device, cudaStream_t stream) {
  if (batch < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("BceWithLogits: batch ", batch, " is negative"));
  }
  return LaunchKernel("BceKernel", BceKernel, dim3(1), dim3(kLossThreads), 0,
                      stream, logits, labels, batch, grad_scale, dlogits,
                      loss_device);
}

}  // namespace dlrm::dense::cuda
