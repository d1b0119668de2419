// The dlrm_server process itself: kill -9 at random moments of training and
// of checkpoint writes, then resume from the newest valid checkpoint (with
// dynamic tables: to the same id maps);
// damaged checkpoints skipped on resume; the checkpoint flags; --health-check
// over TLS (real processes on loopback, driven through the C++ client
// library); and ModelHost's periodic checkpoints in-process.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "clients/client.h"
#include "core/config.h"
#include "core/device.h"
#include "data/synthetic.h"
#include "google/protobuf/text_format.h"
#include "model/checkpoint.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "server/metrics.h"
#include "server/model_host.h"
#include "tests/server/server_binary.h"
#include "tests/support/expect.h"
#include "tests/support/files.h"
#include "tests/support/process.h"
#include "tests/support/synthetic.h"
#include "tests/support/test_certs.h"

namespace dlrm {
namespace {

using test::ReadFile;

namespace fs = std::filesystem;

std::string ServerPath() { return test::ServerBinary(); }

// One spawned dlrm_server: stdout in a pipe, stderr (the log) in a file.
struct Proc {
  pid_t pid = -1;
  int out_fd = -1;

  // Starts `args` with `env` added to ours. False if it cannot start.
  bool Spawn(const std::vector<std::string>& args, const fs::path& err,
             const std::vector<std::string>& env = {}) {
    const test::Child child = test::SpawnPiped(args, err.string(), env);
    pid = child.pid;
    out_fd = child.out_fd;
    return pid != -1;
  }

  // Reads stdout until "dlrm_server: listening on ADDR"; "" on timeout or
  // exit.
  std::string WaitListening(double seconds) {
    return test::WaitForWord(out_fd, "dlrm_server: listening on ", seconds);
  }

  // Exit code within `seconds` (128 + signal when killed), or -2 (then it
  // is killed).
  int WaitExit(double seconds) {
    const int code = pid > 0 ? test::WaitExit(pid, seconds) : -2;
    pid = -1;
    if (out_fd >= 0) close(out_fd);
    out_fd = -1;
    return code;
  }

  void Kill9() {
    if (pid > 0) kill(pid, SIGKILL);
    WaitExit(10);
  }

  ~Proc() { Kill9(); }
};

// The newest checkpoint under `root` that loads, after checking that EVERY
// committed checkpoint there loads (checksums verified); step -1 if none.
struct Newest {
  std::string dir;
  int64_t step = -1;
};
Newest CheckEveryCommittedCheckpointLoads(const fs::path& root) {
  Newest newest;
  for (const model::CheckpointEntry& e :
       model::ListCheckpoints(root.string())) {
    EXPECT_TRUE(e.manifest.ok()) << e.dir << ": " << e.manifest.status();
    auto loaded = model::LoadCheckpoint(e.dir, /*weights_only=*/false);
    EXPECT_TRUE(loaded.ok()) << e.dir << ": " << loaded.status();
    if (loaded.ok() && newest.step < 0) {
      newest.dir = e.dir;
      newest.step = (*loaded)->steps();
      EXPECT_EQ(newest.step, e.manifest->step);
    }
  }
  // Atomic commits: no committed-looking directory without its manifest.
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(root, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.find(".tmp-") != std::string::npos) continue;
    // Jobs' end markers (server/job_manager.h) lie beside the checkpoints.
    if (name.starts_with("job-") && name.ends_with(".end")) continue;
    EXPECT_TRUE(fs::exists(entry.path() / "MANIFEST.json"))
        << "partial checkpoint " << entry.path();
  }
  return newest;
}

class ServerProcessTest : public test::ServerBinaryTest {
 protected:
  void SetUp() override {
    ServerBinaryTest::SetUp();
    root_ = dir_ / "ckpt";
  }

  // Runs `args` to its end (test::Run, files in dir_): its exit code (-1
  // when it could not start or a signal ended it), its stdout then its
  // stderr into *out.
  int RunToEnd(const std::vector<std::string>& args, std::string* out) {
    const test::RunResult r = test::Run(args, dir_.string());
    *out = r.out + r.err;
    return r.exit_code;
  }

  // Spawns `server` with `args` (its log dir_/`log`, `env` added to ours),
  // waits for it to listen (`seconds` at most) and connects: nullptr, after
  // a failure naming the log, when it does not.
  std::unique_ptr<clients::Client> StartServer(
      Proc& server, const std::vector<std::string>& args,
      const std::string& log, const std::vector<std::string>& env = {},
      double seconds = 30) {
    if (!server.Spawn(args, dir_ / log, env)) {
      ADD_FAILURE() << "cannot start " << args[0];
      return nullptr;
    }
    const std::string address = server.WaitListening(seconds);
    if (address.empty()) {
      ADD_FAILURE() << "not listening: " << ReadFile(dir_ / log);
      return nullptr;
    }
    auto client = clients::Client::Connect(address);
    if (!client.ok()) {
      ADD_FAILURE() << client.status();
      return nullptr;
    }
    return *std::move(client);
  }

  // Starts `request` on `client` and polls it until the job has run
  // `steps` steps (60 s at most): the steps it had run then, or -1 after a
  // failure (the job did not start, or failed).
  static int64_t RunJobPast(clients::Client& client, const JobRequest& request,
                            int64_t steps) {
    auto job = client.StartJob(request);
    if (!job.ok()) {
      ADD_FAILURE() << job.status();
      return -1;
    }
    absl::StatusOr<JobStatus> running;
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::seconds(60);
    do {
      running = client.GetJob(job->id());
      if (!running.ok() || (running->state() != JobStatus::PENDING &&
                            running->state() != JobStatus::RUNNING)) {
        ADD_FAILURE() << (running.ok() ? running->error()
                                       : running.status().ToString());
        return -1;
      }
    } while (running->steps() < steps &&
             std::chrono::steady_clock::now() < deadline);
    return running->steps();
  }

  // Runs `request` on a server of `args` (log first.log; each checkpoint
  // slowed by 30 ms, so that the kill lands while the job runs) past step
  // 27 and the checkpoint at step 25, and kills it -9 there, before the
  // job's `steps`: every committed checkpoint under root_ then loads, and
  // *newest, the newest, is at step 25 or later.
  void KillNinePastStep27(const std::vector<std::string>& args,
                          const JobRequest& request, int64_t steps,
                          Newest* newest) {
    int64_t killed_at = 0;
    {
      Proc server;
      auto client = StartServer(server, args, "first.log",
                                {"DLRM_TEST_CHECKPOINT_DELAY_MS=30"});
      ASSERT_NE(client, nullptr);
      killed_at = RunJobPast(*client, request, 27);
      server.Kill9();
    }
    ASSERT_GE(killed_at, 27);
    ASSERT_LT(killed_at, steps);
    *newest = CheckEveryCommittedCheckpointLoads(root_);
    ASSERT_GE(newest->step, 25);
    ASSERT_LT(newest->step, steps);
  }

  // StartServer(server, args, "second.log"), whose log must say it resumes
  // job-1 at `newest`'s step of `steps`: its client (null after a failure).
  std::unique_ptr<clients::Client> StartResuming(
      Proc& server, const std::vector<std::string>& args, const Newest& newest,
      int64_t steps) {
    auto client = StartServer(server, args, "second.log");
    if (client == nullptr) return nullptr;
    const std::string text = ReadFile(dir_ / "second.log");
    EXPECT_HAS_SUBSTR(text, "resuming job job-1 at step " +
                                std::to_string(newest.step) + " of " +
                                std::to_string(steps))
        << text;
    return client;
  }

  // The flags of a tiny training server with periodic checkpoints.
  std::vector<std::string> Args(std::vector<std::string> extra = {}) {
    std::vector<std::string> args = test::WithLocalServerFlags(
        {ServerPath(), "--config", "tiny", "--checkpoint-dir", root_.string()});
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  }

