// What the rest of the server asks about an optimizer config: its defaults,
// its validation and the layout of its state, for dense parameters and for
// embedding rows (host tables, the RocksDB store, the planner's byte counts,
// checkpoints). The update math is in optim/rules.h. All functions are pure
// and thread-safe.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "dlrm/config.pb.h"
#include "optim/rules.h"

namespace dlrm::optim {

// Calls fn(Rule{}) with the rule of `type` and returns true; returns false
// without calling fn for a type no rule implements. The one switch over
// optimizer types: the code that runs optimizers is a template over the
// rule.
template <typename Fn>
bool Visit(OptimizerConfig::Type type, Fn&& fn) {
  switch (type) {
    case OptimizerConfig::SGD:
      fn(Sgd{});
      return true;
    case OptimizerConfig::ADAGRAD:
    case OptimizerConfig::ROWWISE_ADAGRAD:
      fn(Adagrad{});
      return true;
    case OptimizerConfig::ADAM:
      fn(Adam{});
      return true;
    default:
      return false;
  }
}

// The constants of step number `step` (1 for the first) of `config`
// (normalised, valid), for the CUDA kernels. InvalidArgument for a type no
// rule implements.
absl::StatusOr<AnyStep> MakeStep(const OptimizerConfig& config, int64_t step);

// Fills the fields `config` leaves 0 with their defaults: the rule's
// learning rate, eps 1e-8, beta1 0.9, beta2 0.999. A type no rule
// implements keeps learning_rate 0 (Validate then refuses it).
void SetDefaults(OptimizerConfig* config);

// OK when `config` (normalised by SetDefaults) can run: a known type, a
// finite learning_rate > 0, a finite eps > 0, betas in [0, 1) and a finite
// initial_accumulator >= 0 (checked whatever the type, as every optimizer
// has these fields). Otherwise InvalidArgument whose message starts with
// "<field>.<member>", e.g. "dense_optimizer.eps must be ...".
absl::Status Validate(const OptimizerConfig& config, const std::string& field);

// State arrays of an embedding table, in order (EmbeddingTable's state1,
// state2); of a dense parameter (DenseOptimizer's). Empty for SGD and for a
// type no rule implements. The spans point at static data.
std::span<const StateArray> SparseState(const OptimizerConfig& config);
std::span<const StateArray> DenseState(const OptimizerConfig& config);

// The value `array` starts at, before the first step.
float InitialValue(const StateArray& array, const OptimizerConfig& config);

// Writes the state of an embedding row no step has touched into
// out[0, SparseStateFloatsPerRow(config, dim)): each array's InitialValue,
// arrays in order.
void InitialSparseState(const OptimizerConfig& config, int dim, float* out);

// Floats of state one embedding row carries, all arrays together: 0 (SGD),
// 1 (row-wise Adagrad), 2 * dim (Adam).
int SparseStateFloatsPerRow(const OptimizerConfig& config, int dim);

// Floats of state per dense parameter element: 0 (SGD), 1 (Adagrad),
// 2 (Adam).
int DenseStateFloatsPerElement(const OptimizerConfig& config);

// True when an embedding row's state is shared by its columns (a kRow
// array): a table split into column blocks would then keep one such value
// per block and train differently from the whole table.
bool SparseStateSpansColumns(const OptimizerConfig& config);

}  // namespace dlrm::optim
