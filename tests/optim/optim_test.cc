// Tests for optim/: the rules' formulas against double-precision references
// and against a per-operation correctly rounded reference (what the CUDA
// _rn intrinsics compute), the step constants, the state layouts,
// defaults and validation.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <span>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "core/random.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/text_format.h"
#include "optim/optimizer.h"
#include "optim/rules.h"
#include "optim/schedule.h"
#include "tests/support/expect.h"

namespace dlrm::optim {
namespace {

constexpr uint64_t kSeed = 20261124;

Rng SeededRng(uint64_t seed) {
  std::printf("[   seed   ] %llu\n", static_cast<unsigned long long>(seed));
  return Rng(seed);
}

std::vector<float> Normals(Rng& rng, size_t n, double scale = 1.0) {
  std::vector<float> v(n);
  for (float& x : v) x = static_cast<float>(rng.Normal() * scale);
  return v;
}

OptimizerConfig Config(OptimizerConfig::Type type) {
  OptimizerConfig c;
  c.set_type(type);
  c.set_initial_accumulator(0.1f);
  SetDefaults(&c);
  return c;
}

// One float operation, rounded on its own: each result goes through a
// volatile float, so no compiler can fuse it into the next operation (as
// the CUDA _rn intrinsics cannot be). A rule compiled with FMA contraction
// differs from these (checked by building this test with
// -ffp-contract=fast).
float Rounded(float x) {
  volatile float v = x;
  return v;
}
float Add(float a, float b) { return Rounded(a + b); }
float Sub(float a, float b) { return Rounded(a - b); }
float Mul(float a, float b) { return Rounded(a * b); }
float Div(float a, float b) { return Rounded(a / b); }
float Sqrt(float a) { return Rounded(std::sqrt(a)); }

// Weights and up to two state arrays of n floats.
struct Arrays {
  std::vector<float> w, s1, s2;
};

// Expects |a - b| <= rel * max(|b|, rms(b)) elementwise.
void ExpectCloseToScale(const std::vector<float>& a,
                        const std::vector<double>& b, double rel,
                        const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  double sum_sq = 0;
  for (double x : b) sum_sq += x * x;
  const double rms = b.empty() ? 0.0 : std::sqrt(sum_sq / b.size());
  int bad = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double tol = rel * std::max(std::fabs(b[i]), rms);
    if (!(std::fabs(a[i] - b[i]) <= tol) && ++bad <= 5) {
      ADD_FAILURE() << what << " [" << i << "]: " << a[i] << " vs " << b[i];
    }
  }
  EXPECT_EQ(bad, 0) << what;
}

void ExpectBitwiseEqual(const std::vector<float>& a,
                        const std::vector<float>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  int bad = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0 && ++bad <= 5) {
      ADD_FAILURE() << what << " [" << i << "]: " << a[i] << " vs " << b[i];
    }
  }
  EXPECT_EQ(bad, 0) << what;
}

// ------------------------------------------------- dense parameters

// The rule of `config`, element by element over `a`, for steps 1..steps,
// with fresh gradients from `grads`.
void RunDense(const OptimizerConfig& config,
              const std::vector<std::vector<float>>& grads, Arrays* a) {
  for (size_t t = 0; t < grads.size(); ++t) {
    VisitElementWise(config.type(), [&](auto rule) {
      using Rule = decltype(rule);
      const typename Rule::Step step =
          Rule::MakeStep(config, static_cast<int64_t>(t) + 1);
      for (size_t i = 0; i < a->w.size(); ++i) {
        Rule::DenseElement(step, grads[t][i], a->w.data(), a->s1.data(),
                           a->s2.data(), static_cast<int64_t>(i));
      }
    });
  }
}

// The same updates with each float operation rounded on its own.
void RunDenseRoundedReference(const OptimizerConfig& config,
                              const std::vector<std::vector<float>>& grads,
                              Arrays* a) {
  const float lr = config.learning_rate(), eps = config.eps();
  const float b1 = config.beta1(), b2 = config.beta2();
  for (size_t t = 0; t < grads.size(); ++t) {
    const double step = static_cast<double>(t + 1);
    const float step_size =
        static_cast<float>(lr / (1.0 - std::pow(double{b1}, step)));
    const float inv_sqrt_bias2 =
        static_cast<float>(1.0 / std::sqrt(1.0 - std::pow(double{b2}, step)));
    for (size_t i = 0; i < a->w.size(); ++i) {
      const float g = grads[t][i];
      float& p = a->w[i];
      switch (config.type()) {
        case OptimizerConfig::SGD:
          p = Sub(p, Mul(lr, g));
          break;
        case OptimizerConfig::ADAGRAD:
        case OptimizerConfig::ROWWISE_ADAGRAD:
          a->s1[i] = Add(a->s1[i], Mul(g, g));
          p = Sub(p, Div(Mul(lr, g), Add(Sqrt(a->s1[i]), eps)));
          break;
        default: {
          float& m = a->s1[i];
          float& v = a->s2[i];
          m = Add(Mul(b1, m), Mul(Sub(1.0f, b1), g));
          v = Add(Mul(b2, v), Mul(Mul(Sub(1.0f, b2), g), g));
          p = Sub(p, Div(Mul(step_size, m),
                         Add(Mul(Sqrt(v), inv_sqrt_bias2), eps)));
          break;
        }
      }
    }
  }
}

