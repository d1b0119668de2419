// The CUDA dense backend's parameters on the device (cuda_backend.cc), in
// the host view's order (HostDenseParams::params): each one's value and
// gradient, borrowed from its layer's buffers, and its optimizer state.
// The copies to and from the host view, the all-reduce buckets' packing
// and the optimizer's launches. Not thread-safe; work is queued on the
// stream each call names.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "core/cuda/cuda_raii.h"
#include "dense/cuda/cuda_dense.h"
#include "dense/cuda/device_mlp.h"
#include "dense/linear.h"
#include "dlrm/config.pb.h"

namespace dlrm::dense::cuda {

// A parameter (pointers into its layer's buffers) and its optimizer state.
struct DeviceParam {
  float* value = nullptr;
  float* grad = nullptr;
  int64_t size = 0;
  dlrm::cuda::DeviceBuffer<float> state[2];
  // Takes weight decay and a trust ratio under a layer-wise optimizer
  // (AdaptsLayerWise of its host name).
  bool adapt = true;
};

// Parameters [first, second) (HostDenseParams::Range of a bucket).
using ParamRange = std::pair<size_t, size_t>;

class DeviceParams {
 public:
  // Adds a parameter of `size` floats at `value` with gradient `grad`
  // (device memory, borrowed), and `arrays` state arrays of its size.
  absl::Status Add(float* value, float* grad, int64_t size, size_t arrays);
  // Adds the parameters of the network in the host view's order: the
  // bottom MLP's (weight, bias per layer), the interaction layer's (its
  // Parameters; none when `interaction` is null), the top MLP's; each with
  // `arrays` state arrays.
  absl::Status AddNetwork(DeviceMlp& bottom,
                          const DeviceInteractionLayer* interaction,
                          DeviceMlp& top, size_t arrays);
  // After the last Add: Internal unless there is one per `host` parameter
  // (the same order); notes which adapt layer-wise (by their names) and,
  // when `layer_wise`, allocates LayerOptimizerUpdate's scratch for the
  // largest (so that it never grows inside a captured graph).
  absl::Status Finish(const std::vector<ParamRef>& host, bool layer_wise);

  size_t size() const { return params_.size(); }

  // Queues the copies between the host view's values `host` and optimizer
  // state `state` (`arrays` per parameter, as DenseOptimizer::State lists
  // them) and the device's: up for cudaMemcpyHostToDevice, else down.
  absl::Status CopyHostView(const std::vector<ParamRef>& host,
                            const std::vector<ParamRef>& state, size_t arrays,
                            cudaMemcpyKind kind, cudaStream_t stream) const;

  // Floats of the gradients of parameters `range`.
  int64_t GradientFloats(ParamRange range) const;
  // Copies the gradients of parameters `range` into `flat` back to back
  // (to_flat) or from it into the parameters, as `kind`.
  absl::Status CopyGradients(ParamRange range, float* flat, bool to_flat,
                             cudaMemcpyKind kind, cudaStream_t stream) const;
  // Queues the copy of every value into `to`'s (device to device), which
  // must hold the same parameters.
  absl::Status CopyValuesTo(const DeviceParams& to, cudaStream_t stream) const;

  // Queues every parameter's update under the optimizer `type` (the
  // layer-wise rule when Finish said so), reading the step's constants
  // from `constants` (device memory, an optim::PackedStep).
  absl::Status Optimize(OptimizerConfig::Type type, const double* constants,
                        cudaStream_t stream);

 private:
  std::vector<DeviceParam> params_;
  bool layer_wise_ = false;
  dlrm::cuda::DeviceBuffer<double> layer_scratch_;
};

}  // namespace dlrm::dense::cuda
