// The CUDA dense backend's parameters (device_params.h).
#include "dense/cuda/device_params.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "dense/cuda/cuda_dense.h"
#include "dense/cuda/device_copy.h"
#include "dense/optimizer.h"

namespace dlrm::dense::cuda {

using dlrm::cuda::DeviceBuffer;

absl::Status DeviceParams::Add(float* value, float* grad, int64_t size,
                               size_t arrays) {
  DeviceParam p;
  p.value = value;
  p.grad = grad;
  p.size = size;
  for (size_t k = 0; k < arrays; ++k) {
    ASSIGN_OR_RETURN(p.state[k], DeviceBuffer<float>::Allocate(size));
  }
  params_.push_back(std::move(p));
  return absl::OkStatus();
}

absl::Status DeviceParams::AddNetwork(DeviceMlp& bottom,
                                      const DeviceInteractionLayer* interaction,
                                      DeviceMlp& top, size_t arrays) {
  auto add_mlp = [&](DeviceMlp& mlp) -> absl::Status {
    for (DeviceLayer& d : mlp.layers) {
      RETURN_IF_ERROR(Add(d.w.data(), d.dw.data(),
                          static_cast<int64_t>(d.w.size()), arrays));
      RETURN_IF_ERROR(Add(d.b.data(), d.db.data(),
                          static_cast<int64_t>(d.b.size()), arrays));
    }
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(add_mlp(bottom));
  if (interaction != nullptr) {
    for (const DeviceParamRef& p : interaction->Parameters()) {
      RETURN_IF_ERROR(Add(p.value, p.grad, p.size, arrays));
    }
  }
  return add_mlp(top);
}

absl::Status DeviceParams::Finish(const std::vector<ParamRef>& host,
                                  bool layer_wise) {
  if (params_.size() != host.size()) {
    return absl::InternalError(absl::StrCat("CUDA backend: ", params_.size(),
                                            " device parameters for ",
                                            host.size(), " host ones"));
  }
  int64_t largest = 0;
  for (size_t i = 0; i < params_.size(); ++i) {
    params_[i].adapt = AdaptsLayerWise(host[i].name);
    largest = std::max(largest, params_[i].size);
  }
  layer_wise_ = layer_wise;
  if (layer_wise_) {
    ASSIGN_OR_RETURN(layer_scratch_,
                     DeviceBuffer<double>::Allocate(
                         static_cast<size_t>(LayerScratchDoubles(largest))));
  }
  return absl::OkStatus();
}

absl::Status DeviceParams::CopyHostView(const std::vector<ParamRef>& host,
                                        const std::vector<ParamRef>& state,
                                        size_t arrays, cudaMemcpyKind kind,
                                        cudaStream_t stream) const {
  const bool up = kind == cudaMemcpyHostToDevice;
  auto copy = [&](float* device, float* host_side, int64_t n) {
    return up ? CopyAsync(device, host_side, n, kind, stream)
              : CopyAsync(host_side, device, n, kind, stream);
  };
  for (size_t i = 0; i < params_.size(); ++i) {
    const DeviceParam& p = params_[i];
    RETURN_IF_ERROR(copy(p.value, host[i].value, p.size));
    for (size_t k = 0; k < arrays; ++k) {
      RETURN_IF_ERROR(
          copy(p.state[k].data(), state[i * arrays + k].value, p.size));
    }
  }
  return absl::OkStatus();
}

int64_t DeviceParams::GradientFloats(ParamRange range) const {
  int64_t total = 0;
  for (size_t i = range.first; i < range.second; ++i) {
    total += params_[i].size;
  }
  return total;
}

absl::Status DeviceParams::CopyGradients(ParamRange range, float* flat,
                                         bool to_flat, cudaMemcpyKind kind,
                                         cudaStream_t stream) const {
  int64_t at = 0;
  for (size_t i = range.first; i < range.second; ++i) {
    float* grad = params_[i].grad;
    RETURN_IF_ERROR(
        to_flat ? CopyAsync(flat + at, grad, params_[i].size, kind, stream)
                : CopyAsync(grad, flat + at, params_[i].size, kind, stream));
    at += params_[i].size;
  }
  return absl::OkStatus();
}

absl::Status DeviceParams::CopyValuesTo(const DeviceParams& to,
                                        cudaStream_t stream) const {
  for (size_t i = 0; i < params_.size(); ++i) {
    RETURN_IF_ERROR(CopyAsync(to.params_[i].value, params_[i].value,
                              params_[i].size, cudaMemcpyDeviceToDevice,
                              stream));
  }
  return absl::OkStatus();
}

absl::Status DeviceParams::Optimize(OptimizerConfig::Type type,
                                    const double* constants,
                                    cudaStream_t stream) {
  for (DeviceParam& p : params_) {
    if (layer_wise_) {
      RETURN_IF_ERROR(LayerOptimizerUpdate(
          type, constants, p.adapt, p.value, p.grad, p.state[0].data(),
          p.state[1].data(), p.size, &layer_scratch_, stream));
    } else {
      RETURN_IF_ERROR(DenseOptimizerUpdate(type, constants, p.value, p.grad,
                                           p.state[0].data(), p.state[1].data(),
                                           p.size, stream));
    }
  }
  return absl::OkStatus();
}

}  // namespace dlrm::dense::cuda
