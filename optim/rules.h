// The optimizers' math, written once. Each rule below holds one optimizer's
// step constants, state layout and per-element update; the update functions
// compile for the host and for CUDA devices (core/host_device.h), so the CPU
// table and dense kernels, the CUDA kernels and the tests all run the same
// formulas with the same roundings.
//
// A rule is a struct with:
//   struct Step           the constants of one step (learning rate, bias
//                         corrections, ...), with `using Rule` naming its
//                         rule; made once per step on the host by
//                         `MakeStep(config, step)` (an OptimizerConfig,
//                         valid; step counted from 1). Its learning_rate is
//                         the schedule's rate at that step
//                         (ScheduledLearningRate, schedule.h).
//   kDefaultLearningRate  what a learning_rate of 0 means.
//   kLayerWise            false for the element-wise rules below, true for
//                         the layer-wise ones (LAMB, LARS), whose update
//                         needs norms over a whole parameter tensor first.
//   kDenseState           state arrays of a dense parameter, in order
//                         (state1, state2); every one kElement.
// An element-wise rule also has:
//   kSparseState          state arrays of an embedding table, in order
//                         (EmbeddingTable's state1, state2). At most two.
//   DenseElement(step, g, p, s1, s2, i)
//                         updates p[i] and its state s1[i], s2[i] (arrays it
//                         has no state for are not touched) from gradient g.
//   kRowReduction         true when an embedding row's update needs a sum
//                         over its columns first; then state1 is kRow and
//                         RowTerm(g) is one column's term of the sum and
//                         RowScale(step, state1_of_row, sum, dim) updates the
//                         row's float and returns the row scale.
//   SparseElement(step, row_scale, g, w, s1, s2, c)
//                         updates column c of an embedding row: w[c] and its
//                         per-element state s1[c] / s2[c], where w, s1, s2
//                         point at the row's weights and the row's part of
//                         state1 / state2.
// A layer-wise rule instead has (dense parameters only; DenseOptimizer runs
// them: the norms over a tensor, MakeLayer, then LayerElement per element):
//   NormTerm(step, weight_decay, g, p, s1, s2, i)
//                         element i's term of the norm the trust ratio
//                         divides by (LAMB: of the update, LARS: of the
//                         gradient); reads only.
//   MakeLayer(step, adapt, weight_norm, term_norm)
//                         the tensor's constants (struct Layer): its weight
//                         decay and its learning rate times its trust ratio;
//                         adapt false (biases) means no decay and ratio 1.
//                         Host and device (the CUDA kernel makes it from
//                         norms it reduced), with Rn* double operations.
//   LayerElement(step, layer, g, p, s1, s2, i)
//                         updates p[i], s1[i], s2[i].
// Every float operation goes through RnAdd / RnMul / ... so nothing is fused
// into a multiply-add, on the host or the device. MakeStep is a template
// over the config type only so that this header, which CUDA files include,
// needs no Protobuf headers.
//
// Adding an optimizer: a rule here (an element-wise one's Step in AnyStep),
// its case in optim::Visit (optimizer.h), its enum value (and fields) in
// proto/dlrm/config.proto; optimizer.cc if it has new fields to validate.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <variant>

#include "core/host_device.h"
#include "optim/schedule.h"

namespace dlrm::optim {

// How many floats of a state array belong to one embedding row.
enum class Extent {
  kRow,      // One, shared by the row's columns.
  kElement,  // One per weight: dim.
};

// A state array's value before the first step.
enum class Initial {
  kZero,
  kInitialAccumulator,  // OptimizerConfig.initial_accumulator.
};

// One optimizer state array.
struct StateArray {
  // Suffix of its tensor name in checkpoints ("<param>.<name>").
  const char* name;
  Extent extent;
  Initial initial;
};

// Floats `array` holds per embedding row of `dim` columns: 1 or dim.
constexpr int FloatsPerRow(const StateArray& array, int dim) {
  return array.extent == Extent::kRow ? 1 : dim;
}

// 1 - beta^step, computed in double for the callers to round once to
// float: in float, 1 - beta^t loses the digits that matter while beta^t is
// close to 1.
inline double OneMinusPow(float beta, int64_t step) {
  return 1.0 - std::pow(static_cast<double>(beta), static_cast<double>(step));
}

// The start of every rule's MakeStep: a Step with the schedule's learning
// rate at `step` (ScheduledLearningRate), its other constants at their
// defaults.
template <typename Step, typename Config>
Step StepWithLearningRate(const Config& config, int64_t step) {
  Step s;
  s.learning_rate = ScheduledLearningRate(config, step);
  return s;
}

// Plain SGD: w -= lr * g. No state.
struct Sgd {
  struct Step {
    using Rule = Sgd;
    float learning_rate = 0;
  };
  static constexpr float kDefaultLearningRate = 0.1f;
  static constexpr std::array<StateArray, 0> kDenseState{};
  static constexpr std::array<StateArray, 0> kSparseState{};
  static constexpr bool kLayerWise = false;
  static constexpr bool kRowReduction = false;

