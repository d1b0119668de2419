// DCN's cross network on the device: dense::CrossNet's passes with each
// layer's two maps as Linear layers on cuBLASLt / cuBLAS (cuda_linear.cc;
// their bf16 versions at PRECISION_BF16) and the elementwise parts as the
// kernels of dense_kernels.cu.
#include <algorithm>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/cuda_status.h"
#include "core/status.h"
#include "dense/cuda/cuda_dense.h"

namespace dlrm::dense::cuda {
namespace {

using dlrm::cuda::DeviceBuffer;

// Grows `b` to at least `n` elements (contents lost when it grows) and
// returns its data.
template <typename T>
absl::StatusOr<T*> Sized(DeviceBuffer<T>& b, int64_t n) {
  if (static_cast<int64_t>(b.size()) < n) {
    RETURN_IF_ERROR(b.Resize(static_cast<size_t>(n)));
  }
  return b.data();
}

absl::Status CheckBatch(const char* what, int64_t batch) {
  if (batch < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "DeviceCrossNet::", what, ": batch ", batch, " is negative"));
  }
  return absl::OkStatus();
}

// One layer's forward, dense::CrossNet's LayerForward: p = x_l V^T (no
// bias), q = p W^T + b, x_next = x0 * q + x_l, with `layer`'s v, w and b
// (a DeviceCrossNet::Layer).
template <typename Layer>
absl::Status LayerForward(BlasContext* ctx, const Layer& layer, int n, int r,
                          const float* x0, const float* xl, int64_t batch,
                          float* p, float* q, float* x_next) {
  RETURN_IF_ERROR(LinearForward(ctx, xl, batch, /*in=*/n, /*out=*/r,
                                layer.v.data(), /*b=*/nullptr,
                                /*relu=*/false, p));
  RETURN_IF_ERROR(LinearForward(ctx, p, batch, /*in=*/r, /*out=*/n,
                                layer.w.data(), layer.b.data(),
                                /*relu=*/false, q));
  return internal::CrossCombine(x0, q, xl, batch * n, x_next, ctx->stream());
}

// LayerForward at PRECISION_BF16, dense::CrossNet's LayerForwardBf16: p =
// x_l V^T summed in fp32 (into p_sum) and rounded once to bf16 (p), q = p
// W^T + b in fp32, x_next = x0 * q + x_l, and x_next's bf16 copy into
// x_next_bf16 unless null.
absl::Status LayerForwardBf16(BlasContext* ctx, const Bf16* vb, const Bf16* wb,
                              const float* b, int n, int r, const float* x0,
                              const float* xl, const Bf16* xl_bf16,
                              int64_t batch, float* p_sum, Bf16* p, float* q,
                              float* x_next, Bf16* x_next_bf16) {
  RETURN_IF_ERROR(LinearForwardBf16(ctx, xl_bf16, batch, /*in=*/n, /*out=*/r,
                                    vb, /*b=*/nullptr, /*relu=*/false, p_sum,
                                    p));
  RETURN_IF_ERROR(LinearForwardBf16(ctx, p, batch, /*in=*/r, /*out=*/n, wb, b,
                                    /*relu=*/false, q, /*y_bf16=*/nullptr));
  RETURN_IF_ERROR(
      internal::CrossCombine(x0, q, xl, batch * n, x_next, ctx->stream()));
  if (x_next_bf16 == nullptr) return absl::OkStatus();
  return RoundToBf16(x_next, batch * n, x_next_bf16, ctx->stream());
}

}  // namespace

