// Tests of Model with dynamic tables (docs/dynamic.md): it trains and
// predicts (predictions and refused steps admit nothing), checkpoints
// restore the id maps bit for bit on the host and RocksDB tiers, or
// re-route the ids by hash onto another row-wise shard count or a whole
// table, the weights export writes each row's id beside the rows, the
// planner counts the maps' bytes, and bad configs get errors naming the
// field.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "comm/communicator.h"
#include "core/config.h"
#include "core/status.h"
#include "data/synthetic.h"
#include "embedding/dynamic_route.h"
#include "embedding/dynamic_store.h"
#include "embedding/embedding_store.h"
#include "embedding/sharding_memory.h"
#include "embedding/sharding_planner.h"
#include "model/checkpoint.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "model/weights_export.h"
#include "tests/support/expect.h"
#include "tests/support/store_model.h"
#include "tests/support/synthetic.h"

namespace dlrm::model {
namespace {

namespace fs = std::filesystem;

constexpr uint64_t kModelSeed = 20261202;
constexpr uint64_t kDataSeed = 41;

// Three tables: C1 dynamic (LRU, a time to live), C2 dynamic (admitted
// after 2 sightings, a shared row for the others, LFU), C3 static. The
// synthetic ids are below each table's rows (its capacity) until raw ids
// reach the batches, so C1 and C2 see at most `rows` distinct ids, more
// than some buckets hold.
ModelConfig DynamicConfig() {
  auto parsed = ParseModelConfigText(absl::StrCat(R"(
    num_dense_features: 5 embedding_dim: 8
    tables { name: "C1" rows: 120 multi_hot_size: 3 dynamic: true
             eviction { ttl_steps: 4 } }
    tables { name: "C2" rows: 90 pooling: POOLING_MEAN multi_hot_size: 2
             dynamic: true unadmitted: UNADMITTED_SHARED_ROW
             admission { kind: ADMIT_AFTER_SIGHTINGS }
             eviction { kind: EVICT_LFU } }
    tables { name: "C3" rows: 50 }
    bottom_mlp: [16, 8] top_mlp: [16, 1]
    dense_optimizer { type: SGD learning_rate: 0.1 }
    sparse_optimizer { type: ADAGRAD learning_rate: 0.5 }
    seed: )",
                                                  kModelSeed));
  EXPECT_TRUE(parsed.ok()) << parsed.status();
  auto c = NormalizeModelConfig(*parsed);
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

// `text` parsed as a ModelConfig and normalised; the error of either.
absl::StatusOr<ModelConfig> NormalizedText(const std::string& text) {
  ASSIGN_OR_RETURN(const ModelConfig parsed, ParseModelConfigText(text));
  return NormalizeModelConfig(parsed);
}

// `c` with the dynamic tables C1 and C2 on RocksDB under `dir`/db, behind
// caches of 90% of their rows.
ModelConfig DynamicTablesOnRocksDb(const ModelConfig& c, const fs::path& dir) {
  RocksDbConfig r;
  r.set_path((dir / "db").string());
  r.set_cache_fraction(0.9);
  auto placed = PlaceTablesOnRocksDb(c, {"C1", "C2"}, r);
  EXPECT_TRUE(placed.ok()) << placed.status();
  return placed.ok() ? *placed : c;
}

std::vector<data::Batch> Batches(const ModelConfig& c, int count) {
  data::SyntheticOptions o;
  o.zipf_alpha = 0.8;
  o.teacher_seed = kDataSeed;
  o.sample_seed = kDataSeed + 1;
  return test::SyntheticBatches(c, count, 64, o);
}

// Trains `m` on batches [begin, end) in order: their losses, or the first
// refused step's error.
absl::StatusOr<std::vector<double>> TrainOn(
    Model& m, const std::vector<data::Batch>& batches, int begin, int end) {
  std::vector<double> losses;
  for (int i = begin; i < end; ++i) {
    ASSIGN_OR_RETURN(const auto r, m.TrainStep(batches[i]));
    losses.push_back(r.loss);
  }
  return losses;
}

std::unique_ptr<Model> Make(const ModelConfig& c) {
  auto m = Model::Create(c);
  EXPECT_TRUE(m.ok()) << m.status();
  return m.ok() ? *std::move(m) : nullptr;
}

embedding::DynamicStore* DynamicOf(Model& m, int k) {
  return dynamic_cast<embedding::DynamicStore*>(m.shards().WholeStore(k));
}

// A shard of a dynamic table on this rank: its shard number in the plan's
// placement, and its store.
struct DynamicShard {
  int shard;
  embedding::DynamicStore* store;
};

// The shards of dynamic table `k` on this rank, in shard order (a failure
// for one whose store is not a DynamicStore).
std::vector<DynamicShard> DynamicShardsOf(Model& m, int k) {
  std::vector<DynamicShard> out;
  for (int j = 0; j < m.shards().size(); ++j) {
    if (m.shards()[j].table != k) continue;
    auto* d = dynamic_cast<embedding::DynamicStore*>(m.shards().store(j));
    EXPECT_NE(d, nullptr);
    if (d != nullptr) out.push_back({m.shards()[j].shard, d});
  }
  return out;
}

// Every table's records through the stores, and the maps' state.
std::vector<int64_t> Maps(Model& m) {
  std::vector<int64_t> out;
  for (int k = 0; k < 2; ++k) {
    const embedding::DynamicIdMap& map = DynamicOf(m, k)->map();
    for (const auto* v : {&map.keys(), &map.last_steps(), &map.sightings()}) {
      out.insert(out.end(), v->begin(), v->end());
    }
    out.insert(out.end(), map.sketch().begin(), map.sketch().end());
    out.push_back(map.step());
  }
  return out;
}

// Every table's records, read through the stores.
std::vector<float> Tables(Model& m) {
  return test::StoreRecords(m, /*with_steps=*/false);
}

TEST(DynamicModelTest, TrainsAndPredictsWithoutAdmitting) {
  std::printf("model seed %llu, data seed %llu\n",
              static_cast<unsigned long long>(kModelSeed),
              static_cast<unsigned long long>(kDataSeed));
  const ModelConfig c = DynamicConfig();
  std::unique_ptr<Model> m = Make(c);
  ASSERT_NE(m, nullptr);
  ASSERT_NE(DynamicOf(*m, 0), nullptr);
  ASSERT_NE(DynamicOf(*m, 1), nullptr);
  EXPECT_EQ(dynamic_cast<embedding::DynamicStore*>(m->shards().WholeStore(2)),
            nullptr);
  const std::vector<data::Batch> batches = Batches(c, 8);
  std::vector<RankTableStore> reported;
  for (int i = 0; i < 6; ++i) {
    auto r = m->TrainStep(batches[i]);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_TRUE(std::isfinite(r->loss));
    reported = r->stores;
  }
  const embedding::StoreMetrics m1 = DynamicOf(*m, 0)->metrics();
  // The step reports both dynamic tables' counters (host memory: no cache).
  ASSERT_EQ(reported.size(), 2u);
  EXPECT_TRUE(reported[0].dynamic);
  EXPECT_EQ(reported[0].table, 0);
  EXPECT_EQ(reported[0].cache_rows, 0);
  EXPECT_EQ(reported[0].metrics.ids_admitted, m1.ids_admitted);
  EXPECT_EQ(reported[1].table, 1);
  EXPECT_GT(reported[1].metrics.ids_admitted, 0);
  EXPECT_GT(m1.ids_admitted, 0);
  EXPECT_GT(m1.ids_occupied, 0);
  EXPECT_LE(m1.ids_occupied, 119);
  const std::vector<int64_t> maps = Maps(*m);
  const std::vector<float> tables = Tables(*m);
  std::vector<float> probs;
  ASSERT_TRUE(m->Predict(batches[7], &probs).ok());
  EXPECT_EQ(Maps(*m), maps);
  EXPECT_EQ(Tables(*m), tables);
  EXPECT_EQ(DynamicOf(*m, 0)->metrics().ids_admitted, m1.ids_admitted);
}

// A step refused after the dynamic tables prepared (the static C3's row
// cache on RocksDB is too small for the batch) admits nothing: the maps and
// rows stay as they were, and training goes on like a twin that never saw
// the batch.
TEST(DynamicModelTest, ARefusedStepAdmitsNothing) {
  const fs::path dir = fs::path(::testing::TempDir()) /
                       absl::StrCat("dynamic_refused_", ::getpid());
  fs::remove_all(dir);
  auto on_rocksdb = [&](const std::string& name) {
    RocksDbConfig r;
    r.set_path((dir / name).string());
    r.set_cache_rows(16);
    auto placed = PlaceTablesOnRocksDb(DynamicConfig(), {"C3"}, r);
    EXPECT_TRUE(placed.ok()) << placed.status();
    return *placed;
  };
  const ModelConfig c = on_rocksdb("m");
  std::unique_ptr<Model> m = Make(c);
  std::unique_ptr<Model> twin = Make(on_rocksdb("twin"));
  ASSERT_TRUE(m && twin);
  data::SyntheticOptions o;
  o.zipf_alpha = 0.8;
  o.teacher_seed = kDataSeed;
  o.sample_seed = kDataSeed + 1;
  // 4 samples always fit 16 cached rows of C3; 64 of its 50 rows never do.
  const std::vector<data::Batch> small = test::SyntheticBatches(c, 6, 4, o);
  o.sample_seed = kDataSeed + 2;
  const data::Batch big = test::SyntheticBatches(c, 1, 64, o)[0];
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(m->TrainStep(small[i]).ok());
    ASSERT_TRUE(twin->TrainStep(small[i]).ok());
  }
  const std::vector<int64_t> maps = Maps(*m);
  const std::vector<float> tables = Tables(*m);
  const int64_t admitted = DynamicOf(*m, 0)->metrics().ids_admitted;
  auto refused = m->TrainStep(big);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted)
      << refused.status();
  EXPECT_EQ(Maps(*m), maps);
  EXPECT_EQ(Tables(*m), tables);
  EXPECT_EQ(DynamicOf(*m, 0)->metrics().ids_admitted, admitted);
  for (int i = 3; i < 6; ++i) {
    auto x = m->TrainStep(small[i]);
    auto y = twin->TrainStep(small[i]);
    ASSERT_TRUE(x.ok() && y.ok()) << x.status() << " " << y.status();
    EXPECT_EQ(x->loss, y->loss) << i;
  }
  EXPECT_EQ(Maps(*m), Maps(*twin));
  EXPECT_EQ(Tables(*m), Tables(*twin));
  m.reset();
  twin.reset();
  fs::remove_all(dir);
}

