// Dense optimizers: the rules of optim/rules.h (PyTorch semantics for the
// element-wise ones) applied to borrowed parameter/gradient pairs, with the
// layer-wise rules' norms reduced here.
#include "dense/optimizer.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "dense/param_names.h"
#include "optim/optimizer.h"

namespace dlrm::dense {
namespace {

// Elements below which an OpenMP region costs more than the update.
constexpr int64_t kParallelElements = 1 << 15;

absl::Status ValidateParams(const std::vector<ParamRef>& params) {
  for (size_t i = 0; i < params.size(); ++i) {
    const ParamRef& p = params[i];
    if (p.size < 0 || p.value == nullptr || p.grad == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "dense optimizer: parameter ", i, " '", p.name,
          "' has a null value/grad or a negative size (", p.size, ")"));
    }
  }
  return absl::OkStatus();
}

// One step of `Rule` over the n elements of p, and p's bf16 copy into
// `copy` unless null.
template <typename Rule>
void UpdateParameter(const typename Rule::Step& step, float* p, const float* g,
                     float* s1, float* s2, int64_t n, Bf16* copy) {
  const bool parallel = n >= kParallelElements;
  if (copy == nullptr) {
#pragma omp parallel for simd schedule(static) if (parallel)
    for (int64_t k = 0; k < n; ++k) {
      Rule::DenseElement(step, g[k], p, s1, s2, k);
    }
    return;
  }
#pragma omp parallel for simd schedule(static) if (parallel)
  for (int64_t k = 0; k < n; ++k) {
    Rule::DenseElement(step, g[k], p, s1, s2, k);
    copy[k] = ToBf16(p[k]);
  }
}

// Elements per block of the layer-wise norms: each block's sums of squares
// are reduced on one thread and the blocks' sums added in block order, so
// the norms (and the weights) do not depend on the number of threads.
constexpr int64_t kNormBlock = 1 << 13;

// One step of the layer-wise `Rule` over the n elements of p: ||p|| and the
// norm of the rule's NormTerm in double (when `adapt`), the tensor's
// constants, then the element updates. `partials` is scratch. LAMB's update
// is computed twice, for its norm and to apply it, instead of kept in a
// buffer the size of the parameter: NormTerm and LayerElement run the same
// float operations on the same inputs, so both see the same values.
template <typename Rule>
void UpdateLayer(const typename Rule::Step& step, bool adapt, float* p,
                 const float* g, float* s1, float* s2, int64_t n,
                 std::vector<double>* partials, Bf16* copy) {
  const bool parallel = n >= kParallelElements;
  double weight_norm = 0, term_norm = 0;
  if (adapt) {
    const int64_t blocks = (n + kNormBlock - 1) / kNormBlock;
    partials->assign(2 * blocks, 0.0);
    double* sums = partials->data();
#pragma omp parallel for schedule(static) if (parallel)
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t end = std::min(n, (b + 1) * kNormBlock);
      double w2 = 0, t2 = 0;
#pragma omp simd reduction(+ : w2, t2)
      for (int64_t k = b * kNormBlock; k < end; ++k) {
        const double w = p[k];
        const double t =
            Rule::NormTerm(step, step.weight_decay, g[k], p, s1, s2, k);
        w2 += w * w;
        t2 += t * t;
      }
      sums[2 * b] = w2;
      sums[2 * b + 1] = t2;
    }
    for (int64_t b = 0; b < blocks; ++b) {
      weight_norm += sums[2 * b];
      term_norm += sums[2 * b + 1];
    }
    weight_norm = std::sqrt(weight_norm);
    term_norm = std::sqrt(term_norm);
  }
  const typename Rule::Layer layer =
      Rule::MakeLayer(step, adapt, weight_norm, term_norm);
  if (copy == nullptr) {
#pragma omp parallel for simd schedule(static) if (parallel)
    for (int64_t k = 0; k < n; ++k) {
      Rule::LayerElement(step, layer, g[k], p, s1, s2, k);
    }
    return;
  }
#pragma omp parallel for simd schedule(static) if (parallel)
  for (int64_t k = 0; k < n; ++k) {
    Rule::LayerElement(step, layer, g[k], p, s1, s2, k);
    copy[k] = ToBf16(p[k]);
  }
}

}  // namespace

bool AdaptsLayerWise(std::string_view name) { return !IsBias(name); }

absl::StatusOr<std::unique_ptr<DenseOptimizer>> DenseOptimizer::Create(
    const OptimizerConfig& config, std::vector<ParamRef> params) {
  RETURN_IF_ERROR(optim::Validate(config, "dense_optimizer"));
  RETURN_IF_ERROR(ValidateParams(params));
  return std::unique_ptr<DenseOptimizer>(
      new DenseOptimizer(config, std::move(params)));
}

DenseOptimizer::DenseOptimizer(const OptimizerConfig& config,
                               std::vector<ParamRef> params)
    : config_(config), params_(std::move(params)) {
  const std::span<const optim::StateArray> arrays = optim::DenseState(config_);
  for (size_t k = 0; k < arrays.size(); ++k) {
    const float initial = optim::InitialValue(arrays[k], config_);
    for (const ParamRef& p : params_) state_[k].emplace_back(p.size, initial);
  }
  for (const ParamRef& p : params_) {
    adapt_.push_back(AdaptsLayerWise(p.name));
  }
}

absl::Status DenseOptimizer::SetConfig(const OptimizerConfig& config) {
  if (config.type() != config_.type() ||
      config.initial_accumulator() != config_.initial_accumulator()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dense_optimizer: the type and initial_accumulator cannot change (",
        OptimizerConfig::Type_Name(config_.type()), " ",
        config_.initial_accumulator(), " -> ",
        OptimizerConfig::Type_Name(config.type()), " ",
        config.initial_accumulator(), ")"));
  }
  config_ = config;
  return absl::OkStatus();
}

void DenseOptimizer::Step() {
  ++step_;
  optim::Visit(config_.type(), [&](auto rule) {
    using Rule = decltype(rule);
    const typename Rule::Step step = Rule::MakeStep(config_, step_);
    for (size_t i = 0; i < params_.size(); ++i) {
      float* s1 = state_[0].empty() ? nullptr : state_[0][i].data();
      float* s2 = state_[1].empty() ? nullptr : state_[1][i].data();
      Bf16* copy = bf16_copies_.empty() ? nullptr : bf16_copies_[i];
      if constexpr (Rule::kLayerWise) {
        UpdateLayer<Rule>(step, adapt_[i], params_[i].value, params_[i].grad,
                          s1, s2, params_[i].size, &partials_, copy);
      } else {
        UpdateParameter<Rule>(step, params_[i].value, params_[i].grad, s1, s2,
                              params_[i].size, copy);
      }
    }
  });
}

absl::Status DenseOptimizer::SetBf16Copies(std::vector<Bf16*> copies) {
  if (!copies.empty() && copies.size() != params_.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("dense optimizer: ", copies.size(), " bf16 copies for ",
                     params_.size(), " parameters"));
  }
  bf16_copies_ = std::move(copies);
  return absl::OkStatus();
}

std::vector<ParamRef> DenseOptimizer::State() {
  const std::span<const optim::StateArray> arrays = optim::DenseState(config_);
  std::vector<ParamRef> state;
  for (size_t i = 0; i < params_.size(); ++i) {
    for (size_t k = 0; k < arrays.size(); ++k) {
      state.push_back({params_[i].name + "." + arrays[k].name,
                       state_[k][i].data(), nullptr, params_[i].size});
    }
  }
  return state;
}

}  // namespace dlrm::dense
