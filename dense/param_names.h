// The dense parameters' names, spelled once: the dense backend names its
// MLPs' parameters with them (Mlp::Parameters), and the weights export, the
// checkpoints and the TorchRec mapping (model/) name the same tensors with
// them. An interaction's parameters are named in core/config.cc
// (InteractionParamSpecs). A parameter's optimizer state is named after
// it ("<name>.<array>", optim::StateArray).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace dlrm::dense {

// The prefixes of the bottom MLP's and the top MLP's parameters.
inline constexpr char kBottomMlpPrefix[] = "bottom_mlp";
inline constexpr char kTopMlpPrefix[] = "top_mlp";

// An MLP layer's parameters: its weight [out, in] and bias [out].
inline constexpr char kWeight[] = "weight";
inline constexpr char kBias[] = "bias";

// "<prefix>.<layer>.<what>", e.g. "bottom_mlp.0.weight".
inline std::string ParamName(absl::string_view prefix, int64_t layer,
                             absl::string_view what) {
  return absl::StrCat(prefix, ".", layer, ".", what);
}

// Whether `name` is a layer's bias ("<prefix>.<layer>.bias").
inline bool IsBias(std::string_view name) {
  constexpr std::string_view bias = kBias;
  return name.size() > bias.size() && name.ends_with(bias) &&
         name[name.size() - bias.size() - 1] == '.';
}

}  // namespace dlrm::dense
