// Linear layers and MLPs on oneDNN's sgemm (or, in bf16, the hand-written
// AMX kernel of dense/amx_gemm.h where the tiles run and oneDNN's matmul,
// dense/bf16.h, elsewhere, the bias and ReLU in the GEMM), the fp32
// forward's bias and ReLU, and the backward's ReLU mask, bias gradient and
// bf16 rounding, fused into single passes over the activations.
#include "dense/linear.h"

#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <type_traits>
#include <utility>

#include "dense/amx_gemm.h"
#include "dense/cpu_isa.h"
#include "dense/param_names.h"

namespace dlrm::dense {
namespace {

// The bias gradient is reduced over fixed blocks of rows, then over blocks
// in order, so the sum does not depend on the thread count or on timing.
// 32 rows, the AMX kernel's block of rows: the mask pass fused into its
// epilogue (MaskedGrad) sums the same blocks, so both give the same bits.
constexpr int64_t kRowBlock = 32;

// Element-wise passes below this many floats run on one thread: an OpenMP
// region costs more than it saves (inference on a few samples).
constexpr int64_t kParallelFloats = 1 << 14;

// ReLU and its mask on the bits: GCC keeps float compares out of vectorized
// loops under its default -ftrapping-math (a quiet NaN could trap), and the
// scalar loop costs ~5x. Equal to max(v, 0) and v > 0 for every non-NaN v.
inline float Relu(float v) {
  const int32_t bits = std::bit_cast<int32_t>(v);
  return std::bit_cast<float>(bits & ~(bits >> 31));
}
inline bool Positive(float v) { return std::bit_cast<int32_t>(v) > 0; }

// y[r, :] = act(y[r, :] + b) for `rows` rows.
void AddBiasAct(float* y, const float* b, int64_t rows, int out, bool relu) {
  for (int64_t r = 0; r < rows; ++r) {
    float* row = y + r * out;
    if (relu) {
      for (int c = 0; c < out; ++c) row[c] = Relu(row[c] + b[c]);
    } else {
      for (int c = 0; c < out; ++c) row[c] += b[c];
    }
  }
}

// The ReLU's mask read off the bf16 copy of an output: its sign bit and
// magnitude, as Positive's on the fp32 bits.
inline bool Positive(Bf16 v) { return static_cast<int16_t>(v) > 0; }

// Applies the ReLU mask (from y, the layer's output in fp32 or bf16) to rows
// [begin, end) of dy and writes their column sums to `sum`, the masked rows'
// bf16 copy to dyb when kCopy, and the masked rows back to dy when
// kWriteDy. Branch-free inner loops (the template arguments), so they
// vectorize.
template <bool kWriteDy, bool kCopy, typename Y>
void MaskAndSum(float* dy, const Y* y, int64_t begin, int64_t end, int out,
                bool relu, float* sum, Bf16* dyb) {
  std::fill(sum, sum + out, 0.0f);
  for (int64_t r = begin; r < end; ++r) {
    float* __restrict__ g = dy + r * out;
    Bf16* __restrict__ gb = kCopy ? dyb + r * out : nullptr;
    if (relu) {
      const Y* __restrict__ a = y + r * out;
      for (int c = 0; c < out; ++c) {
        const float v = Positive(a[c]) ? g[c] : 0.0f;
        if constexpr (kWriteDy) g[c] = v;
        sum[c] += v;
      }
      // A loop of its own: with the rounding in the loop above, GCC leaves
      // both scalar.
      if constexpr (kCopy) {
        for (int c = 0; c < out; ++c) {
          gb[c] = ToBf16(kWriteDy || Positive(a[c]) ? g[c] : 0.0f);
        }
      }
    } else {
      for (int c = 0; c < out; ++c) sum[c] += g[c];
      if constexpr (kCopy) {
        for (int c = 0; c < out; ++c) gb[c] = ToBf16(g[c]);
      }
    }
  }
}

// Grows `v` to at least `n` elements (never shrinks) and returns its data.
template <typename T>
T* Sized(AlignedVector<T>& v, int64_t n) {
  if (static_cast<int64_t>(v.size()) < n) v.resize(n);
  return v.data();
}

}  // namespace

void SumBlocks(const float* partial, int64_t blocks, int n, float* sum) {
  std::copy(partial, partial + n, sum);
  for (int64_t blk = 1; blk < blocks; ++blk) {
    const float* block = partial + blk * n;
    for (int c = 0; c < n; ++c) sum[c] += block[c];
  }
}

// oneDNN's sgemm is JIT-built for the running CPU (AVX-512 where present)
// and threads with OpenMP, the same pool as the rest of the step; measured
// 2.2x OpenBLAS 0.3.21 on the Zen 5 machines we run on, which that OpenBLAS
// drives with AVX2 kernels.
void Sgemm(char trans_a, char trans_b, int64_t m, int64_t n, int64_t k,
           const float* a, int64_t lda, const float* b, int64_t ldb, float beta,
           float* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  static const bool isa_set = (EnsureCpuIsa(), true);
  (void)isa_set;
  const dnnl_status_t st =
      dnnl_sgemm(trans_a, trans_b, m, n, k, 1.0f, a, lda, b, ldb, beta, c, ldc);
  if (st != dnnl_success) {
    std::fprintf(stderr, "dnnl_sgemm(%c, %c, %lld, %lld, %lld) failed: %d\n",
                 trans_a, trans_b, static_cast<long long>(m),
                 static_cast<long long>(n), static_cast<long long>(k),
                 static_cast<int>(st));
    std::abort();
  }
}

Linear::Linear(int in, int out, bool relu)
    : in_(in),
      out_(out),
      relu_(relu),
      w_(static_cast<size_t>(in) * out),
      b_(out),
      dw_(static_cast<size_t>(in) * out),
      db_(out) {}

void Linear::Init(Rng* rng) {
  const double w_std = std::sqrt(2.0 / (in_ + out_));
  const double b_std = std::sqrt(1.0 / out_);
  for (float& w : w_) w = static_cast<float>(rng->Normal() * w_std);
  for (float& b : b_) b = static_cast<float>(rng->Normal() * b_std);
}

namespace {

// The fp32 forward's pass after the GEMM: the bias `b` added to y's `batch`
// rows of `out` floats, then the ReLU (when `relu`), in blocks of rows.
void BiasAct(const float* b, int out, bool relu, int64_t batch, float* y) {
  const int64_t blocks = (batch + kRowBlock - 1) / kRowBlock;
#pragma omp parallel for schedule(static) if (batch * out >= kParallelFloats)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t r0 = blk * kRowBlock;
    AddBiasAct(y + r0 * out, b, std::min(kRowBlock, batch - r0), out, relu);
  }
}

}  // namespace

