// Tests for embedding/slot_manager.h and embedding/cached_store.h: the slot
// bookkeeping (LRU / LFU order, pinning of the batch's rows, dirty
// write-back plans, refused batches changing nothing), and a cache of host
// slots (HostSlots, the CPU stand-in for the device's) much smaller than
// its table training bitwise like the table in host memory, with skewed
// ids, prefetch (on the caller's thread and in the background), records
// read and written mid-training and flushes, over a HostStore (rows moved
// through the cache's records and staging, and directly between the slots
// and the HostStore's arrays) and over RocksDB (a RocksDbCachedStore under
// it).
#include "embedding/cached_store.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "core/device.h"
#include "core/random.h"
#include "embedding/embedding_store.h"
#include "embedding/embedding_table.h"
#include "embedding/rocksdb_store.h"
#include "embedding/slot_manager.h"
#include "tests/support/expect.h"
#include "tests/support/table_spec.h"

namespace dlrm::embedding {
namespace {

using test::AllRecords;
using test::Bag;
using test::RandomGrad;
using test::SkewedIds;

constexpr uint64_t kSeed = 20261124;

TableSpec MakeSpec(int64_t rows, int dim, Pooling pooling,
                   OptimizerConfig::Type type) {
  return test::MakeTableSpec(5, rows, dim, pooling, type, kSeed);
}

int RecordFloats(const TableSpec& spec) {
  return spec.dim + StateFloatsPerRow(spec.optimizer, spec.dim);
}

bool BitwiseEqual(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// `direct`: CacheOptions::direct_host_access (used over a HostStore).
std::unique_ptr<CachedStore> HostCache(const TableSpec& spec,
                                       int64_t cache_rows,
                                       EvictionPolicy eviction,
                                       std::unique_ptr<EmbeddingStore> backing,
                                       bool background_prefetch = true,
                                       bool direct = true) {
  CacheOptions options;
  options.cache_rows = cache_rows;
  options.eviction = eviction;
  options.background_prefetch = background_prefetch;
  options.direct_host_access = direct;
  auto store = CachedStore::Create(
      spec, options, std::make_unique<HostSlots>(spec, cache_rows),
      std::move(backing));
  EXPECT_TRUE(store.ok()) << store.status();
  return store.ok() ? std::move(store).value() : nullptr;
}

std::unique_ptr<CachedStore> HostCache(const TableSpec& spec,
                                       int64_t cache_rows,
                                       EvictionPolicy eviction,
                                       bool background_prefetch = true,
                                       bool direct = true) {
  return HostCache(spec, cache_rows, eviction,
                   std::make_unique<HostStore>(spec), background_prefetch,
                   direct);
}

// An LRU cache of `cache_rows` over a HostStore that it reads through calls
// only (not directly, as a RocksDB one), prefetching in the background.
std::unique_ptr<CachedStore> BackgroundLruCache(const TableSpec& spec,
                                                int64_t cache_rows) {
  return HostCache(spec, cache_rows, EvictionPolicy::kLru,
                   /*background_prefetch=*/true, /*direct=*/false);
}

// A RocksDB database in a directory of the test's own, removed at the end.
class TempDatabase {
 public:
  explicit TempDatabase(const std::string& name)
      : dir_(testing::TempDir() + "/" + name + "_" +
             std::to_string(::getpid())) {
    std::filesystem::remove_all(dir_);
    options_.path = dir_;
    options_.block_cache_bytes = 1 << 20;
    options_.write_buffer_bytes = 1 << 20;
    auto db = RowDatabase::Open(options_);
    EXPECT_TRUE(db.ok()) << db.status();
    if (db.ok()) db_ = std::move(db).value();
  }
  ~TempDatabase() {
    db_.reset();
    std::filesystem::remove_all(dir_);
  }
  RowDatabase* db() { return db_.get(); }
  // A RocksDB row cache of `cache_rows` rows of `spec` in the database.
  std::unique_ptr<EmbeddingStore> Store(const TableSpec& spec,
                                        int64_t cache_rows) {
    RocksDbStoreOptions options = options_;
    options.cache_rows = cache_rows;
    auto store = RocksDbCachedStore::Create(spec, options, db_.get());
    EXPECT_TRUE(store.ok()) << store.status();
    return store.ok() ? std::move(store).value() : nullptr;
  }

 private:
  std::string dir_;
  RocksDbStoreOptions options_;
  std::unique_ptr<RowDatabase> db_;
};

// ------------------------------------------------------------ SlotManager

// Plans and commits `ids`, returning the plan's copy.
SlotPlan PlanAndCommit(SlotManager& m, const data::SparseFeature& ids) {
  const absl::Status st = m.Plan(ids);
  EXPECT_TRUE(st.ok()) << st;
  SlotPlan plan = m.plan();
  m.Commit();
  return plan;
}

TEST(SlotManagerTest, MissesTakeFreeSlotsThenHitsKeepThem) {
  SlotManager m(5, 100, 4, EvictionPolicy::kLru, "the cache", "cache_rows");
  const SlotPlan first = PlanAndCommit(m, Bag({7, 3, 7}));
  EXPECT_EQ(first.rows, (std::vector<int64_t>{7, 3}));
  EXPECT_EQ(first.slots, (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(first.misses, (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(first.remapped.ids, (std::vector<int64_t>{0, 1, 0}));
  EXPECT_EQ(first.remapped.offsets, (std::vector<int64_t>{0, 3}));
  EXPECT_EQ(first.evictions, 0);
  const SlotPlan second = PlanAndCommit(m, Bag({3, 9}));
  EXPECT_EQ(second.slots, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(second.misses, (std::vector<int64_t>{1}));
  EXPECT_EQ(m.SlotOf(7), 0);
  EXPECT_EQ(m.SlotOf(9), 2);
  EXPECT_EQ(m.SlotOf(8), -1);
  EXPECT_EQ(m.RowOf(3), -1);
  EXPECT_EQ(m.resident(), 3);
}

TEST(SlotManagerTest, LruEvictsTheLeastRecentlyUsedRow) {
  SlotManager m(5, 100, 3, EvictionPolicy::kLru, "the cache", "cache_rows");
  for (int64_t row : {0, 1, 2, 0}) PlanAndCommit(m, Bag({row}));
  const SlotPlan plan = PlanAndCommit(m, Bag({3}));
  EXPECT_EQ(plan.evictions, 1);
  EXPECT_EQ(m.SlotOf(1), -1);
  EXPECT_EQ(plan.slots, (std::vector<int64_t>{1}));  // Row 1's slot.
  EXPECT_GE(m.SlotOf(0), 0);
  EXPECT_GE(m.SlotOf(2), 0);
}

TEST(SlotManagerTest, LfuEvictsTheLeastFrequentlyUsedRowTiesByRecency) {
  SlotManager m(5, 100, 3, EvictionPolicy::kLfu, "the cache", "cache_rows");
  for (int64_t row : {0, 0, 1, 2}) PlanAndCommit(m, Bag({row}));
  // 1 and 2 were used once, 1 longer ago; 0 twice, though least recently.
  PlanAndCommit(m, Bag({3}));
  EXPECT_EQ(m.SlotOf(1), -1);
  EXPECT_GE(m.SlotOf(0), 0);
  PlanAndCommit(m, Bag({4}));
  EXPECT_EQ(m.SlotOf(2), -1);
  EXPECT_GE(m.SlotOf(0), 0);
}

TEST(SlotManagerTest, RowsOfThePlannedBatchAreNeverVictims) {
  SlotManager m(5, 100, 2, EvictionPolicy::kLru, "the cache", "cache_rows");
  PlanAndCommit(m, Bag({0}));
  PlanAndCommit(m, Bag({1}));
  // Row 0 heads the LRU order but is in the batch: row 1 goes.
  const SlotPlan plan = PlanAndCommit(m, Bag({0, 2}));
  EXPECT_EQ(plan.evictions, 1);
  EXPECT_EQ(m.SlotOf(1), -1);
  EXPECT_EQ(m.SlotOf(0), 0);
  EXPECT_EQ(m.SlotOf(2), 1);
}

TEST(SlotManagerTest, DirtyVictimsArePlannedForWriteBackInRowOrder) {
  SlotManager m(5, 100, 4, EvictionPolicy::kLru, "the cache", "cache_rows");
  PlanAndCommit(m, Bag({40, 10}));
  m.MarkBatchDirty();
  PlanAndCommit(m, Bag({20, 30}));  // Clean.
  EXPECT_EQ(m.DirtySlots(), (std::vector<int64_t>{0, 1}));
  const SlotPlan plan = PlanAndCommit(m, Bag({1, 2, 3}));
  // 40 and 10 (dirty), then 20 (clean) go.
  EXPECT_EQ(plan.evictions, 3);
  EXPECT_EQ(plan.writeback_rows, (std::vector<int64_t>{10, 40}));
  EXPECT_EQ(plan.writeback_slots, (std::vector<int64_t>{1, 0}));
  // Victims' dirty bits leave with them; loaded rows start clean.
  EXPECT_TRUE(m.DirtySlots().empty());
  EXPECT_EQ(m.SlotOf(30), 3);
}

TEST(SlotManagerTest, RefusedBatchesChangeNothing) {
  SlotManager m(5, 100, 2, EvictionPolicy::kLru, "the cache", "cache_rows");
  PlanAndCommit(m, Bag({0, 1}));
  m.MarkBatchDirty();

  absl::Status st = m.Plan(Bag({0, 100}));
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_HAS_SUBSTR(st.message(), "table 5") << st;
  EXPECT_HAS_SUBSTR(st.message(), "id 100") << st;
  st = m.Plan(Bag({-1}));
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;

  st = m.Plan(Bag({2, 3, 4}));
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted) << st;
  EXPECT_HAS_SUBSTR(st.message(),
                    "table 5: batch has 3 unique ids but the cache "
                    "holds 2 rows (cache_rows)")
      << st;

  data::SparseFeature bad = Bag({1, 2});
  bad.offsets = {0, 3};
  st = m.Plan(bad);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_HAS_SUBSTR(st.message(), "offsets") << st;
  bad.offsets = {1, 2};
  EXPECT_EQ(m.Plan(bad).code(), absl::StatusCode::kInvalidArgument);

  // A plan never committed changes nothing either.
  ASSERT_TRUE(m.Plan(Bag({7, 8})).ok());
  EXPECT_EQ(m.SlotOf(0), 0);
  EXPECT_EQ(m.SlotOf(1), 1);
  EXPECT_EQ(m.SlotOf(7), -1);
  EXPECT_EQ(m.DirtySlots(), (std::vector<int64_t>{0, 1}));
  // Commit without a successful plan is a no-op.
  EXPECT_EQ(m.Plan(Bag({100})).code(), absl::StatusCode::kInvalidArgument);
  m.Commit();
  EXPECT_EQ(m.resident(), 2);

  // An empty batch plans nothing.
  data::SparseFeature empty;
  ASSERT_TRUE(m.Plan(empty).ok());
  EXPECT_TRUE(m.plan().rows.empty());
  m.Commit();
  EXPECT_EQ(m.resident(), 2);
}

// Random batches against a brute-force model of the cache: the plan's
// slots are distinct, hits stay put, exactly the rows the batch holds are
// resident afterwards, capacity is never exceeded, and every dirty row
// evicted is in the write-back list.
TEST(SlotManagerTest, RandomBatchesKeepTheInvariants) {
  for (const EvictionPolicy policy :
       {EvictionPolicy::kLru, EvictionPolicy::kLfu}) {
    const uint64_t seed = kSeed + static_cast<int>(policy);
    SCOPED_TRACE(testing::Message() << "seed " << seed);
    std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
    Rng rng(seed);
    SlotManager m(5, 500, 40, policy, "the cache", "cache_rows");
    std::vector<int64_t> holder(40, -1);
    std::vector<bool> dirty(40, false);
    int64_t resident = 0;
    for (int step = 0; step < 300; ++step) {
      const data::SparseFeature ids =
          SkewedIds(rng, 500, 6, 4, /*repeats=*/true);
      ASSERT_TRUE(m.Plan(ids).ok());
      const SlotPlan& plan = m.plan();
      std::vector<int64_t> sorted = plan.slots;
      std::sort(sorted.begin(), sorted.end());
      ASSERT_EQ(std::adjacent_find(sorted.begin(), sorted.end()), sorted.end());
      std::vector<int64_t> expected_writeback;
      for (size_t k = 0; k < plan.rows.size(); ++k) {
        const int64_t slot = plan.slots[k];
        const bool miss =
            std::find(plan.misses.begin(), plan.misses.end(),
                      static_cast<int64_t>(k)) != plan.misses.end();
        if (!miss) {
          ASSERT_EQ(holder[slot], plan.rows[k]);
        } else if (holder[slot] >= 0 && dirty[slot]) {
          expected_writeback.push_back(holder[slot]);
        }
      }
      std::sort(expected_writeback.begin(), expected_writeback.end());
      ASSERT_EQ(plan.writeback_rows, expected_writeback);
      m.Commit();
      // Evicted rows leave their slots; loaded rows start clean.
      for (const int64_t k : plan.misses) {
        if (holder[plan.slots[k]] >= 0) --resident;
        holder[plan.slots[k]] = plan.rows[k];
        dirty[plan.slots[k]] = false;
        ++resident;
      }
      ASSERT_EQ(m.resident(), resident);
      ASSERT_LE(resident, 40);
      for (size_t p = 0; p < ids.ids.size(); ++p) {
        ASSERT_EQ(holder[plan.remapped.ids[p]], ids.ids[p]);
      }
      if (rng.Below(2) == 0) {
        m.MarkBatchDirty();
        for (const int64_t slot : plan.slots) dirty[slot] = true;
      }
      for (int64_t s = 0; s < 40; ++s) {
        ASSERT_EQ(m.RowOf(s), holder[s]);
        if (holder[s] >= 0) {
          ASSERT_EQ(m.SlotOf(holder[s]), s);
        }
        ASSERT_EQ(m.IsDirty(s), static_cast<bool>(dirty[s]));
      }
    }
  }
}

// ------------------------------------------------------------ CachedStore

// Trains `store` and a HostStore of the same spec on the same skewed
// batches: pooled outputs bitwise at every step, every record (weights and
// optimizer state) and the step at the end, and midway. `prefetch`: 0 none,
// 1 the next batch after Prepare (as the model does), 2 before it.
// Midway, records are read (ReadRows of the whole table, resident or not)
// and a few rows written (WriteRows) on both, and the store flushed.
void TrainAndCompare(const TableSpec& spec, CachedStore& store, int steps,
                     int64_t bags, int max_hot, int prefetch, uint64_t seed) {
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  HostStore reference(spec);
  Rng rng(seed);
  std::vector<data::SparseFeature> batches;
  for (int i = 0; i <= steps; ++i) {
    batches.push_back(
        SkewedIds(rng, spec.rows, bags, max_hot, /*repeats=*/true));
  }
  const int dim = spec.dim;
  const int floats = RecordFloats(spec);
  std::vector<float> out_ref(bags * dim), out_store(bags * dim);
  for (int i = 0; i < steps; ++i) {
    const data::SparseFeature& ids = batches[i];
    absl::StatusOr<const data::SparseFeature*> prepared =
        test::PrepareWithPrefetch(store, batches, i, prefetch);
    ASSERT_TRUE(prepared.ok()) << prepared.status();
    ASSERT_NE(*prepared, &ids);
    ASSERT_TRUE(reference.Forward(ids, out_ref.data(), dim).ok());
    ASSERT_TRUE(store.Forward(**prepared, out_store.data(), dim).ok());
    ASSERT_TRUE(BitwiseEqual(out_ref, out_store)) << "forward, step " << i;
    const std::vector<float> grad = RandomGrad(rng, bags, dim);
    ASSERT_TRUE(reference.BackwardUpdate(ids, grad.data(), dim).ok());
    ASSERT_TRUE(store.BackwardUpdate(**prepared, grad.data(), dim).ok());
    if (i == steps / 2) {
      ASSERT_TRUE(BitwiseEqual(AllRecords(store), AllRecords(reference)))
          << "records midway";
      // Rows 0..5 (hot, resident) and the last rows (likely not) set to
      // new records on both.
      std::vector<float> records(6 * floats);
      for (float& x : records) x = static_cast<float>(rng.Uniform(0.1, 0.2));
      for (const int64_t begin : {int64_t{0}, spec.rows - 6}) {
        ASSERT_TRUE(store.WriteRows(begin, 6, records.data()).ok());
        ASSERT_TRUE(reference.WriteRows(begin, 6, records.data()).ok());
      }
      ASSERT_TRUE(store.Flush().ok());
      // Flushed: the backing store holds the whole table and the step.
      ASSERT_TRUE(
          BitwiseEqual(AllRecords(store.backing()), AllRecords(reference)))
          << "backing store after Flush";
      EXPECT_EQ(store.backing().step(), reference.step());
    }
  }
  EXPECT_EQ(store.step(), reference.step());
  EXPECT_TRUE(BitwiseEqual(AllRecords(store), AllRecords(reference)));
  ASSERT_TRUE(store.Flush().ok());
  EXPECT_TRUE(BitwiseEqual(AllRecords(store.backing()), AllRecords(reference)));
  EXPECT_EQ(store.backing().step(), reference.step());
}

class CachedStoreEquivalenceTest
    : public testing::TestWithParam<test::StoreCase> {};

// A table 25x its cache, against the same table in host memory, for every
// embedding optimizer, both poolings and both policies, in every prefetch
// mode, with the rows moved through the cache's records and staging and
// moved directly between the slots and the HostStore's arrays: both
// bitwise like the table, and so like each other, with the same hits,
// misses, evictions and write-backs.
TEST_P(CachedStoreEquivalenceTest, TwentyFiveTimesOverCapacityIsBitwise) {
  const auto [type, pooling, eviction] = GetParam();
  // Prefetch modes 1 and 2 with the reads on the caller's thread and on the
  // store's own.
  for (const auto& [prefetch, background] :
       {std::pair{0, false}, std::pair{1, false}, std::pair{2, false},
        std::pair{1, true}, std::pair{2, true}}) {
    SCOPED_TRACE(testing::Message()
                 << "prefetch mode " << prefetch
                 << (background ? " in the background" : " on the caller"));
    const TableSpec spec = MakeSpec(2500, 16, pooling, type);
    const uint64_t seed = kSeed + 10 * static_cast<int>(type) + prefetch;
    std::vector<float> records[2];
    StoreMetrics metrics[2];
    for (const bool direct : {false, true}) {
      SCOPED_TRACE(direct ? "direct" : "staged");
      std::unique_ptr<CachedStore> store =
          HostCache(spec, 100, eviction, background, direct);
      ASSERT_NE(store, nullptr);
      EXPECT_EQ(store->memory_space(), MemorySpace::kHost);
      EXPECT_EQ(store->direct(), direct);
      TrainAndCompare(spec, *store, /*steps=*/30, /*bags=*/16, /*max_hot=*/4,
                      prefetch, seed);
      records[direct] = AllRecords(*store);
      const StoreMetrics m = metrics[direct] = store->metrics();
      // The table really spilled: rows were evicted, written back and
      // loaded.
      EXPECT_GT(m.evictions, 0);
      EXPECT_GT(m.rows_written, 0);
      EXPECT_GT(m.rows_read, 0);
      EXPECT_GT(m.hits, 0);
      if (prefetch > 0 && !direct) {
        EXPECT_GT(m.prefetch_hits, 0);
      } else {
        // The direct path stages nothing: every miss is read from the
        // backing table.
        EXPECT_EQ(m.prefetch_hits, 0);
      }
      if (direct || prefetch == 0) {
        EXPECT_EQ(m.rows_read, m.misses);
      }
      EXPECT_EQ(m.bytes_read, m.rows_read * RecordFloats(spec) * 4);
      EXPECT_EQ(m.bytes_written, m.rows_written * RecordFloats(spec) * 4);
    }
    EXPECT_TRUE(BitwiseEqual(records[0], records[1])) << "direct vs staged";
    EXPECT_EQ(metrics[0].hits, metrics[1].hits);
    EXPECT_EQ(metrics[0].misses, metrics[1].misses);
    EXPECT_EQ(metrics[0].evictions, metrics[1].evictions);
    EXPECT_EQ(metrics[0].rows_written, metrics[1].rows_written);
  }
}

INSTANTIATE_TEST_SUITE_P(
    All, CachedStoreEquivalenceTest,
    testing::Combine(
        testing::Values(OptimizerConfig::SGD, OptimizerConfig::ADAGRAD,
                        OptimizerConfig::ROWWISE_ADAGRAD,
                        OptimizerConfig::ADAM),
        testing::Values(POOLING_SUM, POOLING_MEAN),
        testing::Values(EvictionPolicy::kLru, EvictionPolicy::kLfu)),
    test::StoreCaseName);

// A shard (a slice of a bigger table) with an odd dim: the backing store
// initialises the slice's rows, the cache only moves them.
TEST(CachedStoreTest, ShardWithOddDimIsBitwise) {
  TableSpec spec = MakeSpec(700, 7, POOLING_MEAN, OptimizerConfig::ADAM);
  spec.slice = TableSlice{5000, 1200, 3};
  for (const bool direct : {false, true}) {
    SCOPED_TRACE(direct ? "direct" : "staged");
    std::unique_ptr<CachedStore> store =
        HostCache(spec, 60, EvictionPolicy::kLru, true, direct);
    ASSERT_NE(store, nullptr);
    TrainAndCompare(spec, *store, 20, 12, 4, 1, kSeed + 77);
  }
}

// A cache of 8 slots under batches of up to 8 unique rows from 32 hot ones
// and the rest of the table: most steps evict, nearly all dirty, over SGD,
// row-wise Adagrad and Adam, LRU and LFU, with the next batch prefetched.
// Direct and staged both train bitwise like the table, with the same
// counters, and the direct path reads every miss from the table.
TEST(CachedStoreTest, TinyCacheDirectAndStagedAreBitwise) {
  for (const auto type :
       {OptimizerConfig::SGD, OptimizerConfig::ROWWISE_ADAGRAD,
        OptimizerConfig::ADAM}) {
    for (const EvictionPolicy eviction :
         {EvictionPolicy::kLru, EvictionPolicy::kLfu}) {
      SCOPED_TRACE(testing::Message()
                   << OptimizerConfig::Type_Name(type)
                   << (eviction == EvictionPolicy::kLru ? " LRU" : " LFU"));
      const TableSpec spec = MakeSpec(1000, 8, POOLING_SUM, type);
      constexpr int kSteps = 40;
      StoreMetrics metrics[2];
      for (const bool direct : {false, true}) {
        SCOPED_TRACE(direct ? "direct" : "staged");
        std::unique_ptr<CachedStore> store =
            HostCache(spec, 8, eviction, /*background_prefetch=*/false, direct);
        ASSERT_NE(store, nullptr);
        TrainAndCompare(spec, *store, kSteps, /*bags=*/2, /*max_hot=*/4,
                        /*prefetch=*/1, kSeed + 300 + static_cast<int>(type));
        metrics[direct] = store->metrics();
      }
      const StoreMetrics& d = metrics[1];
      const StoreMetrics& staged = metrics[0];
      std::printf("misses %lld evictions %lld rows written %lld\n",
                  static_cast<long long>(d.misses),
                  static_cast<long long>(d.evictions),
                  static_cast<long long>(d.rows_written));
      EXPECT_GT(d.evictions, kSteps / 2);
      EXPECT_GT(d.rows_written, kSteps / 2);
      EXPECT_EQ(d.rows_read, d.misses);
      EXPECT_EQ(d.prefetch_hits, 0);
      EXPECT_EQ(d.hits, staged.hits);
      EXPECT_EQ(d.misses, staged.misses);
      EXPECT_EQ(d.evictions, staged.evictions);
      EXPECT_EQ(d.rows_written, staged.rows_written);
      EXPECT_GT(staged.prefetch_hits, 0);
    }
  }
}

// HostSlots' direct path on its own: whole records (weights and optimizer
// state) copied from a table's rows into slots and back, equal to the
// records ReadRecord gives; a table of another shape is not mapped, and an
// unmapped table is refused.
TEST(HostSlotsTest, LoadAndStoreRowsCopyWholeRecords) {
  const TableSpec spec = MakeSpec(50, 6, POOLING_SUM, OptimizerConfig::ADAM);
  const int floats = RecordFloats(spec);
  HostStore backing(spec);
  EmbeddingTable& table = backing.table();
  Rng rng(kSeed + 5);
  for (int64_t r = 0; r < spec.rows; ++r) {
    std::vector<float> record(floats);
    for (float& x : record) x = static_cast<float>(rng.Normal());
    table.WriteRecord(r, record.data());
  }
  HostSlots slots(spec, 10);
  ASSERT_TRUE(slots.MapHostTable(table));
  const std::vector<int64_t> rows = {7, 49, 0, 13, 22};
  const std::vector<int64_t> where = {9, 0, 4, 5, 1};
  ASSERT_TRUE(slots.LoadRows(table, rows.data(), where.data(), 5).ok());
  std::vector<float> got(5 * floats), want(floats);
  ASSERT_TRUE(slots.ReadSlots(where.data(), 5, got.data()).ok());
  for (int i = 0; i < 5; ++i) {
    table.ReadRecord(rows[i], want.data());
    EXPECT_EQ(std::memcmp(got.data() + i * floats, want.data(),
                          floats * sizeof(float)),
              0)
        << "row " << rows[i];
  }
  // Slots 9 and 0 (rows 7 and 49) stored into rows 30 and 31.
  const std::vector<int64_t> to = {30, 31};
  ASSERT_TRUE(slots.StoreRows(where.data(), to.data(), 2, table).ok());
  std::vector<float> stored(floats);
  for (int i = 0; i < 2; ++i) {
    table.ReadRecord(to[i], stored.data());
    EXPECT_EQ(std::memcmp(stored.data(), got.data() + i * floats,
                          floats * sizeof(float)),
              0)
        << "row " << to[i];
  }

  HostStore other(spec);
  EXPECT_EQ(slots.LoadRows(other.table(), rows.data(), where.data(), 1).code(),
            absl::StatusCode::kFailedPrecondition);
  HostStore wider(MakeSpec(50, 8, POOLING_SUM, OptimizerConfig::ADAM));
  EXPECT_FALSE(slots.MapHostTable(wider.table()));
  EXPECT_EQ(slots.StoreRows(where.data(), to.data(), 1, table).code(),
            absl::StatusCode::kFailedPrecondition);
}

// Prepares `ids` on `store` and updates it and `reference` alike with a
// gradient of 0.5 in every column of every bag.
void StepBeside(CachedStore& store, HostStore& reference,
                const data::SparseFeature& ids) {
  const int dim = store.spec().dim;
  const std::vector<float> grad(ids.num_bags() * dim, 0.5f);
  auto p = store.Prepare(ids);
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_TRUE(store.BackwardUpdate(**p, grad.data(), dim).ok());
  ASSERT_TRUE(reference.BackwardUpdate(ids, grad.data(), dim).ok());
}

// A row staged by a prefetch must not shadow a newer value: row 9 is
// staged, loaded by a batch in between (consuming the staging), updated and
// evicted; row 0 is resident (not staged), evicted dirty in between. The
// next batch must see both updates; WriteRows drops a staged copy too.
TEST(CachedStoreTest, PrefetchedRowsEvictedOrUpdatedInBetween) {
  const TableSpec spec = MakeSpec(10, 8, POOLING_SUM, OptimizerConfig::ADAM);
  std::unique_ptr<CachedStore> store = BackgroundLruCache(spec, 3);
  ASSERT_NE(store, nullptr);
  HostStore reference(spec);
  StepBeside(*store, reference, Bag({0}));
  ASSERT_TRUE(store->Prefetch(Bag({0, 9})).ok());
  StepBeside(*store, reference,
             Bag({9, 1, 2}));  // Takes 9 from staging; evicts 0 (dirty).
  EXPECT_EQ(store->metrics().prefetch_hits, 1);
  EXPECT_FALSE(store->IsResident(0));
  EXPECT_TRUE(store->IsDirty(9));
  StepBeside(*store, reference, Bag({3, 4, 5}));  // Evicts 9 (dirty), 1, 2.
  EXPECT_FALSE(store->IsResident(9));
  StepBeside(*store, reference, Bag({0, 9}));
  ASSERT_TRUE(store->Prefetch(Bag({0, 9, 6, 7})).ok());
  // Row 7 staged, then written: the batch must load the written record.
  const int floats = RecordFloats(spec);
  std::vector<float> record(floats, 0.25f);
  ASSERT_TRUE(store->WriteRows(7, 1, record.data()).ok());
  ASSERT_TRUE(reference.WriteRows(7, 1, record.data()).ok());
  StepBeside(*store, reference, Bag({0, 9, 6}));
  StepBeside(*store, reference, Bag({7}));
  EXPECT_EQ(store->metrics().prefetch_hits, 2);  // 6; not 7.
  EXPECT_TRUE(BitwiseEqual(AllRecords(*store), AllRecords(reference)));
}

// RocksDB under the host tier: the cache's backing store is a RocksDB row
// cache (itself much smaller than the table), and the table still trains
// bitwise like host memory, under LRU and LFU, with the prefetch's reads on
// the caller's thread and in the background; a flush reaches RocksDB.
TEST(CachedStoreTest, OverRocksDbIsBitwise) {
  for (const EvictionPolicy eviction :
       {EvictionPolicy::kLru, EvictionPolicy::kLfu}) {
    for (const bool background : {false, true}) {
      SCOPED_TRACE(testing::Message()
                   << (eviction == EvictionPolicy::kLru ? "LRU" : "LFU")
                   << (background ? ", background prefetch" : ""));
      TempDatabase db("cached_store_test");
      ASSERT_NE(db.db(), nullptr);
      const TableSpec spec =
          MakeSpec(2000, 16, POOLING_SUM, OptimizerConfig::ROWWISE_ADAGRAD);
      std::unique_ptr<CachedStore> store = HostCache(
          spec, 80, eviction, db.Store(spec, /*cache_rows=*/300), background);
      ASSERT_NE(store, nullptr);
      // Only a HostStore's rows are read directly.
      EXPECT_FALSE(store->direct());
      TrainAndCompare(spec, *store, 30, 16, 4, 1,
                      kSeed + 500 + static_cast<int>(eviction));
      EXPECT_GT(store->backing().metrics().rows_written, 0);
      EXPECT_GT(store->metrics().prefetch_hits, 0);
    }
  }
}

// Read after write across consecutive batches: a cache of 2 slots, every
// batch's 2 rows updated, so Prepare(batch i) evicts the rows of batch i - 1
// dirty and writes them back, and the Prefetch of batch i + 1 right after
// it (the same rows as batch i - 1) must read those written values, not the
// ones before. Bitwise like the table in host memory over host memory and
// over RocksDB, LRU and LFU, background and synchronous prefetch, and every
// miss after the first two batches comes from the staging.
TEST(CachedStoreTest, PrefetchReadsRowsEvictedByTheBatchBefore) {
  const TableSpec spec = MakeSpec(10, 4, POOLING_SUM, OptimizerConfig::ADAM);
  for (const bool over_rocksdb : {false, true}) {
    for (const EvictionPolicy eviction :
         {EvictionPolicy::kLru, EvictionPolicy::kLfu}) {
      for (const bool background : {false, true}) {
        SCOPED_TRACE(testing::Message()
                     << (over_rocksdb ? "RocksDB" : "host") << " backing, "
                     << (eviction == EvictionPolicy::kLru ? "LRU" : "LFU")
                     << (background ? ", background prefetch" : ""));
        TempDatabase db("cached_store_raw_test");
        ASSERT_NE(db.db(), nullptr);
        std::unique_ptr<EmbeddingStore> backing =
            over_rocksdb ? db.Store(spec, /*cache_rows=*/2)
                         : std::make_unique<HostStore>(spec);
        std::unique_ptr<CachedStore> store =
            HostCache(spec, 2, eviction, std::move(backing), background,
                      /*direct=*/false);
        ASSERT_NE(store, nullptr);
        HostStore reference(spec);
        const std::vector<data::SparseFeature> batches = {Bag({1, 2}),
                                                          Bag({3, 4})};
        std::vector<float> out_ref(4), out_store(4), grad(4);
        constexpr int kSteps = 12;
        for (int i = 0; i < kSteps; ++i) {
          const data::SparseFeature& ids = batches[i % 2];
          auto p = store->Prepare(ids);
          ASSERT_TRUE(p.ok()) << p.status();
          // Batch i + 1's rows were evicted by this Prepare, dirty.
          ASSERT_TRUE(store->Prefetch(batches[(i + 1) % 2]).ok());
          ASSERT_TRUE(reference.Forward(ids, out_ref.data(), 4).ok());
          ASSERT_TRUE(store->Forward(**p, out_store.data(), 4).ok());
          ASSERT_TRUE(BitwiseEqual(out_ref, out_store)) << "step " << i;
          for (int d = 0; d < 4; ++d) grad[d] = 0.25f * (i + 1) - 0.1f * d;
          ASSERT_TRUE(reference.BackwardUpdate(ids, grad.data(), 4).ok());
          ASSERT_TRUE(store->BackwardUpdate(**p, grad.data(), 4).ok());
        }
        EXPECT_TRUE(BitwiseEqual(AllRecords(*store), AllRecords(reference)));
        const StoreMetrics m = store->metrics();
        EXPECT_EQ(m.misses, 2 * kSteps);
        EXPECT_EQ(m.prefetch_hits, 2 * (kSteps - 1));
        EXPECT_EQ(m.evictions, 2 * (kSteps - 1));
        EXPECT_EQ(m.rows_written, 2 * (kSteps - 1));
      }
    }
  }
}

// A Prefetch whose batch is never prepared, followed by other batches,
// writes and flushes: its staged rows never shadow newer values, and the
// background read is waited for by every call that touches the backing
// store (a store destroyed with a read in flight waits for it).
TEST(CachedStoreTest, BackgroundPrefetchIsWaitedForEverywhere) {
  const TableSpec spec = MakeSpec(40, 4, POOLING_MEAN, OptimizerConfig::SGD);
  std::unique_ptr<CachedStore> store = BackgroundLruCache(spec, 4);
  ASSERT_NE(store, nullptr);
  HostStore reference(spec);
  const int floats = RecordFloats(spec);
  std::vector<float> record(floats, 0.75f);
  for (int round = 0; round < 20; ++round) {
    const int64_t a = round % 40, b = (round * 7 + 3) % 40;
    StepBeside(*store, reference, Bag({a, b}));
    ASSERT_TRUE(store->Prefetch(Bag({(a + 1) % 40, (b + 5) % 40, 39})).ok());
    switch (round % 4) {
      case 0:
        ASSERT_TRUE(store->WriteRows(39, 1, record.data()).ok());
        ASSERT_TRUE(reference.WriteRows(39, 1, record.data()).ok());
        break;
      case 1:
        ASSERT_TRUE(store->Flush().ok());
        break;
      case 2:
        ASSERT_TRUE(BitwiseEqual(AllRecords(*store), AllRecords(reference)));
        break;
      default:
        break;
    }
  }
  EXPECT_TRUE(BitwiseEqual(AllRecords(*store), AllRecords(reference)));
  ASSERT_TRUE(store->Prefetch(Bag({1, 2, 3, 4, 5})).ok());
  store.reset();
}

TEST(CachedStoreTest, RefusedCallsAndUnchangedRows) {
  const TableSpec spec = MakeSpec(50, 4, POOLING_SUM, OptimizerConfig::SGD);
  std::unique_ptr<CachedStore> store = HostCache(spec, 4, EvictionPolicy::kLru);
  ASSERT_NE(store, nullptr);
  std::vector<float> grad(8, 1.0f), out(8);
  auto p = store->Prepare(Bag({1, 2}));
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_TRUE(store->BackwardUpdate(**p, grad.data(), 4).ok());
  const std::vector<float> before = AllRecords(*store);

  // Bad ids and too many unique ids: refused, nothing changes.
  absl::StatusOr<const data::SparseFeature*> bad = store->Prepare(Bag({3, 50}));
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_HAS_SUBSTR(bad.status().message(), "table 5");
  bad = store->Prepare(Bag({3, 4, 5, 6, 7}));
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(BitwiseEqual(AllRecords(*store), before));
  EXPECT_TRUE(store->IsDirty(1));
  // The earlier prepared batch is no longer the last successful Prepare's.
  EXPECT_EQ(store->Forward(**p, out.data(), 4).code(),
            absl::StatusCode::kFailedPrecondition);
  const data::SparseFeature other = Bag({1});
  p = store->Prepare(Bag({1}));
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(store->Forward(other, out.data(), 4).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(store->BackwardUpdate(other, grad.data(), 4).code(),
            absl::StatusCode::kFailedPrecondition);

  // Record ranges outside the table.
  EXPECT_EQ(store->ReadRows(48, 3, out.data()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store->WriteRows(-1, 1, out.data()).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(CachedStoreTest, CreateChecksItsParts) {
  const TableSpec spec = MakeSpec(50, 4, POOLING_SUM, OptimizerConfig::ADAM);
  CacheOptions options;
  // CachedStore::Create's status with `slots` host slots over `backing`.
  auto create = [&](int64_t slots, std::unique_ptr<EmbeddingStore> backing) {
    return CachedStore::Create(spec, options,
                               std::make_unique<HostSlots>(spec, slots),
                               std::move(backing))
        .status();
  };
  options.cache_rows = 0;
  EXPECT_EQ(create(1, std::make_unique<HostStore>(spec)).code(),
            absl::StatusCode::kInvalidArgument);
  options.cache_rows = 8;
  // Slots of another count, a backing store of another shape, none.
  EXPECT_EQ(create(4, std::make_unique<HostStore>(spec)).code(),
            absl::StatusCode::kInvalidArgument);
  const TableSpec other = MakeSpec(50, 4, POOLING_SUM, OptimizerConfig::SGD);
  const absl::Status st = create(8, std::make_unique<HostStore>(other));
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_HAS_SUBSTR(st.message(), "table 5") << st;
  EXPECT_EQ(create(8, nullptr).code(), absl::StatusCode::kInvalidArgument);
  // The backing store's step carries over.
  auto backing = std::make_unique<HostStore>(spec);
  backing->set_step(41);
  auto store = CachedStore::Create(
      spec, options, std::make_unique<HostSlots>(spec, 8), std::move(backing));
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ((*store)->step(), 41);
}

// The factory's device tier with a cache: validated options, and without
// a GPU a FailedPrecondition naming the table
// (tests/embedding/cuda_store_test.cc covers it with one).
TEST(CachedStoreTest, DeviceCacheOptionsAndFactory) {
  StoreOptions options;
  options.kind = StoreKind::kDevice;
  options.device_cache.cache_rows = -1;
  EXPECT_EQ(options.Validate().code(), absl::StatusCode::kInvalidArgument);
  options.device_cache.cache_rows = 16;
  options.device_cache.eviction = static_cast<EvictionPolicy>(7);
  EXPECT_EQ(options.Validate().code(), absl::StatusCode::kInvalidArgument);
  options.device_cache.eviction = EvictionPolicy::kLfu;
  EXPECT_TRUE(options.Validate().ok());
  // RocksDB under the device cache: its options are checked; no other tier.
  options.device_cache_backing = StoreKind::kRocksDbCache;
  absl::Status st = options.Validate();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_HAS_SUBSTR(st.message(), "RocksDbStoreOptions.path") << st;
  options.rocksdb.path = testing::TempDir() + "/unused";
  EXPECT_TRUE(options.Validate().ok());
  options.device_cache_backing = StoreKind::kDevice;
  st = options.Validate();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_HAS_SUBSTR(st.message(), "device_cache_backing") << st;
  options.device_cache_backing = StoreKind::kHost;
  if (CudaDeviceCount() > 0) {
    GTEST_SKIP() << "a CUDA device is present: the device cache is tested by "
                    "cuda_store_test";
  }
  const TableSpec spec = MakeSpec(50, 4, POOLING_SUM, OptimizerConfig::SGD);
  st = CreateEmbeddingStore(spec, options, nullptr).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
  EXPECT_HAS_SUBSTR(st.message(), "table 5") << st;
}

}  // namespace
}  // namespace dlrm::embedding
