// Tests for the sparse update in pieces: EmbeddingTable::BeginUpdate /
// UpdateRows against the plain references, the stores' BeginUpdate /
// UpdateRange / EndUpdate through embedding::UpdateStores on every CPU tier
// against BackwardUpdate on a twin store, and the ranges UpdateStores cuts;
// bit for bit, on random inputs (duplicates, empty bags, one id, every id
// the same, multi-hot, dims 16 and 128 and odd ones, fp32 and 16-bit rows).
#include "embedding/store_update.h"

#include <gtest/gtest.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <numeric>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/random.h"
#include "embedding/cached_store.h"
#include "embedding/embedding_store.h"
#include "embedding/embedding_table.h"
#include "embedding/row_database.h"
#include "tests/support/expect.h"
#include "tests/support/table_spec.h"

namespace dlrm::embedding {
namespace {
using test::BitDifferences;

constexpr uint64_t kSeed = 20261202;

// Kinds of batches: every case the update's paths branch on.
enum class Batch {
  kMultiHot,  // 0..8 ids a bag, about one in eight empty, repeats in a bag
  kOneHot,    // one id a bag
  kOneId,     // a single bag of a single id
  kSameId,    // every bag holds the same id, 1..4 times
  kEmpty,     // bags, none with an id
};

data::SparseFeature MakeBatch(Batch kind, Rng& rng, int64_t rows,
                              int64_t bags) {
  switch (kind) {
    case Batch::kMultiHot:
      return test::HotHalfIds(rng, rows, bags, 8);
    case Batch::kOneHot: {
      data::SparseFeature f;
      f.offsets.push_back(0);
      for (int64_t s = 0; s < bags; ++s) {
        f.ids.push_back(static_cast<int64_t>(rng.Below(rows)));
        f.offsets.push_back(s + 1);
      }
      return f;
    }
    case Batch::kOneId:
      return test::Bag({static_cast<int64_t>(rng.Below(rows))});
    case Batch::kSameId: {
      const int64_t id = static_cast<int64_t>(rng.Below(rows));
      data::SparseFeature f;
      f.offsets.push_back(0);
      for (int64_t s = 0; s < bags; ++s) {
        for (uint64_t i = 0; i <= rng.Below(4); ++i) f.ids.push_back(id);
        f.offsets.push_back(static_cast<int64_t>(f.ids.size()));
      }
      return f;
    }
    case Batch::kEmpty:
      return data::SparseFeature{.offsets = std::vector<int64_t>(bags + 1, 0),
                                 .ids = {}};
  }
  return {};
}

// The Batch kinds' names, in their order.
constexpr const char* kBatchNames[] = {"multi-hot", "one-hot", "one id",
                                       "same id", "empty"};
static_assert(std::size(kBatchNames) == static_cast<size_t>(Batch::kEmpty) + 1);

const char* BatchName(Batch kind) {
  return kBatchNames[static_cast<int>(kind)];
}

// [0, u) cut at random points (empty ranges included), in random order.
std::vector<std::pair<int64_t, int64_t>> RandomRanges(Rng& rng, int64_t u) {
  std::vector<int64_t> cuts = {0, u};
  const uint64_t extra = rng.Below(8);
  for (uint64_t i = 0; i < extra; ++i) {
    cuts.push_back(static_cast<int64_t>(rng.Below(u + 1)));
  }
  std::sort(cuts.begin(), cuts.end());
  std::vector<std::pair<int64_t, int64_t>> ranges;
  for (size_t i = 0; i + 1 < cuts.size(); ++i) {
    ranges.emplace_back(cuts[i], cuts[i + 1]);
  }
  for (size_t i = ranges.size(); i > 1; --i) {
    std::swap(ranges[i - 1], ranges[rng.Below(i)]);
  }
  return ranges;
}

// Two steps of BeginUpdate and UpdateRows over random ranges in random
// order on 3 threads, against reference::DenseGradientUpdate (fp32 rows)
// or DenseGradientUpdate16, bitwise.
void CheckTableRanges(RowPrecision precision, OptimizerConfig::Type type,
                      Pooling pooling, int dim, int64_t rows, Batch kind) {
  const std::string label = absl::StrCat(
      RowPrecision_Name(precision), " ", OptimizerConfig::Type_Name(type),
      pooling == POOLING_MEAN ? " mean" : " sum", " dim ", dim, " rows ", rows,
      " ", BatchName(kind));
  Rng rng(kSeed + dim + rows + static_cast<int>(kind));
  const OptimizerConfig opt = test::MakeOptimizer(type);
  EmbeddingTable t(3, rows, dim, pooling, opt, kSeed, {}, precision);
  const bool fp32 = precision == ROW_FP32;
  std::vector<float> w;
  std::vector<uint16_t> words;
  if (fp32) {
    w.assign(t.weights(), t.weights() + rows * dim);
  } else {
    words.assign(t.words(), t.words() + rows * dim);
  }
  std::vector<float> s1(t.state1().begin(), t.state1().end());
  std::vector<float> s2(t.state2().begin(), t.state2().end());
  for (int step = 1; step <= 2; ++step) {
    const data::SparseFeature ids = MakeBatch(kind, rng, rows, 300);
    const int64_t stride = dim + 3;
    const std::vector<float> grad =
        test::RandomGrad(rng, ids.num_bags(), static_cast<int>(stride));
    const int64_t u = t.BeginUpdate(ids, grad.data(), stride);
    const auto ranges = RandomRanges(rng, u);
    const int n = static_cast<int>(ranges.size());
#pragma omp parallel for schedule(dynamic, 1) num_threads(3)
    for (int i = 0; i < n; ++i) t.UpdateRows(ranges[i].first, ranges[i].second);
    if (fp32) {
      reference::DenseGradientUpdate(w.data(), s1.data(), s2.data(), rows, dim,
                                     pooling, opt, step, ids, grad.data(),
                                     stride);
    } else {
      reference::DenseGradientUpdate16(
          words.data(), precision, s1.data(), s2.data(), rows, dim, pooling,
          opt, step, ids, grad.data(), stride, kSeed, 3, 0, 0);
    }
  }
  EXPECT_EQ(t.step(), 2);
  if (fp32) {
    EXPECT_EQ(BitDifferences(t.weights(), w.data(), w.size(), label), 0);
  } else {
    EXPECT_EQ(BitDifferences(t.words(), words.data(), words.size(), label), 0);
  }
  EXPECT_EQ(BitDifferences(t.state1().data(), s1.data(), s1.size(), label), 0);
  EXPECT_EQ(BitDifferences(t.state2().data(), s2.data(), s2.size(), label), 0);
}

TEST(TableRangesTest, RangesInAnyOrderOnThreadsGiveTheReferenceBits) {
  std::printf("seed %llu\n", static_cast<unsigned long long>(kSeed));
  for (RowPrecision precision : {ROW_FP32, ROW_BF16, ROW_FP16}) {
    for (auto type : {OptimizerConfig::SGD, OptimizerConfig::ROWWISE_ADAGRAD,
                      OptimizerConfig::ADAM}) {
      for (Pooling pooling : {POOLING_SUM, POOLING_MEAN}) {
        for (int dim : {1, 16, 33, 128}) {
          for (Batch kind : {Batch::kMultiHot, Batch::kOneHot, Batch::kOneId,
                             Batch::kSameId, Batch::kEmpty}) {
            // Few rows (the rows-long array deduplicates, rows repeat) and
            // many (the hash table does).
            CheckTableRanges(precision, type, pooling, dim, 50, kind);
            if (kind != Batch::kSameId && kind != Batch::kEmpty) {
              CheckTableRanges(precision, type, pooling, dim, 70000, kind);
            }
          }
        }
      }
    }
  }
}

// ------------------------------------------------------------ PlanRowRanges

TEST(PlanRowRangesTest, BigStoresAreCutAndEveryRowIsCoveredOnce) {
  // One store with most of the work, small ones, one not split (a whole
  // update, or no ids) and one with too few rows to cut.
  const std::vector<int64_t> work = {1000000, 20000, 30000, 50000, 400000};
  const std::vector<int64_t> units = {40000, 300, 500, 0, 300};
  for (int threads = 1; threads <= 4; ++threads) {
    SCOPED_TRACE(testing::Message() << threads << " threads");
    const int64_t share = RangeShare(work, threads);
    EXPECT_EQ(share, 1500000 / (2 * threads));
    const std::vector<RowRange> ranges = PlanRowRanges(work, units, share);
    std::vector<std::vector<RowRange>> of(work.size());
    for (size_t i = 0; i < ranges.size(); ++i) {
      of[ranges[i].store].push_back(ranges[i]);
      if (i > 0) {
        EXPECT_GE(ranges[i - 1].work, ranges[i].work);
      }
    }
    for (size_t j = 0; j < work.size(); ++j) {
      std::sort(of[j].begin(), of[j].end(),
                [](const RowRange& a, const RowRange& b) {
                  return a.begin < b.begin;
                });
      int64_t next = 0;
      for (const RowRange& r : of[j]) {
        EXPECT_EQ(r.begin, next) << "store " << j;
        EXPECT_GT(r.end, r.begin) << "store " << j;
        next = r.end;
      }
      EXPECT_EQ(next, units[j]) << "store " << j;
    }
    // The big store holds 2/3 of all the work: 2 x threads x 2/3 ranges,
    // rounded up; the small ones whole.
    EXPECT_EQ(of[0].size(), static_cast<size_t>((4 * threads + 2) / 3));
    EXPECT_EQ(of[1].size(), 1u);
    EXPECT_EQ(of[2].size(), 1u);
    EXPECT_TRUE(of[3].empty());
    // 300 rows: one range whatever its work.
    EXPECT_EQ(of[4].size(), 1u);
  }
  EXPECT_TRUE(PlanRowRanges({}, {}, 1).empty());
  EXPECT_EQ(RangeShare({}, 2), 1);
}

// ------------------------------------------------------------ UpdateStores

enum class Tier { kHost, kRocksDb, kHostSlots, kDynamicHost, kDynamicRocksDb };

// The Tier values' names, in their order (test names are made of them).
constexpr const char* kTierNames[] = {"Host", "RocksDb", "HostSlots",
                                      "DynamicHost", "DynamicRocksDb"};
static_assert(std::size(kTierNames) ==
              static_cast<size_t>(Tier::kDynamicRocksDb) + 1);

std::string TierName(Tier tier) { return kTierNames[static_cast<int>(tier)]; }

// The stores of one case: a big multi-hot table of dim 128, a one-hot one
// of dim 16, a tiny one, one whose batch is empty, one whose ids are all
// the same, one of an odd dim.
struct TableCase {
  int64_t rows;
  int dim;
  Batch batch;
  int64_t bags;
};
constexpr TableCase kTables[] = {
    {20000, 128, Batch::kMultiHot, 1024}, {5000, 16, Batch::kOneHot, 1024},
    {3, 16, Batch::kMultiHot, 1024},      {100, 128, Batch::kEmpty, 1024},
    {1000, 16, Batch::kSameId, 1024},     {777, 33, Batch::kMultiHot, 400},
};

class UpdateStoresTest
    : public testing::TestWithParam<std::tuple<Tier, RowPrecision>> {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(testing::TempDir()) /
           absl::StrCat("store_update_test_", getpid(), "_",
                        TierName(std::get<0>(GetParam())), "_",
                        RowPrecision_Name(std::get<1>(GetParam())));
    std::filesystem::remove_all(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // A fresh database in a directory `name` of the test's own.
  std::unique_ptr<RowDatabase> OpenDatabase(const std::string& name) {
    RocksDbStoreOptions o;
    o.path = (dir_ / name).string();
    o.block_cache_bytes = 1 << 20;
    o.write_buffer_bytes = 1 << 20;
    auto db = RowDatabase::Open(o);
    EXPECT_TRUE(db.ok()) << db.status();
    return db.ok() ? std::move(db).value() : nullptr;
  }

  // A store of table `k` of kTables on the test's tier (rows on RocksDB in
  // `db`).
  std::unique_ptr<EmbeddingStore> Make(int k, RowDatabase* db) {
    const Tier tier = std::get<0>(GetParam());
    TableSpec spec =
        test::MakeTableSpec(k, kTables[k].rows, kTables[k].dim,
                            k % 2 == 0 ? POOLING_SUM : POOLING_MEAN,
                            k % 3 == 0   ? OptimizerConfig::ROWWISE_ADAGRAD
                            : k % 3 == 1 ? OptimizerConfig::ADAM
                                         : OptimizerConfig::SGD,
                            kSeed);
    spec.precision = std::get<1>(GetParam());
    if (tier == Tier::kHostSlots) {
      CacheOptions options;
      options.cache_rows = spec.rows;
      auto store = CachedStore::Create(
          spec, options, std::make_unique<HostSlots>(spec, spec.rows),
          std::make_unique<HostStore>(spec));
      EXPECT_TRUE(store.ok()) << store.status();
      return store.ok() ? std::move(store).value() : nullptr;
    }
    StoreOptions o;
    o.kind = tier == Tier::kRocksDb || tier == Tier::kDynamicRocksDb
                 ? StoreKind::kRocksDbCache
                 : StoreKind::kHost;
    o.rocksdb.path = db->options().path;
    // A cache of 3/4 of the rows: batches evict rows (and read them back).
    o.rocksdb.cache_rows = std::max<int64_t>(3, spec.rows - spec.rows / 4);
    o.dynamic = tier == Tier::kDynamicHost || tier == Tier::kDynamicRocksDb;
    auto store = CreateEmbeddingStore(spec, o, db);
    EXPECT_TRUE(store.ok()) << store.status();
    return store.ok() ? std::move(store).value() : nullptr;
  }

  std::filesystem::path dir_;
};

// Two sets of the same stores, one trained through UpdateStores at 1 to 4
// threads (from 2 threads on, the big table is split), the other by
// BackwardUpdate store by store: the same pooled
// outputs at every step and the same records (weights and optimizer state)
// and step counters at the end, bitwise.
TEST_P(UpdateStoresTest, TrainsBitwiseLikeBackwardUpdate) {
  std::printf("seed %llu\n", static_cast<unsigned long long>(kSeed));
  const int num = static_cast<int>(std::size(kTables));
  const int saved = omp_get_max_threads();
  for (int threads = 1; threads <= 4; ++threads) {
    SCOPED_TRACE(testing::Message() << threads << " threads");
    // Each set in a database of its own (the stores drop theirs first).
    std::unique_ptr<RowDatabase> db_split =
        OpenDatabase(absl::StrCat("split_", threads));
    std::unique_ptr<RowDatabase> db_whole =
        OpenDatabase(absl::StrCat("whole_", threads));
    ASSERT_NE(db_split, nullptr);
    ASSERT_NE(db_whole, nullptr);
    std::vector<std::unique_ptr<EmbeddingStore>> split, whole;
    for (int k = 0; k < num; ++k) {
      split.push_back(Make(k, db_split.get()));
      whole.push_back(Make(k, db_whole.get()));
      ASSERT_NE(split.back(), nullptr);
      ASSERT_NE(whole.back(), nullptr);
    }
    Rng rng(kSeed + threads);
    for (int step = 0; step < 3; ++step) {
      std::vector<data::SparseFeature> ids;
      std::vector<std::vector<float>> grads;
      for (const TableCase& t : kTables) {
        ids.push_back(MakeBatch(t.batch, rng, t.rows, t.bags));
        grads.push_back(test::RandomGrad(rng, ids.back().num_bags(), t.dim));
      }
      std::vector<StoreUpdate> updates(num);
      for (int k = 0; k < num; ++k) {
        const std::string what = absl::StrCat("table ", k, " step ", step);
        auto a = split[k]->Prepare(ids[k]);
        auto b = whole[k]->Prepare(ids[k]);
        ASSERT_TRUE(a.ok()) << what << ": " << a.status();
        ASSERT_TRUE(b.ok()) << what << ": " << b.status();
        const int64_t n = ids[k].num_bags() * kTables[k].dim;
        std::vector<float> out_a(std::max<int64_t>(n, 1)),
            out_b(std::max<int64_t>(n, 1));
        ASSERT_TRUE(split[k]->Forward(**a, out_a.data(), kTables[k].dim).ok());
        ASSERT_TRUE(whole[k]->Forward(**b, out_b.data(), kTables[k].dim).ok());
        EXPECT_EQ(BitDifferences(out_a.data(), out_b.data(), n, what), 0);
        ASSERT_TRUE(
            whole[k]->BackwardUpdate(**b, grads[k].data(), kTables[k].dim).ok())
            << what;
        updates[k] = {split[k].get(), *a, grads[k].data(), kTables[k].dim,
                      absl::OkStatus()};
      }
      omp_set_num_threads(threads);
      UpdateStores(updates);
      omp_set_num_threads(saved);
      for (int k = 0; k < num; ++k) {
        EXPECT_TRUE(updates[k].status.ok())
            << "table " << k << ": " << updates[k].status;
      }
    }
    for (int k = 0; k < num; ++k) {
      EXPECT_EQ(split[k]->step(), whole[k]->step()) << "table " << k;
      const std::vector<float> a = test::AllRecords(*split[k]);
      const std::vector<float> b = test::AllRecords(*whole[k]);
      ASSERT_EQ(a.size(), b.size());
      EXPECT_EQ(BitDifferences(a.data(), b.data(), a.size(),
                               absl::StrCat("table ", k, " records")),
                0);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Tiers, UpdateStoresTest,
    testing::Combine(testing::Values(Tier::kHost, Tier::kRocksDb,
                                     Tier::kHostSlots, Tier::kDynamicHost,
                                     Tier::kDynamicRocksDb),
                     testing::Values(ROW_FP32, ROW_BF16)),
    [](const testing::TestParamInfo<UpdateStoresTest::ParamType>& info) {
      return TierName(std::get<0>(info.param)) +
             RowPrecision_Name(std::get<1>(info.param));
    });

// A store handed a batch that is not its last Prepare's fails with its
// FailedPrecondition and gets no EndUpdate; the others are updated.
TEST(UpdateStoresErrorTest, AStoresErrorIsItsOwnAndTheOthersAreUpdated) {
  const std::filesystem::path dir =
      std::filesystem::path(testing::TempDir()) /
      absl::StrCat("store_update_test_error_", getpid());
  std::filesystem::remove_all(dir);
  {
    RocksDbStoreOptions o;
    o.path = dir.string();
    o.block_cache_bytes = 1 << 20;
    o.write_buffer_bytes = 1 << 20;
    auto db = RowDatabase::Open(o);
    ASSERT_TRUE(db.ok()) << db.status();
    const TableSpec spec = test::MakeTableSpec(
        0, 100, 16, POOLING_SUM, OptimizerConfig::ROWWISE_ADAGRAD, kSeed);
    o.cache_rows = 100;
    StoreOptions so;
    so.kind = StoreKind::kRocksDbCache;
    so.rocksdb = o;
    auto cached = CreateEmbeddingStore(spec, so, db->get());
    ASSERT_TRUE(cached.ok()) << cached.status();
    HostStore host(spec), twin(spec);
    Rng rng(kSeed);
    const data::SparseFeature ids = test::HotHalfIds(rng, 100, 64, 4);
    const data::SparseFeature other = test::HotHalfIds(rng, 100, 64, 4);
    const std::vector<float> grad = test::RandomGrad(rng, 64, 16);
    ASSERT_TRUE((*cached)->Prepare(ids).ok());
    std::vector<StoreUpdate> updates = {
        {cached->get(), &other, grad.data(), 16, absl::OkStatus()},
        {&host, &ids, grad.data(), 16, absl::OkStatus()}};
    UpdateStores(updates);
    EXPECT_EQ(updates[0].status.code(), absl::StatusCode::kFailedPrecondition)
        << updates[0].status;
    EXPECT_TRUE(updates[1].status.ok()) << updates[1].status;
    ASSERT_TRUE(twin.BackwardUpdate(ids, grad.data(), 16).ok());
    const std::vector<float> a = test::AllRecords(host);
    const std::vector<float> b = test::AllRecords(twin);
    EXPECT_EQ(BitDifferences(a.data(), b.data(), a.size(), "host"), 0);
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace dlrm::embedding