void Linear::Forward(const float* x, int64_t batch, float* y) const {
  if (batch <= 0) return;
  // GEMM with beta = 0 and then one read-modify-write pass for bias + ReLU
  // measured faster than pre-filling y with the bias (beta = 1) and a
  // separate ReLU pass: one pass over y instead of two.
  Sgemm('N', 'T', batch, out_, in_, x, in_, w_.data(), in_, 0.0f, y, out_);
  BiasAct(b_.data(), out_, relu_, batch, y);
}

void Linear::ForwardBf16(const Bf16* x, int64_t batch, float* y,
                         Bf16* y_bf16) const {
  if (batch <= 0) return;
  if (AmxGemmUsable()) {
    // The hand-written AMX kernel (dense/amx_gemm.h) writes both outputs in
    // its epilogue. The weights are packed for its tiles on every call
    // (in x out values, 1/batch of the product's work), into the calling
    // thread's buffer, so concurrent calls share nothing.
    thread_local AmxPackedB packed;
    packed.PackTransposed(wb_.data(), in_, out_, in_);
    AmxGemm(batch, x, in_, packed, {b_.data(), relu_, y, y_bf16, out_});
    return;
  }
  // One oneDNN call: the GEMM with the bias and ReLU as its post-ops, into
  // the output the caller keeps. The GEMM into fp32 and a pass for the
  // bias, ReLU and rounding wrote y twice and read it once more (the kaggle
  // step's MLP forwards took 1.4-1.8x as long, bench/RESULTS.md "Fused
  // dense passes"). With both outputs, y and then its bf16 copy.
  BgemmBiasAct(batch, out_, in_, x, in_, wb_.data(), in_, b_.data(), relu_, y,
               y == nullptr ? y_bf16 : nullptr, out_);
  if (y != nullptr && y_bf16 != nullptr) ToBf16(y, batch * out_, y_bf16);
}

void Linear::SyncBf16Weights() {
  wb_.resize(w_.size());
  ToBf16(w_.data(), static_cast<int64_t>(w_.size()), wb_.data());
}

