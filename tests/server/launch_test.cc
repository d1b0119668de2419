// Multi-rank serving end to end: real dlrm_server rank processes on
// loopback, driven through the C++ client library, checked against the
// single-process Model fed the same batches (docs/hybrid.md tolerance),
// plus dataset jobs whose ranks read their own shares, checkpoints,
// deploy/launch_local.sh and a follower that dies; and ranks on "hosts" of
// their own (network namespaces) across an emulated link with delay, loss
// and a partition.
#include <arpa/inet.h>
#include <errno.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "clients/client.h"
#include "core/config.h"
#include "core/status.h"
#include "data/criteo.h"
#include "data/rotating_source.h"
#include "data/source.h"
#include "data/synthetic.h"
#include "data/wire.h"
#include "dlrm/service.grpc.pb.h"
#include "google/protobuf/text_format.h"
#include "model/checkpoint.h"
#include "model/model.h"
#include "model/weights_export.h"
#include "tests/server/npy_files.h"
#include "tests/server/server_binary.h"
#include "tests/support/expect.h"
#include "tests/support/files.h"
#include "tests/support/process.h"
#include "tests/support/test_certs.h"

namespace dlrm {
namespace {

using test::ReadFile;

using test::FreePort;

namespace fs = std::filesystem;

// Every sharding kind at once (pinned), with optimizers that keep state.
constexpr char kConfig[] = R"pb(
  num_dense_features: 4
  embedding_dim: 8
  tables { name: "t0" rows: 50 sharding: SHARDING_TABLE_WISE }
  tables {
    name: "t1"
    rows: 30
    multi_hot_size: 3
    pooling: POOLING_MEAN
    sharding: SHARDING_ROW_WISE
  }
  tables {
    name: "t2"
    rows: 100
    multi_hot_size: 2
    sharding: SHARDING_COLUMN_WISE
  }
  tables { name: "t3" rows: 10 sharding: SHARDING_DATA_PARALLEL }
  bottom_mlp: [ 8, 8 ]
  top_mlp: [ 8, 1 ]
  interaction: INTERACTION_DOT
  dense_optimizer { type: ADAM learning_rate: 0.01 }
  sparse_optimizer { type: ADAM learning_rate: 0.01 }
  seed: 7
)pb";

// Global batches of 37 samples: not divisible by 2 or 3.
constexpr int64_t kBatch = 37;
constexpr int64_t kSteps = 4;

fs::path BuildDir() { return test::BuildDir(); }

std::string ServerPath() { return test::ServerBinary(); }

fs::path SourceDir() { return DLRM_SOURCE_DIR; }

// One spawned process with stdout in a pipe and stderr in a file.
using Proc = test::Child;

// `env`: extra NAME=VALUE entries on top of this process's environment.
Proc Spawn(const std::vector<std::string>& args, const fs::path& err,
           const std::vector<std::string>& env = {}) {
  return test::SpawnPiped(args, err.string(), env);
}

using test::WaitExit;
using test::WaitForWord;

// Reads `fd` until a "dlrm_server: listening on ADDR" line; "" on timeout.
std::string WaitListening(int fd, double seconds) {
  return WaitForWord(fd, "dlrm_server: listening on ", seconds);
}

// `name` found in PATH or the sbin directories (daemons live there); "" if
// absent.
std::string FindProgram(const std::string& name) {
  std::string path = std::getenv("PATH") != nullptr ? std::getenv("PATH") : "";
  path += ":/usr/sbin:/sbin:/usr/local/sbin";
  std::stringstream dirs(path);
  for (std::string dir; std::getline(dirs, dir, ':');) {
    const fs::path candidate = fs::path(dir) / name;
    if (!dir.empty() && access(candidate.c_str(), X_OK) == 0) {
      return candidate.string();
    }
  }
  return "";
}

std::string HostName() {
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  return host;
}

// A Slurm cluster of this one host on loopback, for a test: munged,
// slurmctld and slurmd from a config written under `dir`, stopped when
// this object goes.
class LocalSlurm {
 public:
  LocalSlurm() = default;
  LocalSlurm(const LocalSlurm&) = delete;
  LocalSlurm& operator=(const LocalSlurm&) = delete;
  ~LocalSlurm() { Stop(); }

