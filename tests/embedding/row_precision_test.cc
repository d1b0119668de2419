// Tests for 16-bit embedding rows (embedding/row_precision.h and the 16-bit
// paths of EmbeddingTable): the conversions, the stochastic rounding
// (within one ulp, unbiased, deterministic), the pooled lookup of every
// kernel version against the reference on the widened rows, and the fused
// update against a plain fp32 update rounded the same way, bitwise.
#include "embedding/row_precision.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/random.h"
#include "embedding/embedding_kernels.h"
#include "embedding/embedding_store.h"
#include "embedding/embedding_table.h"
#include "embedding/planned_bytes.h"
#include "embedding/sharding_memory.h"
#include "tests/support/expect.h"
#include "tests/support/optimizer.h"
#include "tests/support/table_update.h"

namespace dlrm::embedding {
namespace {
using test::BitDifferences;

constexpr uint64_t kSeed = 20261202;
constexpr RowPrecision kPrecisions[] = {ROW_FP16, ROW_BF16};

const char* Name(RowPrecision p) { return p == ROW_FP16 ? "fp16" : "bf16"; }

// The word of `precision` next to `w` away from zero (w finite, not the
// largest): one more in the magnitude bits.
uint16_t AwayFromZero(uint16_t w) { return static_cast<uint16_t>(w + 1); }

// `x` rounded toward zero to `precision`.
uint16_t TowardZero(RowPrecision precision, float x) {
  uint16_t w = FloatToWord(precision, x);
  if (std::fabs(WordToFloat(precision, w)) > std::fabs(x)) --w;
  return w;
}

TEST(RowPrecisionTest, EveryWordWidensAndNarrowsBackToItself) {
  for (RowPrecision p : kPrecisions) {
    for (uint32_t w = 0; w < 65536; ++w) {
      const float f = WordToFloat(p, static_cast<uint16_t>(w));
      if (std::isnan(f)) {
        EXPECT_TRUE(std::isnan(WordToFloat(p, FloatToWord(p, f)))) << w;
        continue;
      }
      ASSERT_EQ(FloatToWord(p, f), w) << Name(p) << " word " << w;
      ASSERT_EQ(FloatToWordStochastic(p, f, 0xffffffffu), w)
          << Name(p) << " word " << w << ": exact values never move";
    }
  }
}

TEST(RowPrecisionTest, NearestRoundsToTheCloserNeighbour) {
  std::printf("seed %llu\n", static_cast<unsigned long long>(kSeed));
  Rng rng(kSeed);
  for (RowPrecision p : kPrecisions) {
    for (int i = 0; i < 100000; ++i) {
      // Magnitudes from 2^-30 to 2^15: half's subnormals and normals.
      const float x = static_cast<float>((rng.Uniform() < 0.5 ? -1 : 1) *
                                         std::exp2(rng.Uniform(-30, 15)));
      const uint16_t lo = TowardZero(p, x);
      const float a = WordToFloat(p, lo);
      const float b = WordToFloat(p, AwayFromZero(lo));
      const float got = WordToFloat(p, FloatToWord(p, x));
      ASSERT_TRUE(got == a || got == b) << Name(p) << " " << x;
      const double da = std::fabs(double{x} - a), db = std::fabs(double{x} - b);
      if (da != db) {
        ASSERT_EQ(got, da < db ? a : b) << Name(p) << " " << x;
      }
    }
  }
  EXPECT_EQ(HalfToFloat(FloatToHalf(70000.0f)), INFINITY);
  EXPECT_EQ(HalfToFloat(FloatToHalf(65504.0f)), 65504.0f);
  EXPECT_EQ(Bf16ToFloat(FloatToBf16(1.0f + 0x1p-8f)), 1.0f);  // tie to even
}

TEST(RowPrecisionTest, StochasticRoundingStaysWithinOneUlp) {
  Rng rng(kSeed + 1);
  for (RowPrecision p : kPrecisions) {
    for (int i = 0; i < 100000; ++i) {
      const float x = static_cast<float>((rng.Uniform() < 0.5 ? -1 : 1) *
                                         std::exp2(rng.Uniform(-30, 15)));
      const uint16_t lo = TowardZero(p, x);
      const uint16_t got =
          FloatToWordStochastic(p, x, static_cast<uint32_t>(rng.NextU64()));
      ASSERT_TRUE(got == lo || got == AwayFromZero(lo))
          << Name(p) << " " << x << " gave word " << got << ", toward zero "
          << lo;
    }
  }
}

TEST(RowPrecisionTest, StochasticRoundingIsUnbiasedOverTheHashedBits) {
  // For values at several fractions of an ulp, normal and (half)
  // subnormal, the mean over 2^16 rows' bits is the value within 5 sigma
  // of a Bernoulli mean.
  constexpr int kDraws = 1 << 16;
  for (RowPrecision p : kPrecisions) {
    for (float base : {1.0f, -3.0f, 1e-6f, 2e-7f}) {
      const uint16_t lo = TowardZero(p, base);
      const double a = WordToFloat(p, lo), b = WordToFloat(p, lo + 1);
      for (double frac : {0.1, 0.5, 0.77, 0.999}) {
        const float x = static_cast<float>(a + frac * (b - a));
        const double want_frac = (double{x} - a) / (b - a);
        double sum = 0;
        for (int d = 0; d < kDraws; ++d) {
          const uint32_t bits =
              RoundingBits(RoundingRowKey(kSeed, 2, d, /*step=*/7), 5);
          sum += WordToFloat(p, FloatToWordStochastic(p, x, bits));
        }
        const double mean_frac = (sum / kDraws - a) / (b - a);
        const double sigma =
            std::sqrt(want_frac * (1 - want_frac) / kDraws) + 1e-9;
        EXPECT_NEAR(mean_frac, want_frac, 5 * sigma)
            << Name(p) << " x " << x << " frac " << frac;
      }
    }
  }
}

TEST(RowPrecisionTest, RoundingBitsArePureAndDependOnEveryArgument) {
  const uint64_t k = RoundingRowKey(kSeed, 1, 100, 3);
  EXPECT_EQ(RoundingBits(k, 4),
            RoundingBits(RoundingRowKey(kSeed, 1, 100, 3), 4));
  EXPECT_NE(RoundingBits(k, 4), RoundingBits(k, 5));
  EXPECT_NE(k, RoundingRowKey(kSeed + 1, 1, 100, 3));
  EXPECT_NE(k, RoundingRowKey(kSeed, 2, 100, 3));
  EXPECT_NE(k, RoundingRowKey(kSeed, 1, 101, 3));
  EXPECT_NE(k, RoundingRowKey(kSeed, 1, 100, 4));
}

std::vector<float> Widen(RowPrecision p, const uint16_t* w, int64_t n) {
  std::vector<float> out(n);
  for (int64_t i = 0; i < n; ++i) out[i] = WordToFloat(p, w[i]);
  return out;
}

TEST(Pool16Test, EveryVersionGivesTheReferenceBitsOnTheWidenedRows) {
  std::printf("seed %llu\n", static_cast<unsigned long long>(kSeed));
  Rng rng(kSeed);
  constexpr int64_t kRows = 300;
  std::vector<kernels::Isa> isas;
  for (kernels::Isa isa : {kernels::Isa::kPortable, kernels::Isa::kAvx512}) {
    if (kernels::Supported(isa)) isas.push_back(isa);
  }
  for (RowPrecision p : kPrecisions) {
    for (int dim : {1, 3, 8, 15, 16, 17, 31, 32, 33, 64, 100, 128, 129, 257}) {
      std::vector<uint16_t> words(kRows * dim);
      for (uint16_t& w : words) {
        w = FloatToWord(p, static_cast<float>(rng.Normal()));
      }
      const std::vector<float> wide = Widen(p, words.data(), words.size());
      const int64_t stride = dim + 5;
      for (Pooling pooling : {POOLING_SUM, POOLING_MEAN}) {
        for (int max_hot : {1, 40}) {
          const data::SparseFeature ids =
              test::SmallIdBags(rng, kRows, 50, max_hot);
          const int64_t bags = ids.num_bags();
          std::vector<float> want(bags * stride, -7.0f);
          reference::PoolForward(wide.data(), dim, pooling, ids, want.data(),
                                 stride);
          for (kernels::Isa isa : isas) {
            const std::string what = absl::StrCat(
                Name(p), isa == kernels::Isa::kAvx512 ? " avx512" : " portable",
                " dim ", dim, " hot ", max_hot,
                pooling == POOLING_MEAN ? " mean" : " sum");
            std::vector<float> got(bags * stride, -7.0f);
            kernels::PoolBags16(isa, p, words.data(), dim,
                                pooling == POOLING_MEAN, ids.offsets.data(),
                                ids.ids.data(), 0, bags / 2, ids.offsets[bags],
                                got.data(), stride);
            kernels::PoolBags16(isa, p, words.data(), dim,
                                pooling == POOLING_MEAN, ids.offsets.data(),
                                ids.ids.data(), bags / 2, bags,
                                ids.offsets[bags], got.data(), stride);
            EXPECT_EQ(BitDifferences(got.data(), want.data(), got.size(), what),
                      0);
          }
          // The table's Forward (PoolRows16, parallel where big) too.
          EmbeddingTable t(0, kRows, dim, pooling,
                           test::MakeOptimizer(OptimizerConfig::SGD), kSeed, {},
                           p);
          std::memcpy(t.words(), words.data(), words.size() * 2);
          std::vector<float> got(bags * stride, -7.0f);
          t.Forward(ids, got.data(), stride);
          EXPECT_EQ(BitDifferences(got.data(), want.data(), got.size(),
                                   absl::StrCat(Name(p), " Forward dim ", dim)),
                    0);
        }
      }
    }
  }
}

// Two steps of a 16-bit EmbeddingTable::BackwardUpdate against
// reference::DenseGradientUpdate16 (fp32 math, then the same rounding),
// bitwise, at `threads` OpenMP threads, on a table that is the slice
// [row_begin, +rows) x [col_begin, +dim) of a bigger one.
void CheckUpdate16(RowPrecision p, OptimizerConfig::Type type, Pooling pooling,
                   int dim, int64_t rows, int64_t bags, int max_hot,
                   int threads, int64_t row_begin = 0, int col_begin = 0) {
  const std::string label = absl::StrCat(
      Name(p), " ", OptimizerConfig::Type_Name(type),
      pooling == POOLING_MEAN ? " mean" : " sum", " dim ", dim, " rows ", rows,
      " bags ", bags, " hot ", max_hot, " threads ", threads);
  Rng rng(kSeed + dim + rows);
  const OptimizerConfig opt = test::MakeOptimizer(type);
  EmbeddingTable t(3, rows, dim, pooling, opt, kSeed,
                   TableSlice{row_begin + rows + 7, row_begin, col_begin}, p);
  ASSERT_EQ(t.weights(), nullptr);
  test::ExpectTwoUpdatesMatchReference(
      t, t.words(), rows, dim, bags, max_hot, threads, rng, label,
      [&](uint16_t* w, float* s1, float* s2, int step,
          const data::SparseFeature& ids, const float* grad, int64_t stride) {
        reference::DenseGradientUpdate16(w, p, s1, s2, rows, dim, pooling, opt,
                                         step, ids, grad, stride, kSeed, 3,
                                         row_begin, col_begin);
      });
}

TEST(Update16Test, EveryRuleGivesTheReferenceBits) {
  std::printf("seed %llu\n", static_cast<unsigned long long>(kSeed));
  for (RowPrecision p : kPrecisions) {
    for (auto type : {OptimizerConfig::SGD, OptimizerConfig::ROWWISE_ADAGRAD,
                      OptimizerConfig::ADAM}) {
      for (Pooling pooling : {POOLING_SUM, POOLING_MEAN}) {
        for (int dim : {1, 7, 16, 100, 129}) {
          CheckUpdate16(p, type, pooling, dim, 50, 120, 9, 1);
          CheckUpdate16(p, type, pooling, dim, 70000, 60, 3, 1, 1000, 8);
          CheckUpdate16(p, type, pooling, dim, 70000, 150, 1, 1);
        }
      }
    }
  }
}

TEST(Update16Test, ThreadsSplitTheRowsWithTheSameBits) {
  for (RowPrecision p : kPrecisions) {
    for (int threads : {1, 2, 3}) {
      CheckUpdate16(p, OptimizerConfig::ADAM, POOLING_MEAN, 64, 20000, 4096, 4,
                    threads);
      CheckUpdate16(p, OptimizerConfig::ROWWISE_ADAGRAD, POOLING_SUM, 64, 20000,
                    4096, 4, threads);
    }
  }
}

TEST(Update16Test, ShardsRoundAsTheWholeTable) {
  // The block [10, 30) x [4, 12) of a 40 x 16 table, updated on its own
  // with the whole table's gradients for those rows and columns, holds the
  // whole table's bits (SGD and Adam: no sum over the row's columns).
  Rng rng(kSeed + 5);
  for (RowPrecision p : kPrecisions) {
    for (auto type : {OptimizerConfig::SGD, OptimizerConfig::ADAM}) {
      const OptimizerConfig opt = test::MakeOptimizer(type);
      EmbeddingTable whole(2, 40, 16, POOLING_SUM, opt, kSeed, {}, p);
      EmbeddingTable block(2, 20, 8, POOLING_SUM, opt, kSeed,
                           TableSlice{40, 10, 4}, p);
      for (int step = 0; step < 3; ++step) {
        data::SparseFeature ids = test::SmallIdBags(rng, 20, 30, 3);
        const std::vector<float> grad =
            test::NormalFloats(rng, ids.num_bags() * 16);
        block.BackwardUpdate(ids, grad.data() + 4, 16);
        for (int64_t& id : ids.ids) id += 10;
        whole.BackwardUpdate(ids, grad.data(), 16);
      }
      for (int64_t r = 0; r < 20; ++r) {
        for (int c = 0; c < 8; ++c) {
          ASSERT_EQ(block.words()[r * 8 + c],
                    whole.words()[(10 + r) * 16 + 4 + c])
              << Name(p) << " row " << r << " col " << c;
        }
      }
    }
  }
}

TEST(Table16Test, InitialValuesAreTheFp32OnesRoundedToNearest) {
  const OptimizerConfig sgd = test::MakeOptimizer(OptimizerConfig::SGD);
  EmbeddingTable fp32(1, 30, 12, POOLING_SUM, sgd, kSeed);
  for (RowPrecision p : kPrecisions) {
    EmbeddingTable t(1, 30, 12, POOLING_SUM, sgd, kSeed, {}, p);
    for (int64_t i = 0; i < 30 * 12; ++i) {
      ASSERT_EQ(t.words()[i], FloatToWord(p, fp32.weights()[i])) << i;
    }
  }
}

TEST(Table16Test, RecordsHoldTheExactValuesAndCopyBack) {
  const OptimizerConfig adam = test::MakeOptimizer(OptimizerConfig::ADAM);
  for (RowPrecision p : kPrecisions) {
    EmbeddingTable a(1, 10, 6, POOLING_SUM, adam, kSeed, {}, p);
    EmbeddingTable b(1, 10, 6, POOLING_SUM, adam, kSeed + 1, {}, p);
    a.state1()[7] = 0.25f;
    std::vector<float> record(6 + 12);
    a.ReadRecord(1, record.data());
    for (int c = 0; c < 6; ++c) {
      EXPECT_EQ(record[c], WordToFloat(p, a.words()[6 + c]));
    }
    EXPECT_EQ(record[6 + 1], 0.25f);
    b.WriteRecord(4, record.data());
    EXPECT_EQ(0, BitDifferences(b.words() + 24, a.words() + 6, 6, "record"));
    const int64_t from[] = {2}, to[] = {3};
    CopyRecords(a, from, b, to, 1);
    EXPECT_EQ(0, BitDifferences(b.words() + 18, a.words() + 12, 6, "copy"));
  }
}

TEST(Table16Test, WeightsTakeTwoBytesEach) {
  const OptimizerConfig adagrad =
      test::MakeOptimizer(OptimizerConfig::ROWWISE_ADAGRAD);
  TableSpec spec;
  spec.rows = 1000;
  spec.dim = 64;
  spec.optimizer = adagrad;
  const int64_t fp32 = HostStore(spec).MemoryBytes().host;
  EXPECT_EQ(fp32, 1000 * (64 * 4 + 4));
  for (RowPrecision p : kPrecisions) {
    spec.precision = p;
    HostStore store(spec);
    EXPECT_EQ(store.MemoryBytes().host, 1000 * (64 * 2 + 4)) << Name(p);
    EXPECT_EQ(ShardBytes({0, 0, 1000, 0, 64}, adagrad, p),
              store.MemoryBytes().host);
    // The planners' and the memory plan's bytes of such a table.
    TableConfig table;
    table.set_rows(1000);
    table.set_dim(64);
    table.set_weight_precision(p);
    EXPECT_EQ(
        PlannedShardBytes(table, RocksDbConfig(), {0, 0, 1000, 0, 64}, adagrad)
            .host,
        store.MemoryBytes().host);
  }
}

TEST(Table16Test, TheDeviceTierRefusesSixteenBitRows) {
  // The host and RocksDB tiers keep them (rows16_tiers_test.cc).
  TableSpec spec;
  spec.rows = 10;
  spec.dim = 4;
  spec.optimizer = test::MakeOptimizer(OptimizerConfig::SGD);
  spec.precision = ROW_BF16;
  StoreOptions o;
  o.kind = StoreKind::kDevice;
  absl::StatusOr<std::unique_ptr<EmbeddingStore>> store =
      CreateEmbeddingStore(spec, o, nullptr);
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(store.status().message().find("ROW_BF16"), std::string::npos)
      << store.status();
  EXPECT_NE(store.status().message().find("device tier"), std::string::npos)
      << store.status();
  o.kind = StoreKind::kHost;
  EXPECT_TRUE(CreateEmbeddingStore(spec, o, nullptr).ok());
  spec.precision = static_cast<RowPrecision>(9);
  EXPECT_EQ(spec.Validate().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace dlrm::embedding
