// The dense parameters' names, spelled once: the dense backend names its
// parameters with them (Mlp::Parameters, CrossNet::Parameters), and the
// weights export, the checkpoints and the TorchRec mapping (model/) name
// the same tensors with them. A parameter's optimizer state is named after
// it ("<name>.<array>", optim::StateArray).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace dlrm::dense {

// The prefixes of the bottom MLP's, the DCN cross network's and the top
// MLP's parameters.
inline constexpr char kBottomMlpPrefix[] = "bottom_mlp";
inline constexpr char kCrossNetPrefix[] = "interaction.crossnet";
inline constexpr char kTopMlpPrefix[] = "top_mlp";

// A layer's parameters: an MLP layer's weight [out, in] and bias [out]; a
// cross layer's V [r, N], W [N, r] and bias [N].
inline constexpr char kWeight[] = "weight";
inline constexpr char kBias[] = "bias";
inline constexpr char kCrossV[] = "V";
inline constexpr char kCrossW[] = "W";

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
