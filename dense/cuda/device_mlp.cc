// The CUDA dense backend's MLPs (device_mlp.h).
#include "dense/cuda/device_mlp.h"

#include <algorithm>

namespace dlrm::dense::cuda {

using dlrm::cuda::DeviceBuffer;

absl::Status AllocateMlp(const Mlp& mlp, bool bf16, DeviceMlp* out) {
  std::vector<DeviceLayer>& layers = out->layers;
  layers.resize(mlp.layers().size());
  for (size_t i = 0; i < layers.size(); ++i) {
    const Linear& l = mlp.layers()[i];
    DeviceLayer& d = layers[i];
    d.in = l.in();
    d.out = l.out();
    d.relu = l.relu();
    const size_t weights = static_cast<size_t>(l.in()) * l.out();
    ASSIGN_OR_RETURN(d.w, DeviceBuffer<float>::Allocate(weights));
    ASSIGN_OR_RETURN(d.dw, DeviceBuffer<float>::Allocate(weights));
    ASSIGN_OR_RETURN(d.b, DeviceBuffer<float>::Allocate(l.out()));
    ASSIGN_OR_RETURN(d.db, DeviceBuffer<float>::Allocate(l.out()));
    if (bf16) {
      ASSIGN_OR_RETURN(d.wb, DeviceBuffer<Bf16>::Allocate(weights));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<const float*> MlpTrainForward(BlasContext* blas, bool bf16,
                                             DeviceMlp& mlp, const float* x,
                                             int64_t batch) {
  const cudaStream_t stream = blas->stream();
  std::vector<DeviceLayer>& layers = mlp.layers;
  if (bf16) {
    const int64_t in_floats = batch * layers.front().in;
    ASSIGN_OR_RETURN(Bf16 * in, Sized(mlp.x_bf16, in_floats));
    RETURN_IF_ERROR(RoundToBf16(x, in_floats, in, stream));
    for (size_t i = 0; i < layers.size(); ++i) {
      DeviceLayer& l = layers[i];
      ASSIGN_OR_RETURN(float* y, Sized(l.y, batch * l.out));
      Bf16* yb = nullptr;
      if (i + 1 < layers.size()) {
        ASSIGN_OR_RETURN(yb, Sized(l.yb, batch * l.out));
      }
      RETURN_IF_ERROR(LinearForwardBf16(blas, in, batch, l.in, l.out,
                                        l.wb.data(), l.b.data(), l.relu, y,
                                        yb));
      in = yb;
    }
    return layers.back().y.data();
  }
  const float* in = x;
  for (DeviceLayer& l : layers) {
    ASSIGN_OR_RETURN(float* y, Sized(l.y, batch * l.out));
    RETURN_IF_ERROR(LinearForward(blas, in, batch, l.in, l.out, l.w.data(),
                                  l.b.data(), l.relu, y));
    in = y;
  }
  return in;
}

absl::Status MlpTrainBackward(BlasContext* blas, bool bf16, DeviceMlp& mlp,
                              const float* x, float* dy, int64_t batch,
                              float* dx, MlpScratch* scratch) {
  std::vector<DeviceLayer>& layers = mlp.layers;
  int widest = 0, widest_out = 0;
  for (size_t i = 0; i < layers.size(); ++i) {
    if (i + 1 < layers.size()) widest = std::max(widest, layers[i].out);
    widest_out = std::max(widest_out, layers[i].out);
  }
  ASSIGN_OR_RETURN(float* a, Sized(scratch->grad_a, batch * widest));
  ASSIGN_OR_RETURN(float* b, Sized(scratch->grad_b, batch * widest));
  Bf16* dy_bf16 = nullptr;
  if (bf16) {
    ASSIGN_OR_RETURN(dy_bf16, Sized(scratch->dy_bf16, batch * widest_out));
  }
  const size_t n = layers.size();
  float* grad = dy;
  for (size_t i = n; i-- > 0;) {
    DeviceLayer& l = layers[i];
    float* layer_dx = i == 0 ? dx : ((n - 1 - i) % 2 == 0 ? a : b);
    if (bf16) {
      const Bf16* in = i == 0 ? mlp.x_bf16.data() : layers[i - 1].yb.data();
      RETURN_IF_ERROR(LinearBackwardBf16(
          blas, in, l.y.data(), grad, batch, l.in, l.out, l.wb.data(), l.relu,
          l.dw.data(), l.db.data(), layer_dx, dy_bf16));
    } else {
      const float* in = i == 0 ? x : layers[i - 1].y.data();
      RETURN_IF_ERROR(LinearBackward(blas, in, l.y.data(), grad, batch, l.in,
                                     l.out, l.w.data(), l.relu, l.dw.data(),
                                     l.db.data(), layer_dx));
    }
    grad = layer_dx;
  }
  return absl::OkStatus();
}

absl::Status MlpInfer(BlasContext* blas, bool bf16, const DeviceMlp& mlp,
                      const float* x, int64_t batch, float* out,
                      MlpScratch* buffers) {
  const cudaStream_t stream = blas->stream();
  const std::vector<DeviceLayer>& layers = mlp.layers;
  int widest = 0;
  for (size_t i = 0; i + 1 < layers.size(); ++i) {
    widest = std::max(widest, layers[i].out);
  }
  const int64_t half = batch * widest;
  ASSIGN_OR_RETURN(float* scratch, Sized(buffers->infer, 2 * half));
  if (bf16) {
    // The input, then the hidden outputs in turns, each at a multiple of
    // 256 bytes (cuBLASLt's heuristic assumes operands that aligned).
    auto aligned = [](int64_t n) { return (n + 127) / 128 * 128; };
    const int64_t input = aligned(batch * layers.front().in);
    const int64_t hidden = aligned(half);
    ASSIGN_OR_RETURN(Bf16 * staged,
                     Sized(buffers->infer_bf16, input + 2 * hidden));
    RETURN_IF_ERROR(RoundToBf16(x, batch * layers.front().in, staged, stream));
    const Bf16* in = staged;
    for (size_t i = 0; i < layers.size(); ++i) {
      const DeviceLayer& l = layers[i];
      const bool last = i + 1 == layers.size();
      float* y = last ? out : scratch + (i % 2) * half;
      Bf16* yb = last ? nullptr : staged + input + (i % 2) * hidden;
      RETURN_IF_ERROR(LinearForwardBf16(blas, in, batch, l.in, l.out,
                                        l.wb.data(), l.b.data(), l.relu, y,
                                        yb));
      in = yb;
    }
    return absl::OkStatus();
  }
  const float* in = x;
  for (size_t i = 0; i < layers.size(); ++i) {
    const DeviceLayer& l = layers[i];
    float* y = i + 1 == layers.size() ? out : scratch + (i % 2) * half;
    RETURN_IF_ERROR(LinearForward(blas, in, batch, l.in, l.out, l.w.data(),
                                  l.b.data(), l.relu, y));
    in = y;
  }
  return absl::OkStatus();
}

absl::Status SyncMlpBf16(DeviceMlp& mlp, cudaStream_t stream) {
  for (DeviceLayer& l : mlp.layers) {
    RETURN_IF_ERROR(RoundToBf16(l.w.data(), static_cast<int64_t>(l.w.size()),
                                l.wb.data(), stream));
  }
  return absl::OkStatus();
}

}  // namespace dlrm::dense::cuda
