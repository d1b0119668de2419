// Defaults, validation and state layout of the optimizer configs, read off
// the rules in optim/rules.h.
#include "optim/optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <variant>

#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace dlrm::optim {
namespace {

// What the state's users assume of a rule: EmbeddingTable and
// DenseOptimizer hold two state arrays, and a row-wise rule keeps its
// per-row float in state1.
template <typename Rule>
constexpr bool LayoutFits() {
  if constexpr (Rule::kLayerWise) {
    return Rule::kDenseState.size() <= 2;
  } else {
    return Rule::kSparseState.size() <= 2 && Rule::kDenseState.size() <= 2 &&
           (!Rule::kRowReduction ||
            (!Rule::kSparseState.empty() &&
             Rule::kSparseState[0].extent == Extent::kRow));
  }
}

template <typename... Steps>
constexpr bool EveryLayoutFits(const std::variant<Steps...>*) {
  return (LayoutFits<typename Steps::Rule>() && ...);
}
static_assert(EveryLayoutFits(static_cast<const AnyStep*>(nullptr)) &&
                  LayoutFits<Lamb>() && LayoutFits<Lars>(),
              "a rule's state does not fit EmbeddingTable / DenseOptimizer");

template <typename T>
absl::Status Invalid(const std::string& field, const char* member,
                     const char* requirement, T value) {
  return absl::InvalidArgumentError(absl::StrCat(
      field, ".", member, " must be ", requirement, ", got ", value));
}

bool FiniteAtLeast0(float x) { return x >= 0 && std::isfinite(x); }
bool In0To1(float x) { return x >= 0 && x <= 1; }

// `field` names the schedule ("dense_optimizer.schedule").
absl::Status ValidateSchedule(const LearningRateSchedule& s,
                              const std::string& field) {
  if (s.warmup_steps() < 0) {
    return Invalid(field, "warmup_steps", ">= 0", s.warmup_steps());
  }
  if (!In0To1(s.warmup_start_factor())) {
    return Invalid(field, "warmup_start_factor", "in [0, 1]",
                   s.warmup_start_factor());
  }
  if (s.has_polynomial_decay()) {
    const PolynomialDecay& p = s.polynomial_decay();
    const std::string decay = field + ".polynomial_decay";
    if (p.decay_start_step() < 0) {
      return Invalid(decay, "decay_start_step", ">= 0", p.decay_start_step());
    }
    if (p.decay_steps() <= 0) {
      return Invalid(decay, "decay_steps", "> 0", p.decay_steps());
    }
    if (!(p.power() > 0) || !std::isfinite(p.power())) {
      return Invalid(decay, "power", "a finite number > 0", p.power());
    }
    if (!In0To1(p.end_factor())) {
      return Invalid(decay, "end_factor", "in [0, 1]", p.end_factor());
    }
  } else if (s.has_step_decay()) {
    const StepDecay& p = s.step_decay();
    const std::string decay = field + ".step_decay";
    if (p.decay_start_step() < 0) {
      return Invalid(decay, "decay_start_step", ">= 0", p.decay_start_step());
    }
    if (p.step_size() <= 0) {
      return Invalid(decay, "step_size", "> 0", p.step_size());
    }
    if (!(p.gamma() > 0 && p.gamma() <= 1)) {
      return Invalid(decay, "gamma", "in (0, 1]", p.gamma());
    }
  }
  return absl::OkStatus();
}

// InvalidArgument naming "<field>.<member>" when a field `type` does not
// use is set: a silently ignored weight decay or momentum would train
// otherwise than its config reads.
absl::Status Unused(const OptimizerConfig& config, const std::string& field,
                    const char* member, float value, const char* users) {
  if (value == 0) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(field, ".", member, " is used by ", users, " only; type ",
                   OptimizerConfig::Type_Name(config.type()), " has it at ",
                   value, " (set it to 0)"));
}

}  // namespace

