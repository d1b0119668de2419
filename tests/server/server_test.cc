// Tests for server/: an in-process server on an ephemeral port with the
// "tiny" model, driven by real gRPC clients (the generated stubs), plus the
// dlrm_server binary as a child process.
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <omp.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <latch>
#include <limits>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/config.h"
#include "data/synthetic.h"
#include "data/wire.h"
#include "dlrm/service.grpc.pb.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/descriptor.pb.h"
#include "google/protobuf/dynamic_message.h"
#include "google/protobuf/text_format.h"
#include "model/checkpoint.h"
#include "model/metrics.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "model/weights_export.h"
#include "server/datasets.h"
#include "server/dlrm_server.h"
#include "tests/server/npy_files.h"
#include "tests/server/raw_call.h"
#include "tests/server/rpc.h"
#include "tests/support/expect.h"
#include "tests/support/files.h"
#include "tests/support/health.h"
#include "tests/support/process.h"
#include "tests/support/synthetic.h"

namespace dlrm::server {
namespace {

using test::MakeTempDir;
using test::MetricValue;
using test::WriteTinyTsv;

namespace fs = std::filesystem;
using std::chrono::milliseconds;

// ------------------------------------------------------------ helpers

ModelConfig Tiny() {
  absl::StatusOr<ModelConfig> c = LoadModelConfig("tiny");
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

// The tiny model with a wide top MLP: each step takes long enough that a
// client outruns the trainer.
ModelConfig SlowTiny() {
  ModelConfig c = Tiny();
  c.clear_top_mlp();
  c.add_top_mlp(512);
  c.add_top_mlp(512);
  c.add_top_mlp(1);
  absl::StatusOr<ModelConfig> n = NormalizeModelConfig(c);
  EXPECT_TRUE(n.ok()) << n.status();
  return *n;
}

using test::SyntheticBatch;

Batch ToWire(const data::Batch& b, bool labels = true) {
  Batch out;
  data::BatchToProto(b, labels, &out);
  return out;
}

std::vector<float> LocalPredict(model::Model& model, const data::Batch& b) {
  std::vector<float> probs;
  EXPECT_TRUE(model.Predict(b, &probs).ok());
  return probs;
}

struct StreamOutcome {
  std::vector<StepResult> results;
  grpc::Status status;
};

// Streams `batches` on one Train call (writes on a second thread, so the
// client is never blocked by its own reading) and collects every result.
StreamOutcome RunTrainStream(Trainer::Stub* stub,
                             const std::vector<Batch>& batches) {
  grpc::ClientContext context;
  auto stream = stub->Train(&context);
  std::thread writer([&] {
    for (const Batch& b : batches) {
      TrainRequest request;
      *request.mutable_batch() = b;
      if (!stream->Write(request)) break;
    }
    stream->WritesDone();
  });
  StreamOutcome out;
  TrainResponse response;
  while (stream->Read(&response)) out.results.push_back(response.result());
  writer.join();
  out.status = stream->Finish();
  return out;
}

std::shared_ptr<grpc::Channel> Connect(const std::string& address) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  args.SetMaxSendMessageSize(-1);
  return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(),
                                   args);
}

// ------------------------------------------------------------ fixture

class ServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = MakeTempDir("fixture");
    fs::create_directories(dir_ / "checkpoints");
    fs::create_directories(dir_ / "data");
    Start(Tiny(), Options());
  }

  void TearDown() override {
    server_.reset();
    fs::remove_all(dir_);
  }

  ServerOptions Options() const {
    ServerOptions o;
    o.listen = "127.0.0.1:0";
    o.metrics_listen = "127.0.0.1:0";
    o.checkpoint_dir = (dir_ / "checkpoints").string();
    o.data_dir = (dir_ / "data").string();
    o.train_queue_depth = 2;
    o.predict_max_wait_us = 10000;
    o.max_message_bytes = 1 << 20;
    o.max_batch_samples = 4096;
    return o;
  }

  void Start(const ModelConfig& config, ServerOptions options) {
    server_.reset();
    auto model = model::Model::Create(config);
    ASSERT_TRUE(model.ok()) << model.status();
    auto server = DlrmServer::Start(*std::move(model), std::move(options));
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    channel_ = Connect(server_->address());
    trainer_ = Trainer::NewStub(channel_);
    predictor_ = Predictor::NewStub(channel_);
    admin_ = Admin::NewStub(channel_);
  }

  uint64_t Checksum() { return server_->host()->WeightChecksum().value(); }
  int64_t Steps() { return server_->host()->steps(); }

  std::vector<Batch> TrainBatches(int count, int64_t size, uint64_t seed) {
    std::vector<Batch> out;
    data::SyntheticOptions o;
    o.teacher_seed = Tiny().seed();
    o.sample_seed = seed;
    auto source = data::MakeSyntheticSource(Tiny(), o);
    EXPECT_TRUE(source.ok());
    data::Batch b;
    for (int i = 0; i < count; ++i) {
      EXPECT_TRUE(*(*source)->Next(size, &b));
      out.push_back(ToWire(b));
    }
    return out;
  }

  grpc::Status Predict(const Batch& batch, PredictResponse* response) {
    grpc::ClientContext context;
    PredictRequest request;
    *request.mutable_batch() = batch;
    return predictor_->Predict(&context, request, response);
  }

  grpc::Status GetJob(const std::string& id, JobStatus* status) {
    grpc::ClientContext context;
    JobId request;
    request.set_id(id);
    return trainer_->GetJob(&context, request, status);
  }

  // Starts the job `request` describes; `started` its first status.
  grpc::Status StartJob(const JobRequest& request, JobStatus* started) {
    grpc::ClientContext context;
    return trainer_->StartJob(&context, request, started);
  }

  // GET /metrics from the server's metrics listener.
  httplib::Result GetMetricsOverHttp() {
    const std::string address = server_->metrics_address();
    const size_t colon = address.rfind(':');
    httplib::Client http(address.substr(0, colon),
                         std::stoi(address.substr(colon + 1)));
    return http.Get("/metrics");
  }

  // Starts the tiny model with table t2 on RocksDB under dir_, behind a
  // cache of 40 rows.
  void StartWithT2OnRocksDb() {
    RocksDbConfig r;
    r.set_path((dir_ / "rocksdb").string());
    r.set_cache_rows(40);
    auto config = PlaceTablesOnRocksDb(Tiny(), {"t2"}, r);
    ASSERT_TRUE(config.ok()) << config.status();
    Start(*config, Options());
  }

  // StartJob, then WaitForJobEnd: the job's last status; a failure, and
  // an empty status (STATE_UNSPECIFIED), when it does not start.
  JobStatus RunJob(const JobRequest& request) {
    JobStatus started;
    const grpc::Status status = StartJob(request, &started);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return status.ok() ? WaitForJobEnd(started.id()) : JobStatus();
  }

  // Polls the job until it succeeded or failed (WaitForJob's deadline).
  JobStatus WaitForJobEnd(const std::string& id) {
    return WaitForJob(id, [](const JobStatus& s) {
      return s.state() == JobStatus::SUCCEEDED ||
             s.state() == JobStatus::FAILED;
    });
  }

  // Polls the job until `done` holds, or 120 s pass (a deadline for a
  // loaded machine, where a step of the tiny model can take 100 ms).
  JobStatus WaitForJob(const std::string& id,
                       const std::function<bool(const JobStatus&)>& done) {
    JobStatus status;
    const auto deadline =
        std::chrono::steady_clock::now() + milliseconds(120000);
    while (std::chrono::steady_clock::now() < deadline) {
      EXPECT_TRUE(GetJob(id, &status).ok());
      if (done(status)) break;
      std::this_thread::sleep_for(milliseconds(5));
    }
    return status;
  }

  grpc::Status Checkpoint(const std::string& path, bool save,
                          CheckpointResponse* response) {
    grpc::ClientContext context;
    CheckpointRequest request;
    request.set_path(path);
    return save ? admin_->SaveCheckpoint(&context, request, response)
                : admin_->RestoreCheckpoint(&context, request, response);
  }

  std::string AdminMetrics() {
    grpc::ClientContext context;
    MetricsResponse response;
    EXPECT_TRUE(admin_->GetMetrics(&context, MetricsRequest(), &response).ok());
    return response.prometheus_text();
  }

  fs::path dir_;
  std::unique_ptr<DlrmServer> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<Trainer::Stub> trainer_;
  std::unique_ptr<Predictor::Stub> predictor_;
  std::unique_ptr<Admin::Stub> admin_;
};

// ------------------------------------------------------------ training

TEST_F(ServerTest, TrainStreamReturnsOrderedStepsAndLossDrops) {
  const std::vector<Batch> batches = TrainBatches(80, 256, /*seed=*/11);
  StreamOutcome out = RunTrainStream(trainer_.get(), batches);
  ASSERT_TRUE(out.status.ok()) << out.status.error_message();
  ASSERT_EQ(out.results.size(), batches.size());
  double first = 0, last = 0;
  for (size_t i = 0; i < out.results.size(); ++i) {
    EXPECT_EQ(out.results[i].step(), static_cast<int64_t>(i + 1));
    EXPECT_EQ(out.results[i].samples(), 256);
    EXPECT_GT(out.results[i].samples_per_second(), 0);
    if (i < 10) first += out.results[i].loss() / 10;
    if (i >= out.results.size() - 10) last += out.results[i].loss() / 10;
  }
  EXPECT_LT(last, first - 0.02)
      << "first 10 steps " << first << ", last 10 steps " << last;
  EXPECT_EQ(Steps(), 80);
}

