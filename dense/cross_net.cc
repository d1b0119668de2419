// DCNv2's low-rank cross network on the CPU: each layer's two maps on
// oneDNN's sgemm (or, in bf16, the AMX kernel of dense/amx_gemm.h where
// the tiles run and oneDNN's matmul elsewhere), the bias, product, residual and
// bf16 roundings in one pass over the rows (plain loops the compiler
// vectorises), and the reference in double.
#include "dense/cross_net.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <utility>

#include "dense/amx_gemm.h"

namespace dlrm::dense {
namespace {

// Rows per block of the elementwise passes. The bias gradient is summed per
// block, then over blocks in order (as Linear's bias gradient), so it does
// not depend on the thread count.
constexpr int64_t kRowBlock = 64;

// Element-wise passes below this many floats run on one thread: an OpenMP
// region costs more than it saves.
constexpr int64_t kParallelFloats = 1 << 14;

// Grows `v` to at least `n` elements (never shrinks) and returns its data.
template <typename T>
T* Sized(AlignedVector<T>& v, int64_t n) {
  if (static_cast<int64_t>(v.size()) < n) v.resize(n);
  return v.data();
}

int64_t Blocks(int64_t rows) { return (rows + kRowBlock - 1) / kRowBlock; }

// One layer's forward on `batch` rows of width n: p = x_l V^T, q = p W^T +
// b, x_next = x0 * q + x_l. Training and inference both run it, so they
// compute the same bits. Its elementwise part after the GEMMs (the AMX
// kernel does the same in its epilogue): q += b, x_next = x0 * q + x_l,
// and x_next's bf16 copy into x_next_bf16 unless null.
void BiasProductResidual(const float* b, int n, const float* x0,
                         const float* xl, int64_t batch, float* q,
                         float* x_next, Bf16* x_next_bf16) {
  const int64_t blocks = Blocks(batch);
#pragma omp parallel for schedule(static) if (batch * n >= kParallelFloats)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t end = std::min(batch, (blk + 1) * kRowBlock);
    for (int64_t row = blk * kRowBlock; row < end; ++row) {
      const int64_t at = row * n;
      float* __restrict__ qr = q + at;
      float* __restrict__ xr = x_next + at;
      const float* __restrict__ x0r = x0 + at;
      const float* __restrict__ xlr = xl + at;
      for (int c = 0; c < n; ++c) {
        const float qv = qr[c] + b[c];
        qr[c] = qv;
        xr[c] = x0r[c] * qv + xlr[c];
      }
      if (x_next_bf16 != nullptr) {
        Bf16* __restrict__ xb = x_next_bf16 + at;
        for (int c = 0; c < n; ++c) xb[c] = ToBf16(xr[c]);
      }
    }
  }
}

void LayerForward(const float* v, const float* w, const float* b, int n, int r,
                  const float* x0, const float* xl, int64_t batch, float* p,
                  float* q, float* x_next) {
  Sgemm('N', 'T', batch, r, n, xl, n, v, n, 0.0f, p, r);
  Sgemm('N', 'T', batch, n, r, p, r, w, r, 0.0f, q, n);
  BiasProductResidual(b, n, x0, xl, batch, q, x_next, nullptr);
}

// LayerForward at PRECISION_BF16: p = x_l V^T in bf16 (fp32 sums rounded
// once), q = p W^T + b in fp32; x_l's bf16 copy in xl_bf16, x_next's
// written to x_next_bf16 unless null.
void LayerForwardBf16(const Bf16* vb, const Bf16* wb, const float* b, int n,
                      int r, const float* x0, const float* xl,
                      const Bf16* xl_bf16, int64_t batch, Bf16* p, float* q,
                      float* x_next, Bf16* x_next_bf16) {
  if (AmxGemmUsable()) {
    // The AMX kernel (dense/amx_gemm.h), the weights packed for its tiles
    // on every call (V and W are [r x n] and [n x r]: 1/batch of a
    // product's work) into the calling thread's buffers.
    // The second product's epilogue is BiasProductResidual's arithmetic
    // (q = sum + b kept, x_next = x0 * q + x_l), on each block of outputs
    // as it leaves the tiles: q is written once and not read back.
    thread_local AmxPackedB packed_v, packed_w;
    packed_v.PackTransposed(vb, n, r, n);
    AmxGemm(batch, xl_bf16, n, packed_v, {nullptr, false, nullptr, p, r});
    packed_w.PackTransposed(wb, r, n, r);
    AmxEpilogue out{b, false, x_next, x_next_bf16, n};
    out.pre_f32 = q;
    out.mul = x0;
    out.add = xl;
    AmxGemm(batch, p, r, packed_w, out);
    return;
  }
  BgemmToBf16('N', 'T', batch, r, n, xl_bf16, n, vb, n, p, r);
  Bgemm('N', 'T', batch, n, r, p, r, wb, r, 0.0f, q, n);
  BiasProductResidual(b, n, x0, xl, batch, q, x_next, x_next_bf16);
}

// A layer's four backward products at PRECISION_BF16 on the AMX kernel:
// dW = h^T p and dV = dp^T x_l from transposed copies of h and dp (the
// kernel's A operand is row-major over the reduction), dp = h W rounded
// to bf16, and dx = g + dp V when g is non-null (the gradient wrt x_l:
// its direct path plus the path through V), else dp V added to dx (fp32).
void LayerGradsAmx(int n, int r, int64_t batch, const Bf16* h, const Bf16* p,
                   const Bf16* xl, const Bf16* wb, const Bf16* vb, float* dw,
                   float* dv, Bf16* dp, const float* g, float* dx) {
  thread_local AlignedVector<Bf16> transposed;
  thread_local AmxPackedB packed;
  const int64_t ld = AmxTransposedLd(batch);
  Bf16* t = Sized(transposed, std::max<int64_t>(n, r) * ld);
  const int64_t blocks = Blocks(batch);
  auto transpose = [&](const Bf16* src, int cols) {
#pragma omp parallel for schedule(static) if (batch * cols >= kParallelFloats)
    for (int64_t blk = 0; blk < blocks; ++blk) {
      const int64_t r0 = blk * kRowBlock;
      TransposeBf16(src + r0 * cols, std::min(kRowBlock, batch - r0), cols,
                    cols, t + r0, ld);
    }
  };
  transpose(h, n);
  packed.Pack(p, batch, r, r);
  AmxGemm(n, t, ld, packed, {nullptr, false, dw, nullptr, r});
  packed.Pack(wb, n, r, r);
  AmxGemm(batch, h, n, packed, {nullptr, false, nullptr, dp, r});
  transpose(dp, r);
  packed.Pack(xl, batch, n, n);
  AmxGemm(r, t, ld, packed, {nullptr, false, dv, nullptr, n});
  packed.Pack(vb, r, n, n);
  AmxEpilogue out{nullptr, false, dx, nullptr, n, /*accumulate=*/g == nullptr};
  out.add = g;
  AmxGemm(batch, dp, r, packed, out);
}

inline void Put(float* p, float v) { *p = v; }
inline void Put(Bf16* p, float v) { *p = ToBf16(v); }

// Rows [begin, end) of one layer's elementwise backward, from g (the
// gradient wrt x_{l+1}): h = g * x0 (W's output gradient), dx0 += g * q
// (dx0 = g * q on the first layer visited, kFirst), and the gradient wrt
// x_l's direct path: g copied to g_next (unless null: the AMX path adds g
// in its last product's epilogue), or added to dx0 on layer 0 (kLast, whose
// x_l is x_0). Writes h's column sums over the rows to `sum`.
template <bool kFirst, bool kLast, typename H>
void BackwardRows(const float* g, const float* x0, const float* q,
                  int64_t begin, int64_t end, int n, H* h, float* dx0,
                  float* g_next, float* __restrict__ sum) {
  std::fill(sum, sum + n, 0.0f);
  for (int64_t row = begin; row < end; ++row) {
    const int64_t at = row * n;
    const float* __restrict__ gr = g + at;
    const float* __restrict__ x0r = x0 + at;
    const float* __restrict__ qr = q + at;
    H* __restrict__ hr = h + at;
    float* __restrict__ dxr = dx0 + at;
    for (int c = 0; c < n; ++c) {
      const float gv = gr[c];
      const float hv = gv * x0r[c];
      Put(hr + c, hv);
      sum[c] += hv;
      float d = gv * qr[c];
      if constexpr (!kFirst) d = dxr[c] + d;
      if constexpr (kLast) d += gv;
      dxr[c] = d;
    }
    if (!kLast && g_next != nullptr) {
      std::memcpy(g_next + at, gr, sizeof(float) * n);
    }
  }
}

template <bool kFirst, bool kLast, typename H>
void BackwardPass(const float* g, const float* x0, const float* q,
                  int64_t batch, int n, H* h, float* dx0, float* g_next,
                  float* partial) {
  const int64_t blocks = Blocks(batch);
#pragma omp parallel for schedule(static) if (batch * n >= kParallelFloats)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    BackwardRows<kFirst, kLast, H>(g, x0, q, blk * kRowBlock,
                                   std::min(batch, (blk + 1) * kRowBlock), n, h,
                                   dx0, g_next, partial + blk * n);
  }
}