  template <typename Config>
  static Step MakeStep(const Config& config, int64_t step) {
    return StepWithLearningRate<Step>(config, step);
  }

  DLRM_HOST_DEVICE static void DenseElement(const Step& s, float g, float* p,
                                            float* /*s1*/, float* /*s2*/,
                                            int64_t i) {
    p[i] = RnSub(p[i], RnMul(s.learning_rate, g));
  }

  DLRM_HOST_DEVICE static void SparseElement(const Step& s, float /*scale*/,
                                             float g, float* w, float* /*s1*/,
                                             float* /*s2*/, int64_t c) {
    w[c] = RnSub(w[c], RnMul(s.learning_rate, g));
  }
};

// Adagrad. Dense parameters: PyTorch's per-element Adagrad, s += g^2,
// p -= lr * g / (sqrt(s) + eps). Embedding rows: FBGEMM's row-wise Adagrad,
// one accumulator per row fed the mean of the squared gradient over the
// row's columns (ADAGRAD and ROWWISE_ADAGRAD both mean this).
struct Adagrad {
  struct Step {
    using Rule = Adagrad;
    float learning_rate = 0;
    float eps = 0;
  };
  static constexpr float kDefaultLearningRate = 0.01f;
  static constexpr std::array<StateArray, 1> kDenseState{
      {{"sum", Extent::kElement, Initial::kInitialAccumulator}}};
  // "momentum1": the checkpoints' name for a table's first state array.
  static constexpr std::array<StateArray, 1> kSparseState{
      {{"momentum1", Extent::kRow, Initial::kInitialAccumulator}}};
  static constexpr bool kLayerWise = false;
  static constexpr bool kRowReduction = true;

  template <typename Config>
  static Step MakeStep(const Config& config, int64_t step) {
    Step s = StepWithLearningRate<Step>(config, step);
    s.eps = config.eps();
    return s;
  }

  DLRM_HOST_DEVICE static void DenseElement(const Step& s, float g, float* p,
                                            float* s1, float* /*s2*/,
                                            int64_t i) {
    const float sum = RnAdd(s1[i], RnMul(g, g));
    s1[i] = sum;
    p[i] = RnSub(p[i],
                 RnDiv(RnMul(s.learning_rate, g), RnAdd(RnSqrt(sum), s.eps)));
  }

  DLRM_HOST_DEVICE static float RowTerm(float g) { return RnMul(g, g); }

  // The row's accumulator takes the mean square; returns sqrt(acc) + eps.
  DLRM_HOST_DEVICE static float RowScale(const Step& s, float& accumulator,
                                         float sum, int dim) {
    accumulator = RnAdd(accumulator, RnDiv(sum, static_cast<float>(dim)));
    return RnAdd(RnSqrt(accumulator), s.eps);
  }