  // An endless synthetic training job (or `steps` long).
  static JobRequest Job(int64_t steps) {
    JobRequest r;
    r.mutable_train()->mutable_synthetic()->set_num_samples(0);
    r.set_batch_size(32);
    r.set_max_steps(steps);
    return r;
  }

  fs::path root_;
};

// Whether a save's temporary directory ("<name>.tmp-<pid>") is under
// `root`, other than those of process `except` (a running server's own
// save in progress).
bool HasTemporary(const fs::path& root, pid_t except = -1) {
  std::error_code ec;
  const std::string own = ".tmp-" + std::to_string(except);
  for (const auto& entry : fs::directory_iterator(root, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.find(".tmp-") == std::string::npos) continue;
    if (except > 0 && name.ends_with(own)) continue;
    return true;
  }
  return false;
}

// kill -9 at random moments, half the trials with a slow disk (the test
// hook DLRM_TEST_CHECKPOINT_DELAY_MS) so that many kills land inside a
// checkpoint write. After each kill: every committed checkpoint loads, the
// restarted server says it resumes from the newest one at its step, and
// training continues from there without error.
TEST_F(ServerProcessTest, KillNineDuringTrainingAndCheckpointsThenResume) {
  const unsigned seed = 20261123;
  std::mt19937 rng(seed);
  std::printf("seed %u\n", seed);
  constexpr int kTrials = 24;
  int killed_in_save = 0, resumed = 0;
  for (int trial = 0; trial < kTrials; ++trial) {
    SCOPED_TRACE("trial " + std::to_string(trial));
    const Newest newest = CheckEveryCommittedCheckpointLoads(root_);
    const bool left_temporary = HasTemporary(root_);
    const fs::path log = dir_ / ("server-" + std::to_string(trial) + ".log");
    const bool slow_disk = trial % 2 == 0;
    Proc server;
    ASSERT_TRUE(server.Spawn(
        Args({"--checkpoint-every-steps", "2", "--keep-checkpoints", "3"}), log,
        {slow_disk ? "DLRM_TEST_CHECKPOINT_DELAY_MS=40"
                   : "DLRM_TEST_CHECKPOINT_DELAY_MS=0"}));
    const std::string address = server.WaitListening(30);
    ASSERT_FALSE(address.empty()) << ReadFile(log);
    const std::string text = ReadFile(log);
    if (newest.step >= 0) {
      EXPECT_HAS_SUBSTR(text, "resuming from " + newest.dir + " at step " +
                                  std::to_string(newest.step))
          << text;
      ++resumed;
    } else {
      EXPECT_HAS_SUBSTR(text, "starting afresh") << text;
    }
    if (left_temporary) {
      EXPECT_HAS_SUBSTR(text, "an unfinished checkpoint") << text;
    }
    // Gone at start; the resumed job may already be saving its own.
    EXPECT_FALSE(HasTemporary(root_, server.pid));

    auto client = clients::Client::Connect(address);
    ASSERT_TRUE(client.ok()) << client.status();
    auto info = (*client)->GetModelInfo();
    ASSERT_TRUE(info.ok()) << info.status();
    // The one job of every trial was killed mid-way each time: the
    // checkpoint recorded it and the restarted server resumes it (the model
    // then trains on at once).
    absl::StatusOr<JobStatus> job;
    if (newest.step >= 0) {
      EXPECT_GE(info->steps(), newest.step);
      EXPECT_HAS_SUBSTR(text, "resuming job job-1 at step " +
                                  std::to_string(newest.step) + " of 1000000")
          << text;
      job = (*client)->GetJob("job-1");
      ASSERT_TRUE(job.ok()) << job.status();
      EXPECT_GE(job->steps(), newest.step);
    } else {
      EXPECT_EQ(info->steps(), 0);
      job = (*client)->StartJob(Job(/*steps=*/1000000));
      ASSERT_TRUE(job.ok()) << job.status();
    }
    // Two steps, so the step-2 checkpoint is committed (the job counts a
    // step once its checkpoint is written), then a random pause.
    absl::StatusOr<JobStatus> running =
        test::WaitForJobSteps(**client, job->id(), 2, /*seconds=*/20);
    ASSERT_TRUE(running.ok()) << running.status();
    std::this_thread::sleep_for(std::chrono::milliseconds(
        std::uniform_int_distribution<int>(0, 200)(rng)));
    // Training runs (and has not failed) right up to the kill.
    running = (*client)->GetJob(job->id());
    ASSERT_TRUE(running.ok()) << running.status();
    EXPECT_EQ(running->state(), JobStatus::RUNNING) << running->error();
    server.Kill9();
    if (HasTemporary(root_)) ++killed_in_save;
  }
  std::printf("%d trials, %d killed inside a checkpoint write, %d resumed\n",
              kTrials, killed_in_save, resumed);
  EXPECT_GE(killed_in_save, 3);
  EXPECT_EQ(resumed, kTrials - 1);

  // Finally a clean run: resume, cancel the resumed job, train 5 more
  // steps to the end, no error.
  const Newest newest = CheckEveryCommittedCheckpointLoads(root_);
  ASSERT_GE(newest.step, 0);
  Proc server;
  ASSERT_TRUE(
      server.Spawn(Args({"--checkpoint-every-steps", "3"}), dir_ / "last.log"));
  const std::string address = server.WaitListening(30);
  ASSERT_FALSE(address.empty()) << ReadFile(dir_ / "last.log");
  auto client = clients::Client::Connect(address);
  ASSERT_TRUE(client.ok()) << client.status();
  auto cancelled = (*client)->CancelJob("job-1");
  ASSERT_TRUE(cancelled.ok()) << cancelled.status();
  EXPECT_EQ(cancelled->state(), JobStatus::CANCELLED);
  const int64_t steps = (*client)->GetModelInfo()->steps();
  EXPECT_GE(steps, newest.step);
  auto job = (*client)->StartJob(Job(5));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->id(), "job-2");
  auto done = (*client)->WaitJob(job->id(), {}, nullptr);
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->state(), JobStatus::SUCCEEDED) << done->error();
  EXPECT_EQ((*client)->GetModelInfo()->steps(), steps + 5);
  client->reset();
  kill(server.pid, SIGTERM);
  EXPECT_EQ(server.WaitExit(20), 0);
}

