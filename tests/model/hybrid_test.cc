// Multi-rank tests of the hybrid-parallel step (model/hybrid_model.h) with
// real processes on loopback: the binary re-executes itself as N ranks that
// meet at a coordinator and talk through Gloo, and the parent compares what
// rank 0 reports with a single-process Model on the same global batches,
// or with the same job in host memory when the tables are on RocksDB (also
// over-capacity batches, prefetch, and multi-rank checkpoints through
// server::RankGroup).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "comm/coordinator.h"
#include "comm/gloo_communicator.h"
#include "comm/host_staged_communicator.h"
#include "core/config.h"
#include "core/status.h"
#include "data/synthetic.h"
#include "embedding/dynamic_store.h"
#include "embedding/sharding.h"
#include "model/model.h"
#include "server/rank_group.h"
#include "tests/support/process.h"
#include "tests/support/ranks.h"
#include "tests/support/sharding.h"

namespace dlrm::model {
namespace {

constexpr int kSteps = 4;

// The four-table model (tests/support/sharding.h) in fp32: under bf16 a
// last-bit difference of a sum can cross a rounding boundary, beyond these
// tests' float tolerances.
ModelConfig TestConfig() {
  return test::FourTableConfig("dense_precision: PRECISION_FP32");
}

// A scenario is a sharding kind and modifiers, "kind+mod+mod":
// - overlap: the dense all-reduce on a second communicator, overlapped with
//   the backward pass;
// - host: larger tables (RocksDbTestConfig) in host memory;
// - rocksdb: the same tables on RocksDB behind a cache of 10% of each
//   shard's rows (table d stays in host memory in the table-wise kind, so
//   one model mixes the tiers);
// - prefetch: TrainStep gets the next batch; prefetch0: on rank 0 only
//   (the others send no samples to the prefetch);
// - overcap: before step 2, a batch over a shard's cache must fail on every
//   rank and change nothing;
// - ckpt: through server::RankGroup: 2 steps, a checkpoint, 4 steps, a
//   restore, the same 4 steps again;
// - resume: through server::RankGroup: restores ckpt's checkpoint in new
//   processes and trains its last 4 steps;
// - adagrad: row-wise Adagrad on the tables instead of Adam;
// - lamb, lars: LAMB or LARS on the dense parameters, with a warm-up and a
//   decay on both optimizers (LearningRateSchedule);
// - dcn: the DCN interaction (2 cross layers of rank 6 over the 80-wide
//   input) instead of dot;
// - dense_adagrad, dense_adam: that optimizer for the dense parameters
//   instead of SGD;
// - staged: the output and backward dists over a host-staged device
//   communicator (comm/host_staged_communicator.h) over the CPU Device:
//   the device step's exchange layout, host copies of host tables and
//   staging, run in host memory (Model::Create's device_comm);
// - dynamic: every table dynamic (docs/dynamic.md), its rows the capacity
//   of a map the batches' ids (below the rows) go through; table d's 7
//   rows (one bucket of 6) refuse some;
// - churn: the batches' ids drawn from a vocabulary of 5x the largest
//   table's rows, and tables a and c admitting an id after 2 sightings
//   (with dynamic: the maps admit, evict and refuse);
// - fp16, bf16: every table's weights in 16 bits (weight_precision).
// The kind "hashed" (for dynamic tables) puts tables a and b row-wise over
// every rank (ids routed by hash), c column-wise and d table-wise on the
// last rank; one process compares with the same plan's shards all on its
// rank (the same maps: HashedOneProcessPlan).
struct Scenario {
  std::string kind;
  bool staged = false, overlap = false, host = false, rocksdb = false,
       prefetch = false, prefetch0 = false, overcap = false, ckpt = false,
       resume = false, adagrad = false, lamb = false, lars = false, dcn = false,
       dense_adagrad = false, dense_adam = false, dynamic = false,
       churn = false;
  RowPrecision rows_precision = ROW_FP32;
  // Larger tables, other batches.
  bool big() const { return host || rocksdb; }
};

Scenario ParseScenario(const std::string& text) {
  Scenario s;
  size_t at = text.find('+');
  s.kind = text.substr(0, at);
  while (at != std::string::npos) {
    const size_t next = text.find('+', at + 1);
    const std::string mod = text.substr(at + 1, next - at - 1);
    s.overlap |= mod == "overlap";
    s.staged |= mod == "staged";
    s.host |= mod == "host";
    s.rocksdb |= mod == "rocksdb";
    s.prefetch |= mod == "prefetch" || mod == "prefetch0";
    s.prefetch0 |= mod == "prefetch0";
    s.overcap |= mod == "overcap";
    s.ckpt |= mod == "ckpt";
    s.resume |= mod == "resume";
    s.adagrad |= mod == "adagrad";
    s.lamb |= mod == "lamb";
    s.lars |= mod == "lars";
    s.dcn |= mod == "dcn";
    s.dense_adagrad |= mod == "dense_adagrad";
    s.dense_adam |= mod == "dense_adam";
    s.dynamic |= mod == "dynamic";
    s.churn |= mod == "churn";
    if (mod == "fp16") s.rows_precision = ROW_FP16;
    if (mod == "bf16") s.rows_precision = ROW_BF16;
    at = next;
  }
  return s;
}

// TestConfig's architecture with tables large enough for a cache of 10% of
// a shard's rows to hold a batch's ids, and small enough that a few steps
// touch more rows than the cache holds (rows spill to RocksDB and come
// back).
ModelConfig RocksDbTestConfig() {
  ModelConfig c = TestConfig();
  const int64_t rows[] = {800, 2000, 1200, 1000};
  for (int k = 0; k < c.tables_size(); ++k)
    c.mutable_tables(k)->set_rows(rows[k]);
  return c;
}

// Where a scenario's ranks keep their databases (under the report's path).
std::string RocksDbDir(const std::string& out) { return out + ".rocksdb"; }
// Where ckpt writes and resume reads the checkpoint.
std::string CheckpointDir(const std::string& out) { return out + ".ckpt"; }

int StepsOf(const Scenario& s) { return s.big() ? 6 : kSteps; }

// Pins every table for `scenario` on `world` ranks; `out` is the report's
// path (RocksDB scenarios keep their databases next to it).
ModelConfig ScenarioConfig(const std::string& text, int world,
                           const std::string& out = "") {
  const Scenario sc = ParseScenario(text);
  const std::string& scenario = sc.kind;
  ModelConfig c = sc.big() ? RocksDbTestConfig() : TestConfig();
  if (sc.adagrad) {
    c.mutable_sparse_optimizer()->set_type(OptimizerConfig::ADAGRAD);
  }
  if (sc.dcn) {
    c.set_interaction(INTERACTION_DCN);
    c.set_dcn_num_layers(2);
    c.set_dcn_low_rank_dim(6);
  }
  if (sc.dense_adagrad || sc.dense_adam) {
    c.mutable_dense_optimizer()->Clear();
    c.mutable_dense_optimizer()->set_type(
        sc.dense_adam ? OptimizerConfig::ADAM : OptimizerConfig::ADAGRAD);
    c.mutable_dense_optimizer()->set_learning_rate(0.01f);
  }
  if (sc.adagrad || sc.dcn || sc.dense_adagrad || sc.dense_adam) {
    auto normalised = NormalizeModelConfig(c);
    EXPECT_TRUE(normalised.ok()) << normalised.status();
    c = *normalised;
  }
  if (sc.lamb || sc.lars) {
    // Schedules that change the rate at every one of the steps run.
    OptimizerConfig* dense = c.mutable_dense_optimizer();
    dense->Clear();
    dense->set_type(sc.lamb ? OptimizerConfig::LAMB : OptimizerConfig::LARS);
    dense->set_learning_rate(sc.lamb ? 0.01f : 1.0f);
    dense->set_weight_decay(0.01f);
    if (sc.lars) {
      dense->set_momentum(0.9f);
      dense->set_trust_coefficient(0.02f);
    }
    dense->mutable_schedule()->set_warmup_steps(3);
    dense->mutable_schedule()->set_warmup_start_factor(0.2f);
    PolynomialDecay* decay =
        dense->mutable_schedule()->mutable_polynomial_decay();
    decay->set_decay_start_step(3);
    decay->set_decay_steps(4);
    LearningRateSchedule* sparse =
        c.mutable_sparse_optimizer()->mutable_schedule();
    sparse->set_warmup_steps(2);
    sparse->mutable_step_decay()->set_decay_start_step(2);
    sparse->mutable_step_decay()->set_step_size(1);
    sparse->mutable_step_decay()->set_gamma(0.8f);
    auto normalised = NormalizeModelConfig(c);
    EXPECT_TRUE(normalised.ok()) << normalised.status();
    c = *normalised;
  }
  if (sc.rocksdb) {
    RocksDbConfig r;
    r.set_path(RocksDbDir(out));
    r.set_cache_fraction(0.1);
    std::vector<std::string> names = {"a", "b", "c"};
    if (scenario != "table") names.push_back("d");
    auto placed = PlaceTablesOnRocksDb(c, names, r);
    EXPECT_TRUE(placed.ok()) << placed.status();
    c = *placed;
  }
  for (int k = 0; k < c.tables_size(); ++k) {
    TableConfig* t = c.mutable_tables(k);
    if (scenario == "hashed") {
      const ShardingKind kinds[] = {SHARDING_ROW_WISE, SHARDING_ROW_WISE,
                                    SHARDING_COLUMN_WISE, SHARDING_TABLE_WISE};
      t->set_sharding(kinds[k]);
      if (k == 3) t->add_shard_ranks(world - 1);
    } else {
      test::ShardTableAs(scenario, k, world, t);
    }
    if (sc.dynamic) t->set_dynamic(true);
    if (sc.churn && (k == 0 || k == 2)) {
      t->mutable_admission()->set_kind(Admission::ADMIT_AFTER_SIGHTINGS);
      t->mutable_admission()->set_min_sightings(2);
    }
    t->set_weight_precision(sc.rows_precision);
  }
  return c;
}

// The one-process reference of "hashed" on `world` ranks: the same config
// with every shard on rank 0 (a and b in `world` row-wise shards, so that
// each shard's map sees the ids a rank's does), and its plan.
std::pair<ModelConfig, embedding::ShardingPlan> HashedOneProcessPlan(
    ModelConfig c, int world) {
  for (int k = 0; k < c.tables_size(); ++k) {
    TableConfig* t = c.mutable_tables(k);
    t->clear_shard_ranks();
    const int shards = t->sharding() == SHARDING_ROW_WISE ? world : 1;
    for (int i = 0; i < shards; ++i) t->add_shard_ranks(0);
  }
  auto plan = test::PlanOver(c, 1);
  EXPECT_TRUE(plan.ok()) << plan.status();
  return {c, *plan};
}

// Empties the bag of every fifth sample of `feature` (the synthetic source
// never makes empty bags).
void EmptySomeBags(data::SparseFeature& feature) {
  data::SparseFeature out;
  out.offsets.push_back(0);
  for (int64_t s = 0; s < feature.num_bags(); ++s) {
    if (s % 5 != 0) {
      out.ids.insert(out.ids.end(), feature.ids.begin() + feature.offsets[s],
                     feature.ids.begin() + feature.offsets[s + 1]);
    }
    out.offsets.push_back(static_cast<int64_t>(out.ids.size()));
  }
  feature = std::move(out);
}

// The global batches every rank (and the reference) trains on, with empty
// bags in a mean-pooled and a sum-pooled multi-hot table. Big scenarios
// draw ids nearly uniformly (Zipf 0.3), so that rows spill from the caches.
std::vector<data::Batch> GlobalBatches(const ModelConfig& c, int64_t size,
                                       const Scenario& sc = {}) {
  data::SyntheticOptions o;
  o.sample_seed = 99;
  if (sc.big()) o.zipf_alpha = 0.3;
  if (sc.churn) {
    for (const TableConfig& t : c.tables()) {
      o.vocabulary = std::max<int64_t>(o.vocabulary, 5 * t.rows());
    }
  }
  auto src = data::MakeSyntheticSource(c, o);
  EXPECT_TRUE(src.ok()) << src.status();
  std::vector<data::Batch> batches(StepsOf(sc));
  for (auto& b : batches) {
    auto more = (*src)->Next(size, &b);
    EXPECT_TRUE(more.ok() && *more);
    EmptySomeBags(b.sparse[1]);
    EmptySomeBags(b.sparse[2]);
  }
  return batches;
}

// Rank r's contiguous share of a global batch of `size` samples.
std::pair<int64_t, int64_t> LocalRange(int64_t size, int rank, int world) {
  return {size * rank / world, size * (rank + 1) / world};
}

// What rank 0 reports: the loss of every step, then every dense weight,
// then every table gathered whole.
struct Report {
  std::vector<double> losses;
  std::vector<float> dense;
  std::vector<std::vector<float>> tables;
};

// Every dense parameter of `m` (the MLPs' and DCN's cross network's), in
// order.
void AppendDense(Model& m, std::vector<float>* out) {
  for (const dense::ParamRef& p : m.dense_params()) {
    out->insert(out->end(), p.value, p.value + p.size);
  }
}

absl::Status WriteReport(const Report& r, const std::string& path) {
  std::ofstream f(path, std::ios::binary);
  auto put = [&f](const void* p, size_t bytes) {
    f.write(static_cast<const char*>(p), static_cast<std::streamsize>(bytes));
  };
  auto put_vec = [&](const auto& v) {
    const uint64_t n = v.size();
    put(&n, sizeof(n));
    put(v.data(), n * sizeof(v[0]));
  };
  put_vec(r.losses);
  put_vec(r.dense);
  const uint64_t tables = r.tables.size();
  put(&tables, sizeof(tables));
  for (const auto& t : r.tables) put_vec(t);
  if (!f) return absl::InternalError("cannot write " + path);
  return absl::OkStatus();
}

Report ReadReport(const std::string& path) {
  Report r;
  std::ifstream f(path, std::ios::binary);
  auto get_vec = [&f](auto& v) {
    uint64_t n = 0;
    f.read(reinterpret_cast<char*>(&n), sizeof(n));
    v.resize(n);
    f.read(reinterpret_cast<char*>(v.data()), n * sizeof(v[0]));
  };
  get_vec(r.losses);
  get_vec(r.dense);
  uint64_t tables = 0;
  f.read(reinterpret_cast<char*>(&tables), sizeof(tables));
  r.tables.resize(tables);
  for (auto& t : r.tables) get_vec(t);
  EXPECT_TRUE(f.good()) << "short report " << path;
  return r;
}

// A rank's place (world, rank, coordinator), then its test's arguments.
struct WorkerArgs : test::RankPlace {
  std::string scenario;
  std::string out;
  int64_t global_batch = 0;
  // Exit abruptly before this step (-1: never): a rank that dies.
  int die_at_step = -1;
};

// Every dense weight and every table gathered whole (collective).
absl::Status Snapshot(Model& m, Report* report) {
  report->dense.clear();
  AppendDense(m, &report->dense);
  report->tables.clear();
  for (int k = 0; k < m.config().tables_size(); ++k) {
    report->tables.emplace_back();
    RETURN_IF_ERROR(m.GatherTable(k, &report->tables.back()));
  }
  return absl::OkStatus();
}

// A global batch of 200 samples whose table-a bags are all different rows:
// more unique ids than any cache of table a (80 rows, 40 per row-wise
// shard) holds.
data::Batch OverCapacityBatch(const ModelConfig& c) {
  data::SyntheticOptions o;
  o.sample_seed = 5;
  auto src = data::MakeSyntheticSource(c, o);
  EXPECT_TRUE(src.ok()) << src.status();
  data::Batch b;
  EXPECT_TRUE((*src)->Next(200, &b).ok());
  for (int64_t i = 0; i < b.size; ++i) b.sparse[0].ids[i] = i;
  return b;
}

// Checks on rank `rank` that `m` refuses `bad` (its slice) with
// ResourceExhausted naming table a, for training and prediction, and that
// nothing changed.
absl::Status ExpectRefused(Model& m, const data::Batch& bad, int rank,
                           int world) {
  Report before, after;
  RETURN_IF_ERROR(Snapshot(m, &before));
  const int64_t steps = m.steps();
  const auto [begin, end] = LocalRange(bad.size, rank, world);
  data::Batch local;
  bad.Slice(begin, end, &local);
  auto check = [&](const absl::Status& s, const char* what) -> absl::Status {
    if (s.code() != absl::StatusCode::kResourceExhausted ||
        s.message().find("table a") == std::string::npos) {
      return absl::InternalError(
          absl::StrCat(what, " of an over-capacity batch: ", s.ToString()));
    }
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(check(m.TrainStep(local).status(), "TrainStep"));
  std::vector<float> probs;
  RETURN_IF_ERROR(check(m.Predict(local, &probs), "Predict"));
  RETURN_IF_ERROR(Snapshot(m, &after));
  if (after.dense != before.dense || after.tables != before.tables ||
      m.steps() != steps) {
    return absl::InternalError("a refused batch changed the model");
  }
  return absl::OkStatus();
}

// Rank 0 of ckpt / resume drives the job through server::RankGroup; the
// others follow. Losses reported: ckpt: steps 0-1, 2-5, then 2-5 again
// after the restore; resume: 2-5 after restoring ckpt's checkpoint. The
// last two entries of `dense` are the probabilities of two samples after
// the last step.
absl::Status RunGroupWorker(const WorkerArgs& a, const Scenario& sc,
                            const ModelConfig& c,
                            std::unique_ptr<comm::Communicator> comm,
                            std::unique_ptr<Model> m) {
  server::RankGroupOptions ro;
  ro.heartbeat_seconds = 1;
  ASSIGN_OR_RETURN(
      std::unique_ptr<server::RankGroup> group,
      server::RankGroup::Create(std::move(comm), std::move(m), ro));
  if (a.rank != 0) return group->Follow();
  const std::vector<data::Batch> batches = GlobalBatches(c, a.global_batch, sc);
  const std::string ckpt = CheckpointDir(a.out);
  Report report;
  auto train = [&](int from, int to) -> absl::Status {
    for (int step = from; step < to; ++step) {
      ASSIGN_OR_RETURN(StepResult r, group->TrainStep(batches[step]));
      report.losses.push_back(r.loss);
    }
    return absl::OkStatus();
  };
  // The probabilities of the first 8 samples of batch 0 right after the
  // save (ckpt) or the restore (resume): report.tables[0].
  auto predict_saved = [&]() -> absl::Status {
    data::Batch eight;
    batches[0].Slice(0, 8, &eight);
    std::vector<float> probs;
    RETURN_IF_ERROR(group->Predict(eight, &probs));
    report.tables.push_back(probs);
    return absl::OkStatus();
  };
  if (sc.ckpt) {
    RETURN_IF_ERROR(train(0, 2));
    RETURN_IF_ERROR(group->SaveCheckpoint(ckpt).status());
    RETURN_IF_ERROR(predict_saved());
    RETURN_IF_ERROR(train(2, 6));
    RETURN_IF_ERROR(group->RestoreCheckpoint(ckpt).status());
    RETURN_IF_ERROR(train(2, 6));
  } else {
    RETURN_IF_ERROR(group->RestoreCheckpoint(ckpt).status());
    RETURN_IF_ERROR(predict_saved());
    RETURN_IF_ERROR(train(2, 6));
  }
  data::Batch two;
  batches[0].Slice(0, 2, &two);
  std::vector<float> probs;
  RETURN_IF_ERROR(group->Predict(two, &probs));
  report.dense = probs;
  RETURN_IF_ERROR(group->Shutdown());
  return WriteReport(report, a.out);
}

// The body of one rank process (test::TestsOrRankMain): `extra` holds the
// scenario, the report file, the global batch and the step it dies at.
absl::Status RunWorker(const test::RankPlace& place, char** extra) {
  const WorkerArgs a{place, extra[0], extra[1], std::atoll(extra[2]),
                     std::atoi(extra[3])};
  const Scenario sc = ParseScenario(a.scenario);
  const ModelConfig c = ScenarioConfig(a.scenario, a.world, a.out);
  ASSIGN_OR_RETURN(embedding::ShardingPlan plan, test::PlanOver(c, a.world));
  comm::GlooOptions go =
      test::RankGloo(a.rank, a.world, a.coordinator, a.scenario, /*connect=*/30,
                     /*op=*/5);
  ASSIGN_OR_RETURN(std::unique_ptr<comm::Communicator> comm,
                   comm::ConnectGloo(go));
  std::unique_ptr<comm::Communicator> dense_comm;
  if (sc.overlap) {
    go.job_id = a.scenario + "-dense";
    ASSIGN_OR_RETURN(dense_comm, comm::ConnectGloo(go));
  }
  std::unique_ptr<comm::Communicator> device_comm;
  if (sc.staged) {
    go.job_id = a.scenario + "-staged";
    ASSIGN_OR_RETURN(std::unique_ptr<comm::Communicator> host,
                     comm::ConnectGloo(go));
    ASSIGN_OR_RETURN(device_comm, comm::MakeHostStagedCommunicator(
                                      std::move(host), DeviceKind::kCpu));
  }
  ASSIGN_OR_RETURN(
      std::unique_ptr<Model> m,
      Model::Create(c, plan, comm.get(), dense_comm.get(), device_comm.get()));
  if (sc.ckpt || sc.resume) {
    return RunGroupWorker(a, sc, c, std::move(comm), std::move(m));
  }
  const std::vector<data::Batch> batches = GlobalBatches(c, a.global_batch, sc);
  const int steps = static_cast<int>(batches.size());
  Report report;
  std::vector<RankTableStore> last_stores;
  for (int step = 0; step < steps; ++step) {
    if (step == a.die_at_step) _exit(3);
    if (sc.overcap && step == 2) {
      RETURN_IF_ERROR(ExpectRefused(*m, OverCapacityBatch(c), a.rank, a.world));
    }
    const auto [begin, end] = LocalRange(a.global_batch, a.rank, a.world);
    data::Batch local, next;
    batches[step].Slice(begin, end, &local);
    const bool has_next =
        sc.prefetch && step + 1 < steps && (!sc.prefetch0 || a.rank == 0);
    if (has_next) batches[step + 1].Slice(begin, end, &next);
    ASSIGN_OR_RETURN(StepResult r,
                     m->TrainStep(local, has_next ? &next : nullptr));
    report.losses.push_back(r.loss);
    last_stores = r.stores;
    // Every exchange moved what docs/hybrid.md's formula says.
    std::vector<int64_t> sizes;
    for (int q = 0; q < a.world; ++q) {
      const auto [b, e] = LocalRange(a.global_batch, q, a.world);
      sizes.push_back(e - b);
    }
    const auto predicted = PredictedExchangeBytes(c, plan, local, sizes, a.rank,
                                                  has_next ? &next : nullptr);
    for (int e = 0; e < StageTimes::kNumExchanges; ++e) {
      if (r.times.bytes_sent[e] != predicted[e]) {
        return absl::InternalError(absl::StrCat(
            "step ", step, ": ", StageTimes::ExchangeName(e), " sent ",
            r.times.bytes_sent[e], " bytes, the formula says ", predicted[e]));
      }
    }
  }
  if (m->shards().has_database()) {
    // The caches were too small for the rows trained: rows went to RocksDB
    // and came back.
    const embedding::StoreMetrics metrics = m->shards().HostCacheMetrics();
    if (metrics.evictions == 0 || metrics.rows_read == 0) {
      return absl::InternalError(absl::StrCat(
          "rank ", a.rank, ": no row spilled and came back (",
          metrics.evictions, " evictions, ", metrics.rows_read, " rows read)"));
    }
    if (sc.prefetch && metrics.prefetch_hits == 0) {
      return absl::InternalError(
          absl::StrCat("rank ", a.rank, ": the prefetch served no row"));
    }
    // The step's report of every rank's caches has this rank's counters
    // as its own stores count them (they change only in a prepare).
    embedding::StoreMetrics reported;
    int64_t cache_rows = 0;
    for (const RankTableStore& t : last_stores) {
      if (t.rank != a.rank) continue;
      reported += t.metrics;
      cache_rows += t.cache_rows;
    }
    if (reported.hits != metrics.hits || reported.misses != metrics.misses ||
        reported.prefetch_hits != metrics.prefetch_hits ||
        reported.evictions != metrics.evictions || cache_rows == 0) {
      return absl::InternalError(absl::StrCat(
          "rank ", a.rank, ": the step reported ", reported.hits, " hits, ",
          reported.misses, " misses, ", reported.prefetch_hits,
          " prefetch hits, ", reported.evictions, " evictions and ", cache_rows,
          " cached rows; the stores count ", metrics.hits, ", ", metrics.misses,
          ", ", metrics.prefetch_hits, ", ", metrics.evictions));
    }
  }
  if (sc.dynamic) {
    // Every shard went through its map, and the step reported the maps.
    int64_t reported = 0;
    for (const RankTableStore& t : last_stores) {
      if (t.rank == a.rank && t.dynamic) reported += t.metrics.ids_admitted;
    }
    int64_t admitted = 0;
    for (int j = 0; j < m->shards().size(); ++j) {
      const auto* d =
          dynamic_cast<const embedding::DynamicStore*>(m->shards().store(j));
      if (d == nullptr) {
        return absl::InternalError(absl::StrCat("rank ", a.rank, ": shard ", j,
                                                " is not a dynamic table's"));
      }
      admitted += d->metrics().ids_admitted;
    }
    if (m->shards().size() > 0 && (admitted == 0 || reported != admitted)) {
      return absl::InternalError(
          absl::StrCat("rank ", a.rank, ": the maps admitted ", admitted,
                       " ids, the step reported ", reported));
    }
    if (sc.churn && !sc.big()) {
      // Every rank's maps together evicted (the step reports them all).
      int64_t evicted = 0;
      for (const RankTableStore& t : last_stores) {
        evicted += t.metrics.ids_evicted;
      }
      if (evicted == 0) {
        return absl::InternalError(
            absl::StrCat("rank ", a.rank, ": no map evicted an id"));
      }
    }
  }
  RETURN_IF_ERROR(Snapshot(*m, &report));
  if (a.rank == 0) RETURN_IF_ERROR(WriteReport(report, a.out));
  return absl::OkStatus();
}

// Starts `world` ranks of `scenario`; returns their pids.
std::vector<pid_t> SpawnRanks(const WorkerArgs& base) {
  std::vector<pid_t> pids;
  for (int r = 0; r < base.world; ++r) {
    pids.push_back(test::SpawnSelf(test::RankArgv(
        "--hybrid-worker", {base.world, r, base.coordinator},
        {base.scenario, base.out, std::to_string(base.global_batch),
         std::to_string(base.die_at_step)})));
  }
  return pids;
}

// The single-process reference on the same global batches: every table
// whole, or for "hashed" on `world` ranks HashedOneProcessPlan's shards.
Report Reference(const ModelConfig& c, const std::vector<data::Batch>& bs,
                 const Scenario& sc = {}, int world = 1) {
  std::unique_ptr<comm::Communicator> one = comm::MakeSingleRankCommunicator();
  absl::StatusOr<std::unique_ptr<Model>> m;
  if (sc.kind == "hashed") {
    const auto [config, plan] = HashedOneProcessPlan(c, world);
    m = Model::Create(config, plan, one.get());
  } else {
    m = Model::Create(c);
  }
  EXPECT_TRUE(m.ok()) << m.status();
  Report r;
  for (const auto& b : bs) {
    auto step = (*m)->TrainStep(b);
    EXPECT_TRUE(step.ok()) << step.status();
    r.losses.push_back(step->loss);
  }
  AppendDense(**m, &r.dense);
  for (int k = 0; k < (*m)->config().tables_size(); ++k) {
    // Through the store: a dynamic table's is no HostStore.
    r.tables.emplace_back();
    EXPECT_TRUE((*m)->GatherTable(k, &r.tables.back()).ok());
  }
  return r;
}

struct Case {
  std::string scenario;
  int world;
  int64_t global_batch;
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << c.scenario << " on " << c.world << " ranks, global batch "
      << c.global_batch;
}

std::string CaseName(const testing::TestParamInfo<Case>& info) {
  std::string scenario = info.param.scenario;
  std::replace(scenario.begin(), scenario.end(), '+', '_');
  return scenario + "_r" + std::to_string(info.param.world) + "_b" +
         std::to_string(info.param.global_batch);
}

class HybridEquivalenceTest : public testing::TestWithParam<Case> {};

// K steps on R ranks equal K steps of one process on the same global
// batches. Tolerance: dense gradients are summed per rank then across ranks
// and row-wise pools shard by shard, so float sums differ in order. Losses
// agree within 1e-5 relative and weights within 1e-5
// absolute (Adam's normalised step turns a last-bit gradient difference
// into up to ~1e-3 of its learning rate). With one rank and no row-wise
// table the arithmetic is the same and the results are bitwise equal.
TEST_P(HybridEquivalenceTest, MatchesOneProcess) {
  const Case& p = GetParam();
  comm::CoordinatorServerOptions so;
  auto coordinator = comm::CoordinatorServer::Start(so);
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  const std::string out = testing::TempDir() + "/hybrid_" + CaseName({p, 0}) +
                          "_" + std::to_string(getpid()) + ".bin";
  const test::RankPlace place{p.world, 0, (*coordinator)->address()};
  WorkerArgs a{place, p.scenario, out, p.global_batch};
  const std::vector<int> codes = test::WaitAll(SpawnRanks(a), 120);
  for (size_t r = 0; r < codes.size(); ++r) {
    ASSERT_EQ(codes[r], 0) << "rank " << r;
  }
  const Report got = ReadReport(out);
  std::filesystem::remove(out);
  const ModelConfig c = ScenarioConfig(p.scenario, p.world);
  const Scenario sc = ParseScenario(p.scenario);
  const Report want =
      Reference(c, GlobalBatches(c, p.global_batch, sc), sc, p.world);
  const std::string kind = sc.kind;
  const bool exact = p.world == 1 && kind != "row" && kind != "mixed";
  ASSERT_EQ(got.losses.size(), want.losses.size());
  for (size_t i = 0; i < want.losses.size(); ++i) {
    EXPECT_NEAR(got.losses[i], want.losses[i],
                exact ? 1e-6 * std::abs(want.losses[i])
                      : 1e-5 * std::abs(want.losses[i]))
        << "step " << i;
  }
  ASSERT_EQ(got.dense.size(), want.dense.size());
  for (size_t i = 0; i < want.dense.size(); ++i) {
    if (exact) {
      ASSERT_EQ(got.dense[i], want.dense[i]) << "dense weight " << i;
    } else {
      ASSERT_NEAR(got.dense[i], want.dense[i], 1e-5) << "dense weight " << i;
    }
  }
  ASSERT_EQ(got.tables.size(), want.tables.size());
  for (size_t k = 0; k < want.tables.size(); ++k) {
    ASSERT_EQ(got.tables[k].size(), want.tables[k].size());
    for (size_t i = 0; i < want.tables[k].size(); ++i) {
      if (exact) {
        ASSERT_EQ(got.tables[k][i], want.tables[k][i])
            << "table " << k << " element " << i;
      } else {
        ASSERT_NEAR(got.tables[k][i], want.tables[k][i], 1e-5)
            << "table " << k << " element " << i;
      }
    }
  }
}

std::vector<Case> Cases() {
  std::vector<Case> cases;
  for (const char* s : {"table", "column", "row", "data", "mixed"}) {
    for (int world : {1, 2, 3, 4}) cases.push_back({s, world, 37});
  }
  cases.push_back({"one_owner", 3, 37});
  // No pins: the planner's own choice (it replicates the 7-row table).
  cases.push_back({"planner", 2, 37});
  cases.push_back({"planner", 3, 37});
  cases.push_back({"mixed+overlap", 2, 37});
  cases.push_back({"mixed+overlap", 3, 37});
  // Fewer samples than ranks: rank 0 has none.
  cases.push_back({"mixed", 4, 3});
  // The layer-wise dense optimizers and schedules: every replica computes
  // the same norms from the all-reduced gradients.
  for (const char* s : {"table+lamb", "table+lars"})
    cases.push_back({s, 1, 37});
  for (const char* s : {"mixed+lamb", "mixed+lars"}) {
    for (int world : {2, 3}) cases.push_back({s, world, 37});
  }
  // DCN: its cross network's gradients all-reduced with the bottom MLP's,
  // overlapped or not, under every dense optimizer; bitwise on one rank.
  cases.push_back({"table+dcn", 1, 37});
  cases.push_back({"mixed+dcn", 2, 37});
  cases.push_back({"mixed+dcn", 4, 37});
  cases.push_back({"mixed+dcn+overlap", 3, 37});
  cases.push_back({"mixed+dcn+dense_adagrad", 3, 37});
  cases.push_back({"mixed+dcn+dense_adagrad+overlap", 2, 37});
  cases.push_back({"table+dcn+dense_adam", 1, 37});
  cases.push_back({"mixed+dcn+dense_adam+overlap", 4, 37});
  cases.push_back({"mixed+dcn", 4, 3});
  // The device step's exchanges, staged through host memory: every kind,
  // one rank included (row-wise: the exchanges run; the others: in place).
  for (const char* s : {"table+staged", "column+staged", "data+staged"}) {
    for (int world : {2, 3}) cases.push_back({s, world, 37});
  }
  for (int world : {1, 2, 3}) cases.push_back({"row+staged", world, 37});
  for (int world : {1, 2, 4}) cases.push_back({"mixed+staged", world, 37});
  cases.push_back({"mixed+staged", 4, 3});
  cases.push_back({"mixed+staged+overlap", 3, 37});
  cases.push_back({"mixed+dcn+staged", 3, 37});
  // Dynamic tables whole or by columns: every shard's map sees every id,
  // on every rank count.
  for (int world : {1, 2, 3}) cases.push_back({"table+dynamic", world, 37});
  for (int world : {2, 3}) cases.push_back({"column+dynamic", world, 37});
  cases.push_back({"planner+dynamic", 3, 37});
  // Row-wise dynamic tables (ids routed to shards by hash) beside a
  // column-wise and a table-wise one, with admission after sightings and
  // evictions: each shard's map sees what one process's same shard sees.
  for (int world : {1, 2, 3, 4}) {
    cases.push_back({"hashed+dynamic+churn", world, 37});
  }
  cases.push_back({"hashed+dynamic+churn+overlap", 3, 37});
  cases.push_back({"hashed+dynamic+churn+staged", 2, 37});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(AllKinds, HybridEquivalenceTest,
                         testing::ValuesIn(Cases()), CaseName);

// Runs `scenario` on `world` ranks with rank 0 reporting to `out`; true
// when every rank exits 0.
bool RunJob(const std::string& scenario, int world, int64_t global_batch,
            const std::string& out) {
  comm::CoordinatorServerOptions so;
  auto coordinator = comm::CoordinatorServer::Start(so);
  EXPECT_TRUE(coordinator.ok()) << coordinator.status();
  if (!coordinator.ok()) return false;
  const test::RankPlace place{world, 0, (*coordinator)->address()};
  WorkerArgs a{place, scenario, out, global_batch};
  const std::vector<int> codes = test::WaitAll(SpawnRanks(a), 120);
  bool ok = true;
  for (size_t r = 0; r < codes.size(); ++r) {
    EXPECT_EQ(codes[r], 0) << scenario << ": rank " << r;
    ok = ok && codes[r] == 0;
  }
  return ok;
}

std::string JobOut(const std::string& scenario) {
  std::string name = scenario;
  std::replace(name.begin(), name.end(), '+', '_');
  return testing::TempDir() + "/hybrid_" + name + "_" +
         std::to_string(getpid()) + ".bin";
}

void ExpectBitwiseEqual(const Report& got, const Report& want) {
  ASSERT_EQ(got.losses.size(), want.losses.size());
  for (size_t i = 0; i < want.losses.size(); ++i) {
    EXPECT_EQ(got.losses[i], want.losses[i]) << "step " << i;
  }
  ASSERT_EQ(got.dense, want.dense);
  ASSERT_EQ(got.tables.size(), want.tables.size());
  for (size_t k = 0; k < want.tables.size(); ++k) {
    ASSERT_EQ(got.tables[k], want.tables[k]) << "table " << k;
  }
}

class HybridRocksDbTest : public testing::TestWithParam<std::string> {};

// Tables on RocksDB behind caches of 10% of each shard's rows, on 2 ranks:
// rows spill and come back (the worker checks the counters), and training
// is bitwise the same job in host memory (the cached tier runs the same
// kernels on the same rows in the same order), and within docs/hybrid.md's
// tolerance of one process.
TEST_P(HybridRocksDbTest, TrainsLikeHostMemory) {
  const std::string scenario = GetParam();
  const Scenario sc = ParseScenario(scenario);
  const std::string host = sc.kind + "+host" + (sc.dynamic ? "+dynamic" : "") +
                           (sc.churn ? "+churn" : "");
  const std::string out = JobOut(scenario), host_out = JobOut(host);
  ASSERT_TRUE(RunJob(scenario, 2, 37, out));
  ASSERT_TRUE(RunJob(host, 2, 37, host_out));
  const Report got = ReadReport(out), want = ReadReport(host_out);
  std::filesystem::remove(out);
  std::filesystem::remove(host_out);
  std::filesystem::remove_all(RocksDbDir(out));
  ExpectBitwiseEqual(got, want);

  const ModelConfig c = ScenarioConfig(host, 2);
  const Scenario host_sc = ParseScenario(host);
  const Report one =
      Reference(c, GlobalBatches(c, 37, host_sc), host_sc, /*world=*/2);
  ASSERT_EQ(got.losses.size(), one.losses.size());
  for (size_t i = 0; i < one.losses.size(); ++i) {
    EXPECT_NEAR(got.losses[i], one.losses[i], 1e-5 * std::abs(one.losses[i]))
        << "step " << i;
  }
  ASSERT_EQ(got.dense.size(), one.dense.size());
  for (size_t i = 0; i < one.dense.size(); ++i) {
    ASSERT_NEAR(got.dense[i], one.dense[i], 1e-5) << "dense weight " << i;
  }
  for (size_t k = 0; k < one.tables.size(); ++k) {
    ASSERT_EQ(got.tables[k].size(), one.tables[k].size());
    for (size_t i = 0; i < one.tables[k].size(); ++i) {
      ASSERT_NEAR(got.tables[k][i], one.tables[k][i], 1e-5)
          << "table " << k << " element " << i;
    }
  }
}

std::string StoreCaseName(const testing::TestParamInfo<std::string>& info) {
  std::string name = info.param;
  std::replace(name.begin(), name.end(), '+', '_');
  return name;
}

INSTANTIATE_TEST_SUITE_P(
    Shards, HybridRocksDbTest,
    testing::Values("table+rocksdb", "column+rocksdb", "row+rocksdb",
                    "mixed+rocksdb", "row+rocksdb+prefetch",
                    "mixed+rocksdb+prefetch0", "table+rocksdb+overcap",
                    "row+rocksdb+overcap", "hashed+dynamic+rocksdb+prefetch"),
    StoreCaseName);

class HybridStagedTest : public testing::TestWithParam<std::string> {};

// The device step's exchanges staged through host memory (a host-staged
// communicator over the CPU Device) move the same floats in the same order
// as the host step's over Gloo: the two jobs are bitwise equal, whatever
// the tables' tier (host memory, or RocksDB through the exchange's host
// copies).
TEST_P(HybridStagedTest, EqualsTheGlooJobBitwise) {
  const std::string scenario = GetParam();
  const std::string staged = scenario + "+staged";
  const std::string out = JobOut(staged), gloo_out = JobOut(scenario);
  ASSERT_TRUE(RunJob(staged, 3, 37, out));
  ASSERT_TRUE(RunJob(scenario, 3, 37, gloo_out));
  const Report got = ReadReport(out), want = ReadReport(gloo_out);
  std::filesystem::remove(out);
  std::filesystem::remove(gloo_out);
  std::filesystem::remove_all(RocksDbDir(out));
  std::filesystem::remove_all(RocksDbDir(gloo_out));
  ExpectBitwiseEqual(got, want);
}

INSTANTIATE_TEST_SUITE_P(Kinds, HybridStagedTest,
                         testing::Values("mixed", "row", "mixed+rocksdb",
                                         "row+rocksdb+prefetch"),
                         StoreCaseName);

class HybridRocksDbCheckpointTest : public testing::TestWithParam<std::string> {
};

// Through server::RankGroup on 2 ranks: a checkpoint after 2 steps holds
// every rank's spilled rows and optimizer state: after 4 more steps a
// restore, in the same job or in new processes, trains those 4 steps again
// bitwise.
TEST_P(HybridRocksDbCheckpointTest, RestoreTrainsOnIdentically) {
  const std::string kind = GetParam();
  const std::string out = JobOut(kind + "+rocksdb+ckpt");
  std::filesystem::remove_all(CheckpointDir(out));
  ASSERT_TRUE(RunJob(kind + "+rocksdb+ckpt", 2, 37, out));
  const Report saved = ReadReport(out);
  const std::filesystem::path ckpt = CheckpointDir(out);
  for (const char* name :
       {"MANIFEST.json", "rank-0.safetensors", "rank-1.safetensors"}) {
    EXPECT_TRUE(std::filesystem::is_regular_file(ckpt / name)) << name;
  }
  for (const char* name : {"rank-0.rocksdb", "rank-1.rocksdb"}) {
    EXPECT_TRUE(std::filesystem::is_directory(ckpt / name)) << name;
  }
  ASSERT_EQ(saved.losses.size(), 10u);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(saved.losses[2 + i], saved.losses[6 + i]) << "step " << 2 + i;
  }
  ASSERT_TRUE(RunJob(kind + "+rocksdb+resume", 2, 37, out));
  const Report resumed = ReadReport(out);
  std::filesystem::remove(out);
  std::filesystem::remove_all(ckpt);
  std::filesystem::remove_all(RocksDbDir(out));
  ASSERT_EQ(resumed.losses.size(), 4u);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(resumed.losses[i], saved.losses[2 + i]) << "step " << 2 + i;
  }
  EXPECT_EQ(resumed.dense, saved.dense);  // the predictions
}

INSTANTIATE_TEST_SUITE_P(Kinds, HybridRocksDbCheckpointTest,
                         testing::Values("mixed", "table", "table+dynamic",
                                         "hashed+dynamic"),
                         StoreCaseName);

// A checkpoint saved by one job, restored by a job of another rank count
// and plan (and, where named, another tier).
struct Reshard {
  std::string saved;  // scenario kind and modifiers of the saving job
  int saved_world;
  std::string restored;
  int restored_world;
  // A dynamic table's ids re-routed by hash (docs/dynamic.md): its maps'
  // buckets differ from the saving job's, so only the predictions right
  // after the restore are the same, not the training after it.
  bool reroutes = false;
};

void PrintTo(const Reshard& r, std::ostream* os) {
  *os << r.saved << " on " << r.saved_world << " -> " << r.restored << " on "
      << r.restored_world;
}

std::string ReshardName(const testing::TestParamInfo<Reshard>& info) {
  std::string name =
      absl::StrCat(info.param.saved, "_r", info.param.saved_world, "_to_",
                   info.param.restored, "_r", info.param.restored_world);
  std::replace(name.begin(), name.end(), '+', '_');
  return name;
}

class HybridReshardTest : public testing::TestWithParam<Reshard> {};

// Through server::RankGroup: a checkpoint after 2 steps restores on another
// rank count with another plan (docs/checkpoints.md "Resharding"): the
// restored job's predictions equal the saving job's right after the save,
// and (unless it re-routes a dynamic table's ids) training the same 4
// steps from there gives the same losses and predictions, up to the float
// summation order of docs/hybrid.md (1e-5).
TEST_P(HybridReshardTest, PredictsAndTrainsOnLikeTheSavingJob) {
  const Reshard& p = GetParam();
  const std::string out = JobOut(ReshardName({p, 0}));
  std::filesystem::remove_all(CheckpointDir(out));
  ASSERT_TRUE(RunJob(p.saved + "+ckpt", p.saved_world, 37, out));
  const Report saved = ReadReport(out);
  ASSERT_TRUE(RunJob(p.restored + "+resume", p.restored_world, 37, out));
  const Report restored = ReadReport(out);
  std::filesystem::remove(out);
  std::filesystem::remove_all(CheckpointDir(out));
  std::filesystem::remove_all(RocksDbDir(out));

  ASSERT_EQ(saved.tables.size(), 1u);
  ASSERT_EQ(restored.tables.size(), 1u);
  ASSERT_EQ(restored.tables[0].size(), 8u);
  for (size_t i = 0; i < 8; ++i) {
    EXPECT_NEAR(restored.tables[0][i], saved.tables[0][i], 1e-6)
        << "sample " << i;
  }
  ASSERT_EQ(saved.losses.size(), 10u);
  ASSERT_EQ(restored.losses.size(), 4u);
  if (p.reroutes) return;
  for (int i = 0; i < 4; ++i) {
    EXPECT_NEAR(restored.losses[i], saved.losses[2 + i],
                1e-5 * std::abs(saved.losses[2 + i]))
        << "step " << 2 + i;
  }
  ASSERT_EQ(restored.dense.size(), saved.dense.size());
  for (size_t i = 0; i < saved.dense.size(); ++i) {
    EXPECT_NEAR(restored.dense[i], saved.dense[i], 1e-5) << "sample " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Plans, HybridReshardTest,
    testing::Values(
        // Host memory: 2 -> 1, 2 -> 3, 1 -> 2.
        Reshard{"mixed+host", 2, "table+host", 1},
        Reshard{"row+host", 2, "column+host", 3},
        Reshard{"table+host", 1, "mixed+host", 2},
        // RocksDB tables: 2 -> 3 and 1 -> 2 on RocksDB, and 2 -> 1 moving
        // every table to host memory.
        Reshard{"mixed+rocksdb", 2, "row+rocksdb", 3},
        Reshard{"table+rocksdb", 1, "mixed+rocksdb", 2},
        Reshard{"row+rocksdb", 2, "table+host", 1},
        // A per-row optimizer state (row-wise Adagrad's accumulator).
        Reshard{"table+host+adagrad", 1, "row+host+adagrad", 2},
        // LAMB's moments and both optimizers' steps, mid-schedule.
        Reshard{"mixed+host+lamb", 2, "table+host+lamb", 1},
        // Dynamic tables' maps, saved whole with each block: 2 -> 3
        // table-wise to column-wise, and 1 -> 2 on RocksDB.
        Reshard{"table+host+dynamic", 2, "column+host+dynamic", 3},
        Reshard{"table+rocksdb+dynamic", 1, "column+rocksdb+dynamic", 2},
        // Row-wise dynamic tables: the ids re-routed by hash into 3 shards,
        // gathered into one table or column blocks, kept in the same 2
        // shards, or routed from a whole table or its column blocks.
        Reshard{"hashed+host+dynamic+churn", 2, "hashed+host+dynamic+churn", 3,
                /*reroutes=*/true},
        Reshard{"hashed+host+dynamic+churn", 2, "table+host+dynamic+churn", 1,
                /*reroutes=*/true},
        Reshard{"hashed+rocksdb+dynamic+churn", 2, "hashed+host+dynamic+churn",
                2},
        Reshard{"table+host+dynamic+churn", 1, "hashed+rocksdb+dynamic+churn",
                3, /*reroutes=*/true},
        Reshard{"column+host+dynamic+churn", 3, "hashed+host+dynamic+churn", 2,
                /*reroutes=*/true},
        Reshard{"hashed+host+dynamic+churn", 3, "column+host+dynamic+churn", 2,
                /*reroutes=*/true},
        // DCN's cross network and its Adam state, saved by rank 0.
        Reshard{"mixed+host+dcn+dense_adam", 2, "table+host+dcn+dense_adam",
                1}),
    ReshardName);

TEST(HybridFailureTest, ADeadRankStopsTheOthersWithAnError) {
  comm::CoordinatorServerOptions so;
  auto coordinator = comm::CoordinatorServer::Start(so);
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  const test::RankPlace place{3, 0, (*coordinator)->address()};
  WorkerArgs a{place, "mixed", testing::TempDir() + "/hybrid_dead.bin", 37,
               /*die_at_step=*/2};
  // Every rank stopped by itself with an error: none was still running at
  // the deadline (the op timeout is 5 s; the deadline leaves start-up and
  // slack on a loaded machine), so none was killed (-1).
  const std::vector<int> codes = test::WaitAll(SpawnRanks(a), 60);
  for (size_t r = 0; r < codes.size(); ++r) {
    EXPECT_GT(codes[r], 0) << "rank " << r;
  }
}

class HybridRowPrecisionTest : public testing::TestWithParam<Case> {};

// `got`, a job of 16-bit rows of `precision` on `world` ranks, against
// `want`, one process: bitwise on one rank without row-wise pooling (`row`
// false); otherwise losses and dense weights within 1e-5, table elements
// within one 16-bit ulp and 99% of them bitwise (see below).
void ExpectSixteenBitRowsLike(const Report& got, const Report& want,
                              RowPrecision precision, int world, bool row,
                              const std::string& what) {
  if (world == 1 && !row) {
    ExpectBitwiseEqual(got, want);
    return;
  }
  ASSERT_EQ(got.losses.size(), want.losses.size());
  for (size_t i = 0; i < want.losses.size(); ++i) {
    EXPECT_NEAR(got.losses[i], want.losses[i], 1e-5 * std::abs(want.losses[i]))
        << "step " << i;
  }
  ASSERT_EQ(got.dense.size(), want.dense.size());
  for (size_t i = 0; i < want.dense.size(); ++i) {
    ASSERT_NEAR(got.dense[i], want.dense[i], 1e-5) << "dense weight " << i;
  }
  // One ulp: 2^-7 (bf16) or 2^-10 (fp16) of the value bounds it.
  const double ulp = precision == ROW_BF16 ? 0x1p-7 : 0x1p-10;
  int64_t elements = 0, same = 0;
  ASSERT_EQ(got.tables.size(), want.tables.size());
  for (size_t k = 0; k < want.tables.size(); ++k) {
    ASSERT_EQ(got.tables[k].size(), want.tables[k].size());
    for (size_t i = 0; i < want.tables[k].size(); ++i) {
      const float g = got.tables[k][i], w = want.tables[k][i];
      ASSERT_NEAR(g, w, 1e-6 + ulp * std::abs(w))
          << "table " << k << " element " << i;
      ++elements;
      same += std::memcmp(&g, &w, sizeof(g)) == 0;
    }
  }
  std::printf("%s on %d ranks: %lld of %lld table elements bitwise equal\n",
              what.c_str(), world, static_cast<long long>(same),
              static_cast<long long>(elements));
  EXPECT_GE(same, elements * 99 / 100);
}

// 16-bit rows (every table fp16 or bf16) on R ranks train like one process:
// each update rounds stochastically by the whole table's row and column,
// so a shard rounds an element as the whole table does. One rank without
// row-wise pooling is bitwise one process. On two ranks the dense
// all-reduce (and row-wise pooling) sums in another order, so a gradient
// may differ in its last bit and move an element across its rounding
// threshold: the tables agree within one 16-bit ulp, and nearly every
// element bitwise (rounding by the shard's own rows would differ in about
// half of the touched elements of a row-wise shard).
TEST_P(HybridRowPrecisionTest, RanksTrainSixteenBitRowsLikeOneProcess) {
  const Case& p = GetParam();
  const std::string out = JobOut(CaseName({p, 0}));
  ASSERT_TRUE(RunJob(p.scenario, p.world, p.global_batch, out));
  const Report got = ReadReport(out);
  std::filesystem::remove(out);
  const ModelConfig c = ScenarioConfig(p.scenario, p.world);
  const Report want = Reference(c, GlobalBatches(c, p.global_batch));
  const Scenario sc = ParseScenario(p.scenario);
  ASSERT_NE(sc.rows_precision, ROW_FP32);
  ExpectSixteenBitRowsLike(got, want, sc.rows_precision, p.world,
                           sc.kind == "row", p.scenario);
}

INSTANTIATE_TEST_SUITE_P(
    SixteenBitRows, HybridRowPrecisionTest,
    testing::Values(Case{"table+bf16", 1, 37}, Case{"table+bf16", 2, 37},
                    Case{"row+bf16", 2, 37}, Case{"row+fp16", 2, 37},
                    Case{"data+bf16", 2, 37}, Case{"mixed+fp16", 3, 37}),
    CaseName);

// 16-bit rows' checkpoints reshard as fp32 ones do: 2 -> 1 and 2 -> 3 in
// the same precision, and 1 -> 2 restoring bf16 rows into fp32 ones.
INSTANTIATE_TEST_SUITE_P(
    SixteenBitRows, HybridReshardTest,
    testing::Values(Reshard{"row+host+bf16", 2, "table+host+bf16", 1},
                    Reshard{"mixed+host+fp16", 2, "column+host+fp16", 3},
                    Reshard{"table+host+bf16", 1, "row+host", 2}),
    ReshardName);

class HybridRowPrecisionRocksDbTest : public testing::TestWithParam<Case> {};

// 16-bit rows on RocksDB (caches of 10% of each shard's rows: rows spill
// and come back) on R ranks: bitwise the same job with the tables in host
// memory (the slots round each update by the row they hold, as the host
// tier does), and like one process as HybridRowPrecisionTest says.
TEST_P(HybridRowPrecisionRocksDbTest, TrainsLikeHostMemoryAndOneProcess) {
  const Case& p = GetParam();
  const Scenario sc = ParseScenario(p.scenario);
  ASSERT_TRUE(sc.rocksdb);
  ASSERT_NE(sc.rows_precision, ROW_FP32);
  const std::string host =
      sc.kind + "+host+" + (sc.rows_precision == ROW_BF16 ? "bf16" : "fp16");
  const std::string out = JobOut(CaseName({p, 0})), host_out = JobOut(host);
  ASSERT_TRUE(RunJob(p.scenario, p.world, p.global_batch, out));
  ASSERT_TRUE(RunJob(host, p.world, p.global_batch, host_out));
  const Report got = ReadReport(out), want = ReadReport(host_out);
  std::filesystem::remove(out);
  std::filesystem::remove(host_out);
  std::filesystem::remove_all(RocksDbDir(out));
  ExpectBitwiseEqual(got, want);

  const ModelConfig c = ScenarioConfig(host, p.world);
  const Scenario host_sc = ParseScenario(host);
  const Report one = Reference(c, GlobalBatches(c, p.global_batch, host_sc));
  ExpectSixteenBitRowsLike(got, one, sc.rows_precision, p.world,
                           sc.kind == "row", p.scenario);
}

INSTANTIATE_TEST_SUITE_P(SixteenBitRows, HybridRowPrecisionRocksDbTest,
                         testing::Values(Case{"table+rocksdb+bf16", 1, 37},
                                         Case{"row+rocksdb+bf16", 2, 37},
                                         Case{"mixed+rocksdb+fp16", 2, 37}),
                         CaseName);

// 16-bit RocksDB tables' checkpoints: restored in the same job and in new
// processes they train on bitwise (the saved databases hold the words).
INSTANTIATE_TEST_SUITE_P(SixteenBitRows, HybridRocksDbCheckpointTest,
                         testing::Values("mixed+bf16"), StoreCaseName);

// ... and reshard: 2 -> 1 in bf16, and 1 -> 2 restoring bf16 rows into
// fp32 ones on RocksDB.
INSTANTIATE_TEST_SUITE_P(
    SixteenBitRocksDbRows, HybridReshardTest,
    testing::Values(Reshard{"row+rocksdb+bf16", 2, "table+rocksdb+bf16", 1},
                    Reshard{"table+rocksdb+bf16", 1, "row+rocksdb", 2}),
    ReshardName);

}  // namespace
}  // namespace dlrm::model

int main(int argc, char** argv) {
  return dlrm::test::TestsOrRankMain(argc, argv, "--hybrid-worker", 4,
                                     dlrm::model::RunWorker);
}