// The textbook formulas in double (PyTorch's Adagrad and Adam).
std::vector<double> DenseDoubleReference(
    const OptimizerConfig& config, const std::vector<std::vector<float>>& grads,
    const std::vector<float>& w0, double initial_state) {
  const double lr = config.learning_rate(), eps = config.eps();
  const double b1 = config.beta1(), b2 = config.beta2();
  std::vector<double> p(w0.begin(), w0.end());
  std::vector<double> s(p.size(), initial_state), m(p.size(), 0.0),
      v(p.size(), 0.0);
  for (size_t t = 0; t < grads.size(); ++t) {
    const double bc1 = 1 - std::pow(b1, t + 1.0);
    const double bc2 = 1 - std::pow(b2, t + 1.0);
    for (size_t i = 0; i < p.size(); ++i) {
      const double g = grads[t][i];
      switch (config.type()) {
        case OptimizerConfig::SGD:
          p[i] -= lr * g;
          break;
        case OptimizerConfig::ADAGRAD:
        case OptimizerConfig::ROWWISE_ADAGRAD:
          s[i] += g * g;
          p[i] -= lr * g / (std::sqrt(s[i]) + eps);
          break;
        default:
          m[i] = b1 * m[i] + (1 - b1) * g;
          v[i] = b2 * v[i] + (1 - b2) * g * g;
          p[i] -= lr * (m[i] / bc1) / (std::sqrt(v[i] / bc2) + eps);
          break;
      }
    }
  }
  return p;
}

// `steps` gradients of `n` normal floats.
std::vector<std::vector<float>> Gradients(Rng& rng, int steps, size_t n) {
  std::vector<std::vector<float>> grads;
  for (int t = 0; t < steps; ++t) grads.push_back(Normals(rng, n));
  return grads;
}

const OptimizerConfig::Type kTypes[] = {
    OptimizerConfig::SGD, OptimizerConfig::ADAGRAD,
    OptimizerConfig::ROWWISE_ADAGRAD, OptimizerConfig::ADAM};

// Weights `w` and two state arrays of `n` floats whatever the rule (so a
// rule touching one it does not own would show), the first at its initial
// value when `arrays` (the rule's state) has one.
Arrays StartState(const OptimizerConfig& config,
                  std::span<const StateArray> arrays, size_t n,
                  std::vector<float> w) {
  Arrays a;
  a.w = std::move(w);
  a.s1.assign(n, 0.0f);
  a.s2.assign(n, 0.0f);
  if (!arrays.empty()) a.s1.assign(n, InitialValue(arrays[0], config));
  return a;
}

Arrays StartArrays(const OptimizerConfig& config, std::vector<float> w) {
  const size_t n = w.size();
  return StartState(config, DenseState(config), n, std::move(w));
}

TEST(DenseRuleTest, RoundsEachOperationLikeTheDevice) {
  Rng rng = SeededRng(kSeed);
  const size_t n = 1001;
  for (OptimizerConfig::Type type : kTypes) {
    const OptimizerConfig config = Config(type);
    const std::vector<std::vector<float>> grads = Gradients(rng, 5, n);
    const std::vector<float> w0 = Normals(rng, n);
    Arrays got = StartArrays(config, w0), want = StartArrays(config, w0);
    RunDense(config, grads, &got);
    RunDenseRoundedReference(config, grads, &want);
    const std::string label = OptimizerConfig::Type_Name(type);
    ExpectBitwiseEqual(got.w, want.w, label + " param");
    ExpectBitwiseEqual(got.s1, want.s1, label + " state1");
    ExpectBitwiseEqual(got.s2, want.s2, label + " state2");
  }
}

TEST(DenseRuleTest, MatchesTheFormulasInDouble) {
  Rng rng = SeededRng(kSeed + 1);
  const size_t n = 1001;
  for (OptimizerConfig::Type type : kTypes) {
    const OptimizerConfig config = Config(type);
    const std::vector<std::vector<float>> grads = Gradients(rng, 5, n);
    const std::vector<float> w0 = Normals(rng, n);
    Arrays got = StartArrays(config, w0);
    RunDense(config, grads, &got);
    // A few float roundings per step, of the parameter's size.
    ExpectCloseToScale(
        got.w,
        DenseDoubleReference(config, grads, w0, config.initial_accumulator()),
        1e-6, OptimizerConfig::Type_Name(type));
  }
}

// ------------------------------------------------- embedding rows

// UpdateSparseRow of `config`'s rule on one row of `dim` with state laid out
// as SparseState says.
void RunSparseRow(const OptimizerConfig& config,
                  const std::vector<std::vector<float>>& grads, int dim,
                  Arrays* a) {
  for (size_t t = 0; t < grads.size(); ++t) {
    VisitElementWise(config.type(), [&](auto rule) {
      using Rule = decltype(rule);
      UpdateSparseRow<Rule>(Rule::MakeStep(config, static_cast<int64_t>(t) + 1),
                            grads[t].data(), dim, a->w.data(), a->s1.data(),
                            a->s2.data());
    });
  }
}

void RunSparseRowRoundedReference(const OptimizerConfig& config,
                                  const std::vector<std::vector<float>>& grads,
                                  int dim, Arrays* a) {
  const float lr = config.learning_rate(), eps = config.eps();
  const float b1 = config.beta1(), b2 = config.beta2();
  for (size_t t = 0; t < grads.size(); ++t) {
    const double step = static_cast<double>(t + 1);
    const float bias1 = static_cast<float>(1.0 - std::pow(double{b1}, step));
    const float bias2 = static_cast<float>(1.0 - std::pow(double{b2}, step));
    const float* g = grads[t].data();
    switch (config.type()) {
      case OptimizerConfig::SGD:
        for (int c = 0; c < dim; ++c) a->w[c] = Sub(a->w[c], Mul(lr, g[c]));
        break;
      case OptimizerConfig::ADAGRAD:
      case OptimizerConfig::ROWWISE_ADAGRAD: {
        float sum = 0.0f;
        for (int c = 0; c < dim; ++c) sum = Add(sum, Mul(g[c], g[c]));
        a->s1[0] = Add(a->s1[0], Div(sum, static_cast<float>(dim)));
        const float denom = Add(Sqrt(a->s1[0]), eps);
        for (int c = 0; c < dim; ++c) {
          a->w[c] = Sub(a->w[c], Div(Mul(lr, g[c]), denom));
        }
        break;
      }
      default:
        for (int c = 0; c < dim; ++c) {
          float& m = a->s1[c];
          float& v = a->s2[c];
          m = Add(Mul(b1, m), Mul(Sub(1.0f, b1), g[c]));
          v = Add(Mul(b2, v), Mul(Mul(Sub(1.0f, b2), g[c]), g[c]));
          a->w[c] = Sub(a->w[c], Div(Mul(lr, Div(m, bias1)),
                                     Add(Sqrt(Div(v, bias2)), eps)));
        }
        break;
    }
  }
}