// A store's staged prepare is held back until CommitPrepared, and pooling
// before the commit is refused.
TEST(DynamicModelTest, AStagedPrepareChangesTheMapOnlyWhenCommitted) {
  std::unique_ptr<Model> m = Make(DynamicConfig());
  ASSERT_NE(m, nullptr);
  embedding::DynamicStore* store = DynamicOf(*m, 0);
  data::SparseFeature ids;
  ids.offsets = {0, 2, 3};
  ids.ids = {1000000007, 5, 1000000007};
  auto staged = store->PrepareStaged(ids);
  ASSERT_TRUE(staged.ok()) << staged.status();
  EXPECT_EQ(store->map().Lookup(1000000007), -1);
  std::vector<float> out(2 * store->spec().dim);
  EXPECT_EQ(store->Forward(**staged, out.data(), store->spec().dim).code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(store->CommitPrepared().ok());
  EXPECT_GE(store->map().Lookup(1000000007), 0);
  EXPECT_GE(store->map().Lookup(5), 0);
  EXPECT_TRUE(store->Forward(**staged, out.data(), store->spec().dim).ok());
}

// The planner replicates small tables, but never a dynamic one, and gives
// each row-wise shard of one 2 rows at least.
TEST(DynamicModelTest, ThePlannerNeverReplicatesDynamicTables) {
  const ModelConfig c = DynamicConfig();
  embedding::PlannerOptions po;
  po.world_size = 3;
  auto plan = embedding::PlanSharding(c, po);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->tables[2].kind, SHARDING_DATA_PARALLEL);
  for (int k = 0; k < 2; ++k) {
    EXPECT_NE(plan->tables[k].kind, SHARDING_DATA_PARALLEL) << k;
  }
  // A dynamic table's row-wise shards need 2 rows each.
  ModelConfig pinned = c;
  pinned.mutable_tables(0)->set_rows(5);
  pinned.mutable_tables(0)->set_sharding(SHARDING_ROW_WISE);
  for (int r : {0, 1, 2}) pinned.mutable_tables(0)->add_shard_ranks(r);
  auto refused = embedding::PlanSharding(pinned, po);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument)
      << refused.status();
  EXPECT_NE(refused.status().message().find("tables[0]"), std::string::npos)
      << refused.status();
}

