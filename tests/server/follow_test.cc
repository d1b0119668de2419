// Replicas that follow training (server/checkpoint_follower.h): an
// inference-only server following a checkpoint directory swaps newer
// checkpoints in while clients predict the whole time, skips damaged and
// half-written ones, and reports the served version.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "core/config.h"
#include "data/synthetic.h"
#include "data/wire.h"
#include "dlrm/service.grpc.pb.h"
#include "model/checkpoint.h"
#include "model/model.h"
#include "server/checkpoint_follower.h"
#include "server/dlrm_server.h"
#include "tests/support/expect.h"
#include "tests/support/files.h"
#include "tests/support/synthetic.h"

namespace dlrm::server {
namespace {

using test::MakeTempDir;
using test::MetricValue;

namespace fs = std::filesystem;

ModelConfig Tiny() {
  absl::StatusOr<ModelConfig> c = LoadModelConfig("tiny");
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

using test::SyntheticBatch;

// Flips one byte in the middle of every safetensors file under `dir`
// (sizes unchanged: only the CRC-32C can tell).
void Corrupt(const fs::path& dir) {
  int flipped = 0;
  for (const auto& entry : fs::recursive_directory_iterator(dir)) {
    if (entry.path().extension() != ".safetensors") continue;
    std::fstream f(entry.path(),
                   std::ios::in | std::ios::out | std::ios::binary);
    const auto at = static_cast<std::streamoff>(entry.file_size() / 2);
    f.seekg(at);
    char c = 0;
    f.read(&c, 1);
    c = static_cast<char>(c ^ 0x5a);
    f.seekp(at);
    f.write(&c, 1);
    ++flipped;
  }
  ASSERT_GT(flipped, 0) << "no safetensors file under " << dir;
}

// Clients predicting `batch` on their own threads until Stop(), checking
// every answer against the probabilities expected for the step it names.
class Clients {
 public:
  // Starts `threads` clients; `step` and `probs` are the weights served
  // now and their predictions.
  Clients(const std::string& address, const data::Batch& batch, int threads,
          int64_t step, std::vector<float> probs)
      : channel_(
            grpc::CreateChannel(address, grpc::InsecureChannelCredentials())) {
    data::BatchToProto(batch, /*labels=*/false, request_.mutable_batch());
    expected_[step] = std::move(probs);
    for (int t = 0; t < threads; ++t) {
      threads_.emplace_back([this] { Run(); });
    }
  }
  ~Clients() { Stop(); }

  // Predictions the clients must see from the weights of `step`.
  void Expect(int64_t step, std::vector<float> probs) {
    std::lock_guard<std::mutex> lock(mu_);
    expected_[step] = std::move(probs);
  }

  // Waits until a client got an answer from the weights of `step` after
  // this call (or 60 s pass); true if one did.
  bool AwaitStep(int64_t step) {
    std::unique_lock<std::mutex> lock(mu_);
    seen_.erase(step);
    return cv_.wait_for(lock, std::chrono::seconds(60),
                        [&] { return seen_.count(step) > 0; });
  }

  void Stop() {
    stop_.store(true);
    for (std::thread& t : threads_) t.join();
    threads_.clear();
  }

  int64_t answers() const { return answers_.load(); }
  std::vector<std::string> failures() {
    std::lock_guard<std::mutex> lock(mu_);
    return failures_;
  }

 private:
  void Run() {
    auto stub = Predictor::NewStub(channel_);
    while (!stop_.load()) {
      grpc::ClientContext context;
      PredictResponse response;
      const grpc::Status status = stub->Predict(&context, request_, &response);
      std::lock_guard<std::mutex> lock(mu_);
      if (!status.ok()) {
        failures_.push_back(status.error_message());
        continue;
      }
      const auto want = expected_.find(response.model_step());
      if (want == expected_.end()) {
        failures_.push_back("an answer from unexpected step " +
                            std::to_string(response.model_step()));
        continue;
      }
      for (int i = 0; i < response.probabilities_size(); ++i) {
        if (std::fabs(response.probabilities(i) - want->second[i]) > 1e-6f) {
          failures_.push_back("step " + std::to_string(want->first) +
                              ": probability " + std::to_string(i) +
                              " differs from the trained model's");
          break;
        }
      }
      ++answers_;
      seen_.insert(response.model_step());
      cv_.notify_all();
    }
  }

  std::shared_ptr<grpc::Channel> channel_;
  PredictRequest request_;
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> answers_{0};
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<int64_t, std::vector<float>> expected_;
  std::set<int64_t> seen_;
  std::vector<std::string> failures_;
  std::vector<std::thread> threads_;
};

class FollowTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = test::MakeTestDir();
    root_ = dir_ / "checkpoints";
    fs::create_directories(root_);
    auto trainer = model::Model::Create(Tiny());
    ASSERT_TRUE(trainer.ok()) << trainer.status();
    trainer_ = *std::move(trainer);
    batch_ = SyntheticBatch(Tiny(), 16, 77);
  }
  void TearDown() override {
    server_.reset();
    fs::remove_all(dir_);
  }