// BackwardPass for layer l of `num`, visited from the last.
template <typename H>
void BackwardPassOf(int l, int num, const float* g, const float* x0,
                    const float* q, int64_t batch, int n, H* h, float* dx0,
                    float* g_next, float* partial) {
  const bool first = l == num - 1, last = l == 0;
  if (first && last) {
    BackwardPass<true, true>(g, x0, q, batch, n, h, dx0, g_next, partial);
  } else if (first) {
    BackwardPass<true, false>(g, x0, q, batch, n, h, dx0, g_next, partial);
  } else if (last) {
    BackwardPass<false, true>(g, x0, q, batch, n, h, dx0, g_next, partial);
  } else {
    BackwardPass<false, false>(g, x0, q, batch, n, h, dx0, g_next, partial);
  }
}

}  // namespace

CrossNet::CrossNet(int width, int num_layers, int rank)
    : width_(width), rank_(rank), layers_(std::max(num_layers, 0)) {
  const size_t matrix = static_cast<size_t>(width) * std::max(rank, 0);
  for (Layer& l : layers_) {
    l.v.resize(matrix);
    l.w.resize(matrix);
    l.b.resize(width);
    l.dv.resize(matrix);
    l.dw.resize(matrix);
    l.db.resize(width);
  }
  x_.resize(layers_.empty() ? 0 : layers_.size() - 1);
  p_.resize(layers_.size());
  q_.resize(layers_.size());
}

