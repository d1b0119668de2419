// Tests for embedding/: initial values, the optimized pooled lookup and the
// fused sparse optimizers against their plain references.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/config.h"
#include "core/random.h"
#include "embedding/dynamic_route.h"
#include "embedding/embedding_table.h"
#include "embedding/sharding.h"
#include "embedding/sparse_backward_host.h"
#include "embedding/sparse_chunks.h"
#include "optim/optimizer.h"
#include "tests/support/expect.h"
#include "tests/support/optimizer.h"

namespace dlrm::embedding {
namespace {

constexpr uint64_t kSeed = 20261122;

using test::MakeOptimizer;

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

// The rows r with !skip[r] whose `dim` weights differ, in bits, between
// `weights` and `before`.
int64_t ChangedRowsBut(const std::vector<bool>& skip, const float* weights,
                       const std::vector<float>& before, int dim) {
  int64_t changed = 0;
  for (size_t r = 0; r < skip.size(); ++r) {
    if (skip[r]) continue;
    changed += std::memcmp(weights + r * dim, before.data() + r * dim,
                           dim * sizeof(float)) != 0;
  }
  return changed;
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
    EXPECT_EQ(ChangedRowsBut(touched, t.weights(), before, dim), 0)
        << label << " step " << step;
  }
  EXPECT_EQ(ChangedRowsBut(ever_touched, t.weights(), initial, dim), 0)
      << label;
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

// A ShardingConfig on CUDA: host table 'a' of 1000 rows, then `tables`.
ModelConfig CudaShardingConfig(const std::string& tables) {
  return ShardingConfig("device: DEVICE_CUDA tables { name: 'a' rows: 1000 } " +
                        tables);
}

// Tier planner options: a host budget of `host_budget_bytes` and RocksDB
// at an unused path caching `cache_rows` rows (when > 0) or
// `cache_fraction` of each table (when > 0).
TierPlanOptions TiersOverRocksDb(int64_t host_budget_bytes, int64_t cache_rows,
                                 double cache_fraction) {
  TierPlanOptions options;
  options.rocksdb.set_path("/tmp/unused");
  if (cache_rows > 0) options.rocksdb.set_cache_rows(cache_rows);
  if (cache_fraction > 0) options.rocksdb.set_cache_fraction(cache_fraction);
  options.host_budget_bytes = host_budget_bytes;
  return options;
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
  EXPECT_HAS_SUBSTR(plan->ToString(c), "a (100 x 8): table-wise on rank 0")
      << plan->ToString(c);
}

// `c` with the ROWWISE_ADAGRAD sparse optimizer (its per-row state spans
// the columns, so the planner splits rows).
ModelConfig WithRowwiseAdagrad(ModelConfig c) {
  c.mutable_sparse_optimizer()->set_type(OptimizerConfig::ROWWISE_ADAGRAD);
  return c;
}

// `c`'s whole tables on one rank (WholeTablesPlan): the rank's host bytes
// are `host_bytes` and the plan's text holds each of `parts`.
void ExpectWholeTablesPlan(const ModelConfig& c, int64_t host_bytes,
                           const std::vector<std::string>& parts) {
  const ShardingPlan plan = WholeTablesPlan(c);
  EXPECT_EQ(HostBytesPerRank(c, plan, c.rocksdb()),
            (std::vector<int64_t>{host_bytes}));
  const std::string text = plan.ToString(c);
  for (const std::string& part : parts) {
    EXPECT_HAS_SUBSTR(text, part) << text;
  }
}

// Tables in device memory take no host memory: the tier planner counts
// nothing for them, never moves them, and the plan shows their bytes
// apart. SGD, dim 8: 32 bytes a row.
TEST(ShardingTest, DeviceTablesTakeNoHostMemory) {
  const ModelConfig c = CudaShardingConfig(
      "tables { name: 'g' rows: 4000 storage: STORAGE_DEVICE } "
      "tables { name: 'b' rows: 500 }");
  EXPECT_EQ(HostBytesOfTable(c, 0, c.rocksdb()), 32000);
  EXPECT_EQ(HostBytesOfTable(c, 1, c.rocksdb()), 0);
  ExpectWholeTablesPlan(
      c, 48000,
      {"g (4000 x 8): table-wise on rank 0; in device memory",
       "rank 0: 0.0 MiB in host memory, 0.1 MiB in device memory"});

  // Within budget with the device table's 128000 bytes left out.
  TierPlanOptions options = TiersOverRocksDb(48000, 0, /*cache_fraction=*/0.1);
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

// A device table with a cache keeps every row in host memory behind its
// device slots: the planner counts the whole table on the host, the plan
// its slots on the device.
TEST(ShardingTest, CachedDeviceTablesCountTheirHostRows) {
  const ModelConfig c = CudaShardingConfig(
      "tables { name: 'g' rows: 40000 storage: STORAGE_DEVICE "
      "device_cache_rows: 4000 }");
  EXPECT_EQ(HostBytesOfTable(c, 1, c.rocksdb()), 1280000);
  ExpectWholeTablesPlan(
      c, 1312000, {"rank 0: 1.3 MiB in host memory, 0.1 MiB in device memory"});
}

// The device budget, on 1 to 4 ranks: device tables of equal lookup cost
// spread so that every rank's device bytes (DeviceBytesPerRank) stay
// within ceil(tables / ranks) tables' worth, and the tier planner then
// moves nothing. SGD, dim 8: 32 bytes a row, 320000 bytes a table.
TEST(ShardingTest, DeviceBudgetSpreadsDeviceTablesOnOneToFourRanks) {
  const ModelConfig c = ShardingConfig(
      "device: DEVICE_CUDA "
      "tables { name: 'g0' rows: 10000 storage: STORAGE_DEVICE } "
      "tables { name: 'g1' rows: 10000 storage: STORAGE_DEVICE } "
      "tables { name: 'g2' rows: 10000 storage: STORAGE_DEVICE } "
      "tables { name: 'g3' rows: 10000 storage: STORAGE_DEVICE } "
      "tables { name: 'h' rows: 10000 }");
  for (int world = 1; world <= 4; ++world) {
    SCOPED_TRACE(absl::StrCat(world, " ranks"));
    PlannerOptions o;
    o.world_size = world;
    o.device_budget_bytes = (4 + world - 1) / world * int64_t{320000};
    auto plan = PlanSharding(c, o);
    ASSERT_TRUE(plan.ok()) << plan.status();
    const std::vector<int64_t> device = DeviceBytesPerRank(c, *plan);
    ASSERT_EQ(device.size(), static_cast<size_t>(world));
    int64_t total = 0;
    for (int r = 0; r < world; ++r) {
      EXPECT_LE(device[r], o.device_budget_bytes) << "rank " << r;
      total += device[r];
    }
    EXPECT_EQ(total, 4 * 320000);  // the host table counts nothing
    TierPlanOptions tiers;
    tiers.device_budget_bytes = o.device_budget_bytes;
    auto same = PlanStorageTiers(c, tiers, &*plan);
    ASSERT_TRUE(same.ok()) << same.status();
    EXPECT_EQ(same->SerializeAsString(), c.SerializeAsString());
  }
}

// A device table that fits no rank's device budget whole is split where a
// split fits (columns, or rows for row-wise Adagrad); where nothing fits it
// is placed as without the budget, and the tier planner moves it to host
// memory.
TEST(ShardingTest, DeviceBudgetSplitsADeviceTableOrLeavesItToTheTierPlanner) {
  const ModelConfig c = ShardingConfig(
      "device: DEVICE_CUDA "
      "tables { name: 'g' rows: 10000 storage: STORAGE_DEVICE }");
  PlannerOptions o;
  o.device_budget_bytes = 200000;  // the table: 320000 bytes
  o.data_parallel_max_bytes = 0;
  for (int world = 2; world <= 4; ++world) {
    SCOPED_TRACE(absl::StrCat(world, " ranks"));
    o.world_size = world;
    auto plan = PlanSharding(c, o);
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_EQ(plan->tables[0].kind, SHARDING_COLUMN_WISE);
    for (int64_t bytes : DeviceBytesPerRank(c, *plan)) {
      EXPECT_LE(bytes, o.device_budget_bytes);
    }
    const ModelConfig adagrad = WithRowwiseAdagrad(c);
    auto by_rows = PlanSharding(adagrad, o);
    ASSERT_TRUE(by_rows.ok()) << by_rows.status();
    EXPECT_EQ(by_rows->tables[0].kind, SHARDING_ROW_WISE);
    for (int64_t bytes : DeviceBytesPerRank(adagrad, *by_rows)) {
      EXPECT_LE(bytes, o.device_budget_bytes);
    }
  }
  // One rank: nothing fits, so the table goes whole (the budget is soft
  // here) and the tier planner moves it off the device.
  o.world_size = 1;
  auto plan = PlanSharding(c, o);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->tables[0].kind, SHARDING_TABLE_WISE);
  EXPECT_EQ(DeviceBytesPerRank(c, *plan), (std::vector<int64_t>{320000}));
  TierPlanOptions tiers;
  tiers.device_budget_bytes = o.device_budget_bytes;
  auto moved = PlanStorageTiers(c, tiers, &*plan);
  ASSERT_TRUE(moved.ok()) << moved.status();
  EXPECT_EQ(moved->tables(0).storage(), STORAGE_HOST);
  EXPECT_EQ(DeviceBytesPerRank(*moved, *plan), (std::vector<int64_t>{0}));
}

// The tier planner's device pass, on 1 to 4 ranks: device tables (a cached
// one counted by its slots) move to STORAGE_HOST largest first, only while
// one of their shards sits on a rank over the budget, device_cache_rows
// cleared; the host budget then counts them and may move them on to
// RocksDB. ApplyMemoryBudgets takes the config's device_budget_bytes.
TEST(ShardingTest, TierPlannerMovesTheLargestDeviceTablesToTheHost) {
  // Device bytes: big 640000, mid 320000, cached 4000 slots = 128000,
  // small 96000.
  const ModelConfig c = ShardingConfig(
      "device: DEVICE_CUDA "
      "tables { name: 'small' rows: 3000 storage: STORAGE_DEVICE } "
      "tables { name: 'big' rows: 20000 storage: STORAGE_DEVICE } "
      "tables { name: 'cached' rows: 50000 storage: STORAGE_DEVICE "
      "device_cache_rows: 4000 } "
      "tables { name: 'mid' rows: 10000 storage: STORAGE_DEVICE } "
      "rocksdb { cache_fraction: 0.1 }");
  // One rank holding everything whole: 1184000 device bytes. Within
  // 600000 once big (640000) has left; within 230000 once mid has too;
  // within 100000 once cached has too.
  const ShardingPlan whole = WholeTablesPlan(c);
  EXPECT_EQ(DeviceBytesPerRank(c, whole), (std::vector<int64_t>{1184000}));
  TierPlanOptions o;
  o.device_budget_bytes = 600000;
  auto one = PlanStorageTiers(c, o, &whole);
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(one->tables(1).storage(), STORAGE_HOST);
  for (int k : {0, 2, 3}) EXPECT_EQ(one->tables(k).storage(), STORAGE_DEVICE);
  EXPECT_EQ(DeviceBytesPerRank(*one, whole), (std::vector<int64_t>{544000}));
  o.device_budget_bytes = 230000;
  auto two = PlanStorageTiers(c, o, &whole);
  ASSERT_TRUE(two.ok()) << two.status();
  EXPECT_EQ(two->tables(3).storage(), STORAGE_HOST);
  EXPECT_EQ(two->tables(2).storage(), STORAGE_DEVICE);
  EXPECT_EQ(DeviceBytesPerRank(*two, whole), (std::vector<int64_t>{224000}));
  // The cached table (128000 bytes of slots) goes next, and loses its
  // device_cache_rows.
  o.device_budget_bytes = 100000;
  auto three = PlanStorageTiers(c, o, &whole);
  ASSERT_TRUE(three.ok()) << three.status();
  EXPECT_EQ(three->tables(2).storage(), STORAGE_HOST);
  EXPECT_EQ(three->tables(2).device_cache_rows(), 0);
  EXPECT_EQ(three->tables(0).storage(), STORAGE_DEVICE);
  EXPECT_EQ(DeviceBytesPerRank(*three, whole), (std::vector<int64_t>{96000}));

  // Ranks 2 to 4, one table per rank table-wise (pinned): only the tables
  // on a rank over the budget move, whatever their size elsewhere.
  for (int world = 2; world <= 4; ++world) {
    SCOPED_TRACE(absl::StrCat(world, " ranks"));
    ModelConfig pinned = c;
    for (int k = 0; k < pinned.tables_size(); ++k) {
      pinned.mutable_tables(k)->set_sharding(SHARDING_TABLE_WISE);
      pinned.mutable_tables(k)->add_shard_ranks(k % world);
    }
    PlannerOptions po;
    po.world_size = world;
    auto plan = PlanSharding(pinned, po);
    ASSERT_TRUE(plan.ok()) << plan.status();
    // 330000: only a rank holding big (640000), or mid with another table,
    // is over.
    o.device_budget_bytes = 330000;
    auto planned = PlanStorageTiers(pinned, o, &*plan);
    ASSERT_TRUE(planned.ok()) << planned.status();
    for (int64_t bytes : DeviceBytesPerRank(*planned, *plan)) {
      EXPECT_LE(bytes, o.device_budget_bytes);
    }
    EXPECT_EQ(planned->tables(1).storage(), STORAGE_HOST);    // big
    EXPECT_EQ(planned->tables(0).storage(), STORAGE_DEVICE);  // small
    // mid shares rank 1 with big on 2 ranks (big moved: fits), rank 0
    // with small on 3 ranks (416000: over), and is alone on 4 ranks.
    EXPECT_EQ(planned->tables(3).storage(),
              world == 3 ? STORAGE_HOST : STORAGE_DEVICE);
  }

  // Then the host budget counts the moved table (640000 bytes) beside the
  // cached table's host rows (1600000); the larger, the cached table's
  // host backing, moves to RocksDB (its slots stay on the device), leaving
  // its row cache (5000 rows) and big in host memory.
  const std::string dir = ::testing::TempDir() + "/device_budget_rocksdb";
  o.device_budget_bytes = 600000;
  o.host_budget_bytes = 1700000;
  o.rocksdb.set_path(dir);
  o.rocksdb.set_cache_fraction(0.1);
  auto both = PlanStorageTiers(c, o, &whole);
  ASSERT_TRUE(both.ok()) << both.status();
  EXPECT_EQ(both->tables(1).storage(), STORAGE_HOST);
  EXPECT_EQ(both->tables(2).storage(), STORAGE_DEVICE);
  EXPECT_EQ(both->tables(2).device_cache_backing(), STORAGE_ROCKSDB);
  EXPECT_EQ(HostBytesPerRank(*both, whole, both->rocksdb()),
            (std::vector<int64_t>{20000 * 32 + 5000 * 32}));
  // With the cached table's backing already on RocksDB, the moved table
  // is the one that goes.
  ModelConfig rocks_backed = c;
  rocks_backed.mutable_tables(2)->set_device_cache_backing(STORAGE_ROCKSDB);
  *rocks_backed.mutable_rocksdb() = o.rocksdb;
  o.host_budget_bytes = 300000;
  auto then = PlanStorageTiers(rocks_backed, o, &whole);
  ASSERT_TRUE(then.ok()) << then.status();
  EXPECT_EQ(then->tables(1).storage(), STORAGE_ROCKSDB);
  EXPECT_EQ(HostBytesPerRank(*then, whole, then->rocksdb()),
            (std::vector<int64_t>{2000 * 32 + 5000 * 32}));

  // The config's own budget.
  ModelConfig from_config = c;
  from_config.set_device_budget_bytes(600000);
  auto applied = ApplyMemoryBudgets(from_config);
  ASSERT_TRUE(applied.ok()) << applied.status();
  EXPECT_EQ(applied->tables(1).storage(), STORAGE_HOST);
  auto again = ApplyMemoryBudgets(*applied);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->SerializeAsString(), applied->SerializeAsString());
}

// Negative device budgets are refused naming the field.
TEST(ShardingTest, NegativeDeviceBudgetIsInvalidArgument) {
  const ModelConfig c = ShardingConfig("tables { name: 'a' rows: 10 }");
  PlannerOptions po;
  po.device_budget_bytes = -1;
  test::ExpectInvalid(PlanSharding(c, po).status(), "device_budget_bytes");
  TierPlanOptions to;
  to.device_budget_bytes = -1;
  test::ExpectInvalid(PlanStorageTiers(c, to).status(), "device_budget_bytes");
  ModelConfig bad = c;
  bad.set_device_budget_bytes(-5);
  test::ExpectInvalid(NormalizeModelConfig(bad).status(),
                      "device_budget_bytes");
}

// RocksDB under a device cache: the host holds only its row cache, RocksDB
// the table; over a host budget the planner moves a device cache's host
// backing to RocksDB (the slots stay on the device) before the smaller
// host table. SGD, dim 8: 32 bytes a row.
TEST(ShardingTest, DeviceCacheOverRocksDbCountsItsRowCache) {
  const ModelConfig c = CudaShardingConfig(
      "tables { name: 'g' rows: 40000 storage: STORAGE_DEVICE "
      "device_cache_rows: 4000 device_cache_backing: STORAGE_ROCKSDB } "
      "rocksdb { path: '/tmp/unused' cache_rows: 2000 }");
  EXPECT_EQ(HostBytesOfTable(c, 1, c.rocksdb()), 64000);
  ExpectWholeTablesPlan(c, 96000,
                        {"on rocksdb with a cache of 2000 rows; in device "
                         "memory",
                         "rank 0: 0.1 MiB in host memory, 1.2 MiB on rocksdb, "
                         "0.1 MiB in device memory"});

  ModelConfig host_backed = c;
  host_backed.mutable_tables(1)->clear_device_cache_backing();
  host_backed.clear_rocksdb();
  auto moved = PlanStorageTiers(
      host_backed, TiersOverRocksDb(100000, /*cache_rows=*/2000, 0));
  ASSERT_TRUE(moved.ok()) << moved.status();
  EXPECT_EQ(moved->tables(1).storage(), STORAGE_DEVICE);
  EXPECT_EQ(moved->tables(1).device_cache_backing(), STORAGE_ROCKSDB);
  EXPECT_EQ(moved->tables(1).device_cache_rows(), 4000);
  EXPECT_EQ(moved->tables(0).storage(), STORAGE_HOST);
  EXPECT_EQ(moved->rocksdb().path(), "/tmp/unused");
}

TEST(ShardingTest, BalancesLookupsAndReplicatesSmallTables) {
  // Four big one-hot tables over two ranks: two each. A tiny one is
  // replicated.
  const ModelConfig c = ShardingConfig(
      "tables { name: 'a' rows: 10000 } tables { name: 'b' rows: 10000 } "
      "tables { name: 'c' rows: 10000 } tables { name: 'd' rows: 10000 } "
      "tables { name: 'tiny' rows: 10 }");
  auto plan = PlanSharding(c, PlannerOptions{.world_size = 2});
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
  const ModelConfig adagrad = WithRowwiseAdagrad(c);
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
  EXPECT_HAS_SUBSTR(plan.status().message(), "huge") << plan.status();
  EXPECT_HAS_SUBSTR(plan.status().message(), "100000 bytes") << plan.status();
}

TEST(ShardingTest, PinsAreHonouredAndBadPinsNamed) {
  const ModelConfig c = ShardingConfig(
      "tables { name: 'a' rows: 100 sharding: SHARDING_COLUMN_WISE "
      "shard_ranks: [2, 0] } "
      "tables { name: 'b' rows: 90 sharding: SHARDING_ROW_WISE } "
      "tables { name: 'c' rows: 80 sharding: SHARDING_TABLE_WISE "
      "shard_ranks: [1] }");
  const PlannerOptions o{.world_size = 3};
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
  EXPECT_HAS_SUBSTR(refused.status().message(), "tables[0] (x).shard_ranks")
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
  EXPECT_HAS_SUBSTR(s.message(), "table a") << s;
  plan.tables[0].shards[1].row_begin = 50;
  plan.tables[0].shards[1].row_count = 50;
  EXPECT_TRUE(plan.Validate(c).ok());
  plan.tables[0].shards[1].rank = 2;
  EXPECT_EQ(plan.Validate(c).code(), absl::StatusCode::kInvalidArgument);
}

// The host stand-in of the CUDA sparse backward pass (sparse_chunks.h,
// sparse_backward_host.h): its chunk plan, and its results against the CPU
// table.

TEST(SparseChunksTest, PlanArithmetic) {
  const int32_t c = kSparseChunk;
  EXPECT_EQ(SplitChunks(0), 0);
  EXPECT_EQ(SplitChunks(1), 0);
  EXPECT_EQ(SplitChunks(c), 0);
  EXPECT_EQ(SplitChunks(c + 1), 2);
  EXPECT_EQ(SplitChunks(2 * c), 2);
  EXPECT_EQ(SplitChunks(2 * c + 1), 3);
  EXPECT_EQ(SplitChunks(50000), (50000 + c - 1) / c);
  // Chunks of a run tile it in order, all full but the last.
  const ChunkRange first = ChunkOccurrences(100, 2 * c + 5, 0);
  EXPECT_EQ(first.begin, 100);
  EXPECT_EQ(first.end, 100 + c);
  const ChunkRange last = ChunkOccurrences(100, 2 * c + 5, 2);
  EXPECT_EQ(last.begin, 100 + 2 * c);
  EXPECT_EQ(last.end, 100 + 2 * c + 5);
  // Runs without chunks share their start with the next run; the search
  // passes them.
  const std::vector<int32_t> starts = {0, 0, 3, 3, 3, 5};  // 6 runs
  const int64_t want[] = {1, 1, 1, 4, 4};
  for (int64_t j = 0; j < 5; ++j) {
    EXPECT_EQ(RunOfChunk(starts.data(), 6, j), want[j]) << "chunk " << j;
  }
  // MaxSplitChunks bounds the chunks of any split of n occurrences into
  // runs.
  std::printf("seed %llu\n", static_cast<unsigned long long>(kSeed));
  Rng rng(kSeed);
  for (int trial = 0; trial < 2000; ++trial) {
    const int64_t n = 1 + rng.Below(20 * c);
    int64_t left = n, chunks = 0;
    while (left > 0) {
      // Runs just over a chunk (the worst case), or of any length.
      const int64_t len = std::min<int64_t>(
          left, trial % 2 == 0 ? c + 1 + rng.Below(3) : 1 + rng.Below(4 * c));
      chunks += SplitChunks(static_cast<int32_t>(len));
      left -= len;
    }
    ASSERT_LE(chunks, MaxSplitChunks(n)) << "n " << n;
  }
}

// |got[i] - want[i]| <= rel * max(|want[i]|, rms(want)) for every i; NaN
// never passes. Prints the largest error in those units.
void ExpectCloseToScale(const std::vector<float>& got, const float* want,
                        double rel, const std::string& what) {
  double sum_sq = 0;
  for (size_t i = 0; i < got.size(); ++i) sum_sq += double{want[i]} * want[i];
  const double rms = got.empty() ? 0.0 : std::sqrt(sum_sq / got.size());
  int failures = 0;
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double scale = std::max<double>(std::fabs(want[i]), rms);
    const double err = std::fabs(double{got[i]} - want[i]);
    if (!(err <= rel * scale) && failures++ < 5) {
      ADD_FAILURE() << what << "[" << i << "]: " << got[i] << " vs " << want[i]
                    << " (rms " << rms << ")";
    }
    if (scale > 0) worst = std::max(worst, err / scale);
  }
  std::printf("%s: largest error %.3g of scale (tolerance %.3g)\n",
              what.c_str(), worst, rel);
}