// dy's ReLU mask (from y) and the bias gradient in one pass over dy, summed
// in fixed blocks of rows; with dyb, dy's bf16 copy too; the masked dy
// written back when kWriteDy. False for an empty batch, after zeroing the
// weight and bias gradients.
template <bool kWriteDy, typename Y>
bool Linear::MaskAndBiasGrad(const Y* y, float* dy, int64_t batch, Bf16* dyb,
                             Bf16* dyb_t) {
  if (batch <= 0) {
    std::fill(dw_.begin(), dw_.end(), 0.0f);
    std::fill(db_.begin(), db_.end(), 0.0f);
    return false;
  }
  const int64_t blocks = (batch + kRowBlock - 1) / kRowBlock;
  partial_.resize(std::max<size_t>(partial_.size(), blocks * out_));
  float* partial = partial_.data();
  const int out = out_;
  const bool relu = relu_;
  const bool amx = AmxGemmUsable();
#pragma omp parallel for schedule(static) if (batch * out >= kParallelFloats)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t begin = blk * kRowBlock;
    const int64_t end = std::min(batch, begin + kRowBlock);
    float* sum = partial + blk * out;
    if (dyb != nullptr) {
      bool masked = false;
      if constexpr (!kWriteDy && std::is_same_v<Y, Bf16>) {
        if (relu && amx) {  // the same bits, in AVX-512 registers
          AmxMaskRows(dy, y, begin, end, out, sum, dyb);
          masked = true;
        }
      }
      if (!masked) {
        MaskAndSum<kWriteDy, true>(dy, y, begin, end, out, relu, sum, dyb);
      }
      // The block's rows of the copy, just written, transposed.
      if (dyb_t != nullptr) {
        TransposeBf16(dyb + begin * out, end - begin, out, out, dyb_t + begin,
                      AmxTransposedLd(batch));
      }
    } else {
      MaskAndSum<kWriteDy, false>(dy, y, begin, end, out, relu, sum, dyb);
    }
  }
  SumBlocks(partial, blocks, out, db_.data());
  return true;
}

namespace {

// With the AMX kernel, the bf16 backward's transposed copy of dy [out x
// batch] (leading dimension AmxTransposedLd), the A operand of dW = dy^T x:
// the calling thread's buffer, grown as needed; null where oneDNN runs the
// GEMMs (it reads dy as stored).
Bf16* TransposedDy(int64_t out, int64_t batch) {
  if (!AmxGemmUsable()) return nullptr;
  thread_local AlignedVector<Bf16> dy_t;
  return Sized(dy_t, out * AmxTransposedLd(batch));
}

}  // namespace

void Linear::GradGemmsBf16(const Bf16* x, const Bf16* dy_bf16,
                           const Bf16* dy_bf16_t, int64_t batch, float* dx,
                           const MaskedGrad* below) {
  if (dy_bf16_t != nullptr) {
    // dW [out x in] = dy^T [out x batch] x [batch x in], x packed for the
    // tiles with the batch as the reduction.
    thread_local AmxPackedB packed_x;
    packed_x.Pack(x, batch, in_, in_);
    AmxGemm(out_, dy_bf16_t, AmxTransposedLd(batch), packed_x,
            {nullptr, false, dw_.data(), nullptr, in_});
  } else {
    Bgemm('T', 'N', out_, in_, batch, dy_bf16, out_, x, in_, 0.0f, dw_.data(),
          in_);
  }
  if (dx == nullptr && below == nullptr) return;
  if (AmxGemmUsable()) {
    thread_local AmxPackedB packed_w;
    packed_w.Pack(wb_.data(), out_, in_, in_);
    AmxEpilogue out{nullptr, false, dx, nullptr, in_};
    if (below != nullptr) {
      // The layer below's mask pass as the blocks leave the tiles: its
      // output (relu'd) is x, this layer's input.
      out.c_f32 = nullptr;
      out.c_bf16 = below->dyb;
      out.mask = x;
      out.c_bf16_t = below->dyb_t;
      out.ldt = AmxTransposedLd(batch);
      out.col_sums = below->sums;
    }
    AmxGemm(batch, dy_bf16, out_, packed_w, out);
    return;
  }
  Bgemm('N', 'N', batch, in_, out_, dy_bf16, out_, wb_.data(), in_, 0.0f, dx,
        in_);
}

void Linear::BackwardBf16(const Bf16* x, const float* y, float* dy,
                          int64_t batch, float* dx, Bf16* dy_bf16,
                          const MaskedGrad* below) {
  Bf16* dy_t = TransposedDy(out_, batch);
  if (!MaskAndBiasGrad<true>(y, dy, batch, dy_bf16, dy_t)) return;
  GradGemmsBf16(x, dy_bf16, dy_t, batch, dx, below);
}