// A dataset job survives kill -9: the periodic checkpoints record it, the
// restarted server (same command line) resumes it at the recorded position
// under its id, and its final model is bitwise the one of an uninterrupted
// run. A job that ended (succeeded, cancelled) is not restarted, and new
// ids go on after the old ones.
TEST_F(ServerProcessTest, JobResumesAfterKillNineToTheSameWeights) {
  // Two epochs of 700 synthetic samples in batches of 32 (22 per epoch,
  // the last one short): 44 steps.
  JobRequest request;
  request.mutable_train()->mutable_synthetic()->set_num_samples(700);
  request.set_batch_size(32);
  request.set_epochs(2);
  constexpr int64_t kSteps = 44;
  clients::WaitOptions wait;
  wait.poll_interval_seconds = 0.02;

  uint64_t uninterrupted = 0;
  {
    root_ = dir_ / "uninterrupted";
    Proc server;
    auto client = StartServer(server, Args(), "uninterrupted.log");
    ASSERT_NE(client, nullptr);
    auto job = client->StartJob(request);
    ASSERT_TRUE(job.ok()) << job.status();
    auto done = client->WaitJob(job->id(), wait, nullptr);
    ASSERT_TRUE(done.ok()) << done.status();
    ASSERT_EQ(done->state(), JobStatus::SUCCEEDED) << done->error();
    EXPECT_EQ(done->steps(), kSteps);
    auto info = client->GetModelInfo(/*include_weight_checksum=*/true);
    ASSERT_TRUE(info.ok()) << info.status();
    EXPECT_EQ(info->steps(), kSteps);
    uninterrupted = info->weight_checksum();
  }

  root_ = dir_ / "ckpt";
  // Every 5 steps (not a divisor of an epoch's 22, so checkpoints land
  // mid-epoch and in the second one); the first run slowed down so that
  // the kill lands while the job runs.
  const std::vector<std::string> args =
      Args({"--checkpoint-every-steps", "5", "--keep-checkpoints", "2"});
  // Into the second epoch, past the checkpoint at step 25 (the resume
  // below names the job: job-1).
  Newest newest;
  ASSERT_NO_FATAL_FAILURE(KillNinePastStep27(args, request, kSteps, &newest));
  int64_t cancelled_at = 0;  // the model's step when job-2 was cancelled

  // The same command line: the job goes on by itself.
  {
    Proc server;
    auto client = StartResuming(server, args, newest, kSteps);
    ASSERT_NE(client, nullptr);
    auto jobs = client->ListJobs();
    ASSERT_TRUE(jobs.ok()) << jobs.status();
    ASSERT_EQ(jobs->size(), 1u);
    EXPECT_EQ((*jobs)[0].id(), "job-1");
    EXPECT_GE((*jobs)[0].steps(), newest.step);
    auto done = client->WaitJob("job-1", wait, nullptr);
    ASSERT_TRUE(done.ok()) << done.status();
    ASSERT_EQ(done->state(), JobStatus::SUCCEEDED) << done->error();
    EXPECT_EQ(done->steps(), kSteps);
    EXPECT_EQ(done->samples(), 2 * 700);
    auto info = client->GetModelInfo(/*include_weight_checksum=*/true);
    ASSERT_TRUE(info.ok()) << info.status();
    EXPECT_EQ(info->steps(), kSteps);
    EXPECT_EQ(info->weight_checksum(), uninterrupted);

    // An endless job, cancelled after a checkpoint recorded it running.
    auto endless = client->StartJob(Job(1000000));
    ASSERT_TRUE(endless.ok()) << endless.status();
    EXPECT_EQ(endless->id(), "job-2");
    absl::StatusOr<JobStatus> running;
    do {
      running = client->GetJob("job-2");
      ASSERT_TRUE(running.ok()) << running.status();
    } while (running->steps() < 7);
    auto cancelled = client->CancelJob("job-2");
    ASSERT_TRUE(cancelled.ok()) << cancelled.status();
    EXPECT_EQ(cancelled->state(), JobStatus::CANCELLED);
    cancelled_at = kSteps + cancelled->steps();
    server.Kill9();
  }
  // Neither the finished nor the cancelled job starts again.
  std::vector<std::string> on_exit = args;
  on_exit.push_back("--checkpoint-on-exit");
  {
    Proc server;
    ASSERT_TRUE(server.Spawn(on_exit, dir_ / "third.log"));
    const std::string address = server.WaitListening(30);
    ASSERT_FALSE(address.empty()) << ReadFile(dir_ / "third.log");
    const std::string text = ReadFile(dir_ / "third.log");
    // The cancel saved job-2's last step, recording no job
    // (ModelHost::CheckpointStoppedTraining): the resume starts there.
    EXPECT_HAS_SUBSTR(
        text,
        "resuming from " +
            (root_ / model::PeriodicCheckpointName(cancelled_at)).string() +
            " at step " + std::to_string(cancelled_at))
        << text;
    EXPECT_NO_SUBSTR(text, "resuming job") << text;
    auto client = clients::Client::Connect(address);
    ASSERT_TRUE(client.ok()) << client.status();
    auto jobs = (*client)->ListJobs();
    ASSERT_TRUE(jobs.ok()) << jobs.status();
    EXPECT_TRUE(jobs->empty());
    // A graceful stop mid-job: the exit checkpoint records the job.
    auto next = (*client)->StartJob(Job(1000000));
    ASSERT_TRUE(next.ok()) << next.status();
    EXPECT_EQ(next->id(), "job-3");
    absl::StatusOr<JobStatus> running =
        test::WaitForJobSteps(**client, "job-3", 3);
    ASSERT_TRUE(running.ok()) << running.status();
    client->reset();
    kill(server.pid, SIGTERM);
    EXPECT_EQ(server.WaitExit(20), 0);
  }
  auto final_manifest = model::ReadManifest((root_ / "final").string());
  ASSERT_TRUE(final_manifest.ok()) << final_manifest.status();
  const size_t at = final_manifest->job.find("\"steps\":");
  ASSERT_NE(at, std::string::npos) << final_manifest->job;
  const int64_t stopped = std::stoll(final_manifest->job.substr(at + 8));
  EXPECT_GE(stopped, 3);
  Proc server;
  ASSERT_TRUE(server.Spawn(args, dir_ / "fourth.log"));
  const std::string address = server.WaitListening(30);
  ASSERT_FALSE(address.empty()) << ReadFile(dir_ / "fourth.log");
  const std::string text = ReadFile(dir_ / "fourth.log");
  EXPECT_HAS_SUBSTR(text, "resuming job job-3 at step " +
                              std::to_string(stopped) + " of 1000000")
      << text;
  auto client = clients::Client::Connect(address);
  ASSERT_TRUE(client.ok()) << client.status();
  auto cancelled = (*client)->CancelJob("job-3");
  ASSERT_TRUE(cancelled.ok()) << cancelled.status();
  EXPECT_EQ(cancelled->state(), JobStatus::CANCELLED);
  EXPECT_GE(cancelled->steps(), stopped);
  client->reset();
  kill(server.pid, SIGTERM);
  EXPECT_EQ(server.WaitExit(20), 0);
}

// Every tensor of the safetensors files `a` and `b` whose name ends with
// `suffix` ("" for all): the same names, bytes and dtypes.
void ExpectSameTensors(const fs::path& a, const fs::path& b,
                       const std::string& suffix) {
  auto fa = model::SafetensorsFile::Open(a.string());
  auto fb = model::SafetensorsFile::Open(b.string());
  ASSERT_TRUE(fa.ok()) << fa.status();
  ASSERT_TRUE(fb.ok()) << fb.status();
  int compared = 0;
  for (const std::string& name : (*fa)->Names()) {
    if (!name.ends_with(suffix)) continue;
    ASSERT_TRUE((*fb)->Has(name)) << name << " is not in " << b;
    const model::Dtype dtype = *(*fa)->DtypeOf(name);
    const std::vector<int64_t> shape = *(*fa)->Shape(name);
    auto x = (*fa)->GetBytes(name, dtype, shape);
    auto y = (*fb)->GetBytes(name, dtype, shape);
    ASSERT_TRUE(x.ok() && y.ok()) << name;
    EXPECT_TRUE(std::equal(x->begin(), x->end(), y->begin(), y->end()))
        << name << " differs";
    ++compared;
  }
  EXPECT_GT(compared, 0) << "no tensor of " << a << " ends with " << suffix;
  if (suffix.empty()) {
    EXPECT_EQ((*fa)->Names(), (*fb)->Names());
  }
}