// The tolerance, relative to the values' scale, of results built on row
// gradients whose longest run has `longest` occurrences, when runs longer
// than kSparseChunk are summed in chunks on one side and serially on the
// other (docs/cuda.md "Numerics"): the serial sum's rounding error on
// gradients of random sign grows like 2^-24 sqrt(n) of the sum; 8 times
// that covers Adam's squared moment (twice the gradient's error) and the
// largest of many columns. Never below 1e-5, the tolerance of the
// optimizer tests.
double LongRunTolerance(int64_t longest) {
  return std::max(
      1e-5, 8 * std::ldexp(1.0, -24) * std::sqrt(static_cast<double>(longest)));
}

// A copy of `t`'s weights and state, for the stand-in to update.
struct TableCopy {
  std::vector<float> weights, state1, state2;
  explicit TableCopy(const EmbeddingTable& t)
      : weights(t.weights(), t.weights() + t.rows() * t.dim()),
        state1(t.state1().begin(), t.state1().end()),
        state2(t.state2().begin(), t.state2().end()) {}
};

int32_t LongestRun(const SparseBackwardProducts& p) {
  int32_t longest = 0;
  for (int32_t c : p.counts) longest = std::max(longest, c);
  return longest;
}

// Checks the chunk list against the runs: each split run (in range, longer
// than kSparseChunk) is tiled in order by its chunks, each at most
// kSparseChunk long and all full but the last; no other run has chunks.
void ExpectPlanTilesRuns(const SparseBackwardProducts& p, int64_t rows) {
  const int64_t u = static_cast<int64_t>(p.unique_keys.size());
  ASSERT_EQ(p.chunk_starts.size(), static_cast<size_t>(u + 1));
  ASSERT_EQ(static_cast<int64_t>(p.chunks.size()), p.chunk_starts[u]);
  ASSERT_LE(static_cast<int64_t>(p.chunks.size()),
            MaxSplitChunks(static_cast<int64_t>(p.sorted_keys.size())));
  for (int64_t k = 0; k < u; ++k) {
    const bool split = p.unique_keys[k] < static_cast<uint64_t>(rows) &&
                       p.counts[k] > kSparseChunk;
    const int32_t chunks = p.chunk_starts[k + 1] - p.chunk_starts[k];
    ASSERT_EQ(chunks > 0, split) << "run " << k;
    int64_t next = p.starts[k];
    for (int32_t i = 0; i < chunks; ++i) {
      const SparseChunk& c = p.chunks[p.chunk_starts[k] + i];
      EXPECT_EQ(c.run, k);
      EXPECT_EQ(c.begin, next);
      EXPECT_LE(c.end - c.begin, kSparseChunk);
      if (i + 1 < chunks) {
        EXPECT_EQ(c.end - c.begin, kSparseChunk);
      }
      next = c.end;
    }
    if (split) {
      EXPECT_EQ(next, p.starts[k] + p.counts[k]) << "run " << k;
    }
  }
}