  DLRM_HOST_DEVICE static void SparseElement(const Step& s, float denominator,
                                             float g, float* w, float* /*s1*/,
                                             float* /*s2*/, int64_t c) {
    w[c] = RnSub(w[c], RnDiv(RnMul(s.learning_rate, g), denominator));
  }
};

// The constants of Adam's and LAMB's moments at one step (part of their
// Step).
struct MomentConstants {
  float eps = 0;
  float beta1 = 0, beta2 = 0;
  float one_minus_beta1 = 1, one_minus_beta2 = 1;
  // 1 - beta^t.
  float bias1 = 1, bias2 = 1;
};

// Sets *s from `config` at step `step`.
template <typename Config>
void SetMomentConstants(const Config& config, int64_t step,
                        MomentConstants* s) {
  s->eps = config.eps();
  s->beta1 = config.beta1();
  s->beta2 = config.beta2();
  s->one_minus_beta1 = 1.0f - s->beta1;
  s->one_minus_beta2 = 1.0f - s->beta2;
  s->bias1 = static_cast<float>(OneMinusPow(s->beta1, step));
  s->bias2 = static_cast<float>(OneMinusPow(s->beta2, step));
}

// Adam's and LAMB's moments, m = b1 m + (1 - b1) g and
// v = b2 v + (1 - b2) g^2: one rounding order for both rules and both
// forms.
DLRM_HOST_DEVICE inline float FirstMoment(const MomentConstants& s, float g,
                                          float m) {
  return RnAdd(RnMul(s.beta1, m), RnMul(s.one_minus_beta1, g));
}
DLRM_HOST_DEVICE inline float SecondMoment(const MomentConstants& s, float g,
                                           float v) {
  return RnAdd(RnMul(s.beta2, v), RnMul(RnMul(s.one_minus_beta2, g), g));
}

// Both moments of element i stepped with gradient g, stored back into
// m[i] and v[i]; returns them.
struct Moments {
  float m, v;
};
DLRM_HOST_DEVICE inline Moments StepMoments(const MomentConstants& s, float g,
                                            float* m, float* v, int64_t i) {
  const Moments next{FirstMoment(s, g, m[i]), SecondMoment(s, g, v[i])};
  m[i] = next.m;
  v[i] = next.v;
  return next;
}

// Adam with bias correction; embedding rows update lazily (only rows in the
// batch, with the table's step count). Both forms compute
// m = b1 m + (1 - b1) g, v = b2 v + (1 - b2) g^2 and
// w -= lr * (m / bc1) / (sqrt(v / bc2) + eps), bc = 1 - beta^t, but round
// differently: dense parameters as PyTorch writes it (lr / bc1 and
// 1 / sqrt(bc2) folded into two constants), embedding rows as FBGEMM does.
// Merging the two would change one of them by an ulp here and there.
struct Adam {
  // Embedding rows use the moment constants' bias1 and bias2.
  struct Step : MomentConstants {
    using Rule = Adam;
    float learning_rate = 0;
    // Dense parameters: lr / (1 - beta1^t) and 1 / sqrt(1 - beta2^t).
    float step_size = 0, inv_sqrt_bias2 = 1;
  };
  static constexpr float kDefaultLearningRate = 0.001f;
  static constexpr std::array<StateArray, 2> kDenseState{
      {{"exp_avg", Extent::kElement, Initial::kZero},
       {"exp_avg_sq", Extent::kElement, Initial::kZero}}};
  static constexpr std::array<StateArray, 2> kSparseState{
      {{"momentum1", Extent::kElement, Initial::kZero},
       {"momentum2", Extent::kElement, Initial::kZero}}};
  static constexpr bool kLayerWise = false;
  static constexpr bool kRowReduction = false;

  template <typename Config>
  static Step MakeStep(const Config& config, int64_t step) {
    Step s = StepWithLearningRate<Step>(config, step);
    SetMomentConstants(config, step, &s);
    // From the double 1 - beta^t, not the rounded bias1 / bias2.
    s.step_size =
        static_cast<float>(s.learning_rate / OneMinusPow(s.beta1, step));
    s.inv_sqrt_bias2 =
        static_cast<float>(1.0 / std::sqrt(OneMinusPow(s.beta2, step)));
    return s;
  }

  DLRM_HOST_DEVICE static void DenseElement(const Step& s, float g, float* p,
                                            float* s1, float* s2, int64_t i) {
    const auto [m, v] = StepMoments(s, g, s1, s2, i);
    p[i] = RnSub(p[i], RnDiv(RnMul(s.step_size, m),
                             RnAdd(RnMul(RnSqrt(v), s.inv_sqrt_bias2), s.eps)));
  }