// The same for dynamic tables (docs/dynamic.md) whose raw ids come from a
// drifting vocabulary 40x their capacity, so that they admit and evict all
// along: killed during training, the resumed job ends with the weights,
// the id maps (the checkpoint's <base>.dynamic_map, the export's ids,
// occupied rows) and the admission sketch of an uninterrupted run.
TEST_F(ServerProcessTest, DynamicTablesResumeAfterKillNineToTheSameMaps) {
  const fs::path config = dir_ / "dynamic.textproto";
  {
    std::ofstream out(config);
    out << R"(num_dense_features: 4 embedding_dim: 4
      tables { name: "t0" rows: 50 dynamic: true eviction { ttl_steps: 6 } }
      tables { name: "t1" rows: 20 multi_hot_size: 3 pooling: POOLING_MEAN }
      tables { name: "t2" rows: 100 multi_hot_size: 2 dynamic: true
               admission { kind: ADMIT_AFTER_SIGHTINGS min_sightings: 2 }
               eviction { kind: EVICT_LFU } unadmitted: UNADMITTED_SHARED_ROW }
      bottom_mlp: [8, 4] top_mlp: [8, 1] interaction: INTERACTION_DOT
      dense_optimizer { type: SGD learning_rate: 0.1 }
      sparse_optimizer { type: ADAGRAD learning_rate: 0.1 }
      seed: 7
    )";
  }
  auto args_for = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = Args(std::move(extra));
    *std::find(args.begin(), args.end(), "tiny") = config.string();
    return args;
  };
  JobRequest request;
  SyntheticData& data = *request.mutable_train()->mutable_synthetic();
  data.set_num_samples(700);
  data.set_vocabulary(4000);
  data.set_drift(0.5);
  request.set_batch_size(32);
  request.set_epochs(2);
  constexpr int64_t kSteps = 44;
  clients::WaitOptions wait;
  wait.poll_interval_seconds = 0.02;

  // Ends the job, then returns the model's info and writes its export and
  // a checkpoint (relative paths: under root_).
  auto finish = [&](clients::Client& client, const std::string& id) {
    auto done = client.WaitJob(id, wait, nullptr);
    EXPECT_TRUE(done.ok()) << done.status();
    EXPECT_EQ(done->state(), JobStatus::SUCCEEDED) << done->error();
    EXPECT_EQ(done->steps(), kSteps);
    auto info = client.GetModelInfo(/*include_weight_checksum=*/true);
    EXPECT_TRUE(info.ok()) << info.status();
    EXPECT_EQ(info->steps(), kSteps);
    auto exported = client.ExportWeights("weights.safetensors");
    EXPECT_TRUE(exported.ok()) << exported.status();
    auto saved = client.SaveCheckpoint("end");
    EXPECT_TRUE(saved.ok()) << saved.status();
    return *info;
  };

  ModelInfo uninterrupted;
  const fs::path first_root = dir_ / "uninterrupted";
  {
    root_ = first_root;
    Proc server;
    auto client = StartServer(server, args_for({}), "uninterrupted.log");
    ASSERT_NE(client, nullptr);
    auto job = client->StartJob(request);
    ASSERT_TRUE(job.ok()) << job.status();
    uninterrupted = finish(*client, job->id());
    ASSERT_FALSE(HasFailure());
  }
  // Both dynamic tables evicted (the counters of one uninterrupted run).
  ASSERT_EQ(uninterrupted.dynamic_tables_size(), 2);
  for (const DynamicTableStats& t : uninterrupted.dynamic_tables()) {
    EXPECT_GT(t.ids_evicted(), 0) << t.table();
    EXPECT_GT(t.occupied_rows(), 0) << t.table();
  }

  root_ = dir_ / "ckpt";
  const std::vector<std::string> args =
      args_for({"--checkpoint-every-steps", "5", "--keep-checkpoints", "2"});
  Newest newest;
  ASSERT_NO_FATAL_FAILURE(KillNinePastStep27(args, request, kSteps, &newest));
  {
    Proc server;
    auto client = StartResuming(server, args, newest, kSteps);
    ASSERT_NE(client, nullptr);
    const ModelInfo resumed = finish(*client, "job-1");
    EXPECT_EQ(resumed.weight_checksum(), uninterrupted.weight_checksum());
    ASSERT_EQ(resumed.dynamic_tables_size(), 2);
    for (int k = 0; k < 2; ++k) {
      EXPECT_EQ(resumed.dynamic_tables(k).occupied_rows(),
                uninterrupted.dynamic_tables(k).occupied_rows())
          << resumed.dynamic_tables(k).table();
    }
  }
  // The export (every weight and each dynamic table's ids) and the
  // checkpoint's maps and sketch, bitwise.
  ExpectSameTensors(first_root / "weights.safetensors",
                    root_ / "weights.safetensors", "");
  ExpectSameTensors(first_root / "end" / "rank-0.safetensors",
                    root_ / "end" / "rank-0.safetensors", ".dynamic_map");
  ExpectSameTensors(first_root / "end" / "rank-0.safetensors",
                    root_ / "end" / "rank-0.safetensors", ".dynamic_sketch");
}

// Flip a byte in the newest checkpoint, truncate a file of the next: the
// restart skips both, naming them, and resumes from the third; training
// then rewrites the damaged step's checkpoint. When nothing loads, the
// server refuses to start unless --no-resume.
TEST_F(ServerProcessTest, DamagedCheckpointsAreSkippedWithAWarning) {
  {
    Proc server;
    auto client = StartServer(
        server,
        Args({"--checkpoint-every-steps", "2", "--keep-checkpoints", "5"}),
        "first.log");
    ASSERT_NE(client, nullptr);
    auto job = client->StartJob(Job(6));
    ASSERT_TRUE(job.ok()) << job.status();
    auto done = client->WaitJob(job->id(), {}, nullptr);
    ASSERT_TRUE(done.ok()) << done.status();
    ASSERT_EQ(done->state(), JobStatus::SUCCEEDED) << done->error();
    server.Kill9();
  }
  for (const char* name : {"ckpt-2", "ckpt-4", "ckpt-6"}) {
    ASSERT_TRUE(fs::exists(root_ / name / "MANIFEST.json")) << name;
  }
  const fs::path flipped = root_ / "ckpt-6" / "rank-0.safetensors";
  {
    std::fstream f(flipped, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(fs::file_size(flipped) / 2));
    f.put('\x5a');
  }
  const fs::path truncated = root_ / "ckpt-4" / "dense.safetensors";
  fs::resize_file(truncated, fs::file_size(truncated) - 100);

  const fs::path log = dir_ / "second.log";
  Proc server;
  ASSERT_TRUE(server.Spawn(Args({"--checkpoint-every-steps", "2"}), log));
  const std::string address = server.WaitListening(30);
  ASSERT_FALSE(address.empty()) << ReadFile(log);
  const std::string text = ReadFile(log);
  EXPECT_HAS_SUBSTR(text, "skipping checkpoint " + (root_ / "ckpt-6").string())
      << text;
  EXPECT_HAS_SUBSTR(text, flipped.string() + " is corrupt") << text;
  EXPECT_HAS_SUBSTR(text, "skipping checkpoint " + (root_ / "ckpt-4").string())
      << text;
  EXPECT_HAS_SUBSTR(text, truncated.string() + " has ") << text;
  EXPECT_HAS_SUBSTR(
      text, "resuming from " + (root_ / "ckpt-2").string() + " at step 2")
      << text;
  auto client = clients::Client::Connect(address);
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_EQ((*client)->GetModelInfo()->steps(), 2);
  auto job = (*client)->StartJob(Job(2));
  ASSERT_TRUE(job.ok()) << job.status();
  auto done = (*client)->WaitJob(job->id(), {}, nullptr);
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->state(), JobStatus::SUCCEEDED) << done->error();
  // The new step-4 checkpoint replaced the damaged one.
  EXPECT_TRUE(model::LoadCheckpoint((root_ / "ckpt-4").string(), false).ok());
  server.Kill9();

  // Damage every checkpoint: no silent fresh start.
  for (const model::CheckpointEntry& e : model::ListCheckpoints(root_)) {
    fs::resize_file(fs::path(e.dir) / "rank-0.safetensors", 10);
  }
  Proc refused;
  ASSERT_TRUE(refused.Spawn(Args(), dir_ / "third.log"));
  EXPECT_EQ(refused.WaitExit(30), 1);
  EXPECT_HAS_SUBSTR(ReadFile(dir_ / "third.log"), "could be loaded")
      << ReadFile(dir_ / "third.log");
  Proc fresh;
  ASSERT_TRUE(fresh.Spawn(Args({"--no-resume"}), dir_ / "fourth.log"));
  const std::string fresh_address = fresh.WaitListening(30);
  ASSERT_FALSE(fresh_address.empty()) << ReadFile(dir_ / "fourth.log");
  auto fresh_client = clients::Client::Connect(fresh_address);
  ASSERT_TRUE(fresh_client.ok());
  EXPECT_EQ((*fresh_client)->GetModelInfo()->steps(), 0);
}