void Linear::BackwardBf16(const Bf16* x, const Bf16* y_bf16, const float* dy,
                          int64_t batch, float* dx, Bf16* dy_bf16,
                          const MaskedGrad* below) {
  Bf16* dy_t = TransposedDy(out_, batch);
  // Only read: kWriteDy is false.
  if (!MaskAndBiasGrad<false>(y_bf16, const_cast<float*>(dy), batch, dy_bf16,
                              dy_t)) {
    return;
  }
  GradGemmsBf16(x, dy_bf16, dy_t, batch, dx, below);
}

float* Linear::MaskedSums(int64_t batch) {
  return Sized(partial_, (batch + kRowBlock - 1) / kRowBlock * out_);
}

void Linear::BackwardMasked(const Bf16* x, const MaskedGrad& g, int64_t batch,
                            float* dx, const MaskedGrad* below) {
  if (batch <= 0) {
    std::fill(dw_.begin(), dw_.end(), 0.0f);
    std::fill(db_.begin(), db_.end(), 0.0f);
    return;
  }
  SumBlocks(g.sums, (batch + kRowBlock - 1) / kRowBlock, out_, db_.data());
  GradGemmsBf16(x, g.dyb, g.dyb_t, batch, dx, below);
}

void Linear::Backward(const float* x, const float* y, float* dy, int64_t batch,
                      float* dx) {
  if (!MaskAndBiasGrad<true>(y, dy, batch, /*dyb=*/nullptr,
                             /*dyb_t=*/nullptr)) {
    return;
  }
  // dW [out x in] = dy^T [out x batch] x [batch x in].
  Sgemm('T', 'N', out_, in_, batch, dy, out_, x, in_, 0.0f, dw_.data(), in_);
  // dx [batch x in] = dy [batch x out] x W [out x in].
  if (dx != nullptr) {
    Sgemm('N', 'N', batch, in_, out_, dy, out_, w_.data(), in_, 0.0f, dx, in_);
  }
}

Mlp::Mlp(int in, std::span<const int> widths, bool relu_last) : in_(in) {
  layers_.reserve(widths.size());
  int prev = in;
  for (size_t i = 0; i < widths.size(); ++i) {
    const bool relu = relu_last || i + 1 < widths.size();
    layers_.emplace_back(prev, widths[i], relu);
    prev = widths[i];
  }
  acts_.resize(layers_.size());
}

void Mlp::Init(Rng* rng) {
  for (Linear& layer : layers_) layer.Init(rng);
  SyncBf16Weights();
}

void Mlp::SetPrecision(DensePrecision precision) {
  precision_ = precision;
  acts_bf16_.resize(precision == PRECISION_BF16 ? layers_.size() : 0);
  SyncBf16Weights();
}

void Mlp::SyncBf16Weights() {
  if (precision_ != PRECISION_BF16) return;
  for (Linear& layer : layers_) layer.SyncBf16Weights();
}

size_t Mlp::WidestHidden() const {
  size_t widest = 0;
  for (size_t i = 0; i + 1 < layers_.size(); ++i) {
    widest = std::max<size_t>(widest, layers_[i].out());
  }
  return widest;
}

const float* Mlp::Forward(const float* x, int64_t batch) {
  if (precision_ == PRECISION_BF16) {
    const Bf16* in = Sized(x_bf16_, batch * in_);
    ToBf16(x, batch * in_, x_bf16_.data());
    // The layers before the last keep only their bf16 outputs (the next
    // layer's input, and the backward's ReLU mask); the last, its fp32 one.
    for (size_t i = 0; i < layers_.size(); ++i) {
      const int64_t need = batch * layers_[i].out();
      const bool last = i + 1 == layers_.size();
      float* y = last ? Sized(acts_[i], need) : nullptr;
      Bf16* yb = last ? nullptr : Sized(acts_bf16_[i], need);
      layers_[i].ForwardBf16(in, batch, y, yb);
      in = yb;
    }
    return acts_.back().data();
  }
  const float* in = x;
  for (size_t i = 0; i < layers_.size(); ++i) {
    const size_t need = static_cast<size_t>(batch) * layers_[i].out();
    // Grow only: a smaller batch reuses the buffer without reallocating.
    if (acts_[i].size() < need) acts_[i].resize(need);
    layers_[i].Forward(in, batch, acts_[i].data());
    in = acts_[i].data();
  }
  return in;
}