  DLRM_HOST_DEVICE static void SparseElement(const Step& s, float /*scale*/,
                                             float g, float* w, float* s1,
                                             float* s2, int64_t c) {
    const auto [m, v] = StepMoments(s, g, s1, s2, c);
    w[c] = RnSub(w[c], RnDiv(RnMul(s.learning_rate, RnDiv(m, s.bias1)),
                             RnAdd(RnSqrt(RnDiv(v, s.bias2)), s.eps)));
  }
};

// The layer-wise rules. Choices, where the papers and the common
// implementations (NVIDIA apex FusedLAMB / LARC, TF Addons LAMB, the MLPerf
// ResNet LARS, torch-optimizer) differ:
// - Layers: each parameter tensor is one layer (a Linear's weight, its bias).
// - Biases (DenseOptimizer: a parameter named "*.bias") take neither weight
//   decay nor the trust ratio (ratio 1), as BERT's LAMB (apex with decay 0,
//   TF Addons' exclude lists) and MLPerf's LARS (skip list) do; plain Adam /
//   momentum SGD at the scheduled rate.
// - Zero norms: the ratio is 1 when ||w|| or the other norm is 0 (apex, TF,
//   torch-optimizer), so a zero-initialised tensor still moves and a zero
//   update divides nothing by 0. No clipping of the ratio or of ||w||.
// - Norms are sums of squares in double, reduced in a fixed order
//   (DenseOptimizer; the CUDA kernels in another fixed order, so the norms
//   agree within double rounding); the ratio is computed in double and the
//   tensor's rate lr x ratio rounded once to float.

// One tensor's constants under a layer-wise rule.
struct LayerRate {
  float weight_decay = 0;
  // The step's learning rate x the tensor's ratio.
  float learning_rate = 0;
};

// The constants every layer-wise rule's Step has (part of it): the step's
// learning rate and weight decay.
struct LayerConstants {
  float learning_rate = 0, weight_decay = 0;
};

// A tensor's LayerRate from a step's LayerConstants: with `adapt`, the
// step's weight decay and lr x `ratio` rounded once to float; without (a
// bias), no weight decay and `ratio` (then 1).
DLRM_HOST_DEVICE inline LayerRate MakeLayerRate(const LayerConstants& s,
                                                bool adapt, double ratio) {
  LayerRate l;
  l.weight_decay = adapt ? s.weight_decay : 0.0f;
  l.learning_rate =
      static_cast<float>(RnMul(static_cast<double>(s.learning_rate), ratio));
  return l;
}

// LAMB (You et al. 2019, Algorithm 2, with Adam's bias correction as apex
// and TF Addons apply it): m = b1 m + (1 - b1) g, v = b2 v + (1 - b2) g^2,
// u = (m / bc1) / (sqrt(v / bc2) + eps) + wd w, w -= lr (||w|| / ||u||) u.
// The moments round as the embedding rows' Adam does. No gradient
// pre-normalisation by the global norm (apex's max_grad_norm): the DLRM
// step has no gradient clipping anywhere else either.
struct Lamb {
  struct Step : MomentConstants, LayerConstants {
    using Rule = Lamb;
  };
  // The tensor's rate: the step's learning rate x its trust ratio.
  using Layer = LayerRate;
  static constexpr float kDefaultLearningRate = 0.001f;
  static constexpr bool kLayerWise = true;
  static constexpr std::array<StateArray, 2> kDenseState{
      {{"exp_avg", Extent::kElement, Initial::kZero},
       {"exp_avg_sq", Extent::kElement, Initial::kZero}}};

  template <typename Config>
  static Step MakeStep(const Config& config, int64_t step) {
    Step s = StepWithLearningRate<Step>(config, step);
    SetMomentConstants(config, step, &s);
    s.weight_decay = config.weight_decay();
    return s;
  }

  // The update u of element i, from the moments the step stores.
  DLRM_HOST_DEVICE static float Update(const Step& s, float weight_decay,
                                       float m, float v, float w) {
    const float adam =
        RnDiv(RnDiv(m, s.bias1), RnAdd(RnSqrt(RnDiv(v, s.bias2)), s.eps));
    return RnAdd(adam, RnMul(weight_decay, w));
  }

  // u_i: the trust ratio is ||w|| / ||u||.
  DLRM_HOST_DEVICE static float NormTerm(const Step& s, float weight_decay,
                                         float g, const float* p,
                                         const float* s1, const float* s2,
                                         int64_t i) {
    return Update(s, weight_decay, FirstMoment(s, g, s1[i]),
                  SecondMoment(s, g, s2[i]), p[i]);
  }

  DLRM_HOST_DEVICE static Layer MakeLayer(const Step& s, bool adapt,
                                          double weight_norm,
                                          double update_norm) {
    const double ratio = adapt && weight_norm > 0 && update_norm > 0
                             ? RnDiv(weight_norm, update_norm)
                             : 1.0;
    return MakeLayerRate(s, adapt, ratio);
  }

  DLRM_HOST_DEVICE static void LayerElement(const Step& s, const Layer& l,
                                            float g, float* p, float* s1,
                                            float* s2, int64_t i) {
    const auto [m, v] = StepMoments(s, g, s1, s2, i);
    p[i] = RnSub(p[i],
                 RnMul(l.learning_rate, Update(s, l.weight_decay, m, v, p[i])));
  }
};

// LARS (You et al. 2017, Algorithm 1; the form of the MLPerf ResNet / TF
// LARSOptimizer, with the rate inside the momentum): local = eta ||w|| /
// (||g|| + wd ||w||), v = mu v + lr local (g + wd w), w -= v. No epsilon in
// the denominator: the zero-norm rule above covers what it guards against.
struct Lars {
  struct Step : LayerConstants {
    using Rule = Lars;
    float momentum = 0;
    float trust_coefficient = 0;
  };
  // The tensor's rate: the step's learning rate x its local rate.
  using Layer = LayerRate;
  static constexpr float kDefaultLearningRate = 0.1f;
  static constexpr bool kLayerWise = true;
  // PyTorch SGD's name for it.
  static constexpr std::array<StateArray, 1> kDenseState{
      {{"momentum_buffer", Extent::kElement, Initial::kZero}}};