class DynamicCheckpointTest : public ::testing::TestWithParam<bool> {};

// A checkpoint after 3 steps holds the rows and the maps: restored into the
// same model after 3 more steps, or loaded into a new one, the maps are
// bit for bit those saved and the 3 steps train again identically.
TEST_P(DynamicCheckpointTest, RestoresTheMapsBitForBit) {
  const bool rocksdb = GetParam();
  const fs::path dir = fs::path(::testing::TempDir()) /
                       absl::StrCat("dynamic_ckpt_", rocksdb, "_", ::getpid());
  fs::remove_all(dir);
  ModelConfig c = DynamicConfig();
  if (rocksdb) c = DynamicTablesOnRocksDb(c, dir);
  std::unique_ptr<Model> m = Make(c);
  ASSERT_NE(m, nullptr);
  const std::vector<data::Batch> batches = Batches(c, 6);
  const auto first = TrainOn(*m, batches, 0, 3);
  ASSERT_TRUE(first.ok()) << first.status();
  const std::string ckpt = (dir / "ckpt").string();
  auto saved = SaveCheckpoint(*m, ckpt);
  ASSERT_TRUE(saved.ok()) << saved.status();
  const std::vector<int64_t> maps = Maps(*m);
  const std::vector<float> tables = Tables(*m);
  const absl::StatusOr<std::vector<double>> trained =
      TrainOn(*m, batches, 3, 6);
  ASSERT_TRUE(trained.ok()) << trained.status();
  const std::vector<double>& losses = *trained;
  const std::vector<int64_t> maps_after = Maps(*m);
  ASSERT_NE(maps_after, maps);

  auto restored = RestoreCheckpoint(*m, ckpt);
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_EQ(Maps(*m), maps);
  EXPECT_EQ(Tables(*m), tables);
  auto loaded = LoadCheckpoint(ckpt, /*weights_only=*/false);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(Maps(**loaded), maps);
  EXPECT_EQ(Tables(**loaded), tables);
  for (int i = 3; i < 6; ++i) {
    auto a = m->TrainStep(batches[i]);
    auto b = (*loaded)->TrainStep(batches[i]);
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(a->loss, losses[i - 3]) << "step " << i;
    EXPECT_EQ(b->loss, losses[i - 3]) << "step " << i;
  }
  EXPECT_EQ(Maps(*m), maps_after);
  EXPECT_EQ(Maps(**loaded), maps_after);
  loaded->reset();
  m.reset();
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Tiers, DynamicCheckpointTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "RocksDb" : "Host";
                         });