  // An inference-only server following root_, starting from an untrained
  // model (no checkpoint served). The test drives the polls: the follower's
  // own interval is an hour.
  void StartReplica() { StartReplica(ReplicaOptions()); }

  // The options of StartReplica's server.
  ServerOptions ReplicaOptions() const {
    ServerOptions o;
    o.listen = "127.0.0.1:0";
    o.metrics_listen = "";
    o.inference_only = true;
    o.follow_dir = root_.string();
    o.follow_poll_seconds = 3600;
    return o;
  }

  // A server of `o` from an untrained model.
  void StartReplica(const ServerOptions& o) {
    auto model = model::Model::Create(Tiny());
    ASSERT_TRUE(model.ok()) << model.status();
    auto server = DlrmServer::Start(*std::move(model), o);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    ASSERT_NE(server_->follower(), nullptr);
  }

  // Trains the trainer to `step` and saves it as `dir`; returns the
  // trainer's predictions of batch_ there.
  std::vector<float> TrainAndSave(int64_t step, const fs::path& dir) {
    while (trainer_->steps() < step) {
      const data::Batch b =
          SyntheticBatch(Tiny(), 32, 1000 + static_cast<uint64_t>(step));
      EXPECT_TRUE(trainer_->TrainStep(b).ok());
    }
    auto info = model::SaveCheckpoint(*trainer_, dir.string());
    EXPECT_TRUE(info.ok()) << info.status();
    std::vector<float> probs;
    EXPECT_TRUE(trainer_->Predict(batch_, &probs).ok());
    return probs;
  }

  ModelInfo Info() {
    auto channel = grpc::CreateChannel(server_->address(),
                                       grpc::InsecureChannelCredentials());
    grpc::ClientContext context;
    ModelInfo info;
    EXPECT_TRUE(Admin::NewStub(channel)
                    ->GetModelInfo(&context, ModelInfoRequest(), &info)
                    .ok());
    return info;
  }

  double Metric(const std::string& series) {
    return MetricValue(server_->MetricsText(), series);
  }