InteractionLayerFloats CrossNet::FloatsPerSample(int width, int num_layers,
                                                 int rank) {
  const int64_t n = width, r = rank, layers = num_layers;
  // Training: x_l for l in [1, L), p_l and q_l per layer; the backward's h,
  // dp and its two gradient buffers. Infer: p, q and two x_l.
  return {(layers - 1) * n + layers * (r + n) + n + r + (layers > 1 ? n : 0) +
              (layers > 2 ? n : 0),
          r + 3 * n};
}

void CrossNet::Init(Rng* rng) {
  // torch.nn.init.xavier_normal_: std = sqrt(2 / (fan_in + fan_out)), and
  // fan_in + fan_out = N + r for both [r x N] and [N x r].
  const double stddev = std::sqrt(2.0 / (width_ + rank_));
  for (Layer& l : layers_) {
    for (float& x : l.v) x = static_cast<float>(rng->Normal() * stddev);
    for (float& x : l.w) x = static_cast<float>(rng->Normal() * stddev);
    std::fill(l.b.begin(), l.b.end(), 0.0f);
  }
  SyncBf16Weights();
}

void CrossNet::SetPrecision(DensePrecision precision) {
  precision_ = precision;
  const size_t num = precision == PRECISION_BF16 ? layers_.size() : 0;
  x_bf16_.resize(num);
  p_bf16_.resize(num);
  SyncBf16Weights();
}

