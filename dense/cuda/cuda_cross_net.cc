// DCN's cross network on the device: dense::CrossNet's passes with each
// layer's two maps as Linear layers on cuBLASLt / cuBLAS (cuda_linear.cc)
// and the elementwise parts as the kernels of dense_kernels.cu.
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
absl::StatusOr<float*> Sized(DeviceBuffer<float>& b, int64_t n) {
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
// bias), q = p W^T + b, x_next = x0 * q + x_l.
absl::Status LayerForward(BlasContext* ctx, const float* v, const float* w,
                          const float* b, int n, int r, const float* x0,
                          const float* xl, int64_t batch, float* p, float* q,
                          float* x_next) {
  RETURN_IF_ERROR(LinearForward(ctx, xl, batch, /*in=*/n, /*out=*/r, v,
                                /*b=*/nullptr, /*relu=*/false, p));
  RETURN_IF_ERROR(LinearForward(ctx, p, batch, /*in=*/r, /*out=*/n, w, b,
                                /*relu=*/false, q));
  return internal::CrossCombine(x0, q, xl, batch * n, x_next, ctx->stream());
}

}  // namespace

absl::StatusOr<std::unique_ptr<DeviceCrossNet>> DeviceCrossNet::Create(
    int width, int num_layers, int rank) {
  std::unique_ptr<DeviceCrossNet> net(new DeviceCrossNet());
  net->width_ = width;
  net->rank_ = rank;
  net->layers_.resize(std::max(num_layers, 0));
  const size_t matrix = static_cast<size_t>(width) * std::max(rank, 0);
  for (Layer& l : net->layers_) {
    ASSIGN_OR_RETURN(l.v, DeviceBuffer<float>::Allocate(matrix));
    ASSIGN_OR_RETURN(l.w, DeviceBuffer<float>::Allocate(matrix));
    ASSIGN_OR_RETURN(l.b, DeviceBuffer<float>::Allocate(width));
    ASSIGN_OR_RETURN(l.dv, DeviceBuffer<float>::Allocate(matrix));
    ASSIGN_OR_RETURN(l.dw, DeviceBuffer<float>::Allocate(matrix));
    ASSIGN_OR_RETURN(l.db, DeviceBuffer<float>::Allocate(width));
  }
  net->x_.resize(net->layers_.empty() ? 0 : net->layers_.size() - 1);
  net->p_.resize(net->layers_.size());
  net->q_.resize(net->layers_.size());
  return net;
}

absl::Status DeviceCrossNet::Forward(BlasContext* ctx, const float* x0,
                                     int64_t batch, float* out) {
  RETURN_IF_ERROR(CheckBatch("Forward", batch));
  const int n = width_, r = rank_, num = num_layers();
  if (batch == 0 || num == 0) return absl::OkStatus();
  const float* xl = x0;
  for (int l = 0; l < num; ++l) {
    ASSIGN_OR_RETURN(float* p, Sized(p_[l], batch * r));
    ASSIGN_OR_RETURN(float* q, Sized(q_[l], batch * n));
    float* x_next = out;
    if (l + 1 < num) {
      ASSIGN_OR_RETURN(x_next, Sized(x_[l], batch * n));
    }
    const Layer& layer = layers_[l];
    RETURN_IF_ERROR(LayerForward(ctx, layer.v.data(), layer.w.data(),
                                 layer.b.data(), n, r, x0, xl, batch, p, q,
                                 x_next));
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
  ASSIGN_OR_RETURN(float* h, Sized(h_, batch * n));
  ASSIGN_OR_RETURN(float* dp, Sized(dp_, batch * r));
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
    RETURN_IF_ERROR(internal::CrossBackwardElementwise(
        g, x0, q_[l].data(), batch * n, first, last, h, dx0, g_next,
        ctx->stream()));
    // W's map as a Linear layer (in r, out N) with output gradient h: db
    // (the CPU's block order), dW = h^T p and dp = h W.
    RETURN_IF_ERROR(LinearBackward(ctx, p_[l].data(), /*y=*/nullptr, h, batch,
                                   /*in=*/r, /*out=*/n, layer.w.data(),
                                   /*relu=*/false, layer.dw.data(),
                                   layer.db.data(), dp));
    // V's map: dV [r x N] = dp^T x_l, and x_l's gradient through it added
    // to g_next (or to dx0 on layer 0).
    RETURN_IF_ERROR(Gemm(ctx, 'T', 'N', r, n, batch, dp, r, xl, n, 0.0f,
                         layer.dv.data(), n));
    RETURN_IF_ERROR(Gemm(ctx, 'N', 'N', batch, n, r, dp, r, layer.v.data(), n,
                         1.0f, last ? dx0 : g_next, n));
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
    const Layer& layer = layers_[l];
    RETURN_IF_ERROR(LayerForward(ctx, layer.v.data(), layer.w.data(),
                                 layer.b.data(), n, r, x0, xl, batch, p, q,
                                 x_next));
    xl = x_next;
  }
  return absl::OkStatus();
}

}  // namespace dlrm::dense::cuda
