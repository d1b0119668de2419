// Tests that each tier owns what callers used to ask a table's storage
// field: EmbeddingStore::capabilities (equal to the factory's
// TierCapabilities), MemoryBytes by place, and the checkpoint hook Save;
// and that model::ShardSet builds every store through the factory, owns
// its databases and stages a restore of the database form.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "core/config.h"
#include "embedding/cached_store.h"
#include "embedding/embedding_store.h"
#include "embedding/rocksdb_store.h"
#include "embedding/row_database.h"
#include "embedding/sharding.h"
#include "model/shard_set.h"
#include "tests/support/table_spec.h"

namespace dlrm {
namespace {

namespace fs = std::filesystem;
using embedding::CheckpointForm;
using embedding::EmbeddingStore;
using embedding::StoreCapabilities;
using embedding::StoreKind;
using embedding::StoreOptions;
using embedding::TableSpec;

constexpr uint64_t kSeed = 20261202;

// A fresh directory under the test's temporary directory, removed after.
class ScratchDir {
 public:
  ScratchDir() {
    path_ = (fs::path(::testing::TempDir()) /
             ("store_hooks_" + std::to_string(::getpid()) + "_" +
              std::to_string(counter_++)))
                .string();
    fs::remove_all(path_);
  }
  ~ScratchDir() { fs::remove_all(path_); }
  const std::string& path() const { return path_; }

 private:
  static inline int counter_ = 0;
  std::string path_;
};

// What a sink received from one Save.
class RecordingSink final : public embedding::RowsSink {
 public:
  absl::Status Tensors(const embedding::EmbeddingTable& rows,
                       std::unique_ptr<embedding::HostStore> copy) override {
    ++tensors;
    table = &rows;
    copied = copy != nullptr;
    weights.assign(rows.weights(), rows.weights() + rows.rows() * rows.dim());
    step = rows.step();
    return absl::OkStatus();
  }
  absl::Status Database(embedding::RowDatabase& db) override {
    ++databases;
    database = &db;
    return absl::OkStatus();
  }

