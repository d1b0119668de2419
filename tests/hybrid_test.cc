// Multi-rank tests of the hybrid-parallel step (model/hybrid_model.h) with
// real processes on loopback: the binary re-executes itself as N ranks that
// meet at a coordinator and talk through Gloo, and the parent compares what
// rank 0 reports with a single-process DlrmModel on the same global batches.
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "comm/coordinator.h"
#include "comm/gloo_communicator.h"
#include "core/config.h"
#include "core/status.h"
#include "data/synthetic.h"
#include "embedding/sharding.h"
#include "model/dlrm_model.h"
#include "model/hybrid_model.h"

extern char** environ;

namespace dlrm::model {
namespace {

constexpr int kSteps = 4;

// Four tables of dim 16 (so column-wise can split 4 ways), one mean-pooled
// multi-hot, Adam on the tables (per element: column-wise shards update
// exactly like the whole row).
ModelConfig TestConfig() {
  auto parsed = ParseModelConfigText(R"(
    num_dense_features: 4 embedding_dim: 16
    tables { name: "a" rows: 60 }
    tables { name: "b" rows: 45 multi_hot_size: 3 pooling: POOLING_MEAN }
    tables { name: "c" rows: 80 multi_hot_size: 2 }
    tables { name: "d" rows: 7 }
    bottom_mlp: [16, 16] top_mlp: [16, 1] interaction: INTERACTION_DOT
    dense_optimizer { type: SGD learning_rate: 0.1 }
    sparse_optimizer { type: ADAM learning_rate: 0.01 }
    seed: 17)");
  EXPECT_TRUE(parsed.ok()) << parsed.status();
  auto c = NormalizeModelConfig(*parsed);
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

// A scenario ending in "+overlap" runs the base scenario with the dense
// all-reduce on a second communicator, overlapped with the backward pass.
constexpr char kOverlap[] = "+overlap";

bool Overlaps(const std::string& scenario) {
  return scenario.ends_with(kOverlap);
}

// Pins every table for `scenario` on `world` ranks.
ModelConfig ScenarioConfig(std::string scenario, int world) {
  if (Overlaps(scenario)) scenario.resize(scenario.size() - strlen(kOverlap));
  ModelConfig c = TestConfig();
  for (int k = 0; k < c.tables_size(); ++k) {
    TableConfig* t = c.mutable_tables(k);
    if (scenario == "table") {
      t->set_sharding(SHARDING_TABLE_WISE);
      t->add_shard_ranks((k + 1) % world);
    } else if (scenario == "one_owner") {
      // Every other rank owns nothing.
      t->set_sharding(SHARDING_TABLE_WISE);
      t->add_shard_ranks(0);
    } else if (scenario == "column") {
      t->set_sharding(SHARDING_COLUMN_WISE);
      for (int r = world - 1; r >= 0; --r) t->add_shard_ranks(r);
    } else if (scenario == "row") {
      t->set_sharding(SHARDING_ROW_WISE);
    } else if (scenario == "data") {
      t->set_sharding(SHARDING_DATA_PARALLEL);
    } else if (scenario == "mixed") {
      const ShardingKind kinds[] = {SHARDING_TABLE_WISE, SHARDING_COLUMN_WISE,
                                    SHARDING_ROW_WISE, SHARDING_DATA_PARALLEL};
      t->set_sharding(kinds[k]);
      if (k == 0) t->add_shard_ranks(world - 1);
    }
  }
  return c;
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
// bags in a mean-pooled and a sum-pooled multi-hot table.
std::vector<data::Batch> GlobalBatches(const ModelConfig& c, int64_t size) {
  data::SyntheticOptions o;
  o.sample_seed = 99;
  auto src = data::MakeSyntheticSource(c, o);
  EXPECT_TRUE(src.ok()) << src.status();
  std::vector<data::Batch> batches(kSteps);
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

void AppendDense(const dense::Mlp& mlp, std::vector<float>* out) {
  for (const dense::Linear& l : mlp.layers()) {
    out->insert(out->end(), l.weight(),
                l.weight() + static_cast<int64_t>(l.in()) * l.out());
    out->insert(out->end(), l.bias(), l.bias() + l.out());
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

struct WorkerArgs {
  std::string scenario;
  int world = 1;
  int rank = 0;
  std::string coordinator;
  std::string out;
  int64_t global_batch = 0;
  // Exit abruptly before this step (-1: never): a rank that dies.
  int die_at_step = -1;
};

// The body of one rank process.
absl::Status RunWorker(const WorkerArgs& a) {
  const ModelConfig c = ScenarioConfig(a.scenario, a.world);
  embedding::PlannerOptions po;
  po.world_size = a.world;
  ASSIGN_OR_RETURN(embedding::ShardingPlan plan,
                   embedding::PlanSharding(c, po));
  comm::GlooOptions go;
  go.rank = a.rank;
  go.world_size = a.world;
  go.coordinator_address = a.coordinator;
  go.job_id = a.scenario;
  go.connect_timeout_seconds = 30;
  go.op_timeout_seconds = 5;
  ASSIGN_OR_RETURN(std::unique_ptr<comm::Communicator> comm,
                   comm::ConnectGloo(go));
  std::unique_ptr<comm::Communicator> dense_comm;
  if (Overlaps(a.scenario)) {
    go.job_id = a.scenario + "-dense";
    ASSIGN_OR_RETURN(dense_comm, comm::ConnectGloo(go));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<HybridModel> m,
                   HybridModel::Create(c, plan, comm.get(), dense_comm.get()));
  const std::vector<data::Batch> batches = GlobalBatches(c, a.global_batch);
  Report report;
  for (int step = 0; step < kSteps; ++step) {
    if (step == a.die_at_step) _exit(3);
    const auto [begin, end] = LocalRange(a.global_batch, a.rank, a.world);
    data::Batch local;
    batches[step].Slice(begin, end, &local);
    ASSIGN_OR_RETURN(HybridStepResult r, m->TrainStep(local));
    report.losses.push_back(r.loss);
    // Every exchange moved what docs/hybrid.md's formula says.
    std::vector<int64_t> sizes;
    for (int q = 0; q < a.world; ++q) {
      const auto [b, e] = LocalRange(a.global_batch, q, a.world);
      sizes.push_back(e - b);
    }
    const auto predicted =
        PredictedExchangeBytes(c, plan, local, sizes, a.rank);
    for (int e = 0; e < HybridStageTimes::kNumExchanges; ++e) {
      if (r.times.bytes_sent[e] != predicted[e]) {
        return absl::InternalError(absl::StrCat(
            "step ", step, ": ", HybridStageTimes::ExchangeName(e), " sent ",
            r.times.bytes_sent[e], " bytes, the formula says ", predicted[e]));
      }
    }
  }
  AppendDense(m->bottom(), &report.dense);
  AppendDense(m->top(), &report.dense);
  for (int k = 0; k < c.tables_size(); ++k) {
    report.tables.emplace_back();
    RETURN_IF_ERROR(m->GatherTable(k, &report.tables.back()));
  }
  if (a.rank == 0) RETURN_IF_ERROR(WriteReport(report, a.out));
  return absl::OkStatus();
}

std::string SelfPath() {
  return std::filesystem::read_symlink("/proc/self/exe");
}

// Starts `world` ranks of `scenario`; returns their pids.
std::vector<pid_t> SpawnRanks(const WorkerArgs& base) {
  std::vector<pid_t> pids;
  for (int r = 0; r < base.world; ++r) {
    std::vector<std::string> args = {SelfPath(),
                                     "--hybrid-worker",
                                     base.scenario,
                                     std::to_string(base.world),
                                     std::to_string(r),
                                     base.coordinator,
                                     base.out,
                                     std::to_string(base.global_batch),
                                     std::to_string(base.die_at_step)};
    std::vector<char*> argv;
    for (auto& s : args) argv.push_back(s.data());
    argv.push_back(nullptr);
    pid_t pid = -1;
    EXPECT_EQ(
        posix_spawn(&pid, argv[0], nullptr, nullptr, argv.data(), environ), 0);
    pids.push_back(pid);
  }
  return pids;
}

// Waits for every pid for at most `seconds`; kills what is left. Returns
// the exit codes (-1 for killed or crashed).
std::vector<int> WaitAll(const std::vector<pid_t>& pids, double seconds) {
  std::vector<int> codes(pids.size(), -2);
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  size_t done = 0;
  while (done < pids.size()) {
    for (size_t i = 0; i < pids.size(); ++i) {
      if (codes[i] != -2) continue;
      int status = 0;
      if (waitpid(pids[i], &status, WNOHANG) == pids[i]) {
        codes[i] = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
        ++done;
      }
    }
    if (std::chrono::steady_clock::now() > deadline) {
      for (size_t i = 0; i < pids.size(); ++i) {
        if (codes[i] == -2) {
          kill(pids[i], SIGKILL);
          waitpid(pids[i], nullptr, 0);
          codes[i] = -1;
        }
      }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return codes;
}

// The single-process reference on the same global batches.
Report Reference(const ModelConfig& c, const std::vector<data::Batch>& bs) {
  auto m = DlrmModel::Create(c);
  EXPECT_TRUE(m.ok()) << m.status();
  Report r;
  for (const auto& b : bs) {
    auto step = (*m)->TrainStep(b);
    EXPECT_TRUE(step.ok()) << step.status();
    r.losses.push_back(step->loss);
  }
  AppendDense((*m)->bottom(), &r.dense);
  AppendDense((*m)->top(), &r.dense);
  for (const auto& t : (*m)->tables()) {
    r.tables.emplace_back(t->weights(), t->weights() + t->rows() * t->dim());
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
  if (Overlaps(scenario)) {
    scenario.replace(scenario.size() - strlen(kOverlap), 1, "_");
  }
  return scenario + "_r" + std::to_string(info.param.world) + "_b" +
         std::to_string(info.param.global_batch);
}

class HybridEquivalenceTest : public testing::TestWithParam<Case> {};

// K steps on R ranks equal K steps of one process on the same global
// batches. Tolerance: dense gradients are summed per rank then across ranks
// and row-wise pools shard by shard, so float sums differ in order; a
// row-wise shard of a mean table also gets its gradient pre-divided by the
// bag length, where the single-rank kernel fuses that multiply into its sum
// (FMA). Losses agree within 1e-5 relative and weights within 1e-5
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
  WorkerArgs a{p.scenario, p.world,       0, (*coordinator)->address(),
               out,        p.global_batch};
  const std::vector<int> codes = WaitAll(SpawnRanks(a), 120);
  for (size_t r = 0; r < codes.size(); ++r) {
    ASSERT_EQ(codes[r], 0) << "rank " << r;
  }
  const Report got = ReadReport(out);
  std::filesystem::remove(out);
  const ModelConfig c = ScenarioConfig(p.scenario, p.world);
  const Report want = Reference(c, GlobalBatches(c, p.global_batch));
  const bool exact =
      p.world == 1 && p.scenario != "row" && p.scenario != "mixed";
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
  return cases;
}

INSTANTIATE_TEST_SUITE_P(AllKinds, HybridEquivalenceTest,
                         testing::ValuesIn(Cases()), CaseName);

TEST(HybridFailureTest, ADeadRankStopsTheOthersWithAnError) {
  comm::CoordinatorServerOptions so;
  auto coordinator = comm::CoordinatorServer::Start(so);
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  WorkerArgs a{"mixed",
               3,
               0,
               (*coordinator)->address(),
               testing::TempDir() + "/hybrid_dead.bin",
               37,
               /*die_at_step=*/2};
  const auto start = std::chrono::steady_clock::now();
  const std::vector<int> codes = WaitAll(SpawnRanks(a), 60);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  // Every rank stopped by itself (none was killed), with an error.
  for (size_t r = 0; r < codes.size(); ++r) {
    EXPECT_GT(codes[r], 0) << "rank " << r;
  }
  // The op timeout is 5 s; allow start-up and slack on a loaded machine.
  EXPECT_LT(seconds, 40) << "ranks took " << seconds << " s to stop";
}

}  // namespace
}  // namespace dlrm::model

int main(int argc, char** argv) {
  if (argc == 9 && std::strcmp(argv[1], "--hybrid-worker") == 0) {
    dlrm::model::WorkerArgs a;
    a.scenario = argv[2];
    a.world = std::atoi(argv[3]);
    a.rank = std::atoi(argv[4]);
    a.coordinator = argv[5];
    a.out = argv[6];
    a.global_batch = std::atoll(argv[7]);
    a.die_at_step = std::atoi(argv[8]);
    const absl::Status s = dlrm::model::RunWorker(a);
    if (!s.ok()) {
      std::fprintf(stderr, "rank %d: %s\n", a.rank, s.ToString().c_str());
      return 1;
    }
    return 0;
  }
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