struct StandInCase {
  int dim;
  Pooling pooling;
  int64_t rows;
  BatchShape batch;
  int pad;
  // Whether a run longer than kSparseChunk occurs (checked, so that each
  // case tests what it says).
  bool long_runs;
};

std::string CaseName(const StandInCase& c) {
  return absl::StrCat("d", c.dim, c.pooling == POOLING_MEAN ? "_mean" : "_sum",
                      "_rows", c.rows, "_bags", c.batch.bags, "_hot",
                      c.batch.max_hot, "_pad", c.pad);
}

// Three steps of the CPU table and the stand-in on the same batches: the
// stand-in's weights and state equal the table's bitwise when every run fits
// in a chunk (the same sums in the same order, the same rule functions);
// with longer runs the sums are chunked, and the results agree within
// LongRunTolerance.
class SparseBackwardHostTest : public ::testing::TestWithParam<StandInCase> {};

TEST_P(SparseBackwardHostTest, MatchesCpuTable) {
  const StandInCase& c = GetParam();
  for (auto type : {OptimizerConfig::SGD, OptimizerConfig::ROWWISE_ADAGRAD,
                    OptimizerConfig::ADAM}) {
    SCOPED_TRACE(::testing::Message()
                 << OptimizerConfig::Type_Name(type) << " seed " << kSeed);
    OptimizerConfig optimizer = MakeOptimizer(type);
    optimizer.mutable_schedule()->set_warmup_steps(3);
    optimizer.mutable_schedule()->set_warmup_start_factor(0.5f);
    EmbeddingTable cpu(1, c.rows, c.dim, c.pooling, optimizer, kSeed);
    TableCopy host(cpu);
    SparseBackwardProducts products;
    Rng rng(kSeed + c.dim + type);
    const int64_t stride = c.dim + c.pad;
    int32_t longest = 0;
    for (int step = 1; step <= 3; ++step) {
      const data::SparseFeature ids = RandomIds(rng, c.rows, c.batch);
      const std::vector<float> grad = RandomGrad(rng, ids.num_bags(), stride);
      cpu.BackwardUpdate(ids, grad.data(), stride);
      auto constants = optim::MakeStep(optimizer, step);
      ASSERT_TRUE(constants.ok()) << constants.status();
      ASSERT_TRUE(
          SparseBackwardUpdateHost(host.weights.data(), host.state1.data(),
                                   host.state2.data(), c.rows, c.dim,
                                   c.pooling == POOLING_MEAN, *constants, ids,
                                   grad.data(), stride, &products)
              .ok());
      ExpectPlanTilesRuns(products, c.rows);
      longest = std::max(longest, LongestRun(products));
    }
    const bool long_runs = longest > kSparseChunk;
    EXPECT_EQ(long_runs, c.long_runs) << "the case's batches";
    const size_t n = host.weights.size();
    if (!long_runs) {
      ExpectBitwise(host.weights.data(), cpu.weights(), n, "weights");
      ExpectBitwise(host.state1.data(), cpu.state1().data(), host.state1.size(),
                    "state1");
      ExpectBitwise(host.state2.data(), cpu.state2().data(), host.state2.size(),
                    "state2");
    } else {
      const double tol = LongRunTolerance(longest);
      ExpectCloseToScale(host.weights, cpu.weights(), tol, "weights");
      ExpectCloseToScale(host.state1, cpu.state1().data(), tol, "state1");
      ExpectCloseToScale(host.state2, cpu.state2().data(), tol, "state2");
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cases, SparseBackwardHostTest,
    ::testing::Values(
        // One-hot over a big table: every run short.
        StandInCase{16, POOLING_SUM, 20000, {1000, 1, 0}, 0, false},
        // Multi-hot with empty bags, a padded stride, odd dims.
        StandInCase{3, POOLING_MEAN, 5000, {200, 5, 0}, 2, false},
        StandInCase{33, POOLING_SUM, 5000, {300, 4, 0}, 0, false},
        // No bags; all bags of a small table.
        StandInCase{8, POOLING_MEAN, 10, {0, 1, 0}, 0, false},
        // Skewed small tables: hot rows longer than a chunk (the first two
        // like the hottest shapes of tests/embedding/cuda_embedding_test.cc).
        StandInCase{4, POOLING_SUM, 10, {257, 3, 0}, 0, true},
        StandInCase{16, POOLING_MEAN, 300, {500, 20, 0}, 0, true},
        StandInCase{16, POOLING_SUM, 40, {2000, 3, 0}, 0, true},
        StandInCase{16, POOLING_MEAN, 155, {5000, 4, 0}, 3, true},
        StandInCase{5, POOLING_MEAN, 3, {3000, 2, 0}, 0, true}),
    [](const ::testing::TestParamInfo<StandInCase>& info) {
      return CaseName(info.param);
    });

// A 3-row table with 50 000 hits: each run's gradient (a chunked sum)
// against the CPU table's sequential sum of the same terms, within the
// rounding error bound of both orders; the updated rows against the CPU
// table within LongRunTolerance.
TEST(SparseBackwardHostLongRunTest, TinyTableSumsWithinTheRoundingBound) {
  std::printf("seed %llu\n", static_cast<unsigned long long>(kSeed));
  const int64_t rows = 3;
  const int dim = 16;
  for (Pooling pooling : {POOLING_SUM, POOLING_MEAN}) {
    const bool mean = pooling == POOLING_MEAN;
    Rng rng(kSeed + pooling);
    // 29 000 bags of 0..3 ids (one in eight empty, 1.75 on average): about
    // 50 000 hits, 29 000 of them on row 0.
    const data::SparseFeature ids = RandomIds(rng, rows, {29000, 3, 0});
    ASSERT_GT(ids.ids.size(), 48000u);
    const std::vector<float> grad = RandomGrad(rng, ids.num_bags(), dim);
    SparseBackwardProducts p;
    ASSERT_TRUE(
        SparseBackwardGradients(rows, dim, mean, ids, grad.data(), dim, &p)
            .ok());
    ExpectPlanTilesRuns(p, rows);
    ASSERT_EQ(p.unique_keys.size(), 3u);
    for (int64_t k = 0; k < 3; ++k) {
      ASSERT_GT(p.counts[k], 100 * kSparseChunk) << "row " << k;
      // The CPU table's order: every term in bag order from 0. Each sum's
      // error is at most (additions a term goes through) * 2^-24 * sum |x|
      // (to first order): n - 1 for the serial sum, at most kSparseChunk
      // inside a chunk plus the chunks for the chunked one.
      const int64_t chunks = SplitChunks(p.counts[k]);
      const double u = std::ldexp(1.0, -24);
      const double adds = p.counts[k] + kSparseChunk + chunks;
      for (int col = 0; col < dim; ++col) {
        float serial = 0.0f;
        double abs_sum = 0;
        for (int64_t e = p.starts[k]; e < p.starts[k] + p.counts[k]; ++e) {
          const int64_t s = p.sorted_bags[e];
          const float scale =
              mean ? 1.0f / static_cast<float>(ids.bag_size(s)) : 1.0f;
          const float term = grad[s * dim + col] * scale;
          serial += term;
          abs_sum += std::fabs(term);
        }
        const float chunked = p.row_grads[k * dim + col];
        EXPECT_LE(std::fabs(double{chunked} - serial), adds * u * abs_sum)
            << "row " << k << " column " << col;
      }
    }
    // The updates built on those sums.
    for (auto type : {OptimizerConfig::SGD, OptimizerConfig::ROWWISE_ADAGRAD,
                      OptimizerConfig::ADAM}) {
      SCOPED_TRACE(OptimizerConfig::Type_Name(type));
      const OptimizerConfig optimizer = MakeOptimizer(type);
      EmbeddingTable cpu(0, rows, dim, pooling, optimizer, kSeed);
      TableCopy host(cpu);
      cpu.BackwardUpdate(ids, grad.data(), dim);
      auto constants = optim::MakeStep(optimizer, 1);
      ASSERT_TRUE(constants.ok());
      ASSERT_TRUE(
          SparseBackwardUpdateHost(host.weights.data(), host.state1.data(),
                                   host.state2.data(), rows, dim, mean,
                                   *constants, ids, grad.data(), dim, &p)
              .ok());
      const double tol = LongRunTolerance(LongestRun(p));
      ExpectCloseToScale(host.weights, cpu.weights(), tol, "weights");
      ExpectCloseToScale(host.state1, cpu.state1().data(), tol, "state1");
      ExpectCloseToScale(host.state2, cpu.state2().data(), tol, "state2");
    }
  }
}

// The (run, begin, end) of each of `p`'s chunks, in order.
std::vector<std::array<int64_t, 3>> ChunkBounds(
    const SparseBackwardProducts& p) {
  std::vector<std::array<int64_t, 3>> bounds;
  for (const SparseChunk& c : p.chunks)
    bounds.push_back({c.run, c.begin, c.end});
  return bounds;
}

TEST(SparseBackwardHostLongRunTest, ChunkingIsDeterministic) {
  std::printf("seed %llu\n", static_cast<unsigned long long>(kSeed));
  Rng rng(kSeed);
  const int dim = 12;
  const data::SparseFeature ids = RandomIds(rng, 155, {20000, 3, 0});
  const std::vector<float> grad = RandomGrad(rng, ids.num_bags(), dim);
  SparseBackwardProducts a, b;
  ASSERT_TRUE(
      SparseBackwardGradients(155, dim, true, ids, grad.data(), dim, &a).ok());
  // b is reused: a second batch first, then the same one.
  const data::SparseFeature other = RandomIds(rng, 155, {100, 2, 0});
  ASSERT_TRUE(
      SparseBackwardGradients(155, dim, true, other, grad.data(), dim, &b)
          .ok());
  ASSERT_TRUE(
      SparseBackwardGradients(155, dim, true, ids, grad.data(), dim, &b).ok());
  ASSERT_GT(a.chunks.size(), 0u);
  EXPECT_EQ(a.sorted_keys, b.sorted_keys);
  EXPECT_EQ(a.sorted_bags, b.sorted_bags);
  EXPECT_EQ(a.unique_keys, b.unique_keys);
  EXPECT_EQ(a.counts, b.counts);
  EXPECT_EQ(a.starts, b.starts);
  EXPECT_EQ(a.chunk_starts, b.chunk_starts);
  EXPECT_EQ(ChunkBounds(a), ChunkBounds(b));
  ASSERT_EQ(a.partials.size(), b.partials.size());
  ExpectBitwise(a.partials.data(), b.partials.data(), a.partials.size(),
                "partials");
  ASSERT_EQ(a.row_grads.size(), b.row_grads.size());
  ExpectBitwise(a.row_grads.data(), b.row_grads.data(), a.row_grads.size(),
                "row gradients");
}

// Ids outside [0, rows) sort last as one run of key `rows`, which gets no
// chunks and no update; the rows in range are updated as if the bad ids
// were not there (sum pooling; under mean pooling they still count in the
// bag's size, as on the device).
TEST(SparseBackwardHostTest, OutOfRangeIdsAreSkipped) {
  const int64_t rows = 6;
  const int dim = 4;
  data::SparseFeature bad, good;
  bad.offsets = {0};
  good.offsets = {0};
  // 150 bags: bag s holds s % 3 and, in most bags, an id out of range
  // (runs of 50 in range, so the sums are the CPU table's).
  for (int s = 0; s < 150; ++s) {
    good.ids.push_back(s % 3);
    bad.ids.push_back(s % 3);
    if (s % 5 != 0) bad.ids.push_back(s % 2 == 0 ? rows : -1 - s);
    bad.offsets.push_back(static_cast<int64_t>(bad.ids.size()));
    good.offsets.push_back(static_cast<int64_t>(good.ids.size()));
  }
  std::printf("seed %llu\n", static_cast<unsigned long long>(kSeed));
  Rng rng(kSeed);
  const std::vector<float> grad = RandomGrad(rng, 150, dim);
  const OptimizerConfig optimizer = MakeOptimizer(OptimizerConfig::ADAM);
  EmbeddingTable cpu(0, rows, dim, POOLING_SUM, optimizer, kSeed);
  TableCopy host(cpu);
  cpu.BackwardUpdate(good, grad.data(), dim);
  auto constants = optim::MakeStep(optimizer, 1);
  ASSERT_TRUE(constants.ok());
  SparseBackwardProducts p;
  ASSERT_TRUE(SparseBackwardUpdateHost(host.weights.data(), host.state1.data(),
                                       host.state2.data(), rows, dim, false,
                                       *constants, bad, grad.data(), dim, &p)
                  .ok());
  ASSERT_EQ(p.unique_keys.size(), 4u);
  EXPECT_EQ(p.unique_keys.back(), static_cast<uint64_t>(rows));
  EXPECT_EQ(p.counts.back(), 120);  // Longer than a chunk: still no chunks.
  EXPECT_EQ(p.chunk_starts[4] - p.chunk_starts[3], 0);
  for (int c = 0; c < dim; ++c) EXPECT_EQ(p.row_grads[3 * dim + c], 0.0f);
  ExpectPlanTilesRuns(p, rows);
  ExpectBitwise(host.weights.data(), cpu.weights(), rows * dim, "weights");
  ExpectBitwise(host.state1.data(), cpu.state1().data(), rows * dim, "m");
  ExpectBitwise(host.state2.data(), cpu.state2().data(), rows * dim, "v");

  // Mean pooling: bag {2, rows} gives row 2 half the bag's gradient.
  data::SparseFeature one;
  one.offsets = {0, 2};
  one.ids = {2, rows};
  const OptimizerConfig sgd = MakeOptimizer(OptimizerConfig::SGD);
  auto sgd_step = optim::MakeStep(sgd, 1);
  ASSERT_TRUE(sgd_step.ok());
  std::vector<float> w(rows * dim, 1.0f);
  const std::vector<float> g = {2.0f, 4.0f, -2.0f, 0.0f};
  ASSERT_TRUE(SparseBackwardUpdateHost(w.data(), nullptr, nullptr, rows, dim,
                                       true, *sgd_step, one, g.data(), dim, &p)
                  .ok());
  for (int64_t i = 0; i < rows * dim; ++i) {
    const float want = i / dim == 2 ? 1.0f - 0.1f * (0.5f * g[i % dim]) : 1.0f;
    EXPECT_EQ(w[i], want) << "element " << i;
  }
}

TEST(SparseBackwardHostTest, EmptyBatchesChangeNothingAndBadArgsAreNamed) {
  const OptimizerConfig optimizer = MakeOptimizer(OptimizerConfig::ADAM);
  auto constants = optim::MakeStep(optimizer, 1);
  ASSERT_TRUE(constants.ok());
  EmbeddingTable cpu(0, 7, 4, POOLING_MEAN, optimizer, kSeed);
  TableCopy host(cpu);
  const std::vector<float> grad(12, 1.0f);
  SparseBackwardProducts p;
  data::SparseFeature empty, none;
  empty.offsets = {0, 0, 0, 0};
  for (const data::SparseFeature* f : {&empty, &none}) {
    ASSERT_TRUE(SparseBackwardUpdateHost(
                    host.weights.data(), host.state1.data(), host.state2.data(),
                    7, 4, true, *constants, *f, grad.data(), 4, &p)
                    .ok());
    EXPECT_TRUE(p.unique_keys.empty());
    EXPECT_TRUE(p.chunks.empty());
  }
  ExpectBitwise(host.weights.data(), cpu.weights(), 28, "weights");
  ExpectBitwise(host.state1.data(), cpu.state1().data(), 28, "m");

  data::SparseFeature one;
  one.offsets = {0, 1};
  one.ids = {0};
  struct Bad {
    int64_t rows;
    int dim;
    int64_t stride;
    const char* names;
  };
  for (const Bad& b : {Bad{7, 0, 4, "dim"}, Bad{7, 4, 3, "grad_stride"},
                       Bad{-1, 4, 4, "rows"}}) {
    const absl::Status st = SparseBackwardGradients(b.rows, b.dim, false, one,
                                                    grad.data(), b.stride, &p);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << b.names;
    EXPECT_HAS_SUBSTR(st.message(), b.names) << st;
  }
}

// A dynamic table's raw ids spread evenly over its row-wise shards, each
// to exactly one, unchanged; a static table's row-wise shards take the ids
// in their rows as shard rows; other placements take every id.
TEST(DynamicRouteTest, EveryIdGoesToOneShard) {
  Rng rng(7);
  for (int shards : {1, 2, 3, 4}) {
    TablePlacement p;
    p.kind = SHARDING_ROW_WISE;
    for (int i = 0; i < shards; ++i) {
      p.shards.push_back({i, 1000 * i / shards,
                          1000 * (i + 1) / shards - 1000 * i / shards, 0, 8});
    }
    std::vector<int64_t> count(shards, 0);
    constexpr int kIds = 120000;
    for (int n = 0; n < kIds; ++n) {
      const int64_t id = static_cast<int64_t>(rng.NextU64() >> 1);
      int takers = 0;
      for (int i = 0; i < shards; ++i) {
        const int64_t local = ShardTakes(p, i, /*dynamic=*/true, id);
        if (local < 0) continue;
        ++takers;
        ++count[i];
        EXPECT_EQ(local, id);
        EXPECT_EQ(DynamicRowShard(id, shards), i);
      }
      ASSERT_EQ(takers, 1) << "id " << id << " over " << shards << " shards";
    }
    for (int i = 0; i < shards; ++i) {
      EXPECT_NEAR(count[i], kIds / shards, kIds / shards / 20)
          << "shard " << i << " of " << shards;
    }
    // The same table, static: the shard of the id's rows, as a shard row.
    for (int64_t id : {int64_t{0}, int64_t{333}, int64_t{999}}) {
      int takers = 0;
      for (int i = 0; i < shards; ++i) {
        const int64_t local = ShardTakes(p, i, /*dynamic=*/false, id);
        if (local < 0) continue;
        ++takers;
        EXPECT_EQ(local, id - p.shards[i].row_begin);
      }
      EXPECT_EQ(takers, 1) << "row " << id;
    }
  }
  TablePlacement table_wise;
  table_wise.shards.push_back({0, 0, 1000, 0, 8});
  EXPECT_EQ(ShardTakes(table_wise, 0, /*dynamic=*/true, int64_t{1} << 40),
            int64_t{1} << 40);
  EXPECT_EQ(ShardTakes(table_wise, 0, /*dynamic=*/false, 5), 5);
}

}  // namespace
}  // namespace dlrm::embedding