  int tensors = 0;
  int databases = 0;
  const embedding::EmbeddingTable* table = nullptr;
  bool copied = false;
  std::vector<float> weights;
  int64_t step = -1;
  embedding::RowDatabase* database = nullptr;
};

TableSpec Spec(int64_t rows, int dim) {
  return test::MakeTableSpec(0, rows, dim, POOLING_SUM,
                             OptimizerConfig::ADAGRAD, kSeed);
}

void ExpectSame(const StoreCapabilities& a, const StoreCapabilities& b) {
  EXPECT_EQ(a.prefetch, b.prefetch);
  EXPECT_EQ(a.read_beside_step, b.read_beside_step);
  EXPECT_EQ(a.cache_rows, b.cache_rows);
  EXPECT_EQ(a.device_cache, b.device_cache);
  EXPECT_EQ(a.checkpoint, b.checkpoint);
}

// One training update on `ids` with a gradient of ones, so rows change.
void Train(EmbeddingStore& store, const data::SparseFeature& ids) {
  const int dim = store.spec().dim;
  absl::StatusOr<const data::SparseFeature*> prepared = store.Prepare(ids);
  ASSERT_TRUE(prepared.ok()) << prepared.status();
  const int64_t bags = static_cast<int64_t>(ids.offsets.size()) - 1;
  std::vector<float> grad(bags * dim, 1.0f);
  ASSERT_TRUE(store.BackwardUpdate(**prepared, grad.data(), dim).ok());
}

data::SparseFeature Ids(std::vector<int64_t> ids) {
  data::SparseFeature f;
  f.offsets = {0, static_cast<int64_t>(ids.size())};
  f.ids = std::move(ids);
  return f;
}

TEST(StoreHooksTest, HostStoreSavesItsOwnTableAndCountsItsArrays) {
  const TableSpec spec = Spec(1000, 8);
  absl::StatusOr<std::unique_ptr<EmbeddingStore>> store =
      embedding::CreateEmbeddingStore(spec, StoreOptions{}, nullptr);
  ASSERT_TRUE(store.ok()) << store.status();
  ExpectSame((*store)->capabilities(),
             embedding::TierCapabilities(StoreOptions{}, spec.rows));
  EXPECT_TRUE((*store)->capabilities().read_beside_step);
  EXPECT_FALSE((*store)->capabilities().prefetch);
  EXPECT_EQ((*store)->capabilities().cache_rows, 0);
  EXPECT_EQ((*store)->capabilities().checkpoint, CheckpointForm::kTensors);
  // Weights plus one row-wise Adagrad accumulator per row.
  const embedding::StoreBytes bytes = (*store)->MemoryBytes();
  EXPECT_EQ(bytes.host, 1000 * (8 + 1) * 4);
  EXPECT_EQ(bytes.device, 0);
  EXPECT_EQ(bytes.disk, 0);

  Train(**store, Ids({3, 7, 3}));
  RecordingSink sink;
  ASSERT_TRUE((*store)->Save(sink).ok());
  EXPECT_EQ(sink.tensors, 1);
  EXPECT_EQ(sink.databases, 0);
  EXPECT_FALSE(sink.copied);  // the table itself, not a copy
  auto* host = dynamic_cast<embedding::HostStore*>(store->get());
  ASSERT_NE(host, nullptr);
  EXPECT_EQ(sink.table, &host->table());
  EXPECT_EQ(sink.step, 1);
}

TEST(StoreHooksTest, RocksDbStoreFlushesAndSavesItsDatabase) {
  ScratchDir dir;
  embedding::RocksDbStoreOptions db_options;
  db_options.path = dir.path();
  absl::StatusOr<std::unique_ptr<embedding::RowDatabase>> db =
      embedding::RowDatabase::Open(db_options);
  ASSERT_TRUE(db.ok()) << db.status();
  const TableSpec spec = Spec(5000, 16);
  StoreOptions options;
  options.kind = StoreKind::kRocksDbCache;
  options.rocksdb = db_options;
  options.rocksdb.cache_rows = 64;
  absl::StatusOr<std::unique_ptr<EmbeddingStore>> store =
      embedding::CreateEmbeddingStore(spec, options, db->get());
  ASSERT_TRUE(store.ok()) << store.status();
  const StoreCapabilities c = (*store)->capabilities();
  ExpectSame(c, embedding::TierCapabilities(options, spec.rows));
  EXPECT_TRUE(c.prefetch);
  EXPECT_TRUE(c.read_beside_step);
  EXPECT_EQ(c.cache_rows, 64);
  EXPECT_FALSE(c.device_cache);
  EXPECT_EQ(c.checkpoint, CheckpointForm::kDatabase);
  // The slots are host memory: 64 records of 16 weights and 1 state float.
  EXPECT_GE((*store)->MemoryBytes().host, 64 * (16 + 1) * 4);

  Train(**store, Ids({1, 2, 3}));
  auto* rocks = dynamic_cast<embedding::RocksDbCachedStore*>(store->get());
  ASSERT_NE(rocks, nullptr);
  ASSERT_TRUE(rocks->IsDirty(1));
  RecordingSink sink;
  ASSERT_TRUE((*store)->Save(sink).ok());
  EXPECT_EQ(sink.tensors, 0);
  EXPECT_EQ(sink.databases, 1);
  EXPECT_EQ(sink.database, db->get());
  EXPECT_FALSE(rocks->IsDirty(1));  // Save flushed first

  // Once RocksDB wrote files, the rows count on disk.
  ScratchDir checkpoint;
  ASSERT_TRUE((*db)->Checkpoint(checkpoint.path()).ok());
  EXPECT_GT((*store)->MemoryBytes().disk, 0);
}

TEST(StoreHooksTest, HostCacheSavesAHostCopyEqualToItsRows) {
  const TableSpec spec = Spec(300, 4);
  embedding::CacheOptions cache;
  cache.cache_rows = 32;
  cache.direct_host_access = false;
  cache.background_prefetch = false;
  auto backing = std::make_unique<embedding::HostStore>(spec);
  auto slots = std::make_unique<embedding::HostSlots>(spec, cache.cache_rows);
  absl::StatusOr<std::unique_ptr<embedding::CachedStore>> store =
      embedding::CachedStore::Create(spec, cache, std::move(slots),
                                     std::move(backing));
  ASSERT_TRUE(store.ok()) << store.status();
  const StoreCapabilities c = (*store)->capabilities();
  EXPECT_EQ(c.cache_rows, 32);
  EXPECT_FALSE(c.device_cache);  // host slots
  EXPECT_FALSE(c.prefetch);
  EXPECT_FALSE(c.read_beside_step);
  EXPECT_EQ(c.checkpoint, CheckpointForm::kTensors);
  // The slots plus the whole table behind them.
  EXPECT_EQ((*store)->MemoryBytes().host, (32 + 300) * (4 + 1) * 4);

  Train(**store, Ids({5, 9, 299}));
  RecordingSink sink;
  ASSERT_TRUE((*store)->Save(sink).ok());
  EXPECT_EQ(sink.tensors, 1);
  EXPECT_TRUE(sink.copied);
  EXPECT_EQ(sink.step, 1);
  std::vector<float> record(4 + 1);
  for (const int64_t row : {0, 5, 9, 299}) {
    ASSERT_TRUE((*store)->ReadRow(row, record.data()).ok());
    for (int c = 0; c < 4; ++c) {
      EXPECT_EQ(sink.weights[row * 4 + c], record[c]) << row;
    }
  }
}

TEST(StoreHooksTest, StoreOptionsForMapsEachTierOfTheConfig) {
  RocksDbConfig rocksdb;
  rocksdb.set_cache_rows(100);
  rocksdb.set_eviction(RocksDbConfig::LFU);
  TableConfig table;
  table.set_rows(1000);
  table.set_storage(STORAGE_HOST);
  StoreOptions o = embedding::StoreOptionsFor(table, rocksdb, 1000);
  EXPECT_EQ(o.kind, StoreKind::kHost);
  EXPECT_FALSE(embedding::NeedsDatabase(o));

  table.set_storage(STORAGE_ROCKSDB);
  o = embedding::StoreOptionsFor(table, rocksdb, 1000);
  EXPECT_EQ(o.kind, StoreKind::kRocksDbCache);
  EXPECT_EQ(o.rocksdb.cache_rows, CachedRows(rocksdb, 1000));
  EXPECT_EQ(o.rocksdb.eviction, embedding::EvictionPolicy::kLfu);
  EXPECT_TRUE(embedding::NeedsDatabase(o));
  EXPECT_EQ(embedding::TableCapabilities(table, rocksdb, 1000).checkpoint,
            CheckpointForm::kDatabase);

  table.set_storage(STORAGE_DEVICE);
  o = embedding::StoreOptionsFor(table, rocksdb, 1000);
  EXPECT_EQ(o.kind, StoreKind::kDevice);
  EXPECT_EQ(o.device_cache.cache_rows, 0);
  EXPECT_FALSE(embedding::NeedsDatabase(o));
  EXPECT_FALSE(
      embedding::TableCapabilities(table, rocksdb, 1000).read_beside_step);

  table.set_device_cache_rows(50);
  table.set_device_cache_backing(STORAGE_ROCKSDB);
  o = embedding::StoreOptionsFor(table, rocksdb, 1000);
  EXPECT_EQ(o.device_cache.cache_rows, 50);
  EXPECT_EQ(o.device_cache_backing, StoreKind::kRocksDbCache);
  EXPECT_TRUE(embedding::NeedsDatabase(o));
  const StoreCapabilities c =
      embedding::TableCapabilities(table, rocksdb, 1000);
  EXPECT_EQ(c.cache_rows, 50);
  EXPECT_TRUE(c.device_cache);
  // Saved as tensors whatever is behind the device cache.
  EXPECT_EQ(c.checkpoint, CheckpointForm::kTensors);
}

// Two tables, one in host memory and one on RocksDB, whole on one rank.
ModelConfig MixedConfig(const std::string& rocksdb_path) {
  ModelConfig config;
  config.set_seed(kSeed);
  config.mutable_sparse_optimizer()->set_type(OptimizerConfig::ADAGRAD);
  config.mutable_sparse_optimizer()->set_learning_rate(0.1f);
  config.mutable_rocksdb()->set_path(rocksdb_path);
  config.mutable_rocksdb()->set_cache_rows(16);
  for (int k = 0; k < 2; ++k) {
    TableConfig* t = config.add_tables();
    t->set_name(k == 0 ? "host" : "rocks");
    t->set_rows(k == 0 ? 200 : 400);
    t->set_dim(4);
    t->set_storage(k == 0 ? STORAGE_HOST : STORAGE_ROCKSDB);
  }
  return config;
}

TEST(ShardSetTest, BuildsEveryTierAndOwnsItsDatabase) {
  ScratchDir dir;
  const ModelConfig config = MixedConfig(dir.path());
  const embedding::ShardingPlan plan = embedding::WholeTablesPlan(config);
  const std::vector<model::ShardRef> refs = {{0, 0}, {1, 0}};
  std::string database_dir;
  {
    absl::StatusOr<std::unique_ptr<model::ShardSet>> set =
        model::ShardSet::Create(config, plan, 0, refs, nullptr);
    ASSERT_TRUE(set.ok()) << set.status();
    model::ShardSet& shards = **set;
    ASSERT_EQ(shards.size(), 2);
    EXPECT_TRUE(shards.has_database());
    ASSERT_NE(shards.WholeHostTable(0), nullptr);
    EXPECT_EQ(shards.WholeHostTable(1), nullptr);
    ASSERT_NE(shards.WholeStore(1), nullptr);
    EXPECT_EQ(shards.WholeStore(1)->capabilities().checkpoint,
              CheckpointForm::kDatabase);
    EXPECT_EQ(shards.WholeStore(1)->spec().rows, 400);
    // Host: the host table whole, the RocksDB table's 16 slots and more.
    EXPECT_GE(shards.MemoryBytes().host, (200 + 16) * (4 + 1) * 4);
    const fs::path rank_dir = fs::path(dir.path()) / "rank_0";
    ASSERT_TRUE(fs::is_directory(rank_dir));
    for (const auto& entry : fs::directory_iterator(rank_dir)) {
      database_dir = entry.path().string();
    }
    ASSERT_FALSE(database_dir.empty());

    // A row trained on the live store, then a staged fresh database: the
    // staged store starts from the initial rows, and the swap puts it in
    // place and removes the old database.
    std::vector<float> initial(5), trained(5), after(5);
    EmbeddingStore* live = shards.WholeStore(1);
    ASSERT_TRUE(live->ReadRow(7, initial.data()).ok());
    Train(*live, Ids({7}));
    ASSERT_TRUE(live->ReadRow(7, trained.data()).ok());
    ASSERT_NE(trained[0], initial[0]);
    absl::StatusOr<std::unique_ptr<model::ShardSet::Staged>> staged =
        shards.Stage("");
    ASSERT_TRUE(staged.ok()) << staged.status();
    EXPECT_EQ((*staged)->stores[0], nullptr);  // the host table stays
    ASSERT_NE((*staged)->stores[1], nullptr);
    EXPECT_EQ(shards.WholeStore(1), live);  // nothing changed yet
    shards.Swap(*std::move(staged));
    EXPECT_NE(shards.WholeStore(1), live);
    ASSERT_TRUE(shards.WholeStore(1)->ReadRow(7, after.data()).ok());
    EXPECT_EQ(after, initial);
    EXPECT_FALSE(fs::exists(database_dir));

    // A checkpoint of a database staged back restores its rows.
    Train(*shards.WholeStore(1), Ids({7}));
    ASSERT_TRUE(shards.WholeStore(1)->ReadRow(7, trained.data()).ok());
    ScratchDir saved;
    RecordingSink sink;
    ASSERT_TRUE(shards.WholeStore(1)->Save(sink).ok());
    ASSERT_NE(sink.database, nullptr);
    ASSERT_TRUE(sink.database->Checkpoint(saved.path()).ok());
    Train(*shards.WholeStore(1), Ids({7}));
    staged = shards.Stage(saved.path());
    ASSERT_TRUE(staged.ok()) << staged.status();
    shards.Swap(*std::move(staged));
    ASSERT_TRUE(shards.WholeStore(1)->ReadRow(7, after.data()).ok());
    EXPECT_EQ(after, trained);
  }
  // The set removed its databases and the rank's directory.
  EXPECT_FALSE(fs::exists(fs::path(dir.path()) / "rank_0"));
}

TEST(ShardSetTest, StageNamesAMissingCheckpointAndNeedsADatabase) {
  ScratchDir dir;
  ModelConfig config = MixedConfig(dir.path());
  const embedding::ShardingPlan plan = embedding::WholeTablesPlan(config);
  absl::StatusOr<std::unique_ptr<model::ShardSet>> set =
      model::ShardSet::Create(config, plan, 0, {{0, 0}, {1, 0}}, nullptr);
  ASSERT_TRUE(set.ok()) << set.status();
  absl::StatusOr<std::unique_ptr<model::ShardSet::Staged>> staged =
      (*set)->Stage((fs::path(dir.path()) / "no-such-checkpoint").string());
  EXPECT_EQ(staged.status().code(), absl::StatusCode::kNotFound)
      << staged.status();

  config.mutable_tables(1)->set_storage(STORAGE_HOST);
  absl::StatusOr<std::unique_ptr<model::ShardSet>> host_only =
      model::ShardSet::Create(config, plan, 0, {{0, 0}, {1, 0}}, nullptr);
  ASSERT_TRUE(host_only.ok()) << host_only.status();
  EXPECT_FALSE((*host_only)->has_database());
  EXPECT_EQ((*host_only)->Stage("").status().code(),
            absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace dlrm