  // "" once the cluster's node is idle; else why it cannot run here (the
  // test's skip message).
  std::string Start(const fs::path& dir) {
    if (geteuid() != 0) {
      return "a local Slurm cluster needs root here (slurmd runs the job "
             "steps as the submitting user, which it must be able to become)";
    }
    for (const char* p : {"munged", "slurmctld", "slurmd", "srun", "sinfo"}) {
      if (FindProgram(p).empty()) {
        return std::string(p) +
               " is not installed (scripts/install-deps.sh installs "
               "slurm-wlm and munge)";
      }
    }
    dir_ = dir;
    fs::create_directories(dir / "state");
    fs::create_directories(dir / "spool");
    {
      std::ofstream key(dir / "munge.key", std::ios::binary);
      std::random_device random;
      for (int i = 0; i < 1024; ++i) key.put(static_cast<char>(random()));
    }
    fs::permissions(dir / "munge.key",
                    fs::perms::owner_read | fs::perms::owner_write);
    const std::string d = dir.string();
    if (const std::string e = Run(
            {FindProgram("munged"), "--force", "--key-file=" + d + "/munge.key",
             "--socket=" + d + "/munge.sock", "--pid-file=" + d + "/munged.pid",
             "--log-file=" + d + "/munged.log",
             "--seed-file=" + d + "/munged.seed"});
        !e.empty()) {
      return "munged would not start: " + e;
    }
    char host[256] = {};
    gethostname(host, sizeof(host) - 1);
    std::string node(host);
    node = node.substr(0, node.find('.'));
    std::ofstream(dir / "slurm.conf")
        << "ClusterName=dlrmtest\n"
        << "SlurmctldHost=" << node << "(127.0.0.1)\n"
        << "SlurmctldPort=" << FreePort() << "\n"
        << "SlurmdPort=" << FreePort() << "\n"
        << "SlurmUser=root\nSlurmdUser=root\n"
        << "AuthType=auth/munge\nCredType=cred/munge\n"
        << "AuthInfo=socket=" << d << "/munge.sock\n"
        << "StateSaveLocation=" << d << "/state\n"
        << "SlurmdSpoolDir=" << d << "/spool\n"
        << "SlurmctldPidFile=" << d << "/slurmctld.pid\n"
        << "SlurmdPidFile=" << d << "/slurmd.pid\n"
        << "SlurmctldLogFile=" << d << "/slurmctld.log\n"
        << "SlurmdLogFile=" << d << "/slurmd.log\n"
        << "ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\n"
        << "SelectType=select/cons_tres\nSelectTypeParameters=CR_Core\n"
        << "MpiDefault=none\nReturnToService=2\n"
        << "JobAcctGatherType=jobacct_gather/none\n"
        << "AccountingStorageType=accounting_storage/none\n"
        << "NodeName=" << node << " NodeAddr=127.0.0.1 CPUs=2 State=UNKNOWN\n"
        << "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE "
           "State=UP OverSubscribe=FORCE\n";
    for (const char* daemon : {"slurmctld", "slurmd"}) {
      if (const std::string e = Run({FindProgram(daemon), "-f", conf()});
          !e.empty()) {
        return std::string(daemon) + " would not start: " + e + "\n" +
               ReadFile(dir / (std::string(daemon) + ".log"));
      }
    }
    // Up once sinfo sees the node idle.
    for (int i = 0; i < 100; ++i) {
      const std::string state = Output(FindProgram("sinfo") + " -h -o %T");
      if (state.find("idle") != std::string::npos) return "";
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    return "the Slurm node never became idle; slurmd log:\n" +
           ReadFile(dir / "slurmd.log");
  }

  std::string conf() const { return (dir_ / "slurm.conf").string(); }

  // Stops the daemons (before their directory goes).
  void Stop() {
    if (dir_.empty()) return;
    for (const char* pid_file : {"slurmd.pid", "slurmctld.pid", "munged.pid"}) {
      std::ifstream in(dir_ / pid_file);
      pid_t pid = 0;
      if (!(in >> pid) || pid <= 0) continue;
      kill(pid, SIGTERM);
      for (int i = 0; i < 100 && kill(pid, 0) == 0; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
      if (kill(pid, 0) == 0) kill(pid, SIGKILL);
    }
    dir_.clear();
  }

 private:
  // Runs `args` (a daemon that forks into the background) to its exit; ""
  // when it exits 0, else its exit status.
  static std::string Run(const std::vector<std::string>& args) {
    const pid_t pid = test::Spawn(args).pid;
    if (pid == -1) return "cannot spawn " + args[0];
    int status = 0;
    waitpid(pid, &status, 0);
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return "";
    return args[0] + " exited with status " + std::to_string(status);
  }
  std::string Output(const std::string& command) const {
    const std::string full = "SLURM_CONF=" + conf() + " " + command + " 2>&1";
    FILE* pipe = popen(full.c_str(), "r");
    if (pipe == nullptr) return "";
    std::string out;
    char buffer[256];
    while (fgets(buffer, sizeof(buffer), pipe) != nullptr) out += buffer;
    pclose(pipe);
    return out;
  }

  fs::path dir_;
};

class LaunchTest : public test::ServerBinaryTest {
 protected:
  void SetUp() override {
    ServerBinaryTest::SetUp();
    if (IsSkipped()) return;
    config_path_ = dir_ / "model.textproto";
    std::ofstream(config_path_) << kConfig;
    absl::StatusOr<ModelConfig> config = LoadModelConfig(config_path_);
    ASSERT_TRUE(config.ok()) << config.status();
    config_ = *config;
  }

  void TearDown() override {
    slurm_.Stop();
    for (Proc& p : ranks_) {
      if (p.pid > 0) {
        kill(p.pid, SIGKILL);
        waitpid(p.pid, nullptr, 0);
      }
      if (p.out_fd >= 0) close(p.out_fd);
    }
    ServerBinaryTest::TearDown();
  }

  // The model config file every rank starts from (--config).
  void WriteConfig(const ModelConfig& config) {
    std::string text;
    ASSERT_TRUE(google::protobuf::TextFormat::PrintToString(config, &text));
    std::ofstream(config_path_) << text;
  }

  // Tables [first, last) of config_ on RocksDB under dir_/rocksdb behind
  // caches of 60 rows: config_ normalised, and written (WriteConfig).
  void PutTablesOnRocksDb(int first, int last) {
    ModelConfig c = config_;
    for (int k = first; k < last; ++k) {
      c.mutable_tables(k)->set_storage(STORAGE_ROCKSDB);
    }
    c.mutable_rocksdb()->set_path((dir_ / "rocksdb").string());
    c.mutable_rocksdb()->set_cache_rows(60);
    absl::StatusOr<ModelConfig> normal = NormalizeModelConfig(c);
    ASSERT_TRUE(normal.ok()) << normal.status();
    config_ = *normal;
    WriteConfig(config_);
  }

  // The /metrics text of `client`'s server; each of `series` must be in it.
  static std::string MetricsWith(clients::Client& client,
                                 const std::vector<std::string>& series) {
    auto metrics = client.GetMetrics();
    EXPECT_TRUE(metrics.ok()) << metrics.status();
    if (!metrics.ok()) return "";
    for (const std::string& s : series) {
      EXPECT_HAS_SUBSTR(*metrics, s) << s << " in\n" << *metrics;
    }
    return *metrics;
  }

  // Starts `request` on `client` and waits for the job to end (polling
  // every 0.05 s, 60 s at most): its last status, or a call's error.
  static absl::StatusOr<JobStatus> RunJobToEnd(clients::Client& client,
                                               const JobRequest& request) {
    ASSIGN_OR_RETURN(const JobStatus started, client.StartJob(request));
    clients::WaitOptions wait;
    wait.poll_interval_seconds = 0.05;
    wait.timeout_seconds = 60;
    return client.WaitJob(started.id(), wait, nullptr);
  }

  // --checkpoint-dir `ckpt` and a checkpoint every two steps.
  static std::vector<std::string> CheckpointEveryTwoSteps(
      const std::filesystem::path& ckpt) {
    return {"--checkpoint-dir", ckpt.string(), "--checkpoint-every-steps", "2"};
  }

  // Starts `world` ranks; returns rank 0's address ("" on failure). Each
  // rank learns its rank, the world size and the coordinator from flags,
  // or with `launcher` ("slurm", "mpi", "torchrun") only from the
  // variables that launcher sets (comm/launcher_env.h).
  std::string StartRanks(int world, std::vector<std::string> extra = {},
                         const std::string& launcher = "") {
    SpawnRanks(world, std::move(extra), launcher);
    const std::string address = WaitListening(ranks_[0].out_fd, 30);
    EXPECT_FALSE(address.empty()) << "rank 0 did not listen; log:\n"
                                  << ReadFile(dir_ / "rank-0.log");
    return address;
  }

  // StartRanks(world, extra), then a client of rank 0; null after a failed
  // expectation.
  std::unique_ptr<clients::Client> StartAndConnect(
      int world, std::vector<std::string> extra = {}) {
    const std::string address = StartRanks(world, std::move(extra));
    if (address.empty()) return nullptr;
    auto client = clients::Client::Connect(address);
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? *std::move(client) : nullptr;
  }

  // Starts the ranks as StartRanks does, without waiting for them; rank r
  // logs to dir_/rank-r.log.
  void SpawnRanks(int world, std::vector<std::string> extra = {},
                  const std::string& launcher = "") {
    ranks_.clear();
    const int port = coordinator_port_ > 0 ? coordinator_port_ : FreePort();
    const std::string coordinator = "127.0.0.1:" + std::to_string(port);
    for (int r = 0; r < world; ++r) {
      std::vector<std::string> args = test::WithLocalServerFlags(
          {ServerPath(), "--config", config_path_.string(),
           "--predict-max-wait-us", "0"});
      const std::string rank = std::to_string(r), size = std::to_string(world);
      std::vector<std::string> env;
      if (launcher == "slurm") {
        env = {"SLURM_PROCID=" + rank,
               "SLURM_NTASKS=" + size,
               "SLURM_LOCALID=" + rank,
               "SLURM_NNODES=1",
               "SLURM_JOB_NODELIST=localhost",
               "SLURM_JOB_ID=4242",
               "MASTER_PORT=" + std::to_string(port)};
      } else if (launcher == "mpi") {
        env = {"OMPI_COMM_WORLD_RANK=" + rank, "OMPI_COMM_WORLD_SIZE=" + size,
               "OMPI_COMM_WORLD_LOCAL_RANK=" + rank,
               "OMPI_COMM_WORLD_LOCAL_SIZE=" + size,
               "MASTER_PORT=" + std::to_string(port)};
      } else if (launcher == "torchrun") {
        env = {"RANK=" + rank,          "WORLD_SIZE=" + size,
               "LOCAL_RANK=" + rank,    "LOCAL_WORLD_SIZE=" + size,
               "MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + std::to_string(port)};
      } else if (launcher == "mpirun" || launcher == "srun") {
        // One launcher process starts every rank; its stdout is rank 0's.
        std::vector<std::string> command =
            launcher == "mpirun"
                ? std::vector<std::string>{FindProgram("mpirun"),
                                           "--allow-run-as-root",
                                           "--oversubscribe",
                                           "-np",
                                           size,
                                           "-x",
                                           "MASTER_PORT=" +
                                               std::to_string(port)}
                : std::vector<std::string>{
                      FindProgram("srun"), "-n", size, "--overcommit",
                      "--export=ALL,MASTER_PORT=" + std::to_string(port)};
        args.insert(args.begin(), command.begin(), command.end());
        args.insert(args.end(), extra.begin(), extra.end());
        if (launcher == "srun") env = {"SLURM_CONF=" + slurm_.conf()};
        ranks_.push_back(Spawn(args, dir_ / "rank-0.log", env));
        launcher_process_ = true;
        break;
      } else {
        args.insert(args.end(), {"--world-size", size, "--rank", rank,
                                 "--coordinator", coordinator});
      }
      args.insert(args.end(), extra.begin(), extra.end());
      ranks_.push_back(
          Spawn(args, dir_ / ("rank-" + std::to_string(r) + ".log"), env));
    }
  }

  // SIGTERM to rank 0; every rank must exit 0. A launcher (mpirun, srun)
  // gets the signal instead and passes it on; it must exit, with the
  // status it reports for signalled tasks.
  void StopRanks() {
    if (launcher_process_) {
      kill(ranks_[0].pid, SIGTERM);
      EXPECT_NE(WaitExit(ranks_[0].pid, 60), -2)
          << "the launcher did not exit; log:\n"
          << ReadFile(dir_ / "rank-0.log");
      ranks_[0].pid = -1;
      return;
    }
    kill(ranks_[0].pid, SIGTERM);
    for (size_t r = 0; r < ranks_.size(); ++r) {
      EXPECT_EQ(WaitExit(ranks_[r].pid, 20), 0)
          << "rank " << r << " log:\n"
          << ReadFile(dir_ / ("rank-" + std::to_string(r) + ".log"));
      ranks_[r].pid = -1;
    }
  }

  std::unique_ptr<data::BatchSource> Source(uint64_t seed, int64_t samples) {
    data::SyntheticOptions o;
    o.sample_seed = seed;
    o.num_samples = samples;
    auto source = data::MakeSyntheticSource(config_, o);
    EXPECT_TRUE(source.ok()) << source.status();
    return std::move(*source);
  }

  // Starts `world` ranks with `extra` (StartRanks) and trains kSteps
  // batches through rank 0 (Train); the ranks keep running.
  void StartAndTrain(int world, const std::vector<std::string>& extra) {
    const std::string address = StartRanks(world, extra);
    ASSERT_FALSE(address.empty());
    auto client = clients::Client::Connect(address);
    ASSERT_TRUE(client.ok()) << client.status();
    Train(**client);
  }

  // Trains kSteps batches through the client; returns the losses.
  std::vector<double> Train(clients::Client& client) {
    auto source = Source(11, kBatch * kSteps);
    clients::TrainOptions o;
    o.batch_size = kBatch;
    o.max_in_flight = 1;
    std::vector<double> losses;
    auto summary = client.Train(
        *source, o, [&](const StepResult& r) { losses.push_back(r.loss()); });
    EXPECT_TRUE(summary.ok()) << summary.status();
    return losses;
  }

  // Trains `model` (one process) on Train()'s batches, expecting `losses`
  // (docs/hybrid.md tolerance).
  void ExpectOneProcessLosses(model::Model& model,
                              const std::vector<double>& losses) {
    auto source = Source(11, kBatch * kSteps);
    data::Batch batch;
    ASSERT_EQ(losses.size(), static_cast<size_t>(kSteps));
    for (int64_t s = 0; s < kSteps; ++s) {
      ASSERT_TRUE(*source->Next(kBatch, &batch));
      auto r = model.TrainStep(batch);
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_NEAR(losses[s], r->loss, 1e-5 * std::abs(r->loss)) << "step " << s;
    }
  }

  data::Batch EvalBatch() {
    auto source = Source(23, 29);
    data::Batch batch;
    EXPECT_TRUE(source->Next(29, &batch).ok());
    return batch;
  }

  void CheckAgainstOneProcess(int world, const std::string& launcher = "") {
    const std::string address = StartRanks(world, {}, launcher);
    ASSERT_FALSE(address.empty());
    CheckServingLikeOneProcess(address, world);
  }

  // Trains and predicts through the job of `world` ranks whose rank 0
  // serves at `address`, checks the results against one process, then
  // stops the ranks.
  void CheckServingLikeOneProcess(const std::string& address, int world) {
    auto client = clients::Client::Connect(address);
    ASSERT_TRUE(client.ok()) << client.status();
    const std::vector<double> losses = Train(**client);
    const data::Batch eval = EvalBatch();
    auto probs = (*client)->Predict(eval);
    ASSERT_TRUE(probs.ok()) << probs.status();
    auto info = (*client)->GetModelInfo();
    ASSERT_TRUE(info.ok()) << info.status();
    EXPECT_EQ(info->world_size(), world);
    EXPECT_HAS_SUBSTR(info->sharding_plan(), "row-wise")
        << info->sharding_plan();
    EXPECT_EQ(info->steps(), kSteps);
    // Per-stage times and exchange bytes of the hybrid step reach /metrics.
    ASSERT_FALSE(
        MetricsWith(**client,
                    {"dlrm_train_stage_seconds{stage=\"output_dist\"}",
                     "dlrm_train_stage_seconds_total{stage=\"bwd_dist\"}",
                     "dlrm_exchange_bytes_total{exchange=\"ids\"}",
                     "dlrm_exchange_bytes_total{exchange=\"dense_allreduce\"}"})
            .empty());

    // The reference: one process, the same global batches.
    auto model = model::Model::Create(config_);
    ASSERT_TRUE(model.ok()) << model.status();
    ExpectOneProcessLosses(**model, losses);
    std::vector<float> ref;
    ASSERT_TRUE((*model)->Predict(eval, &ref).ok());
    ASSERT_EQ(probs->size(), ref.size());
    for (size_t i = 0; i < ref.size(); ++i) {
      EXPECT_NEAR((*probs)[i], ref[i], 1e-5) << "sample " << i;
    }
    StopRanks();
  }

  fs::path config_path_;
  ModelConfig config_;
  std::vector<Proc> ranks_;
  // Whether ranks_ holds one launcher process (mpirun, srun) for them all.
  bool launcher_process_ = false;
  // The cluster srun submits to (RanksStartedBySrun...).
  LocalSlurm slurm_;
  // The coordinator port StartRanks uses; 0 picks a free one.
  int coordinator_port_ = 0;
};

TEST_F(LaunchTest, TwoRanksTrainAndPredictLikeOneProcess) {
  CheckAgainstOneProcess(2);
}

TEST_F(LaunchTest, ThreeRanksTrainAndPredictLikeOneProcess) {
  CheckAgainstOneProcess(3);
}

// Predict on two ranks while a Train stream runs: every answer equals a
// one-process model's after exactly the step its model_step names (the
// ranks' predictions run beside the step, docs/server.md "Predictions
// beside training"), and the job still stops cleanly on SIGTERM.
TEST_F(LaunchTest, TwoRanksPredictBesideATrainStream) {
  const std::string address = StartRanks(2);
  ASSERT_FALSE(address.empty());
  auto client = clients::Client::Connect(address);
  ASSERT_TRUE(client.ok()) << client.status();
  const data::Batch eval = EvalBatch();
  PredictRequest request;
  data::BatchToProto(eval, /*labels=*/false, request.mutable_batch());
  auto stub = Predictor::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  std::atomic<bool> trained{false};
  std::vector<double> losses;
  std::thread training([&] {
    losses = Train(**client);
    trained.store(true);
  });
  std::vector<PredictResponse> answers;
  for (bool last = false; !last;) {
    last = trained.load();
    grpc::ClientContext context;
    PredictResponse response;
    const grpc::Status status = stub->Predict(&context, request, &response);
    ASSERT_TRUE(status.ok()) << status.error_message();
    answers.push_back(response);
  }
  training.join();

  // The reference: one process, the eval batch's probabilities after each
  // of Train()'s steps.
  auto model = model::Model::Create(config_);
  ASSERT_TRUE(model.ok()) << model.status();
  auto source = Source(11, kBatch * kSteps);
  std::vector<std::vector<float>> want(kSteps + 1);
  data::Batch batch;
  for (int64_t s = 0; s <= kSteps; ++s) {
    ASSERT_TRUE((*model)->Predict(eval, &want[s]).ok());
    if (s == kSteps) break;
    ASSERT_TRUE(*source->Next(kBatch, &batch));
    ASSERT_TRUE((*model)->TrainStep(batch).ok());
  }
  int64_t last_step = 0;
  for (size_t a = 0; a < answers.size(); ++a) {
    const PredictResponse& r = answers[a];
    ASSERT_GE(r.model_step(), last_step) << "answer " << a;
    ASSERT_LE(r.model_step(), kSteps) << "answer " << a;
    ASSERT_EQ(r.probabilities_size(), static_cast<int>(eval.size));
    for (int i = 0; i < r.probabilities_size(); ++i) {
      ASSERT_NEAR(r.probabilities(i), want[r.model_step()][i], 2e-5)
          << "answer " << a << " at step " << r.model_step() << ", sample "
          << i;
    }
    last_step = r.model_step();
  }
  EXPECT_EQ(answers.back().model_step(), kSteps);
  EXPECT_HAS_SUBSTR(ReadFile(dir_ / "rank-0.log"),
                    "predictions run beside training on 2 ranks");
  StopRanks();
}

// Ranks started by a launcher take their identity from its variables alone
// and train like one process.
TEST_F(LaunchTest, RanksFromSlurmVariablesTrainLikeOneProcess) {
  CheckAgainstOneProcess(2, "slurm");
}

TEST_F(LaunchTest, RanksFromOpenMpiVariablesTrainLikeOneProcess) {
  CheckAgainstOneProcess(2, "mpi");
}

TEST_F(LaunchTest, RanksFromTorchrunVariablesTrainLikeOneProcess) {
  CheckAgainstOneProcess(2, "torchrun");
}

// Real launchers: Open MPI's mpirun and a local Slurm cluster's srun start
// both ranks, which take everything from the launcher's variables.
TEST_F(LaunchTest, RanksStartedByMpirunTrainLikeOneProcess) {
  if (FindProgram("mpirun").empty()) {
    GTEST_SKIP() << "mpirun is not installed (scripts/install-deps.sh "
                    "installs openmpi-bin)";
  }
  CheckAgainstOneProcess(2, "mpirun");
}

TEST_F(LaunchTest, RanksStartedBySrunTrainLikeOneProcess) {
  const std::string why = slurm_.Start(dir_ / "slurm");
  if (!why.empty()) GTEST_SKIP() << why;
  CheckAgainstOneProcess(2, "srun");
}

// The control plane over mutual TLS with a join token: a process that claims
// rank 1 with another token is refused and exits 1 saying so, while the real
// ranks 0 and 1 form the job and train.
TEST_F(LaunchTest, TlsAndJoinTokenGuardTheControlPlane) {
  if (!test::MakeTestCertificates(dir_)) {
    GTEST_SKIP() << "the openssl tool could not make test certificates";
  }
  std::ofstream(dir_ / "join-token") << "job-0123456789abcdef0123456789\n";
  std::ofstream(dir_ / "wrong-token") << "job-0123456789abcdef012345678X\n";
  const auto file = [&](const char* name) { return (dir_ / name).string(); };
  const std::vector<std::string> tls = {
      "--coordinator-tls-ca",    file("ca.pem"),
      "--coordinator-tls-cert",  file("server.pem"),
      "--coordinator-tls-key",   file("server.key"),
      "--coordinator-tls-mutual"};
  coordinator_port_ = FreePort();
  // The impostor starts first and waits for rank 0's coordinator.
  std::vector<std::string> impostor_args = {
      ServerPath(),
      "--config",
      config_path_.string(),
      "--world-size",
      "2",
      "--rank",
      "1",
      "--coordinator",
      "127.0.0.1:" + std::to_string(coordinator_port_),
      "--join-token-file",
      file("wrong-token")};
  impostor_args.insert(impostor_args.end(), tls.begin(), tls.end());
  Proc impostor = Spawn(impostor_args, dir_ / "impostor.log");
  ASSERT_GT(impostor.pid, 0);
  std::vector<std::string> extra = tls;
  extra.insert(extra.end(), {"--join-token-file", file("join-token")});
  const std::string address = StartRanks(2, extra);
  const int impostor_exit = WaitExit(impostor.pid, 60);
  close(impostor.out_fd);
  const std::string impostor_log = ReadFile(dir_ / "impostor.log");
  EXPECT_EQ(impostor_exit, 1) << impostor_log;
  EXPECT_HAS_SUBSTR(impostor_log, "refused this rank's join token")
      << impostor_log;
  EXPECT_NO_SUBSTR(impostor_log, "0123456789abcdef") << impostor_log;
  ASSERT_FALSE(address.empty());
  auto client = clients::Client::Connect(address);
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_EQ(Train(**client).size(), static_cast<size_t>(kSteps));
  auto info = (*client)->GetModelInfo();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->world_size(), 2);
  EXPECT_EQ(info->steps(), kSteps);
  EXPECT_HAS_SUBSTR(ReadFile(dir_ / "rank-0.log"),
                    "mutual TLS, join token required")
      << ReadFile(dir_ / "rank-0.log");
  StopRanks();
}

// A rank whose peers never come gives up after --comm-connect-timeout-s
// with an error, instead of the default two minutes.
TEST_F(LaunchTest, ConnectTimeoutEndsARankWhosePeersNeverCome) {
  const std::string coordinator = "127.0.0.1:" + std::to_string(FreePort());
  Proc p = Spawn(
      {ServerPath(), "--config", config_path_.string(), "--listen",
       "127.0.0.1:0", "--metrics-listen", "", "--world-size", "2", "--rank",
       "1", "--coordinator", coordinator, "--comm-connect-timeout-s", "2"},
      dir_ / "rank-1.log");
  ranks_.push_back(p);
  // It exits by itself well before the default two minutes: still running
  // after 30 s (-2) fails.
  const int code = WaitExit(p.pid, 30);
  ranks_.back().pid = -1;
  EXPECT_NE(code, 0);
  EXPECT_NE(code, -2) << "still waiting after 30 s";
  const std::string log = ReadFile(dir_ / "rank-1.log");
  EXPECT_HAS_SUBSTR(log, coordinator) << log;
}

TEST_F(LaunchTest, CheckpointRestoresEveryRankBitwise) {
  const fs::path ckpt = dir_ / "ckpt";
  std::vector<float> before;
  int64_t steps = 0;
  {
    const std::string address = StartRanks(2);
    ASSERT_FALSE(address.empty());
    auto client = clients::Client::Connect(address);
    ASSERT_TRUE(client.ok()) << client.status();
    Train(**client);
    auto saved = (*client)->SaveCheckpoint(ckpt.string());
    ASSERT_TRUE(saved.ok()) << saved.status();
    EXPECT_TRUE(fs::exists(ckpt / "rank-0.safetensors"));
    EXPECT_TRUE(fs::exists(ckpt / "rank-1.safetensors"));
    EXPECT_TRUE(fs::exists(ckpt / "MANIFEST.json"));
    auto probs = (*client)->Predict(EvalBatch());
    ASSERT_TRUE(probs.ok()) << probs.status();
    before = *probs;
    // Training on changes the model; the restore below must undo it.
    Train(**client);
    auto restored = (*client)->RestoreCheckpoint(ckpt.string());
    ASSERT_TRUE(restored.ok()) << restored.status();
    auto again = (*client)->Predict(EvalBatch());
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_EQ(*again, before);
    steps = (*client)->GetModelInfo()->steps();
    StopRanks();
  }
  const std::string address = StartRanks(2, {"--restore", ckpt.string()});
  ASSERT_FALSE(address.empty());
  auto client = clients::Client::Connect(address);
  ASSERT_TRUE(client.ok()) << client.status();
  auto probs = (*client)->Predict(EvalBatch());
  ASSERT_TRUE(probs.ok()) << probs.status();
  EXPECT_EQ(*probs, before);
  EXPECT_EQ((*client)->GetModelInfo()->steps(), steps);
  // Another world size has another plan: the restore reshards, and the
  // predictions are the same up to float summation order.
  StopRanks();
  const std::string three = StartRanks(3);
  ASSERT_FALSE(three.empty());
  auto other = clients::Client::Connect(three);
  ASSERT_TRUE(other.ok());
  auto resharded = (*other)->RestoreCheckpoint(ckpt.string());
  ASSERT_TRUE(resharded.ok()) << resharded.status();
  auto on_three = (*other)->Predict(EvalBatch());
  ASSERT_TRUE(on_three.ok()) << on_three.status();
  ASSERT_EQ(on_three->size(), before.size());
  for (size_t i = 0; i < before.size(); ++i) {
    EXPECT_NEAR((*on_three)[i], before[i], 1e-6) << "sample " << i;
  }
  EXPECT_EQ((*other)->GetModelInfo()->steps(), steps);
  StopRanks();
}

// Admin.SetLearningRate on two ranks reaches every rank between two
// steps: the steps after it train as one process whose optimizers took the
// same rates at the same step (docs/hybrid.md tolerance), GetModelInfo
// shows them, and a NaN or negative rate is INVALID_ARGUMENT naming the
// field and changes nothing.
TEST_F(LaunchTest, LearningRateSetOnRankZeroReachesEveryRank) {
  const std::string address = StartRanks(2);
  ASSERT_FALSE(address.empty());
  auto client = clients::Client::Connect(address);
  ASSERT_TRUE(client.ok()) << client.status();
  const std::vector<double> first = Train(**client);
  auto nan = (*client)->SetLearningRate(std::nanf(""), std::nullopt);
  EXPECT_EQ(nan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_HAS_SUBSTR(nan.status().message(), "dense_optimizer.learning_rate")
      << nan.status();
  auto negative = (*client)->SetLearningRate(std::nullopt, -1.0f);
  EXPECT_EQ(negative.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_HAS_SUBSTR(negative.status().message(),
                    "sparse_optimizer.learning_rate")
      << negative.status();
  auto set = (*client)->SetLearningRate(0.003f, 0.05f);
  ASSERT_TRUE(set.ok()) << set.status();
  EXPECT_EQ(set->dense(), 0.003f);
  EXPECT_EQ(set->sparse(), 0.05f);
  EXPECT_EQ(set->step(), kSteps);
  auto info = (*client)->GetModelInfo();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->config().dense_optimizer().learning_rate(), 0.003f);
  EXPECT_EQ(info->config().sparse_optimizer().learning_rate(), 0.05f);
  const std::vector<double> second = Train(**client);

  auto model = model::Model::Create(config_);
  ASSERT_TRUE(model.ok()) << model.status();
  ExpectOneProcessLosses(**model, first);
  OptimizerConfig dense = config_.dense_optimizer();
  OptimizerConfig sparse = config_.sparse_optimizer();
  dense.set_learning_rate(0.003f);
  sparse.set_learning_rate(0.05f);
  ASSERT_TRUE((*model)->SetOptimizers(dense, sparse).ok());
  ExpectOneProcessLosses(**model, second);
  // The old rates would train otherwise (the check above has teeth).
  auto unchanged = model::Model::Create(config_);
  ASSERT_TRUE(unchanged.ok());
  double last = 0;
  for (int round = 0; round < 2; ++round) {
    auto source = Source(11, kBatch * kSteps);
    data::Batch batch;
    for (int64_t s = 0; s < kSteps; ++s) {
      ASSERT_TRUE(*source->Next(kBatch, &batch));
      auto r = (*unchanged)->TrainStep(batch);
      ASSERT_TRUE(r.ok());
      last = r->loss;
    }
  }
  EXPECT_GT(std::abs(last - second.back()), 1e-4 * std::abs(last));
  StopRanks();
}

// The weights export `got` holds the tensors of `model`'s export `want`
// (names, shapes, metadata) with values within docs/hybrid.md's 1e-5.
void ExpectSameWeights(const std::string& got_path,
                       const std::string& want_path, model::Model& model) {
  auto got = model::SafetensorsFile::Open(got_path);
  auto want = model::SafetensorsFile::Open(want_path);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_TRUE(want.ok()) << want.status();
  EXPECT_EQ((*got)->metadata(), (*want)->metadata());
  const std::vector<model::TensorSpec> specs =
      model::WeightSpecs(model.config());
  ASSERT_EQ((*got)->Names().size(), specs.size());
  for (const model::TensorSpec& spec : specs) {
    if (spec.dtype == model::Dtype::kI64) {  // a dynamic table's ids: exact
      auto a = (*got)->GetInt64(spec.name, spec.shape);
      auto b = (*want)->GetInt64(spec.name, spec.shape);
      ASSERT_TRUE(a.ok()) << a.status();
      ASSERT_TRUE(b.ok()) << b.status();
      EXPECT_EQ(*a, *b) << spec.name;
      continue;
    }
    auto a = (*got)->Get(spec.name, spec.shape);
    auto b = (*want)->Get(spec.name, spec.shape);
    ASSERT_TRUE(a.ok()) << a.status();
    ASSERT_TRUE(b.ok()) << b.status();
    for (size_t i = 0; i < b->size(); ++i) {
      ASSERT_NEAR((*a)[i], (*b)[i], 1e-5) << spec.name << " element " << i;
    }
  }
}

// Admin.ExportWeights on two ranks: the leader gathers every table (of
// every sharding kind) and writes the one file; it has the tensors of one
// process's export, in the same file order, with the values of one process
// trained on the same batches (docs/hybrid.md's tolerance, 1e-5).
TEST_F(LaunchTest, ExportWeightsOnTwoRanksMatchesOneProcess) {
  const fs::path ckpt = dir_ / "ckpt";
  const std::string address =
      StartRanks(2, {"--checkpoint-dir", ckpt.string()});
  ASSERT_FALSE(address.empty());
  auto client = clients::Client::Connect(address);
  ASSERT_TRUE(client.ok()) << client.status();
  const std::vector<double> losses = Train(**client);
  auto exported = (*client)->ExportWeights("weights.safetensors");
  ASSERT_TRUE(exported.ok()) << exported.status();
  const fs::path file = fs::weakly_canonical(ckpt / "weights.safetensors");
  EXPECT_EQ(exported->path(), file.string());
  EXPECT_EQ(exported->step(), kSteps);
  EXPECT_EQ(exported->bytes(), static_cast<int64_t>(fs::file_size(file)));
  // Outside --checkpoint-dir: refused, as on one rank.
  EXPECT_EQ((*client)->ExportWeights("../outside.safetensors").status().code(),
            absl::StatusCode::kInvalidArgument);
  // The job serves on after the export's collectives.
  auto probs = (*client)->Predict(EvalBatch());
  ASSERT_TRUE(probs.ok()) << probs.status();
  StopRanks();

  auto model = model::Model::Create(config_);
  ASSERT_TRUE(model.ok()) << model.status();
  ExpectOneProcessLosses(**model, losses);
  const std::string one = (dir_ / "one.safetensors").string();
  auto reference = model::ExportSafetensors(**model, one);
  ASSERT_TRUE(reference.ok()) << reference.status();
  EXPECT_EQ(exported->tensors(), reference->tensors);
  // Same header: names, shapes, offsets and metadata.
  EXPECT_EQ(exported->bytes(), reference->bytes);
  ExpectSameWeights(file.string(), one, **model);
}

// Dynamic tables on 2 and 4 ranks, t0 table-wise and t2 column-wise (2
// or 4 column blocks, each keeping the same map): the export gathers each
// row's id from the shard that holds it, and its ids are one process's.
TEST_F(LaunchTest, ExportWeightsOfDynamicTablesOnRanksMatchesOneProcess) {
  ModelConfig c = config_;
  c.mutable_tables(0)->set_dynamic(true);
  c.mutable_tables(2)->set_dynamic(true);
  absl::StatusOr<ModelConfig> normal = NormalizeModelConfig(c);
  ASSERT_TRUE(normal.ok()) << normal.status();
  config_ = *normal;
  WriteConfig(config_);
  auto model = model::Model::Create(config_);
  ASSERT_TRUE(model.ok()) << model.status();
  const std::string one = (dir_ / "one.safetensors").string();
  bool trained = false;
  for (const int world : {2, 4}) {
    SCOPED_TRACE(absl::StrCat(world, " ranks"));
    const std::string address = StartRanks(world);
    ASSERT_FALSE(address.empty());
    auto client = clients::Client::Connect(address);
    ASSERT_TRUE(client.ok()) << client.status();
    const std::vector<double> losses = Train(**client);
    const std::string exported =
        (dir_ / absl::StrCat("weights-", world, ".safetensors")).string();
    ASSERT_TRUE((*client)->ExportWeights(exported).ok());
    client->reset();
    StopRanks();
    if (!trained) {
      ExpectOneProcessLosses(**model, losses);
      ASSERT_TRUE(model::ExportSafetensors(**model, one).ok());
      trained = true;
    }
    ExpectSameWeights(exported, one, **model);
    // Both tables hold ids (so the comparison above compared some).
    auto f = model::SafetensorsFile::Open(exported);
    ASSERT_TRUE(f.ok()) << f.status();
    for (int k : {0, 2}) {
      const TableConfig& t = config_.tables(k);
      auto ids = (*f)->GetInt64(model::TableIdsName(t), {t.rows()});
      ASSERT_TRUE(ids.ok()) << ids.status();
      EXPECT_EQ(ids->back(), model::kKeptRowId) << t.name();
      EXPECT_GT(std::count_if(ids->begin(), ids->end(),
                              [](int64_t id) { return id >= 0; }),
                t.rows() / 2)
          << t.name();
    }
  }
}

// One fixed batch, once.
class OneBatch : public data::BatchSource {
 public:
  OneBatch(data::Batch batch, int num_dense)
      : batch_(std::move(batch)), num_dense_(num_dense) {}
  absl::StatusOr<bool> Next(int64_t, data::Batch* batch) override {
    if (done_) {
      batch->Reset(num_dense_, static_cast<int>(batch_.sparse.size()));
      return false;
    }
    done_ = true;
    *batch = batch_;
    return true;
  }
  absl::Status Rewind() override {
    done_ = false;
    return absl::OkStatus();
  }

 private:
  data::Batch batch_;
  int num_dense_;
  bool done_ = false;
};

// Tables t0-t2 on RocksDB behind caches of 60 rows per shard (t2's column
// blocks, 100 rows each, spill), t3 in host memory, on 2 ranks: trains like
// one process (the weights export too), checkpoints every rank's database
// and restores it, and a batch over a cache is refused on every rank with
// ResourceExhausted while the job serves on unchanged.
TEST_F(LaunchTest, TablesOnRocksDbTrainCheckpointAndRefuseOverCapacity) {
  ASSERT_NO_FATAL_FAILURE(PutTablesOnRocksDb(0, 3));

  const std::string address = StartRanks(2);
  ASSERT_FALSE(address.empty());
  auto client = clients::Client::Connect(address);
  ASSERT_TRUE(client.ok()) << client.status();
  const std::vector<double> losses = Train(**client);
  // The export reads the shards' rows through their RocksDB stores.
  const std::string exported = (dir_ / "weights.safetensors").string();
  ASSERT_TRUE((*client)->ExportWeights(exported).ok());
  // The reference: one process (its tables on RocksDB too), same batches.
  {
    auto model = model::Model::Create(config_);
    ASSERT_TRUE(model.ok()) << model.status();
    ExpectOneProcessLosses(**model, losses);
    const std::string one = (dir_ / "one.safetensors").string();
    ASSERT_TRUE(model::ExportSafetensors(**model, one).ok());
    ExpectSameWeights(exported, one, **model);
  }

  // Every rank's caches on /metrics, labelled by table and rank; the
  // tiers in model info.
  const std::string metrics = MetricsWith(
      **client, {"dlrm_embedding_cache_misses_total{table=\"t1\",rank=\"0\"}",
                 "dlrm_embedding_cache_misses_total{table=\"t1\",rank=\"1\"}",
                 "dlrm_embedding_cache_hit_ratio{table=\"t2\",rank=\"1\"}",
                 "dlrm_rocksdb_written_bytes_total{table=\"t2\",rank=\"0\"}"});
  ASSERT_FALSE(metrics.empty());
  EXPECT_NO_SUBSTR(metrics, "table=\"t3\"");
  auto info = (*client)->GetModelInfo();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_HAS_SUBSTR(info->sharding_plan(), "on rocksdb")
      << info->sharding_plan();
  // t0-t2 with Adam (96 B a row): 5000 + 3000 + 10000 rows' bytes stored.
  EXPECT_EQ(info->memory_bytes().at("rocksdb"), (50 + 30 + 100) * 96);

  // A dataset job reads a batch ahead: every rank's RocksDB shards
  // prefetch the next batch's rows (the Train stream above, one batch in
  // flight, had none queued). t2's column blocks (100 rows behind 60-row
  // caches) miss; t0 and t1's shards fit their caches whole.
  {
    JobRequest request;
    request.mutable_train()->mutable_synthetic()->set_num_samples(kBatch * 6);
    request.set_batch_size(kBatch);
    auto done = RunJobToEnd(**client, request);
    ASSERT_TRUE(done.ok()) << done.status();
    ASSERT_EQ(done->state(), JobStatus::SUCCEEDED) << done->error();
    auto after_job = (*client)->GetMetrics();
    ASSERT_TRUE(after_job.ok()) << after_job.status();
    for (const char* series :
         {"dlrm_embedding_cache_prefetch_hits_total{table=\"t2\",rank=\"0\"} ",
          "dlrm_embedding_cache_prefetch_hits_total{table=\"t2\",rank=\"1\"}"
          " "}) {
      const size_t at = after_job->find(series);
      ASSERT_NE(at, std::string::npos) << series;
      EXPECT_GT(std::stod(after_job->substr(at + std::strlen(series))), 0)
          << series;
    }
  }

  const fs::path ckpt = dir_ / "ckpt";
  auto saved = (*client)->SaveCheckpoint(ckpt.string());
  ASSERT_TRUE(saved.ok()) << saved.status();
  EXPECT_TRUE(fs::is_directory(ckpt / "rank-0.rocksdb"));
  EXPECT_TRUE(fs::is_directory(ckpt / "rank-1.rocksdb"));
  auto before = (*client)->Predict(EvalBatch());
  ASSERT_TRUE(before.ok()) << before.status();
  Train(**client);
  auto restored = (*client)->RestoreCheckpoint(ckpt.string());
  ASSERT_TRUE(restored.ok()) << restored.status();
  auto again = (*client)->Predict(EvalBatch());
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(*again, *before);

  // 100 samples whose t2 bags hold 100 different rows: over the cache of
  // each of t2's column blocks (60 rows).
  data::Batch over;
  ASSERT_TRUE(Source(31, 100)->Next(100, &over).ok());
  for (int64_t i = 0; i < over.size; ++i) {
    for (int64_t p = over.sparse[2].offsets[i];
         p < over.sparse[2].offsets[i + 1]; ++p) {
      over.sparse[2].ids[p] = i;
    }
  }
  // A prediction reads the rows beside the step (PoolReadOnly), through no
  // cache, so it takes the batch; training on it is refused.
  auto predicted = (*client)->Predict(over);
  EXPECT_TRUE(predicted.ok()) << predicted.status();
  OneBatch one(over, config_.num_dense_features());
  clients::TrainOptions o;
  o.batch_size = over.size;
  auto trained = (*client)->Train(one, o, [](const StepResult&) {});
  EXPECT_EQ(trained.status().code(), absl::StatusCode::kResourceExhausted)
      << trained.status();
  auto after = (*client)->Predict(EvalBatch());
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(*after, *before);
  StopRanks();
}

// rocksdb.host_budget_bytes on 2 ranks: per rank, t0 (50 rows), half of
// t1 (15 rows), half of t2's columns (100 rows x 4) and t3 take 4800 +
// 1440 + 4800 + 960 = 12000 B (Adam) on the rank with t0. A budget of
// 11000 B moves only the largest table, t2 (its caches: 60 rows x 4, 2880
// B, so 10080 B), and the job trains like one in-memory process.
TEST_F(LaunchTest, HostBudgetPutsTheLargestTablesOnRocksDbPerRank) {
  ModelConfig c = config_;
  c.mutable_rocksdb()->set_path((dir_ / "rocksdb").string());
  c.mutable_rocksdb()->set_host_budget_bytes(11000);
  c.mutable_rocksdb()->set_cache_rows(60);
  WriteConfig(c);
  const std::string address = StartRanks(2);
  ASSERT_FALSE(address.empty());
  auto client = clients::Client::Connect(address);
  ASSERT_TRUE(client.ok()) << client.status();
  auto info = (*client)->GetModelInfo();
  ASSERT_TRUE(info.ok()) << info.status();
  std::string tiers;
  for (const TableConfig& t : info->config().tables()) {
    tiers += t.storage() == STORAGE_ROCKSDB ? "R" : "H";
  }
  EXPECT_EQ(tiers, "HHRH") << info->sharding_plan();
  EXPECT_EQ(info->memory_bytes().at("rocksdb"), 100 * 96);
  const std::vector<double> losses = Train(**client);
  auto model = model::Model::Create(config_);
  ASSERT_TRUE(model.ok()) << model.status();
  ExpectOneProcessLosses(**model, losses);
  StopRanks();
}

TEST_F(LaunchTest, DeadFollowerFailsTrainingQuicklyAndRankZeroStaysUp) {
  const std::string address = StartRanks(2, {"--comm-timeout-s", "3"});
  ASSERT_FALSE(address.empty());
  clients::ClientOptions co;
  co.call_timeout_seconds = 30;
  auto client = clients::Client::Connect(address, co);
  ASSERT_TRUE(client.ok()) << client.status();
  Train(**client);
  kill(ranks_[1].pid, SIGKILL);
  waitpid(ranks_[1].pid, nullptr, 0);
  ranks_[1].pid = -1;

  auto source = Source(11, kBatch);
  clients::TrainOptions o;
  o.batch_size = kBatch;
  auto summary = (*client)->Train(*source, o, nullptr);
  ASSERT_FALSE(summary.ok());
  EXPECT_EQ(summary.status().code(), absl::StatusCode::kUnavailable)
      << summary.status();
  EXPECT_HAS_SUBSTR(summary.status().message(), "communicator")
      << summary.status();
  // The error names the rank that died, its host and its last heartbeat.
  EXPECT_HAS_SUBSTR(summary.status().message(),
                    "rank 1 on " + HostName() + " is silent: last heartbeat ")
      << summary.status();

  // Rank 0 still answers: model info, and clear errors for model calls.
  auto info = (*client)->GetModelInfo();
  EXPECT_TRUE(info.ok()) << info.status();
  auto metrics = (*client)->GetMetrics();
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  EXPECT_HAS_SUBSTR(*metrics, "dlrm_rank_failures_total{rank=\"1\"} 1")
      << *metrics;
  EXPECT_HAS_SUBSTR(
      *metrics,
      "dlrm_rank_heartbeat_age_seconds{rank=\"1\",host=\"" + HostName() + "\"}")
      << *metrics;
  auto probs = (*client)->Predict(EvalBatch());
  EXPECT_EQ(probs.status().code(), absl::StatusCode::kUnavailable)
      << probs.status();
  kill(ranks_[0].pid, SIGTERM);
  EXPECT_EQ(WaitExit(ranks_[0].pid, 20), 0);
  ranks_[0].pid = -1;
}

// A rank that freezes in the middle of a periodic save (the test hook
// DLRM_TEST_CHECKPOINT_FREEZE stops it with SIGSTOP): at "commit", after
// its part is written and agreed on, rank 0 commits the checkpoint and it
// is reported as what is on disk, committed (counted saved, not failed),
// and --keep-checkpoints prunes the older one; at "write", before its part
// is written, the save fails and rank 0 removes its temporary directory.
// Either way the job's error names the frozen rank, its host and its last
// heartbeat.
class FrozenRankTest : public LaunchTest,
                       public testing::WithParamInterface<const char*> {};

TEST_P(FrozenRankTest, SaveOutcomeIsWhatIsOnDiskAndTheRankIsNamed) {
  const bool committed = std::string(GetParam()) == "commit";
  const fs::path root = dir_ / "ckpt";
  // The older checkpoint (step 0) the job resumes from.
  {
    auto model = model::Model::Create(config_);
    ASSERT_TRUE(model.ok()) << model.status();
    ASSERT_TRUE(
        model::SaveCheckpoint(**model, (root / "ckpt-0").string()).ok());
  }
  setenv("DLRM_TEST_CHECKPOINT_FREEZE", absl::StrCat("1:", GetParam()).c_str(),
         1);
  const std::string address = StartRanks(
      2, {"--comm-timeout-s", "3", "--checkpoint-dir", root.string(),
          "--checkpoint-every-steps", "2", "--keep-checkpoints", "1"});
  unsetenv("DLRM_TEST_CHECKPOINT_FREEZE");
  ASSERT_FALSE(address.empty());
  clients::ClientOptions co;
  co.call_timeout_seconds = 60;
  auto client = clients::Client::Connect(address, co);
  ASSERT_TRUE(client.ok()) << client.status();
  auto source = Source(11, kBatch * kSteps);
  clients::TrainOptions o;
  o.batch_size = kBatch;
  o.max_in_flight = 1;
  int64_t trained = 0;
  auto summary = (*client)->Train(
      *source, o, [&](const StepResult& r) { trained = r.step(); });
  ASSERT_FALSE(summary.ok());
  EXPECT_EQ(summary.status().code(), absl::StatusCode::kUnavailable)
      << summary.status();
  EXPECT_HAS_SUBSTR(summary.status().message(),
                    "rank 1 on " + HostName() + " is silent: last heartbeat ")
      << summary.status();
  EXPECT_EQ(trained, 2) << summary.status();

  auto metrics = (*client)->GetMetrics();
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  const std::string log = ReadFile(dir_ / "rank-0.log");
  for (const auto& entry : fs::directory_iterator(root)) {
    EXPECT_NO_SUBSTR(entry.path().filename().string(), ".tmp-")
        << entry.path() << "\n"
        << log;
  }
  if (committed) {
    EXPECT_TRUE(fs::exists(root / "ckpt-2" / "MANIFEST.json")) << log;
    EXPECT_FALSE(fs::exists(root / "ckpt-0")) << log;
    EXPECT_HAS_SUBSTR(*metrics, "dlrm_checkpoints_saved_total 1") << *metrics;
    EXPECT_HAS_SUBSTR(*metrics, "dlrm_checkpoints_failed_total 0") << *metrics;
    EXPECT_HAS_SUBSTR(log, "is committed at step 2") << log;
    auto loaded = model::LoadCheckpoint((root / "ckpt-2").string(), false);
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    EXPECT_EQ((*loaded)->steps(), 2);
  } else {
    EXPECT_FALSE(fs::exists(root / "ckpt-2")) << log;
    EXPECT_TRUE(fs::exists(root / "ckpt-0" / "MANIFEST.json")) << log;
    EXPECT_HAS_SUBSTR(*metrics, "dlrm_checkpoints_failed_total 1") << *metrics;
  }
  EXPECT_HAS_SUBSTR(*metrics, "dlrm_rank_failures_total{rank=\"1\"} 1")
      << *metrics;
}

INSTANTIATE_TEST_SUITE_P(Points, FrozenRankTest,
                         testing::Values("commit", "write"));

// ---- Ranks on hosts of their own: network namespaces on this machine.

// Runs `command` (a shell line) to its end; "" when it exits 0, else what
// it printed and its status.
std::string Shell(const std::string& command) {
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return "cannot run " + command;
  std::string out;
  char buffer[256];
  while (fgets(buffer, sizeof(buffer), pipe) != nullptr) out += buffer;
  const int status = pclose(pipe);
  if (status == 0) return "";
  return command + ": status " + std::to_string(status) + ": " + out;
}

fs::path LinkEmulatorPath() { return BuildDir() / "tests" / "link_emulator"; }

// Each rank in a network namespace of its own (its "host"), joined to the
// others through a middle namespace where tests/tools/link_emulator
// forwards the frames, with a delay and loss when asked (the kernel here
// has no sch_netem). Rank r is 10.77.0.<r+1>/24 on its eth0; rank 0 also
// has a leg to the root namespace (10.78.<k>.2/30, this process at
// 10.78.<k>.1), where it serves the client. Everything goes in TearDown.
class CrossHostLaunchTest : public LaunchTest {
 protected:
  void SetUp() override {
    LaunchTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    if (geteuid() != 0) {
      GTEST_SKIP() << "network namespaces need root (ip netns add)";
    }
    ip_ = FindProgram("ip");
    if (ip_.empty()) GTEST_SKIP() << "the ip tool (iproute2) is not installed";
    prefix_ = "dlrmnt-" + std::to_string(getpid()) + "-";
    RemoveStaleNamespaces();
    if (const std::string e = AddNamespace(prefix_ + "m"); !e.empty()) {
      GTEST_SKIP() << "ip netns is not permitted here: " << e;
    }
  }

  void TearDown() override {
    StopEmulator();
    LaunchTest::TearDown();  // the ranks go first: they hold the namespaces
    if (!root_leg_.empty()) Shell(ip_ + " link del " + root_leg_);
    for (const std::string& ns : namespaces_) {
      const std::string e = Shell(ip_ + " netns del " + ns);
      EXPECT_TRUE(e.empty()) << e;
    }
  }

  // Namespaces of test processes that died before their TearDown.
  void RemoveStaleNamespaces() {
    for (const auto& entry : fs::directory_iterator("/run/netns", ec_)) {
      const std::string name = entry.path().filename().string();
      if (name.rfind("dlrmnt-", 0) != 0) continue;
      const pid_t owner = std::atoi(name.c_str() + 7);
      if (owner > 0 && kill(owner, 0) != 0 && errno == ESRCH) {
        Shell(ip_ + " netns del " + name);
      }
    }
  }

  std::string AddNamespace(const std::string& ns) {
    std::string e = Shell(ip_ + " netns add " + ns);
    if (!e.empty()) return e;
    namespaces_.push_back(ns);
    return Shell(ip_ + " -n " + ns + " link set lo up");
  }

  std::string Ns(int rank) const { return prefix_ + std::to_string(rank); }
  std::string Mid() const { return prefix_ + "m"; }
  static std::string Address(int rank) {
    return "10.77.0." + std::to_string(rank + 1);
  }

  // Builds the namespaces of `world` ranks and starts the link between
  // them: `delay_ms` one way, each frame lost with probability `loss`.
  void Connect(int world, double delay_ms, double loss) {
    for (int r = 0; r < world; ++r) {
      const std::string port = "port" + std::to_string(r);
      for (const std::string& e :
           {AddNamespace(Ns(r)),
            Shell(ip_ + " -n " + Mid() + " link add " + port +
                  " type veth peer name eth0 netns " + Ns(r)),
            Shell(ip_ + " -n " + Ns(r) + " addr add " + Address(r) +
                  "/24 dev eth0"),
            Shell(ip_ + " -n " + Ns(r) + " link set eth0 up"),
            Shell(ip_ + " -n " + Mid() + " link set " + port + " up")}) {
        ASSERT_TRUE(e.empty()) << e;
      }
    }
    // The root namespace's leg: its name, taken atomically, picks a subnet
    // no other test process on this machine uses.
    for (int k = getpid() % 200; root_leg_.empty() && k < getpid() % 200 + 50;
         ++k) {
      const std::string name = "dlrmnt" + std::to_string(k);
      if (!Shell(ip_ + " link add " + name + " type veth peer name client " +
                 "netns " + Ns(0))
               .empty()) {
        continue;
      }
      root_leg_ = name;
      const std::string subnet = "10.78." + std::to_string(k) + ".";
      client_address_ = subnet + "2";
      for (const std::string& e :
           {Shell(ip_ + " addr add " + subnet + "1/30 dev " + name),
            Shell(ip_ + " link set " + name + " up"),
            Shell(ip_ + " -n " + Ns(0) + " addr add " + subnet +
                  "2/30 dev client"),
            Shell(ip_ + " -n " + Ns(0) + " link set client up")}) {
        ASSERT_TRUE(e.empty()) << e;
      }
    }
    ASSERT_FALSE(root_leg_.empty()) << "no free root-namespace leg";
    ASSERT_EQ(access(LinkEmulatorPath().c_str(), X_OK), 0)
        << LinkEmulatorPath();
    std::vector<std::string> args = {ip_,
                                     "netns",
                                     "exec",
                                     Mid(),
                                     LinkEmulatorPath().string(),
                                     "--delay-ms",
                                     std::to_string(delay_ms),
                                     "--loss",
                                     std::to_string(loss),
                                     "--seed",
                                     "1"};
    for (int r = 0; r < world; ++r) args.push_back("port" + std::to_string(r));
    emulator_ = Spawn(args, dir_ / "link_emulator.log");
    ASSERT_FALSE(
        WaitForWord(emulator_.out_fd, "link_emulator: forwarding ", 10).empty())
        << ReadFile(dir_ / "link_emulator.log");
  }

  // Stops the link; the frames it forwarded and dropped (-1, -1 when it
  // did not say).
  std::pair<int64_t, int64_t> StopEmulator() {
    if (emulator_.pid <= 0) return {-1, -1};
    kill(emulator_.pid, SIGTERM);
    EXPECT_NE(WaitExit(emulator_.pid, 5), -2) << "the link emulator hung";
    emulator_.pid = -1;
    close(emulator_.out_fd);
    const std::string log = ReadFile(dir_ / "link_emulator.log");
    long long forwarded = -1, dropped = -1;
    const size_t at = log.find("stopped, ");
    if (at == std::string::npos ||
        std::sscanf(log.c_str() + at, "stopped, %lld frames forwarded, %lld",
                    &forwarded, &dropped) != 2) {
      ADD_FAILURE() << "link emulator log:\n" << log;
    }
    return {forwarded, dropped};
  }

  // Cuts (or mends) rank `rank`'s cable: its port in the middle goes down.
  void SetLink(int rank, bool up) {
    const std::string e = Shell(ip_ + " -n " + Mid() + " link set port" +
                                std::to_string(rank) + (up ? " up" : " down"));
    ASSERT_TRUE(e.empty()) << e;
  }

  // StartRanks across the namespaces: rank r runs in Ns(r), binds its
  // collectives to Address(r); rank 0 hosts the coordinator there and
  // serves the client on its root leg. Returns rank 0's address.
  std::string StartRanksAcrossHosts(int world,
                                    const std::vector<std::string>& extra) {
    ranks_.clear();
    // A fresh coordinator port per start: the last one may be in TIME_WAIT.
    const std::string coordinator =
        Address(0) + ":" + std::to_string(29500 + starts_++);
    for (int r = 0; r < world; ++r) {
      std::vector<std::string> args = {
          ip_,
          "netns",
          "exec",
          Ns(r),
          ServerPath(),
          "--config",
          config_path_.string(),
          "--listen",
          (r == 0 ? client_address_ : Address(r)) + ":0",
          "--metrics-listen",
          "",
          "--threads",
          "1",
          "--predict-max-wait-us",
          "0",
          "--world-size",
          std::to_string(world),
          "--rank",
          std::to_string(r),
          "--coordinator",
          coordinator,
          "--comm-bind-address",
          Address(r)};
      args.insert(args.end(), extra.begin(), extra.end());
      // ip netns exec execs the server: the pid is the rank's.
      ranks_.push_back(
          Spawn(args, dir_ / ("rank-" + std::to_string(r) + ".log")));
    }
    const std::string address = WaitListening(ranks_[0].out_fd, 60);
    EXPECT_FALSE(address.empty()) << "rank 0 did not listen; log:\n"
                                  << ReadFile(dir_ / "rank-0.log");
    return address;
  }

  // Connect(world, delay_ms, loss), the ranks started across the hosts,
  // then CheckServingLikeOneProcess: rank 0's address, "" after a failed
  // expectation that it did not listen.
  std::string ServeAcrossHosts(int world, double delay_ms, double loss) {
    Connect(world, delay_ms, loss);
    if (HasFatalFailure()) return "";
    const std::string address = StartRanksAcrossHosts(world, {});
    EXPECT_FALSE(address.empty());
    if (!address.empty()) CheckServingLikeOneProcess(address, world);
    return address;
  }

  std::string ip_, prefix_, root_leg_, client_address_;
  std::vector<std::string> namespaces_;
  Proc emulator_;
  int starts_ = 0;
  std::error_code ec_;
};

TEST_F(CrossHostLaunchTest, TwoHostsTrainAndPredictLikeOneProcess) {
  const std::string address = ServeAcrossHosts(2, 0, 0);
  EXPECT_EQ(address.rfind(client_address_, 0), 0u) << address;
  // The ranks' traffic went through the link.
  const auto [forwarded, dropped] = StopEmulator();
  EXPECT_GT(forwarded, 100);
  EXPECT_EQ(dropped, 0);
}

TEST_F(CrossHostLaunchTest, ThreeHostsTrainAndPredictLikeOneProcess) {
  ServeAcrossHosts(3, 0, 0);
}

// 5 ms each way (10 ms round trip): slower steps, the same arithmetic.
TEST_F(CrossHostLaunchTest, FiveMillisecondLinkTrainsLikeOneProcess) {
  ServeAcrossHosts(2, 5, 0);
}

// 1% of frames lost: TCP retransmits under Gloo, and nothing else changes.
TEST_F(CrossHostLaunchTest, LossyLinkTrainsLikeOneProcess) {
  if (ServeAcrossHosts(2, 0.2, 0.01).empty()) return;
  EXPECT_GT(StopEmulator().second, 0);
}

// A partition mid-job: rank 1's cable is cut after step 3. Within the
// communicator timeout (3 s here) the step fails with Unavailable, rank 1
// exits with an error and rank 0 keeps answering. Restarted with the cable
// mended, the job resumes from its last committed checkpoint (one per step)
// and trains on.
TEST_F(CrossHostLaunchTest, PartitionStopsEveryRankAndTheJobResumes) {
  Connect(2, 0, 0);
  const fs::path ckpt = dir_ / "ckpt";
  const std::vector<std::string> flags = {
      "--comm-timeout-s",         "3", "--checkpoint-dir", ckpt.string(),
      "--checkpoint-every-steps", "1"};
  int64_t committed = 0;
  {
    const std::string address = StartRanksAcrossHosts(2, flags);
    ASSERT_FALSE(address.empty());
    clients::ClientOptions co;
    co.call_timeout_seconds = 60;
    auto client = clients::Client::Connect(address, co);
    ASSERT_TRUE(client.ok()) << client.status();
    auto source = Source(11, kBatch * 50);
    clients::TrainOptions o;
    o.batch_size = kBatch;
    o.max_in_flight = 1;
    int64_t steps = 0;
    auto summary = (*client)->Train(*source, o, [&](const StepResult&) {
      if (++steps == 3) SetLink(1, false);
    });
    ASSERT_GE(steps, 3);
    ASSERT_FALSE(summary.ok());
    EXPECT_EQ(summary.status().code(), absl::StatusCode::kUnavailable)
        << summary.status();
    EXPECT_HAS_SUBSTR(summary.status().message(), "communicator")
        << summary.status();
    // Rank 1 gives up on its own (its communicator timeout is 3 s; the
    // deadline is generous for a loaded 2-core machine), with the reason in
    // its log.
    const int exit1 = WaitExit(ranks_[1].pid, 60);
    ranks_[1].pid = -1;
    const std::string log1 = ReadFile(dir_ / "rank-1.log");
    EXPECT_NE(exit1, -2) << "rank 1 did not stop; log:\n" << log1;
    EXPECT_NE(exit1, 0) << log1;
    // Rank 0 answers, and model calls fail clearly.
    auto info = (*client)->GetModelInfo();
    EXPECT_TRUE(info.ok()) << info.status();
    auto probs = (*client)->Predict(EvalBatch());
    EXPECT_EQ(probs.status().code(), absl::StatusCode::kUnavailable)
        << probs.status();
    kill(ranks_[0].pid, SIGTERM);
    EXPECT_EQ(WaitExit(ranks_[0].pid, 20), 0) << ReadFile(dir_ / "rank-0.log");
    ranks_[0].pid = -1;
    for (const model::CheckpointEntry& e :
         model::ListCheckpoints(ckpt.string())) {
      if (e.manifest.ok()) committed = std::max(committed, e.manifest->step);
    }
    // Every step the client saw answered was checkpointed first, except
    // that a step whose exchanges finished just before the cut loses its
    // periodic save to the partition: a failed save does not fail the step
    // (docs/checkpoints.md), and rank 0 logs it.
    const std::string log0 = ReadFile(dir_ / "rank-0.log");
    if (committed < steps) {
      EXPECT_EQ(committed, steps - 1) << "client saw " << steps << " steps";
      EXPECT_HAS_SUBSTR(
          log0, absl::StrCat("periodic checkpoint at step ", steps, " failed"))
          << log0;
    }
  }
  SetLink(1, true);
  const std::string address = StartRanksAcrossHosts(2, flags);
  ASSERT_FALSE(address.empty());
  auto client = clients::Client::Connect(address);
  ASSERT_TRUE(client.ok()) << client.status();
  auto info = (*client)->GetModelInfo();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_GE(info->steps(), committed);
  EXPECT_EQ(Train(**client).size(), static_cast<size_t>(kSteps));
  EXPECT_EQ((*client)->GetModelInfo()->steps(), info->steps() + kSteps);
  StopRanks();
}

TEST_F(LaunchTest, LaunchLocalStartsServesAndStopsEveryRank) {
  const std::string script =
      (SourceDir() / "deploy" / "launch_local.sh").string();
  ASSERT_EQ(access(script.c_str(), X_OK), 0) << script;
  setenv("DLRM_SERVER", ServerPath().c_str(), 1);
  setenv("DLRM_LOG_DIR", (dir_ / "logs").c_str(), 1);
  ranks_.push_back(
      Spawn(test::WithLocalServerFlags(
                {"/bin/bash", script, "2", "--config", config_path_.string()}),
            dir_ / "launch.err"));
  const std::string address = WaitListening(ranks_[0].out_fd, 30);
  ASSERT_FALSE(address.empty()) << ReadFile(dir_ / "launch.err");
  auto client = clients::Client::Connect(address);
  ASSERT_TRUE(client.ok()) << client.status();
  auto probs = (*client)->Predict(EvalBatch());
  ASSERT_TRUE(probs.ok()) << probs.status();
  EXPECT_EQ(probs->size(), 29u);

  kill(ranks_[0].pid, SIGINT);
  EXPECT_EQ(WaitExit(ranks_[0].pid, 30), 0) << ReadFile(dir_ / "launch.err");
  ranks_[0].pid = -1;
  EXPECT_HAS_SUBSTR(ReadFile(dir_ / "logs" / "rank-1.log"),
                    "rank 0 shut the job down");
  EXPECT_HAS_SUBSTR(ReadFile(dir_ / "logs" / "rank-0.log"), "server stopped");
}

// A damaged rank file in the newest multi-rank checkpoint: the rank that
// owns it finds the bad checksum, all ranks agree to skip it, and the job
// resumes from the one before.
TEST_F(LaunchTest, ResumeSkipsAMultiRankCheckpointWithADamagedRankFile) {
  const fs::path ckpt = dir_ / "ckpt";
  const std::vector<std::string> flags = CheckpointEveryTwoSteps(ckpt);
  {
    StartAndTrain(2, flags);
    if (HasFatalFailure()) return;
    for (Proc& p : ranks_) {  // the checkpoints are committed: kill -9
      kill(p.pid, SIGKILL);
      waitpid(p.pid, nullptr, 0);
      p.pid = -1;
      close(p.out_fd);
      p.out_fd = -1;
    }
  }
  const fs::path damaged = ckpt / "ckpt-4" / "rank-1.safetensors";
  ASSERT_TRUE(fs::exists(damaged));
  {
    std::fstream f(damaged, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(fs::file_size(damaged) - 8));
    f.put('\x7f');
  }
  auto client = StartAndConnect(2, flags);
  ASSERT_NE(client, nullptr);
  EXPECT_EQ(client->GetModelInfo()->steps(), 2);
  const std::string rank0 = ReadFile(dir_ / "rank-0.log");
  EXPECT_HAS_SUBSTR(rank0, "skipping checkpoint " + (ckpt / "ckpt-4").string())
      << rank0;
  EXPECT_HAS_SUBSTR(
      rank0, "resuming from " + (ckpt / "ckpt-2").string() + " at step 2")
      << rank0;
  const std::string rank1 = ReadFile(dir_ / "rank-1.log");
  EXPECT_HAS_SUBSTR(rank1, damaged.string() + " is corrupt") << rank1;
  StopRanks();
}

// Checkpoints none of which has a readable manifest: a job of several
// ranks refuses to start, as one process does, rather than train from
// scratch and later prune them; --no-resume starts afresh.
TEST_F(LaunchTest, ResumeRefusesWhenNoMultiRankCheckpointLoads) {
  const fs::path ckpt = dir_ / "ckpt";
  const std::vector<std::string> flags = CheckpointEveryTwoSteps(ckpt);
  StartAndTrain(2, flags);
  if (HasFatalFailure()) return;
  StopRanks();
  int damaged = 0;
  for (const fs::directory_entry& e : fs::directory_iterator(ckpt)) {
    const fs::path manifest = e.path() / "MANIFEST.json";
    if (!fs::exists(manifest)) continue;
    fs::resize_file(manifest, 10);
    ++damaged;
  }
  ASSERT_GT(damaged, 0);
  for (Proc& p : ranks_) close(p.out_fd);  // the stopped job's
  std::vector<std::string> refused = flags;
  refused.insert(refused.end(), {"--comm-timeout-s", "10"});
  SpawnRanks(2, refused);
  EXPECT_EQ(WaitExit(ranks_[0].pid, 60), 1) << ReadFile(dir_ / "rank-0.log");
  ranks_[0].pid = -1;
  EXPECT_NE(WaitExit(ranks_[1].pid, 60), 0);
  ranks_[1].pid = -1;
  const std::string rank0 = ReadFile(dir_ / "rank-0.log");
  EXPECT_HAS_SUBSTR(rank0,
                    "no checkpoint in " + ckpt.string() + " could be loaded")
      << rank0;
  EXPECT_NO_SUBSTR(rank0, "starting afresh") << rank0;
  for (Proc& p : ranks_) close(p.out_fd);
  std::vector<std::string> fresh = flags;
  fresh.push_back("--no-resume");
  auto client = StartAndConnect(2, fresh);
  ASSERT_NE(client, nullptr);
  EXPECT_EQ(client->GetModelInfo()->steps(), 0);
  StopRanks();
}

// Periodic checkpoints of a 2-rank job hold every rank's part; when a rank
// dies, the other stops the step with a clear error, and the launcher with
// --restart-on-failure restarts the whole job, which resumes from the
// newest checkpoint, finishes the dataset job that was running (no client
// action) and trains on.
TEST_F(LaunchTest, LauncherRestartsTheJobFromTheLastCheckpointWhenARankDies) {
  const std::string script =
      (SourceDir() / "deploy" / "launch_local.sh").string();
  const fs::path ckpt = dir_ / "ckpt";
  const fs::path logs = dir_ / "logs";
  setenv("DLRM_SERVER", ServerPath().c_str(), 1);
  setenv("DLRM_LOG_DIR", logs.c_str(), 1);
  ranks_.push_back(
      Spawn(test::WithLocalServerFlags(
                {"/bin/bash", script, "--restart-on-failure", "1", "2",
                 "--config", config_path_.string(), "--checkpoint-dir",
                 ckpt.string(), "--checkpoint-every-steps", "2",
                 "--comm-timeout-s", "3", "--predict-max-wait-us", "0"}),
            dir_ / "launch.err"));
  std::string address = WaitListening(ranks_[0].out_fd, 30);
  ASSERT_FALSE(address.empty()) << ReadFile(dir_ / "launch.err");
  clients::ClientOptions co;
  co.call_timeout_seconds = 30;
  auto client = clients::Client::Connect(address, co);
  ASSERT_TRUE(client.ok()) << client.status();
  Train(**client);  // kSteps = 4: checkpoints at steps 2 and 4
  for (const char* name : {"ckpt-2", "ckpt-4"}) {
    auto manifest = model::ReadManifest((ckpt / name).string());
    ASSERT_TRUE(manifest.ok()) << manifest.status();
    EXPECT_EQ(manifest->world_size, 2);
    EXPECT_EQ(manifest->format, model::kCheckpointFormat);
    EXPECT_HAS_SUBSTR(manifest->sharding_plan, "row-wise");
    EXPECT_TRUE(fs::exists(ckpt / name / "rank-1.safetensors"));
    EXPECT_TRUE(
        model::VerifyCheckpointFiles((ckpt / name).string(), *manifest).ok());
  }
  // A dataset job on the server, which the periodic checkpoints record.
  constexpr int64_t kJobSteps = 40;
  JobRequest request;
  SyntheticData* synthetic = request.mutable_train()->mutable_synthetic();
  synthetic->set_num_samples(kBatch * kJobSteps);
  synthetic->set_teacher_seed(1);
  synthetic->set_sample_seed(13);
  request.set_batch_size(kBatch);
  // An evaluation after every step (which leaves the model as it is)
  // makes each step slow enough for the kill below to land mid-job.
  request.mutable_eval()->mutable_synthetic()->set_num_samples(4096);
  request.set_eval_interval(1);
  auto job = (*client)->StartJob(request);
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_EQ(job->id(), "job-1");
  absl::StatusOr<JobStatus> running =
      test::WaitForJobSteps(**client, "job-1", 3);
  ASSERT_TRUE(running.ok()) << running.status();
  ASSERT_LT(running->steps(), kJobSteps);

  // Rank 1 dies; rank 0's step fails with a clear error (or the launcher
  // has already stopped rank 0).
  const pid_t rank1 = std::stoi(ReadFile(logs / "rank-1.pid"));
  kill(rank1, SIGKILL);
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (std::chrono::steady_clock::now() < deadline) {
    running = (*client)->GetJob("job-1");
    if (!running.ok() || running->state() != JobStatus::RUNNING) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (running.ok()) {
    EXPECT_EQ(running->state(), JobStatus::FAILED);
    EXPECT_HAS_SUBSTR(running->error(), "UNAVAILABLE") << running->error();
  } else {
    // The server going away: UNAVAILABLE, or CANCELLED for a call its
    // shutdown cut off.
    EXPECT_TRUE(absl::IsUnavailable(running.status()) ||
                absl::IsCancelled(running.status()))
        << running.status();
  }
  client->reset();

  // The launcher restarts both ranks; they resume from the newest
  // checkpoint, and rank 0 resumes the job where that checkpoint saw it.
  address = WaitListening(ranks_[0].out_fd, 60);
  ASSERT_FALSE(address.empty()) << ReadFile(dir_ / "launch.err");
  const std::vector<model::CheckpointEntry> entries =
      model::ListCheckpoints(ckpt.string());
  ASSERT_FALSE(entries.empty());
  ASSERT_TRUE(entries[0].manifest.ok()) << entries[0].manifest.status();
  const int64_t newest = entries[0].manifest->step;
  EXPECT_GT(newest, kSteps);
  EXPECT_HAS_SUBSTR(entries[0].manifest->job, "\"job-1\"")
      << entries[0].manifest->job;
  const std::string rank0_log = ReadFile(logs / "rank-0.log");
  EXPECT_HAS_SUBSTR(rank0_log, "resuming from " + entries[0].dir + " at step " +
                                   std::to_string(newest))
      << rank0_log;
  EXPECT_HAS_SUBSTR(rank0_log, "resuming job job-1 at step " +
                                   std::to_string(newest - kSteps) + " of " +
                                   std::to_string(kJobSteps))
      << rank0_log;
  EXPECT_HAS_SUBSTR(ReadFile(dir_ / "launch.err"), "restarting every rank")
      << ReadFile(dir_ / "launch.err");
  // No client action: the job finishes by itself.
  auto again = clients::Client::Connect(address, co);
  ASSERT_TRUE(again.ok()) << again.status();
  auto done = (*again)->WaitJob("job-1", {}, nullptr);
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->state(), JobStatus::SUCCEEDED) << done->error();
  EXPECT_EQ(done->steps(), kJobSteps);
  EXPECT_EQ((*again)->GetModelInfo()->steps(), kSteps + kJobSteps);

  // The model is the one of an uninterrupted run: one process fed the
  // stream's batches, then the job's (docs/hybrid.md tolerance).
  auto after = (*again)->Predict(EvalBatch());
  ASSERT_TRUE(after.ok()) << after.status();
  auto reference = model::Model::Create(config_);
  ASSERT_TRUE(reference.ok()) << reference.status();
  data::Batch batch;
  auto stream = Source(11, kBatch * kSteps);
  data::SyntheticOptions so;
  so.teacher_seed = 1;
  so.sample_seed = 13;
  so.num_samples = kBatch * kJobSteps;
  auto job_data = data::MakeSyntheticSource(config_, so);
  ASSERT_TRUE(job_data.ok()) << job_data.status();
  for (data::BatchSource* source : {stream.get(), job_data->get()}) {
    while (*source->Next(kBatch, &batch)) {
      ASSERT_TRUE((*reference)->TrainStep(batch).ok());
    }
  }
  std::vector<float> ref;
  ASSERT_TRUE((*reference)->Predict(EvalBatch(), &ref).ok());
  ASSERT_EQ(after->size(), ref.size());
  for (size_t i = 0; i < ref.size(); ++i) {
    EXPECT_NEAR((*after)[i], ref[i], 1e-5) << "sample " << i;
  }
  EXPECT_EQ(Train(**again).size(), static_cast<size_t>(kSteps));
  EXPECT_EQ((*again)->GetModelInfo()->steps(), 2 * kSteps + kJobSteps);

  kill(ranks_[0].pid, SIGINT);
  EXPECT_EQ(WaitExit(ranks_[0].pid, 30), 0) << ReadFile(dir_ / "launch.err");
  ranks_[0].pid = -1;
}

// --- Dataset jobs: every rank reads its own share ---------------------------

// `lines` Criteo TSV lines shaped for kConfig (4 dense, 4 categorical
// columns) from a fixed seed; line `bad` (0-based; -1 = none) has a dense
// value that does not parse.
std::string CriteoText(int lines, int bad = -1) {
  const unsigned seed = 4242;
  std::printf("criteo text seed %u\n", seed);
  std::mt19937 rng(seed);
  std::string text;
  for (int i = 0; i < lines; ++i) {
    text += rng() % 4 == 0 ? "1" : "0";
    for (int j = 0; j < 4; ++j) {
      text += "\t";
      if (i == bad && j == 2) {
        text += "x7";
      } else if (rng() % 5 != 0) {
        text += std::to_string(rng() % 1000);
      }
    }
    for (int t = 0; t < 4; ++t) {
      char hex[16];
      std::snprintf(hex, sizeof(hex), "%x", static_cast<unsigned>(rng()));
      absl::StrAppend(&text, "\t", hex);
    }
    text += "\n";
  }
  return text;
}

// The leader-scatter reference path and the jobs below see 200 samples as
// 2 epochs of 5 full batches of 37 and one of 15: uneven on 2 and 3 ranks.
constexpr int kDataSamples = 200;
constexpr int kDataEpochs = 2;
constexpr int64_t kDataSteps = 12;

class DatasetJobTest : public LaunchTest {
 protected:
  void SetUp() override {
    LaunchTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    tsv_ = (dir_ / "data" / "train.txt").string();
    bin_ = (dir_ / "data" / "train.bin").string();
    fs::create_directories(dir_ / "data");
    std::ofstream(tsv_) << CriteoText(kDataSamples);
    auto count = data::ConvertCriteoTsvToBinary({tsv_}, bin_, 4, 4);
    ASSERT_TRUE(count.ok()) << count.status();
    ASSERT_EQ(*count, kDataSamples);
    WriteNpyDays();
  }

  // The same samples as TorchRec-style NumPy days data/day_0 (90 samples)
  // and data/day_1 (the rest): the raw categorical values as uint32.
  void WriteNpyDays() {
    data::CriteoOptions raw;
    raw.num_dense = 4;
    raw.table_rows.assign(4, int64_t{1} << 32);
    auto source = data::OpenCriteoBinary(bin_, raw);
    ASSERT_TRUE(source.ok()) << source.status();
    int64_t first = 0;
    for (const int64_t n : {int64_t{90}, kDataSamples - int64_t{90}}) {
      data::Batch b;
      ASSERT_TRUE(*(*source)->Next(n, &b));
      ASSERT_EQ(b.size, n);
      std::vector<uint32_t> sparse(n * 4);
      for (int64_t i = 0; i < n; ++i) {
        for (int t = 0; t < 4; ++t) {
          sparse[i * 4 + t] = static_cast<uint32_t>(b.sparse[t].ids[i]);
        }
      }
      const std::string prefix =
          (dir_ / "data" / absl::StrCat("day_", first > 0 ? 1 : 0)).string();
      ASSERT_TRUE(
          testing_npy::WriteNpy(prefix + "_dense.npy", "<f4", b.dense, n, 4));
      ASSERT_TRUE(
          testing_npy::WriteNpy(prefix + "_sparse.npy", "<u4", sparse, n, 4));
      ASSERT_TRUE(
          testing_npy::WriteNpy(prefix + "_labels.npy", "<f4", b.labels, n, 1));
      npy_days_.push_back(prefix);
      first += n;
    }
  }

  // The job's global batches, as the leader read and scattered them (with
  // the multi-hot bags of config_'s tables of multi_hot_size 3 and 2).
  std::vector<data::Batch> Batches() {
    auto source = data::OpenCriteoBinary(
        bin_, data::CriteoOptionsForModel(config_, /*hash_ids=*/false));
    EXPECT_TRUE(source.ok()) << source.status();
    std::vector<data::Batch> batches;
    data::Batch batch;
    for (int epoch = 0; epoch < kDataEpochs; ++epoch) {
      EXPECT_TRUE((*source)->Rewind().ok());
      while (*(*source)->Next(kBatch, &batch)) batches.push_back(batch);
    }
    EXPECT_EQ(batches.size(), static_cast<size_t>(kDataSteps));
    // t1 and t2 read multi-hot bags derived from the one-hot rows.
    if (!batches.empty()) {
      EXPECT_EQ(batches[0].sparse[1].bag_size(0), 3);
      EXPECT_EQ(batches[0].sparse[2].bag_size(0), 2);
    }
    return batches;
  }

  JobRequest Request(bool binary) {
    JobRequest request;
    if (binary) {
      request.mutable_train()->set_criteo_binary(bin_);
    } else {
      request.mutable_train()->mutable_criteo_tsv()->add_paths(tsv_);
    }
    request.set_batch_size(kBatch);
    request.set_epochs(kDataEpochs);
    return request;
  }

  // Starts `world` ranks that may read dir_/data, runs `request` to its
  // end and returns the final status; *checksum: the weights' checksum.
  JobStatus RunJob(int world, const JobRequest& request, uint64_t* checksum,
                   std::vector<std::string> extra = {}) {
    extra.insert(extra.end(), {"--allow-data-path", (dir_ / "data").string()});
    const std::string address = StartRanks(world, extra);
    EXPECT_FALSE(address.empty());
    auto client = clients::Client::Connect(address);
    EXPECT_TRUE(client.ok()) << client.status();
    JobStatus status;
    if (address.empty() || !client.ok()) return status;
    auto started = (*client)->StartJob(request);
    EXPECT_TRUE(started.ok()) << started.status();
    if (!started.ok()) return status;
    clients::WaitOptions wait;
    wait.poll_interval_seconds = 0.05;
    wait.timeout_seconds = 120;
    auto done = (*client)->WaitJob(started->id(), wait, nullptr);
    EXPECT_TRUE(done.ok()) << done.status();
    if (done.ok()) status = *done;
    auto info = (*client)->GetModelInfo(/*include_weight_checksum=*/true);
    EXPECT_TRUE(info.ok()) << info.status();
    if (info.ok()) *checksum = info->weight_checksum();
    client->reset();
    StopRanks();
    return status;
  }

  // `world` ranks trained on Batches() through the Train stream: rank 0
  // scatters each batch's slices. The weights' checksum.
  uint64_t StreamChecksum(int world) {
    const std::string address = StartRanks(world);
    auto client = clients::Client::Connect(address);
    EXPECT_TRUE(client.ok()) << client.status();
    if (address.empty() || !client.ok()) return 0;
    const std::vector<data::Batch> batches = Batches();
    data::RotatingSource source(&batches, static_cast<int64_t>(batches.size()));
    clients::TrainOptions o;
    o.batch_size = kBatch;
    o.max_in_flight = 1;
    auto summary = (*client)->Train(source, o, [](const StepResult&) {});
    EXPECT_TRUE(summary.ok()) << summary.status();
    auto info = (*client)->GetModelInfo(/*include_weight_checksum=*/true);
    EXPECT_TRUE(info.ok()) << info.status();
    EXPECT_EQ(info->steps(), kDataSteps);
    client->reset();
    StopRanks();
    return info.ok() ? info->weight_checksum() : 0;
  }

  // The NumPy days' prefixes.
  JobRequest NpyRequest() {
    JobRequest request = Request(/*binary=*/true);
    request.mutable_train()->clear_criteo_binary();
    for (const std::string& day : npy_days_) {
      request.mutable_train()->mutable_criteo_npy()->add_paths(day);
    }
    return request;
  }

  std::string tsv_, bin_;
  std::vector<std::string> npy_days_;
};

// A dataset job on 2 and 3 ranks, each reading its own share of the binary
// file (and on 2 of the TSV file and of the same samples as NumPy days), trains
// bitwise like the same ranks fed the same batches through the Train stream,
// where rank 0 reads every batch and scatters the slices; a job of one rank
// trains bitwise like one process, and 2 ranks like one process to
// docs/hybrid.md's tolerance.
TEST_F(DatasetJobTest, RanksReadingTheirOwnShareTrainLikeTheLeaderScatter) {
  for (int world : {2, 3}) {
    SCOPED_TRACE("world " + std::to_string(world));
    uint64_t job = 0;
    const JobStatus done = RunJob(world, Request(/*binary=*/true), &job);
    ASSERT_EQ(done.state(), JobStatus::SUCCEEDED) << done.error();
    EXPECT_EQ(done.steps(), kDataSteps);
    EXPECT_EQ(done.samples(), kDataEpochs * kDataSamples);
    EXPECT_EQ(job, StreamChecksum(world));
    if (world == 2) {
      uint64_t tsv = 0;
      const JobStatus from_tsv = RunJob(2, Request(/*binary=*/false), &tsv);
      ASSERT_EQ(from_tsv.state(), JobStatus::SUCCEEDED) << from_tsv.error();
      EXPECT_EQ(tsv, job);
      // The same samples as two NumPy days: rank shares cross the days'
      // boundary.
      uint64_t npy = 0;
      const JobStatus from_npy = RunJob(2, NpyRequest(), &npy);
      ASSERT_EQ(from_npy.state(), JobStatus::SUCCEEDED) << from_npy.error();
      EXPECT_EQ(from_npy.samples(), kDataEpochs * kDataSamples);
      EXPECT_EQ(npy, job);
    }
  }

  // One rank against one process, bitwise.
  auto model = model::Model::Create(config_);
  ASSERT_TRUE(model.ok()) << model.status();
  for (const data::Batch& batch : Batches()) {
    ASSERT_TRUE((*model)->TrainStep(batch).ok());
  }
  auto one_process = (*model)->WeightChecksum();
  ASSERT_TRUE(one_process.ok()) << one_process.status();
  uint64_t one_rank = 0;
  const JobStatus done = RunJob(1, Request(/*binary=*/true), &one_rank);
  ASSERT_EQ(done.state(), JobStatus::SUCCEEDED) << done.error();
  EXPECT_EQ(one_rank, *one_process);

  // Two ranks against one process, weight by weight.
  const std::string address =
      StartRanks(2, {"--allow-data-path", (dir_ / "data").string(),
                     "--checkpoint-dir", (dir_ / "out").string()});
  auto client = clients::Client::Connect(address);
  ASSERT_TRUE(client.ok()) << client.status();
  auto started = (*client)->StartJob(Request(/*binary=*/true));
  ASSERT_TRUE(started.ok()) << started.status();
  auto finished = (*client)->WaitJob(started->id(), {}, nullptr);
  ASSERT_TRUE(finished.ok()) << finished.status();
  ASSERT_EQ(finished->state(), JobStatus::SUCCEEDED) << finished->error();
  auto exported = (*client)->ExportWeights("weights.safetensors");
  ASSERT_TRUE(exported.ok()) << exported.status();
  client->reset();
  StopRanks();
  const std::string one = (dir_ / "one.safetensors").string();
  ASSERT_TRUE(model::ExportSafetensors(**model, one).ok());
  ExpectSameWeights(exported->path(), one, **model);
}

// Tables on RocksDB: each rank reads its share of the next batch a step
// ahead (its shards prefetch the rows) and trains on it the step after; the
// weights are bitwise those of the Train stream, which sends no next batch
// (one batch in flight).
TEST_F(DatasetJobTest, SharesReadAheadForTheRocksDbPrefetchTrainAlike) {
  ASSERT_NO_FATAL_FAILURE(PutTablesOnRocksDb(1, 3));
  uint64_t job = 0;
  const JobStatus done = RunJob(2, Request(/*binary=*/true), &job);
  ASSERT_EQ(done.state(), JobStatus::SUCCEEDED) << done.error();
  EXPECT_EQ(done.steps(), kDataSteps);
  EXPECT_EQ(job, StreamChecksum(2));
}

// A job resumed on 2 ranks from a checkpoint taken mid-way through its
// second epoch: each rank seeks to its share at the recorded position, and
// the job ends with the weights of an uninterrupted run.
TEST_F(DatasetJobTest, ResumedJobSeeksEveryRankToItsPosition) {
  uint64_t uninterrupted = 0;
  const JobStatus done =
      RunJob(2, Request(/*binary=*/true), &uninterrupted,
             {"--checkpoint-dir", (dir_ / "first").string(),
              "--checkpoint-every-steps", "5", "--keep-checkpoints", "0"});
  ASSERT_EQ(done.state(), JobStatus::SUCCEEDED) << done.error();
  // Step 10: epoch 2, after its 4th batch (sample 148). The copy has no
  // end marker, so a server started on it resumes the job.
  fs::create_directories(dir_ / "second");
  fs::copy(dir_ / "first" / "ckpt-10", dir_ / "second" / "ckpt-10",
           fs::copy_options::recursive);
  const std::string address =
      StartRanks(2, {"--allow-data-path", (dir_ / "data").string(),
                     "--checkpoint-dir", (dir_ / "second").string()});
  ASSERT_FALSE(address.empty());
  const std::string log = ReadFile(dir_ / "rank-0.log");
  EXPECT_HAS_SUBSTR(log, "resuming job job-1 at step 10 of") << log;
  auto client = clients::Client::Connect(address);
  ASSERT_TRUE(client.ok()) << client.status();
  auto resumed = (*client)->WaitJob("job-1", {}, nullptr);
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  ASSERT_EQ(resumed->state(), JobStatus::SUCCEEDED) << resumed->error();
  EXPECT_EQ(resumed->steps(), kDataSteps);
  EXPECT_EQ(resumed->samples(), kDataEpochs * kDataSamples);
  auto info = (*client)->GetModelInfo(/*include_weight_checksum=*/true);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->weight_checksum(), uninterrupted);
  client->reset();
  StopRanks();
}

// A malformed line in rank 1's share: the job fails on its second step
// with rank 1's error naming the file and line (rank 0 never parses it),
// the model keeps the first step, and the ranks serve and train on.
TEST_F(DatasetJobTest, ReadErrorOnAFollowerFailsTheJobNamingRankAndFile) {
  // Batch 2 is samples [37, 74): rank 0 reads [37, 56), rank 1 [56, 74).
  std::ofstream(tsv_) << CriteoText(kDataSamples, /*bad=*/60);
  const std::string address =
      StartRanks(2, {"--allow-data-path", (dir_ / "data").string()});
  auto client = clients::Client::Connect(address);
  ASSERT_TRUE(client.ok()) << client.status();
  auto failed = RunJobToEnd(**client, Request(/*binary=*/false));
  ASSERT_TRUE(failed.ok()) << failed.status();
  EXPECT_EQ(failed->state(), JobStatus::FAILED);
  EXPECT_EQ(failed->steps(), 1);
  const std::string where = absl::StrCat(
      "rank 1: ", fs::weakly_canonical(tsv_).string(), ":61: column 3");
  EXPECT_HAS_SUBSTR(failed->error(), where)
      << failed->error() << "\nexpected: " << where;
  EXPECT_HAS_SUBSTR(failed->error(), "INVALID_ARGUMENT") << failed->error();
  EXPECT_EQ((*client)->GetModelInfo()->steps(), 1);
  // The group goes on: a prediction, and a job on good data.
  ASSERT_TRUE((*client)->Predict(EvalBatch()).ok());
  auto done = RunJobToEnd(**client, Request(/*binary=*/true));
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->state(), JobStatus::SUCCEEDED) << done->error();
  EXPECT_EQ((*client)->GetModelInfo()->steps(), 1 + kDataSteps);
  StopRanks();
}

}  // namespace
}  // namespace dlrm
