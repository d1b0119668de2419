// Tests for embedding/embedding_kernels.h and the fused sparse update's fast
// paths (gradient sums in registers, grouped row sums, prefetch, the two
// deduplications, the parallel split): every version against the plain
// references of embedding_table.h, bit for bit, on random inputs with odd dims,
// empty bags and repeated ids.
#include "embedding/embedding_kernels.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/random.h"
#include "embedding/embedding_table.h"
#include "tests/support/expect.h"
#include "tests/support/optimizer.h"
#include "tests/support/table_update.h"

namespace dlrm::embedding {
namespace {
using test::BitDifferences;

constexpr uint64_t kSeed = 20261202;

using kernels::Isa;

// Every version this CPU runs.
std::vector<Isa> SupportedIsas() {
  std::vector<Isa> out;
  for (Isa isa : {Isa::kPortable, Isa::kAvx512}) {
    if (kernels::Supported(isa)) out.push_back(isa);
  }
  return out;
}

const char* IsaName(Isa isa) {
  return isa == Isa::kAvx512 ? "avx512" : "portable";
}

TEST(PoolBagsTest, EveryVersionGivesTheReferenceBits) {
  std::printf("seed %llu\n", static_cast<unsigned long long>(kSeed));
  Rng rng(kSeed);
  constexpr int64_t kRows = 300;
  constexpr float kSentinel = -7.0f;
  for (int dim :
       {1, 3, 7, 8, 15, 16, 17, 31, 33, 64, 100, 128, 129, 200, 257}) {
    const std::vector<float> weights = test::NormalFloats(rng, kRows * dim);
    for (Pooling pooling : {POOLING_SUM, POOLING_MEAN}) {
      for (int max_hot : {1, 40}) {
        const data::SparseFeature ids =
            test::SmallIdBags(rng, kRows, 50, max_hot);
        const int64_t bags = ids.num_bags();
        const int64_t stride = dim + 5;
        std::vector<float> want(bags * stride, kSentinel);
        reference::PoolForward(weights.data(), dim, pooling, ids, want.data(),
                               stride);
        for (Isa isa : SupportedIsas()) {
          const std::string what =
              absl::StrCat(IsaName(isa), " dim ", dim, " hot ", max_hot,
                           pooling == POOLING_MEAN ? " mean" : " sum");
          // All bags at once, and in three uneven ranges (as the parallel
          // loop's chunks call it).
          for (const std::vector<int64_t>& cuts :
               {std::vector<int64_t>{0, bags},
                std::vector<int64_t>{0, 1, bags / 2 + 1, bags}}) {
            std::vector<float> got(bags * stride, kSentinel);
            for (size_t i = 0; i + 1 < cuts.size(); ++i) {
              kernels::PoolBags(isa, weights.data(), dim,
                                pooling == POOLING_MEAN, ids.offsets.data(),
                                ids.ids.data(), cuts[i], cuts[i + 1],
                                ids.offsets[bags], got.data(), stride);
            }
            // The padding past dim stays untouched (the reference writes
            // none either).
            EXPECT_EQ(BitDifferences(got.data(), want.data(), got.size(), what),
                      0);
          }
        }
      }
    }
  }
}

TEST(PoolBagsTest, EmptyBagsGiveZerosAndRepeatsAddUp) {
  const std::vector<float> weights = {1.5f, -2.0f, 0.25f, 3.0f, 4.0f, 5.0f};
  // dim 3: bag 0 empty, bag 1 row 1 three times, bag 2 rows 0 and 1.
  const data::SparseFeature ids{{0, 0, 3, 5}, {1, 1, 1, 0, 1}};
  for (Isa isa : SupportedIsas()) {
    for (bool mean : {false, true}) {
      std::vector<float> out(9, -1.0f);
      kernels::PoolBags(isa, weights.data(), 3, mean, ids.offsets.data(),
                        ids.ids.data(), 0, 3, 5, out.data(), 3);
      const float k = mean ? 1.0f / 3.0f : 1.0f, h = mean ? 0.5f : 1.0f;
      const std::vector<float> want = {
          0, 0, 0, 9 * k, 12 * k, 15 * k, 4.5f * h, 2 * h, 5.25f * h};
      for (int i = 0; i < 9; ++i) {
        EXPECT_EQ(out[i], want[i])
            << IsaName(isa) << " mean " << mean << " element " << i;
      }
    }
  }
}

TEST(SumRowsTest, EveryVersionGivesThePlainLoopsBits) {
  std::printf("seed %llu\n", static_cast<unsigned long long>(kSeed));
  Rng rng(kSeed + 1);
  constexpr int64_t kRows = 200;
  constexpr float kSentinel = -7.0f;
  for (int dim :
       {1, 3, 7, 8, 15, 16, 17, 24, 31, 32, 33, 64, 100, 128, 129, 200, 257}) {
    const int64_t stride = dim + 5;
    const std::vector<float> rows = test::NormalFloats(rng, kRows * stride);
    // Ranges of `order`: empty, one row, a row repeated, random rows with
    // repeats (skewed to small indices), and one long run.
    std::vector<int64_t> order;
    std::vector<std::pair<int64_t, int64_t>> ranges;
    auto add_range = [&](const std::vector<int64_t>& r) {
      const int64_t begin = static_cast<int64_t>(order.size());
      order.insert(order.end(), r.begin(), r.end());
      ranges.push_back({begin, static_cast<int64_t>(order.size())});
    };
    add_range({});
    add_range({static_cast<int64_t>(rng.Below(kRows))});
    add_range(std::vector<int64_t>(9, static_cast<int64_t>(rng.Below(kRows))));
    for (int n : {2, 5, 13, 40, 300}) {
      std::vector<int64_t> r(n);
      for (int64_t& i : r) {
        const double u = rng.Uniform();
        i = std::min<int64_t>(kRows - 1, u * u * kRows);
      }
      add_range(r);
    }
    const int64_t total = static_cast<int64_t>(order.size());
    for (const auto& [begin, end] : ranges) {
      std::vector<float> want(dim + 4, kSentinel);
      for (int c = 0; c < dim; ++c) want[c] = 0.0f;
      for (int64_t e = begin; e < end; ++e) {
        for (int c = 0; c < dim; ++c) want[c] += rows[order[e] * stride + c];
      }
      for (Isa isa : SupportedIsas()) {
        const std::string what =
            absl::StrCat(IsaName(isa), " dim ", dim, " rows ", end - begin);
        std::vector<float> got(dim + 4, kSentinel);
        kernels::SumRows(isa, rows.data(), stride, dim, order.data(), begin,
                         end, total, got.data());
        // Nothing past dim is written.
        EXPECT_EQ(BitDifferences(got.data(), want.data(), got.size(), what), 0);
      }
    }
  }
}

// Two steps of EmbeddingTable::BackwardUpdate against
// reference::DenseGradientUpdate, bitwise, at `threads` OpenMP threads.
void CheckUpdate(OptimizerConfig::Type type, Pooling pooling, int dim,
                 int64_t rows, int64_t bags, int max_hot, int threads) {
  const std::string label = absl::StrCat(
      OptimizerConfig::Type_Name(type),
      pooling == POOLING_MEAN ? " mean" : " sum", " dim ", dim, " rows ", rows,
      " bags ", bags, " hot ", max_hot, " threads ", threads);
  Rng rng(kSeed + dim + rows);
  const OptimizerConfig opt = test::MakeOptimizer(type);
  EmbeddingTable t(3, rows, dim, pooling, opt, kSeed);
  test::ExpectTwoUpdatesMatchReference(
      t, t.weights(), rows, dim, bags, max_hot, threads, rng, label,
      [&](float* w, float* s1, float* s2, int step,
          const data::SparseFeature& ids, const float* grad, int64_t stride) {
        reference::DenseGradientUpdate(w, s1, s2, rows, dim, pooling, opt, step,
                                       ids, grad, stride);
      });
}

TEST(SparseUpdateTest, OddDimsAndEveryRuleGiveTheReferenceBits) {
  std::printf("seed %llu\n", static_cast<unsigned long long>(kSeed));
  for (auto type : {OptimizerConfig::SGD, OptimizerConfig::ROWWISE_ADAGRAD,
                    OptimizerConfig::ADAM}) {
    for (Pooling pooling : {POOLING_SUM, POOLING_MEAN}) {
      for (int dim : {1, 7, 9, 16, 33, 100, 128, 129, 257}) {
        // Few rows for many ids (the rows-long array deduplicates) and many
        // rows for few ids (the hash table does), multi-hot and one-hot;
        // one row for all ids.
        CheckUpdate(type, pooling, dim, 1, 40, 5, 1);
        CheckUpdate(type, pooling, dim, 50, 120, 9, 1);
        CheckUpdate(type, pooling, dim, 70000, 60, 3, 1);
        CheckUpdate(type, pooling, dim, 70000, 150, 1, 1);
      }
    }
  }
}

TEST(SparseUpdateTest, ThreadsSplitTheRowsWithTheSameBits) {
  // Big enough for BackwardUpdate's own parallel loop, at 1 to 3 threads
  // (uneven splits of the unique rows, groups cut at the split).
  for (auto type : {OptimizerConfig::SGD, OptimizerConfig::ROWWISE_ADAGRAD,
                    OptimizerConfig::ADAM}) {
    for (int threads : {1, 2, 3}) {
      CheckUpdate(type, POOLING_SUM, 33, 30000, 6000, 4, threads);
      CheckUpdate(type, POOLING_MEAN, 128, 2000, 3000, 6, threads);
    }
  }
}

}  // namespace
}  // namespace dlrm::embedding