// FBGEMM's row-wise Adagrad, SGD and Adam in double.
std::vector<double> SparseRowDoubleReference(
    const OptimizerConfig& config, const std::vector<std::vector<float>>& grads,
    int dim, const std::vector<float>& w0) {
  const double lr = config.learning_rate(), eps = config.eps();
  const double b1 = config.beta1(), b2 = config.beta2();
  std::vector<double> w(w0.begin(), w0.end()), m(dim, 0.0), v(dim, 0.0);
  double acc = config.initial_accumulator();
  for (size_t t = 0; t < grads.size(); ++t) {
    const std::vector<float>& g = grads[t];
    const double bc1 = 1 - std::pow(b1, t + 1.0);
    const double bc2 = 1 - std::pow(b2, t + 1.0);
    switch (config.type()) {
      case OptimizerConfig::SGD:
        for (int c = 0; c < dim; ++c) w[c] -= lr * g[c];
        break;
      case OptimizerConfig::ADAGRAD:
      case OptimizerConfig::ROWWISE_ADAGRAD: {
        double sum = 0;
        for (int c = 0; c < dim; ++c) sum += double{g[c]} * g[c];
        acc += sum / dim;
        for (int c = 0; c < dim; ++c)
          w[c] -= lr * g[c] / (std::sqrt(acc) + eps);
        break;
      }
      default:
        for (int c = 0; c < dim; ++c) {
          m[c] = b1 * m[c] + (1 - b1) * g[c];
          v[c] = b2 * v[c] + (1 - b2) * g[c] * g[c];
          w[c] -= lr * (m[c] / bc1) / (std::sqrt(v[c] / bc2) + eps);
        }
        break;
    }
  }
  return w;
}

Arrays StartRow(const OptimizerConfig& config, int dim, std::vector<float> w) {
  return StartState(config, SparseState(config), dim, std::move(w));
}

TEST(SparseRuleTest, RowUpdateRoundsEachOperationLikeTheDevice) {
  Rng rng = SeededRng(kSeed + 2);
  // Dims around the 8-wide vector loop and its tail.
  for (int dim : {1, 3, 8, 17, 64}) {
    for (OptimizerConfig::Type type : kTypes) {
      const OptimizerConfig config = Config(type);
      const std::vector<std::vector<float>> grads = Gradients(rng, 4, dim);
      const std::vector<float> w0 = Normals(rng, dim);
      Arrays got = StartRow(config, dim, w0), want = got;
      RunSparseRow(config, grads, dim, &got);
      RunSparseRowRoundedReference(config, grads, dim, &want);
      const std::string label =
          OptimizerConfig::Type_Name(type) + " dim " + std::to_string(dim);
      ExpectBitwiseEqual(got.w, want.w, label + " weights");
      ExpectBitwiseEqual(got.s1, want.s1, label + " state1");
      ExpectBitwiseEqual(got.s2, want.s2, label + " state2");
    }
  }
}

TEST(SparseRuleTest, RowUpdateMatchesTheFormulasInDouble) {
  Rng rng = SeededRng(kSeed + 3);
  for (int dim : {1, 16, 33}) {
    for (OptimizerConfig::Type type : kTypes) {
      const OptimizerConfig config = Config(type);
      const std::vector<std::vector<float>> grads = Gradients(rng, 5, dim);
      const std::vector<float> w0 = Normals(rng, dim);
      Arrays got = StartRow(config, dim, w0);
      RunSparseRow(config, grads, dim, &got);
      ExpectCloseToScale(
          got.w, SparseRowDoubleReference(config, grads, dim, w0), 1e-6,
          OptimizerConfig::Type_Name(type) + " dim " + std::to_string(dim));
    }
  }
}

// ------------------------------------------------- step constants

TEST(StepTest, AdamBiasCorrectionsAreComputedInDouble) {
  OptimizerConfig config = Config(OptimizerConfig::ADAM);
  config.set_learning_rate(0.003f);
  for (int64_t t :
       {int64_t{1}, int64_t{2}, int64_t{10}, int64_t{1000}, int64_t{100000}}) {
    const Adam::Step s = Adam::MakeStep(config, t);
    const double bc1 = 1.0 - std::pow(double{config.beta1()}, double(t));
    const double bc2 = 1.0 - std::pow(double{config.beta2()}, double(t));
    EXPECT_EQ(s.bias1, static_cast<float>(bc1)) << t;
    EXPECT_EQ(s.bias2, static_cast<float>(bc2)) << t;
    EXPECT_EQ(s.step_size, static_cast<float>(config.learning_rate() / bc1))
        << t;
    EXPECT_EQ(s.inv_sqrt_bias2, static_cast<float>(1.0 / std::sqrt(bc2))) << t;
    EXPECT_EQ(s.one_minus_beta1, 1.0f - config.beta1());
    EXPECT_EQ(s.one_minus_beta2, 1.0f - config.beta2());
  }
}