absl::StatusOr<std::unique_ptr<DeviceCrossNet>> DeviceCrossNet::Create(
    int width, int num_layers, int rank, DensePrecision precision) {
  std::unique_ptr<DeviceCrossNet> net(new DeviceCrossNet());
  net->width_ = width;
  net->rank_ = rank;
  net->precision_ = precision;
  const bool bf16 = precision == PRECISION_BF16;
  net->layers_.resize(std::max(num_layers, 0));
  const size_t matrix = static_cast<size_t>(width) * std::max(rank, 0);
  for (Layer& l : net->layers_) {
    ASSIGN_OR_RETURN(l.v, DeviceBuffer<float>::Allocate(matrix));
    ASSIGN_OR_RETURN(l.w, DeviceBuffer<float>::Allocate(matrix));
    ASSIGN_OR_RETURN(l.b, DeviceBuffer<float>::Allocate(width));
    ASSIGN_OR_RETURN(l.dv, DeviceBuffer<float>::Allocate(matrix));
    ASSIGN_OR_RETURN(l.dw, DeviceBuffer<float>::Allocate(matrix));
    ASSIGN_OR_RETURN(l.db, DeviceBuffer<float>::Allocate(width));
    if (bf16) {
      ASSIGN_OR_RETURN(l.vb, DeviceBuffer<Bf16>::Allocate(matrix));
      ASSIGN_OR_RETURN(l.wb, DeviceBuffer<Bf16>::Allocate(matrix));
    }
  }
  net->x_.resize(net->layers_.empty() ? 0 : net->layers_.size() - 1);
  net->p_.resize(net->layers_.size());
  net->q_.resize(net->layers_.size());
  net->x_bf16_.resize(bf16 ? net->layers_.size() : 0);
  net->p_bf16_.resize(bf16 ? net->layers_.size() : 0);
  return net;
}

absl::Status DeviceCrossNet::SyncBf16Weights(cudaStream_t stream) {
  if (precision_ != PRECISION_BF16) return absl::OkStatus();
  for (Layer& l : layers_) {
    RETURN_IF_ERROR(RoundToBf16(l.v.data(), static_cast<int64_t>(l.v.size()),
                                l.vb.data(), stream));
    RETURN_IF_ERROR(RoundToBf16(l.w.data(), static_cast<int64_t>(l.w.size()),
                                l.wb.data(), stream));
  }
  return absl::OkStatus();
}

std::vector<DeviceParamRef> DeviceCrossNet::Parameters() const {
  std::vector<DeviceParamRef> params;
  params.reserve(3 * layers_.size());
  for (const Layer& l : layers_) {
    params.push_back(
        {l.v.data(), l.dv.data(), static_cast<int64_t>(l.v.size())});
    params.push_back(
        {l.w.data(), l.dw.data(), static_cast<int64_t>(l.w.size())});
    params.push_back(
        {l.b.data(), l.db.data(), static_cast<int64_t>(l.b.size())});
  }
  return params;
}

absl::Status DeviceCrossNet::ForwardBf16(BlasContext* ctx, const float* x0,
                                         int64_t batch, float* out) {
  const int n = width_, r = rank_, num = num_layers();
  ASSIGN_OR_RETURN(Bf16 * x0_bf16, Sized(x_bf16_[0], batch * n));
  RETURN_IF_ERROR(RoundToBf16(x0, batch * n, x0_bf16, ctx->stream()));
  const float* xl = x0;
  for (int l = 0; l < num; ++l) {
    const bool last = l + 1 == num;
    ASSIGN_OR_RETURN(float* p_sum, Sized(p_[l], batch * r));
    ASSIGN_OR_RETURN(Bf16 * p, Sized(p_bf16_[l], batch * r));
    ASSIGN_OR_RETURN(float* q, Sized(q_[l], batch * n));
    float* x_next = out;
    Bf16* x_next_bf16 = nullptr;
    if (!last) {
      ASSIGN_OR_RETURN(x_next, Sized(x_[l], batch * n));
      ASSIGN_OR_RETURN(x_next_bf16, Sized(x_bf16_[l + 1], batch * n));
    }
    const Layer& layer = layers_[l];
    RETURN_IF_ERROR(LayerForwardBf16(
        ctx, layer.vb.data(), layer.wb.data(), layer.b.data(), n, r, x0, xl,
        x_bf16_[l].data(), batch, p_sum, p, q, x_next, x_next_bf16));
    xl = x_next;
  }
  return absl::OkStatus();
}