// A checkpoint of a static table does not restore into a dynamic one.
TEST(DynamicCheckpointTest, RefusesACheckpointOfAStaticTable) {
  const fs::path dir = fs::path(::testing::TempDir()) /
                       absl::StrCat("dynamic_static_", ::getpid());
  fs::remove_all(dir);
  ModelConfig fixed = DynamicConfig();
  for (TableConfig& t : *fixed.mutable_tables()) {
    t.clear_dynamic();
    t.clear_admission();
    t.clear_eviction();
    t.clear_unadmitted();
  }
  std::unique_ptr<Model> s = Make(fixed);
  ASSERT_NE(s, nullptr);
  ASSERT_TRUE(SaveCheckpoint(*s, dir.string()).ok());
  std::unique_ptr<Model> d = Make(DynamicConfig());
  ASSERT_NE(d, nullptr);
  const auto r = RestoreCheckpoint(*d, dir.string());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition)
      << r.status();
  EXPECT_NE(r.status().message().find("C1"), std::string::npos) << r.status();
  fs::remove_all(dir);
}

// The weights export of a model whose dynamic tables evicted (raw ids from
// a vocabulary 8x their capacity, a time to live on C1) holds, beside each
// dynamic table's rows, the id each row holds: -1 for a free row (its id
// expired or none came), -2 for the kept row; each id maps to its row as
// the table's map does, and the rows are the table's. A static table has
// no ids.
TEST(DynamicExportTest, WritesEachRowsIdBesideItsRows) {
  const fs::path dir = fs::path(::testing::TempDir()) /
                       absl::StrCat("dynamic_export_", ::getpid());
  fs::remove_all(dir);
  const ModelConfig c = DynamicConfig();
  std::unique_ptr<Model> m = Make(c);
  ASSERT_NE(m, nullptr);
  data::SyntheticOptions o;
  o.zipf_alpha = 0.8;
  o.teacher_seed = kDataSeed;
  o.sample_seed = kDataSeed + 1;
  o.vocabulary = 1000;
  std::vector<data::Batch> batches = test::SyntheticBatches(c, 16, 64, o);
  ASSERT_EQ(batches.size(), 16u);
  // The last 5 steps see one id of C1: its others outlive their time to
  // live (4 steps).
  for (int i = 11; i < 16; ++i) {
    std::fill(batches[i].sparse[0].ids.begin(), batches[i].sparse[0].ids.end(),
              7);
  }
  for (const data::Batch& b : batches) {
    auto r = m->TrainStep(b);
    ASSERT_TRUE(r.ok()) << r.status();
  }
  const std::string path = (dir / "weights.safetensors").string();
  auto info = ExportSafetensors(*m, path);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->tensors, static_cast<int64_t>(WeightSpecs(c).size()));
  auto f = SafetensorsFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_FALSE((*f)->Has(TableIdsName(c.tables(2))));
  int64_t expired = 0;
  for (int k = 0; k < 2; ++k) {
    SCOPED_TRACE(c.tables(k).name());
    const embedding::DynamicIdMap& map = DynamicOf(*m, k)->map();
    EXPECT_GT(map.counters().evicted, 0);
    const int64_t rows = c.tables(k).rows();
    ASSERT_EQ(*(*f)->DtypeOf(TableIdsName(c.tables(k))), Dtype::kI64);
    auto ids = (*f)->GetInt64(TableIdsName(c.tables(k)), {rows});
    ASSERT_TRUE(ids.ok()) << ids.status();
    std::vector<int64_t> gathered;
    ASSERT_TRUE(m->GatherTableIds(k, &gathered).ok());
    EXPECT_EQ(gathered, *ids);
    EXPECT_EQ((*ids)[rows - 1], kKeptRowId);
    std::set<int64_t> seen;
    int64_t table_expired = 0;
    for (int64_t r = 0; r + 1 < rows; ++r) {
      const int64_t id = (*ids)[r];
      if (id == kFreeRowId) {
        // Free: empty, or its id expired (the map still holds the key).
        if (map.keys()[r] >= 0) {
          EXPECT_EQ(map.Lookup(map.keys()[r]), -1) << "row " << r;
          ++table_expired;
        }
        continue;
      }
      ASSERT_GE(id, 0) << "row " << r;
      EXPECT_TRUE(seen.insert(id).second) << "id " << id << " twice";
      EXPECT_EQ(map.Lookup(id), r) << "id " << id;
    }
    // Every row holding a key is exported with it, unless it expired.
    EXPECT_EQ(static_cast<int64_t>(seen.size()) + table_expired,
              map.occupied());
    std::vector<float> table;
    ASSERT_TRUE(m->GatherTable(k, &table).ok());
    auto weights = (*f)->Get(TableWeightName(c.tables(k)), {rows, 8});
    ASSERT_TRUE(weights.ok()) << weights.status();
    EXPECT_TRUE(std::equal(weights->begin(), weights->end(), table.begin(),
                           table.end()));
    expired += table_expired;
  }
  // C1's time to live (4 steps) ran out for some of its ids.
  EXPECT_GT(expired, 0);
  // A static table has no ids to gather.
  std::vector<int64_t> none;
  EXPECT_EQ(m->GatherTableIds(2, &none).code(),
            absl::StatusCode::kFailedPrecondition);
  m.reset();
  fs::remove_all(dir);
}