// A replica (--inference-only --follow DIR) as a real process: it waits
// for the first checkpoint before it listens, then serves it, swaps a
// newer one in, and exits 0 on SIGTERM. --follow without --inference-only
// is refused at start-up.
TEST_F(ServerProcessTest, FollowingReplicaServesTheNewestCheckpoint) {
  fs::create_directories(root_);
  {
    Proc refused;
    ASSERT_TRUE(
        refused.Spawn({ServerPath(), "--follow", root_.string(), "--listen",
                       "127.0.0.1:0", "--metrics-listen", ""},
                      dir_ / "refused.log"));
    EXPECT_EQ(refused.WaitExit(30), 1);
    EXPECT_HAS_SUBSTR(ReadFile(dir_ / "refused.log"),
                      "--follow needs --inference-only")
        << ReadFile(dir_ / "refused.log");
  }
  const fs::path log = dir_ / "replica.log";
  Proc replica;
  ASSERT_TRUE(
      replica.Spawn({ServerPath(), "--inference-only", "--follow",
                     root_.string(), "--follow-poll-seconds", "0.1", "--listen",
                     "127.0.0.1:0", "--metrics-listen", "", "--threads", "1"},
                    log));
  // It says it waits (and does not listen: nothing to serve yet).
  for (int i = 0;
       i < 600 && ReadFile(log).find("waiting for a complete "
                                     "checkpoint") == std::string::npos;
       ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_HAS_SUBSTR(ReadFile(log), "waiting for a complete checkpoint")
      << ReadFile(log);

  {
    // SIGTERM while waiting is an orderly stop.
    Proc waiting;
    ASSERT_TRUE(
        waiting.Spawn({ServerPath(), "--inference-only", "--follow",
                       root_.string(), "--follow-poll-seconds", "0.1",
                       "--listen", "127.0.0.1:0", "--metrics-listen", ""},
                      dir_ / "waiting.log"));
    for (int i = 0; i < 600 && ReadFile(dir_ / "waiting.log")
                                       .find("waiting for a complete "
                                             "checkpoint") == std::string::npos;
         ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    kill(waiting.pid, SIGTERM);
    EXPECT_EQ(waiting.WaitExit(30), 0) << ReadFile(dir_ / "waiting.log");
  }

  auto config = LoadModelConfig("tiny");
  ASSERT_TRUE(config.ok());
  auto trainer = model::Model::Create(*config);
  ASSERT_TRUE(trainer.ok());
  data::SyntheticOptions so;
  so.teacher_seed = config->seed();
  auto source = data::MakeSyntheticSource(*config, so);
  ASSERT_TRUE(source.ok());
  data::Batch batch;
  auto train_to = [&](int64_t step) {
    while ((*trainer)->steps() < step) {
      ASSERT_TRUE(*(*source)->Next(32, &batch));
      ASSERT_TRUE((*trainer)->TrainStep(batch).ok());
    }
    ASSERT_TRUE(
        model::SaveCheckpoint(
            **trainer, (root_ / model::PeriodicCheckpointName(step)).string())
            .ok());
  };
  train_to(2);
  const std::string address = replica.WaitListening(120);
  ASSERT_FALSE(address.empty()) << ReadFile(log);
  auto client = clients::Client::Connect(address);
  ASSERT_TRUE(client.ok()) << client.status();
  auto info = (*client)->GetModelInfo();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_TRUE(info->inference_only());
  EXPECT_EQ(info->steps(), 2);
  EXPECT_EQ(info->served_checkpoint(), (root_ / "ckpt-2").string());

  train_to(4);
  int64_t served = 0;
  for (int i = 0; i < 1200 && served != 4; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    info = (*client)->GetModelInfo();
    ASSERT_TRUE(info.ok()) << info.status();
    served = info->served_checkpoint_step();
  }
  EXPECT_EQ(served, 4) << ReadFile(log);
  EXPECT_EQ(info->served_checkpoint(), (root_ / "ckpt-4").string());
  ASSERT_TRUE(*(*source)->Next(8, &batch));
  std::vector<float> want;
  ASSERT_TRUE((*trainer)->Predict(batch, &want).ok());
  auto got = (*client)->Predict(batch);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_NEAR((*got)[i], want[i], 1e-6f) << i;
  }
  kill(replica.pid, SIGTERM);
  EXPECT_EQ(replica.WaitExit(60), 0) << ReadFile(log);
}

// A trainer whose job ends between two periodic checkpoints saves its last
// step, and a replica following its directory serves it: it does not stay
// at the checkpoint before. Then the trainer's stop saves `final` (with
// more steps), which the replica serves too.
TEST_F(ServerProcessTest, ReplicaCatchesUpWhenTrainingStopsBetweenCheckpoints) {
  Proc trainer;
  auto client = StartServer(
      trainer, Args({"--checkpoint-every-steps", "10", "--checkpoint-on-exit"}),
      "trainer.log", {}, 120);
  ASSERT_NE(client, nullptr);
  auto job = client->StartJob(Job(15));
  ASSERT_TRUE(job.ok()) << job.status();
  clients::WaitOptions wait;
  wait.poll_interval_seconds = 0.05;
  auto done = client->WaitJob(job->id(), wait, nullptr);
  ASSERT_TRUE(done.ok()) << done.status();
  ASSERT_EQ(done->state(), JobStatus::SUCCEEDED) << done->DebugString();
  EXPECT_TRUE(fs::exists(root_ / "ckpt-10"));
  EXPECT_TRUE(fs::exists(root_ / "ckpt-15")) << ReadFile(dir_ / "trainer.log");

  Proc replica;
  auto follower =
      StartServer(replica,
                  test::WithLocalServerFlags({ServerPath(), "--inference-only",
                                              "--follow", root_.string(),
                                              "--follow-poll-seconds", "0.1"}),
                  "replica.log", {}, 120);
  ASSERT_NE(follower, nullptr);
  auto info = follower->GetModelInfo();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->served_checkpoint_step(), 15);

  // Three more steps, then the trainer stops and saves final/ at step 18.
  job = client->StartJob(Job(3));
  ASSERT_TRUE(job.ok()) << job.status();
  done = client->WaitJob(job->id(), wait, nullptr);
  ASSERT_TRUE(done.ok()) << done.status();
  client.reset();
  kill(trainer.pid, SIGTERM);
  EXPECT_EQ(trainer.WaitExit(60), 0) << ReadFile(dir_ / "trainer.log");
  ASSERT_TRUE(fs::exists(root_ / "final"));
  int64_t served = 0;
  std::string dir;
  for (int i = 0; i < 1200 && dir != (root_ / "final").string(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    info = follower->GetModelInfo();
    ASSERT_TRUE(info.ok()) << info.status();
    served = info->served_checkpoint_step();
    dir = info->served_checkpoint();
  }
  EXPECT_EQ(dir, (root_ / "final").string()) << ReadFile(dir_ / "replica.log");
  EXPECT_EQ(served, 18);
  follower.reset();
  kill(replica.pid, SIGTERM);
  EXPECT_EQ(replica.WaitExit(60), 0) << ReadFile(dir_ / "replica.log");
}

// --health-check against a TLS server: with the CA it gets SERVING; without
// it (plaintext, or TLS not trusting the CA) it fails; mutual TLS needs the
// client certificate too.
TEST_F(ServerProcessTest, HealthCheckOverTls) {
  if (!test::MakeTestCertificates(dir_)) {
    GTEST_SKIP() << "the openssl tool could not make test certificates";
  }
  auto file = [&](const char* name) { return (dir_ / name).string(); };
  std::string address;
  auto probe = [&](std::vector<std::string> extra, std::string* out) {
    std::vector<std::string> args = {ServerPath(), "--health-check", address};
    args.insert(args.end(), extra.begin(), extra.end());
    return RunToEnd(args, out);
  };
  for (const bool mutual : {false, true}) {
    SCOPED_TRACE(mutual ? "mutual TLS" : "TLS");
    std::vector<std::string> args = {
        ServerPath(), "--config",        "tiny",
        "--listen",   "127.0.0.1:0",     "--metrics-listen",
        "",           "--tls-cert",      file("server.pem"),
        "--tls-key",  file("server.key")};
    if (mutual) {
      args.push_back("--tls-client-ca");
      args.push_back(file("ca.pem"));
    }
    Proc server;
    ASSERT_TRUE(server.Spawn(args, dir_ / "tls-server.log"));
    address = server.WaitListening(30);
    ASSERT_FALSE(address.empty()) << ReadFile(dir_ / "tls-server.log");
    std::string out;
    std::vector<std::string> trusted = {"--health-check-ca", file("ca.pem")};
    if (mutual) {
      EXPECT_EQ(probe(trusted, &out), 1) << out;
      trusted.insert(trusted.end(), {"--health-check-cert", file("client.pem"),
                                     "--health-check-key", file("client.key")});
    }
    EXPECT_EQ(probe(trusted, &out), 0) << out;
    EXPECT_HAS_SUBSTR(out, "SERVING") << out;
    EXPECT_EQ(probe({}, &out), 1) << out;  // plaintext to a TLS port
    EXPECT_EQ(probe({"--health-check-ca", file("other-ca.pem")}, &out), 1)
        << out;
    EXPECT_EQ(probe({"--health-check-ca", file("missing.pem")}, &out), 1)
        << out;
    EXPECT_HAS_SUBSTR(out, "missing.pem") << out;
    kill(server.pid, SIGTERM);
    EXPECT_EQ(server.WaitExit(20), 0);
  }
}

// The periodic-checkpoint and resume flags come from --server-config too,
// and are checked together with --checkpoint-dir.
TEST_F(ServerProcessTest, CheckpointFlagsFromTheConfigFile) {
  std::ofstream(dir_ / "server.toml")
      << "checkpoint-dir = \"" << root_.string() << "\"\n"
      << "checkpoint-every-steps = 7\ncheckpoint-every-seconds = 90\n"
      << "keep-checkpoints = 4\nresume = false\n";
  auto dry_run = [&](std::vector<std::string> extra, std::string* out) {
    std::vector<std::string> args = {ServerPath(), "--config", "tiny",
                                     "--dry-run"};
    args.insert(args.end(), extra.begin(), extra.end());
    return RunToEnd(args, out);
  };
  std::string out;
  const std::string config = (dir_ / "server.toml").string();
  ASSERT_EQ(dry_run({"--server-config", config}, &out), 0) << out;
  EXPECT_HAS_SUBSTR(out, "resume off") << out;
  EXPECT_HAS_SUBSTR(out, "every 7 steps, 90 s (0 = off), keeping 4") << out;
  ASSERT_EQ(dry_run({"--server-config", config, "--resume"}, &out), 0) << out;
  EXPECT_HAS_SUBSTR(out, "resume from the newest valid checkpoint") << out;
  EXPECT_EQ(dry_run({"--checkpoint-every-steps", "5"}, &out), 1) << out;
  EXPECT_HAS_SUBSTR(out, "need --checkpoint-dir") << out;
}

// A resume with another --config: what a trained model may change (the
// tables' learning rate) is applied, logged field by field and reported by
// --dry-run; what it may not (a table's rows) is refused at start and by
// --dry-run, naming the field and both values. Without --config the
// checkpoint's config is used as it is.
TEST_F(ServerProcessTest, ResumeAppliesAChangedRateAndRefusesAnotherShape) {
  const ModelConfig tiny = *LoadModelConfig("tiny");
  {
    auto model = model::Model::Create(tiny);
    ASSERT_TRUE(model.ok()) << model.status();
    auto source = data::MakeSyntheticSource(tiny, data::SyntheticOptions{});
    ASSERT_TRUE(source.ok());
    data::Batch batch;
    for (int i = 0; i < 3; ++i) {
      ASSERT_TRUE(*(*source)->Next(16, &batch));
      ASSERT_TRUE((*model)->TrainStep(batch).ok());
    }
    ASSERT_TRUE(
        model::SaveCheckpoint(
            **model, (root_ / model::PeriodicCheckpointName(3)).string())
            .ok());
  }
  const auto write = [&](const ModelConfig& c, const std::string& name) {
    std::string text;
    EXPECT_TRUE(google::protobuf::TextFormat::PrintToString(c, &text));
    std::ofstream(dir_ / name) << text;
    return (dir_ / name).string();
  };
  ModelConfig faster = tiny;
  faster.mutable_sparse_optimizer()->set_learning_rate(0.05f);
  const std::string faster_path = write(faster, "faster.textproto");
  ModelConfig wider = tiny;
  wider.mutable_tables(2)->set_rows(200);
  const std::string wider_path = write(wider, "wider.textproto");
  const auto run = [&](std::vector<std::string> args, std::string* out) {
    return RunToEnd(args, out);
  };
  const std::string kApplied =
      "resume: sparse_optimizer.learning_rate 0.1 -> 0.05";
  const std::string kRefused =
      "tables[2].rows: the checkpoint has 100, the config 200";
  std::string out;
  std::vector<std::string> args = Args({"--dry-run"});
  args[2] = faster_path;
  ASSERT_EQ(run(args, &out), 0) << out;
  EXPECT_HAS_SUBSTR(
      out, "resumes from " + (root_ / "ckpt-3").string() + " at step 3")
      << out;
  EXPECT_HAS_SUBSTR(out, kApplied) << out;
  args[2] = wider_path;
  EXPECT_EQ(run(args, &out), 1) << out;
  EXPECT_HAS_SUBSTR(out, kRefused) << out;
  args = Args();
  args[2] = wider_path;
  EXPECT_EQ(run(args, &out), 1) << out;
  EXPECT_HAS_SUBSTR(out, kRefused) << out;
  EXPECT_NO_SUBSTR(out, "starting afresh") << out;

  // Started for real: the new rate is in force and logged.
  args = Args();
  args[2] = faster_path;
  Proc server;
  auto client = StartServer(server, args, "server.err", {}, 60);
  ASSERT_NE(client, nullptr);
  auto info = client->GetModelInfo();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->steps(), 3);
  EXPECT_EQ(info->config().sparse_optimizer().learning_rate(), 0.05f);
  EXPECT_EQ(info->config().dense_optimizer().learning_rate(), 0.1f);
  EXPECT_HAS_SUBSTR(ReadFile(dir_ / "server.err"), kApplied)
      << ReadFile(dir_ / "server.err");
  server.Kill9();

  // No --config: the checkpoint's own, nothing changed or refused.
  args = Args({"--dry-run"});
  args.erase(args.begin() + 1, args.begin() + 3);
  ASSERT_EQ(run(args, &out), 0) << out;
  EXPECT_NO_SUBSTR(out, "resume: ") << out;
}