TEST(StepTest, MakeStepPicksEachTypesRule) {
  auto index = [](OptimizerConfig::Type type) {
    auto step = MakeStep(Config(type), 3);
    EXPECT_TRUE(step.ok()) << step.status();
    return step.ok() ? static_cast<int>(step->index()) : -1;
  };
  EXPECT_TRUE(std::holds_alternative<Sgd::Step>(
      *MakeStep(Config(OptimizerConfig::SGD), 1)));
  EXPECT_EQ(index(OptimizerConfig::ADAGRAD), 1);
  EXPECT_EQ(index(OptimizerConfig::ROWWISE_ADAGRAD), 1);
  EXPECT_EQ(index(OptimizerConfig::ADAM), 2);
  const auto adam = MakeStep(Config(OptimizerConfig::ADAM), 3);
  ASSERT_TRUE(adam.ok());
  EXPECT_EQ(std::get<Adam::Step>(*adam).bias1,
            Adam::MakeStep(Config(OptimizerConfig::ADAM), 3).bias1);
  OptimizerConfig bad;
  bad.set_type(static_cast<OptimizerConfig::Type>(42));
  EXPECT_EQ(MakeStep(bad, 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  // The layer-wise rules have no AnyStep (their constants are packed:
  // MakePackedStep).
  for (auto type : {OptimizerConfig::LAMB, OptimizerConfig::LARS}) {
    EXPECT_EQ(MakeStep(Config(type), 1).status().code(),
              absl::StatusCode::kInvalidArgument)
        << OptimizerConfig::Type_Name(type);
    EXPECT_FALSE(VisitElementWise(type, [](auto) {}));
  }
  for (OptimizerConfig::Type type : kTypes) {
    EXPECT_TRUE(VisitElementWise(type, [](auto) {}));
  }
}

// The packed constants of a layer-wise type are its rule's own MakeStep,
// the scheduled rate included.
TEST(StepTest, PackedLayerStepIsTheLayerWiseRules) {
  OptimizerConfig lamb = Config(OptimizerConfig::LAMB);
  lamb.set_weight_decay(0.01f);
  lamb.mutable_schedule()->set_warmup_steps(4);
  lamb.mutable_schedule()->set_warmup_start_factor(0.25f);
  auto l = MakePackedStep(lamb, 2);
  ASSERT_TRUE(l.ok()) << l.status();
  ASSERT_EQ(l->size, sizeof(Lamb::Step));
  Lamb::Step got_lamb;
  std::memcpy(&got_lamb, l->bytes.data(), sizeof(Lamb::Step));
  const Lamb::Step want = Lamb::MakeStep(lamb, 2);
  EXPECT_EQ(got_lamb.learning_rate, want.learning_rate);
  EXPECT_NE(want.learning_rate, lamb.learning_rate());
  EXPECT_EQ(got_lamb.bias2, want.bias2);
  EXPECT_EQ(got_lamb.weight_decay, 0.01f);

  OptimizerConfig lars = Config(OptimizerConfig::LARS);
  lars.set_momentum(0.9f);
  auto r = MakePackedStep(lars, 5);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->size, sizeof(Lars::Step));
  Lars::Step got_lars;
  std::memcpy(&got_lars, r->bytes.data(), sizeof(Lars::Step));
  EXPECT_EQ(got_lars.momentum, 0.9f);
  EXPECT_EQ(got_lars.trust_coefficient,
            Lars::MakeStep(lars, 5).trust_coefficient);
}

// MakePackedStep holds the bytes of the rule's own MakeStep for every type,
// element-wise and layer-wise, zero after them; the scheduled rate and the
// bias corrections change from step to step, and so do the bytes.
TEST(StepTest, PackedStepHoldsTheRulesStepBytes) {
  const auto* values = OptimizerConfig::Type_descriptor();
  for (int i = 0; i < values->value_count(); ++i) {
    const auto type =
        static_cast<OptimizerConfig::Type>(values->value(i)->number());
    SCOPED_TRACE(values->value(i)->name());
    OptimizerConfig config = Config(type);
    if (type == OptimizerConfig::LAMB || type == OptimizerConfig::LARS) {
      config.set_weight_decay(0.01f);
    }
    if (type == OptimizerConfig::LARS) config.set_momentum(0.9f);
    config.mutable_schedule()->set_warmup_steps(4);
    config.mutable_schedule()->set_warmup_start_factor(0.25f);
    ASSERT_TRUE(Validate(config, "opt").ok()) << Validate(config, "opt");
    std::vector<std::byte> previous;
    for (int64_t step = 1; step <= 3; ++step) {
      auto packed = MakePackedStep(config, step);
      ASSERT_TRUE(packed.ok()) << packed.status();
      Visit(type, [&](auto rule) {
        using Step = typename decltype(rule)::Step;
        const Step want = decltype(rule)::MakeStep(config, step);
        ASSERT_EQ(packed->size, sizeof(Step));
        EXPECT_EQ(std::memcmp(packed->bytes.data(), &want, sizeof(Step)), 0)
            << "step " << step;
        Step got;
        std::memcpy(&got, packed->bytes.data(), sizeof(Step));
        EXPECT_EQ(got.learning_rate, want.learning_rate);
      });
      for (size_t b = packed->size; b < PackedStep::kMaxBytes; ++b) {
        EXPECT_EQ(packed->bytes[b], std::byte{0}) << "byte " << b;
      }
      const std::vector<std::byte> bytes(packed->bytes.begin(),
                                         packed->bytes.end());
      EXPECT_NE(bytes, previous) << "step " << step;
      previous = bytes;
    }
  }
  OptimizerConfig bad;
  bad.set_type(static_cast<OptimizerConfig::Type>(42));
  EXPECT_EQ(MakePackedStep(bad, 1).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// A new enum value without a rule fails here.
TEST(StepTest, EveryConfigTypeHasARule) {
  const auto* values = OptimizerConfig::Type_descriptor();
  for (int i = 0; i < values->value_count(); ++i) {
    const auto type =
        static_cast<OptimizerConfig::Type>(values->value(i)->number());
    EXPECT_TRUE(Visit(type, [](auto) {})) << values->value(i)->name();
    EXPECT_TRUE(Validate(Config(type), "opt").ok()) << values->value(i)->name();
  }
}

// ------------------------------------------------- learning-rate schedules

// A config of `type` with learning rate 0.5 and `schedule` (text format),
// normalised.
OptimizerConfig Scheduled(OptimizerConfig::Type type,
                          const std::string& schedule) {
  OptimizerConfig c;
  c.set_type(type);
  c.set_learning_rate(0.5f);
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(
      schedule, c.mutable_schedule()))
      << schedule;
  SetDefaults(&c);
  EXPECT_TRUE(Validate(c, "opt").ok()) << Validate(c, "opt");
  return c;
}

// The hand-computed values below are of the decimal factors; the config
// holds them as floats.
constexpr double kFloatConfig = 1e-7;

double Multiplier(const OptimizerConfig& c, int64_t step) {
  return LearningRateMultiplier(ScheduleOf(c), step);
}

TEST(ScheduleTest, ConstantIsExactlyOne) {
  const OptimizerConfig c = Config(OptimizerConfig::ADAM);
  for (int64_t t : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{1} << 40}) {
    EXPECT_EQ(Multiplier(c, t), 1.0) << t;
    // The rate in the step constants is the configured float, bit for bit.
    EXPECT_EQ(Adam::MakeStep(c, t).learning_rate, c.learning_rate()) << t;
  }
}

TEST(ScheduleTest, LinearWarmupStartMiddleEnd) {
  const OptimizerConfig c = Scheduled(
      OptimizerConfig::SGD, "warmup_steps: 4 warmup_start_factor: 0.2");
  // 0.2 + 0.8 t / 4 for t < 4, then 1.
  EXPECT_NEAR(Multiplier(c, 0), 0.2, kFloatConfig);
  EXPECT_NEAR(Multiplier(c, 1), 0.4, kFloatConfig);
  EXPECT_NEAR(Multiplier(c, 2), 0.6, kFloatConfig);
  EXPECT_NEAR(Multiplier(c, 3), 0.8, kFloatConfig);
  EXPECT_EQ(Multiplier(c, 4), 1.0);
  EXPECT_EQ(Multiplier(c, 1000), 1.0);
  // The default start is 0: the first of 10 updates runs at a tenth.
  const OptimizerConfig zero =
      Scheduled(OptimizerConfig::SGD, "warmup_steps: 10");
  EXPECT_EQ(Multiplier(zero, 0), 0.0);
  EXPECT_NEAR(Multiplier(zero, 1), 0.1, kFloatConfig);
  EXPECT_NEAR(Multiplier(zero, 5), 0.5, kFloatConfig);
  EXPECT_EQ(Multiplier(zero, 10), 1.0);
}

TEST(ScheduleTest, PolynomialDecay) {
  const OptimizerConfig c = Scheduled(OptimizerConfig::SGD,
                                      "polynomial_decay { decay_start_step: 10 "
                                      "decay_steps: 20 end_factor: 0.1 }");
  EXPECT_EQ(c.schedule().polynomial_decay().power(), 2.0f);  // the default
  // 0.1 + 0.9 (1 - (t - 10) / 20)^2 on [10, 30].
  EXPECT_EQ(Multiplier(c, 1), 1.0);
  EXPECT_EQ(Multiplier(c, 10), 1.0);
  EXPECT_NEAR(Multiplier(c, 11), 0.1 + 0.9 * 0.95 * 0.95, kFloatConfig);
  EXPECT_NEAR(Multiplier(c, 15), 0.60625, kFloatConfig);
  EXPECT_NEAR(Multiplier(c, 20), 0.325, kFloatConfig);
  EXPECT_NEAR(Multiplier(c, 30), 0.1, kFloatConfig);
  EXPECT_NEAR(Multiplier(c, 1000), 0.1, kFloatConfig);
  const OptimizerConfig linear = Scheduled(
      OptimizerConfig::SGD, "polynomial_decay { decay_steps: 4 power: 1 }");
  EXPECT_NEAR(Multiplier(linear, 1), 0.75, kFloatConfig);
  EXPECT_NEAR(Multiplier(linear, 3), 0.25, kFloatConfig);
  EXPECT_EQ(Multiplier(linear, 4), 0.0);
}

TEST(ScheduleTest, StepDecay) {
  const OptimizerConfig c =
      Scheduled(OptimizerConfig::SGD,
                "step_decay { decay_start_step: 5 step_size: 10 gamma: 0.5 }");
  // (step, multiplier), exactly.
  for (const auto& [step, want] :
       std::vector<std::pair<int64_t, double>>{{1, 1.0},
                                               {5, 1.0},
                                               {14, 1.0},
                                               {15, 0.5},
                                               {24, 0.5},
                                               {25, 0.25},
                                               {105, std::pow(0.5, 10)}}) {
    EXPECT_EQ(Multiplier(c, step), want) << "step " << step;
  }
  const OptimizerConfig fallback =
      Scheduled(OptimizerConfig::SGD, "step_decay { step_size: 3 }");
  EXPECT_EQ(fallback.schedule().step_decay().gamma(), 0.1f);  // the default
  EXPECT_EQ(Multiplier(fallback, 2), 1.0);
  EXPECT_NEAR(Multiplier(fallback, 3), double{0.1f}, kFloatConfig);
}

// MLPerf DLRM v1's shape: warm-up, a plateau, then a quadratic decay to 0.
TEST(ScheduleTest, WarmupThenPolynomialDecay) {
  const OptimizerConfig c =
      Scheduled(OptimizerConfig::SGD,
                "warmup_steps: 10 polynomial_decay { decay_start_step: 20 "
                "decay_steps: 10 }");
  EXPECT_DOUBLE_EQ(Multiplier(c, 5), 0.5);
  EXPECT_EQ(Multiplier(c, 10), 1.0);
  EXPECT_EQ(Multiplier(c, 20), 1.0);
  EXPECT_DOUBLE_EQ(Multiplier(c, 25), 0.25);
  EXPECT_EQ(Multiplier(c, 30), 0.0);
  // Overlapping phases multiply: warm-up to 8, decay from 4 over 8.
  const OptimizerConfig overlap = Scheduled(
      OptimizerConfig::SGD,
      "warmup_steps: 8 polynomial_decay { decay_start_step: 4 decay_steps: 8 "
      "power: 1 }");
  EXPECT_DOUBLE_EQ(Multiplier(overlap, 6), 0.75 * 0.75);
}

// Every rule's step constants carry lr x multiplier, rounded once.
TEST(ScheduleTest, EveryRuleStepCarriesTheScheduledRate) {
  const OptimizerConfig::Type all[] = {OptimizerConfig::SGD,
                                       OptimizerConfig::ADAGRAD,
                                       OptimizerConfig::ROWWISE_ADAGRAD,
                                       OptimizerConfig::ADAM,
                                       OptimizerConfig::LAMB,
                                       OptimizerConfig::LARS};
  for (OptimizerConfig::Type type : all) {
    const OptimizerConfig c =
        Scheduled(type,
                  "warmup_steps: 3 warmup_start_factor: 0.1 step_decay { "
                  "decay_start_step: 4 step_size: 2 gamma: 0.3 }");
    for (int64_t t = 1; t <= 9; ++t) {
      const float want = static_cast<float>(0.5 * Multiplier(c, t));
      Visit(type, [&](auto rule) {
        EXPECT_EQ(decltype(rule)::MakeStep(c, t).learning_rate, want)
            << OptimizerConfig::Type_Name(type) << " step " << t;
      });
      if (auto step = MakeStep(c, t); step.ok()) {
        std::visit(
            [&](const auto& s) { EXPECT_EQ(s.learning_rate, want) << t; },
            *step);
      }
    }
    // Hand-computed: warm-up 0.1 + 0.9 t / 3, then 0.3^floor((t - 4) / 2).
    EXPECT_FLOAT_EQ(ScheduledLearningRate(c, 1), 0.5f * 0.4f);
    EXPECT_FLOAT_EQ(ScheduledLearningRate(c, 3), 0.5f);
    EXPECT_FLOAT_EQ(ScheduledLearningRate(c, 5), 0.5f);
    EXPECT_FLOAT_EQ(ScheduledLearningRate(c, 6), 0.5f * 0.3f);
    EXPECT_FLOAT_EQ(ScheduledLearningRate(c, 9), 0.5f * 0.09f);
  }
}

// ------------------------------------------------- layout

TEST(LayoutTest, StateSizesPerRowAndPerElement) {
  for (int dim : {1, 16, 33}) {
    EXPECT_EQ(SparseStateFloatsPerRow(Config(OptimizerConfig::SGD), dim), 0);
    EXPECT_EQ(SparseStateFloatsPerRow(Config(OptimizerConfig::ADAGRAD), dim),
              1);
    EXPECT_EQ(
        SparseStateFloatsPerRow(Config(OptimizerConfig::ROWWISE_ADAGRAD), dim),
        1);
    EXPECT_EQ(SparseStateFloatsPerRow(Config(OptimizerConfig::ADAM), dim),
              2 * dim);
  }
  EXPECT_EQ(DenseStateFloatsPerElement(Config(OptimizerConfig::SGD)), 0);
  EXPECT_EQ(DenseStateFloatsPerElement(Config(OptimizerConfig::ADAGRAD)), 1);
  EXPECT_EQ(
      DenseStateFloatsPerElement(Config(OptimizerConfig::ROWWISE_ADAGRAD)), 1);
  EXPECT_EQ(DenseStateFloatsPerElement(Config(OptimizerConfig::ADAM)), 2);

  EXPECT_FALSE(SparseStateSpansColumns(Config(OptimizerConfig::SGD)));
  EXPECT_TRUE(SparseStateSpansColumns(Config(OptimizerConfig::ADAGRAD)));
  EXPECT_TRUE(
      SparseStateSpansColumns(Config(OptimizerConfig::ROWWISE_ADAGRAD)));
  EXPECT_FALSE(SparseStateSpansColumns(Config(OptimizerConfig::ADAM)));

  // The layer-wise rules: dense state only.
  const OptimizerConfig lamb = Config(OptimizerConfig::LAMB);
  const OptimizerConfig lars = Config(OptimizerConfig::LARS);
  EXPECT_EQ(DenseStateFloatsPerElement(lamb), 2);
  EXPECT_EQ(DenseStateFloatsPerElement(lars), 1);
  EXPECT_TRUE(SparseState(lamb).empty());
  EXPECT_TRUE(SparseState(lars).empty());
  ASSERT_EQ(DenseState(lamb).size(), 2u);
  EXPECT_STREQ(DenseState(lamb)[0].name, "exp_avg");
  EXPECT_STREQ(DenseState(lamb)[1].name, "exp_avg_sq");
  ASSERT_EQ(DenseState(lars).size(), 1u);
  EXPECT_STREQ(DenseState(lars)[0].name, "momentum_buffer");
  EXPECT_EQ(InitialValue(DenseState(lars)[0], lars), 0.0f);

  OptimizerConfig unknown;
  unknown.set_type(static_cast<OptimizerConfig::Type>(42));
  EXPECT_TRUE(SparseState(unknown).empty());
  EXPECT_TRUE(DenseState(unknown).empty());
  EXPECT_EQ(SparseStateFloatsPerRow(unknown, 8), 0);
}

TEST(LayoutTest, NamesAndInitialValues) {
  const OptimizerConfig adagrad = Config(OptimizerConfig::ADAGRAD);
  ASSERT_EQ(DenseState(adagrad).size(), 1u);
  EXPECT_STREQ(DenseState(adagrad)[0].name, "sum");
  EXPECT_EQ(InitialValue(DenseState(adagrad)[0], adagrad), 0.1f);
  const OptimizerConfig adam = Config(OptimizerConfig::ADAM);
  ASSERT_EQ(DenseState(adam).size(), 2u);
  EXPECT_STREQ(DenseState(adam)[0].name, "exp_avg");
  EXPECT_STREQ(DenseState(adam)[1].name, "exp_avg_sq");
  EXPECT_EQ(InitialValue(DenseState(adam)[1], adam), 0.0f);
  ASSERT_EQ(SparseState(adam).size(), 2u);
  EXPECT_STREQ(SparseState(adam)[0].name, "momentum1");
  EXPECT_STREQ(SparseState(adam)[1].name, "momentum2");

  // A fresh row's state record: the arrays' initial values in order.
  std::vector<float> record(5, -1.0f);
  InitialSparseState(adagrad, 4, record.data());
  EXPECT_EQ(record, (std::vector<float>{0.1f, -1, -1, -1, -1}));
  record.assign(9, -1.0f);
  InitialSparseState(adam, 4, record.data());
  EXPECT_EQ(record, (std::vector<float>{0, 0, 0, 0, 0, 0, 0, 0, -1}));
}

// ------------------------------------------------- defaults and validation

TEST(DefaultsTest, FillOnlyWhatIsZero) {
  EXPECT_EQ(Config(OptimizerConfig::SGD).learning_rate(), 0.1f);
  EXPECT_EQ(Config(OptimizerConfig::ADAGRAD).learning_rate(), 0.01f);
  EXPECT_EQ(Config(OptimizerConfig::ROWWISE_ADAGRAD).learning_rate(), 0.01f);
  const OptimizerConfig adam = Config(OptimizerConfig::ADAM);
  EXPECT_EQ(adam.learning_rate(), 0.001f);
  EXPECT_EQ(adam.eps(), 1e-8f);
  EXPECT_EQ(adam.beta1(), 0.9f);
  EXPECT_EQ(adam.beta2(), 0.999f);
  OptimizerConfig set;
  set.set_type(OptimizerConfig::ADAM);
  set.set_learning_rate(0.5f);
  set.set_eps(1e-3f);
  set.set_beta1(0.5f);
  set.set_beta2(0.25f);
  OptimizerConfig kept = set;
  SetDefaults(&kept);
  EXPECT_EQ(kept.SerializeAsString(), set.SerializeAsString());

  EXPECT_EQ(Config(OptimizerConfig::LAMB).learning_rate(), 0.001f);
  const OptimizerConfig lars = Config(OptimizerConfig::LARS);
  EXPECT_EQ(lars.learning_rate(), 0.1f);
  EXPECT_EQ(lars.trust_coefficient(), 0.001f);
  EXPECT_EQ(lars.momentum(), 0.0f);
  EXPECT_EQ(lars.weight_decay(), 0.0f);
  // Only LARS has a trust coefficient, and no config gains a schedule.
  EXPECT_EQ(Config(OptimizerConfig::LAMB).trust_coefficient(), 0.0f);
  EXPECT_FALSE(Config(OptimizerConfig::SGD).has_schedule());
  OptimizerConfig decays;
  decays.mutable_schedule()->mutable_polynomial_decay()->set_decay_steps(5);
  SetDefaults(&decays);
  EXPECT_EQ(decays.schedule().polynomial_decay().power(), 2.0f);
  EXPECT_EQ(decays.schedule().polynomial_decay().end_factor(), 0.0f);
  decays.mutable_schedule()->mutable_step_decay()->set_step_size(5);
  SetDefaults(&decays);
  EXPECT_EQ(decays.schedule().step_decay().gamma(), 0.1f);
  decays.mutable_schedule()->mutable_step_decay()->set_gamma(0.5f);
  SetDefaults(&decays);
  EXPECT_EQ(decays.schedule().step_decay().gamma(), 0.5f);
}

TEST(ValidateTest, NamesTheFieldWithInvalidArgument) {
  struct Case {
    const char* member;
    void (*spoil)(OptimizerConfig*);
  };
  const Case cases[] = {
      {"type",
       [](OptimizerConfig* c) {
         c->set_type(static_cast<OptimizerConfig::Type>(42));
       }},
      {"learning_rate", [](OptimizerConfig* c) { c->set_learning_rate(0); }},
      {"learning_rate", [](OptimizerConfig* c) { c->set_learning_rate(-1); }},
      {"learning_rate",
       [](OptimizerConfig* c) { c->set_learning_rate(std::nanf("")); }},
      {"learning_rate",
       [](OptimizerConfig* c) { c->set_learning_rate(INFINITY); }},
      {"eps", [](OptimizerConfig* c) { c->set_eps(0); }},
      {"eps", [](OptimizerConfig* c) { c->set_eps(std::nanf("")); }},
      {"beta1", [](OptimizerConfig* c) { c->set_beta1(1.0f); }},
      {"beta1", [](OptimizerConfig* c) { c->set_beta1(-0.1f); }},
      {"beta2", [](OptimizerConfig* c) { c->set_beta2(std::nanf("")); }},
      {"initial_accumulator",
       [](OptimizerConfig* c) { c->set_initial_accumulator(-1); }},
      {"initial_accumulator",
       [](OptimizerConfig* c) { c->set_initial_accumulator(INFINITY); }},
  };
  for (OptimizerConfig::Type type : kTypes) {
    EXPECT_TRUE(Validate(Config(type), "sparse_optimizer").ok());
    for (const Case& c : cases) {
      OptimizerConfig config = Config(type);
      c.spoil(&config);
      const absl::Status status = Validate(config, "sparse_optimizer");
      EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument)
          << c.member << " " << status;
      const std::string want = std::string("sparse_optimizer.") + c.member;
      EXPECT_EQ(status.message().substr(0, want.size()), want) << status;
    }
  }
}

