// Dense optimizers over a list of parameters: the rules of optim/rules.h
// applied element by element.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "core/aligned.h"
#include "dense/linear.h"
#include "dlrm/config.pb.h"

namespace dlrm::dense {

// Applies one update per Step() to every parameter from its grad. Owns the
// optimizer state (optim::DenseState: Adagrad's sum, Adam's moments). Not
// thread-safe.
class DenseOptimizer {
 public:
  // `config` must be normalised (see core/config.h); ROWWISE_ADAGRAD means
  // plain Adagrad for dense parameters. Params are borrowed and must
  // outlive the optimizer. InvalidArgument for a config optim::Validate
  // refuses or a parameter with a null value / grad or a negative size.
  static absl::StatusOr<std::unique_ptr<DenseOptimizer>> Create(
      const OptimizerConfig& config, std::vector<ParamRef> params);

  void Step();

  // State tensors named "<param>.<state>" (e.g. "top.0.weight.exp_avg"),
  // for checkpoints, parameter by parameter in optim::DenseState's order;
  // empty for SGD.
  std::vector<ParamRef> State();
  int64_t step() const { return step_; }
  void set_step(int64_t step) { step_ = step; }

 private:
  DenseOptimizer(const OptimizerConfig& config, std::vector<ParamRef> params);

  OptimizerConfig config_;
  std::vector<ParamRef> params_;
  // state_[k][i]: state array k of parameter i.
  std::vector<AlignedVector<float>> state_[2];
  int64_t step_ = 0;
};

}  // namespace dlrm::dense