// --device cuda (or device = "cuda" in the --server-config file) on a
// machine without a usable GPU: the server exits 1 at start with a
// FAILED_PRECONDITION that says why and how to run on the CPU, never an
// abort; --dry-run shows the device.
TEST_F(ServerProcessTest, CudaWithoutAGpuExitsWithAClearError) {
  if (CudaDeviceCount() > 0) {
    GTEST_SKIP() << "this machine has a CUDA device";
  }
  auto run = [&](const std::vector<std::string>& args, std::string* out) {
    return RunToEnd(args, out);
  };
  std::string out;
  ASSERT_EQ(run(Args({"--device", "cuda"}), &out), 1) << out;
  EXPECT_HAS_SUBSTR(out, "FAILED_PRECONDITION: device cuda") << out;
  EXPECT_HAS_SUBSTR(out, CudaUnavailableReason()) << out;
  EXPECT_HAS_SUBSTR(out, "--device cpu") << out;
  EXPECT_NO_SUBSTR(out, "listening on") << out;

  std::ofstream(dir_ / "server.toml") << "device = \"cuda\"\n";
  ASSERT_EQ(
      run(Args({"--server-config", (dir_ / "server.toml").string()}), &out), 1)
      << out;
  EXPECT_HAS_SUBSTR(out, "FAILED_PRECONDITION: device cuda") << out;
  const std::vector<std::string> dry = {ServerPath(), "--config", "tiny",
                                        "--device",   "cuda",     "--dry-run"};
  ASSERT_EQ(run(dry, &out), 0) << out;
  EXPECT_HAS_SUBSTR(out, "device cuda") << out;
  EXPECT_NE(
      run({ServerPath(), "--config", "tiny", "--device", "tpu", "--dry-run"},
          &out),
      0);
  EXPECT_HAS_SUBSTR(out, "--device: tpu not in") << out;
}