// DynamicConfig with capacities (C1 1200, C2 900 rows) large enough that
// no bucket of a shard overflows when the ids are re-routed, and C2's
// unadmitted ids pooling zero unless `shared_row` (each row-wise shard
// trains a shared row of its own: no restore on another shard count can
// give every id the one it pooled).
ModelConfig RerouteConfig(bool rocksdb, const fs::path& dir,
                          bool shared_row = false) {
  ModelConfig c = DynamicConfig();
  c.mutable_tables(0)->set_rows(1200);
  c.mutable_tables(1)->set_rows(900);
  if (!shared_row) c.mutable_tables(1)->set_unadmitted(UNADMITTED_ZERO);
  if (rocksdb) c = DynamicTablesOnRocksDb(c, dir);
  return c;
}

// A one-process model of `c` with C1 and C2 in `shards` row-wise shards
// (ids routed by hash), all on its one rank, over `comm`.
std::unique_ptr<Model> MakeRowWise(ModelConfig c, int shards,
                                   comm::Communicator* comm) {
  for (int k = 0; k < 2; ++k) {
    TableConfig* t = c.mutable_tables(k);
    t->set_sharding(SHARDING_ROW_WISE);
    for (int i = 0; i < shards; ++i) t->add_shard_ranks(0);
  }
  embedding::PlannerOptions po;
  auto plan = embedding::PlanSharding(c, po);
  EXPECT_TRUE(plan.ok()) << plan.status();
  if (!plan.ok()) return nullptr;
  auto m = Model::Create(c, *plan, comm);
  EXPECT_TRUE(m.ok()) << m.status();
  return m.ok() ? *std::move(m) : nullptr;
}

// What the shards of dynamic table `k` hold, by id: the id's record
// (weights, and optimizer state unless `weights_only`), its last step and
// sightings, whatever shard and row it is in (expecting a row-wise
// shard's ids to be those DynamicRowShard gives it).
std::map<int64_t, std::vector<float>> ById(Model& m, int k,
                                           bool weights_only = false) {
  std::map<int64_t, std::vector<float>> out;
  for (const auto& [shard, d] : DynamicShardsOf(m, k)) {
    const embedding::TableSpec& spec = d->spec();
    const int64_t floats =
        spec.dim + embedding::StateFloatsPerRow(spec.optimizer, spec.dim);
    const embedding::DynamicIdMap& map = d->map();
    for (int64_t r = 0; r < map.usable_rows(); ++r) {
      const int64_t id = map.keys()[r];
      if (id < 0) continue;
      const embedding::TablePlacement& p = m.plan().tables[k];
      if (p.kind == SHARDING_ROW_WISE) {
        EXPECT_EQ(
            embedding::DynamicRowShard(id, static_cast<int>(p.shards.size())),
            shard)
            << "id " << id;
      }
      std::vector<float> record(floats);
      EXPECT_TRUE(d->ReadRows(r, 1, record.data()).ok());
      if (weights_only) record.resize(spec.dim);
      record.push_back(static_cast<float>(map.last_steps()[r]));
      record.push_back(static_cast<float>(map.sightings()[r]));
      EXPECT_TRUE(out.emplace(id, std::move(record)).second)
          << "id " << id << " in two shards";
    }
  }
  return out;
}

// Expects `got` to hold the ids of `want` with the same records, naming the
// first few that differ.
void ExpectSameIds(const std::map<int64_t, std::vector<float>>& got,
                   const std::map<int64_t, std::vector<float>>& want,
                   const std::string& what) {
  EXPECT_EQ(got.size(), want.size()) << what;
  int reported = 0;
  for (const auto& [id, record] : want) {
    const auto it = got.find(id);
    if (it != got.end() && it->second == record) continue;
    ADD_FAILURE() << what << ": id " << id
                  << (it == got.end() ? " is missing" : " differs");
    if (++reported == 5) break;
  }
}

std::vector<float> Probabilities(Model& m, const data::Batch& b) {
  std::vector<float> probs;
  EXPECT_TRUE(m.Predict(b, &probs).ok());
  return probs;
}

class DynamicRerouteTest : public ::testing::TestWithParam<bool> {};

