// The configs/*.textproto files compiled into the binary (generated list).
#pragma once

#include <span>
#include <string_view>

namespace dlrm::internal {

struct Preset {
  std::string_view name;
  std::string_view text;
};

// Defined in the generated presets.cc.
std::span<const Preset> Presets();

}  // namespace dlrm::internal
