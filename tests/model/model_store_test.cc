// Tests of Model over storage tiers: tables on RocksDB behind a cache of
// 10% of their rows train bitwise like the all-in-memory model; over-capacity
// batches are rejected without change; checkpoints and the safetensors export
// of a RocksDB-backed model.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/config.h"
#include "data/synthetic.h"
#include "embedding/embedding_store.h"
#include "embedding/sharding.h"
#include "model/checkpoint.h"
#include "model/model.h"
#include "model/trainer.h"
#include "model/weights_export.h"
#include "tests/support/expect.h"
#include "tests/support/store_model.h"
#include "tests/support/synthetic.h"

namespace dlrm::model {
namespace {

namespace fs = std::filesystem;

// Fixed seeds, printed by the tests that use them.
constexpr uint64_t kModelSeed = 20261123;
constexpr uint64_t kDataSeed = 77;

// A small model with large-ish tables (the cache holds 10% of each) and
// multi-hot bags of up to 4 ids.
ModelConfig BaseConfig(OptimizerConfig::Type sparse) {
  return test::StoreTestConfig(sparse, kModelSeed);
}

std::string ScratchDir(const std::string& name) {
  return test::ScratchDir("model_store_test", name);
}

using test::OnRocksDb;

// `count` batches of `n` samples, teacher `seed` and sample stream `seed + 1`.
std::vector<data::Batch> Batches(const ModelConfig& c, int count, int64_t n,
                                 uint64_t seed) {
  return test::SyntheticBatches(
      c, count, n,
      {.zipf_alpha = 1.05, .teacher_seed = seed, .sample_seed = seed + 1});
}

std::unique_ptr<Model> Make(const ModelConfig& c) { return test::MakeModel(c); }

// The seeds, for reproducing a failure.
void PrintSeeds() {
  std::printf("model seed %llu, data seed %llu\n",
              static_cast<unsigned long long>(kModelSeed),
              static_cast<unsigned long long>(kDataSeed));
}

using test::TrainBothExpectSameLoss;

// Every float of the model: dense weights, then every table's records
// (weights and optimizer state, read through the stores) and step.
std::vector<float> Everything(Model& m) {
  std::vector<float> out;
  for (dense::Mlp* mlp : {&m.bottom(), &m.top()}) {
    for (const dense::Linear& l : mlp->layers()) {
      out.insert(out.end(), l.weight(),
                 l.weight() + static_cast<int64_t>(l.in()) * l.out());
      out.insert(out.end(), l.bias(), l.bias() + l.out());
    }
  }
  for (int k = 0; k < m.config().tables_size(); ++k) {
    embedding::EmbeddingStore& s = *m.shards().WholeStore(k);
    const int floats = s.spec().dim + embedding::StateFloatsPerRow(
                                          s.spec().optimizer, s.spec().dim);
    std::vector<float> record(floats);
    for (int64_t row = 0; row < s.spec().rows; ++row) {
      EXPECT_TRUE(s.ReadRow(row, record.data()).ok());
      out.insert(out.end(), record.begin(), record.end());
    }
    out.push_back(static_cast<float>(s.step()));
  }
  return out;
}

void ExpectBitwiseEqual(const std::vector<float>& a,
                        const std::vector<float>& b) {
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
}

struct Case {
  OptimizerConfig::Type sparse;
  RocksDbConfig::Eviction eviction;
  bool prefetch;
};

class TierEquivalenceTest : public ::testing::TestWithParam<Case> {};

TEST_P(TierEquivalenceTest, TrainsBitwiseLikeHostMemory) {
  const Case& p = GetParam();
  PrintSeeds();
  const ModelConfig host_config = BaseConfig(p.sparse);
  const std::string dir = ScratchDir("equiv");
  const ModelConfig rocks_config =
      OnRocksDb(host_config, dir, /*cache_rows=*/0, p.eviction);
  EXPECT_EQ(CachedRowsOfTable(rocks_config, 0), 200);
  EXPECT_EQ(CachedRowsOfTable(rocks_config, 1), 300);
  EXPECT_EQ(CachedRowsOfTable(rocks_config, 2), 150);
  auto host = Make(host_config);
  auto rocks = Make(rocks_config);
  ASSERT_TRUE(host && rocks);
  EXPECT_FALSE(host->shards().has_database());
  EXPECT_TRUE(rocks->shards().has_database());
  ExpectBitwiseEqual(Everything(*host), Everything(*rocks));

  // 32 samples x up to 4 ids fits the smallest cache (150 rows); 40 steps
  // touch several times more rows than any cache holds.
  constexpr int kSteps = 40;
  const auto batches = Batches(host_config, kSteps, 32, kDataSeed);
  ASSERT_NO_FATAL_FAILURE(
      TrainBothExpectSameLoss(*host, *rocks, batches, p.prefetch));
  const embedding::StoreMetrics m = rocks->shards().HostCacheMetrics();
  EXPECT_GT(m.evictions, 0);
  EXPECT_GT(m.rows_read, 0);
  if (p.prefetch) {
    EXPECT_GT(m.prefetch_hits, 0);
  }
  ExpectBitwiseEqual(Everything(*host), Everything(*rocks));
  EXPECT_EQ(host->WeightChecksum().value(), rocks->WeightChecksum().value());

  std::vector<float> pa, pb;
  ASSERT_TRUE(host->Predict(batches[0], &pa).ok());
  ASSERT_TRUE(rocks->Predict(batches[0], &pb).ok());
  ExpectBitwiseEqual(pa, pb);

  rocks.reset();
  // The model's database was scratch: its directory is gone.
  EXPECT_TRUE(fs::is_empty(dir));
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(
    Tiers, TierEquivalenceTest,
    ::testing::Values(Case{OptimizerConfig::SGD, RocksDbConfig::LRU, false},
                      Case{OptimizerConfig::ADAM, RocksDbConfig::LRU, true},
                      Case{OptimizerConfig::ROWWISE_ADAGRAD, RocksDbConfig::LFU,
                           true},
                      Case{OptimizerConfig::SGD, RocksDbConfig::LFU, true}));

// A live change of the learning rates (Model::SetOptimizers) reaches the
// RocksDB tier's slots: with prefetch and evictions in flight, the steps
// after it train bitwise as host memory given the same change.
TEST(ModelStoreTest, LearningRateChangedLiveTrainsLikeHostMemory) {
  const ModelConfig host_config = BaseConfig(OptimizerConfig::ADAM);
  const std::string dir = ScratchDir("rate");
  auto host = Make(host_config);
  auto rocks = Make(OnRocksDb(host_config, dir));
  ASSERT_TRUE(host && rocks);
  constexpr int kSteps = 20;
  const auto batches = Batches(host_config, kSteps, 32, kDataSeed);
  OptimizerConfig dense = host_config.dense_optimizer();
  OptimizerConfig sparse = host_config.sparse_optimizer();
  dense.set_learning_rate(dense.learning_rate() * 3);
  sparse.set_learning_rate(sparse.learning_rate() * 5);
  for (int i = 0; i < kSteps; ++i) {
    if (i == kSteps / 2) {
      ASSERT_TRUE(host->SetOptimizers(dense, sparse).ok());
      ASSERT_TRUE(rocks->SetOptimizers(dense, sparse).ok());
    }
    const data::Batch* next = i + 1 < kSteps ? &batches[i + 1] : nullptr;
    auto a = host->TrainStep(batches[i]);
    auto b = rocks->TrainStep(batches[i], next);
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(a->loss, b->loss) << "step " << i;
  }
  ExpectBitwiseEqual(Everything(*host), Everything(*rocks));
  EXPECT_EQ(rocks->config().sparse_optimizer().learning_rate(),
            sparse.learning_rate());
  rocks.reset();
  fs::remove_all(dir);
}

TEST(ModelStoreTest, MixedTiersTrainLikeHostMemory) {
  const ModelConfig host_config = BaseConfig(OptimizerConfig::ADAM);
  const std::string dir = ScratchDir("mixed");
  RocksDbConfig r;
  r.set_path(dir);
  auto mixed_config = PlaceTablesOnRocksDb(host_config, {"C2"}, r);
  ASSERT_TRUE(mixed_config.ok()) << mixed_config.status();
  EXPECT_EQ(mixed_config->tables(0).storage(), STORAGE_HOST);
  EXPECT_EQ(mixed_config->tables(1).storage(), STORAGE_ROCKSDB);
  auto host = Make(host_config);
  auto mixed = Make(*mixed_config);
  ASSERT_TRUE(host && mixed);
  // The host table is whole in memory; the cached one is not.
  ASSERT_NE(mixed->shards().WholeHostTable(0), nullptr);
  EXPECT_EQ(mixed->shards().WholeHostTable(0)->rows(), 2000);
  EXPECT_EQ(mixed->shards().WholeHostTable(1), nullptr);
  EXPECT_EQ(mixed->shards().WholeStore(1)->spec().rows, 3000);
  ASSERT_NO_FATAL_FAILURE(TrainBothExpectSameLoss(
      *host, *mixed, Batches(host_config, 20, 32, kDataSeed)));
  ExpectBitwiseEqual(Everything(*host), Everything(*mixed));
  mixed.reset();
  fs::remove_all(dir);
}

// model::Train (dlrm_train's loop) reads a batch ahead and passes it as
// `next`: the cached tables prefetch, and training stays bitwise that of
// the in-memory model.
TEST(ModelStoreTest, TrainLoopPrefetchesNextBatch) {
  PrintSeeds();
  const ModelConfig host_config = BaseConfig(OptimizerConfig::ROWWISE_ADAGRAD);
  const std::string dir = ScratchDir("train_loop");
  auto host = Make(host_config);
  auto rocks = Make(OnRocksDb(host_config, dir));
  ASSERT_TRUE(host && rocks);
  TrainOptions options;
  options.batch_size = 32;
  options.max_steps = 30;
  options.log_interval = 0;
  for (Model* m : {host.get(), rocks.get()}) {
    data::SyntheticOptions o;
    o.teacher_seed = kDataSeed;
    o.sample_seed = kDataSeed + 1;
    auto source = data::MakeSyntheticSource(host_config, o);
    ASSERT_TRUE(source.ok()) << source.status();
    auto r = Train(*m, **source, /*eval=*/nullptr, options, EvalOptions(),
                   TrainCallbacks());
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->steps, 30);
  }
  const embedding::StoreMetrics m = rocks->shards().HostCacheMetrics();
  EXPECT_GT(m.misses, 0);
  // Every miss after the first step was staged by the step before it.
  EXPECT_GT(m.prefetch_hits, m.misses / 2);
  ExpectBitwiseEqual(Everything(*host), Everything(*rocks));
  rocks.reset();
  fs::remove_all(dir);
}

// The tier planner: the largest tables go to RocksDB until the host tables
// plus the caches fit the budget. BaseConfig's tables (SGD, dim 8) take
// 64000 (C1), 96000 (C2) and 48000 (C3) bytes; a 10% cache a tenth of that.
TEST(ModelStoreTest, PlannerMovesLargestTablesUntilTheBudgetFits) {
  const ModelConfig host_config = BaseConfig(OptimizerConfig::SGD);
  const std::string dir = ScratchDir("planner");
  embedding::TierPlanOptions options;
  options.rocksdb.set_path(dir);
  options.rocksdb.set_cache_fraction(0.1);
  auto tiers = [&](int64_t budget) {
    options.host_budget_bytes = budget;
    auto c = embedding::PlanStorageTiers(host_config, options);
    EXPECT_TRUE(c.ok()) << c.status();
    std::string s;
    for (const TableConfig& t : c->tables()) {
      s += t.storage() == STORAGE_ROCKSDB ? "R" : "H";
    }
    return s;
  };
  EXPECT_EQ(tiers(0), "HHH");  // No budget.
  EXPECT_EQ(tiers(208000), "HHH");
  EXPECT_EQ(tiers(207999), "HRH");  // 64000 + 9600 + 48000 = 121600.
  EXPECT_EQ(tiers(121600), "HRH");
  EXPECT_EQ(tiers(121599), "RRH");  // 6400 + 9600 + 48000 = 64000.
  EXPECT_EQ(tiers(63999), "RRR");   // 6400 + 9600 + 4800 = 20800.
  EXPECT_EQ(tiers(20800), "RRR");

  options.host_budget_bytes = 20799;
  auto too_small = embedding::PlanStorageTiers(host_config, options);
  EXPECT_EQ(too_small.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_HAS_SUBSTR(too_small.status().message(), "20800")
      << too_small.status();
  options.host_budget_bytes = -1;
  EXPECT_EQ(embedding::PlanStorageTiers(host_config, options).status().code(),
            absl::StatusCode::kInvalidArgument);
  embedding::TierPlanOptions no_path;
  no_path.host_budget_bytes = 100000;
  auto missing = embedding::PlanStorageTiers(host_config, no_path);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_HAS_SUBSTR(missing.status().message(), "rocksdb.path");

  // The planned model trains like the in-memory one.
  options.host_budget_bytes = 100000;
  auto planned = embedding::PlanStorageTiers(host_config, options);
  ASSERT_TRUE(planned.ok()) << planned.status();
  EXPECT_EQ(CachedRowsOfTable(*planned, 1), 300);
  auto host = Make(host_config);
  auto mixed = Make(*planned);
  ASSERT_TRUE(host && mixed);
  ASSERT_NO_FATAL_FAILURE(TrainBothExpectSameLoss(
      *host, *mixed, Batches(host_config, 10, 32, kDataSeed)));
  ExpectBitwiseEqual(Everything(*host), Everything(*mixed));
  mixed.reset();
  fs::remove_all(dir);
}

TEST(ModelStoreTest, OverCapacityBatchIsRejectedAndChangesNothing) {
  PrintSeeds();
  const ModelConfig host_config = BaseConfig(OptimizerConfig::ADAM);
  const std::string dir = ScratchDir("capacity");
  // 16 cached rows per table: a 4-sample batch always fits, 64 samples of
  // up to 4 ids never do.
  const ModelConfig rocks_config = OnRocksDb(host_config, dir, 16);
  auto host = Make(host_config);
  auto rocks = Make(rocks_config);
  ASSERT_TRUE(host && rocks);
  const auto small = Batches(host_config, 6, 4, kDataSeed);
  const auto big = Batches(host_config, 1, 64, kDataSeed + 10);
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(host->TrainStep(small[i]).ok());
    ASSERT_TRUE(rocks->TrainStep(small[i]).ok());
  }
  const uint64_t before = rocks->WeightChecksum().value();
  const std::vector<float> everything = Everything(*rocks);
  auto rejected = rocks->TrainStep(big[0]);
  EXPECT_EQ(rejected.status().code(), absl::StatusCode::kResourceExhausted)
      << rejected.status();
  std::vector<float> probs;
  EXPECT_EQ(rocks->Predict(big[0], &probs).code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(rocks->WeightChecksum().value(), before);
  ExpectBitwiseEqual(Everything(*rocks), everything);
  EXPECT_EQ(rocks->steps(), 3);
  // Training goes on as if the rejected batch had never come.
  for (int i = 3; i < 6; ++i) {
    auto x = host->TrainStep(small[i]);
    auto y = rocks->TrainStep(small[i]);
    ASSERT_TRUE(x.ok() && y.ok()) << y.status();
    EXPECT_EQ(x->loss, y->loss);
  }
  ExpectBitwiseEqual(Everything(*host), Everything(*rocks));
  rocks.reset();
  fs::remove_all(dir);
}

TEST(ModelStoreTest, CheckpointRestoreContinuesIdentically) {
  PrintSeeds();
  const ModelConfig host_config = BaseConfig(OptimizerConfig::ADAM);
  const std::string dir = ScratchDir("ckpt_rows");
  const std::string ckpt = ScratchDir("ckpt");
  const ModelConfig rocks_config = OnRocksDb(host_config, dir);
  auto rocks = Make(rocks_config);
  ASSERT_TRUE(rocks);
  const auto batches = Batches(host_config, 20, 32, kDataSeed);
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(rocks->TrainStep(batches[i]).ok());
  auto saved = SaveCheckpoint(*rocks, ckpt);
  ASSERT_TRUE(saved.ok()) << saved.status();
  EXPECT_EQ(saved->step, 10);
  EXPECT_TRUE(fs::is_directory(fs::path(ckpt) / "rank-0.rocksdb"));
  const std::vector<float> at_save = Everything(*rocks);

  const std::vector<double> losses = test::TrainLosses(*rocks, batches, 10, 20);
  const std::vector<float> at_end = Everything(*rocks);

  // Restored in place: the rows as saved, then the same continuation.
  auto restored = RestoreCheckpoint(*rocks, ckpt);
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_EQ(rocks->steps(), 10);
  ExpectBitwiseEqual(Everything(*rocks), at_save);
  EXPECT_EQ(test::TrainLosses(*rocks, batches, 10, 20), losses);
  ExpectBitwiseEqual(Everything(*rocks), at_end);

  // Loaded into a new model (its own fresh database).
  auto loaded = LoadCheckpoint(ckpt, /*weights_only=*/false);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ExpectBitwiseEqual(Everything(**loaded), at_save);
  EXPECT_EQ(test::TrainLosses(**loaded, batches, 10, 20), losses);

  // Restored into a model with the table in host memory: the rows move
  // tier through the stores, and training goes on bitwise the same.
  auto host = Make(host_config);
  auto moved = RestoreCheckpoint(*host, ckpt);
  ASSERT_TRUE(moved.ok()) << moved.status();
  ExpectBitwiseEqual(Everything(*host), at_save);
  EXPECT_EQ(test::TrainLosses(*host, batches, 10, 20), losses);
  ExpectBitwiseEqual(Everything(*host), at_end);

  rocks.reset();
  loaded->reset();
  fs::remove_all(dir);
  fs::remove_all(ckpt);
}

TEST(ModelStoreTest, SafetensorsExportReadsRowsThroughTheStore) {
  const ModelConfig host_config = BaseConfig(OptimizerConfig::SGD);
  const std::string dir = ScratchDir("export_rows");
  const std::string out = ScratchDir("export");
  fs::create_directories(out);
  auto host = Make(host_config);
  auto rocks = Make(OnRocksDb(host_config, dir));
  ASSERT_TRUE(host && rocks);
  for (const auto& b : Batches(host_config, 10, 32, kDataSeed)) {
    ASSERT_TRUE(host->TrainStep(b).ok());
    ASSERT_TRUE(rocks->TrainStep(b).ok());
  }
  const std::string b = test::ExpectSameExport(*host, *rocks, out);
  EXPECT_GT(test::ReadFile(b).size(), size_t{6500 * 8 * 4});
  rocks.reset();
  fs::remove_all(dir);
  fs::remove_all(out);
}

// The budget per rank: with a sharding plan, a table moves only while one
// of its shards sits on a rank over the budget, and each shard's cache is
// sized from its own rows. BaseConfig (SGD, dim 8, 32 B a row): C1 2000
// rows table-wise on rank 0 (64000 B), C2 3000 rows row-wise on ranks 0
// and 1 (48000 B each), C3 1500 rows table-wise on rank 1 (48000 B).
TEST(ModelStoreTest, PlannerKeepsEveryRankWithinTheBudget) {
  const ModelConfig c = BaseConfig(OptimizerConfig::SGD);
  embedding::ShardingPlan plan;
  plan.world_size = 2;
  plan.tables.resize(3);
  plan.tables[0].kind = SHARDING_TABLE_WISE;
  plan.tables[0].shards = {{0, 0, 2000, 0, 8}};
  plan.tables[1].kind = SHARDING_ROW_WISE;
  plan.tables[1].shards = {{0, 0, 1500, 0, 8}, {1, 1500, 1500, 0, 8}};
  plan.tables[2].kind = SHARDING_TABLE_WISE;
  plan.tables[2].shards = {{1, 0, 1500, 0, 8}};
  ASSERT_TRUE(plan.Validate(c).ok());
  EXPECT_EQ(embedding::HostBytesPerRank(c, plan, c.rocksdb()),
            (std::vector<int64_t>{112000, 96000}));

  embedding::TierPlanOptions options;
  options.rocksdb.set_path(ScratchDir("rank_planner"));
  options.rocksdb.set_cache_fraction(0.1);
  auto tiers = [&](int64_t budget) {
    options.host_budget_bytes = budget;
    auto planned = embedding::PlanStorageTiers(c, options, &plan);
    EXPECT_TRUE(planned.ok()) << planned.status();
    std::string s;
    for (const TableConfig& t : planned->tables()) {
      s += t.storage() == STORAGE_ROCKSDB ? "R" : "H";
    }
    return s;
  };
  EXPECT_EQ(tiers(112000), "HHH");
  // C2 is the largest (96000 B over both ranks): rank 0 keeps 64000 + 4800.
  EXPECT_EQ(tiers(111999), "HRH");
  // Rank 0 still over: C1 moves (6400 + 4800); rank 1 (4800 + 48000) fits.
  EXPECT_EQ(tiers(68799), "RRH");
  // Now rank 1 is over too: C3 moves.
  EXPECT_EQ(tiers(52799), "RRR");
  // Every table moved, rank 1 (4800 + 4800) fits and rank 0 does not.
  options.host_budget_bytes = 11199;
  auto too_small = embedding::PlanStorageTiers(c, options, &plan);
  EXPECT_EQ(too_small.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_HAS_SUBSTR(too_small.status().message(), "rank 0")
      << too_small.status();

  // The largest table, C2 whole on rank 1, which fits: it stays, and C1
  // moves for rank 0 (64000 + 48000 with C3).
  plan.tables[1].kind = SHARDING_TABLE_WISE;
  plan.tables[1].shards = {{1, 0, 3000, 0, 8}};
  plan.tables[2].shards[0].rank = 0;
  ASSERT_TRUE(plan.Validate(c).ok());
  EXPECT_EQ(tiers(100000), "RHH");
}

// rocksdb.host_budget_bytes in the config: the model plans its tiers when
// it is created, its config says so, and a checkpoint's config plans to
// itself.
TEST(ModelStoreTest, ModelAppliesTheConfigsHostBudget) {
  const std::string dir = ScratchDir("config_budget");
  ModelConfig c = BaseConfig(OptimizerConfig::SGD);
  c.mutable_rocksdb()->set_path(dir);
  c.mutable_rocksdb()->set_host_budget_bytes(121600);
  auto n = NormalizeModelConfig(c);
  ASSERT_TRUE(n.ok()) << n.status();
  auto m = Make(*n);
  ASSERT_NE(m, nullptr);
  EXPECT_TRUE((m->shards().WholeHostTable(0) != nullptr));
  EXPECT_FALSE((m->shards().WholeHostTable(1) != nullptr));  // the largest
  EXPECT_TRUE((m->shards().WholeHostTable(2) != nullptr));
  EXPECT_EQ(m->config().tables(1).storage(), STORAGE_ROCKSDB);
  auto again = embedding::ApplyMemoryBudgets(m->config());
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->SerializeAsString(), m->config().SerializeAsString());

  ModelConfig bad = *n;
  bad.mutable_rocksdb()->set_host_budget_bytes(-1);
  auto negative = NormalizeModelConfig(bad);
  EXPECT_EQ(negative.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_HAS_SUBSTR(negative.status().message(), "rocksdb.host_budget_bytes")
      << negative.status();
  bad = *n;
  bad.mutable_rocksdb()->clear_path();
  auto no_path = NormalizeModelConfig(bad);
  EXPECT_EQ(no_path.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_HAS_SUBSTR(no_path.status().message(), "rocksdb.path")
      << no_path.status();
  bad = *n;
  bad.mutable_rocksdb()->set_write_buffer_bytes(-5);
  auto buffer = NormalizeModelConfig(bad);
  EXPECT_EQ(buffer.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_HAS_SUBSTR(buffer.status().message(), "rocksdb.write_buffer_bytes")
      << buffer.status();
  bad = *n;
  bad.mutable_rocksdb()->set_host_budget_bytes(1000);
  auto tiny = Model::Create(bad);
  EXPECT_EQ(tiny.status().code(), absl::StatusCode::kResourceExhausted)
      << tiny.status();
  m.reset();
  fs::remove_all(dir);
}

TEST(ModelStoreTest, ConfigNeedsRocksDbPath) {
  ModelConfig c = BaseConfig(OptimizerConfig::SGD);
  c.mutable_tables(1)->set_storage(STORAGE_ROCKSDB);
  auto n = NormalizeModelConfig(c);
  EXPECT_EQ(n.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_HAS_SUBSTR(n.status().message(), "rocksdb.path") << n.status();
  c.mutable_rocksdb()->set_path("/tmp/x");
  c.mutable_rocksdb()->set_cache_fraction(1.5);
  EXPECT_EQ(NormalizeModelConfig(c).status().code(),
            absl::StatusCode::kInvalidArgument);
  RocksDbConfig r;
  r.set_path("/tmp/x");
  EXPECT_EQ(PlaceTablesOnRocksDb(BaseConfig(OptimizerConfig::SGD), {"C9"}, r)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace dlrm::model
