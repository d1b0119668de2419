// Dense optimizers: the rules of optim/rules.h (PyTorch semantics) applied
// to borrowed parameter/gradient pairs.
#include "dense/optimizer.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status.h"
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

// One step of `Rule` over the n elements of p.
template <typename Rule>
void UpdateParameter(const typename Rule::Step& step, float* p, const float* g,
                     float* s1, float* s2, int64_t n) {
  const bool parallel = n >= kParallelElements;
#pragma omp parallel for simd schedule(static) if (parallel)
  for (int64_t k = 0; k < n; ++k) Rule::DenseElement(step, g[k], p, s1, s2, k);
}

}  // namespace

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
}

void DenseOptimizer::Step() {
  ++step_;
  optim::Visit(config_.type(), [&](auto rule) {
    using Rule = decltype(rule);
    const typename Rule::Step step = Rule::MakeStep(config_, step_);
    for (size_t i = 0; i < params_.size(); ++i) {
      float* s1 = state_[0].empty() ? nullptr : state_[0][i].data();
      float* s2 = state_[1].empty() ? nullptr : state_[1][i].data();
      UpdateParameter<Rule>(step, params_[i].value, params_[i].grad, s1, s2,
                            params_[i].size);
    }
  });
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
