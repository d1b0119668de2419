// An interaction with parameters behind one interface (DCN's cross
// network, dense/cross_net.h, is the one so far), and the registry that
// makes the config's: the CPU layer, its CUDA twin and the floats its passes
// keep per sample. The dense backends, HostDenseParams and the memory plan
// ask the registry and never name an interaction with parameters.
//
// Adding an interaction with parameters touches six files, plus its tests
// and docs: proto/dlrm/config.proto (its value and fields), core/config.cc
// (defaults, checks, output width, InteractionParamSpecs,
// kInteractionFields, InteractionFieldsText), its entry in
// interaction_layer.cc, its CPU layer's .h (which also declares its CUDA
// factory for the entry) and .cc, and its CUDA layer's file (dense/cuda/,
// a DeviceInteractionLayer with its kernels). dense/CMakeLists.txt builds
// every source of the folder, so it needs no line.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "core/aligned.h"
#include "core/random.h"
#include "dense/bf16.h"
#include "dense/linear.h"
#include "dlrm/config.pb.h"

namespace dlrm::dense {

// An interaction with parameters on the CPU: z [batch x N'] from the
// interaction input x [batch x N] (dense/interaction.h's t and z). Its
// parameters are dense parameters like the MLPs' (the optimizer, the
// all-reduce, checkpoints and exports see them, named by the config's
// InteractionParamSpecs). Not thread-safe.
class InteractionLayer {
 public:
  virtual ~InteractionLayer() = default;

  // Draws the initial parameters from `rng` (after the MLPs' draws:
  // HostDenseParams::Create).
  virtual void Init(Rng* rng) = 0;
  // Sets the precision of the passes; PRECISION_BF16 also writes the bf16
  // weights (SyncBf16Weights).
  virtual void SetPrecision(DensePrecision precision) = 0;
  // Under PRECISION_BF16, rewrites the bf16 copies of the weights from the
  // fp32 master weights; call after they change. Nothing at PRECISION_FP32.
  virtual void SyncBf16Weights() = 0;

  // Training forward into `out`, keeping what Backward needs; x is borrowed
  // and must be unchanged when Backward runs. `out` may not overlap x.
  virtual void Forward(const float* x, int64_t batch, float* out) = 0;
  // After Forward(x, batch, ...): writes dx (overwritten) from dout, the
  // gradient wrt the output, and writes (does not accumulate) every
  // parameter's gradient; a batch of 0 zeroes them. dx may not overlap x or
  // dout.
  virtual void Backward(const float* x, const float* dout, int64_t batch,
                        float* dx) = 0;
  // Inference forward: Forward's arithmetic, keeping none of its
  // activations (those of a pending Backward stay valid); `scratch` is
  // resized as needed.
  virtual void Infer(const float* x, int64_t batch, float* out,
                     AlignedVector<float>* scratch) const = 0;

  // Its parameters (value, gradient, size; `name` empty: HostDenseParams
  // names them from InteractionParamSpecs), in the specs' order. Valid as
  // long as the layer.
  virtual std::vector<ParamRef> Parameters() = 0;
  // Their bf16 copies in the same order (DenseOptimizer::SetBf16Copies):
  // null for a parameter without one and at PRECISION_FP32.
  virtual std::vector<Bf16*> Bf16Copies() = 0;
};

// The layer of a normalised config's interaction, its parameters
// uninitialised (Init); null for an interaction without parameters.
std::unique_ptr<InteractionLayer> CreateInteractionLayer(
    const ModelConfig& config);

// Floats per sample an interaction layer's buffers hold (the memory plan):
// the training passes' activations and gradients, and Infer's scratch.
struct InteractionLayerFloats {
  int64_t train = 0;
  int64_t predict = 0;
};
// Those of a normalised config's interaction layer; zero without one.
InteractionLayerFloats InteractionLayerFloatsPerSample(
    const ModelConfig& config);

namespace cuda {
class DeviceInteractionLayer;  // dense/cuda/cuda_dense.h
// The device twin of CreateInteractionLayer's layer at `precision`, its
// parameters uninitialised (the CUDA backend uploads the host view's); null
// for an interaction without parameters. Internal on a CUDA error. Defined
// in CUDA builds only (DLRM_WITH_CUDA).
absl::StatusOr<std::unique_ptr<DeviceInteractionLayer>>
CreateDeviceInteractionLayer(const ModelConfig& config,
                             DensePrecision precision);
}  // namespace cuda

}  // namespace dlrm::dense
