// The dense backend factory and the host parameters both backends start
// from.
#include "dense/backend.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "core/config.h"
#include "core/random.h"
#include "core/status.h"
#include "dense/cpu_backend.h"
#include "dense/param_names.h"

#if defined(DLRM_WITH_CUDA)
#include "dense/cuda/cuda_backend.h"
#endif

namespace dlrm::dense {
namespace {

std::vector<int> Widths(const google::protobuf::RepeatedField<int32_t>& w) {
  return {w.begin(), w.end()};
}

// Appends `layer`'s parameters to *params, named by `specs` (the config's
// InteractionParamSpecs); Internal unless they match in number and sizes.
absl::Status AppendNamed(const std::vector<DenseParamSpec>& specs,
                         std::vector<ParamRef> layer,
                         std::vector<ParamRef>* params) {
  if (layer.size() != specs.size()) {
    return absl::InternalError(
        absl::StrCat("the interaction layer has ", layer.size(),
                     " parameters, the config's specs ", specs.size()));
  }
  for (size_t i = 0; i < layer.size(); ++i) {
    if (layer[i].size != specs[i].size()) {
      return absl::InternalError(absl::StrCat(
          "interaction parameter ", specs[i].name, ": the layer has ",
          layer[i].size, " floats, the config's spec ", specs[i].size()));
    }
    layer[i].name = specs[i].name;
    params->push_back(std::move(layer[i]));
  }
  return absl::OkStatus();
}

}  // namespace

HostDenseParams::HostDenseParams(const ModelConfig& config)
    : bottom(config.num_dense_features(), Widths(config.bottom_mlp()),
             /*relu_last=*/true),
      top(MakeInteractionShape(config).output_width, Widths(config.top_mlp()),
          /*relu_last=*/false),
      interaction(CreateInteractionLayer(config)) {}

absl::StatusOr<std::unique_ptr<HostDenseParams>> HostDenseParams::Create(
    const ModelConfig& config) {
  std::unique_ptr<HostDenseParams> p(new HostDenseParams(config));
  Rng rng(config.seed());
  p->bottom.Init(&rng);
  p->top.Init(&rng);
  if (p->interaction != nullptr) p->interaction->Init(&rng);
  p->params = p->bottom.Parameters(kBottomMlpPrefix);
  if (p->interaction != nullptr) {
    RETURN_IF_ERROR(AppendNamed(InteractionParamSpecs(config),
                                p->interaction->Parameters(), &p->params));
  }
  p->top_begin = p->params.size();
  for (ParamRef& ref : p->top.Parameters(kTopMlpPrefix)) {
    p->params.push_back(std::move(ref));
  }
  ASSIGN_OR_RETURN(p->optimizer,
                   DenseOptimizer::Create(config.dense_optimizer(), p->params));
  return p;
}

std::pair<size_t, size_t> HostDenseParams::Range(GradBucket bucket) const {
  switch (bucket) {
    case GradBucket::kBottom:
      return {0, top_begin};
    case GradBucket::kTop:
      return {top_begin, params.size()};
    case GradBucket::kAll:
      break;
  }
  return {0, params.size()};
}

absl::Status HostDenseParams::SetPrecision(DensePrecision precision) {
  bottom.SetPrecision(precision);
  top.SetPrecision(precision);
  if (interaction != nullptr) interaction->SetPrecision(precision);
  // In params' order: bottom, interaction, top.
  std::vector<Bf16*> copies = bottom.Bf16Copies();
  if (interaction != nullptr) {
    for (Bf16* c : interaction->Bf16Copies()) copies.push_back(c);
  }
  for (Bf16* c : top.Bf16Copies()) copies.push_back(c);
  const absl::Status st = optimizer->SetBf16Copies(std::move(copies));
  if (!st.ok()) return absl::InternalError(st.message());
  return absl::OkStatus();
}

absl::Status DenseBackend::SetDeviceColumns(std::vector<ColumnRange> columns) {
  if (columns.empty()) return absl::OkStatus();
  return absl::UnimplementedError(
      "the CPU dense backend has no device memory for embedding columns: "
      "tables with storage STORAGE_DEVICE need device: DEVICE_CUDA");
}

absl::StatusOr<float*> DenseBackend::DeviceInteractionInput(int64_t /*batch*/,
                                                            bool /*predict*/) {
  return absl::UnimplementedError(
      "the CPU dense backend has no device interaction input");
}

absl::Status CheckDeviceColumns(const InteractionShape& shape,
                                std::span<const ColumnRange> columns) {
  int last = shape.dim;
  for (const ColumnRange& c : columns) {
    if (c.begin < last || c.end <= c.begin || c.end > shape.input_width) {
      return absl::InvalidArgumentError(absl::StrCat(
          "device columns [", c.begin, ", ", c.end,
          ") are not sorted, disjoint and within the embedding columns [",
          shape.dim, ", ", shape.input_width, ") of the interaction input"));
    }
    last = c.end;
  }
  return absl::OkStatus();
}

absl::Status CheckSameParams(std::span<const ParamRef> from,
                             std::span<const ParamRef> to) {
  if (from.size() != to.size()) {
    return absl::FailedPreconditionError(
        absl::StrCat("dense parameters: the destination has ", to.size(),
                     " parameters, the source ", from.size()));
  }
  for (size_t i = 0; i < from.size(); ++i) {
    if (from[i].name != to[i].name || from[i].size != to[i].size) {
      return absl::FailedPreconditionError(
          absl::StrCat("dense parameter ", i, ": the destination's is ",
                       to[i].name, " of ", to[i].size, " floats, the source's ",
                       from[i].name, " of ", from[i].size));
    }
  }
  return absl::OkStatus();
}

std::vector<ColumnRange> HostColumns(const InteractionShape& shape,
                                     std::span<const ColumnRange> device) {
  std::vector<ColumnRange> host;
  int at = shape.dim;
  for (const ColumnRange& c : device) {
    if (c.begin > at) host.push_back({at, c.begin});
    at = c.end;
  }
  if (shape.input_width > at) host.push_back({at, shape.input_width});
  return host;
}

int64_t HostRowsFloats(const InteractionShape& shape,
                       std::span<const ColumnRange> host, int64_t batch) {
  if (host.empty() || batch <= 0) return 0;
  return (batch - 1) * shape.input_width + host.back().end;
}

absl::StatusOr<std::unique_ptr<DenseBackend>> CreateDenseBackend(
    const ModelConfig& config) {
  if (config.device() != DEVICE_CUDA) return CreateCpuDenseBackend(config);
#if defined(DLRM_WITH_CUDA)
  absl::StatusOr<std::unique_ptr<DenseBackend>> backend =
      cuda::CreateCudaDenseBackend(config);
#else
  absl::StatusOr<std::unique_ptr<DenseBackend>> backend =
      absl::FailedPreconditionError(
          "device cuda: this binary was built without CUDA (nvcc was not "
          "found when it was built)");
#endif
  if (absl::IsFailedPrecondition(backend.status())) {
    return absl::FailedPreconditionError(
        absl::StrCat(backend.status().message(),
                     "; to train on the CPU, pass --device cpu (or set "
                     "device: DEVICE_CPU in the model config)"));
  }
  return backend;
}

}  // namespace dlrm::dense