// --tf32 and --precision (core/dense_flags.h, shared with dlrm_train)
// reach the model config a run would use: --dry-run shows them, with the
// config's own settings when the flags are not given; a bad value fails
// naming the flag. Needs no GPU: a dry run allocates nothing.
TEST_F(ServerProcessTest, DenseFlagsReachTheConfig) {
  auto dry_run = [&](std::vector<std::string> extra, std::string* out) {
    std::vector<std::string> args = {ServerPath(), "--dry-run"};
    args.insert(args.end(), extra.begin(), extra.end());
    return RunToEnd(args, out);
  };
  std::string out;
  ASSERT_EQ(dry_run({"--config", "tiny", "--device", "cuda"}, &out), 0) << out;
  EXPECT_HAS_SUBSTR(out,
                    "device cuda (the dense part), dense precision fp32 "
                    "(auto, on the GPU), tf32 GEMMs on")
      << out;
  ASSERT_EQ(
      dry_run({"--config", "tiny", "--device", "cuda", "--tf32", "off"}, &out),
      0)
      << out;
  EXPECT_HAS_SUBSTR(out, "tf32 GEMMs off") << out;
  ASSERT_EQ(dry_run({"--config", "tiny", "--device", "cuda", "--tf32", "on",
                     "--precision", "bf16"},
                    &out),
            0)
      << out;
  EXPECT_HAS_SUBSTR(out,
                    "dense precision bf16 (asked for, on the GPU), tf32 GEMMs "
                    "on")
      << out;
  // The config's own setting when the flag is not given.
  std::ofstream(dir_ / "no_tf32.textproto")
      << "num_dense_features: 4 embedding_dim: 4\n"
         "tables { name: \"t0\" rows: 50 }\n"
         "bottom_mlp: [8, 4] top_mlp: [8, 1]\n"
         "device: DEVICE_CUDA gpu_disable_tf32: true\n";
  ASSERT_EQ(dry_run({"--config", (dir_ / "no_tf32.textproto").string()}, &out),
            0)
      << out;
  EXPECT_HAS_SUBSTR(out, "tf32 GEMMs off") << out;
  ASSERT_EQ(dry_run({"--config", (dir_ / "no_tf32.textproto").string(),
                     "--tf32", "on"},
                    &out),
            0)
      << out;
  EXPECT_HAS_SUBSTR(out, "tf32 GEMMs on") << out;
  EXPECT_NE(dry_run({"--config", "tiny", "--tf32", "maybe"}, &out), 0) << out;
  EXPECT_HAS_SUBSTR(out, "--tf32") << out;
}

// --device-memory-budget-mb reaches the config and the plan --dry-run
// prints: with 2 MiB per rank, the largest device table (a, 3.2 MB) moves
// to host memory on one rank; on two the planner splits it and b still
// does not fit beside it, so a moves (largest first). A negative budget
// fails naming the flag. A dry run never queries a GPU.
TEST_F(ServerProcessTest, DeviceMemoryBudgetReachesThePlan) {
  std::ofstream(dir_ / "device.textproto")
      << "num_dense_features: 4 embedding_dim: 8 device: DEVICE_CUDA\n"
         "tables { name: \"a\" rows: 100000 storage: STORAGE_DEVICE }\n"
         "tables { name: \"b\" rows: 50000 storage: STORAGE_DEVICE }\n"
         "tables { name: \"c\" rows: 1000 }\n"
         "bottom_mlp: [8] top_mlp: [1]\n";
  auto dry_run = [&](std::vector<std::string> extra, std::string* out) {
    std::vector<std::string> args = {ServerPath(), "--dry-run", "--config",
                                     (dir_ / "device.textproto").string()};
    args.insert(args.end(), extra.begin(), extra.end());
    return RunToEnd(args, out);
  };
  std::string out;
  ASSERT_EQ(dry_run({}, &out), 0) << out;
  EXPECT_HAS_SUBSTR(out, "device memory budget: the GPU's free memory at start")
      << out;
  EXPECT_HAS_SUBSTR(out,
                    "a (100000 x 8): table-wise on rank 0; in device memory")
      << out;
  ASSERT_EQ(dry_run({"--device-memory-budget-mb", "2"}, &out), 0) << out;
  EXPECT_HAS_SUBSTR(out, "device memory budget 2 MiB per rank") << out;
  EXPECT_HAS_SUBSTR(out, "a (100000 x 8): table-wise on rank 0\n") << out;
  EXPECT_HAS_SUBSTR(out,
                    "b (50000 x 8): table-wise on rank 0; in device memory")
      << out;
  ASSERT_EQ(dry_run({"--device-memory-budget-mb", "2", "--world-size", "2",
                     "--coordinator", "127.0.0.1:1"},
                    &out),
            0)
      << out;
  EXPECT_HAS_SUBSTR(out,
                    "a (100000 x 8): column-wise, rank 0 cols [0, 4), rank 1 "
                    "cols [4, 8)\n")
      << out;
  EXPECT_HAS_SUBSTR(out, "rank 1: 1.6 MiB in host memory, 0.0 MiB in device")
      << out;
  EXPECT_EQ(dry_run({"--device-memory-budget-mb", "-1"}, &out), 1) << out;
  EXPECT_HAS_SUBSTR(out, "--device-memory-budget-mb must be in [0, 2^43]")
      << out;
}

