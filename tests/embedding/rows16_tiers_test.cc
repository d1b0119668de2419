// Tests for 16-bit embedding rows on the tiers with slots: the RocksDB tier
// (RocksDbCachedStore: 16-bit slots and 16-bit values in the database) and
// the host-memory cache (CachedStore over HostSlots, in front of a host or
// a RocksDB store). Each trains bitwise like the host tier's 16-bit table
// (HostStore), with rows evicted and re-read, through a reopen, and on a
// shard; the database's values take 2 bytes a weight.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/random.h"
#include "embedding/cached_store.h"
#include "embedding/embedding_store.h"
#include "embedding/planned_bytes.h"
#include "embedding/rocksdb_store.h"
#include "embedding/row_database.h"
#include "embedding/row_precision.h"
#include "tests/support/files.h"
#include "tests/support/table_spec.h"

namespace dlrm::embedding {
namespace {

constexpr uint64_t kSeed = 20261202;

std::string Case(RowPrecision p, OptimizerConfig::Type type) {
  return std::string(RowPrecision_Name(p)) + " " +
         OptimizerConfig::Type_Name(type);
}

// Bits of a's and b's floats that differ (up to 3 reported).
int64_t BitDifferences(const std::vector<float>& a, const std::vector<float>& b,
                       const std::string& what) {
  if (a.size() != b.size()) {
    ADD_FAILURE() << what << ": " << a.size() << " vs " << b.size();
    return -1;
  }
  int64_t differ = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0 && ++differ <= 3) {
      ADD_FAILURE() << what << " [" << i << "]: " << a[i] << " vs " << b[i];
    }
  }
  return differ;
}

TableSpec Spec16(RowPrecision p, OptimizerConfig::Type type, int64_t rows,
                 int dim, Pooling pooling = POOLING_SUM) {
  TableSpec spec = test::MakeTableSpec(4, rows, dim, pooling, type, kSeed);
  spec.precision = p;
  return spec;
}

RocksDbStoreOptions DbOptions(const std::filesystem::path& dir,
                              int64_t cache_rows) {
  RocksDbStoreOptions o;
  o.path = (dir / "db").string();
  o.cache_rows = cache_rows;
  o.block_cache_bytes = 8 << 20;
  return o;
}

// A RowDatabase under `dir` and a RocksDbCachedStore of a spec on it.
struct DbStore {
  std::unique_ptr<RowDatabase> db;
  std::unique_ptr<RocksDbCachedStore> store;

  // Closes the store, then its database.
  void Close() {
    store.reset();
    db.reset();
  }
};

// The database (DbOptions(dir, cache_rows)) and a store of `spec` on it;
// null members after a failed expectation naming the error.
DbStore OpenDbStore(const TableSpec& spec, const std::filesystem::path& dir,
                    int64_t cache_rows) {
  DbStore s;
  auto db = RowDatabase::Open(DbOptions(dir, cache_rows));
  EXPECT_TRUE(db.ok()) << db.status();
  if (!db.ok()) return s;
  s.db = *std::move(db);
  auto store =
      RocksDbCachedStore::Create(spec, DbOptions(dir, cache_rows), s.db.get());
  EXPECT_TRUE(store.ok()) << store.status();
  if (store.ok()) s.store = *std::move(store);
  return s;
}