// C1 and C2 row-wise in 2 shards (one process): a checkpoint restores onto
// 3 shards, 1 and a whole table (and loads whole, weights only too) with
// every id, its record, last step and sightings in the shard its hash names,
// so predictions are the saved ones; onto the same 2 shards it is the saved
// state bit for bit and trains on identically.
TEST_P(DynamicRerouteTest, ReroutesTheIdsByHash) {
  const bool rocksdb = GetParam();
  const fs::path dir = fs::path(::testing::TempDir()) /
                       absl::StrCat("dynamic_reroute_", rocksdb, "_", getpid());
  fs::remove_all(dir);
  const ModelConfig c = RerouteConfig(rocksdb, dir);
  std::unique_ptr<comm::Communicator> one = comm::MakeSingleRankCommunicator();
  std::unique_ptr<Model> m = MakeRowWise(c, 2, one.get());
  ASSERT_NE(m, nullptr);
  const std::vector<data::Batch> batches = Batches(c, 7);
  const auto first = TrainOn(*m, batches, 0, 4);
  ASSERT_TRUE(first.ok()) << first.status();
  const std::string ckpt = (dir / "ckpt").string();
  ASSERT_TRUE(SaveCheckpoint(*m, ckpt).ok());
  const std::vector<float> probs = Probabilities(*m, batches[6]);
  const auto c1 = ById(*m, 0), c2 = ById(*m, 1);
  ASSERT_GT(c1.size(), 100u);
  ASSERT_GT(c2.size(), 20u);
  const absl::StatusOr<std::vector<double>> trained =
      TrainOn(*m, batches, 4, 6);
  ASSERT_TRUE(trained.ok()) << trained.status();
  const std::vector<double>& losses = *trained;
  auto expect_saved = [&](Model& got, const std::string& what) {
    ExpectSameIds(ById(got, 0), c1, what + ", C1");
    ExpectSameIds(ById(got, 1), c2, what + ", C2");
    const std::vector<float> p = Probabilities(got, batches[6]);
    ASSERT_EQ(p.size(), probs.size()) << what;
    for (size_t i = 0; i < p.size(); ++i) {
      EXPECT_NEAR(p[i], probs[i], 1e-6) << what << ", sample " << i;
    }
  };
  for (int shards : {3, 1}) {
    std::unique_ptr<Model> other = MakeRowWise(c, shards, one.get());
    ASSERT_NE(other, nullptr);
    ASSERT_TRUE(RestoreCheckpoint(*other, ckpt).ok()) << shards;
    expect_saved(*other, absl::StrCat(shards, " shards"));
    auto r = other->TrainStep(batches[4]);
    EXPECT_TRUE(r.ok()) << r.status();
  }
  {
    // Table-wise (a model of its own: its RocksDB directory differs).
    std::unique_ptr<Model> whole = Make(c);
    ASSERT_NE(whole, nullptr);
    ASSERT_TRUE(RestoreCheckpoint(*whole, ckpt).ok());
    expect_saved(*whole, "whole");
  }
  for (bool weights_only : {false, true}) {
    auto loaded = LoadCheckpoint(ckpt, weights_only);
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    if (weights_only) {
      // The saved weights, last steps and sightings (the state is fresh).
      for (const auto& [k, saved] : {std::pair{0, &c1}, std::pair{1, &c2}}) {
        std::map<int64_t, std::vector<float>> want;
        for (const auto& [id, record] : *saved) {
          std::vector<float> w(record.begin(), record.begin() + 8);
          w.insert(w.end(), record.end() - 2, record.end());
          want.emplace(id, std::move(w));
        }
        ExpectSameIds(ById(**loaded, k, /*weights_only=*/true), want,
                      absl::StrCat("weights only, table ", k));
      }
      const std::vector<float> p = Probabilities(**loaded, batches[6]);
      for (size_t i = 0; i < p.size(); ++i) {
        EXPECT_NEAR(p[i], probs[i], 1e-6) << "weights only, sample " << i;
      }
    } else {
      expect_saved(**loaded, "loaded");
    }
  }
  // The same shards: the saved maps and rows as they are, and the same
  // steps train identically.
  std::unique_ptr<Model> same = MakeRowWise(c, 2, one.get());
  ASSERT_NE(same, nullptr);
  ASSERT_TRUE(RestoreCheckpoint(*same, ckpt).ok());
  ExpectSameIds(ById(*same, 0), c1, "same shards, C1");
  ExpectSameIds(ById(*same, 1), c2, "same shards, C2");
  for (int i = 4; i < 6; ++i) {
    auto r = same->TrainStep(batches[i]);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->loss, losses[i - 4]) << "step " << i;
  }
  ExpectSameIds(ById(*same, 0), ById(*m, 0), "trained on, C1");
  ExpectSameIds(ById(*same, 1), ById(*m, 1), "trained on, C2");
  same.reset();
  m.reset();
  fs::remove_all(dir);
}