absl::StatusOr<AnyStep> MakeStep(const OptimizerConfig& config, int64_t step) {
  AnyStep constants;
  if (!VisitElementWise(config.type(), [&](auto rule) {
        constants = decltype(rule)::MakeStep(config, step);
      })) {
    return absl::InvalidArgumentError(absl::StrCat(
        "optimizer type ", OptimizerConfig::Type_Name(config.type()), " (",
        static_cast<int>(config.type()),
        ") has no element-wise rule (layer-wise or not implemented)"));
  }
  return constants;
}

absl::StatusOr<PackedStep> MakePackedStep(const OptimizerConfig& config,
                                          int64_t step) {
  PackedStep packed;
  if (!Visit(config.type(), [&](auto rule) {
        using Step = typename decltype(rule)::Step;
        static_assert(std::is_trivially_copyable_v<Step>);
        static_assert(sizeof(Step) <= PackedStep::kMaxBytes &&
                      alignof(Step) <= alignof(PackedStep));
        const Step constants = decltype(rule)::MakeStep(config, step);
        std::memcpy(packed.bytes.data(), &constants, sizeof(Step));
        packed.size = sizeof(Step);
      })) {
    return absl::InvalidArgumentError(absl::StrCat(
        "optimizer type ", OptimizerConfig::Type_Name(config.type()), " (",
        static_cast<int>(config.type()), ") is not implemented"));
  }
  return packed;
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
  if (config->type() == OptimizerConfig::LARS &&
      config->trust_coefficient() == 0) {
    config->set_trust_coefficient(0.001f);
  }
  // Only a schedule that is there: configs without one print as before.
  if (config->has_schedule()) {
    LearningRateSchedule* s = config->mutable_schedule();
    if (s->has_polynomial_decay() && s->polynomial_decay().power() == 0) {
      s->mutable_polynomial_decay()->set_power(2.0f);
    }
    if (s->has_step_decay() && s->step_decay().gamma() == 0) {
      s->mutable_step_decay()->set_gamma(0.1f);
    }
  }
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
  if (!FiniteAtLeast0(acc)) {
    return Invalid(field, "initial_accumulator", "a finite number >= 0", acc);
  }
  const bool lamb = config.type() == OptimizerConfig::LAMB;
  const bool lars = config.type() == OptimizerConfig::LARS;
  if (lamb || lars) {
    if (!FiniteAtLeast0(config.weight_decay())) {
      return Invalid(field, "weight_decay", "a finite number >= 0",
                     config.weight_decay());
    }
  } else {
    RETURN_IF_ERROR(Unused(config, field, "weight_decay", config.weight_decay(),
                           "LAMB and LARS"));
  }
  if (lars) {
    if (!(config.momentum() >= 0 && config.momentum() < 1)) {
      return Invalid(field, "momentum", "in [0, 1)", config.momentum());
    }
    const float eta = config.trust_coefficient();
    if (!(eta > 0) || !std::isfinite(eta)) {
      return Invalid(field, "trust_coefficient", "a finite number > 0", eta);
    }
  } else {
    RETURN_IF_ERROR(
        Unused(config, field, "momentum", config.momentum(), "LARS"));
    RETURN_IF_ERROR(Unused(config, field, "trust_coefficient",
                           config.trust_coefficient(), "LARS"));
  }
  return ValidateSchedule(config.schedule(), field + ".schedule");
}

absl::Status ValidateSparse(const OptimizerConfig& config,
                            const std::string& field) {
  RETURN_IF_ERROR(Validate(config, field));
  if (!VisitElementWise(config.type(), [](auto) {})) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ".type ", OptimizerConfig::Type_Name(config.type()),
        " is layer-wise (a trust ratio per dense parameter tensor) and has "
        "no embedding-table form; embedding tables take SGD, ADAGRAD, "
        "ROWWISE_ADAGRAD or ADAM"));
  }
  return absl::OkStatus();
}

std::span<const StateArray> SparseState(const OptimizerConfig& config) {
  std::span<const StateArray> state;
  VisitElementWise(config.type(),
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
