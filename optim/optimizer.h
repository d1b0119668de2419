// What the rest of the server asks about an optimizer config: its defaults,
// its validation and the layout of its state, for dense parameters and for
// embedding rows (host tables, the RocksDB store, the planner's byte counts,
// checkpoints). The update math is in optim/rules.h. All functions are pure
// and thread-safe.
#pragma once

#include <array>
#include <cstddef>
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
    case OptimizerConfig::LAMB:
      fn(Lamb{});
      return true;
    case OptimizerConfig::LARS:
      fn(Lars{});
      return true;
    default:
      return false;
  }
}

// Visit for the element-wise rules only (not Rule::kLayerWise): the ones
// with an embedding-row form and an AnyStep, which the embedding tables and
// the CUDA kernels run. Returns false, without calling fn, for a layer-wise
// type or one no rule implements.
template <typename Fn>
bool VisitElementWise(OptimizerConfig::Type type, Fn&& fn) {
  bool called = false;
  Visit(type, [&](auto rule) {
    if constexpr (!decltype(rule)::kLayerWise) {
      fn(rule);
      called = true;
    }
  });
  return called;
}

// The constants of step number `step` (1 for the first) of `config`
// (normalised, valid), for the CUDA embedding kernels; their learning rate is
// the schedule's at that step. InvalidArgument for a layer-wise type (LAMB,
// LARS) or one no rule implements.
absl::StatusOr<AnyStep> MakeStep(const OptimizerConfig& config, int64_t step);

// One step's constants as the bytes of its rule's Step (of an element-wise
// or a layer-wise rule), for a copy into device memory: the CUDA dense
// optimizer's kernels read them there, so that its update launches the same
// work every step (docs/cuda.md "CUDA graphs").
struct PackedStep {
  // At least sizeof(Rule::Step) of every rule (checked where packed).
  static constexpr size_t kMaxBytes = 64;
  // The Step at bytes[0, size), zero after it.
  alignas(8) std::array<std::byte, kMaxBytes> bytes{};
  size_t size = 0;
};

// The constants of step number `step` of `config` (normalised, valid) for
// any rule, element-wise or layer-wise, packed: Rule::MakeStep, the
// function MakeStep and the CPU's DenseOptimizer call.
// InvalidArgument for a type no rule implements.
absl::StatusOr<PackedStep> MakePackedStep(const OptimizerConfig& config,
                                          int64_t step);

// Fills the fields `config` leaves 0 with their defaults: the rule's
// learning rate, eps 1e-8, beta1 0.9, beta2 0.999; for LARS,
// trust_coefficient 0.001; in a schedule's set decay, power 2
// (polynomial) or gamma 0.1 (step). A type no rule implements keeps
// learning_rate 0 (Validate then refuses it).
void SetDefaults(OptimizerConfig* config);

// OK when `config` (normalised by SetDefaults) can run on dense
// parameters: a known type, a finite learning_rate > 0, a finite eps > 0,
// betas in [0, 1) and a finite initial_accumulator >= 0 (checked whatever
// the type, as every optimizer has these fields); weight_decay finite >= 0
// and 0 unless LAMB or LARS; momentum in [0, 1) and trust_coefficient
// finite > 0 for LARS, both 0 otherwise; a schedule with warmup_steps >= 0,
// warmup_start_factor in [0, 1], and in its decay decay_start_step >= 0,
// decay_steps > 0, power finite > 0 and end_factor in [0, 1] (polynomial)
// or step_size > 0 and gamma in (0, 1] (step). Otherwise InvalidArgument
// whose message starts with "<field>.<member>", e.g. "dense_optimizer.eps
// must be ..." or "dense_optimizer.schedule.warmup_steps must be ...".
absl::Status Validate(const OptimizerConfig& config, const std::string& field);

// Validate for the embedding tables' optimizer: also InvalidArgument
// naming "<field>.type" for a layer-wise type (LAMB, LARS), which has no
// embedding-row form.
absl::Status ValidateSparse(const OptimizerConfig& config,
                            const std::string& field);

// State arrays of an embedding table, in order (EmbeddingTable's state1,
// state2); of a dense parameter (DenseOptimizer's). Empty for SGD and for a
// type no rule implements, and SparseState for a layer-wise type. The spans
// point at static data.
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

// Floats of state per dense parameter element: 0 (SGD), 1 (Adagrad,
// LARS), 2 (Adam, LAMB).
int DenseStateFloatsPerElement(const OptimizerConfig& config);

// True when an embedding row's state is shared by its columns (a kRow
// array): a table split into column blocks would then keep one such value
// per block and train differently from the whole table.
bool SparseStateSpansColumns(const OptimizerConfig& config);

}  // namespace dlrm::optim