TEST_F(ServerTest, FlowControlBoundsTheQueue) {
  ServerOptions o = Options();
  o.train_queue_depth = 2;
  o.max_message_bytes = 16 << 20;
  Start(SlowTiny(), o);
  std::vector<Batch> batches;
  for (int i = 0; i < 16; ++i) {
    batches.push_back(ToWire(SyntheticBatch(SlowTiny(), 512, 100 + i)));
  }
  // Sample the queue while the client pushes as fast as it can.
  std::atomic<bool> streaming{true};
  std::atomic<int64_t> sampled_max{0};
  std::thread sampler([&] {
    while (streaming.load()) {
      const double depth =
          MetricValue(server_->MetricsText(), "dlrm_train_queue_depth");
      if (depth > sampled_max.load()) sampled_max = static_cast<int64_t>(depth);
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  });
  StreamOutcome out = RunTrainStream(trainer_.get(), batches);
  streaming = false;
  sampler.join();
  ASSERT_TRUE(out.status.ok()) << out.status.error_message();
  ASSERT_EQ(out.results.size(), batches.size());
  const std::string text = server_->MetricsText();
  // Never more than queue-depth batches read ahead of the trainer, and the
  // bound was reached (the client really was held back).
  EXPECT_EQ(MetricValue(text, "dlrm_train_queue_depth_max"), 2);
  EXPECT_LE(sampled_max.load(), 2);
  EXPECT_GT(MetricValue(text, "dlrm_train_read_stalls_total"), 0);
  EXPECT_EQ(MetricValue(text, "dlrm_train_queue_depth"), 0);
  EXPECT_EQ(MetricValue(text, "dlrm_train_queue_capacity"), 2);
}

TEST_F(ServerTest, BadBatchEndsTheStreamAfterEarlierResults) {
  std::vector<Batch> batches = TrainBatches(3, 64, /*seed=*/5);
  batches[2].mutable_sparse(0)->set_ids(0, 50);
  StreamOutcome out = RunTrainStream(trainer_.get(), batches);
  EXPECT_EQ(out.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_HAS_SUBSTR(out.status.error_message(),
                    "batch.sparse[0].ids[0] (sample 0): id 50 out of range [0, "
                    "50) (in stream message 2)")
      << out.status.error_message();
  ASSERT_EQ(out.results.size(), 2u);
  EXPECT_EQ(Steps(), 2);
}

TEST_F(ServerTest, ShutdownStopsStreamsAndJobsAtAStepBoundary) {
  // A client that would stream forever.
  std::atomic<bool> writing{true};
  grpc::ClientContext context;
  auto stream = trainer_->Train(&context);
  const std::vector<Batch> batches = TrainBatches(4, 64, 12);
  std::thread writer([&] {
    TrainRequest request;
    for (int i = 0; writing.load(); ++i) {
      *request.mutable_batch() = batches[i % batches.size()];
      if (!stream->Write(request)) break;
    }
  });
  std::thread reader([&] {
    TrainResponse response;
    while (stream->Read(&response)) {
    }
  });
  while (Steps() < 20) std::this_thread::sleep_for(milliseconds(1));
  const int64_t before = Steps();
  server_->Shutdown(/*grace_seconds=*/5);
  // The stream stopped at a step boundary, not after the 5 s grace period:
  // counted in steps. (A loose bound: a step of this tiny model takes about
  // a millisecond, so on a loaded 2-core machine dozens may finish between
  // reading `before` and the shutdown taking hold; a stream that ran to the
  // grace period would take thousands.)
  const int64_t steps = Steps();
  EXPECT_LE(steps - before, 200);
  std::this_thread::sleep_for(milliseconds(50));
  EXPECT_EQ(Steps(), steps);
  writing = false;
  writer.join();
  reader.join();
  EXPECT_FALSE(stream->Finish().ok());

  // The same for a dataset job.
  Start(Tiny(), Options());
  JobRequest request;
  request.mutable_train()->mutable_synthetic();
  request.set_batch_size(64);
  request.set_max_steps(1000000000);
  JobStatus started;
  {
    grpc::ClientContext start_context;
    ASSERT_TRUE(trainer_->StartJob(&start_context, request, &started).ok());
  }
  WaitForJob(started.id(), [](const JobStatus& s) { return s.steps() > 20; });
  server_->Shutdown();
  const int64_t job_steps = Steps();
  std::this_thread::sleep_for(milliseconds(50));
  EXPECT_EQ(Steps(), job_steps);
}

// ------------------------------------------------------------ jobs

TEST_F(ServerTest, JobStartStatusCancel) {
  JobRequest request;
  request.mutable_train()->mutable_synthetic();  // endless
  request.mutable_eval()->mutable_synthetic()->set_num_samples(1024);
  request.set_batch_size(128);
  request.set_max_steps(1000000000);
  request.set_eval_interval(200);
  JobStatus started;
  ASSERT_TRUE(StartJob(request, &started).ok());
  EXPECT_EQ(started.id(), "job-1");
  const JobStatus running = WaitForJob(started.id(), [](const JobStatus& s) {
    return s.state() == JobStatus::RUNNING && s.steps() >= 210;
  });
  ASSERT_EQ(running.state(), JobStatus::RUNNING);
  EXPECT_GT(running.samples(), 0);
  EXPECT_GT(running.loss(), 0);
  EXPECT_GT(running.samples_per_second(), 0);
  EXPECT_GT(running.elapsed_seconds(), 0);
  EXPECT_EQ(running.eval().samples(), 1024);
  EXPECT_GT(running.eval_reference().auc(), 0.5);

  // One trainer at a time: a second job and a Train stream are refused.
  {
    grpc::ClientContext context;
    JobStatus second;
    const grpc::Status s = trainer_->StartJob(&context, request, &second);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
    EXPECT_HAS_SUBSTR(s.error_message(), "job job-1 is running")
        << s.error_message();
  }
  StreamOutcome stream = RunTrainStream(trainer_.get(), TrainBatches(1, 8, 3));
  EXPECT_EQ(stream.status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);

  JobStatus cancelled;
  {
    grpc::ClientContext context;
    JobId id;
    id.set_id(started.id());
    ASSERT_TRUE(trainer_->CancelJob(&context, id, &cancelled).ok());
  }
  EXPECT_EQ(cancelled.state(), JobStatus::CANCELLED);
  const int64_t steps = Steps();
  EXPECT_EQ(cancelled.steps(), steps);
  std::this_thread::sleep_for(milliseconds(50));
  EXPECT_EQ(Steps(), steps);
  JobStatus after;
  ASSERT_TRUE(GetJob(started.id(), &after).ok());
  EXPECT_EQ(after.state(), JobStatus::CANCELLED);

  // Training is free again.
  StreamOutcome again = RunTrainStream(trainer_.get(), TrainBatches(1, 8, 3));
  EXPECT_TRUE(again.status.ok()) << again.status.error_message();

  JobStatus missing;
  EXPECT_EQ(GetJob("job-99", &missing).error_code(),
            grpc::StatusCode::NOT_FOUND);
}

TEST_F(ServerTest, JobRunsToCompletionWithEvaluation) {
  JobRequest request;
  request.mutable_train()->mutable_synthetic()->set_num_samples(4096);
  request.mutable_eval()->mutable_synthetic()->set_num_samples(2048);
  request.set_batch_size(512);
  request.set_epochs(2);
  JobStatus started;
  ASSERT_TRUE(StartJob(request, &started).ok());
  const JobStatus done = WaitForJobEnd(started.id());
  ASSERT_EQ(done.state(), JobStatus::SUCCEEDED) << done.error();
  EXPECT_EQ(done.steps(), 16);
  EXPECT_EQ(done.samples(), 8192);
  EXPECT_EQ(done.eval().samples(), 2048);
  EXPECT_GT(done.eval().auc(), 0.5);
  EXPECT_GT(done.eval_reference().auc(), done.eval().auc() - 0.01);
  EXPECT_EQ(Steps(), 16);

  grpc::ClientContext context;
  ListJobsResponse list;
  ASSERT_TRUE(trainer_->ListJobs(&context, ListJobsRequest(), &list).ok());
  ASSERT_EQ(list.jobs_size(), 1);
  EXPECT_EQ(list.jobs(0).id(), started.id());
}

TEST_F(ServerTest, JobReadsCriteoTsvUnderDataDir) {
  // label, 4 integer features, 3 hex categoricals (the tiny model's shape).
  std::ofstream tsv(dir_ / "data" / "day.tsv");
  for (int i = 0; i < 300; ++i) {
    tsv << (i % 3 == 0 ? 1 : 0) << "\t" << i % 7 << "\t\t" << i % 11 << "\t"
        << i % 5 << "\t" << std::hex << 0x1000 + i << "\t\t" << 0xabc + 7 * i
        << std::dec << "\n";
  }
  tsv.close();
  JobRequest request;
  request.mutable_train()->mutable_criteo_tsv()->add_paths("day.tsv");
  request.set_batch_size(100);
  const JobStatus done = RunJob(request);
  ASSERT_EQ(done.state(), JobStatus::SUCCEEDED) << done.error();
  EXPECT_EQ(done.steps(), 3);
  EXPECT_EQ(done.samples(), 300);
}

TEST_F(ServerTest, BadJobRequestsAreRefused) {
  struct Case {
    std::function<void(JobRequest*)> set;
    grpc::StatusCode code;
    std::string message;
  };
  const std::vector<Case> cases = {
      {[](JobRequest* r) {}, grpc::StatusCode::INVALID_ARGUMENT,
       "train has no source"},
      {[](JobRequest* r) { r->mutable_train()->mutable_synthetic(); },
       grpc::StatusCode::INVALID_ARGUMENT, "set max_steps"},
      {[](JobRequest* r) {
         r->mutable_train()->mutable_criteo_tsv()->add_paths("missing.tsv");
       },
       grpc::StatusCode::NOT_FOUND, "missing.tsv"},
      {[](JobRequest* r) {
         r->mutable_train()->mutable_synthetic()->set_num_samples(10);
         r->set_batch_size(5000);
       },
       grpc::StatusCode::INVALID_ARGUMENT, "batch_size = 5000"},
      {[](JobRequest* r) {
         r->mutable_train()->mutable_synthetic()->set_num_samples(10);
         r->set_eval_interval(5);
       },
       grpc::StatusCode::INVALID_ARGUMENT, "eval_interval is set"},
  };
  for (const Case& c : cases) {
    JobRequest request;
    c.set(&request);
    grpc::ClientContext context;
    JobStatus status;
    const grpc::Status s = trainer_->StartJob(&context, request, &status);
    EXPECT_EQ(s.error_code(), c.code) << s.error_message();
    EXPECT_HAS_SUBSTR(s.error_message(), c.message) << s.error_message();
  }
  EXPECT_EQ(Steps(), 0);
}

// ------------------------------------------------------------ evaluation

TEST_F(ServerTest, EvaluateInlineAndDataset) {
  auto local = model::Model::Create(Tiny());
  ASSERT_TRUE(local.ok());
  EvaluateRequest inline_request;
  model::MetricsAccumulator expected;
  for (int i = 0; i < 2; ++i) {
    const data::Batch b = SyntheticBatch(Tiny(), 512, 40 + i);
    *inline_request.add_batches() = ToWire(b);
    expected.Add(LocalPredict(**local, b), b.labels);
  }
  const model::EvalMetrics want = expected.Compute();
  {
    grpc::ClientContext context;
    EvaluateResponse response;
    ASSERT_TRUE(trainer_->Evaluate(&context, inline_request, &response).ok());
    EXPECT_EQ(response.metrics().samples(), 1024);
    EXPECT_NEAR(response.metrics().auc(), want.auc, 1e-6);
    EXPECT_NEAR(response.metrics().log_loss(), want.log_loss, 1e-6);
    EXPECT_NEAR(response.metrics().accuracy(), want.accuracy, 1e-9);
    EXPECT_NEAR(response.metrics().ctr(), want.ctr, 1e-9);
    EXPECT_FALSE(response.has_reference());
  }
  {
    EvaluateRequest request;
    request.mutable_dataset()->mutable_synthetic();  // endless
    request.set_max_samples(3000);
    grpc::ClientContext context;
    EvaluateResponse response;
    ASSERT_TRUE(trainer_->Evaluate(&context, request, &response).ok());
    EXPECT_EQ(response.metrics().samples(), 3000);
    EXPECT_EQ(response.reference().samples(), 3000);
    EXPECT_GT(response.reference().auc(), 0.6);
    EXPECT_GT(response.metrics().ctr(), 0.05);
  }
  const std::vector<std::pair<EvaluateRequest, std::string>> bad = [&] {
    std::vector<std::pair<EvaluateRequest, std::string>> v;
    v.push_back({EvaluateRequest(), "set exactly one"});
    EvaluateRequest both = inline_request;
    both.mutable_dataset()->mutable_synthetic()->set_num_samples(10);
    v.push_back({both, "set exactly one"});
    EvaluateRequest endless;
    endless.mutable_dataset()->mutable_synthetic();
    v.push_back({endless, "set max_samples"});
    return v;
  }();
  for (const auto& [request, message] : bad) {
    grpc::ClientContext context;
    EvaluateResponse response;
    const grpc::Status s = trainer_->Evaluate(&context, request, &response);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_HAS_SUBSTR(s.error_message(), message) << s.error_message();
  }
  EXPECT_GT(MetricValue(AdminMetrics(), "dlrm_eval_runs_total"), 0);
}

// ------------------------------------------------------------ prediction

TEST_F(ServerTest, PredictEqualsModelPredictions) {
  auto local = model::Model::Create(Tiny());
  ASSERT_TRUE(local.ok());
  const data::Batch b = SyntheticBatch(Tiny(), 100, 9);
  PredictResponse response;
  ASSERT_TRUE(Predict(ToWire(b, /*labels=*/false), &response).ok());
  const std::vector<float> want = LocalPredict(**local, b);
  ASSERT_EQ(response.probabilities_size(), 100);
  for (int i = 0; i < 100; ++i) {
    EXPECT_NEAR(response.probabilities(i), want[i], 1e-6) << "sample " << i;
  }
}

// Predictions during a Train stream run beside its steps and say which
// step's weights answered: never past the stream's last step, never going
// back, and after the stream the final step's weights.
TEST_F(ServerTest, PredictCarriesTheStepOfItsWeights) {
  const data::Batch probe = SyntheticBatch(Tiny(), 16, 9);
  PredictResponse response;
  ASSERT_TRUE(Predict(ToWire(probe, /*labels=*/false), &response).ok());
  EXPECT_EQ(response.model_step(), 0);

  const std::vector<Batch> batches = TrainBatches(40, 256, /*seed=*/11);
  std::atomic<bool> done{false};
  std::vector<int64_t> steps;
  std::thread predicting([&] {
    while (!done.load()) {
      PredictResponse r;
      const grpc::Status s = Predict(ToWire(probe, /*labels=*/false), &r);
      ASSERT_TRUE(s.ok()) << s.error_message();
      steps.push_back(r.model_step());
    }
  });
  StreamOutcome out = RunTrainStream(trainer_.get(), batches);
  done.store(true);
  predicting.join();
  ASSERT_TRUE(out.status.ok()) << out.status.error_message();
  ASSERT_FALSE(steps.empty());
  for (size_t i = 0; i < steps.size(); ++i) {
    EXPECT_LE(steps[i], 40);
    if (i > 0) EXPECT_GE(steps[i], steps[i - 1]);
  }

  // The final weights: the in-process model's after the same 40 steps.
  auto local = model::Model::Create(Tiny());
  ASSERT_TRUE(local.ok());
  data::SyntheticOptions o;
  o.teacher_seed = Tiny().seed();
  o.sample_seed = 11;
  auto source = data::MakeSyntheticSource(Tiny(), o);
  ASSERT_TRUE(source.ok());
  data::Batch b;
  for (int i = 0; i < 40; ++i) {
    ASSERT_TRUE(*(*source)->Next(256, &b));
    ASSERT_TRUE((*local)->TrainStep(b).ok());
  }
  ASSERT_TRUE(Predict(ToWire(probe, /*labels=*/false), &response).ok());
  EXPECT_EQ(response.model_step(), 40);
  const std::vector<float> want = LocalPredict(**local, probe);
  ASSERT_EQ(response.probabilities_size(), probe.size);
  for (int i = 0; i < probe.size; ++i) {
    EXPECT_NEAR(response.probabilities(i), want[i], 1e-5) << "sample " << i;
  }
}

TEST_F(ServerTest, ConcurrentPredictsAreMicroBatched) {
  auto local = model::Model::Create(Tiny());
  ASSERT_TRUE(local.ok());
  constexpr int kClients = 16;
  std::vector<data::Batch> batches;
  std::vector<std::vector<float>> want;
  for (int i = 0; i < kClients; ++i) {
    batches.push_back(SyntheticBatch(Tiny(), 4 + i % 3, 200 + i));
    want.push_back(LocalPredict(**local, batches.back()));
  }
  // A few rounds at most: each releases all clients at once.
  for (int round = 0; round < 5; ++round) {
    std::latch go(kClients);
    std::vector<std::thread> clients;
    std::vector<PredictResponse> responses(kClients);
    std::vector<grpc::Status> statuses(kClients);
    for (int i = 0; i < kClients; ++i) {
      clients.emplace_back([&, i] {
        go.arrive_and_wait();
        statuses[i] = Predict(ToWire(batches[i], false), &responses[i]);
      });
    }
    for (std::thread& t : clients) t.join();
    for (int i = 0; i < kClients; ++i) {
      ASSERT_TRUE(statuses[i].ok()) << statuses[i].error_message();
      ASSERT_EQ(responses[i].probabilities_size(), batches[i].size);
      for (int s = 0; s < batches[i].size; ++s) {
        EXPECT_NEAR(responses[i].probabilities(s), want[i][s], 1e-5)
            << "client " << i << " sample " << s;
      }
    }
    const std::string text = AdminMetrics();
    const double calls = MetricValue(text, "dlrm_predict_batch_requests_count");
    const double requests =
        MetricValue(text, "dlrm_predict_batch_requests_sum");
    EXPECT_EQ(MetricValue(text, "dlrm_predict_latency_seconds_count"),
              kClients * (round + 1));
    if (requests > calls) return;  // some model call served > 1 request
  }
  FAIL() << "no model call joined more than one request";
}

// ------------------------------------------------------------ bad input

TEST_F(ServerTest, EveryBadInputIsRejectedAndChangesNothing) {
  const data::Batch base = SyntheticBatch(Tiny(), 8, 21);
  // Where sample 5's ids start in table 2.
  int64_t t2_sample5 = base.sparse[2].offsets[5];
  struct Case {
    std::string name;
    std::function<void(Batch*)> mutate;
    std::string message;  // as Predict / Train report it
    bool labels_only;     // only Train and Evaluate read labels
  };
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<Case> cases = {
      {"empty", [](Batch* b) { b->set_size(0); },
       "batch.size = 0: a batch needs at least 1 sample", false},
      {"oversized", [](Batch* b) { b->set_size(5000); },
       "batch.size = 5000 exceeds the limit of 4096 samples", false},
      {"dense count", [](Batch* b) { b->mutable_dense()->RemoveLast(); },
       "batch.dense has 31 values, expected size x num_dense_features = 8 x "
       "4 = 32",
       false},
      {"NaN dense", [&](Batch* b) { b->set_dense(5, nan); },
       "batch.dense[5] (sample 1, feature 1): value is NaN", false},
      {"Inf dense", [&](Batch* b) { b->set_dense(30, inf); },
       "batch.dense[30] (sample 7, feature 2): value is +Inf", false},
      {"sparse count", [](Batch* b) { b->mutable_sparse()->RemoveLast(); },
       "batch.sparse has 2 features, the model has 3 tables", false},
      {"lengths count",
       [](Batch* b) { b->mutable_sparse(1)->mutable_lengths()->RemoveLast(); },
       "batch.sparse[1].lengths has 7 entries, expected one per sample (8)",
       false},
      {"negative length",
       [](Batch* b) { b->mutable_sparse(1)->set_lengths(2, -1); },
       "batch.sparse[1].lengths[2] (sample 2): length -1 is negative", false},
      {"lengths sum", [](Batch* b) { b->mutable_sparse(0)->add_ids(0); },
       "batch.sparse[0].lengths sum to 8 but batch.sparse[0].ids has 9 ids",
       false},
      {"id out of range",
       [&](Batch* b) { b->mutable_sparse(2)->set_ids(t2_sample5, 100); },
       "batch.sparse[2].ids[" + std::to_string(t2_sample5) +
           "] (sample 5): id 100 out of range [0, 100)",
       false},
      {"negative id", [](Batch* b) { b->mutable_sparse(0)->set_ids(3, -1); },
       "batch.sparse[0].ids[3] (sample 3): id -1 out of range [0, 50)", false},
      {"label not 0/1", [](Batch* b) { b->set_labels(3, 0.5f); },
       "batch.labels[3] (sample 3): label 0.5 must be 0 or 1", true},
      {"NaN label", [&](Batch* b) { b->set_labels(2, nan); },
       "batch.labels[2] (sample 2): label nan must be 0 or 1", true},
      {"labels missing", [](Batch* b) { b->clear_labels(); },
       "batch.labels has 0 values, expected one per sample (8)", true},
  };
  const uint64_t checksum = Checksum();
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    Batch bad = ToWire(base);
    c.mutate(&bad);
    if (!c.labels_only) {
      PredictResponse response;
      const grpc::Status s = Predict(bad, &response);
      EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
      EXPECT_HAS_SUBSTR(s.error_message(), c.message) << s.error_message();
    }
    StreamOutcome out = RunTrainStream(trainer_.get(), {bad});
    EXPECT_EQ(out.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_HAS_SUBSTR(out.status.error_message(), c.message)
        << out.status.error_message();
    EXPECT_TRUE(out.results.empty());

    EvaluateRequest eval;
    *eval.add_batches() = ToWire(base);
    *eval.add_batches() = bad;
    grpc::ClientContext context;
    EvaluateResponse response;
    const grpc::Status s = trainer_->Evaluate(&context, eval, &response);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    std::string eval_message = c.message;
    for (size_t at = eval_message.find("batch."); at != std::string::npos;
         at = eval_message.find("batch.", at)) {
      eval_message.replace(at, 6, "batches[1].");
      at += 11;
    }
    EXPECT_HAS_SUBSTR(s.error_message(), eval_message) << s.error_message();
    EXPECT_EQ(Checksum(), checksum);
    EXPECT_EQ(Steps(), 0);
  }
  EXPECT_GE(MetricValue(AdminMetrics(),
                        "dlrm_grpc_requests_total{method=\"/dlrm.Predictor/"
                        "Predict\",code=\"INVALID_ARGUMENT\"}"),
            11);
}

TEST_F(ServerTest, OversizedMessageIsRefusedAndServingGoesOn) {
  // A 2.4 MB message against the fixture's 1 MiB limit.
  Batch huge = ToWire(SyntheticBatch(Tiny(), 4, 1), false);
  for (int i = 0; i < 600000; ++i) huge.add_dense(1.0f);
  PredictResponse response;
  const grpc::Status s = Predict(huge, &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
      << s.error_message();
  StreamOutcome out = RunTrainStream(trainer_.get(), {huge});
  EXPECT_EQ(out.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
      << out.status.error_message();
  EXPECT_EQ(Steps(), 0);
  // The server keeps serving, and training is free again.
  ASSERT_TRUE(
      Predict(ToWire(SyntheticBatch(Tiny(), 4, 1), false), &response).ok());
  EXPECT_EQ(response.probabilities_size(), 4);
  StreamOutcome again = RunTrainStream(trainer_.get(), TrainBatches(2, 16, 2));
  EXPECT_TRUE(again.status.ok()) << again.status.error_message();
  EXPECT_EQ(Steps(), 2);
}

// ------------------------------------------------------------ admin

TEST_F(ServerTest, ModelInfo) {
  grpc::ClientContext context;
  ModelInfo info;
  ASSERT_TRUE(admin_->GetModelInfo(&context, ModelInfoRequest(), &info).ok());
  EXPECT_EQ(info.config().tables_size(), 3);
  EXPECT_EQ(info.embedding_parameters(), EmbeddingParameterCount(Tiny()));
  EXPECT_EQ(info.dense_parameters(), DenseParameterCount(Tiny()));
  EXPECT_EQ(info.world_size(), 1);
  EXPECT_EQ(info.steps(), 0);
  EXPECT_FALSE(info.inference_only());
  EXPECT_HAS_SUBSTR(info.sharding_plan(), "rank 0");
  EXPECT_HAS_SUBSTR(info.sharding_plan(), "t2 (100 x 4)");
  // Weights only (SGD keeps no optimizer state): 4 bytes per parameter.
  EXPECT_EQ(info.memory_bytes().at("host"),
            4 * (info.embedding_parameters() + info.dense_parameters()));
}

TEST_F(ServerTest, CheckpointRoundTrip) {
  ASSERT_TRUE(
      RunTrainStream(trainer_.get(), TrainBatches(5, 64, 7)).status.ok());
  const uint64_t saved = Checksum();
  CheckpointResponse response;
  ASSERT_TRUE(Checkpoint("run1", /*save=*/true, &response).ok());
  EXPECT_EQ(response.step(), 5);
  EXPECT_GT(response.bytes(), 0);
  EXPECT_TRUE(fs::exists(dir_ / "checkpoints" / "run1"));

  ASSERT_TRUE(
      RunTrainStream(trainer_.get(), TrainBatches(3, 64, 8)).status.ok());
  EXPECT_NE(Checksum(), saved);
  EXPECT_EQ(Steps(), 8);

  // An absolute path inside --checkpoint-dir is fine too.
  ASSERT_TRUE(Checkpoint((dir_ / "checkpoints" / "run1").string(),
                         /*save=*/false, &response)
                  .ok());
  EXPECT_EQ(response.step(), 5);
  EXPECT_EQ(Checksum(), saved);
  EXPECT_EQ(Steps(), 5);

  EXPECT_EQ(Checkpoint("nothing-here", false, &response).error_code(),
            grpc::StatusCode::NOT_FOUND);
}

TEST_F(ServerTest, CheckpointPathEscapeIsRefused) {
  const std::vector<std::string> paths = {
      "../outside", "a/../../outside", (dir_ / "outside").string(), "/tmp", ""};
  for (const std::string& path : paths) {
    for (bool save : {true, false}) {
      CheckpointResponse response;
      const grpc::Status s = Checkpoint(path, save, &response);
      EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
          << path << ": " << s.error_message();
      EXPECT_HAS_SUBSTR(s.error_message(), "path");
    }
  }
  EXPECT_FALSE(fs::exists(dir_ / "outside"));
  // `..` that stays inside is fine.
  CheckpointResponse response;
  EXPECT_TRUE(Checkpoint("a/../inside", true, &response).ok());
  EXPECT_TRUE(fs::exists(dir_ / "checkpoints" / "inside"));
}

// Admin.ExportWeights on one rank: the file lands under --checkpoint-dir
// (its directory made), is byte for byte the export of a checkpoint taken at
// the same step, and a path leading outside the directory is refused.
TEST_F(ServerTest, ExportWeightsWritesTheServedWeightsUnderTheCheckpointDir) {
  ASSERT_TRUE(
      RunTrainStream(trainer_.get(), TrainBatches(5, 64, 7)).status.ok());
  auto export_weights = [&](const std::string& path, ExportResponse* r) {
    grpc::ClientContext context;
    ExportRequest request;
    request.set_path(path);
    return admin_->ExportWeights(&context, request, r);
  };
  ExportResponse exported;
  const grpc::Status s =
      export_weights("exports/weights.safetensors", &exported);
  ASSERT_TRUE(s.ok()) << s.error_message();
  const fs::path file = fs::weakly_canonical(dir_ / "checkpoints" / "exports" /
                                             "weights.safetensors");
  EXPECT_EQ(exported.path(), file.string());
  EXPECT_EQ(exported.bytes(), static_cast<int64_t>(fs::file_size(file)));
  EXPECT_EQ(exported.step(), 5);
  // Two layers per MLP, each a weight and a bias, and three tables.
  EXPECT_EQ(exported.tensors(), 2 * 2 + 2 * 2 + 3);

  // The export of a checkpoint taken at the same step, loaded, is the same
  // file, byte for byte.
  CheckpointResponse saved;
  ASSERT_TRUE(Checkpoint("at5", /*save=*/true, &saved).ok());
  auto loaded = model::LoadCheckpoint((dir_ / "checkpoints" / "at5").string(),
                                      /*weights_only=*/true);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  const fs::path again = dir_ / "again.safetensors";
  ASSERT_TRUE(model::ExportSafetensors(**loaded, again.string()).ok());
  auto read = [](const fs::path& path) {
    std::ifstream in(path, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  };
  EXPECT_EQ(read(file), read(again));
  auto weights = model::SafetensorsFile::Open(file.string());
  ASSERT_TRUE(weights.ok()) << weights.status();
  EXPECT_EQ((*weights)->metadata().at("step"), "5");
  EXPECT_TRUE((*weights)->Get("embedding_bags.t1.weight", {20, 4}).ok());

  for (const std::string& path :
       {std::string("../outside.safetensors"),
        (dir_ / "outside.safetensors").string(), std::string("")}) {
    ExportResponse r;
    const grpc::Status refused = export_weights(path, &r);
    EXPECT_EQ(refused.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << path << ": " << refused.error_message();
  }
  EXPECT_FALSE(fs::exists(dir_ / "outside.safetensors"));
}

TEST_F(ServerTest, InferenceOnlyServerServesButDoesNotTrain) {
  ASSERT_TRUE(
      RunTrainStream(trainer_.get(), TrainBatches(3, 64, 7)).status.ok());
  CheckpointResponse response;
  ASSERT_TRUE(Checkpoint("weights", true, &response).ok());
  const data::Batch b = SyntheticBatch(Tiny(), 16, 77);
  PredictResponse trained;
  ASSERT_TRUE(Predict(ToWire(b, false), &trained).ok());

  auto model = model::LoadCheckpoint(
      (dir_ / "checkpoints" / "weights").string(), /*weights_only=*/true);
  ASSERT_TRUE(model.ok()) << model.status();
  ServerOptions o = Options();
  o.inference_only = true;
  auto server = DlrmServer::Start(*std::move(model), o);
  ASSERT_TRUE(server.ok()) << server.status();
  auto channel = Connect((*server)->address());
  auto trainer = Trainer::NewStub(channel);
  auto predictor = Predictor::NewStub(channel);
  auto admin = Admin::NewStub(channel);

  PredictResponse served;
  {
    grpc::ClientContext context;
    PredictRequest request;
    *request.mutable_batch() = ToWire(b, false);
    ASSERT_TRUE(predictor->Predict(&context, request, &served).ok());
  }
  ASSERT_EQ(served.probabilities_size(), 16);
  for (int i = 0; i < 16; ++i) {
    EXPECT_FLOAT_EQ(served.probabilities(i), trained.probabilities(i));
  }
  EXPECT_EQ(
      RunTrainStream(trainer.get(), TrainBatches(1, 8, 1)).status.error_code(),
      grpc::StatusCode::FAILED_PRECONDITION);
  {
    grpc::ClientContext context;
    CheckpointRequest request;
    request.set_path("again");
    CheckpointResponse r;
    EXPECT_EQ(admin->SaveCheckpoint(&context, request, &r).error_code(),
              grpc::StatusCode::FAILED_PRECONDITION);
  }
  {
    grpc::ClientContext context;
    CheckpointRequest request;
    request.set_path("weights");
    CheckpointResponse r;
    EXPECT_TRUE(admin->RestoreCheckpoint(&context, request, &r).ok());
    EXPECT_EQ(r.step(), 3);
  }
  grpc::ClientContext context;
  ModelInfo info;
  ASSERT_TRUE(admin->GetModelInfo(&context, ModelInfoRequest(), &info).ok());
  EXPECT_TRUE(info.inference_only());
  EXPECT_EQ(info.steps(), 3);
}

// ------------------------------------------------------------ metrics

TEST_F(ServerTest, MetricsOverHttpParseAndNameTheSeries) {
  ASSERT_TRUE(
      RunTrainStream(trainer_.get(), TrainBatches(4, 64, 7)).status.ok());
  PredictResponse response;
  ASSERT_TRUE(
      Predict(ToWire(SyntheticBatch(Tiny(), 8, 3), false), &response).ok());
  {
    EvaluateRequest request;
    *request.add_batches() = ToWire(SyntheticBatch(Tiny(), 256, 4));
    grpc::ClientContext context;
    EvaluateResponse r;
    ASSERT_TRUE(trainer_->Evaluate(&context, request, &r).ok());
  }
  auto result = GetMetricsOverHttp();
  ASSERT_TRUE(result) << httplib::to_string(result.error());
  EXPECT_EQ(result->status, 200);
  EXPECT_HAS_SUBSTR(result->get_header_value("Content-Type"), "text/plain");
  const std::string& text = result->body;

  // Every line is a comment or `name{labels} value`.
  const std::regex sample(
      R"(^[a-zA-Z_:][a-zA-Z0-9_:]*(\{[a-zA-Z_][a-zA-Z0-9_]*="[^"]*"(,[a-zA-Z_][a-zA-Z0-9_]*="[^"]*")*\})? (NaN|[+-]Inf|[-+0-9.eE]+)$)");
  std::set<std::string> names;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    if (line[0] == '#') {
      EXPECT_TRUE(line.rfind("# HELP ", 0) == 0 ||
                  line.rfind("# TYPE ", 0) == 0)
          << line;
      continue;
    }
    EXPECT_TRUE(std::regex_match(line, sample)) << line;
    names.insert(line.substr(0, line.find_first_of("{ ")));
  }
  for (const char* name :
       {"dlrm_model_steps", "dlrm_train_steps_total",
        "dlrm_train_samples_total", "dlrm_train_samples_per_second",
        "dlrm_train_loss", "dlrm_train_stage_seconds",
        "dlrm_train_stage_seconds_total", "dlrm_train_queue_depth",
        "dlrm_train_queue_capacity", "dlrm_eval_auc", "dlrm_eval_log_loss",
        "dlrm_predict_latency_seconds_bucket",
        "dlrm_predict_latency_seconds_sum",
        "dlrm_predict_latency_seconds_count",
        "dlrm_predict_batch_samples_bucket", "dlrm_predict_batch_requests_sum",
        "dlrm_grpc_requests_total"}) {
    EXPECT_TRUE(names.count(name)) << name;
  }
  EXPECT_EQ(MetricValue(text, "dlrm_model_steps"), 4);
  EXPECT_EQ(MetricValue(text, "dlrm_train_samples_total"), 256);
  EXPECT_GT(MetricValue(text, "dlrm_train_samples_per_second"), 0);
  EXPECT_GT(MetricValue(text, "dlrm_train_loss"), 0);
  EXPECT_GT(MetricValue(text, "dlrm_eval_auc"), 0);
  EXPECT_GE(
      MetricValue(text, "dlrm_train_stage_seconds_total{stage=\"lookup\"}"), 0);
  EXPECT_EQ(MetricValue(text, "dlrm_predict_batch_samples_sum"), 8);
  EXPECT_EQ(MetricValue(text,
                        "dlrm_grpc_requests_total{method=\"/dlrm.Trainer/"
                        "Train\",code=\"OK\"}"),
            1);
  // Admin.GetMetrics serves the same series.
  const std::string admin = AdminMetrics();
  EXPECT_EQ(MetricValue(admin, "dlrm_train_samples_total"), 256);
  EXPECT_HAS_SUBSTR(admin, "dlrm_predict_latency_seconds_bucket");
}

// A table on RocksDB: model info names its tier and cache, and /metrics
// exports its cache and RocksDB counters, labelled by table.
TEST_F(ServerTest, RocksDbTableCacheMetricsOverHttp) {
  ASSERT_NO_FATAL_FAILURE(StartWithT2OnRocksDb());
  // 16 samples x up to 2 ids fit the 40-row cache; 12 batches touch more
  // than 40 of t2's 100 rows, so rows are evicted, written and read back.
  ASSERT_TRUE(
      RunTrainStream(trainer_.get(), TrainBatches(12, 16, 9)).status.ok());
  {
    grpc::ClientContext context;
    ModelInfo info;
    ASSERT_TRUE(admin_->GetModelInfo(&context, ModelInfoRequest(), &info).ok());
    EXPECT_HAS_SUBSTR(info.sharding_plan(),
                      "t2 (100 x 4): table-wise on rank 0; "
                      "on rocksdb with a cache of 40 rows")
        << info.sharding_plan();
    EXPECT_HAS_SUBSTR(info.sharding_plan(),
                      "t0 (50 x 4): table-wise on rank 0\n")
        << info.sharding_plan();
    // t2's rows as stored: 100 rows x 4 floats (SGD keeps no state).
    EXPECT_EQ(info.memory_bytes().at("rocksdb"), 100 * 4 * 4);
  }
  auto result = GetMetricsOverHttp();
  ASSERT_TRUE(result) << httplib::to_string(result.error());
  ASSERT_EQ(result->status, 200);
  const std::string& text = result->body;
  auto value = [&](const std::string& name) {
    return MetricValue(text, name + "{table=\"t2\",rank=\"0\"}");
  };
  EXPECT_EQ(value("dlrm_embedding_cache_rows"), 40);
  const double hits = value("dlrm_embedding_cache_hits_total");
  const double misses = value("dlrm_embedding_cache_misses_total");
  EXPECT_GT(hits, 0);
  EXPECT_GT(misses, 40);
  EXPECT_GT(value("dlrm_embedding_cache_evictions_total"), 0);
  EXPECT_GE(value("dlrm_embedding_cache_prefetch_hits_total"), 0);
  EXPECT_DOUBLE_EQ(value("dlrm_embedding_cache_hit_ratio"),
                   hits / (hits + misses));
  EXPECT_GE(value("dlrm_embedding_cache_prefetch_hit_ratio"), 0);
  // 16 bytes a row (4 floats).
  EXPECT_GT(value("dlrm_rocksdb_written_rows_total"), 0);
  EXPECT_EQ(value("dlrm_rocksdb_written_bytes_total"),
            16 * value("dlrm_rocksdb_written_rows_total"));
  EXPECT_GT(value("dlrm_rocksdb_read_rows_total"), 0);
  EXPECT_EQ(value("dlrm_rocksdb_read_bytes_total"),
            16 * value("dlrm_rocksdb_read_rows_total"));
  // The caches' write-backs and loads: RocksDB's writes and reads.
  EXPECT_EQ(value("dlrm_embedding_cache_written_back_rows_total"),
            value("dlrm_rocksdb_written_rows_total"));
  EXPECT_EQ(value("dlrm_embedding_cache_loaded_rows_total"),
            value("dlrm_rocksdb_read_rows_total"));
  // Host tables have no cache series.
  EXPECT_TRUE(std::isnan(
      MetricValue(text, "dlrm_embedding_cache_rows{table=\"t0\",rank=\"0\"}")));
}

// ServerMetrics' text (Render(3)) after one training step, `step`, whose
// stores reported `stores`.
std::string RenderAfterStep(int64_t step, std::vector<TableStoreStats> stores) {
  TrainStepOutcome outcome;
  outcome.step = step;
  outcome.stores = std::move(stores);
  ServerMetrics metrics;
  metrics.RecordTrainStep(outcome);
  return metrics.Render(3);
}

// A dynamic table's maps get the dlrm_dynamic_* series; one in host memory
// (no cache) gets no cache series, one on RocksDB both.
TEST(ServerMetricsTest, DynamicTablesGetTheirOwnSeries) {
  TableStoreStats host{"u", 1, 0, /*device=*/false, {}};
  host.dynamic = true;
  host.rows = 1000;
  host.metrics = {.ids_admitted = 300,
                  .ids_evicted = 20,
                  .ids_refused = 2,
                  .unknown_lookups = 7,
                  .ids_occupied = 280};
  TableStoreStats disk{"v", 0, 50, /*device=*/false, {}};
  disk.dynamic = true;
  disk.rows = 500;
  disk.metrics = {.hits = 4, .ids_occupied = 40};
  const std::string text = RenderAfterStep(2, {host, disk});
  const std::string u = "{table=\"u\",rank=\"1\"}";
  EXPECT_EQ(MetricValue(text, "dlrm_dynamic_capacity_rows" + u), 1000) << text;
  EXPECT_EQ(MetricValue(text, "dlrm_dynamic_occupied_rows" + u), 280);
  EXPECT_EQ(MetricValue(text, "dlrm_dynamic_ids_admitted_total" + u), 300);
  EXPECT_EQ(MetricValue(text, "dlrm_dynamic_ids_evicted_total" + u), 20);
  EXPECT_EQ(MetricValue(text, "dlrm_dynamic_ids_refused_total" + u), 2);
  EXPECT_EQ(MetricValue(text, "dlrm_dynamic_unknown_lookups_total" + u), 7);
  EXPECT_TRUE(std::isnan(MetricValue(text, "dlrm_embedding_cache_rows" + u)));
  const std::string v = "{table=\"v\",rank=\"0\"}";
  EXPECT_EQ(MetricValue(text, "dlrm_embedding_cache_rows" + v), 50);
  EXPECT_EQ(MetricValue(text, "dlrm_embedding_cache_hits_total" + v), 4);
  EXPECT_EQ(MetricValue(text, "dlrm_dynamic_occupied_rows" + v), 40);
}

// A device cache's counters (a STORAGE_DEVICE table with device_cache_rows)
// beside a RocksDB row cache's: labelled cache="device", with its hits,
// misses, evictions, write-backs and loads, and no RocksDB series (its
// reads and writes go to the tier behind it).
TEST(ServerMetricsTest, DeviceCacheCountersAreLabelledApart) {
  const TableStoreStats device{"g",
                               0,
                               480,
                               /*device=*/true,
                               {.hits = 70,
                                .misses = 30,
                                .prefetch_hits = 12,
                                .evictions = 9,
                                .rows_read = 30,
                                .rows_written = 8}};
  const TableStoreStats rocksdb{"r",
                                0,
                                40,
                                /*device=*/false,
                                {.hits = 5, .rows_read = 4, .rows_written = 2}};
  const std::string text = RenderAfterStep(3, {device, rocksdb});
  const std::string d = "{table=\"g\",rank=\"0\",cache=\"device\"}";
  EXPECT_EQ(MetricValue(text, "dlrm_embedding_cache_rows" + d), 480) << text;
  EXPECT_EQ(MetricValue(text, "dlrm_embedding_cache_hits_total" + d), 70);
  EXPECT_EQ(MetricValue(text, "dlrm_embedding_cache_misses_total" + d), 30);
  EXPECT_EQ(MetricValue(text, "dlrm_embedding_cache_prefetch_hits_total" + d),
            12);
  EXPECT_EQ(MetricValue(text, "dlrm_embedding_cache_evictions_total" + d), 9);
  EXPECT_EQ(
      MetricValue(text, "dlrm_embedding_cache_written_back_rows_total" + d), 8);
  EXPECT_EQ(MetricValue(text, "dlrm_embedding_cache_loaded_rows_total" + d),
            30);
  EXPECT_DOUBLE_EQ(MetricValue(text, "dlrm_embedding_cache_hit_ratio" + d),
                   0.7);
  EXPECT_TRUE(
      std::isnan(MetricValue(text, "dlrm_rocksdb_read_rows_total" + d)));
  EXPECT_TRUE(
      std::isnan(MetricValue(text, "dlrm_rocksdb_written_rows_total" + d)));
  const std::string r = "{table=\"r\",rank=\"0\"}";
  EXPECT_EQ(MetricValue(text, "dlrm_embedding_cache_hits_total" + r), 5);
  EXPECT_EQ(MetricValue(text, "dlrm_rocksdb_read_rows_total" + r), 4);
  EXPECT_EQ(MetricValue(text, "dlrm_rocksdb_written_rows_total" + r), 2);
  EXPECT_EQ(
      MetricValue(text, "dlrm_embedding_cache_written_back_rows_total" + r), 2);
}

// A dataset job reads one batch ahead and hands it to the step, so the
// rows of a RocksDB table's next batch load during the step before: the
// prefetch serves misses.
TEST_F(ServerTest, RocksDbJobPrefetchesTheNextBatch) {
  ASSERT_NO_FATAL_FAILURE(StartWithT2OnRocksDb());
  JobRequest request;
  request.mutable_train()->mutable_synthetic()->set_num_samples(12 * 16);
  request.set_batch_size(16);
  const JobStatus done = RunJob(request);
  ASSERT_EQ(done.state(), JobStatus::SUCCEEDED) << done.error();
  EXPECT_EQ(done.steps(), 12);
  const std::string text = server_->MetricsText();
  const double misses = MetricValue(
      text, "dlrm_embedding_cache_misses_total{table=\"t2\",rank=\"0\"}");
  const double prefetched = MetricValue(
      text,
      "dlrm_embedding_cache_prefetch_hits_total{table=\"t2\",rank=\"0\"}");
  EXPECT_GT(prefetched, 0) << text;
  EXPECT_LE(prefetched, misses);
}

// ------------------------------------------------------------ health
// (tests/support/health.h) and reflection, through generic calls built from
// the protocols' descriptors (neither ships C++ stubs in Debian's gRPC).

constexpr char kProtocols[] = R"pb(
  name: "server_test_protocols.proto"
  syntax: "proto3"
  message_type {
    name: "ServerReflectionRequest"
    field { name: "host" number: 1 type: TYPE_STRING label: LABEL_OPTIONAL }
    field {
      name: "list_services"
      number: 7
      type: TYPE_STRING
      label: LABEL_OPTIONAL
    }
  }
  message_type {
    name: "ServiceResponse"
    field { name: "name" number: 1 type: TYPE_STRING label: LABEL_OPTIONAL }
  }
  message_type {
    name: "ListServiceResponse"
    field {
      name: "service"
      number: 1
      type: TYPE_MESSAGE
      type_name: ".ServiceResponse"
      label: LABEL_REPEATED
    }
  }
  message_type {
    name: "ServerReflectionResponse"
    field {
      name: "list_services_response"
      number: 6
      type: TYPE_MESSAGE
      type_name: ".ListServiceResponse"
      label: LABEL_OPTIONAL
    }
  }
)pb";

class Protocols {
 public:
  Protocols() {
    google::protobuf::FileDescriptorProto file;
    EXPECT_TRUE(
        google::protobuf::TextFormat::ParseFromString(kProtocols, &file));
    EXPECT_NE(pool_.BuildFile(file), nullptr);
  }
  std::unique_ptr<google::protobuf::Message> New(const std::string& name) {
    return std::unique_ptr<google::protobuf::Message>(
        factory_.GetPrototype(pool_.FindMessageTypeByName(name))->New());
  }

 private:
  google::protobuf::DescriptorPool pool_;
  google::protobuf::DynamicMessageFactory factory_;
};

grpc::ByteBuffer ToBuffer(const google::protobuf::Message& m) {
  const std::string bytes = m.SerializeAsString();
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

bool FromBuffer(const grpc::ByteBuffer& buffer, google::protobuf::Message* m) {
  std::vector<grpc::Slice> slices;
  if (!buffer.Dump(&slices).ok()) return false;
  std::string bytes;
  for (const grpc::Slice& s : slices) {
    bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  return m->ParseFromString(bytes);
}

// Waits for the next completion-queue event; true when it succeeded.
bool Await(grpc::CompletionQueue* cq) {
  void* tag = nullptr;
  bool ok = false;
  return cq->Next(&tag, &ok) && ok;
}

TEST_F(ServerTest, HealthIsServing) {
  for (const std::string service :
       {"", "dlrm.Trainer", "dlrm.Predictor", "dlrm.Admin"}) {
    const absl::StatusOr<int> health = test::CheckHealth(channel_, service);
    ASSERT_TRUE(health.ok()) << service << ": " << health.status();
    EXPECT_EQ(*health, test::kHealthServing) << service;
  }
}

TEST_F(ServerTest, ReflectionListsTheServices) {
  Protocols protocols;
  grpc::GenericStub stub(channel_);
  grpc::CompletionQueue cq;
  grpc::ClientContext context;
  auto call = stub.PrepareCall(
      &context,
      "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", &cq);
  call->StartCall(nullptr);
  ASSERT_TRUE(Await(&cq));
  auto request = protocols.New("ServerReflectionRequest");
  request->GetReflection()->SetString(
      request.get(), request->GetDescriptor()->FindFieldByName("list_services"),
      "*");
  call->Write(ToBuffer(*request), nullptr);
  ASSERT_TRUE(Await(&cq));
  grpc::ByteBuffer reply;
  call->Read(&reply, nullptr);
  ASSERT_TRUE(Await(&cq));
  call->WritesDone(nullptr);
  ASSERT_TRUE(Await(&cq));
  grpc::Status status;
  call->Finish(&status, nullptr);
  ASSERT_TRUE(Await(&cq));
  ASSERT_TRUE(status.ok()) << status.error_message();

  auto response = protocols.New("ServerReflectionResponse");
  ASSERT_TRUE(FromBuffer(reply, response.get()));
  const auto* list_field =
      response->GetDescriptor()->FindFieldByName("list_services_response");
  const google::protobuf::Message& list =
      response->GetReflection()->GetMessage(*response, list_field);
  const auto* service_field = list.GetDescriptor()->FindFieldByName("service");
  std::set<std::string> names;
  for (int i = 0; i < list.GetReflection()->FieldSize(list, service_field);
       ++i) {
    const google::protobuf::Message& s =
        list.GetReflection()->GetRepeatedMessage(list, service_field, i);
    names.insert(s.GetReflection()->GetString(
        s, s.GetDescriptor()->FindFieldByName("name")));
  }
  for (const char* name : {"dlrm.Trainer", "dlrm.Predictor", "dlrm.Admin",
                           "grpc.health.v1.Health"}) {
    EXPECT_TRUE(names.count(name)) << name;
  }
}

// ------------------------------------------------------------ hardening

// True when every byte of `text` is printable ASCII.
bool Printable(const std::string& text) {
  return std::all_of(text.begin(), text.end(),
                     [](char c) { return c >= 0x20 && c < 0x7f; });
}

// The bytes of TrainRequests carrying `batches`.
std::vector<std::string> TrainMessages(const std::vector<Batch>& batches) {
  std::vector<std::string> out;
  for (const Batch& b : batches) {
    TrainRequest request;
    *request.mutable_batch() = b;
    out.push_back(request.SerializeAsString());
  }
  return out;
}

// Bytes no protobuf parser accepts: a varint that never ends.
const std::string kGarbage(24, '\xff');
// A TrainRequest cut short: field 1 promises 16 bytes, 3 follow.
const std::string kTruncated(
    "\x0a\x10"
    "abc",
    5);

class ServerDataPathTest : public ServerTest {
 protected:
  void SetUp() override {
    ServerTest::SetUp();
    // A secret beside the data directory, reachable only by leaving it.
    std::ofstream(dir_ / "secret.tsv") << "TOPSECRET:x:0:0:root\t1\t2\n";
    WriteTinyTsv(dir_ / "data" / "day.tsv", 50);
  }

  grpc::Status EvaluateTsv(const std::string& path) {
    EvaluateRequest request;
    request.mutable_dataset()->mutable_criteo_tsv()->add_paths(path);
    grpc::ClientContext context;
    EvaluateResponse response;
    return trainer_->Evaluate(&context, request, &response);
  }

  using ServerTest::StartJob;
  grpc::Status StartJob(const JobRequest& request) {
    JobStatus status;
    return StartJob(request, &status);
  }
};

TEST_F(ServerDataPathTest, PathsOutsideTheDataDirAreDeniedWithoutContent) {
  fs::create_symlink(dir_ / "secret.tsv", dir_ / "data" / "link.tsv");
  fs::create_directory_symlink(dir_, dir_ / "data" / "up");
  const uint64_t checksum = Checksum();
  const std::vector<std::string> paths = {
      (dir_ / "secret.tsv").string(),
      "../secret.tsv",
      "link.tsv",       // a symbolic link inside that leads out
      "up/secret.tsv",  // through a linked directory
      "/etc/passwd",
      "../missing.tsv",  // outside and absent: denied, not NOT_FOUND
  };
  for (const std::string& path : paths) {
    SCOPED_TRACE(path);
    std::vector<grpc::Status> refusals;
    refusals.push_back(EvaluateTsv(path));
    JobRequest train;
    train.mutable_train()->mutable_criteo_tsv()->add_paths(path);
    refusals.push_back(StartJob(train));
    JobRequest eval;
    eval.mutable_train()->mutable_synthetic()->set_num_samples(64);
    eval.mutable_eval()->mutable_criteo_tsv()->add_paths(path);
    refusals.push_back(StartJob(eval));
    JobRequest binary;
    binary.mutable_train()->set_criteo_binary(path);
    refusals.push_back(StartJob(binary));
    for (const grpc::Status& s : refusals) {
      EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED)
          << s.error_message();
      EXPECT_HAS_SUBSTR(s.error_message(), "\"" + path + "\"")
          << s.error_message();
      EXPECT_NO_SUBSTR(s.error_message(), "SECRET") << s.error_message();
      EXPECT_NO_SUBSTR(s.error_message(), "root") << s.error_message();
    }
  }
  EXPECT_EQ(Checksum(), checksum);
  EXPECT_EQ(Steps(), 0);
  grpc::ClientContext context;
  ListJobsResponse jobs;
  ASSERT_TRUE(trainer_->ListJobs(&context, ListJobsRequest(), &jobs).ok());
  EXPECT_EQ(jobs.jobs_size(), 0);
  // Inside the directory, `..` that stays in and an absolute path are fine.
  fs::create_directories(dir_ / "data" / "sub");
  EXPECT_TRUE(EvaluateTsv("sub/../day.tsv").ok());
  const grpc::Status inside = EvaluateTsv((dir_ / "data" / "day.tsv").string());
  EXPECT_TRUE(inside.ok()) << inside.error_message();
}

TEST_F(ServerDataPathTest, ParseErrorsNameFileLineAndColumnAndQuoteLittle) {
  // Line 2's label: control bytes, then 60 bytes of which only the first
  // 32 (escaped) may come back.
  const std::string label = std::string("\x01\x1b[2J", 5) +
                            std::string(27, 'a') + "TAILSECRET" +
                            std::string(23, 'b');
  {
    std::ofstream out(dir_ / "data" / "bad.tsv");
    out << "0\t1\t2\t3\t4\t1\t2\t3\n" << label << "\t1\t2\t3\t4\t1\t2\t3\n";
  }
  const uint64_t checksum = Checksum();
  const grpc::Status s = EvaluateTsv("bad.tsv");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  const std::string& m = s.error_message();
  EXPECT_HAS_SUBSTR(m, "bad.tsv:2: column 0 (label): label '\\x01\\x1b[2Jaaa")
      << m;
  EXPECT_HAS_SUBSTR(m, "a...' must be 0 or 1") << m;
  EXPECT_NO_SUBSTR(m, "TAILSECRET") << m;
  EXPECT_TRUE(Printable(m)) << m;

  // A job on the file fails the same way; its error is escaped too.
  JobRequest request;
  request.mutable_train()->mutable_criteo_tsv()->add_paths("bad.tsv");
  request.set_batch_size(10);
  const JobStatus done = RunJob(request);
  EXPECT_EQ(done.state(), JobStatus::FAILED);
  EXPECT_HAS_SUBSTR(done.error(), "bad.tsv:2: column 0 (label)")
      << done.error();
  EXPECT_NO_SUBSTR(done.error(), "TAILSECRET");
  EXPECT_TRUE(Printable(done.error())) << done.error();
  EXPECT_EQ(Checksum(), checksum);
}

TEST_F(ServerDataPathTest, AllowDataPathAddsDirectoriesAndNoMore) {
  fs::create_directories(dir_ / "extra");
  fs::create_directories(dir_ / "other");
  WriteTinyTsv(dir_ / "extra" / "more.tsv", 40);
  WriteTinyTsv(dir_ / "other" / "more.tsv", 40);
  fs::create_symlink(dir_ / "other" / "more.tsv", dir_ / "extra" / "out.tsv");
  fs::create_symlink(dir_ / "data" / "day.tsv", dir_ / "extra" / "in.tsv");
  ServerOptions o = Options();
  o.allowed_data_dirs = {(dir_ / "extra").string()};
  Start(Tiny(), o);
  const grpc::Status extra =
      EvaluateTsv((dir_ / "extra" / "more.tsv").string());
  EXPECT_TRUE(extra.ok()) << extra.error_message();
  // A link from one allowed directory into another is fine.
  EXPECT_TRUE(EvaluateTsv((dir_ / "extra" / "in.tsv").string()).ok());
  // Relative paths still resolve under --data-dir.
  EXPECT_TRUE(EvaluateTsv("day.tsv").ok());
  EXPECT_EQ(EvaluateTsv("more.tsv").error_code(), grpc::StatusCode::NOT_FOUND);
  for (const fs::path& p :
       {dir_ / "other" / "more.tsv", dir_ / "extra" / "out.tsv",
        dir_ / "extra" / ".." / "other" / "more.tsv"}) {
    EXPECT_EQ(EvaluateTsv(p.string()).error_code(),
              grpc::StatusCode::PERMISSION_DENIED)
        << p;
  }
  // Start refuses an empty entry.
  o.allowed_data_dirs.push_back("");
  auto model = model::Model::Create(Tiny());
  ASSERT_TRUE(model.ok());
  EXPECT_EQ(DlrmServer::Start(*std::move(model), o).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(ServerDataPathTest, WithoutDataDirOnlySyntheticDataIsRead) {
  ServerOptions o = Options();
  o.data_dir.clear();
  Start(Tiny(), o);
  for (const std::string& path :
       {(dir_ / "data" / "day.tsv").string(), std::string("day.tsv")}) {
    const grpc::Status s = EvaluateTsv(path);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << path;
    EXPECT_HAS_SUBSTR(s.error_message(), "--data-dir") << s.error_message();
  }
  EvaluateRequest synthetic;
  synthetic.mutable_dataset()->mutable_synthetic()->set_num_samples(500);
  grpc::ClientContext context;
  EvaluateResponse response;
  const grpc::Status s = trainer_->Evaluate(&context, synthetic, &response);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(response.metrics().samples(), 500);
}

TEST_F(ServerDataPathTest, ErrorMessagesEscapeControlBytes) {
  // A NUL byte in a checkpoint path: refused before it reaches the file
  // system, and named escaped.
  const std::string nul_path("ck\0pt\n", 6);
  for (bool save : {true, false}) {
    CheckpointResponse response;
    const grpc::Status s = Checkpoint(nul_path, save, &response);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_HAS_SUBSTR(s.error_message(), "\"ck\\x00pt\\n\" contains a NUL byte")
        << s.error_message();
    EXPECT_TRUE(Printable(s.error_message())) << s.error_message();
  }
  EXPECT_EQ(EvaluateTsv(nul_path).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  // A newline and DEL in a dataset path inside the data directory.
  const grpc::Status missing = EvaluateTsv("a\nb\x7f.tsv");
  EXPECT_EQ(missing.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_HAS_SUBSTR(missing.error_message(), "a\\nb\\x7f.tsv")
      << missing.error_message();
  EXPECT_TRUE(Printable(missing.error_message())) << missing.error_message();
}

TEST_F(ServerTest, BusyTrainingNamesNoClientAddress) {
  // A stream that holds training: one batch trained, its result read.
  grpc::ClientContext holder_context;
  const std::unique_ptr<test::TrainStream> holder = test::TrainedOneBatch(
      *trainer_, &holder_context, TrainBatches(1, 16, 3)[0]);
  ASSERT_NE(holder, nullptr);

  const StreamOutcome second =
      RunTrainStream(trainer_.get(), TrainBatches(1, 16, 4));
  EXPECT_EQ(second.status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  JobRequest job;
  job.mutable_train()->mutable_synthetic()->set_num_samples(64);
  grpc::ClientContext context;
  JobStatus started;
  const grpc::Status job_status = trainer_->StartJob(&context, job, &started);
  EXPECT_EQ(job_status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  for (const grpc::Status& s : {second.status, job_status}) {
    EXPECT_HAS_SUBSTR(s.error_message(),
                      "training is busy: a Train stream is "
                      "running")
        << s.error_message();
    // The holder's peer is "ipv4:127.0.0.1:PORT".
    EXPECT_NO_SUBSTR(s.error_message(), "127.0.0.1") << s.error_message();
    EXPECT_NO_SUBSTR(s.error_message(), "ipv4") << s.error_message();
  }
  holder->WritesDone();
  EXPECT_TRUE(holder->Finish().ok());
  EXPECT_EQ(Steps(), 1);
}

TEST_F(ServerTest, UnparseableTrainMessageEndsTheStreamAfterEarlierResults) {
  const std::vector<std::string> good = TrainMessages(TrainBatches(2, 64, 8));
  const test::RawStreamReply reply = test::RawStreamCall(
      channel_, "/dlrm.Trainer/Train", {good[0], kGarbage, good[1]});
  EXPECT_EQ(reply.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(reply.status.error_message(),
            "stream message 1 could not be parsed as TrainRequest");
  ASSERT_EQ(reply.messages.size(), 1u);
  TrainResponse first;
  ASSERT_TRUE(first.ParseFromString(reply.messages[0]));
  EXPECT_EQ(first.result().step(), 1);
  EXPECT_EQ(first.result().samples(), 64);
  EXPECT_EQ(Steps(), 1);
  EXPECT_EQ(MetricValue(server_->MetricsText(),
                        "dlrm_grpc_requests_total{method=\"/dlrm.Trainer/"
                        "Train\",code=\"INVALID_ARGUMENT\"}"),
            1);
}

TEST_F(ServerTest, StreamOfOnlyUnparseableBytesTrainsNothing) {
  const uint64_t checksum = Checksum();
  for (const std::string& bad : {kGarbage, kTruncated}) {
    const test::RawStreamReply reply =
        test::RawStreamCall(channel_, "/dlrm.Trainer/Train", {bad});
    EXPECT_EQ(reply.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_EQ(reply.status.error_message(),
              "stream message 0 could not be parsed as TrainRequest");
    EXPECT_TRUE(reply.messages.empty());
  }
  EXPECT_EQ(Checksum(), checksum);
  EXPECT_EQ(Steps(), 0);
  // Training came free: a good stream runs.
  const StreamOutcome next =
      RunTrainStream(trainer_.get(), TrainBatches(1, 32, 9));
  EXPECT_TRUE(next.status.ok()) << next.status.error_message();
  EXPECT_EQ(Steps(), 1);
}

TEST_F(ServerTest, RawStreamsThatHalfCloseEndOk) {
  // No message at all, then two good ones: a clean half-close is OK.
  const test::RawStreamReply empty =
      test::RawStreamCall(channel_, "/dlrm.Trainer/Train", {});
  EXPECT_TRUE(empty.status.ok()) << empty.status.error_message();
  EXPECT_TRUE(empty.messages.empty());
  const test::RawStreamReply two = test::RawStreamCall(
      channel_, "/dlrm.Trainer/Train", TrainMessages(TrainBatches(2, 16, 10)));
  EXPECT_TRUE(two.status.ok()) << two.status.error_message();
  EXPECT_EQ(two.messages.size(), 2u);
  EXPECT_EQ(Steps(), 2);
}

TEST_F(ServerTest, UnparseablePredictIsInvalidArgument) {
  const uint64_t checksum = Checksum();
  for (const std::string& bad : {kGarbage, kTruncated}) {
    const test::RawUnaryReply reply =
        test::RawUnaryCall(channel_, "/dlrm.Predictor/Predict", bad);
    EXPECT_EQ(reply.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_EQ(reply.status.error_message(),
              "request could not be parsed as PredictRequest");
  }
  // Good bytes on the same raw path answer as the generated client gets.
  PredictRequest request;
  *request.mutable_batch() = ToWire(SyntheticBatch(Tiny(), 5, 11), false);
  const test::RawUnaryReply good = test::RawUnaryCall(
      channel_, "/dlrm.Predictor/Predict", request.SerializeAsString());
  ASSERT_TRUE(good.status.ok()) << good.status.error_message();
  PredictResponse response;
  ASSERT_TRUE(response.ParseFromString(good.bytes));
  EXPECT_EQ(response.probabilities_size(), 5);
  EXPECT_EQ(Checksum(), checksum);
  EXPECT_EQ(MetricValue(server_->MetricsText(),
                        "dlrm_grpc_requests_total{method=\"/dlrm.Predictor/"
                        "Predict\",code=\"INVALID_ARGUMENT\"}"),
            2);
}

// ------------------------------------------------------------ the binary

using test::ServerBinary;

TEST(ServerBinaryTest, StartsOnPortZeroAndExitsCleanlyOnSigterm) {
  const std::string binary = ServerBinary();
  ASSERT_TRUE(fs::exists(binary))
      << binary << " is missing: build the dlrm_server target";
  test::SpawnOptions options;
  options.stdout_pipe = true;
  const test::Child child =
      test::Spawn({binary, "--config", "tiny", "--listen", "127.0.0.1:0",
                   "--metrics-listen", "127.0.0.1:0", "--log-level", "warn"},
                  options);
  ASSERT_NE(child.pid, -1);
  // Read the first line, with a deadline.
  std::string line;
  const auto deadline = std::chrono::steady_clock::now() + milliseconds(20000);
  while (line.find('\n') == std::string::npos &&
         std::chrono::steady_clock::now() < deadline) {
    pollfd p{child.out_fd, POLLIN, 0};
    if (poll(&p, 1, 100) <= 0) continue;
    char buffer[256];
    const ssize_t n = read(child.out_fd, buffer, sizeof(buffer));
    if (n <= 0) break;
    line.append(buffer, n);
  }
  close(child.out_fd);
  std::smatch match;
  const bool parsed = std::regex_search(
      line, match,
      std::regex(R"(^dlrm_server: listening on (127\.0\.0\.1:(\d+)) metrics )"
                 R"(127\.0\.0\.1:(\d+)\n)"));
  EXPECT_TRUE(parsed) << "first line: " << line;
  if (parsed) {
    EXPECT_NE(match[2], "0");
    auto admin = Admin::NewStub(Connect(match[1]));
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + milliseconds(5000));
    ModelInfo info;
    const grpc::Status s =
        admin->GetModelInfo(&context, ModelInfoRequest(), &info);
    EXPECT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(info.config().tables_size(), 3);
  }
  ASSERT_EQ(kill(child.pid, SIGTERM), 0);
  // Its exit code (128 + the signal when one ended it), -2 when it was
  // still running 30 s after SIGTERM (then it is killed).
  const int code = test::WaitExit(child.pid, 30);
  ASSERT_NE(code, -2) << "dlrm_server did not exit after SIGTERM";
  EXPECT_EQ(code, 0);
}

// ------------------------------------------------------------ units

TEST(ResolveUnderTest, KeepsPathsInsideTheRoot) {
  const fs::path root = MakeTempDir("resolve");
  auto inside = ResolveUnder(root.string(), "a/b", "path");
  ASSERT_TRUE(inside.ok());
  EXPECT_EQ(*inside, (fs::weakly_canonical(root) / "a" / "b").string());
  EXPECT_EQ(ResolveUnder(root.string(), "../x", "path").status().code(),
            absl::StatusCode::kInvalidArgument);
  // A symbolic link that leads out is an escape too.
  fs::create_directory_symlink("/tmp", root / "link");
  EXPECT_EQ(ResolveUnder(root.string(), "link/x", "path").status().code(),
            absl::StatusCode::kInvalidArgument);
  // No root: any path as given.
  EXPECT_EQ(*ResolveUnder("", "../x", "path"), "../x");
  fs::remove_all(root);
}

TEST(ResolveDataPathTest, ReadsOnlyInsideTheAllowedDirectories) {
  const fs::path root = MakeTempDir("datapath");
  fs::create_directories(root / "data" / "sub");
  fs::create_directories(root / "extra");
  fs::create_symlink(root / "extra", root / "data" / "to_extra");
  fs::create_symlink(root, root / "data" / "to_root");
  DataPathOptions o;
  // Neither set: no file at all.
  EXPECT_EQ(ResolveDataPath(o, "x.tsv", "f").status().code(),
            absl::StatusCode::kPermissionDenied);
  o.data_dir = (root / "data").string();
  const fs::path data = fs::canonical(root / "data");
  EXPECT_EQ(*ResolveDataPath(o, "sub/../x.tsv", "f"),
            (data / "x.tsv").string());
  EXPECT_EQ(*ResolveDataPath(o, (data / "x.tsv").string(), "f"),
            (data / "x.tsv").string());
  for (const std::string out :
       {"../x.tsv", "to_extra/x.tsv", "to_root/x.tsv", "/etc/passwd", "/"}) {
    absl::StatusOr<std::string> r = ResolveDataPath(o, out, "f");
    EXPECT_EQ(r.status().code(), absl::StatusCode::kPermissionDenied) << out;
    EXPECT_HAS_SUBSTR(r.status().message(), "f = \"" + out + "\"")
        << r.status();
  }
  o.allowed_dirs = {(root / "extra").string()};
  EXPECT_EQ(*ResolveDataPath(o, "to_extra/x.tsv", "f"),
            (fs::canonical(root / "extra") / "x.tsv").string());
  EXPECT_EQ(ResolveDataPath(o, "to_root/x.tsv", "f").status().code(),
            absl::StatusCode::kPermissionDenied);
  // Malformed paths are InvalidArgument, named escaped.
  EXPECT_EQ(ResolveDataPath(o, "", "f").status().code(),
            absl::StatusCode::kInvalidArgument);
  absl::StatusOr<std::string> nul =
      ResolveDataPath(o, std::string("x\0y", 3), "f");
  EXPECT_EQ(nul.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_HAS_SUBSTR(nul.status().message(), "x\\x00y") << nul.status();
  o.allowed_dirs.push_back("");
  EXPECT_EQ(o.Validate().code(), absl::StatusCode::kInvalidArgument);
  fs::remove_all(root);
}

// One TorchRec-style day of `n` samples for the tiny preset (4 dense, 3
// one-hot columns) named PREFIX_{dense,sparse,labels}.npy.
void WriteTinyNpyDay(const fs::path& prefix, int n) {
  std::vector<float> dense(n * 4), labels(n);
  std::vector<int32_t> sparse(n * 3);
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < 4; ++j) dense[i * 4 + j] = 0.25f * (i + j);
    for (int t = 0; t < 3; ++t) sparse[i * 3 + t] = -7 * i + t;
    labels[i] = i % 2;
  }
  const std::string p = prefix.string();
  ASSERT_TRUE(testing_npy::WriteNpy(p + "_dense.npy", "<f4", dense, n, 4));
  ASSERT_TRUE(testing_npy::WriteNpy(p + "_sparse.npy", "<i4", sparse, n, 3));
  ASSERT_TRUE(testing_npy::WriteNpy(p + "_labels.npy", "<f4", labels, n, 0));
}

TEST(ResolveDatasetTest, SyntheticVocabularyAndDriftReachTheSource) {
  DatasetSpec spec;
  SyntheticData* s = spec.mutable_synthetic();
  s->set_num_samples(64);
  s->set_vocabulary(100000);
  s->set_drift(0.5);
  s->set_drift_start(1000);
  const auto resolve = [&](const DatasetSpec& d) {
    return ResolveDataset(d, Tiny(), DataPathOptions{}, DatasetRole::kEval,
                          "eval");
  };
  absl::StatusOr<DatasetSpec> resolved = resolve(spec);
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  EXPECT_EQ(resolved->synthetic().vocabulary(), 100000);
  EXPECT_EQ(resolved->synthetic().drift_start(), 1000);

  // Tiny's static tables (50, 20, 100 rows) take the vocabulary modulo
  // their rows, so there is no teacher reference; with every table dynamic
  // the ids are the teacher's, unreduced.
  absl::StatusOr<OpenedDataset> opened =
      OpenResolvedDataset(*resolved, Tiny(), "eval");
  ASSERT_TRUE(opened.ok()) << opened.status();
  EXPECT_FALSE(opened->reference);
  data::Batch batch;
  ASSERT_TRUE(*opened->source->Next(64, &batch));
  EXPECT_TRUE(batch.Validate(4, data::TableIdLimits(Tiny())).ok());
  ModelConfig dynamic = Tiny();
  for (TableConfig& t : *dynamic.mutable_tables()) t.set_dynamic(true);
  opened = OpenResolvedDataset(*resolved, dynamic, "eval");
  ASSERT_TRUE(opened.ok()) << opened.status();
  EXPECT_TRUE(opened->reference);
  ASSERT_TRUE(*opened->source->Next(64, &batch));
  EXPECT_TRUE(batch.Validate(4, data::TableIdLimits(dynamic)).ok());
  EXPECT_GE(
      *std::max_element(batch.sparse[0].ids.begin(), batch.sparse[0].ids.end()),
      50);

  const auto expect_invalid = [&](const DatasetSpec& d,
                                  const std::string& text) {
    const absl::Status st = resolve(d).status();
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    EXPECT_NE(st.message().find(text), std::string::npos) << st;
  };
  DatasetSpec bad = spec;
  bad.mutable_synthetic()->set_vocabulary(-1);
  expect_invalid(bad, "eval.synthetic.vocabulary = -1");
  bad = spec;
  bad.mutable_synthetic()->set_vocabulary(0);
  expect_invalid(bad, "eval.synthetic.drift = 0.5 needs a vocabulary");
  bad = spec;
  bad.mutable_synthetic()->set_drift(-1);
  expect_invalid(bad, "eval.synthetic.drift = -1");
  bad = spec;
  bad.mutable_synthetic()->set_drift_start(-2);
  expect_invalid(bad, "eval.synthetic.drift_start = -2");
}

TEST(ResolveDatasetTest, NumpyDaysResolveToTheirFilesInsideTheAllowedDirs) {
  const fs::path root = MakeTempDir("npydays");
  fs::create_directories(root / "data");
  fs::create_directories(root / "outside");
  WriteTinyNpyDay(root / "data" / "day_0", 9);
  WriteTinyNpyDay(root / "outside" / "day_1", 9);
  fs::copy_file(root / "outside" / "day_1_dense.npy",
                root / "data" / "day_1_dense.npy");
  fs::copy_file(root / "outside" / "day_1_sparse.npy",
                root / "data" / "day_1_sparse.npy");
  fs::create_symlink(root / "outside" / "day_1_labels.npy",
                     root / "data" / "day_1_labels.npy");
  DataPathOptions o;
  o.data_dir = (root / "data").string();
  const fs::path data = fs::canonical(root / "data");
  const auto spec = [](std::vector<std::string> paths) {
    DatasetSpec s;
    s.mutable_criteo_npy();
    for (const std::string& p : paths) s.mutable_criteo_npy()->add_paths(p);
    return s;
  };
  absl::StatusOr<DatasetSpec> resolved =
      ResolveDataset(spec({"day_0"}), Tiny(), o, DatasetRole::kTrain, "train");
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  ASSERT_EQ(resolved->criteo_npy().paths_size(), 3);
  EXPECT_EQ(resolved->criteo_npy().paths(0),
            (data / "day_0_dense.npy").string());
  EXPECT_EQ(resolved->criteo_npy().paths(1),
            (data / "day_0_sparse.npy").string());
  EXPECT_EQ(resolved->criteo_npy().paths(2),
            (data / "day_0_labels.npy").string());
  // Another rank opens the same day from the resolved spec.
  absl::StatusOr<OpenedDataset> opened =
      OpenResolvedDataset(*resolved, Tiny(), "train");
  ASSERT_TRUE(opened.ok()) << opened.status();
  data::Batch batch;
  ASSERT_TRUE(*opened->source->Next(100, &batch));
  EXPECT_EQ(batch.size, 9);
  EXPECT_EQ(batch.dense[5], 0.25f * 2);
  EXPECT_EQ(batch.labels[3], 1.0f);
  EXPECT_TRUE(batch.Validate(4, std::vector<int64_t>{50, 20, 100}).ok());
  // int32 -7 is 0xfffffff9: row 4294967289 % 50 = 39 of table 0.
  EXPECT_EQ(batch.sparse[0].ids[1], 39);

  // A prefix outside, and a link among a day's files that leads out.
  absl::StatusOr<DatasetSpec> out = ResolveDataset(
      spec({"../outside/day_1"}), Tiny(), o, DatasetRole::kTrain, "train");
  EXPECT_EQ(out.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_HAS_SUBSTR(out.status().message(), "train.criteo_npy.paths[0]")
      << out.status();
  absl::StatusOr<DatasetSpec> link =
      ResolveDataset(spec({"day_1"}), Tiny(), o, DatasetRole::kTrain, "train");
  EXPECT_EQ(link.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_HAS_SUBSTR(link.status().message(), "train.criteo_npy day 0")
      << link.status();
  absl::StatusOr<DatasetSpec> missing =
      ResolveDataset(spec({"day_7"}), Tiny(), o, DatasetRole::kTrain, "train");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_HAS_SUBSTR(missing.status().message(), "day_7_sparse.npy")
      << missing.status();
  EXPECT_EQ(ResolveDataset(spec({}), Tiny(), o, DatasetRole::kTrain, "train")
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  fs::remove_all(root);
}

// ------------------------------------------------------------ job resume

// OpenMP's thread count is per thread: the host applies compute_threads on
// whichever thread makes a model call (jobs, streams and the batcher run on
// their own threads, which main()'s setting never reaches).
TEST(ModelHostThreadsTest, ModelCallsRunWithTheConfiguredThreads) {
  auto model = model::Model::Create(Tiny());
  ASSERT_TRUE(model.ok()) << model.status();
  ModelHostOptions o;
  o.compute_threads = 1;
  auto host = ModelHost::Create(*std::move(model), o);
  ASSERT_TRUE(host.ok()) << host.status();
  const data::Batch batch = SyntheticBatch(Tiny(), 16, 3);
  int train_threads = 0, predict_threads = 0;
  std::thread trainer([&] {
    omp_set_num_threads(2);
    auto lease = (*host)->AcquireTraining("test");
    ASSERT_TRUE(lease.ok()) << lease.status();
    ASSERT_TRUE((*host)->TrainStep(*lease, batch).ok());
    train_threads = omp_get_max_threads();
  });
  trainer.join();
  std::thread predictor([&] {
    omp_set_num_threads(2);
    std::vector<float> probs;
    ASSERT_TRUE((*host)->Predict(batch, &probs).ok());
    predict_threads = omp_get_max_threads();
  });
  predictor.join();
  EXPECT_EQ(train_threads, 1);
  EXPECT_EQ(predict_threads, 1);
  ModelHostOptions bad;
  bad.compute_threads = -1;
  EXPECT_EQ(bad.Validate().code(), absl::StatusCode::kInvalidArgument);
}

// The JobManager's side of jobs surviving a crash, in-process: what a
// periodic checkpoint records, damaged records refused (naming the field),
// a job stopped by shutdown handed over and resumed, end markers.
class JobResumeTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = MakeTempDir("jobs"); }
  void TearDown() override { fs::remove_all(dir_); }

  std::unique_ptr<ModelHost> Host(int64_t every_steps) {
    auto model = model::Model::Create(Tiny());
    EXPECT_TRUE(model.ok()) << model.status();
    ModelHostOptions o;
    o.checkpoint_dir = dir_.string();
    o.checkpoint_every_steps = every_steps;
    o.keep_checkpoints = 0;
    auto host = ModelHost::Create(*std::move(model), o);
    EXPECT_TRUE(host.ok()) << host.status();
    return *std::move(host);
  }

  JobManagerOptions Options() const {
    JobManagerOptions o = Unrecorded();
    o.state_dir = dir_.string();
    return o;
  }

  // No end markers; dataset files read from dir_.
  JobManagerOptions Unrecorded() const {
    JobManagerOptions o;
    o.data_paths.data_dir = dir_.string();
    return o;
  }

  static JobRequest Request(int64_t samples) {
    JobRequest r;
    r.mutable_train()->mutable_synthetic()->set_num_samples(samples);
    r.set_batch_size(10);
    r.set_epochs(2);
    return r;
  }

  // Waits for a terminal state.
  static JobStatus Wait(JobManager& jobs, const std::string& id) {
    for (;;) {
      absl::StatusOr<JobStatus> s = jobs.Get(id);
      EXPECT_TRUE(s.ok()) << s.status();
      if (!s.ok() || s->state() == JobStatus::SUCCEEDED ||
          s->state() == JobStatus::FAILED ||
          s->state() == JobStatus::CANCELLED) {
        return s.ok() ? *s : JobStatus();
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }

  fs::path dir_;
  ServerMetrics metrics_;
};

TEST_F(JobResumeTest, CheckpointsRecordTheJobAndItsPosition) {
  auto host = Host(/*every_steps=*/4);
  JobManager jobs(host.get(), &metrics_, Options());
  // 35 samples in batches of 10: 4 batches per epoch (the last short).
  auto started = jobs.Start(Request(35));
  ASSERT_TRUE(started.ok()) << started.status();
  const JobStatus done = Wait(jobs, started->id());
  ASSERT_EQ(done.state(), JobStatus::SUCCEEDED) << done.error();
  EXPECT_EQ(done.steps(), 8);
  // Step 4 ends epoch 1 (0-based 0) after its 4 batches; step 8 epoch 2.
  for (const auto& [step, epoch, batches, samples] :
       std::vector<std::tuple<int, int, int, int>>{{4, 0, 4, 35},
                                                   {8, 1, 4, 70}}) {
    auto manifest = model::ReadManifest(
        (dir_ / model::PeriodicCheckpointName(step)).string());
    ASSERT_TRUE(manifest.ok()) << manifest.status();
    const nlohmann::json job = nlohmann::json::parse(manifest->job);
    EXPECT_EQ(job["id"], "job-1");
    EXPECT_EQ(job["steps"], step);
    EXPECT_EQ(job["samples"], samples);
    EXPECT_EQ(job["epoch"], epoch);
    EXPECT_EQ(job["epoch_batches"], batches);
    JobRequest request;
    ASSERT_TRUE(google::protobuf::TextFormat::ParseFromString(
        job["request"].get<std::string>(), &request));
    EXPECT_EQ(request.train().synthetic().num_samples(), 35);
  }
  // It ended: its marker says so, and its record is not resumed.
  EXPECT_TRUE(fs::exists(dir_ / "job-1.end"));
  auto record = model::ReadManifest((dir_ / "ckpt-4").string());
  ASSERT_TRUE(record.ok());
  auto host2 = Host(0);
  JobManager again(host2.get(), &metrics_, Options());
  ASSERT_TRUE(again.Resume(record->job).ok());
  EXPECT_TRUE(again.List().empty());
  EXPECT_EQ(host2->steps(), 0);
  // New ids go on after the ended one.
  auto next = again.Start(Request(5));
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(next->id(), "job-2");
  Wait(again, "job-2");
}

TEST_F(JobResumeTest, DamagedRecordsAreRefusedNamingTheProblem) {
  auto host = Host(0);
  JobManager jobs(host.get(), &metrics_, Options());
  std::string request;
  google::protobuf::TextFormat::PrintToString(Request(35), &request);
  auto record = [&](const std::string& field, nlohmann::json value) {
    nlohmann::json r = {{"id", "job-3"}, {"request", request},
                        {"steps", 2},    {"samples", 20},
                        {"epoch", 0},    {"epoch_batches", 2}};
    if (value.is_null()) {
      r.erase(field);
    } else {
      r[field] = value;
    }
    return r.dump();
  };
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"[1, 2]", "not a JSON object"},
      {"{", "not a JSON object"},
      {record("steps", nullptr), "steps"},
      {record("steps", "two"), "steps"},
      {record("id", "job-x"), "job-x"},
      {record("id", "job-0"), "job-0"},
      {record("epoch", -1), ">= 0"},
      {record("request", "train { nonsense: 1 }"), "request does not parse"},
      {record("request", "batch_size: -4 train { synthetic {} }"),
       "batch_size"},
  };
  for (const auto& [text, want] : cases) {
    const absl::Status s = jobs.Resume(text);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_HAS_SUBSTR(s.message(), want) << text << ": " << s.message();
  }
  EXPECT_TRUE(jobs.List().empty());
  EXPECT_EQ(host->steps(), 0);
}

TEST_F(JobResumeTest, AJobStoppedByShutdownResumesWhereItStopped) {
  auto host = Host(0);
  std::string record;
  {
    JobManager jobs(host.get(), &metrics_, Options());
    JobRequest endless;
    endless.mutable_train()->mutable_synthetic()->set_num_samples(0);
    endless.set_batch_size(10);
    endless.set_max_steps(1000000);
    auto started = jobs.Start(endless);
    ASSERT_TRUE(started.ok()) << started.status();
    while (jobs.Get("job-1")->steps() < 3) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    jobs.Shutdown();
    EXPECT_EQ(jobs.Get("job-1")->state(), JobStatus::CANCELLED);
    record = jobs.InterruptedJob();
  }
  // No marker: a restart resumes it.
  EXPECT_FALSE(fs::exists(dir_ / "job-1.end"));
  ASSERT_FALSE(record.empty());
  const nlohmann::json parsed = nlohmann::json::parse(record);
  const int64_t stopped = parsed["steps"];
  EXPECT_EQ(stopped, host->steps());
  EXPECT_EQ(parsed["epoch_batches"], stopped);

  JobManager jobs(host.get(), &metrics_, Options());
  ASSERT_TRUE(jobs.Resume(record).ok());
  auto resumed = jobs.Get("job-1");
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_GE(resumed->steps(), stopped);
  auto cancelled = jobs.Cancel("job-1", absl::Seconds(10));
  ASSERT_TRUE(cancelled.ok()) << cancelled.status();
  EXPECT_EQ(cancelled->state(), JobStatus::CANCELLED);
  EXPECT_EQ(cancelled->steps(), host->steps());
  // Cancelled through Cancel: ended for good.
  EXPECT_TRUE(fs::exists(dir_ / "job-1.end"));
  EXPECT_TRUE(jobs.InterruptedJob().empty());
}

TEST_F(JobResumeTest, JobsResumedFromEachCheckpointEndWithTheSameWeights) {
  // A Criteo TSV file (the tiny model's shape: label, 4 integer features,
  // 3 hex categoricals): 300 samples, batches of 32 (the tenth short),
  // 3 epochs: 30 steps.
  const fs::path tsv = dir_ / "day.tsv";
  {
    std::ofstream out(tsv);
    for (int i = 0; i < 300; ++i) {
      out << (i % 3 == 0 ? 1 : 0) << "\t" << i % 7 << "\t\t" << i % 11 << "\t"
          << i % 5 << "\t" << std::hex << 0x1000 + i << "\t\t" << 0xabc + 7 * i
          << std::dec << "\n";
    }
  }
  JobRequest request;
  request.mutable_train()->mutable_criteo_tsv()->add_paths(tsv.string());
  request.set_batch_size(32);
  request.set_epochs(3);

  // Checkpoints every 7 steps: mid-epoch in each of the 3 epochs.
  auto host = Host(/*every_steps=*/7);
  uint64_t uninterrupted = 0;
  {
    JobManager jobs(host.get(), &metrics_, Options());
    auto started = jobs.Start(request);
    ASSERT_TRUE(started.ok()) << started.status();
    const JobStatus done = Wait(jobs, started->id());
    ASSERT_EQ(done.state(), JobStatus::SUCCEEDED) << done.error();
    EXPECT_EQ(done.steps(), 30);
    uninterrupted = host->WeightChecksum().value();
  }
  // The same as with no checkpoints at all.
  {
    auto plain = Host(0);
    JobManager jobs(plain.get(), &metrics_, Unrecorded());
    auto started = jobs.Start(request);
    ASSERT_TRUE(started.ok()) << started.status();
    ASSERT_EQ(Wait(jobs, started->id()).state(), JobStatus::SUCCEEDED);
    EXPECT_EQ(plain->WeightChecksum().value(), uninterrupted);
  }
  // A crash after each checkpoint: the model from it, the job from its
  // record (no end marker: JobManagerOptions without state_dir).
  for (const auto& [step, epoch, batches] :
       std::vector<std::tuple<int, int, int>>{
           {7, 0, 7}, {14, 1, 4}, {21, 2, 1}}) {
    SCOPED_TRACE("resumed at step " + std::to_string(step));
    const std::string dir =
        (dir_ / model::PeriodicCheckpointName(step)).string();
    auto manifest = model::ReadManifest(dir);
    ASSERT_TRUE(manifest.ok()) << manifest.status();
    const nlohmann::json record = nlohmann::json::parse(manifest->job);
    EXPECT_EQ(record["epoch"], epoch);
    EXPECT_EQ(record["epoch_batches"], batches);
    auto model = model::LoadCheckpoint(dir, /*weights_only=*/false);
    ASSERT_TRUE(model.ok()) << model.status();
    auto resumed_host = ModelHost::Create(*std::move(model), {});
    ASSERT_TRUE(resumed_host.ok()) << resumed_host.status();
    JobManager jobs(resumed_host->get(), &metrics_, Unrecorded());
    ASSERT_TRUE(jobs.Resume(manifest->job).ok());
    const JobStatus done = Wait(jobs, "job-1");
    ASSERT_EQ(done.state(), JobStatus::SUCCEEDED) << done.error();
    EXPECT_EQ(done.steps(), 30);
    EXPECT_EQ(done.samples(), 900);
    EXPECT_EQ((*resumed_host)->steps(), 30);
    EXPECT_EQ((*resumed_host)->WeightChecksum().value(), uninterrupted);
  }
}

}  // namespace
}  // namespace dlrm::server