absl::Status DeviceCrossNet::InferBf16(BlasContext* ctx, const float* x0,
                                       int64_t batch, float* out,
                                       DeviceBuffer<float>* scratch) const {
  const int n = width_, r = rank_, num = num_layers();
  // In floats, each part at a multiple of 256 bytes (64 floats or 128
  // bf16s): p's fp32 sum, q, x_l (two, in turns, from two layers on), then
  // in bf16 x_0, x_l (two, in turns) and p.
  auto aligned = [](int64_t floats) { return (floats + 63) / 64 * 64; };
  const int64_t p_floats = aligned(batch * r), rows = aligned(batch * n);
  const int64_t rows_bf16 = aligned((batch * n + 1) / 2);
  const int64_t p_bf16 = aligned((batch * r + 1) / 2);
  const int64_t xs = num > 1 ? 2 : 0;
  ASSIGN_OR_RETURN(float* p_sum, Sized(*scratch, p_floats + (1 + xs) * rows +
                                                     3 * rows_bf16 + p_bf16));
  float* q = p_sum + p_floats;
  float* x[2] = {q + rows, q + 2 * rows};
  Bf16* bf16 = reinterpret_cast<Bf16*>(q + (1 + xs) * rows);
  Bf16* xb[3] = {bf16, bf16 + 2 * rows_bf16, bf16 + 4 * rows_bf16};
  Bf16* p = bf16 + 6 * rows_bf16;
  RETURN_IF_ERROR(RoundToBf16(x0, batch * n, xb[0], ctx->stream()));
  const float* xl = x0;
  const Bf16* xlb = xb[0];
  for (int l = 0; l < num; ++l) {
    const bool last = l + 1 == num;
    float* x_next = last ? out : x[l % 2];
    Bf16* x_next_bf16 = last ? nullptr : xb[1 + l % 2];
    const Layer& layer = layers_[l];
    RETURN_IF_ERROR(LayerForwardBf16(ctx, layer.vb.data(), layer.wb.data(),
                                     layer.b.data(), n, r, x0, xl, xlb, batch,
                                     p_sum, p, q, x_next, x_next_bf16));
    xl = x_next;
    xlb = x_next_bf16;
  }
  return absl::OkStatus();
}

absl::Status DeviceCrossNet::Forward(BlasContext* ctx, const float* x0,
                                     int64_t batch, float* out) {
  RETURN_IF_ERROR(CheckBatch("Forward", batch));
  const int n = width_, r = rank_, num = num_layers();
  if (batch == 0 || num == 0) return absl::OkStatus();
  if (precision_ == PRECISION_BF16) return ForwardBf16(ctx, x0, batch, out);
  const float* xl = x0;
  for (int l = 0; l < num; ++l) {
    ASSIGN_OR_RETURN(float* p, Sized(p_[l], batch * r));
    ASSIGN_OR_RETURN(float* q, Sized(q_[l], batch * n));
    float* x_next = out;
    if (l + 1 < num) {
      ASSIGN_OR_RETURN(x_next, Sized(x_[l], batch * n));
    }
    RETURN_IF_ERROR(
        LayerForward(ctx, layers_[l], n, r, x0, xl, batch, p, q, x_next));
    xl = x_next;
  }
  return absl::OkStatus();
}