// Trains `store` and a HostStore of its spec on the same `steps` batches
// (`prefetch` as test::PrepareWithPrefetch), checking the pooled outputs
// (and PoolReadOnly's, where the store reads beside the step) bitwise at
// every step and every record at the end. Returns the batches' rng state
// through `rng` so a caller can go on.
void TrainLikeHost(EmbeddingStore& store, HostStore& host, Rng& rng, int steps,
                   int64_t bags, int prefetch, const std::string& label) {
  const TableSpec& spec = store.spec();
  const int dim = spec.dim;
  std::vector<data::SparseFeature> batches;
  for (int i = 0; i <= steps; ++i) {
    batches.push_back(test::HotHalfIds(rng, spec.rows, bags, 4));
  }
  const bool read_beside = store.capabilities().read_beside_step;
  std::vector<float> out_host(bags * dim), out(bags * dim), read(bags * dim);
  for (int i = 0; i < steps; ++i) {
    SCOPED_TRACE(label + ", step " + std::to_string(i));
    absl::StatusOr<const data::SparseFeature*> prepared =
        test::PrepareWithPrefetch(store, batches, i, prefetch);
    ASSERT_TRUE(prepared.ok()) << prepared.status();
    absl::StatusOr<const data::SparseFeature*> host_ids =
        host.Prepare(batches[i]);
    ASSERT_TRUE(host_ids.ok()) << host_ids.status();
    ASSERT_TRUE(host.Forward(**host_ids, out_host.data(), dim).ok());
    ASSERT_TRUE(store.Forward(**prepared, out.data(), dim).ok());
    ASSERT_EQ(BitDifferences(out, out_host, "forward"), 0);
    if (read_beside) {
      ASSERT_TRUE(store.PoolReadOnly(batches[i], read.data(), dim).ok());
      ASSERT_EQ(BitDifferences(read, out_host, "PoolReadOnly"), 0);
    }
    const std::vector<float> grad = test::RandomGrad(rng, bags, dim);
    ASSERT_TRUE(host.BackwardUpdate(**host_ids, grad.data(), dim).ok());
    ASSERT_TRUE(store.BackwardUpdate(**prepared, grad.data(), dim).ok());
  }
  EXPECT_EQ(store.step(), host.step());
  EXPECT_EQ(
      BitDifferences(test::AllRecords(store), test::AllRecords(host), label),
      0);
}

// A RocksDB table's cache of `cache_rows` (with 600 rows: a small cache
// evicts and re-reads rows every step, a big one never). A batch of `bags`
// bags of up to 4 ids must fit the cache (bags * 4 <= cache_rows).
TEST(RocksDb16Test, TrainsBitwiseLikeTheHostTier) {
  std::printf("seed %llu\n", static_cast<unsigned long long>(kSeed));
  for (RowPrecision p : {ROW_FP16, ROW_BF16}) {
    for (auto type : {OptimizerConfig::SGD, OptimizerConfig::ROWWISE_ADAGRAD,
                      OptimizerConfig::ADAM}) {
      for (int64_t cache_rows : {int64_t{100}, int64_t{600}}) {
        for (int prefetch : {0, 1}) {
          const std::string label = Case(p, type) + ", cache " +
                                    std::to_string(cache_rows) + ", prefetch " +
                                    std::to_string(prefetch);
          const std::filesystem::path dir = test::MakeTestDir();
          const TableSpec spec = Spec16(p, type, 600, 12, POOLING_MEAN);
          DbStore s = OpenDbStore(spec, dir, cache_rows);
          ASSERT_NE(s.store, nullptr);
          HostStore host(spec);
          Rng rng(kSeed + cache_rows + prefetch);
          TrainLikeHost(*s.store, host, rng, 6, 25, prefetch, label);
          if (cache_rows < 600) {
            EXPECT_GT(s.store->metrics().evictions, 0) << label;
            EXPECT_GT(s.store->metrics().rows_read, 0) << label;
          }
          s.Close();
          std::filesystem::remove_all(dir);
        }
      }
    }
  }
}

TEST(RocksDb16Test, AShardRoundsAsTheWholeTable) {
  // Rows [100, 400) and columns [4, 12) of a 500 x 16 table, on RocksDB,
  // against the same block on the host tier (which rounds as the whole
  // table does: row_precision_test).
  for (RowPrecision p : {ROW_FP16, ROW_BF16}) {
    const std::filesystem::path dir = test::MakeTestDir();
    TableSpec spec = Spec16(p, OptimizerConfig::ADAM, 300, 8);
    spec.slice = {500, 100, 4};
    DbStore s = OpenDbStore(spec, dir, 80);
    ASSERT_NE(s.store, nullptr);
    HostStore host(spec);
    Rng rng(kSeed + 7);
    TrainLikeHost(*s.store, host, rng, 5, 20, 1, RowPrecision_Name(p));
    s.Close();
    std::filesystem::remove_all(dir);
  }
}