// The schedule's and the layer-wise rules' fields: each bad value is
// InvalidArgument naming the field in full.
TEST(ValidateTest, NamesScheduleAndLayerWiseFields) {
  struct Case {
    OptimizerConfig::Type type;
    const char* text;  // OptimizerConfig fields, text format
    const char* member;
  };
  const Case cases[] = {
      {OptimizerConfig::SGD, "schedule { warmup_steps: -1 }",
       "schedule.warmup_steps"},
      {OptimizerConfig::SGD,
       "schedule { warmup_steps: 3 warmup_start_factor: 1.5 }",
       "schedule.warmup_start_factor"},
      {OptimizerConfig::ADAM, "schedule { warmup_start_factor: nan }",
       "schedule.warmup_start_factor"},
      {OptimizerConfig::SGD, "schedule { polynomial_decay { } }",
       "schedule.polynomial_decay.decay_steps"},
      {OptimizerConfig::SGD,
       "schedule { polynomial_decay { decay_steps: 5 decay_start_step: -2 } }",
       "schedule.polynomial_decay.decay_start_step"},
      {OptimizerConfig::SGD,
       "schedule { polynomial_decay { decay_steps: 5 power: -1 } }",
       "schedule.polynomial_decay.power"},
      {OptimizerConfig::SGD,
       "schedule { polynomial_decay { decay_steps: 5 power: inf } }",
       "schedule.polynomial_decay.power"},
      {OptimizerConfig::SGD,
       "schedule { polynomial_decay { decay_steps: 5 end_factor: 2 } }",
       "schedule.polynomial_decay.end_factor"},
      {OptimizerConfig::ADAGRAD, "schedule { step_decay { } }",
       "schedule.step_decay.step_size"},
      {OptimizerConfig::ADAGRAD,
       "schedule { step_decay { step_size: 4 gamma: 1.5 } }",
       "schedule.step_decay.gamma"},
      {OptimizerConfig::ADAGRAD,
       "schedule { step_decay { step_size: 4 gamma: -0.5 } }",
       "schedule.step_decay.gamma"},
      {OptimizerConfig::ADAGRAD,
       "schedule { step_decay { step_size: 4 decay_start_step: -1 } }",
       "schedule.step_decay.decay_start_step"},
      {OptimizerConfig::LAMB, "weight_decay: -0.1", "weight_decay"},
      {OptimizerConfig::LARS, "weight_decay: nan", "weight_decay"},
      {OptimizerConfig::LARS, "momentum: 1", "momentum"},
      {OptimizerConfig::LARS, "momentum: -0.5", "momentum"},
      {OptimizerConfig::LARS, "trust_coefficient: -0.01", "trust_coefficient"},
      {OptimizerConfig::LARS, "trust_coefficient: inf", "trust_coefficient"},
      // Fields the type does not use.
      {OptimizerConfig::ADAM, "weight_decay: 0.01", "weight_decay"},
      {OptimizerConfig::SGD, "momentum: 0.9", "momentum"},
      {OptimizerConfig::LAMB, "momentum: 0.9", "momentum"},
      {OptimizerConfig::LAMB, "trust_coefficient: 0.01", "trust_coefficient"},
  };
  for (const Case& c : cases) {
    OptimizerConfig config;
    ASSERT_TRUE(google::protobuf::TextFormat::ParseFromString(c.text, &config))
        << c.text;
    config.set_type(c.type);
    SetDefaults(&config);
    const absl::Status status = Validate(config, "dense_optimizer");
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument)
        << c.text << ": " << status;
    const std::string want = std::string("dense_optimizer.") + c.member;
    EXPECT_EQ(status.message().substr(0, want.size()), want)
        << c.text << ": " << status;
  }
  // What the cases spoil is valid as the types' own fields.
  for (const char* text :
       {"type: LAMB weight_decay: 0.01",
        "type: LARS weight_decay: 0.0005 momentum: 0.9 trust_coefficient: 0.02",
        "schedule { warmup_steps: 3 warmup_start_factor: 1 polynomial_decay { "
        "decay_steps: 1 end_factor: 1 } }",
        "schedule { step_decay { step_size: 1 gamma: 1 } }"}) {
    OptimizerConfig config;
    ASSERT_TRUE(google::protobuf::TextFormat::ParseFromString(text, &config));
    SetDefaults(&config);
    EXPECT_TRUE(Validate(config, "dense_optimizer").ok())
        << text << ": " << Validate(config, "dense_optimizer");
  }
}

// The embedding tables refuse the layer-wise types, naming the field.
TEST(ValidateTest, SparseRefusesLayerWiseTypes) {
  for (OptimizerConfig::Type type : kTypes) {
    EXPECT_TRUE(ValidateSparse(Config(type), "sparse_optimizer").ok());
  }
  for (auto type : {OptimizerConfig::LAMB, OptimizerConfig::LARS}) {
    const OptimizerConfig config = Config(type);
    EXPECT_TRUE(Validate(config, "dense_optimizer").ok());
    const absl::Status status = ValidateSparse(config, "sparse_optimizer");
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_EQ(status.message().substr(0, 22), "sparse_optimizer.type ")
        << status;
    EXPECT_HAS_SUBSTR(status.message(), OptimizerConfig::Type_Name(type))
        << status;
  }
  // The common checks run first.
  OptimizerConfig bad = Config(OptimizerConfig::ADAM);
  bad.set_eps(-1);
  EXPECT_EQ(ValidateSparse(bad, "sparse_optimizer").message().substr(0, 20),
            "sparse_optimizer.eps");
}

}  // namespace
}  // namespace dlrm::optim