// Onto smaller shards (DynamicConfig's 120 rows of C1 in 4 shards of 30)
// some buckets get more saved ids than rows: each keeps its most recently
// seen, with their saved records, and counts the others as evicted.
TEST(DynamicRerouteTest, ASmallerShardKeepsTheMostRecentlySeen) {
  const fs::path dir = fs::path(::testing::TempDir()) /
                       absl::StrCat("dynamic_overflow_", getpid());
  fs::remove_all(dir);
  ModelConfig c = DynamicConfig();
  c.mutable_tables(0)->clear_eviction();  // no time to live: ids stay
  std::unique_ptr<comm::Communicator> one = comm::MakeSingleRankCommunicator();
  std::unique_ptr<Model> m = Make(c);
  ASSERT_NE(m, nullptr);
  for (const data::Batch& b : Batches(c, 6)) ASSERT_TRUE(m->TrainStep(b).ok());
  const auto saved = ById(*m, 0);
  const std::string ckpt = (dir / "ckpt").string();
  ASSERT_TRUE(SaveCheckpoint(*m, ckpt).ok());
  std::unique_ptr<Model> four = MakeRowWise(c, 4, one.get());
  ASSERT_NE(four, nullptr);
  ASSERT_TRUE(RestoreCheckpoint(*four, ckpt).ok());
  const auto kept = ById(*four, 0);
  int64_t evicted = 0;
  for (int j = 0; j < four->shards().size(); ++j) {
    if (four->shards()[j].table != 0) continue;
    evicted += four->shards().store(j)->metrics().ids_evicted;
  }
  ASSERT_GT(evicted, 0) << saved.size() << " ids into 4 x 29 rows";
  EXPECT_EQ(static_cast<int64_t>(kept.size()) + evicted,
            static_cast<int64_t>(saved.size()));
  // Each kept id with its saved record; none left out was seen after one
  // kept in the same shard and bucket.
  for (const auto& [id, record] : kept) {
    ASSERT_TRUE(saved.contains(id)) << id;
    EXPECT_EQ(record, saved.at(id)) << id;
  }
  for (int j = 0; j < four->shards().size(); ++j) {
    if (four->shards()[j].table != 0) continue;
    const auto* d =
        dynamic_cast<const embedding::DynamicStore*>(four->shards().store(j));
    ASSERT_NE(d, nullptr);
    const embedding::DynamicIdMap& map = d->map();
    for (const auto& [id, record] : saved) {
      if (kept.contains(id) ||
          embedding::DynamicRowShard(id, 4) != four->shards()[j].shard) {
        continue;
      }
      const int64_t b = map.Bucket(id);
      for (int64_t r = map.BucketBegin(b);
           r < map.BucketBegin(b) + map.BucketSize(b); ++r) {
        // The left-out id's last step (record's second-to-last entry).
        EXPECT_GE(map.last_steps()[r], record[record.size() - 2]) << id;
      }
    }
  }
  fs::remove_all(dir);
}

// The record of the kept row of every shard of table `k`, in shard order.
std::vector<std::vector<float>> KeptRows(Model& m, int k) {
  std::vector<std::vector<float>> out;
  for (const DynamicShard& s : DynamicShardsOf(m, k)) {
    embedding::DynamicStore* d = s.store;
    const embedding::TableSpec& spec = d->spec();
    std::vector<float> record(
        spec.dim + embedding::StateFloatsPerRow(spec.optimizer, spec.dim));
    EXPECT_TRUE(d->ReadRows(d->map().kept_row(), 1, record.data()).ok());
    out.push_back(std::move(record));
  }
  return out;
}

// UNADMITTED_SHARED_ROW: each row-wise shard trains a kept row of its own;
// re-routed onto another shard count, every shard takes the saved first
// shard's (docs/dynamic.md).
TEST(DynamicRerouteTest, EveryShardTakesTheFirstShardsKeptRow) {
  const fs::path dir =
      fs::path(::testing::TempDir()) / absl::StrCat("dynamic_kept_", getpid());
  fs::remove_all(dir);
  const ModelConfig c = RerouteConfig(false, dir, /*shared_row=*/true);
  std::unique_ptr<comm::Communicator> one = comm::MakeSingleRankCommunicator();
  std::unique_ptr<Model> m = MakeRowWise(c, 2, one.get());
  ASSERT_NE(m, nullptr);
  for (const data::Batch& b : Batches(c, 4)) {
    ASSERT_TRUE(m->TrainStep(b).ok());
  }
  const std::vector<std::vector<float>> saved = KeptRows(*m, 1);
  ASSERT_EQ(saved.size(), 2u);
  ASSERT_NE(saved[0], saved[1]);  // both trained, apart
  const std::string ckpt = (dir / "ckpt").string();
  ASSERT_TRUE(SaveCheckpoint(*m, ckpt).ok());
  std::unique_ptr<Model> three = MakeRowWise(c, 3, one.get());
  ASSERT_NE(three, nullptr);
  ASSERT_TRUE(RestoreCheckpoint(*three, ckpt).ok());
  const std::vector<std::vector<float>> kept = KeptRows(*three, 1);
  ASSERT_EQ(kept.size(), 3u);
  for (const auto& row : kept) EXPECT_EQ(row, saved[0]);
  // On the same 2 shards each keeps its own.
  std::unique_ptr<Model> two = MakeRowWise(c, 2, one.get());
  ASSERT_NE(two, nullptr);
  ASSERT_TRUE(RestoreCheckpoint(*two, ckpt).ok());
  EXPECT_EQ(KeptRows(*two, 1), saved);
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Tiers, DynamicRerouteTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "RocksDb" : "Host";
                         });