  template <typename Config>
  static Step MakeStep(const Config& config, int64_t step) {
    Step s = StepWithLearningRate<Step>(config, step);
    s.momentum = config.momentum();
    s.weight_decay = config.weight_decay();
    s.trust_coefficient = config.trust_coefficient();
    return s;
  }

  // g_i: the local rate divides by ||g|| + wd ||w||.
  DLRM_HOST_DEVICE static float NormTerm(const Step& /*s*/,
                                         float /*weight_decay*/, float g,
                                         const float* /*p*/,
                                         const float* /*s1*/,
                                         const float* /*s2*/, int64_t /*i*/) {
    return g;
  }

  DLRM_HOST_DEVICE static Layer MakeLayer(const Step& s, bool adapt,
                                          double weight_norm,
                                          double grad_norm) {
    const double ratio =
        adapt && weight_norm > 0 && grad_norm > 0
            ? RnDiv(
                  RnMul(double{s.trust_coefficient}, weight_norm),
                  RnAdd(grad_norm, RnMul(double{s.weight_decay}, weight_norm)))
            : 1.0;
    return MakeLayerRate(s, adapt, ratio);
  }

  DLRM_HOST_DEVICE static void LayerElement(const Step& s, const Layer& l,
                                            float g, float* p, float* s1,
                                            float* /*s2*/, int64_t i) {
    const float d = RnAdd(g, RnMul(l.weight_decay, p[i]));
    const float v = RnAdd(RnMul(s.momentum, s1[i]), RnMul(l.learning_rate, d));
    s1[i] = v;
    p[i] = RnSub(p[i], v);
  }
};

// One step's constants of any element-wise rule: what the CUDA entry points
// take, made on the host by optim::MakeStep (optimizer.h). std::visit on it
// gives the Step, and Step::Rule its rule.
using AnyStep = std::variant<Sgd::Step, Adagrad::Step, Adam::Step>;

// UpdateSparseRow with the row's reduction already computed: `sum` is, for
// a kRowReduction rule, the sum from 0 over c in [0, dim) in column order of
// RowTerm(g[c]) (ignored for other rules). For callers that compute the sums
// of several rows at once (the CPU table interleaves them).
template <typename Rule>
DLRM_HOST_DEVICE inline void UpdateSparseRowWithSum(
    const typename Rule::Step& step, float sum, const float* __restrict__ g,
    int dim, float* __restrict__ w, float* __restrict__ s1,
    float* __restrict__ s2) {
  // A local copy: the stores below cannot change it, so the compiler keeps
  // the constants in registers instead of reloading them per column.
  const typename Rule::Step k = step;
  float row_scale = 0.0f;
  if constexpr (Rule::kRowReduction) {
    row_scale = Rule::RowScale(k, *s1, sum, dim);
  }
  DLRM_IVDEP
  for (int c = 0; c < dim; ++c) {
    Rule::SparseElement(k, row_scale, g[c], w, s1, s2, c);
  }
}

// One embedding row's update from its summed gradient g[0, dim): w points
// at the row's weights, s1 / s2 at the row's part of state1 / state2 (may be
// null where the rule has no such array; none of them overlap). The row sum
// runs over the columns in order; CUDA kernels split a row over lanes and
// sum in another order, but call SparseElement per element as this does.
template <typename Rule>
DLRM_HOST_DEVICE inline void UpdateSparseRow(const typename Rule::Step& step,
                                             const float* __restrict__ g,
                                             int dim, float* __restrict__ w,
                                             float* __restrict__ s1,
                                             float* __restrict__ s2) {
  float sum = 0.0f;
  if constexpr (Rule::kRowReduction) {
    for (int c = 0; c < dim; ++c) sum = RnAdd(sum, Rule::RowTerm(g[c]));
  }
  UpdateSparseRowWithSum<Rule>(step, sum, g, dim, w, s1, s2);
}

}  // namespace dlrm::optim