void CrossNet::SyncBf16Weights() {
  if (precision_ != PRECISION_BF16) return;
  for (Layer& l : layers_) {
    l.vb.resize(l.v.size());
    l.wb.resize(l.w.size());
    ToBf16(l.v.data(), static_cast<int64_t>(l.v.size()), l.vb.data());
    ToBf16(l.w.data(), static_cast<int64_t>(l.w.size()), l.wb.data());
  }
}

void CrossNet::ForwardBf16(const float* x0, int64_t batch, float* out) {
  const int n = width_, r = rank_;
  const int num = num_layers();
  ToBf16(x0, batch * n, Sized(x_bf16_[0], batch * n));
  const float* xl = x0;
  for (int l = 0; l < num; ++l) {
    const bool last = l + 1 == num;
    float* q = Sized(q_[l], batch * n);
    float* x_next = last ? out : Sized(x_[l], batch * n);
    Bf16* x_next_bf16 = last ? nullptr : Sized(x_bf16_[l + 1], batch * n);
    const Layer& layer = layers_[l];
    LayerForwardBf16(layer.vb.data(), layer.wb.data(), layer.b.data(), n, r, x0,
                     xl, x_bf16_[l].data(), batch, Sized(p_bf16_[l], batch * r),
                     q, x_next, x_next_bf16);
    xl = x_next;
  }
}

void CrossNet::BackwardBf16(const float* x0, const float* dout, int64_t batch,
                            float* dx0) {
  const int n = width_, r = rank_;
  const int num = num_layers();
  const int64_t blocks = Blocks(batch);
  Bf16* h = Sized(h_bf16_, batch * n);
  Bf16* dp = Sized(dp_bf16_, batch * r);
  float* partial = Sized(partial_, blocks * n);
  float* buffers[2] = {Sized(g_a_, num > 1 ? batch * n : 0),
                       Sized(g_b_, num > 2 ? batch * n : 0)};
  const float* g = dout;
  for (int l = num - 1; l >= 0; --l) {
    Layer& layer = layers_[l];
    const Bf16* xl = x_bf16_[l].data();
    const Bf16* p = p_bf16_[l].data();
    const float* q = q_[l].data();
    float* g_next = l == 0 ? nullptr : buffers[(num - 1 - l) % 2];
    const bool last = l == 0;
    const bool amx = AmxGemmUsable();
    // On the AMX path g reaches g_next in the last product's epilogue.
    BackwardPassOf(l, num, g, x0, q, batch, n, h, dx0, amx ? nullptr : g_next,
                   partial);
    SumBlocks(partial, blocks, n, layer.db.data());
    // As Backward's four products, on the bf16 copies.
    if (amx) {
      LayerGradsAmx(n, r, batch, h, p, xl, layer.wb.data(), layer.vb.data(),
                    layer.dw.data(), layer.dv.data(), dp, last ? nullptr : g,
                    last ? dx0 : g_next);
      g = g_next;
      continue;
    }
    Bgemm('T', 'N', n, r, batch, h, n, p, r, 0.0f, layer.dw.data(), r);
    BgemmToBf16('N', 'N', batch, r, n, h, n, layer.wb.data(), r, dp, r);
    Bgemm('T', 'N', r, n, batch, dp, r, xl, n, 0.0f, layer.dv.data(), n);
    Bgemm('N', 'N', batch, n, r, dp, r, layer.vb.data(), n, 1.0f,
          last ? dx0 : g_next, n);
    g = g_next;
  }
}