absl::Status DeviceCrossNet::Backward(BlasContext* ctx, const float* x0,
                                      const float* dout, int64_t batch,
                                      float* dx0) {
  RETURN_IF_ERROR(CheckBatch("Backward", batch));
  const int n = width_, r = rank_, num = num_layers();
  if (batch == 0) {
    for (Layer& l : layers_) {
      for (const DeviceBuffer<float>* g : {&l.dv, &l.dw, &l.db}) {
        CUDA_RETURN_IF_ERROR(cudaMemsetAsync(
            g->data(), 0, sizeof(float) * g->size(), ctx->stream()));
      }
    }
    return absl::OkStatus();
  }
  if (num == 0) return absl::OkStatus();
  const bool bf16 = precision_ == PRECISION_BF16;
  ASSIGN_OR_RETURN(float* h, Sized(h_, batch * n));
  ASSIGN_OR_RETURN(float* dp, Sized(dp_, batch * r));
  Bf16* h_bf16 = nullptr;
  Bf16* dp_bf16 = nullptr;
  if (bf16) {
    ASSIGN_OR_RETURN(h_bf16, Sized(h_bf16_, batch * n));
    ASSIGN_OR_RETURN(dp_bf16, Sized(dp_bf16_, batch * r));
  }
  float* buffers[2] = {nullptr, nullptr};
  if (num > 1) {
    ASSIGN_OR_RETURN(buffers[0], Sized(g_[0], batch * n));
  }
  if (num > 2) {
    ASSIGN_OR_RETURN(buffers[1], Sized(g_[1], batch * n));
  }
  const float* g = dout;
  for (int l = num - 1; l >= 0; --l) {
    Layer& layer = layers_[l];
    const float* xl = l == 0 ? x0 : x_[l - 1].data();
    const bool first = l == num - 1, last = l == 0;
    float* g_next = last ? nullptr : buffers[(num - 1 - l) % 2];
    float* dx = last ? dx0 : g_next;
    RETURN_IF_ERROR(internal::CrossBackwardElementwise(
        g, x0, q_[l].data(), batch * n, first, last, h, dx0, g_next,
        ctx->stream()));
    if (bf16) {
      // As dense::CrossNet::BackwardBf16: db from the fp32 h, then h in
      // bf16; dW = h^T p and dp = h W (its fp32 sum rounded once to bf16);
      // dV = dp^T x_l and dx += dp V on the bf16 copies.
      RETURN_IF_ERROR(LinearBackwardBf16(
          ctx, p_bf16_[l].data(), /*y=*/nullptr, h, batch, /*in=*/r,
          /*out=*/n, layer.wb.data(), /*relu=*/false, layer.dw.data(),
          layer.db.data(), dp, h_bf16));
      RETURN_IF_ERROR(RoundToBf16(dp, batch * r, dp_bf16, ctx->stream()));
      RETURN_IF_ERROR(GemmBf16(ctx, 'T', 'N', r, n, batch, dp_bf16, r,
                               x_bf16_[l].data(), n, 0.0f, layer.dv.data(), n));
      RETURN_IF_ERROR(GemmBf16(ctx, 'N', 'N', batch, n, r, dp_bf16, r,
                               layer.vb.data(), n, 1.0f, dx, n));
    } else {
      // W's map as a Linear layer (in r, out N) with output gradient h: db
      // (the CPU's block order), dW = h^T p and dp = h W.
      RETURN_IF_ERROR(LinearBackward(ctx, p_[l].data(), /*y=*/nullptr, h, batch,
                                     /*in=*/r, /*out=*/n, layer.w.data(),
                                     /*relu=*/false, layer.dw.data(),
                                     layer.db.data(), dp));
      // V's map: dV [r x N] = dp^T x_l, and x_l's gradient through it
      // added to g_next (or to dx0 on layer 0).
      RETURN_IF_ERROR(Gemm(ctx, 'T', 'N', r, n, batch, dp, r, xl, n, 0.0f,
                           layer.dv.data(), n));
      RETURN_IF_ERROR(Gemm(ctx, 'N', 'N', batch, n, r, dp, r, layer.v.data(), n,
                           1.0f, dx, n));
    }
    g = g_next;
  }
  return absl::OkStatus();
}

absl::Status DeviceCrossNet::Infer(BlasContext* ctx, const float* x0,
                                   int64_t batch, float* out,
                                   DeviceBuffer<float>* scratch) const {
  RETURN_IF_ERROR(CheckBatch("Infer", batch));
  const int n = width_, r = rank_, num = num_layers();
  if (batch == 0 || num == 0) return absl::OkStatus();
  if (precision_ == PRECISION_BF16) {
    return InferBf16(ctx, x0, batch, out, scratch);
  }
  // p, q and (from two layers on) x_l in turns, each at a multiple of 256
  // bytes: cuBLASLt's heuristic assumes operands that aligned.
  auto aligned = [](int64_t floats) { return (floats + 63) / 64 * 64; };
  const int64_t p_floats = aligned(batch * r), rows = aligned(batch * n);
  const int64_t xs = num > 1 ? 2 : 0;
  ASSIGN_OR_RETURN(float* p, Sized(*scratch, p_floats + (1 + xs) * rows));
  float* q = p + p_floats;
  float* x[2] = {q + rows, q + 2 * rows};
  const float* xl = x0;
  for (int l = 0; l < num; ++l) {
    float* x_next = l + 1 == num ? out : x[l % 2];
    RETURN_IF_ERROR(
        LayerForward(ctx, layers_[l], n, r, x0, xl, batch, p, q, x_next));
    xl = x_next;
  }
  return absl::OkStatus();
}

}  // namespace dlrm::dense::cuda