  fs::path dir_, root_;
  std::unique_ptr<model::Model> trainer_;
  data::Batch batch_;
  std::unique_ptr<DlrmServer> server_;
};

TEST_F(FollowTest, SwapsNewCheckpointsInAndSkipsDamagedOnesWhileServing) {
  StartReplica();
  std::vector<float> untrained;
  ASSERT_TRUE(server_->host()->Predict(batch_, &untrained).ok());
  Clients clients(server_->address(), batch_, 3, 0, untrained);
  ASSERT_TRUE(clients.AwaitStep(0));

  // A new checkpoint is swapped in.
  clients.Expect(3, TrainAndSave(3, root_ / "ckpt-3"));
  EXPECT_TRUE(server_->follower()->PollOnce());
  EXPECT_EQ(server_->host()->steps(), 3);
  ASSERT_TRUE(clients.AwaitStep(3));
  ModelInfo info = Info();
  EXPECT_EQ(info.served_checkpoint(), (root_ / "ckpt-3").string());
  EXPECT_EQ(info.served_checkpoint_step(), 3);
  EXPECT_EQ(info.steps(), 3);

  // A newer, corrupt one (a byte flipped in each tensor file) is skipped,
  // once: later polls do not try it again while its files stay as they are.
  TrainAndSave(5, root_ / "ckpt-5");
  Corrupt(root_ / "ckpt-5");
  EXPECT_FALSE(server_->follower()->PollOnce());
  EXPECT_FALSE(server_->follower()->PollOnce());
  EXPECT_EQ(server_->host()->steps(), 3);
  EXPECT_EQ(Metric("dlrm_checkpoint_swap_failures_total"), 1);
  ASSERT_TRUE(clients.AwaitStep(3));

  // A half-written one, as a copy onto shared storage leaves it: first
  // without its manifest, then with it but a tensor file cut short. Each
  // state is skipped; once the copy is complete it is swapped in.
  const fs::path staged = dir_ / "staged-7";
  clients.Expect(7, TrainAndSave(7, staged));
  const fs::path half = root_ / "ckpt-7";
  fs::copy(staged, half, fs::copy_options::recursive);
  fs::remove(half / "MANIFEST.json");
  // Rank 0's tables, which a weights-only load reads.
  const fs::path cut = half / "rank-0.safetensors";
  ASSERT_TRUE(fs::exists(cut));
  fs::resize_file(cut, fs::file_size(cut) / 2);
  EXPECT_FALSE(server_->follower()->PollOnce());
  EXPECT_EQ(Metric("dlrm_checkpoint_swap_failures_total"), 2);
  fs::copy_file(staged / "MANIFEST.json", half / "MANIFEST.json");
  EXPECT_FALSE(server_->follower()->PollOnce());
  EXPECT_EQ(Metric("dlrm_checkpoint_swap_failures_total"), 3);
  EXPECT_EQ(server_->host()->steps(), 3);
  ASSERT_TRUE(clients.AwaitStep(3));
  fs::copy_file(staged / cut.lexically_relative(half), cut,
                fs::copy_options::overwrite_existing);
  EXPECT_TRUE(server_->follower()->PollOnce());
  EXPECT_EQ(server_->host()->steps(), 7);
  ASSERT_TRUE(clients.AwaitStep(7));

  // A checkpoint of another architecture is skipped too.
  {
    ModelConfig other = Tiny();
    other.mutable_tables(0)->set_rows(other.tables(0).rows() + 1);
    auto normalised = NormalizeModelConfig(other);
    ASSERT_TRUE(normalised.ok()) << normalised.status();
    auto foreign = model::Model::Create(*normalised);
    ASSERT_TRUE(foreign.ok()) << foreign.status();
    ASSERT_TRUE(
        model::SaveCheckpoint(**foreign, (root_ / "foreign").string()).ok());
  }
  EXPECT_FALSE(server_->follower()->PollOnce());
  EXPECT_EQ(Metric("dlrm_checkpoint_swap_failures_total"), 4);
  EXPECT_EQ(server_->host()->steps(), 7);

  // And a good newer one still gets in.
  clients.Expect(9, TrainAndSave(9, root_ / "ckpt-9"));
  EXPECT_TRUE(server_->follower()->PollOnce());
  ASSERT_TRUE(clients.AwaitStep(9));
  clients.Stop();

  EXPECT_EQ(clients.failures(), std::vector<std::string>());
  EXPECT_GT(clients.answers(), 0);
  info = Info();
  EXPECT_EQ(info.served_checkpoint(), (root_ / "ckpt-9").string());
  EXPECT_EQ(info.served_checkpoint_step(), 9);
  EXPECT_EQ(Metric("dlrm_checkpoint_swaps_total"), 3);
  EXPECT_EQ(Metric("dlrm_checkpoint_swap_failures_total"), 4);
  // One series, whatever the checkpoint: no label that changes per swap.
  EXPECT_EQ(Metric("dlrm_served_step"), 9);
  EXPECT_NO_SUBSTR(server_->MetricsText(), "dlrm_served_step{");
}

// The binary's flags reach every checkpoint a replica swaps in
// (ServerOptions::adjust_loaded_config, dlrm_server's --device, --precision,
// --tf32 and device budget), not only the first: each load calls the
// adjustment on the checkpoint's config, and a load it refuses is skipped
// like a damaged checkpoint, the served model kept.
TEST_F(FollowTest, AdjustsTheConfigOfEveryCheckpointItLoads) {
  std::atomic<int> calls{0};
  std::atomic<bool> refuse{false};
  ServerOptions o = ReplicaOptions();
  o.adjust_loaded_config = [&](ModelConfig* config) -> absl::Status {
    ++calls;
    EXPECT_EQ(config->tables_size(), Tiny().tables_size());
    if (refuse.load()) {
      return absl::InvalidArgumentError("--precision: refused by the test");
    }
    config->set_gpu_disable_tf32(true);
    return absl::OkStatus();
  };
  StartReplica(o);

  const std::vector<float> at2 = TrainAndSave(2, root_ / "ckpt-2");
  EXPECT_TRUE(server_->follower()->PollOnce());
  EXPECT_EQ(calls.load(), 1);
  EXPECT_EQ(server_->host()->steps(), 2);
  std::vector<float> probs;
  ASSERT_TRUE(server_->host()->Predict(batch_, &probs).ok());
  ASSERT_EQ(probs.size(), at2.size());
  for (size_t i = 0; i < probs.size(); ++i) EXPECT_NEAR(probs[i], at2[i], 1e-6);

  refuse = true;
  TrainAndSave(4, root_ / "ckpt-4");
  EXPECT_FALSE(server_->follower()->PollOnce());
  EXPECT_EQ(calls.load(), 2);
  EXPECT_EQ(server_->host()->steps(), 2);
  EXPECT_EQ(Metric("dlrm_checkpoint_swap_failures_total"), 1);
}

TEST_F(FollowTest, PollsOnItsOwnAndIgnoresWhatIsNotNewer) {
  ServerOptions o = ReplicaOptions();
  o.follow_poll_seconds = 0.05;
  TrainAndSave(2, root_ / "ckpt-2");
  auto model = model::LoadCheckpoint((root_ / "ckpt-2").string(), true);
  ASSERT_TRUE(model.ok()) << model.status();
  o.loaded_from = (root_ / "ckpt-2").string();
  auto server = DlrmServer::Start(*std::move(model), o);
  ASSERT_TRUE(server.ok()) << server.status();
  server_ = *std::move(server);
  // The checkpoint it started from is not loaded again.
  EXPECT_FALSE(server_->follower()->PollOnce());
  EXPECT_EQ(server_->host()->served_checkpoint().step, 2);

  TrainAndSave(4, root_ / "ckpt-4");
  // The follower's own thread picks it up (counted once the swap is done).
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (Metric("dlrm_checkpoint_swaps_total") != 1 &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(server_->host()->steps(), 4);
  EXPECT_EQ(server_->host()->served_checkpoint().dir,
            (root_ / "ckpt-4").string());
  EXPECT_EQ(Metric("dlrm_checkpoint_swaps_total"), 1);
}

TEST(FollowOptionsTest, FollowNeedsAnInferenceOnlyServerAndAPositivePoll) {
  auto model = model::Model::Create(Tiny());
  ASSERT_TRUE(model.ok());
  ServerOptions o;
  o.listen = "127.0.0.1:0";
  o.metrics_listen = "";
  o.follow_dir = "/tmp";
  EXPECT_EQ(o.Validate().code(), absl::StatusCode::kInvalidArgument);
  o.inference_only = true;
  EXPECT_TRUE(o.Validate().ok());
  o.follow_poll_seconds = 0;
  EXPECT_EQ(o.Validate().code(), absl::StatusCode::kInvalidArgument);

  CheckpointFollowerOptions f;
  EXPECT_EQ(f.Validate().code(), absl::StatusCode::kInvalidArgument);
  f.dir = "/tmp";
  auto host = ModelHost::Create(*std::move(model), ModelHostOptions());
  ASSERT_TRUE(host.ok());
  EXPECT_EQ(CheckpointFollower::Start(host->get(), nullptr, f).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace dlrm::server