TEST(RocksDb16Test, ValuesTakeTwoBytesAWeightAndSurviveAReopen) {
  const int dim = 16;
  for (RowPrecision p : {ROW_FP16, ROW_BF16}) {
    const std::filesystem::path dir = test::MakeTestDir();
    const TableSpec spec =
        Spec16(p, OptimizerConfig::ROWWISE_ADAGRAD, 500, dim);
    HostStore host(spec);
    Rng rng(kSeed + 11);
    {
      DbStore s = OpenDbStore(spec, dir, 120);
      ASSERT_NE(s.store, nullptr);
      TrainLikeHost(*s.store, host, rng, 4, 30, 0, "before the reopen");
      ASSERT_TRUE(s.store->Flush().ok());
      const StoreMetrics m = s.store->metrics();
      ASSERT_GT(m.rows_written, 0);
      // dim 16-bit words and one float of row-wise Adagrad state a value.
      EXPECT_EQ(m.bytes_written, m.rows_written * (dim * 2 + 4));
      EXPECT_EQ(m.bytes_read, m.rows_read * (dim * 2 + 4));
    }
    // The rows and the step counter come back from the database.
    DbStore s = OpenDbStore(spec, dir, 120);
    ASSERT_NE(s.store, nullptr);
    EXPECT_EQ(s.store->step(), 4);
    TrainLikeHost(*s.store, host, rng, 3, 30, 1, "after the reopen");
    s.Close();
    std::filesystem::remove_all(dir);
  }
}

TEST(RocksDb16Test, AValueOfAnotherPrecisionIsDataLossNamingIt) {
  const std::filesystem::path dir = test::MakeTestDir();
  TableSpec spec = Spec16(ROW_FP32, OptimizerConfig::SGD, 100, 8);
  {
    DbStore s = OpenDbStore(spec, dir, 10);
    ASSERT_NE(s.store, nullptr);
    std::vector<float> record(8, 0.5f);
    ASSERT_TRUE(s.store->WriteRows(3, 1, record.data()).ok());
    ASSERT_TRUE(s.store->Flush().ok());
  }
  spec.precision = ROW_BF16;
  DbStore s = OpenDbStore(spec, dir, 10);
  ASSERT_NE(s.store, nullptr);
  std::vector<float> record(8);
  const absl::Status st = s.store->ReadRows(3, 1, record.data());
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << st;
  EXPECT_NE(st.message().find("ROW_BF16"), std::string::npos) << st;
  s.Close();
  std::filesystem::remove_all(dir);
}

TEST(RocksDb16Test, RecordsWrittenInFp32AreRoundedToNearest) {
  // A restore from fp32 rows writes fp32 records: the tier keeps them
  // rounded to nearest, as the host tier's WriteRows does.
  for (RowPrecision p : {ROW_FP16, ROW_BF16}) {
    const std::filesystem::path dir = test::MakeTestDir();
    const TableSpec spec = Spec16(p, OptimizerConfig::ADAM, 50, 6);
    const int floats = 6 + StateFloatsPerRow(spec.optimizer, 6);
    Rng rng(kSeed + 3);
    std::vector<float> records(50 * floats);
    for (float& x : records) x = static_cast<float>(rng.Normal());
    DbStore s = OpenDbStore(spec, dir, 10);
    ASSERT_NE(s.store, nullptr);
    HostStore host(spec);
    ASSERT_TRUE(s.store->WriteRows(0, 50, records.data()).ok());
    ASSERT_TRUE(host.WriteRows(0, 50, records.data()).ok());
    EXPECT_EQ(BitDifferences(test::AllRecords(*s.store), test::AllRecords(host),
                             RowPrecision_Name(p)),
              0);
    s.Close();
    std::filesystem::remove_all(dir);
  }
}

