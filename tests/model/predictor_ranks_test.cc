// Predictions beside training on several ranks (model/predictor_ranks.h)
// with real processes on loopback: the binary re-executes itself as R ranks
// that meet at a coordinator and talk through two Gloo communicators (the
// step's and the predictions'). The parent replays the training in one
// process and checks that every prediction equals the replay's after
// exactly the step it reports.
#include "model/predictor_ranks.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "comm/communicator.h"
#include "comm/coordinator.h"
#include "comm/gloo_communicator.h"
#include "core/config.h"
#include "core/status.h"
#include "data/synthetic.h"
#include "embedding/sharding.h"
#include "model/model.h"
#include "model/predictor.h"
#include "server/model_host.h"
#include "server/rank_group.h"
#include "tests/support/process.h"
#include "tests/support/ranks.h"
#include "tests/support/sharding.h"
#include "tests/support/synthetic.h"

namespace dlrm::model {
namespace {

constexpr int kSteps = 5;
constexpr int64_t kGlobalBatch = 48;
constexpr int64_t kProbe = 16;

ModelConfig TestConfig() { return test::FourTableConfig(); }

// Every table sharded `kind`-wise over `world` ranks ("mixed": one table of
// each kind, the data-parallel one included); a "+rocksdb" suffix is the
// ranks' tier only (RankConfig), so the one-process replay of such a kind
// keeps its tables in memory (the RocksDB tier trains bitwise alike); a
// "+dynamic" before it makes every table dynamic (docs/dynamic.md).
ModelConfig KindConfig(std::string kind, int world) {
  if (absl::EndsWith(kind, "+rocksdb")) {
    kind.resize(kind.size() - std::string("+rocksdb").size());
  }
  const bool dynamic = absl::EndsWith(kind, "+dynamic");
  if (dynamic) kind.resize(kind.size() - std::string("+dynamic").size());
  ModelConfig c = TestConfig();
  for (int k = 0; k < c.tables_size(); ++k) {
    EXPECT_TRUE(test::ShardTableAs(kind, k, world, c.mutable_tables(k)))
        << kind;
    c.mutable_tables(k)->set_dynamic(dynamic);
  }
  return c;
}

std::vector<data::Batch> GlobalBatches(const ModelConfig& c) {
  data::SyntheticOptions o;
  o.sample_seed = 99;
  return test::SyntheticBatches(c, kSteps, kGlobalBatch, o);
}

// The samples every prediction scores: the start of the first batch.
data::Batch Probe(const std::vector<data::Batch>& batches) {
  data::Batch probe;
  batches[0].Slice(0, kProbe, &probe);
  return probe;
}

// One prediction as rank 0 saw it: the step it reports, the steps the
// training thread had finished when it started and when it ended, and the
// probabilities.
struct Record {
  int64_t step = 0;
  int64_t before = 0;
  int64_t after = 0;
  std::vector<float> probs;
};

absl::Status WriteRecords(const std::vector<Record>& records,
                          const std::string& path) {
  std::ofstream f(path, std::ios::binary);
  for (const Record& r : records) {
    const int64_t head[4] = {r.step, r.before, r.after,
                             static_cast<int64_t>(r.probs.size())};
    f.write(reinterpret_cast<const char*>(head), sizeof(head));
    f.write(reinterpret_cast<const char*>(r.probs.data()),
            static_cast<std::streamsize>(r.probs.size() * sizeof(float)));
  }
  if (!f) return absl::InternalError("cannot write " + path);
  return absl::OkStatus();
}

std::vector<Record> ReadRecords(const std::string& path) {
  std::vector<Record> records;
  std::ifstream f(path, std::ios::binary);
  int64_t head[4];
  while (f.read(reinterpret_cast<char*>(head), sizeof(head))) {
    Record r{head[0], head[1], head[2], std::vector<float>(head[3])};
    f.read(reinterpret_cast<char*>(r.probs.data()),
           static_cast<std::streamsize>(head[3] * sizeof(float)));
    records.push_back(std::move(r));
  }
  return records;
}

// A rank's place (world, rank, coordinator), then its test's arguments.
struct WorkerArgs : test::RankPlace {
  // "train": kSteps steps through server::RankGroup while rank 0 predicts
  // on another thread; "blocked": rank 0 predicts while its step waits for
  // rank 1, which joins the step only after those predictions; "skewed":
  // rank 1's step count differs, so no prediction agrees on a step;
  // "fallback": the same through server::ModelHost, which then predicts
  // between steps; "restore": predictions beside a checkpoint restore.
  std::string mode;
  std::string kind;
  std::string out;
};

std::pair<int64_t, int64_t> LocalRange(int64_t size, int rank, int world) {
  return {size * rank / world, size * (rank + 1) / world};
}

// Rank 0 trains kSteps steps on one thread and predicts on another until
// the training is over, then once more; the training thread starts each
// step only after a prediction ended since the last one, so that the two
// interleave.
absl::Status LeadTraining(server::RankGroup& group,
                          const std::vector<data::Batch>& batches,
                          const std::string& out) {
  RanksPredictor* predictor = group.ranks_predictor();
  if (predictor == nullptr) {
    return absl::InternalError("the group has no predictor beside training");
  }
  std::mutex mu;
  std::condition_variable cv;
  int64_t predictions = 0;  // guarded by mu
  std::atomic<int64_t> finished{0};
  std::atomic<bool> done{false};
  absl::Status trained;
  std::thread training([&] {
    int64_t seen = 0;
    for (int i = 0; i < kSteps && trained.ok(); ++i) {
      {
        std::unique_lock<std::mutex> lock(mu);
        // Bounded so that a failing predictor cannot hang the test; the
        // checks below then fail on the records.
        cv.wait_for(lock, std::chrono::seconds(60),
                    [&] { return predictions > seen; });
        seen = predictions;
      }
      trained = group.TrainStep(batches[i]).status();
      finished.store(i + 1);
    }
    done.store(true);
  });
  const data::Batch probe = Probe(batches);
  std::vector<Record> records;
  absl::Status predicted;
  int aborted = 0;
  for (bool last = false; !last;) {
    last = done.load();
    Record r;
    r.before = finished.load();
    const absl::Status s = predictor->Predict(probe, &r.probs, &r.step);
    r.after = finished.load();
    if (absl::IsAborted(s)) {
      // The ranks kept seeing different steps: allowed, never a mix.
      ++aborted;
      if (!last) continue;
    } else if (!s.ok()) {
      predicted = s;
      break;
    } else {
      records.push_back(std::move(r));
    }
    std::lock_guard<std::mutex> lock(mu);
    ++predictions;
    cv.notify_all();
  }
  training.join();
  RETURN_IF_ERROR(trained);
  RETURN_IF_ERROR(predicted);
  std::printf("rank 0: %zu predictions beside %d steps, %d aborted\n",
              records.size(), kSteps, aborted);
  RETURN_IF_ERROR(group.Shutdown());
  return WriteRecords(records, out);
}

// "restore": rank 0 trains 2 steps, saves a checkpoint, trains 2 more,
// then restores it (back to step 2) and trains the same 2 steps again while
// another thread predicts; right after the restore this thread predicts
// too (the first record).
absl::Status LeadRestore(server::RankGroup& group,
                         const std::vector<data::Batch>& batches,
                         const std::string& out) {
  RanksPredictor* predictor = group.ranks_predictor();
  if (predictor == nullptr) {
    return absl::InternalError("the group has no predictor beside training");
  }
  const std::string ckpt = out + ".ckpt";
  for (int i = 0; i < 4; ++i) {
    if (i == 2) RETURN_IF_ERROR(group.SaveCheckpoint(ckpt).status());
    RETURN_IF_ERROR(group.TrainStep(batches[i]).status());
  }
  const data::Batch probe = Probe(batches);
  std::atomic<bool> done{false};
  // The first record is this thread's; the others the predicting thread's,
  // which only it touches until the join (its push_back may move them).
  Record first;
  std::vector<Record> records(1);
  absl::Status predicted;
  std::thread predicting([&] {
    while (!done.load()) {
      Record r;
      const absl::Status s = predictor->Predict(probe, &r.probs, &r.step);
      if (absl::IsAborted(s)) continue;  // never a mix
      if (!s.ok()) {
        predicted = s;
        return;
      }
      records.push_back(std::move(r));
    }
  });
  absl::Status s = group.RestoreCheckpoint(ckpt).status();
  if (s.ok()) s = predictor->Predict(probe, &first.probs, &first.step);
  for (int i = 2; i < 4 && s.ok(); ++i) {
    s = group.TrainStep(batches[i]).status();
  }
  done.store(true);
  predicting.join();
  records[0] = std::move(first);
  RETURN_IF_ERROR(s);
  RETURN_IF_ERROR(predicted);
  RETURN_IF_ERROR(group.Shutdown());
  return WriteRecords(records, out);
}

// "blocked": rank 0's step cannot finish before rank 1 calls TrainStep,
// which it does only once rank 0 wrote `out`.flag after its predictions.
absl::Status RunBlocked(const WorkerArgs& a, Model& m, RanksPredictor& p,
                        const std::vector<data::Batch>& batches) {
  const auto [begin, end] = LocalRange(kGlobalBatch, a.rank, a.world);
  data::Batch local;
  batches[0].Slice(begin, end, &local);
  const std::string flag = a.out + ".flag";
  if (a.rank != 0) {
    absl::Status served;
    std::thread serving([&] { served = p.Serve(); });
    absl::Status stepped = absl::DeadlineExceededError("no flag from rank 0");
    for (int i = 0; i < 6000; ++i) {
      if (std::filesystem::exists(flag)) {
        stepped = m.TrainStep(local).status();
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    serving.join();
    RETURN_IF_ERROR(stepped);
    return served;
  }
  std::atomic<bool> entered{false};
  absl::Status stepped;
  std::thread training([&] {
    entered.store(true);
    stepped = m.TrainStep(local).status();
  });
  while (!entered.load()) std::this_thread::yield();
  const data::Batch probe = Probe(batches);
  std::vector<Record> records;
  for (int i = 0; i < 3; ++i) {
    Record r;
    RETURN_IF_ERROR(p.Predict(probe, &r.probs, &r.step));
    records.push_back(std::move(r));
  }
  std::ofstream(flag) << "predicted\n";
  training.join();
  RETURN_IF_ERROR(stepped);
  Record r;
  r.before = r.after = 1;
  RETURN_IF_ERROR(p.Predict(probe, &r.probs, &r.step));
  records.push_back(std::move(r));
  RETURN_IF_ERROR(p.Stop());
  return WriteRecords(records, a.out);
}

// "skewed": rank 1 claims 100 steps, so every attempt sees steps 0 and 100
// and the prediction gives up with Aborted; the followers stay in step
// with the leader's commands (a second one aborts alike, then Stop).
absl::Status RunSkewed(const WorkerArgs& a, Model& m, RanksPredictor& p,
                       const std::vector<data::Batch>& batches) {
  if (a.rank != 0) {
    m.set_steps(100);
    return p.Serve();
  }
  const data::Batch probe = Probe(batches);
  for (int i = 0; i < 2; ++i) {
    std::vector<float> probs;
    int64_t step = -1;
    const absl::Status s = p.Predict(probe, &probs, &step);
    if (!absl::IsAborted(s) ||
        s.message().find("steps 0 to 100") == std::string::npos) {
      return absl::InternalError("expected Aborted naming steps 0 to 100: " +
                                 s.ToString());
    }
  }
  // A bad batch is refused before anything is sent.
  data::Batch bad = probe;
  bad.sparse[0].ids[3] = 60;
  std::vector<float> probs;
  int64_t step = -1;
  const absl::Status s = p.Predict(bad, &probs, &step);
  if (!absl::IsInvalidArgument(s)) {
    return absl::InternalError("a bad batch: " + s.ToString());
  }
  RETURN_IF_ERROR(p.Stop());
  const absl::Status after = p.Predict(probe, &probs, &step);
  if (!absl::IsUnavailable(after)) {
    return absl::InternalError("a prediction after Stop: " + after.ToString());
  }
  return WriteRecords({}, a.out);
}

// KindConfig for the rank processes: with "+rocksdb", every table on
// RocksDB under `dir` (each rank's database in its rank_<r> folder) behind
// a cache as large as the table, so rows a batch has not loaded yet are
// read from the database (or their initial value) by predictions.
absl::StatusOr<ModelConfig> RankConfig(const std::string& kind, int world,
                                       const std::string& dir) {
  ModelConfig c = KindConfig(kind, world);
  if (!absl::EndsWith(kind, "+rocksdb")) return c;
  RocksDbConfig r;
  r.set_path(dir);
  r.set_cache_fraction(1.0);
  return PlaceTablesOnRocksDb(c, {"all"}, r);
}

// A rank process (test::TestsOrRankMain): `extra` holds the mode, the
// predictor kind and the report file.
absl::Status RunWorker(const test::RankPlace& place, char** extra) {
  const WorkerArgs a{place, extra[0], extra[1], extra[2]};
  ASSIGN_OR_RETURN(const ModelConfig c,
                   RankConfig(a.kind, a.world, a.out + ".rocksdb"));
  ASSIGN_OR_RETURN(embedding::ShardingPlan plan, test::PlanOver(c, a.world));
  comm::GlooOptions go = test::RankGloo(a.rank, a.world, a.coordinator, "step",
                                        /*connect=*/30, /*op=*/30);
  ASSIGN_OR_RETURN(std::unique_ptr<comm::Communicator> comm,
                   comm::ConnectGloo(go));
  go.job_id = "predict";
  ASSIGN_OR_RETURN(std::unique_ptr<comm::Communicator> predict_comm,
                   comm::ConnectGloo(go));
  ASSIGN_OR_RETURN(std::unique_ptr<Model> m,
                   Model::Create(c, plan, comm.get()));
  // Several ranks are RanksPredictor's case: SnapshotPredictor refuses
  // them, saying so (the worker's exit code fails the test otherwise).
  const absl::StatusOr<std::unique_ptr<SnapshotPredictor>> snapshot =
      SnapshotPredictor::Create(m.get());
  if (!absl::IsFailedPrecondition(snapshot.status()) ||
      !absl::StrContains(snapshot.status().message(), "RanksPredictor")) {
    return absl::InternalError(
        absl::StrCat("SnapshotPredictor::Create on ", a.world,
                     " ranks: ", snapshot.status().ToString()));
  }
  const std::vector<data::Batch> batches = GlobalBatches(c);
  if (a.mode == "fallback" || a.mode == "train" || a.mode == "restore") {
    // Through a server::RankGroup: the followers follow, the leader trains,
    // restores or (fallback) predicts through a ModelHost.
    if (a.mode == "fallback" && a.rank != 0) m->set_steps(100);
    server::RankGroupOptions ro;
    ro.heartbeat_seconds = 1;
    ASSIGN_OR_RETURN(std::unique_ptr<server::RankGroup> group,
                     server::RankGroup::Create(std::move(comm), std::move(m),
                                               ro, std::move(predict_comm)));
    if (a.rank != 0) return group->Follow();
    if (a.mode == "train") return LeadTraining(*group, batches, a.out);
    if (a.mode == "restore") return LeadRestore(*group, batches, a.out);
    ASSIGN_OR_RETURN(std::unique_ptr<server::ModelHost> host,
                     server::ModelHost::Create(std::move(group), {}));
    Record r;
    RETURN_IF_ERROR(host->Predict(Probe(batches), &r.probs, &r.step));
    RETURN_IF_ERROR(host->ShutdownRanks());
    return WriteRecords({r}, a.out);
  }
  RanksPredictorOptions o;
  o.max_attempts = 3;
  o.heartbeat_seconds = 1;
  ASSIGN_OR_RETURN(std::unique_ptr<RanksPredictor> p,
                   RanksPredictor::Create(m.get(), predict_comm.get(), o));
  if (a.mode == "blocked") return RunBlocked(a, *m, *p, batches);
  return RunSkewed(a, *m, *p, batches);
}

// Runs `a.world` ranks of `a` (rank set per process) to their exit, killing
// what is left after `seconds`; returns the exit codes (-1: killed or
// crashed).
std::vector<int> RunRanks(const WorkerArgs& a, double seconds) {
  return test::RunRanks(
      a.world,
      [&](int r) {
        return test::RankArgv("--ranks-worker", {a.world, r, a.coordinator},
                              {a.mode, a.kind, a.out});
      },
      seconds);
}

// The one-process replay: the probe's probabilities after 0, 1, ...,
// kSteps steps on the same global batches.
// The one-process replay of `c` on `world` ranks: every table whole, but a
// dynamic table's `world` row-wise shards (ids routed by hash), all on the
// one rank, so that its maps are the ranks'.
std::vector<std::vector<float>> Replay(const ModelConfig& c, int world) {
  std::unique_ptr<comm::Communicator> one = comm::MakeSingleRankCommunicator();
  ModelConfig hashed = c;
  bool row_wise_dynamic = false;
  for (TableConfig& t : *hashed.mutable_tables()) {
    if (!t.dynamic() || t.sharding() != SHARDING_ROW_WISE) continue;
    row_wise_dynamic = true;
    t.clear_shard_ranks();
    for (int r = 0; r < world; ++r) t.add_shard_ranks(0);
  }
  absl::StatusOr<std::unique_ptr<Model>> m;
  if (row_wise_dynamic) {
    for (TableConfig& t : *hashed.mutable_tables()) {
      if (t.sharding() != SHARDING_ROW_WISE) {
        t.clear_shard_ranks();
        t.set_sharding(SHARDING_TABLE_WISE);
      }
    }
    auto plan = test::PlanOver(hashed, 1);
    EXPECT_TRUE(plan.ok()) << plan.status();
    m = Model::Create(hashed, *plan, one.get());
  } else {
    m = Model::Create(c);
  }
  EXPECT_TRUE(m.ok()) << m.status();
  const std::vector<data::Batch> batches = GlobalBatches(c);
  const data::Batch probe = Probe(batches);
  std::vector<std::vector<float>> want(kSteps + 1);
  for (int s = 0; s <= kSteps; ++s) {
    EXPECT_TRUE((*m)->Predict(probe, &want[s]).ok());
    if (s < kSteps) {
      EXPECT_TRUE((*m)->TrainStep(batches[s]).ok());
    }
  }
  return want;
}

float MaxDiff(const std::vector<float>& a, const std::vector<float>& b) {
  float d = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    d = std::max(d, std::abs(a[i] - b[i]));
  }
  return d;
}

// R ranks and one process differ by float summation order (the dense
// all-reduce, row-wise partial pools): hybrid_test's 1e-5 on weights.
// Consecutive steps move the probe by more than kStepApart, so a
// prediction within kTolerance of one step's is of that step, not a mix.
constexpr float kTolerance = 2e-5f;
constexpr float kStepApart = 1e-3f;

struct Case {
  std::string kind;
  int world;
};

class RanksPredictorTest : public testing::TestWithParam<Case> {
 protected:
  std::vector<Record> Run(const std::string& mode) {
    comm::CoordinatorServerOptions so;
    auto coordinator = comm::CoordinatorServer::Start(so);
    EXPECT_TRUE(coordinator.ok()) << coordinator.status();
    if (!coordinator.ok()) return {};
    const std::string out =
        absl::StrCat(testing::TempDir(), "/ranks_predictor_", mode, "_",
                     GetParam().kind, GetParam().world, "_", getpid(), ".bin");
    const test::RankPlace place{GetParam().world, 0, (*coordinator)->address()};
    WorkerArgs a{place, mode, GetParam().kind, out};
    const std::vector<int> codes = RunRanks(a, 180);
    for (size_t r = 0; r < codes.size(); ++r) {
      EXPECT_EQ(codes[r], 0) << "rank " << r;
    }
    std::vector<Record> records = ReadRecords(out);
    std::filesystem::remove(out);
    std::filesystem::remove(out + ".flag");
    std::filesystem::remove_all(out + ".ckpt");
    std::filesystem::remove_all(out + ".rocksdb");
    return records;
  }

  // The one-process replay of the case's kind and world.
  std::vector<std::vector<float>> Want() const {
    return Replay(KindConfig(GetParam().kind, GetParam().world),
                  GetParam().world);
  }
};

// While the ranks train, every prediction equals the one-process replay
// after exactly the step it reports, never a mix of two.
TEST_P(RanksPredictorTest, EachPredictionIsOfOneStep) {
  const std::vector<Record> records = Run("train");
  const auto want = Want();
  for (int s = 0; s < kSteps; ++s) {
    ASSERT_GT(MaxDiff(want[s], want[s + 1]), kStepApart) << "step " << s;
  }
  ASSERT_GE(records.size(), size_t{kSteps + 1});
  int64_t last = 0;
  for (size_t i = 0; i < records.size(); ++i) {
    const Record& r = records[i];
    ASSERT_GE(r.step, last) << "prediction " << i;
    // Not older than the steps finished when it started, and at most the
    // step in progress when it ended (its count is the model's before
    // TrainStep returns).
    ASSERT_GE(r.step, r.before) << "prediction " << i;
    ASSERT_LE(r.step, std::min<int64_t>(r.after + 1, kSteps))
        << "prediction " << i;
    ASSERT_LE(MaxDiff(r.probs, want[r.step]), kTolerance)
        << "prediction " << i << " reports step " << r.step;
    last = r.step;
  }
  EXPECT_EQ(records.back().step, kSteps);
}

std::string CaseName(const testing::TestParamInfo<Case>& info) {
  std::string name = info.param.kind + "_r" + std::to_string(info.param.world);
  std::replace(name.begin(), name.end(), '+', '_');
  return name;
}

INSTANTIATE_TEST_SUITE_P(
    Kinds, RanksPredictorTest,
    testing::Values(Case{"table", 2}, Case{"column", 2}, Case{"row", 2},
                    Case{"mixed", 2}, Case{"table", 3}, Case{"column", 3},
                    Case{"row", 3}, Case{"mixed", 3}, Case{"mixed+rocksdb", 2},
                    Case{"row+rocksdb", 3}, Case{"table+dynamic", 2},
                    Case{"row+dynamic", 2}, Case{"row+dynamic", 3},
                    Case{"row+dynamic+rocksdb", 2}),
    CaseName);

class RanksPredictorBlockedTest : public RanksPredictorTest {};

// A prediction completes while rank 0's step is under way and cannot finish
// (rank 1 joins it only after the predictions): it never waits for a step.
TEST_P(RanksPredictorBlockedTest, PredictsWhileAStepIsUnderWay) {
  const std::vector<Record> records = Run("blocked");
  const auto want = Want();
  ASSERT_EQ(records.size(), 4u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(records[i].step, 0);
    EXPECT_LE(MaxDiff(records[i].probs, want[0]), kTolerance);
  }
  EXPECT_EQ(records[3].step, 1);
  EXPECT_LE(MaxDiff(records[3].probs, want[1]), kTolerance);
}

INSTANTIATE_TEST_SUITE_P(Kinds, RanksPredictorBlockedTest,
                         testing::Values(Case{"mixed", 2}), CaseName);

class RanksPredictorSkewedTest : public RanksPredictorTest {};

// Ranks that never report the same step: bounded retries, then Aborted on
// the leader, and every rank still follows the next command.
TEST_P(RanksPredictorSkewedTest, GivesUpAfterItsAttempts) {
  EXPECT_TRUE(Run("skewed").empty());
}

INSTANTIATE_TEST_SUITE_P(Kinds, RanksPredictorSkewedTest,
                         testing::Values(Case{"row", 2}), CaseName);

class RanksPredictorRestoreTest : public RanksPredictorTest {};

// Predictions beside a restore that sets the ranks back two steps, and the
// steps trained again after it, are each of one step: the replay's.
TEST_P(RanksPredictorRestoreTest, PredictionsBesideARestoreSeeOneStep) {
  const std::vector<Record> records = Run("restore");
  const auto want = Want();
  ASSERT_FALSE(records.empty());
  EXPECT_EQ(records[0].step, 2);
  for (size_t i = 0; i < records.size(); ++i) {
    ASSERT_GE(records[i].step, 2) << "prediction " << i;
    ASSERT_LE(records[i].step, 4) << "prediction " << i;
    ASSERT_LE(MaxDiff(records[i].probs, want[records[i].step]), kTolerance)
        << "prediction " << i << " reports step " << records[i].step;
  }
}

INSTANTIATE_TEST_SUITE_P(Kinds, RanksPredictorRestoreTest,
                         testing::Values(Case{"row", 2}), CaseName);

class RanksPredictorFallbackTest : public RanksPredictorTest {};

// Through server::ModelHost, a prediction whose ranks never agree on a step
// runs between two steps instead, with the leader's step count.
TEST_P(RanksPredictorFallbackTest, PredictsBetweenStepsInstead) {
  const std::vector<Record> records = Run("fallback");
  const auto want = Want();
  ASSERT_EQ(records.size(), 1u);
  EXPECT_EQ(records[0].step, 0);
  EXPECT_LE(MaxDiff(records[0].probs, want[0]), kTolerance);
}

INSTANTIATE_TEST_SUITE_P(Kinds, RanksPredictorFallbackTest,
                         testing::Values(Case{"column", 2}), CaseName);

TEST(RanksPredictorCreateTest, OneRankIsSnapshotPredictorsCase) {
  auto m = Model::Create(TestConfig());
  ASSERT_TRUE(m.ok()) << m.status();
  std::unique_ptr<comm::Communicator> comm = comm::MakeSingleRankCommunicator();
  auto p = RanksPredictor::Create(m->get(), comm.get(), {});
  EXPECT_EQ(p.status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(RanksPredictorCreateTest, ValidatesOptions) {
  RanksPredictorOptions o;
  o.max_attempts = 0;
  EXPECT_EQ(o.Validate().code(), absl::StatusCode::kInvalidArgument);
  o.max_attempts = 1;
  o.heartbeat_seconds = 0;
  EXPECT_EQ(o.Validate().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace dlrm::model

int main(int argc, char** argv) {
  return dlrm::test::TestsOrRankMain(argc, argv, "--ranks-worker", 3,
                                     dlrm::model::RunWorker);
}
