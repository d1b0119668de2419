// Dense optimizers over a list of parameters: the rules of optim/rules.h
// applied element by element.
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "core/aligned.h"
#include "dense/linear.h"
#include "dlrm/config.pb.h"

namespace dlrm::dense {

// True when the layer-wise rules (LAMB, LARS) give the parameter named
// `name` weight decay and a trust ratio: every one but a "*.bias"
// (optim/rules.h). The CPU and CUDA dense optimizers both ask this.
bool AdaptsLayerWise(std::string_view name);

// Applies one update per Step() to every parameter from its grad. Owns the
// optimizer state (optim::DenseState: Adagrad's sum, Adam's and LAMB's
// moments, LARS's momentum buffer). Update number t (step() after it, 1 for
// the first) runs at the schedule's rate for t. The layer-wise rules (LAMB,
// LARS) take each parameter as one layer; a parameter whose name ends in
// ".bias" gets no weight decay and a trust ratio of 1 (AdaptsLayerWise).
// Not thread-safe.
class DenseOptimizer {
 public:
  // `config` must be normalised (see core/config.h); ROWWISE_ADAGRAD means
  // plain Adagrad for dense parameters. Params are borrowed and must
  // outlive the optimizer. InvalidArgument for a config optim::Validate
  // refuses or a parameter with a null value / grad or a negative size.
  static absl::StatusOr<std::unique_ptr<DenseOptimizer>> Create(
      const OptimizerConfig& config, std::vector<ParamRef> params);

  void Step();

  // The bf16 copies of the parameters (PRECISION_BF16's GEMM inputs), one
  // per parameter in the order of Create's params, null where a parameter
  // has none: each Step then writes copies[i][k] = ToBf16(value[k]) in the
  // same pass as the update, so no conversion pass follows it. Borrowed;
  // empty (the default) for none. InvalidArgument for a count other than
  // the parameters'.
  absl::Status SetBf16Copies(std::vector<Bf16*> copies);

  // State tensors named "<param>.<state>" (e.g. "top.0.weight.exp_avg"),
  // for checkpoints, parameter by parameter in optim::DenseState's order;
  // empty for SGD. The step counter (step()) goes with them: a restore sets
  // both, and the schedule continues from it.
  std::vector<ParamRef> State();
  int64_t step() const { return step_; }
  void set_step(int64_t step) { step_ = step; }

  const OptimizerConfig& config() const { return config_; }
  // Replaces the constants (rate, schedule, eps, ...) of the next Step on
  // (a live change, Model::SetOptimizers). `config` normalised and valid.
  // InvalidArgument when its type or initial_accumulator differs from
  // config()'s (the state would change meaning).
  absl::Status SetConfig(const OptimizerConfig& config);

 private:
  DenseOptimizer(const OptimizerConfig& config, std::vector<ParamRef> params);

  OptimizerConfig config_;
  std::vector<ParamRef> params_;
  std::vector<Bf16*> bf16_copies_;  // SetBf16Copies
  // state_[k][i]: state array k of parameter i.
  std::vector<AlignedVector<float>> state_[2];
  // adapt_[i]: parameter i takes weight decay and a trust ratio (layer-wise
  // rules; false for biases).
  std::vector<bool> adapt_;
  // Partial sums of squares of the layer-wise norms, per block.
  std::vector<double> partials_;
  int64_t step_ = 0;
};

}  // namespace dlrm::dense
