// Dense optimizers: SGD, Adagrad and Adam (PyTorch semantics) applied to
// borrowed parameter/gradient pairs.
#include "dense/optimizer.h"

#include <cmath>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace dlrm::dense {
namespace {

// Elements below which an OpenMP region costs more than the update.
constexpr int64_t kParallelElements = 1 << 15;

bool UsesAdagrad(OptimizerConfig::Type type) {
  return type == OptimizerConfig::ADAGRAD ||
         type == OptimizerConfig::ROWWISE_ADAGRAD;
}

absl::Status Validate(const OptimizerConfig& c,
                      const std::vector<ParamRef>& params) {
  if (!OptimizerConfig::Type_IsValid(c.type())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dense optimizer: unknown type ", static_cast<int>(c.type())));
  }
  if (!(c.learning_rate() > 0) || !std::isfinite(c.learning_rate())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dense optimizer: learning_rate must be > 0, got ", c.learning_rate()));
  }
  if (c.type() != OptimizerConfig::SGD) {
    // A normalised config never has eps = 0; taking it anyway would divide
    // zero by zero for a parameter whose gradient stays 0.
    if (!(c.eps() > 0)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "dense optimizer: eps must be > 0 (normalise the config), got ",
          c.eps()));
    }
  }
  if (UsesAdagrad(c.type()) && !(c.initial_accumulator() >= 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("dense optimizer: initial_accumulator must be >= 0, got ",
                     c.initial_accumulator()));
  }
  if (c.type() == OptimizerConfig::ADAM &&
      !(c.beta1() >= 0 && c.beta1() < 1 && c.beta2() >= 0 && c.beta2() < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("dense optimizer: beta1 and beta2 must be in [0, 1), got ",
                     c.beta1(), " and ", c.beta2()));
  }
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

}  // namespace

absl::StatusOr<std::unique_ptr<DenseOptimizer>> DenseOptimizer::Create(
    const OptimizerConfig& config, std::vector<ParamRef> params) {
  RETURN_IF_ERROR(Validate(config, params));
  return std::unique_ptr<DenseOptimizer>(
      new DenseOptimizer(config, std::move(params)));
}

DenseOptimizer::DenseOptimizer(const OptimizerConfig& config,
                               std::vector<ParamRef> params)
    : config_(config), params_(std::move(params)) {
  if (UsesAdagrad(config_.type())) {
    for (const ParamRef& p : params_) {
      state1_.emplace_back(p.size, config_.initial_accumulator());
    }
  } else if (config_.type() == OptimizerConfig::ADAM) {
    for (const ParamRef& p : params_) {
      state1_.emplace_back(p.size, 0.0f);
      state2_.emplace_back(p.size, 0.0f);
    }
  }
}

void DenseOptimizer::Step() {
  ++step_;
  const float lr = config_.learning_rate();
  const float eps = config_.eps();
  const OptimizerConfig::Type type = config_.type();
  // Adam's bias corrections in double: 1 - beta^t loses digits in float.
  const float b1 = config_.beta1();
  const float b2 = config_.beta2();
  const double t = static_cast<double>(step_);
  const float step_size =
      static_cast<float>(lr / (1.0 - std::pow(static_cast<double>(b1), t)));
  const float inv_sqrt_bc2 = static_cast<float>(
      1.0 / std::sqrt(1.0 - std::pow(static_cast<double>(b2), t)));
  for (size_t i = 0; i < params_.size(); ++i) {
    float* p = params_[i].value;
    const float* g = params_[i].grad;
    const int64_t n = params_[i].size;
    const bool parallel = n >= kParallelElements;
    if (type == OptimizerConfig::SGD) {
#pragma omp parallel for simd schedule(static) if (parallel)
      for (int64_t k = 0; k < n; ++k) p[k] -= lr * g[k];
    } else if (UsesAdagrad(type)) {
      float* s = state1_[i].data();
#pragma omp parallel for simd schedule(static) if (parallel)
      for (int64_t k = 0; k < n; ++k) {
        s[k] += g[k] * g[k];
        p[k] -= lr * g[k] / (std::sqrt(s[k]) + eps);
      }
    } else {
      float* m = state1_[i].data();
      float* v = state2_[i].data();
#pragma omp parallel for simd schedule(static) if (parallel)
      for (int64_t k = 0; k < n; ++k) {
        m[k] = b1 * m[k] + (1.0f - b1) * g[k];
        v[k] = b2 * v[k] + (1.0f - b2) * g[k] * g[k];
        p[k] -= step_size * m[k] / (std::sqrt(v[k]) * inv_sqrt_bc2 + eps);
      }
    }
  }
}

std::vector<ParamRef> DenseOptimizer::State() {
  std::vector<ParamRef> state;
  if (UsesAdagrad(config_.type())) {
    for (size_t i = 0; i < params_.size(); ++i) {
      state.push_back({params_[i].name + ".sum", state1_[i].data(), nullptr,
                       params_[i].size});
    }
  } else if (config_.type() == OptimizerConfig::ADAM) {
    for (size_t i = 0; i < params_.size(); ++i) {
      state.push_back({params_[i].name + ".exp_avg", state1_[i].data(), nullptr,
                       params_[i].size});
      state.push_back({params_[i].name + ".exp_avg_sq", state2_[i].data(),
                       nullptr, params_[i].size});
    }
  }
  return state;
}

}  // namespace dlrm::dense