void CrossNet::InferBf16(const float* x0, int64_t batch, float* out,
                         AlignedVector<float>* scratch) const {
  const int n = width_, r = rank_;
  const int num = num_layers();
  const int64_t rows = batch * n;
  // fp32: q and (from two layers on) x_l in turns; bf16: x_0, x_l in turns,
  // p.
  const int64_t xs = num > 1 ? 2 : 0;
  if (static_cast<int64_t>(scratch->size()) < (1 + xs) * rows) {
    scratch->resize((1 + xs) * rows);
  }
  if (static_cast<int64_t>(infer_bf16_.size()) < 3 * rows + batch * r) {
    infer_bf16_.resize(3 * rows + batch * r);
  }
  float* q = scratch->data();
  float* x[2] = {q + rows, q + 2 * rows};
  Bf16* xb[3] = {infer_bf16_.data(), infer_bf16_.data() + rows,
                 infer_bf16_.data() + 2 * rows};
  Bf16* p = infer_bf16_.data() + 3 * rows;
  ToBf16(x0, rows, xb[0]);
  const float* xl = x0;
  const Bf16* xlb = xb[0];
  for (int l = 0; l < num; ++l) {
    const bool last = l + 1 == num;
    float* x_next = last ? out : x[l % 2];
    Bf16* x_next_bf16 = last ? nullptr : xb[1 + l % 2];
    const Layer& layer = layers_[l];
    LayerForwardBf16(layer.vb.data(), layer.wb.data(), layer.b.data(), n, r, x0,
                     xl, xlb, batch, p, q, x_next, x_next_bf16);
    xl = x_next;
    xlb = x_next_bf16;
  }
}

void CrossNet::Forward(const float* x0, int64_t batch, float* out) {
  const int n = width_, r = rank_;
  const int num = num_layers();
  if (batch <= 0 || num == 0) return;
  if (precision_ == PRECISION_BF16) return ForwardBf16(x0, batch, out);
  const float* xl = x0;
  for (int l = 0; l < num; ++l) {
    float* p = Sized(p_[l], batch * r);
    float* q = Sized(q_[l], batch * n);
    float* x_next = l + 1 == num ? out : Sized(x_[l], batch * n);
    const Layer& layer = layers_[l];
    LayerForward(layer.v.data(), layer.w.data(), layer.b.data(), n, r, x0, xl,
                 batch, p, q, x_next);
    xl = x_next;
  }
}

void CrossNet::Backward(const float* x0, const float* dout, int64_t batch,
                        float* dx0) {
  const int n = width_, r = rank_;
  const int num = num_layers();
  if (batch <= 0) {
    for (Layer& l : layers_) {
      std::fill(l.dv.begin(), l.dv.end(), 0.0f);
      std::fill(l.dw.begin(), l.dw.end(), 0.0f);
      std::fill(l.db.begin(), l.db.end(), 0.0f);
    }
    return;
  }
  if (num == 0) return;
  if (precision_ == PRECISION_BF16) return BackwardBf16(x0, dout, batch, dx0);
  const int64_t blocks = Blocks(batch);
  float* h = Sized(h_, batch * n);
  float* dp = Sized(dp_, batch * r);
  float* partial = Sized(partial_, blocks * n);
  float* buffers[2] = {Sized(g_a_, num > 1 ? batch * n : 0),
                       Sized(g_b_, num > 2 ? batch * n : 0)};
  const float* g = dout;
  for (int l = num - 1; l >= 0; --l) {
    Layer& layer = layers_[l];
    const float* xl = l == 0 ? x0 : x_[l - 1].data();
    const float* p = p_[l].data();
    const float* q = q_[l].data();
    float* g_next = l == 0 ? nullptr : buffers[(num - 1 - l) % 2];
    const bool last = l == 0;
    BackwardPassOf(l, num, g, x0, q, batch, n, h, dx0, g_next, partial);
    SumBlocks(partial, blocks, n, layer.db.data());
    // dW [N x r] = h^T p; dp [batch x r] = h W; dV [r x N] = dp^T x_l.
    Sgemm('T', 'N', n, r, batch, h, n, p, r, 0.0f, layer.dw.data(), r);
    Sgemm('N', 'N', batch, r, n, h, n, layer.w.data(), r, 0.0f, dp, r);
    Sgemm('T', 'N', r, n, batch, dp, r, xl, n, 0.0f, layer.dv.data(), n);
    // The gradient wrt x_l through V: added to g_next, or to dx0 on layer 0.
    Sgemm('N', 'N', batch, n, r, dp, r, layer.v.data(), n, 1.0f,
          last ? dx0 : g_next, n);
    g = g_next;
  }
}