// The planner's per-rank bytes count a dynamic table's id map: a budget of
// exactly a table's weights and state places it whole when static, but not
// when dynamic until the map's bytes (DynamicMapBytes) are added; under a
// budget too small for it whole, row-wise Adagrad splits a dynamic table by
// rows as it does a static one.
TEST(DynamicPlannerTest, CountsTheMapsBytes) {
  auto fixed = NormalizedText(
      "num_dense_features: 2 embedding_dim: 8 tables { name: \"t\" rows: 4000 "
      "} bottom_mlp: [8] top_mlp: [1] sparse_optimizer { type: ADAGRAD }");
  ASSERT_TRUE(fixed.ok()) << fixed.status();
  ModelConfig dynamic = *fixed;
  dynamic.mutable_tables(0)->set_dynamic(true);
  const TableConfig& t = dynamic.tables(0);
  const int64_t rows_bytes = embedding::ShardBytes({0, 0, t.rows(), 0, t.dim()},
                                                   dynamic.sparse_optimizer());
  const int64_t map_bytes = embedding::DynamicMapBytes(t);
  ASSERT_GT(map_bytes, 0);
  ASSERT_EQ(map_bytes,
            embedding::DynamicIdMap::BytesFor(embedding::DynamicIdOptionsFor(
                t.admission(), t.eviction(), t.rows(), 0)));
  embedding::PlannerOptions po;
  po.memory_budget_bytes = rows_bytes;
  auto plan = embedding::PlanSharding(*fixed, po);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->tables[0].kind, SHARDING_TABLE_WISE);
  auto refused = embedding::PlanSharding(dynamic, po);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted)
      << refused.status();
  po.memory_budget_bytes = rows_bytes + map_bytes;
  plan = embedding::PlanSharding(dynamic, po);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->tables[0].kind, SHARDING_TABLE_WISE);

  // On 2 ranks with room for a little over half of it: by rows, each
  // shard's map counted over its own rows.
  po.world_size = 2;
  po.memory_budget_bytes = rows_bytes / 2 + map_bytes / 2 + 1024;
  for (const ModelConfig* config : {&*fixed, &dynamic}) {
    plan = embedding::PlanSharding(*config, po);
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_EQ(plan->tables[0].kind, SHARDING_ROW_WISE);
    EXPECT_EQ(plan->tables[0].shards.size(), 2u);
  }
  // A budget that holds half of the rows but not their maps.
  po.memory_budget_bytes = rows_bytes / 2 + 1024;
  EXPECT_TRUE(embedding::PlanSharding(*fixed, po).ok());
  EXPECT_EQ(embedding::PlanSharding(dynamic, po).status().code(),
            absl::StatusCode::kResourceExhausted);
}

// The error of `extra` added to a one-table config, or OK.
absl::Status ConfigError(const std::string& table,
                         const std::string& extra = "") {
  return NormalizedText(
             absl::StrCat("num_dense_features: 2 embedding_dim: 4 tables { "
                          "name: \"t\" ",
                          table, " } bottom_mlp: [4] top_mlp: [1] ", extra))
      .status();
}

TEST(DynamicConfigTest, RefusesBadFieldsNamingThem) {
  // A table's fields, and the field its error must name.
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"rows: 1 dynamic: true", "tables[0].rows"},
      {"rows: 0 dynamic: true", "tables[0].rows"},
      {"rows: 10 eviction { kind: EVICT_LFU }", "tables[0].eviction"},
      {"rows: 10 admission { kind: ADMIT_ALWAYS }", "tables[0].admission"},
      {"rows: 10 unadmitted: UNADMITTED_SHARED_ROW", "tables[0].unadmitted"},
      {"rows: 10 dynamic: true sharding: SHARDING_DATA_PARALLEL",
       "tables[0].sharding"},
      {"rows: 10 dynamic: true admission { min_sightings: -1 }",
       "tables[0].admission.min_sightings"},
      {"rows: 10 dynamic: true admission { kind: ADMIT_WITH_PROBABILITY }",
       "tables[0].admission.probability"},
      {"rows: 10 dynamic: true admission { kind: ADMIT_WITH_PROBABILITY "
       "probability: 1.5 }",
       "tables[0].admission.probability"},
      {"rows: 10 dynamic: true eviction { ttl_steps: -3 }",
       "tables[0].eviction.ttl_steps"},
      {"rows: 10 dynamic: true eviction { kind: 7 }",
       "tables[0].eviction.kind"},
      {"rows: 10 dynamic: true admission { kind: 9 }",
       "tables[0].admission.kind"},
      {"rows: 10 dynamic: true unadmitted: 5", "tables[0].unadmitted"},
  };
  for (const auto& [table, field] : bad) {
    SCOPED_TRACE(table);
    test::ExpectInvalid(ConfigError(table), field);
  }
  EXPECT_TRUE(ConfigError("rows: 2 dynamic: true").ok());
  // Row-wise: each id to the shard its hash names.
  EXPECT_TRUE(
      ConfigError("rows: 10 dynamic: true sharding: SHARDING_ROW_WISE").ok());
  // No max_rows_per_table cap on a dynamic table's capacity; 0 sightings
  // means 2.
  auto c = NormalizedText(
      "num_dense_features: 2 embedding_dim: 4 tables { name: \"t\" rows: 100 "
      "dynamic: true admission { kind: ADMIT_AFTER_SIGHTINGS } } "
      "bottom_mlp: [4] top_mlp: [1] max_rows_per_table: 10");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->tables(0).rows(), 100);
  EXPECT_EQ(c->tables(0).admission().min_sightings(), 2);
}

}  // namespace
}  // namespace dlrm::model