// A CachedStore of host slots in front of a host store (direct or staged)
// or a RocksDB store, every one 16-bit.
TEST(CachedStore16Test, HostSlotsTrainBitwiseLikeTheHostTier) {
  for (RowPrecision p : {ROW_FP16, ROW_BF16}) {
    for (auto type : {OptimizerConfig::SGD, OptimizerConfig::ROWWISE_ADAGRAD,
                      OptimizerConfig::ADAM}) {
      for (int backing = 0; backing < 3; ++backing) {
        const std::string label =
            Case(p, type) + (backing == 0   ? ", direct"
                             : backing == 1 ? ", staged"
                                            : ", over RocksDB");
        const std::filesystem::path dir = test::MakeTestDir();
        const TableSpec spec = Spec16(p, type, 400, 10);
        std::unique_ptr<RowDatabase> db;
        std::unique_ptr<EmbeddingStore> behind;
        if (backing == 2) {
          auto opened = RowDatabase::Open(DbOptions(dir, 40));
          ASSERT_TRUE(opened.ok()) << opened.status();
          db = std::move(*opened);
          auto rocks =
              RocksDbCachedStore::Create(spec, DbOptions(dir, 40), db.get());
          ASSERT_TRUE(rocks.ok()) << rocks.status();
          behind = std::move(*rocks);
        } else {
          behind = std::make_unique<HostStore>(spec);
        }
        CacheOptions cache;
        cache.cache_rows = 120;
        cache.direct_host_access = backing == 0;
        auto cached = CachedStore::Create(
            spec, cache, std::make_unique<HostSlots>(spec, cache.cache_rows),
            std::move(behind));
        ASSERT_TRUE(cached.ok()) << cached.status();
        EXPECT_EQ((*cached)->direct(), backing == 0) << label;
        HostStore host(spec);
        Rng rng(kSeed + backing);
        TrainLikeHost(**cached, host, rng, 6, 30, 1, label);
        EXPECT_GT((*cached)->metrics().evictions, 0) << label;
        ASSERT_TRUE((*cached)->Flush().ok());
        cached->reset();
        db.reset();
        std::filesystem::remove_all(dir);
      }
    }
  }
}

TEST(CachedStore16Test, ABackingStoreOfAnotherPrecisionIsRefused) {
  const TableSpec spec = Spec16(ROW_BF16, OptimizerConfig::SGD, 100, 4);
  TableSpec fp32 = spec;
  fp32.precision = ROW_FP32;
  CacheOptions cache;
  cache.cache_rows = 10;
  auto cached = CachedStore::Create(
      spec, cache, std::make_unique<HostSlots>(spec, cache.cache_rows),
      std::make_unique<HostStore>(fp32));
  ASSERT_FALSE(cached.ok());
  EXPECT_EQ(cached.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(cached.status().message().find("ROW_FP32"), std::string::npos)
      << cached.status();
}

TEST(RocksDb16Test, PlannedBytesCountTwoBytesAWeight) {
  const OptimizerConfig adagrad =
      test::MakeOptimizer(OptimizerConfig::ROWWISE_ADAGRAD);
  TableConfig table;
  table.set_rows(10000);
  table.set_dim(32);
  table.set_storage(STORAGE_ROCKSDB);
  RocksDbConfig rocksdb;
  rocksdb.set_cache_rows(500);
  const Shard shard{0, 0, 10000, 0, 32};
  const StoreBytes fp32 = PlannedShardBytes(table, rocksdb, shard, adagrad);
  EXPECT_EQ(fp32.host, 500 * (32 * 4 + 4));
  EXPECT_EQ(fp32.disk, 10000 * (32 * 4 + 4));
  for (RowPrecision p : {ROW_FP16, ROW_BF16}) {
    table.set_weight_precision(p);
    const StoreBytes b = PlannedShardBytes(table, rocksdb, shard, adagrad);
    EXPECT_EQ(b.host, 500 * (32 * 2 + 4)) << RowPrecision_Name(p);
    EXPECT_EQ(b.disk, 10000 * (32 * 2 + 4)) << RowPrecision_Name(p);
    // The store's slots take what the plan says.
    const std::filesystem::path dir = test::MakeTestDir();
    TableSpec spec = Spec16(p, OptimizerConfig::ROWWISE_ADAGRAD, 10000, 32);
    DbStore s = OpenDbStore(spec, dir, 500);
    ASSERT_NE(s.store, nullptr);
    EXPECT_GE(s.store->MemoryBytes().host, b.host);
    EXPECT_EQ(TableBytes(*EmbeddingTable::SlotArray(4, 500, 32, POOLING_SUM,
                                                    spec.optimizer, p)),
              b.host);
    s.Close();
    std::filesystem::remove_all(dir);
  }
}

}  // namespace
}  // namespace dlrm::embedding
