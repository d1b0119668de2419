// Defaults, validation and state layout of the optimizer configs, read off
// the rules in optim/rules.h.
#include "optim/optimizer.h"

#include <algorithm>
#include <cmath>
#include <variant>

#include "absl/strings/str_cat.h"

namespace dlrm::optim {
namespace {

// What the state's users assume of a rule: EmbeddingTable and
// DenseOptimizer hold two state arrays, and a row-wise rule keeps its
// per-row float in state1.
template <typename Rule>
constexpr bool LayoutFits() {
  return Rule::kSparseState.size() <= 2 && Rule::kDenseState.size() <= 2 &&
         (!Rule::kRowReduction ||
          (!Rule::kSparseState.empty() &&
           Rule::kSparseState[0].extent == Extent::kRow));
}

template <typename... Steps>
constexpr bool EveryLayoutFits(const std::variant<Steps...>*) {
  return (LayoutFits<typename Steps::Rule>() && ...);
}
static_assert(EveryLayoutFits(static_cast<const AnyStep*>(nullptr)),
              "a rule's state does not fit EmbeddingTable / DenseOptimizer");

absl::Status Invalid(const std::string& field, const char* member,
                     const char* requirement, float value) {
  return absl::InvalidArgumentError(absl::StrCat(
      field, ".", member, " must be ", requirement, ", got ", value));
}

}  // namespace

absl::StatusOr<AnyStep> MakeStep(const OptimizerConfig& config, int64_t step) {
  AnyStep constants;
  if (!Visit(config.type(), [&](auto rule) {
        constants = decltype(rule)::MakeStep(config, step);
      })) {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer type ", static_cast<int>(config.type()),
                     " is not an optimizer this server implements"));
  }
  return constants;
}

void SetDefaults(OptimizerConfig* config) {
  if (config->learning_rate() == 0) {
    Visit(config->type(), [&](auto rule) {
      config->set_learning_rate(decltype(rule)::kDefaultLearningRate);
    });
  }
  if (config->eps() == 0) config->set_eps(1e-8f);
  if (config->beta1() == 0) config->set_beta1(0.9f);
  if (config->beta2() == 0) config->set_beta2(0.999f);
}

absl::Status Validate(const OptimizerConfig& config, const std::string& field) {
  if (!Visit(config.type(), [](auto) {})) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".type ", static_cast<int>(config.type()),
                     " is not an optimizer this server implements"));
  }
  const float lr = config.learning_rate();
  if (!(lr > 0) || !std::isfinite(lr)) {
    return Invalid(field, "learning_rate", "a finite number > 0", lr);
  }
  // eps = 0 would divide 0 by 0 for a weight whose gradient stays 0.
  if (!(config.eps() > 0) || !std::isfinite(config.eps())) {
    return Invalid(field, "eps", "a finite number > 0", config.eps());
  }
  if (!(config.beta1() >= 0 && config.beta1() < 1)) {
    return Invalid(field, "beta1", "in [0, 1)", config.beta1());
  }
  if (!(config.beta2() >= 0 && config.beta2() < 1)) {
    return Invalid(field, "beta2", "in [0, 1)", config.beta2());
  }
  const float acc = config.initial_accumulator();
  if (!(acc >= 0) || !std::isfinite(acc)) {
    return Invalid(field, "initial_accumulator", "a finite number >= 0", acc);
  }
  return absl::OkStatus();
}

std::span<const StateArray> SparseState(const OptimizerConfig& config) {
  std::span<const StateArray> state;
  Visit(config.type(),
        [&](auto rule) { state = decltype(rule)::kSparseState; });
  return state;
}

std::span<const StateArray> DenseState(const OptimizerConfig& config) {
  std::span<const StateArray> state;
  Visit(config.type(), [&](auto rule) { state = decltype(rule)::kDenseState; });
  return state;
}

float InitialValue(const StateArray& array, const OptimizerConfig& config) {
  return array.initial == Initial::kInitialAccumulator
             ? config.initial_accumulator()
             : 0.0f;
}

void InitialSparseState(const OptimizerConfig& config, int dim, float* out) {
  for (const StateArray& array : SparseState(config)) {
    const int n = FloatsPerRow(array, dim);
    std::fill(out, out + n, InitialValue(array, config));
    out += n;
  }
}

int SparseStateFloatsPerRow(const OptimizerConfig& config, int dim) {
  int floats = 0;
  for (const StateArray& array : SparseState(config)) {
    floats += FloatsPerRow(array, dim);
  }
  return floats;
}

int DenseStateFloatsPerElement(const OptimizerConfig& config) {
  return static_cast<int>(DenseState(config).size());
}

bool SparseStateSpansColumns(const OptimizerConfig& config) {
  for (const StateArray& array : SparseState(config)) {
    if (array.extent == Extent::kRow) return true;
  }
  return false;
}

}  // namespace dlrm::optim
