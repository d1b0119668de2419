// The registry of interactions with parameters: one entry each, with the
// factories of its CPU layer and CUDA twin and its floats per sample.
#include "dense/interaction_layer.h"

#include <memory>
#include <utility>

#include "core/status.h"
#include "dense/cross_net.h"
#include "dense/interaction.h"

#if defined(DLRM_WITH_CUDA)
#include "dense/cuda/cuda_dense.h"
#endif

namespace dlrm::dense {
namespace {

struct Entry {
  Interaction kind;
  std::unique_ptr<InteractionLayer> (*create)(const ModelConfig& config);
  InteractionLayerFloats (*floats)(const ModelConfig& config);
#if defined(DLRM_WITH_CUDA)
  absl::StatusOr<std::unique_ptr<cuda::DeviceInteractionLayer>> (
      *create_device)(const ModelConfig& config, DensePrecision precision);
#endif
};

// The cross network's width: the interaction input's.
int Width(const ModelConfig& c) { return MakeInteractionShape(c).input_width; }

constexpr Entry kEntries[] = {
    {
        INTERACTION_DCN,
        [](const ModelConfig& c) -> std::unique_ptr<InteractionLayer> {
          return std::make_unique<CrossNet>(Width(c), c.dcn_num_layers(),
                                            c.dcn_low_rank_dim());
        },
        [](const ModelConfig& c) {
          return CrossNet::FloatsPerSample(Width(c), c.dcn_num_layers(),
                                           c.dcn_low_rank_dim());
        },
#if defined(DLRM_WITH_CUDA)
        [](const ModelConfig& c, DensePrecision precision)
            -> absl::StatusOr<std::unique_ptr<cuda::DeviceInteractionLayer>> {
          ASSIGN_OR_RETURN(
              std::unique_ptr<cuda::DeviceCrossNet> net,
              cuda::DeviceCrossNet::Create(Width(c), c.dcn_num_layers(),
                                           c.dcn_low_rank_dim(), precision));
          return std::unique_ptr<cuda::DeviceInteractionLayer>(std::move(net));
        },
#endif
    },
};

const Entry* Find(Interaction kind) {
  for (const Entry& e : kEntries) {
    if (e.kind == kind) return &e;
  }
  return nullptr;
}

}  // namespace

std::unique_ptr<InteractionLayer> CreateInteractionLayer(
    const ModelConfig& config) {
  const Entry* e = Find(config.interaction());
  return e == nullptr ? nullptr : e->create(config);
}

InteractionLayerFloats InteractionLayerFloatsPerSample(
    const ModelConfig& config) {
  const Entry* e = Find(config.interaction());
  return e == nullptr ? InteractionLayerFloats{} : e->floats(config);
}

#if defined(DLRM_WITH_CUDA)
namespace cuda {

absl::StatusOr<std::unique_ptr<DeviceInteractionLayer>>
CreateDeviceInteractionLayer(const ModelConfig& config,
                             DensePrecision precision) {
  const Entry* e = Find(config.interaction());
  if (e == nullptr) return std::unique_ptr<DeviceInteractionLayer>();
  return e->create_device(config, precision);
}

}  // namespace cuda
#endif

}  // namespace dlrm::dense