// ModelHost's periodic checkpoints in-process: which steps save, by steps
// and by time, retention, and the option checks. Each case has a directory
// of its own (root_, absent at the start) and 16 synthetic samples of the
// tiny model (batch_).
class ModelHostPeriodicTest : public testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() /
            (std::string("model_host_periodic_test-") +
             testing::UnitTest::GetInstance()->current_test_info()->name() +
             "-" + std::to_string(getpid()));
    fs::remove_all(root_);
    auto config = LoadModelConfig("tiny");
    ASSERT_TRUE(config.ok());
    config_ = *config;
    batch_ = test::SyntheticBatch(config_, 16, data::SyntheticOptions());
  }
  void TearDown() override { fs::remove_all(root_); }

  // A ModelHost of a fresh tiny model with `o`; null (and a failure) when
  // it cannot be made.
  std::unique_ptr<server::ModelHost> NewHost(
      const server::ModelHostOptions& o) {
    auto model = model::Model::Create(config_);
    EXPECT_TRUE(model.ok()) << model.status();
    if (!model.ok()) return nullptr;
    auto host = server::ModelHost::Create(std::move(*model), o);
    EXPECT_TRUE(host.ok()) << host.status();
    return host.ok() ? *std::move(host) : nullptr;
  }

  // Options that save under root_ every `steps` steps.
  server::ModelHostOptions SavingEvery(int64_t steps) const {
    server::ModelHostOptions o;
    o.checkpoint_dir = root_.string();
    o.checkpoint_every_steps = steps;
    return o;
  }

  // A host of NewHost and its training lease (holder "test"), which goes
  // before the host does.
  struct Training {
    std::unique_ptr<server::ModelHost> host;
    std::optional<server::ModelHost::TrainingLease> lease;
  };

  // NewHost(o) and its lease: a null host (and a failure) when either
  // cannot be had.
  Training NewTraining(const server::ModelHostOptions& o) {
    Training t;
    t.host = NewHost(o);
    if (t.host == nullptr) return t;
    auto lease = t.host->AcquireTraining("test");
    EXPECT_TRUE(lease.ok()) << lease.status();
    if (lease.ok()) {
      t.lease.emplace(*std::move(lease));
    } else {
      t.host.reset();
    }
    return t;
  }

  fs::path root_;
  ModelConfig config_;
  data::Batch batch_;
};

// Training that stops between two periodic checkpoints saves its step as
// one (for a replica to follow), once; none after StopTraining or without
// periodic checkpoints.
TEST_F(ModelHostPeriodicTest, StoppedTrainingSavesItsStepOnce) {
  server::ModelHostOptions o = SavingEvery(4);
  o.keep_checkpoints = 0;
  auto [host, lease] = NewTraining(o);
  ASSERT_NE(host, nullptr);
  bool failed = true;
  // Nothing trained yet: nothing to save.
  EXPECT_EQ(host->CheckpointStoppedTraining(*lease, &failed), "");
  EXPECT_FALSE(failed);
  for (int step = 1; step <= 4; ++step) {
    ASSERT_TRUE(host->TrainStep(*lease, batch_).ok());
  }
  // ckpt-4 holds the step already.
  EXPECT_EQ(host->CheckpointStoppedTraining(*lease, &failed), "");
  ASSERT_TRUE(host->TrainStep(*lease, batch_).ok());
  EXPECT_EQ(host->CheckpointStoppedTraining(*lease, &failed),
            (root_ / "ckpt-5").string());
  EXPECT_FALSE(failed);
  EXPECT_EQ(host->CheckpointStoppedTraining(*lease, &failed), "");
  ASSERT_TRUE(host->TrainStep(*lease, batch_).ok());
  host->StopTraining();
  EXPECT_EQ(host->CheckpointStoppedTraining(*lease, &failed), "");
  std::vector<std::string> names;
  for (const model::CheckpointEntry& e : model::ListCheckpoints(root_)) {
    EXPECT_TRUE(e.manifest.ok()) << e.dir;
    names.push_back(e.name);
  }
  EXPECT_EQ(names, (std::vector<std::string>{"ckpt-5", "ckpt-4"}));

  // Without periodic checkpoints it saves nothing.
  o.checkpoint_every_steps = 0;
  auto [plain, plain_lease] = NewTraining(o);
  ASSERT_NE(plain, nullptr);
  ASSERT_TRUE(plain->TrainStep(*plain_lease, batch_).ok());
  EXPECT_EQ(plain->CheckpointStoppedTraining(*plain_lease, &failed), "");
}

TEST_F(ModelHostPeriodicTest, SavesByStepsAndByTimeAndKeepsTheNewest) {
  server::ModelHostOptions o = SavingEvery(3);
  o.keep_checkpoints = 2;
  {
    auto [host, lease] = NewTraining(o);
    ASSERT_NE(host, nullptr);
    for (int step = 1; step <= 10; ++step) {
      auto r = host->TrainStep(*lease, batch_);
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_EQ(r->checkpoint.empty(), step % 3 != 0) << step;
    }
  }
  std::vector<model::CheckpointEntry> list = model::ListCheckpoints(root_);
  ASSERT_EQ(list.size(), 2u);
  EXPECT_EQ(list[0].name, "ckpt-9");
  EXPECT_EQ(list[1].name, "ckpt-6");

  // By time: no save until the period has passed, then on the next step.
  o.checkpoint_every_steps = 0;
  o.checkpoint_every_seconds = 0.3;
  o.keep_checkpoints = 0;
  auto [host, lease] = NewTraining(o);
  ASSERT_NE(host, nullptr);
  auto r = host->TrainStep(*lease, batch_);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->checkpoint.empty());
  std::this_thread::sleep_for(std::chrono::milliseconds(350));
  r = host->TrainStep(*lease, batch_);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->checkpoint, (root_ / "ckpt-2").string());
  r = host->TrainStep(*lease, batch_);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->checkpoint.empty());
  EXPECT_EQ(model::ListCheckpoints(root_).size(), 3u);  // 0 keeps all
  fs::remove_all(root_);

  server::ModelHostOptions bad;
  bad.checkpoint_every_steps = 5;
  EXPECT_EQ(bad.Validate().code(), absl::StatusCode::kInvalidArgument);
  bad.checkpoint_dir = root_.string();
  EXPECT_TRUE(bad.Validate().ok());
  bad.inference_only = true;
  EXPECT_EQ(bad.Validate().code(), absl::StatusCode::kInvalidArgument);
  bad.inference_only = false;
  bad.keep_checkpoints = -1;
  EXPECT_EQ(bad.Validate().code(), absl::StatusCode::kInvalidArgument);
}

// A periodic checkpoint that cannot be written (its directory is a file)
// leaves training going and is counted on /metrics, next to the saved ones.
TEST_F(ModelHostPeriodicTest, FailedSavesAreCountedAndTrainingGoesOn) {
  std::ofstream(root_) << "not a directory";
  server::ModelHostOptions o = SavingEvery(2);
  auto [host, lease] = NewTraining(o);
  ASSERT_NE(host, nullptr);
  server::ServerMetrics metrics;
  for (int step = 1; step <= 4; ++step) {
    auto r = host->TrainStep(*lease, batch_);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_TRUE(r->checkpoint.empty());
    EXPECT_EQ(r->checkpoint_failed, step % 2 == 0) << step;
    metrics.RecordTrainStep(*r);
  }
  EXPECT_EQ(host->steps(), 4);
  const std::string text = metrics.Render(4);
  EXPECT_HAS_SUBSTR(text, "dlrm_checkpoints_failed_total 2\n") << text;
  EXPECT_HAS_SUBSTR(text, "dlrm_checkpoints_saved_total 0\n");
  EXPECT_NO_SUBSTR(text, "dlrm_checkpoint_last_step");

  // Once the directory can be made, saves resume and are counted.
  fs::remove(root_);
  auto r = host->TrainStep(*lease, batch_);
  ASSERT_TRUE(r.ok());
  r = host->TrainStep(*lease, batch_);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->checkpoint, (root_ / "ckpt-6").string());
  metrics.RecordTrainStep(*r);
  const std::string after = metrics.Render(6);
  EXPECT_HAS_SUBSTR(after, "dlrm_checkpoints_saved_total 1\n") << after;
  EXPECT_HAS_SUBSTR(after, "dlrm_checkpoint_last_step 6\n");
}

}  // namespace
}  // namespace dlrm