void Mlp::Infer(const float* x, int64_t batch, float* out,
                AlignedVector<float>* scratch) const {
  const size_t n = layers_.size();
  if (n == 0) return;
  const size_t half = static_cast<size_t>(batch) * WidestHidden();
  if (precision_ == PRECISION_BF16) {
    // The input, then the layers' outputs in turns.
    const size_t input = static_cast<size_t>(batch) * in_;
    if (infer_bf16_.size() < input + 2 * half) {
      infer_bf16_.resize(input + 2 * half);
    }
    ToBf16(x, batch * in_, infer_bf16_.data());
    const Bf16* in = infer_bf16_.data();
    for (size_t i = 0; i < n; ++i) {
      const bool last = i + 1 == n;
      Bf16* yb = last ? nullptr : infer_bf16_.data() + input + (i % 2) * half;
      layers_[i].ForwardBf16(in, batch, last ? out : nullptr, yb);
      in = yb;
    }
    return;
  }
  if (scratch->size() < 2 * half) scratch->resize(2 * half);
  const float* in = x;
  for (size_t i = 0; i < n; ++i) {
    float* y = i + 1 == n ? out : scratch->data() + (i % 2) * half;
    layers_[i].Forward(in, batch, y);
    in = y;
  }
}

void Mlp::Backward(const float* x, float* dy, int64_t batch, float* dx) {
  const size_t n = layers_.size();
  if (n == 0) return;
  const bool bf16 = precision_ == PRECISION_BF16;
  // On the AMX kernel each layer's input-gradient product also does the
  // mask pass of the layer below (MaskedGrad), into these buffers in turns,
  // in place of the fp32 gradients' ping-pong buffers.
  const bool fuse = bf16 && AmxGemmUsable();
  if (!fuse) {
    const size_t need = static_cast<size_t>(batch) * WidestHidden();
    if (grad_a_.size() < need) grad_a_.resize(need);
    if (grad_b_.size() < need) grad_b_.resize(need);
  }
  if (bf16) {
    Sized(dy_bf16_, batch * std::max<int64_t>(WidestHidden(), out()));
  }
  MaskedGrad masked[2];
  if (fuse && n > 1) {
    const int64_t ld = AmxTransposedLd(batch);
    for (int j = 0; j < 2; ++j) {
      masked[j].dyb = Sized(masked_dyb_[j], batch * WidestHidden());
      masked[j].dyb_t = Sized(masked_dyb_t_[j], WidestHidden() * ld);
    }
  }
  float* grad = dy;
  for (size_t i = n; i-- > 0;) {
    float* layer_dx =
        i == 0 ? dx : ((n - 1 - i) % 2 == 0 ? grad_a_.data() : grad_b_.data());
    if (bf16) {
      const Bf16* layer_in = i == 0 ? x_bf16_.data() : acts_bf16_[i - 1].data();
      // Layer i - 1 (a ReLU layer: every layer but the top MLP's last) gets
      // its masked gradient from this layer's product.
      MaskedGrad* below = nullptr;
      if (fuse && i > 0) {
        below = &masked[(n - 1 - i) % 2];
        below->sums = layers_[i - 1].MaskedSums(batch);
        layer_dx = nullptr;
      }
      if (fuse && i + 1 < n) {  // the layer above did this layer's mask pass
        layers_[i].BackwardMasked(layer_in, masked[(n - i) % 2], batch,
                                  layer_dx, below);
      } else if (i + 1 == n) {
        layers_[i].BackwardBf16(layer_in, acts_[i].data(), grad, batch,
                                layer_dx, dy_bf16_.data(), below);
      } else {  // Forward kept this layer's output in bf16 only
        layers_[i].BackwardBf16(layer_in, acts_bf16_[i].data(), grad, batch,
                                layer_dx, dy_bf16_.data(), below);
      }
    } else {
      const float* layer_in = i == 0 ? x : acts_[i - 1].data();
      layers_[i].Backward(layer_in, acts_[i].data(), grad, batch, layer_dx);
    }
    grad = layer_dx;
  }
}

std::vector<ParamRef> Mlp::Parameters(const std::string& prefix) {
  std::vector<ParamRef> params;
  params.reserve(2 * layers_.size());
  for (size_t i = 0; i < layers_.size(); ++i) {
    Linear& l = layers_[i];
    params.push_back({ParamName(prefix, i, kWeight), l.weight(),
                      l.weight_grad(), static_cast<int64_t>(l.in()) * l.out()});
    params.push_back(
        {ParamName(prefix, i, kBias), l.bias(), l.bias_grad(), l.out()});
  }
  return params;
}

std::vector<Bf16*> Mlp::Bf16Copies() {
  std::vector<Bf16*> copies;
  copies.reserve(2 * layers_.size());
  for (Linear& l : layers_) {
    copies.push_back(precision_ == PRECISION_BF16 ? l.weight_bf16() : nullptr);
    copies.push_back(nullptr);
  }
  return copies;
}

}  // namespace dlrm::dense
