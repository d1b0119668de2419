// Tests for embedding/: initial values, the optimized pooled lookup and the
// fused sparse optimizers against their plain references.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <set>
#include <span>
#include <vector>

#include "core/config.h"
#include "core/random.h"
#include "embedding/embedding_table.h"
#include "embedding/sharding.h"
#include "optim/optimizer.h"

namespace dlrm::embedding {
namespace {

constexpr uint64_t kSeed = 20261122;

OptimizerConfig MakeOptimizer(OptimizerConfig::Type type) {
  OptimizerConfig o;
  o.set_type(type);
  switch (type) {
    case OptimizerConfig::SGD:
      o.set_learning_rate(0.1f);
      break;
    case OptimizerConfig::ADAGRAD:
    case OptimizerConfig::ROWWISE_ADAGRAD:
      o.set_learning_rate(0.05f);
      o.set_initial_accumulator(0.1f);
      break;
    default:
      o.set_learning_rate(0.01f);
      break;
  }
  o.set_eps(1e-8f);
  o.set_beta1(0.9f);
  o.set_beta2(0.999f);
  return o;
}

struct BatchShape {
  int64_t bags = 0;
  // Bags hold 0..max_hot ids; about one in eight is empty when max_hot > 1.
  int max_hot = 1;
  // Ids are drawn from [0, id_range) (capped at rows), skewed to small ids so
  // duplicates are common, and the largest id rows - 1 always occurs.
  int64_t id_range = 0;
};

data::SparseFeature RandomIds(Rng& rng, int64_t rows, const BatchShape& shape) {
  data::SparseFeature f;
  f.offsets.push_back(0);
  const int64_t range =
      std::min(rows, shape.id_range > 0 ? shape.id_range : rows);
  for (int64_t s = 0; s < shape.bags; ++s) {
    int64_t n = 1;
    if (shape.max_hot > 1) {
      n = rng.Below(8) == 0 ? 0 : 1 + rng.Below(shape.max_hot);
    }
    for (int64_t i = 0; i < n; ++i) {
      // Square of a uniform: a Zipf-ish skew towards small ids.
      const double u = rng.Uniform();
      f.ids.push_back(std::min<int64_t>(range - 1, u * u * range));
    }
    f.offsets.push_back(static_cast<int64_t>(f.ids.size()));
  }
  if (!f.ids.empty()) f.ids[rng.Below(f.ids.size())] = rows - 1;
  return f;
}

std::vector<float> RandomGrad(Rng& rng, int64_t bags, int64_t stride) {
  std::vector<float> g(std::max<int64_t>(1, bags * stride));
  for (float& x : g) x = static_cast<float>(rng.Normal());
  return g;
}

// |a - b| <= rel * max(|a|, |b|) + abs, elementwise.
void ExpectClose(const float* a, const float* b, int64_t n, double rel,
                 double abs, const std::string& what) {
  int failures = 0;
  for (int64_t i = 0; i < n && failures < 5; ++i) {
    const double tol = rel * std::max(std::fabs(a[i]), std::fabs(b[i])) + abs;
    if (!(std::fabs(double{a[i]} - b[i]) <= tol)) {
      ADD_FAILURE() << what << "[" << i << "]: " << a[i] << " vs " << b[i];
      ++failures;
    }
  }
}

// a[i] and b[i] have the same bits for every i < n.
void ExpectBitwise(const float* a, const float* b, int64_t n,
                   const std::string& what) {
  int failures = 0;
  for (int64_t i = 0; i < n && failures < 5; ++i) {
    if (std::memcmp(a + i, b + i, sizeof(float)) != 0) {
      ADD_FAILURE() << what << "[" << i << "]: " << a[i] << " vs " << b[i];
      ++failures;
    }
  }
}

TEST(InitialValueTest, InRangeDeterministicAndSpread) {
  for (int64_t rows : {int64_t{1}, int64_t{2}, int64_t{1000}, int64_t{100000},
                       int64_t{34000000}}) {
    const double bound = 1.0 / std::sqrt(static_cast<double>(rows));
    double sum = 0, sum_sq = 0;
    std::set<float> distinct;
    const int64_t samples = std::min<int64_t>(rows, 2000);
    for (int64_t i = 0; i < samples; ++i) {
      const int64_t row = rows - 1 - i * (rows / samples);
      for (int col = 0; col < 8; ++col) {
        const float v = InitialValue(kSeed, 3, rows, row, col);
        // The float bound may round half an ulp beyond the exact one.
        EXPECT_GE(v, -bound * (1 + 1e-7)) << rows << " " << row << " " << col;
        EXPECT_LT(v, bound) << rows << " " << row << " " << col;
        EXPECT_EQ(v, InitialValue(kSeed, 3, rows, row, col));
        sum += v;
        sum_sq += double{v} * v;
        distinct.insert(v);
      }
    }
    const double n = samples * 8.0;
    if (n >= 8000) {
      EXPECT_NEAR(sum / n / bound, 0.0, 0.05) << rows;
      // Uniform on [-b, b): variance b^2 / 3.
      EXPECT_NEAR(sum_sq / n / (bound * bound), 1.0 / 3, 0.03) << rows;
      EXPECT_GT(distinct.size(), n * 0.99) << rows;
    }
  }
  int differ_table = 0, differ_row = 0, differ_col = 0, differ_seed = 0;
  for (int i = 0; i < 100; ++i) {
    const float v = InitialValue(kSeed, 0, 1000, i, 0);
    differ_table += v != InitialValue(kSeed, 1, 1000, i, 0);
    differ_row += v != InitialValue(kSeed, 0, 1000, i + 1, 0);
    differ_col += v != InitialValue(kSeed, 0, 1000, i, 1);
    differ_seed += v != InitialValue(kSeed + 1, 0, 1000, i, 0);
  }
  EXPECT_EQ(differ_table, 100);
  EXPECT_EQ(differ_row, 100);
  EXPECT_EQ(differ_col, 100);
  EXPECT_EQ(differ_seed, 100);
}

TEST(EmbeddingTableTest, ConstructorInitialisesWeightsAndState) {
  // 300000 x 16 takes the parallel path, 37 x 5 the serial one.
  for (auto [rows, dim] : {std::pair<int64_t, int>{37, 5}, {300000, 16}}) {
    for (auto type :
         {OptimizerConfig::SGD, OptimizerConfig::ADAGRAD,
          OptimizerConfig::ROWWISE_ADAGRAD, OptimizerConfig::ADAM}) {
      const OptimizerConfig opt = MakeOptimizer(type);
      EmbeddingTable t(4, rows, dim, POOLING_SUM, opt, kSeed);
      EXPECT_EQ(t.rows(), rows);
      EXPECT_EQ(t.dim(), dim);
      EXPECT_EQ(t.table_index(), 4);
      EXPECT_EQ(t.step(), 0);
      int mismatches = 0;
      for (int64_t r = 0; r < rows; ++r) {
        for (int c = 0; c < dim; ++c) {
          mismatches +=
              t.weights()[r * dim + c] != InitialValue(kSeed, 4, rows, r, c);
        }
      }
      EXPECT_EQ(mismatches, 0) << rows << "x" << dim << " " << type;
      switch (type) {
        case OptimizerConfig::SGD:
          EXPECT_TRUE(t.state1().empty());
          EXPECT_TRUE(t.state2().empty());
          break;
        case OptimizerConfig::ADAGRAD:
        case OptimizerConfig::ROWWISE_ADAGRAD:
          ASSERT_EQ(t.state1().size(), static_cast<size_t>(rows));
          EXPECT_TRUE(t.state2().empty());
          EXPECT_EQ(std::count(t.state1().begin(), t.state1().end(), 0.1f),
                    rows);
          break;
        default:
          ASSERT_EQ(t.state1().size(), static_cast<size_t>(rows * dim));
          ASSERT_EQ(t.state2().size(), static_cast<size_t>(rows * dim));
          EXPECT_EQ(std::count(t.state1().begin(), t.state1().end(), 0.0f),
                    rows * dim);
          EXPECT_EQ(std::count(t.state2().begin(), t.state2().end(), 0.0f),
                    rows * dim);
          break;
      }
    }
  }
}

// Runs Forward on `ids` with rows of `out_stride` floats, checks it against
// reference::PoolForward and that the padding past dim is untouched.
void CheckForward(const EmbeddingTable& t, const data::SparseFeature& ids,
                  int64_t out_stride, const std::string& label) {
  const int dim = t.dim();
  const int64_t bags = ids.num_bags();
  constexpr float kSentinel = 12345.0f;
  std::vector<float> got(std::max<int64_t>(1, bags * out_stride), kSentinel);
  std::vector<float> want(got.size(), kSentinel);
  t.Forward(ids, got.data(), out_stride);
  reference::PoolForward(t.weights(), dim, t.pooling(), ids, want.data(),
                         out_stride);
  if (t.pooling() == POOLING_SUM) {
    int mismatches = 0;
    for (size_t i = 0; i < got.size(); ++i) mismatches += got[i] != want[i];
    EXPECT_EQ(mismatches, 0) << label;
  } else {
    ExpectClose(got.data(), want.data(), got.size(), 1e-6, 0, label);
  }
  for (int64_t s = 0; s < bags; ++s) {
    for (int64_t c = dim; c < out_stride; ++c) {
      ASSERT_EQ(got[s * out_stride + c], kSentinel) << label;
    }
  }
}

TEST(EmbeddingTableTest, ForwardMatchesReference) {
  std::printf("seed %llu\n", static_cast<unsigned long long>(kSeed));
  Rng rng(kSeed);
  const OptimizerConfig sgd = MakeOptimizer(OptimizerConfig::SGD);
  for (int dim : {4, 8, 16, 17, 24, 64, 72, 128}) {
    for (Pooling pooling : {POOLING_SUM, POOLING_MEAN}) {
      EmbeddingTable t(1, 1000, dim, pooling, sgd, kSeed);
      for (int64_t bags : {0, 1, 2, 9, 300}) {
        for (int max_hot : {1, 5}) {
          for (int64_t pad : {0, 3}) {
            const data::SparseFeature ids =
                RandomIds(rng, t.rows(), {bags, max_hot, 50});
            CheckForward(t, ids, dim + pad,
                         "dim " + std::to_string(dim) + " pooling " +
                             std::to_string(pooling) + " bags " +
                             std::to_string(bags) + " hot " +
                             std::to_string(max_hot) + " pad " +
                             std::to_string(pad));
          }
        }
      }
    }
  }
}

TEST(EmbeddingTableTest, ForwardHandlesEdgeBags) {
  const OptimizerConfig sgd = MakeOptimizer(OptimizerConfig::SGD);
  for (Pooling pooling : {POOLING_SUM, POOLING_MEAN}) {
    EmbeddingTable t(0, 10, 16, pooling, sgd, kSeed);
    // Offsets missing altogether is a batch of 0 too.
    data::SparseFeature none;
    t.Forward(none, nullptr, 16);
    // An empty bag, a bag with one id twice, the largest id.
    data::SparseFeature ids{{0, 0, 2, 3}, {7, 7, 9}};
    std::vector<float> out(3 * 16, -1.0f);
    t.Forward(ids, out.data(), 16);
    for (int c = 0; c < 16; ++c) {
      EXPECT_EQ(out[c], 0.0f);
      const float w7 = t.weights()[7 * 16 + c];
      EXPECT_FLOAT_EQ(out[16 + c], pooling == POOLING_SUM ? 2 * w7 : w7);
      EXPECT_EQ(out[32 + c], t.weights()[9 * 16 + c]);
    }
  }
}

TEST(EmbeddingTableTest, ForwardParallelAndNestedMatchReference) {
  Rng rng(kSeed + 1);
  const OptimizerConfig sgd = MakeOptimizer(OptimizerConfig::SGD);
  std::vector<EmbeddingTable> tables;
  std::vector<data::SparseFeature> ids;
  for (int i = 0; i < 4; ++i) {
    tables.emplace_back(i, 50000, i % 2 ? 16 : 20,
                        i < 2 ? POOLING_SUM : POOLING_MEAN, sgd, kSeed);
    ids.push_back(RandomIds(rng, 50000, {20000, 4, 0}));
  }
  // Big enough for Forward's own parallel loop.
  for (int i = 0; i < 4; ++i)
    CheckForward(tables[i], ids[i], tables[i].dim(), "big");
  // Called from inside a parallel loop over tables, as the model does.
  std::vector<std::vector<float>> got(4);
#pragma omp parallel for
  for (int i = 0; i < 4; ++i) {
    got[i].resize(ids[i].num_bags() * tables[i].dim());
    tables[i].Forward(ids[i], got[i].data(), tables[i].dim());
  }
  for (int i = 0; i < 4; ++i) {
    std::vector<float> want(got[i].size());
    reference::PoolForward(tables[i].weights(), tables[i].dim(),
                           tables[i].pooling(), ids[i], want.data(),
                           tables[i].dim());
    ExpectClose(got[i].data(), want.data(), want.size(), 1e-6, 0, "nested");
  }
}

// Plain copies of a table's weights and state, updated by the reference.
struct ReferenceState {
  std::vector<float> weights, state1, state2;
  explicit ReferenceState(EmbeddingTable& t)
      : weights(t.weights(), t.weights() + t.rows() * t.dim()),
        state1(t.state1().begin(), t.state1().end()),
        state2(t.state2().begin(), t.state2().end()) {}
};

// The rule's update (optim::UpdateSparseRow) compiled here, on each touched
// row's gradient summed in bag order: the table must give these bits, so
// its library is built without FMA contraction as this file is (optim_test
// checks the rule itself against per-operation rounding).
void RuleUpdateInTest(ReferenceState* s, int dim, Pooling pooling,
                      const OptimizerConfig& opt, int64_t step,
                      const data::SparseFeature& ids, const float* grad,
                      int64_t grad_stride) {
  std::map<int64_t, std::vector<float>> rows;  // Touched rows' gradients.
  for (int64_t b = 0; b < ids.num_bags(); ++b) {
    const float scale = pooling == POOLING_MEAN
                            ? 1.0f / static_cast<float>(ids.bag_size(b))
                            : 1.0f;
    for (int64_t p = ids.offsets[b]; p < ids.offsets[b + 1]; ++p) {
      std::vector<float>& g = rows[ids.ids[p]];
      g.resize(dim, 0.0f);
      for (int c = 0; c < dim; ++c) g[c] += grad[b * grad_stride + c] * scale;
    }
  }
  int64_t floats[2] = {0, 0};
  const std::span<const optim::StateArray> arrays = optim::SparseState(opt);
  for (size_t k = 0; k < arrays.size(); ++k) {
    floats[k] = optim::FloatsPerRow(arrays[k], dim);
  }
  optim::VisitElementWise(opt.type(), [&](auto rule) {
    using Rule = decltype(rule);
    for (const auto& [r, g] : rows) {
      optim::UpdateSparseRow<Rule>(
          Rule::MakeStep(opt, step), g.data(), dim, s->weights.data() + r * dim,
          s->state1.data() + r * floats[0], s->state2.data() + r * floats[1]);
    }
  });
}

void CheckBackward(OptimizerConfig::Type type, Pooling pooling, int dim,
                   int64_t rows, const BatchShape& shape, int steps,
                   uint64_t seed) {
  const std::string label =
      "opt " + std::to_string(type) + " pooling " + std::to_string(pooling) +
      " dim " + std::to_string(dim) + " bags " + std::to_string(shape.bags);
  Rng rng(seed);
  const OptimizerConfig opt = MakeOptimizer(type);
  EmbeddingTable t(2, rows, dim, pooling, opt, seed);
  ReferenceState ref(t), here(t);
  const std::vector<float> initial = ref.weights;
  std::vector<bool> ever_touched(rows, false);
  for (int step = 1; step <= steps; ++step) {
    const data::SparseFeature ids = RandomIds(rng, rows, shape);
    const int64_t stride = dim + 2;
    const std::vector<float> grad = RandomGrad(rng, ids.num_bags(), stride);
    std::vector<bool> touched(rows, false);
    for (int64_t id : ids.ids) touched[id] = ever_touched[id] = true;
    const std::vector<float> before(t.weights(), t.weights() + rows * dim);

    t.BackwardUpdate(ids, grad.data(), stride);
    reference::DenseGradientUpdate(ref.weights.data(), ref.state1.data(),
                                   ref.state2.data(), rows, dim, pooling, opt,
                                   step, ids, grad.data(), stride);
    RuleUpdateInTest(&here, dim, pooling, opt, step, ids, grad.data(), stride);
    ASSERT_EQ(t.step(), step);

    // Bitwise: the same accumulation order and the same rule, with no
    // multiply-add fused anywhere.
    for (const ReferenceState* want : {&ref, &here}) {
      const std::string what =
          label + (want == &ref ? " vs reference" : " vs rule here");
      ExpectBitwise(t.weights(), want->weights.data(), rows * dim,
                    what + " weights");
      ExpectBitwise(t.state1().data(), want->state1.data(), want->state1.size(),
                    what + " state1");
      ExpectBitwise(t.state2().data(), want->state2.data(), want->state2.size(),
                    what + " state2");
    }
    int changed_untouched = 0;
    for (int64_t r = 0; r < rows; ++r) {
      if (touched[r]) continue;
      changed_untouched +=
          std::memcmp(t.weights() + r * dim, before.data() + r * dim,
                      dim * sizeof(float)) != 0;
    }
    EXPECT_EQ(changed_untouched, 0) << label << " step " << step;
  }
  int changed_never_touched = 0;
  for (int64_t r = 0; r < rows; ++r) {
    if (ever_touched[r]) continue;
    changed_never_touched +=
        std::memcmp(t.weights() + r * dim, initial.data() + r * dim,
                    dim * sizeof(float)) != 0;
  }
  EXPECT_EQ(changed_never_touched, 0) << label;
}

TEST(EmbeddingTableTest, BackwardUpdateMatchesDenseReference) {
  std::printf("seed %llu\n", static_cast<unsigned long long>(kSeed));
  for (auto type : {OptimizerConfig::SGD, OptimizerConfig::ADAGRAD,
                    OptimizerConfig::ROWWISE_ADAGRAD, OptimizerConfig::ADAM}) {
    for (Pooling pooling : {POOLING_SUM, POOLING_MEAN}) {
      for (int dim : {4, 16, 17, 64}) {
        // Multi-hot with many duplicates; one id per bag; an empty batch.
        CheckBackward(type, pooling, dim, 500, {64, 6, 40}, 4, kSeed + dim);
        CheckBackward(type, pooling, dim, 500, {200, 1, 0}, 3, kSeed + 7);
        CheckBackward(type, pooling, dim, 500, {0, 1, 0}, 1, kSeed);
      }
      // Big enough for BackwardUpdate's own parallel loop.
      CheckBackward(type, pooling, 16, 20000, {8000, 3, 0}, 3, kSeed + 99);
    }
  }
}

TEST(EmbeddingTableTest, BackwardUpdateIsDeterministicAcrossThreadCounts) {
  std::printf("seed %llu\n", static_cast<unsigned long long>(kSeed));
  const int max_threads = omp_get_max_threads();
  for (auto type : {OptimizerConfig::SGD, OptimizerConfig::ROWWISE_ADAGRAD,
                    OptimizerConfig::ADAM}) {
    const OptimizerConfig opt = MakeOptimizer(type);
    EmbeddingTable a(0, 20000, 16, POOLING_MEAN, opt, kSeed);
    EmbeddingTable b(0, 20000, 16, POOLING_MEAN, opt, kSeed);
    Rng rng(kSeed);
    for (int step = 0; step < 3; ++step) {
      const data::SparseFeature ids = RandomIds(rng, 20000, {8000, 4, 300});
      const std::vector<float> grad = RandomGrad(rng, ids.num_bags(), 16);
      omp_set_num_threads(1);
      a.BackwardUpdate(ids, grad.data(), 16);
      omp_set_num_threads(std::max(2, max_threads));
      b.BackwardUpdate(ids, grad.data(), 16);
    }
    omp_set_num_threads(max_threads);
    EXPECT_EQ(std::memcmp(a.weights(), b.weights(), 20000 * 16 * 4), 0);
    EXPECT_TRUE(a.state1() == b.state1());
    EXPECT_TRUE(a.state2() == b.state2());
  }
}

TEST(EmbeddingTableTest, SgdStepFollowsFiniteDifferenceGradient) {
  // Loss L(w) = sum_s <pooled_s(w), g_s>; one SGD step must give
  // w - lr * dL/dw, with dL/dw from central differences (L is linear in w, so
  // a large step h keeps rounding error small).
  constexpr int64_t kRows = 40;
  constexpr int kDim = 4;
  Rng rng(kSeed + 5);
  const OptimizerConfig sgd = MakeOptimizer(OptimizerConfig::SGD);
  EmbeddingTable t(0, kRows, kDim, POOLING_SUM, sgd, kSeed);
  const data::SparseFeature ids = RandomIds(rng, kRows, {16, 4, 30});
  const std::vector<float> g = RandomGrad(rng, ids.num_bags(), kDim);
  auto loss = [&]() {
    std::vector<float> pooled(ids.num_bags() * kDim);
    t.Forward(ids, pooled.data(), kDim);
    double l = 0;
    for (size_t i = 0; i < pooled.size(); ++i) l += double{pooled[i]} * g[i];
    return l;
  };
  const std::vector<float> w0(t.weights(), t.weights() + kRows * kDim);
  std::vector<double> fd(kRows * kDim);
  constexpr float kH = 0.25f;
  for (int64_t i = 0; i < kRows * kDim; ++i) {
    t.weights()[i] = w0[i] + kH;
    const double plus = loss();
    t.weights()[i] = w0[i] - kH;
    const double minus = loss();
    t.weights()[i] = w0[i];
    fd[i] = (plus - minus) / (2.0 * kH);
  }
  t.BackwardUpdate(ids, g.data(), kDim);
  for (int64_t i = 0; i < kRows * kDim; ++i) {
    EXPECT_NEAR(t.weights()[i], w0[i] - sgd.learning_rate() * fd[i], 1e-5)
        << "element " << i;
  }
}

TEST(EmbeddingTableTest, OptimizerFormulasOnOneRow) {
  // One bag holding row 3 twice with gradient (1, -2): the row's gradient is
  // (2, -4) for sum pooling.
  const data::SparseFeature ids{{0, 2}, {3, 3}};
  const float grad[2] = {1.0f, -2.0f};
  {
    const OptimizerConfig opt = MakeOptimizer(OptimizerConfig::ROWWISE_ADAGRAD);
    EmbeddingTable t(0, 5, 2, POOLING_SUM, opt, kSeed);
    const float w0 = t.weights()[6], w1 = t.weights()[7];
    t.BackwardUpdate(ids, grad, 2);
    // s = 0.1 + (4 + 16) / 2 = 10.1.
    EXPECT_FLOAT_EQ(t.state1()[3], 10.1f);
    EXPECT_FLOAT_EQ(t.state1()[2], 0.1f);
    EXPECT_FLOAT_EQ(t.weights()[6], w0 - 0.05f * 2 / std::sqrt(10.1f));
    EXPECT_FLOAT_EQ(t.weights()[7], w1 + 0.05f * 4 / std::sqrt(10.1f));
  }
  {
    // Adam's first step moves each element by lr * sign(g) (bias-corrected
    // m / sqrt(v) is g / |g|); the second, with gradient 0, by
    // lr * m_hat / sqrt(v_hat) with both moments decayed once.
    const OptimizerConfig opt = MakeOptimizer(OptimizerConfig::ADAM);
    EmbeddingTable t(0, 5, 2, POOLING_MEAN, opt, kSeed);
    const float w0 = t.weights()[6], w1 = t.weights()[7];
    t.BackwardUpdate(ids, grad, 2);
    EXPECT_NEAR(t.weights()[6], w0 - 0.01f, 1e-7);
    EXPECT_NEAR(t.weights()[7], w1 + 0.01f, 1e-7);
    // Mean pooling: the row's gradient is (1, -2).
    // (1 - beta) in float is off by up to 1e-5 relative.
    EXPECT_NEAR(t.state1()[6], 0.1, 1e-7);
    EXPECT_NEAR(t.state2()[7], 0.001 * 4, 1e-7);
    const float zero[2] = {0.0f, 0.0f};
    const float after1 = t.weights()[6];
    t.BackwardUpdate(ids, zero, 2);
    EXPECT_EQ(t.step(), 2);
    const double m = 0.09 / (1 - 0.81), v = 0.000999 / (1 - 0.998001);
    EXPECT_NEAR(t.weights()[6], after1 - 0.01 * m / std::sqrt(v), 1e-7);
  }
}

// Update t runs at the schedule's rate for t, whatever set the step count
// (a restore sets it): SGD at 0.1 with a warm-up over 4 updates and the
// rate halved every 5 updates after update 10.
TEST(EmbeddingTableTest, LearningRateFollowsTheScheduleByStep) {
  OptimizerConfig opt = MakeOptimizer(OptimizerConfig::SGD);
  LearningRateSchedule* schedule = opt.mutable_schedule();
  schedule->set_warmup_steps(4);
  schedule->mutable_step_decay()->set_decay_start_step(10);
  schedule->mutable_step_decay()->set_step_size(5);
  schedule->mutable_step_decay()->set_gamma(0.5f);
  EmbeddingTable t(0, 5, 2, POOLING_SUM, opt, kSeed);
  // Row 3 twice with gradient (1, -2): the row's gradient is (2, -4).
  const data::SparseFeature ids{{0, 2}, {3, 3}};
  const float grad[2] = {1.0f, -2.0f};
  const struct {
    int64_t step;       // the update's own step number
    double multiplier;  // the schedule's, by hand
  } updates[] = {{1, 0.25}, {2, 0.5}, {4, 1.0}, {15, 0.5}, {20, 0.25}};
  for (const auto& u : updates) {
    t.set_step(u.step - 1);
    const float w0 = t.weights()[6], w1 = t.weights()[7];
    t.BackwardUpdate(ids, grad, 2);
    EXPECT_EQ(t.step(), u.step);
    EXPECT_FLOAT_EQ(t.weights()[6], w0 - 0.1 * u.multiplier * 2)
        << "update " << u.step;
    EXPECT_FLOAT_EQ(t.weights()[7], w1 + 0.1 * u.multiplier * 4)
        << "update " << u.step;
  }
}

TEST(EmbeddingTableTest, StepCountsEveryCall) {
  EmbeddingTable t(0, 5, 4, POOLING_SUM, MakeOptimizer(OptimizerConfig::ADAM),
                   kSeed);
  const std::vector<float> before(t.weights(), t.weights() + 20);
  data::SparseFeature empty{{0, 0, 0}, {}};
  t.BackwardUpdate(empty, nullptr, 4);
  t.BackwardUpdate(data::SparseFeature{}, nullptr, 4);
  EXPECT_EQ(t.step(), 2);
  EXPECT_EQ(std::memcmp(before.data(), t.weights(), 20 * sizeof(float)), 0);
  t.set_step(41);
  const float grad[4] = {1, 2, 3, 4};
  t.BackwardUpdate(data::SparseFeature{{0, 1}, {2}}, grad, 4);
  EXPECT_EQ(t.step(), 42);
}

TEST(EmbeddingTableTest, SliceHoldsTheSameValuesAsTheWholeTable) {
  const OptimizerConfig sgd = MakeOptimizer(OptimizerConfig::SGD);
  EmbeddingTable whole(3, 40, 8, POOLING_SUM, sgd, kSeed);
  EmbeddingTable slice(3, 10, 4, POOLING_SUM, sgd, kSeed,
                       TableSlice{40, /*row_begin=*/25, /*col_begin=*/4});
  for (int64_t r = 0; r < 10; ++r) {
    for (int c = 0; c < 4; ++c) {
      EXPECT_EQ(slice.weights()[r * 4 + c],
                whole.weights()[(25 + r) * 8 + 4 + c])
          << "row " << r << " col " << c;
    }
  }
}

ModelConfig ShardingConfig(const std::string& tables) {
  auto parsed = ParseModelConfigText(
      "num_dense_features: 2 embedding_dim: 8 bottom_mlp: [8] top_mlp: [1] " +
      tables);
  EXPECT_TRUE(parsed.ok()) << parsed.status();
  auto c = NormalizeModelConfig(*parsed);
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

int64_t BytesOn(const ShardingPlan& plan, const ModelConfig& c, int rank) {
  int64_t bytes = 0;
  for (const auto& t : plan.tables) {
    for (const Shard& s : t.shards) {
      if (s.rank == rank) bytes += ShardBytes(s, c.sparse_optimizer());
    }
  }
  return bytes;
}

TEST(ShardingTest, OneRankHoldsEverythingTableWise) {
  const ModelConfig c = ShardingConfig(
      "tables { name: 'a' rows: 100 } tables { name: 'b' rows: 5 }");
  auto plan = PlanSharding(c, PlannerOptions{});
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->tables.size(), 2u);
  for (const auto& t : plan->tables) {
    EXPECT_EQ(t.kind, SHARDING_TABLE_WISE);
    EXPECT_EQ(t.shards[0].rank, 0);
  }
  EXPECT_NE(plan->ToString(c).find("a (100 x 8): table-wise on rank 0"),
            std::string::npos)
      << plan->ToString(c);
}

// Tables in device memory take no host memory: the tier planner counts
// nothing for them, never moves them, and the plan shows their bytes
// apart. SGD, dim 8: 32 bytes a row.
TEST(ShardingTest, DeviceTablesTakeNoHostMemory) {
  const ModelConfig c = ShardingConfig(
      "device: DEVICE_CUDA tables { name: 'a' rows: 1000 } "
      "tables { name: 'g' rows: 4000 storage: STORAGE_DEVICE } "
      "tables { name: 'b' rows: 500 }");
  EXPECT_EQ(HostBytesOfTable(c, 0, c.rocksdb()), 32000);
  EXPECT_EQ(HostBytesOfTable(c, 1, c.rocksdb()), 0);
  const ShardingPlan plan = WholeTablesPlan(c);
  EXPECT_EQ(HostBytesPerRank(c, plan, c.rocksdb()),
            (std::vector<int64_t>{48000}));
  const std::string text = plan.ToString(c);
  EXPECT_NE(text.find("g (4000 x 8): table-wise on rank 0; in device memory"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("rank 0: 0.0 MiB in host memory, 0.1 MiB in device "
                      "memory"),
            std::string::npos)
      << text;

  TierPlanOptions options;
  options.rocksdb.set_path("/tmp/unused");
  options.rocksdb.set_cache_fraction(0.1);
  // Within budget with the device table's 128000 bytes left out.
  options.host_budget_bytes = 48000;
  auto same = PlanStorageTiers(c, options);
  ASSERT_TRUE(same.ok()) << same.status();
  EXPECT_EQ(same->tables(1).storage(), STORAGE_DEVICE);
  EXPECT_EQ(same->tables(0).storage(), STORAGE_HOST);
  // Over it: the largest host table moves, the device table stays.
  options.host_budget_bytes = 47999;
  auto moved = PlanStorageTiers(c, options);
  ASSERT_TRUE(moved.ok()) << moved.status();
  EXPECT_EQ(moved->tables(0).storage(), STORAGE_ROCKSDB);
  EXPECT_EQ(moved->tables(1).storage(), STORAGE_DEVICE);
  EXPECT_EQ(moved->tables(2).storage(), STORAGE_HOST);
}

TEST(ShardingTest, BalancesLookupsAndReplicatesSmallTables) {
  // Four big one-hot tables over two ranks: two each. A tiny one is
  // replicated.
  const ModelConfig c = ShardingConfig(
      "tables { name: 'a' rows: 10000 } tables { name: 'b' rows: 10000 } "
      "tables { name: 'c' rows: 10000 } tables { name: 'd' rows: 10000 } "
      "tables { name: 'tiny' rows: 10 }");
  PlannerOptions o;
  o.world_size = 2;
  auto plan = PlanSharding(c, o);
  ASSERT_TRUE(plan.ok()) << plan.status();
  int per_rank[2] = {0, 0};
  for (int k = 0; k < 4; ++k) {
    ASSERT_EQ(plan->tables[k].kind, SHARDING_TABLE_WISE);
    ++per_rank[plan->tables[k].shards[0].rank];
  }
  EXPECT_EQ(per_rank[0], 2);
  EXPECT_EQ(per_rank[1], 2);
  EXPECT_EQ(plan->tables[4].kind, SHARDING_DATA_PARALLEL);
  EXPECT_EQ(plan->tables[4].shards.size(), 2u);
}

TEST(ShardingTest, RespectsTheBudgetBySplittingColumnsThenRows) {
  // 1000 x 8 floats = 32000 bytes per table; a 20000-byte budget forces a
  // split. Two columns blocks of 4 (16000 bytes) fit on two ranks.
  const ModelConfig c = ShardingConfig("tables { name: 'big' rows: 1000 }");
  PlannerOptions o;
  o.world_size = 2;
  o.memory_budget_bytes = 20000;
  o.data_parallel_max_bytes = 0;
  auto plan = PlanSharding(c, o);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->tables[0].kind, SHARDING_COLUMN_WISE);
  for (int r = 0; r < 2; ++r) EXPECT_LE(BytesOn(*plan, c, r), 20000);

  // Row-wise Adagrad's per-row state spans the columns: split rows instead.
  ModelConfig adagrad = c;
  adagrad.mutable_sparse_optimizer()->set_type(
      OptimizerConfig::ROWWISE_ADAGRAD);
  auto by_rows = PlanSharding(adagrad, o);
  ASSERT_TRUE(by_rows.ok()) << by_rows.status();
  EXPECT_EQ(by_rows->tables[0].kind, SHARDING_ROW_WISE);
  for (int r = 0; r < 2; ++r) EXPECT_LE(BytesOn(*by_rows, adagrad, r), 20000);

  // A table of dim 4 cannot split its columns in two blocks of 4: rows.
  const ModelConfig narrow = ShardingConfig(
      "interaction: INTERACTION_CAT tables { name: 'n' rows: 2000 dim: 4 }");
  auto rows = PlanSharding(narrow, o);
  ASSERT_TRUE(rows.ok()) << rows.status();
  EXPECT_EQ(rows->tables[0].kind, SHARDING_ROW_WISE);
  EXPECT_EQ(rows->tables[0].shards[1].row_begin, 1000);
  for (int r = 0; r < 2; ++r) EXPECT_LE(BytesOn(*rows, narrow, r), 20000);
}

TEST(ShardingTest, RefusesAnImpossiblePlanNamingTheTable) {
  const ModelConfig c = ShardingConfig(
      "tables { name: 'huge' rows: 100000 } tables { name: 'ok' rows: 10 }");
  PlannerOptions o;
  o.world_size = 2;
  o.memory_budget_bytes = 100000;
  auto plan = PlanSharding(c, o);
  ASSERT_EQ(plan.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(plan.status().message().find("huge"), std::string::npos)
      << plan.status();
  EXPECT_NE(plan.status().message().find("100000 bytes"), std::string::npos)
      << plan.status();
}

TEST(ShardingTest, PinsAreHonouredAndBadPinsNamed) {
  const ModelConfig c = ShardingConfig(
      "tables { name: 'a' rows: 100 sharding: SHARDING_COLUMN_WISE "
      "shard_ranks: [2, 0] } "
      "tables { name: 'b' rows: 90 sharding: SHARDING_ROW_WISE } "
      "tables { name: 'c' rows: 80 sharding: SHARDING_TABLE_WISE "
      "shard_ranks: [1] }");
  PlannerOptions o;
  o.world_size = 3;
  auto plan = PlanSharding(c, o);
  ASSERT_TRUE(plan.ok()) << plan.status();
  const auto& a = plan->tables[0];
  EXPECT_EQ(a.kind, SHARDING_COLUMN_WISE);
  ASSERT_EQ(a.shards.size(), 2u);
  EXPECT_EQ(a.shards[0].rank, 2);
  EXPECT_EQ(a.shards[0].col_count, 4);
  EXPECT_EQ(a.shards[1].rank, 0);
  EXPECT_EQ(a.shards[1].col_begin, 4);
  const auto& b = plan->tables[1];
  EXPECT_EQ(b.kind, SHARDING_ROW_WISE);
  ASSERT_EQ(b.shards.size(), 3u);
  EXPECT_EQ(b.shards[2].row_begin + b.shards[2].row_count, 90);
  EXPECT_EQ(plan->tables[2].shards[0].rank, 1);

  const ModelConfig bad = ShardingConfig(
      "tables { name: 'x' rows: 10 sharding: SHARDING_TABLE_WISE "
      "shard_ranks: [5] }");
  auto refused = PlanSharding(bad, o);
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("tables[0] (x).shard_ranks"),
            std::string::npos)
      << refused.status();
}

TEST(ShardingTest, ValidateCatchesPlansThatDoNotTileTheTable) {
  const ModelConfig c = ShardingConfig("tables { name: 'a' rows: 100 }");
  ShardingPlan plan;
  plan.world_size = 2;
  TablePlacement p;
  p.kind = SHARDING_ROW_WISE;
  p.shards = {{0, 0, 50, 0, 8}, {1, 60, 40, 0, 8}};
  plan.tables = {p};
  absl::Status s = plan.Validate(c);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("table a"), std::string::npos) << s;
  plan.tables[0].shards[1].row_begin = 50;
  plan.tables[0].shards[1].row_count = 50;
  EXPECT_TRUE(plan.Validate(c).ok());
  plan.tables[0].shards[1].rank = 2;
  EXPECT_EQ(plan.Validate(c).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace dlrm::embedding