void CrossNet::Infer(const float* x0, int64_t batch, float* out,
                     AlignedVector<float>* scratch) const {
  const int n = width_, r = rank_;
  const int num = num_layers();
  if (batch <= 0 || num == 0) return;
  if (precision_ == PRECISION_BF16) return InferBf16(x0, batch, out, scratch);
  const int64_t rows = batch * n;
  // p, q and (from two layers on) x_l in turns.
  const int64_t xs = num > 1 ? 2 : 0;
  if (static_cast<int64_t>(scratch->size()) < batch * r + (1 + xs) * rows) {
    scratch->resize(batch * r + (1 + xs) * rows);
  }
  float* p = scratch->data();
  float* q = p + batch * r;
  float* x[2] = {q + rows, q + 2 * rows};
  const float* xl = x0;
  for (int l = 0; l < num; ++l) {
    float* x_next = l + 1 == num ? out : x[l % 2];
    const Layer& layer = layers_[l];
    LayerForward(layer.v.data(), layer.w.data(), layer.b.data(), n, r, x0, xl,
                 batch, p, q, x_next);
    xl = x_next;
  }
}

std::vector<ParamRef> CrossNet::Parameters() {
  std::vector<ParamRef> params;
  params.reserve(3 * layers_.size());
  for (Layer& layer : layers_) {
    const int64_t matrix = static_cast<int64_t>(layer.v.size());
    params.push_back({"", layer.v.data(), layer.dv.data(), matrix});
    params.push_back({"", layer.w.data(), layer.dw.data(), matrix});
    params.push_back({"", layer.b.data(), layer.db.data(),
                      static_cast<int64_t>(layer.b.size())});
  }
  return params;
}

std::vector<Bf16*> CrossNet::Bf16Copies() {
  std::vector<Bf16*> copies;
  copies.reserve(3 * layers_.size());
  const bool bf16 = precision_ == PRECISION_BF16;
  for (Layer& layer : layers_) {
    copies.push_back(bf16 ? layer.vb.data() : nullptr);
    copies.push_back(bf16 ? layer.wb.data() : nullptr);
    copies.push_back(nullptr);
  }
  return copies;
}

namespace reference {

std::vector<double> CrossNetForward(const CrossNet& net, const float* x0,
                                    int64_t batch) {
  const int n = net.width(), r = net.rank();
  std::vector<double> out(static_cast<size_t>(batch) * n);
  std::vector<double> xl(n), p(r);
  for (int64_t s = 0; s < batch; ++s) {
    const float* x0s = x0 + s * n;
    for (int c = 0; c < n; ++c) xl[c] = x0s[c];
    for (int l = 0; l < net.num_layers(); ++l) {
      const float* v = net.v(l);
      const float* w = net.w(l);
      const float* b = net.bias(l);
      for (int k = 0; k < r; ++k) {
        double sum = 0;
        for (int c = 0; c < n; ++c) {
          sum += static_cast<double>(v[k * n + c]) * xl[c];
        }
        p[k] = sum;
      }
      for (int c = 0; c < n; ++c) {
        double q = b[c];
        for (int k = 0; k < r; ++k) {
          q += static_cast<double>(w[c * r + k]) * p[k];
        }
        xl[c] = x0s[c] * q + xl[c];
      }
    }
    std::copy(xl.begin(), xl.end(), out.begin() + s * n);
  }
  return out;
}

}  // namespace reference
}  // namespace dlrm::dense
