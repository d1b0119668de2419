// Tests for clients/: the wire conversions, progress lines and TSV input on
// their own, then the client library and the dlrm_client CLI end to end
// against a real dlrm_server (tiny config, port 0) started per test suite,
// and server processes of their own: config file, restart from a checkpoint,
// Predict under training.
#include <google/protobuf/descriptor.h>
#include <google/protobuf/descriptor.pb.h>
#include <google/protobuf/dynamic_message.h>
#include <google/protobuf/text_format.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/security/credentials.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "clients/client.h"
#include "clients/grpc_status.h"
#include "clients/progress.h"
#include "clients/server_process.h"
#include "clients/tsv_input.h"
#include "core/config.h"
#include "core/status.h"
#include "core/version.h"
#include "data/criteo.h"
#include "data/synthetic.h"
#include "tests/support/expect.h"
#include "tests/support/files.h"
#include "tests/support/health.h"
#include "tests/support/process.h"
#include "tests/support/synthetic.h"

namespace dlrm::clients {
namespace {

using test::FreePort;

using test::ReadFile;
using test::WriteTinyTsv;

using test::ExpectInvalid;

namespace fs = std::filesystem;

// --- helpers ---------------------------------------------------------------

// --- wire ------------------------------------------------------------------

TEST(ClientWireTest, FromGrpcStatusKeepsCodeAndMessage) {
  EXPECT_TRUE(FromGrpcStatus(grpc::Status::OK).ok());
  const absl::Status s = FromGrpcStatus(
      grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "sparse[2] bad"));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "sparse[2] bad");
  EXPECT_EQ(
      FromGrpcStatus(grpc::Status(grpc::StatusCode::UNAVAILABLE, "x")).code(),
      absl::StatusCode::kUnavailable);
  EXPECT_EQ(FromGrpcStatus(grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "x"))
                .code(),
            absl::StatusCode::kUnauthenticated);
}

// --- options, progress, TSV input -------------------------------------------

TEST(ClientOptionsTest, Validate) {
  EXPECT_TRUE(ClientOptions().Validate().ok());
  EXPECT_TRUE(TrainOptions().Validate().ok());
  EXPECT_TRUE(WaitOptions().Validate().ok());
  EXPECT_TRUE(ProgressOptions().Validate().ok());
  ClientOptions c;
  c.max_message_bytes = 0;
  ExpectInvalid(c.Validate(), "max_message_bytes");
  TrainOptions t;
  t.max_in_flight = 0;
  ExpectInvalid(t.Validate(), "max_in_flight");
  t = TrainOptions();
  t.batch_size = -3;
  ExpectInvalid(t.Validate(), "batch_size");
  WaitOptions w;
  w.poll_interval_seconds = 0;
  ExpectInvalid(w.Validate(), "poll_interval_seconds");
  ExpectInvalid(Client::Connect("").status(), "empty");
}

TEST(ClientProgressTest, FormatsCountsAndDurations) {
  EXPECT_EQ(FormatCount(950), "950");
  EXPECT_EQ(FormatCount(12345), "12.3k");
  EXPECT_EQ(FormatCount(4.56e6), "4.56M");
  EXPECT_EQ(FormatDuration(75), "1:15");
  EXPECT_EQ(FormatDuration(3725), "1:02:05");
  EXPECT_EQ(FormatDuration(-1), "?");
}

TEST(ClientProgressTest, RendersBarAndLogLines) {
  ProgressOptions options;
  options.interactive = true;
  options.bar_width = 10;
  ProgressReporter bar("train", 1000, options, stdout);
  ProgressState state;
  state.step = 5;
  state.samples = 500;
  state.loss = 0.5;
  EXPECT_EQ(bar.Render(state, 2.0),
            "train [#####.....]  50%  step 5  500/1.0k samples  250 "
            "samples/s  loss 0.5000  0:02 ETA 0:02");
  options.interactive = false;
  ProgressReporter log("train", 0, options, stdout);
  EXPECT_EQ(
      log.Render(state, 2.0),
      "train: step 5 samples 500 samples/s 250 loss 0.50000 elapsed 2.0s");
  state = ProgressState();
  state.samples = -1;
  EXPECT_EQ(log.Render(state, 3.0), "train: elapsed 3.0s");
}

TEST(ClientTsvInputTest, ReadsLinesWithAndWithoutLabels) {
  std::istringstream in(
      "1\t1\t2\t\t3\t0a\tff\n"
      "\n"
      "5\t\t\t0\t10\t\r\n"
      "0\t0\t0\t0\t1\t2\t3\n");
  data::CriteoOptions options;
  options.num_dense = 4;
  options.table_rows = {100, 7};
  // 1 + 4 + 2 columns with a label, 6 without: the second sample has none.
  absl::StatusOr<std::unique_ptr<data::BatchSource>> source =
      OpenCriteoStream(&in, "mem", options);
  ASSERT_TRUE(source.ok()) << source.status();
  data::Batch b;
  // "5\t\t\t0\t10\t" has 6 columns: dense 5,_,_,0 and cats 0x10, empty.
  absl::StatusOr<bool> more = (*source)->Next(10, &b);
  ASSERT_TRUE(more.ok()) << more.status();
  ASSERT_TRUE(*more);
  ASSERT_EQ(b.size, 3);
  EXPECT_EQ(b.labels, (std::vector<float>{1, 0, 0}));
  EXPECT_FLOAT_EQ(b.dense[0], std::log1p(1.0f));
  EXPECT_FLOAT_EQ(b.dense[4], std::log1p(5.0f));
  EXPECT_EQ(b.sparse[0].ids, (std::vector<int64_t>{0x0a, 0x10, 2}));
  EXPECT_EQ(b.sparse[1].ids, (std::vector<int64_t>{0xff % 7, 0, 3}));
  EXPECT_TRUE(b.Validate(4, options.table_rows).ok());
  more = (*source)->Next(10, &b);
  ASSERT_TRUE(more.ok());
  EXPECT_FALSE(*more);
  ASSERT_TRUE((*source)->Rewind().ok());
  more = (*source)->Next(1, &b);
  ASSERT_TRUE(more.ok() && *more);
  EXPECT_EQ(b.labels, (std::vector<float>{1}));

  std::istringstream bad("1\t1\t2\t3\t4\tzz\t1\n");
  source = OpenCriteoStream(&bad, "bad.tsv", options);
  ASSERT_TRUE(source.ok());
  ExpectInvalid((*source)->Next(10, &b).status(), "bad.tsv:1");
}

// With the tiny model's multi-hot sizes the stream reader yields the bags
// the file reader (data/criteo.h) derives from the same lines, labelled or
// not.
TEST(ClientTsvInputTest, MultiHotBagsEqualTheFileReaders) {
  std::string labelled, unlabelled;
  for (int i = 0; i < 30; ++i) {
    const std::string features =
        absl::StrCat(i, "\t\t", 3 * i, "\t1\t", absl::Hex(i * 7919), "\t",
                     absl::Hex(i * 13), "\t", i % 4 == 0 ? "" : "ff");
    labelled += absl::StrCat(i % 2, "\t", features, "\n");
    unlabelled += features + "\n";
  }
  const fs::path dir = fs::path(testing::TempDir()) / "clients_multi_hot";
  fs::create_directories(dir);
  const std::string file = (dir / "day.tsv").string();
  std::ofstream(file) << labelled;
  absl::StatusOr<ModelConfig> config = LoadModelConfig("tiny");
  ASSERT_TRUE(config.ok()) << config.status();
  const data::CriteoOptions options =
      data::CriteoOptionsForModel(*config, /*hash_ids=*/false);
  auto from_file = data::OpenCriteoTsv({file}, options);
  ASSERT_TRUE(from_file.ok()) << from_file.status();
  data::Batch expected;
  ASSERT_TRUE(*(*from_file)->Next(100, &expected));
  ASSERT_EQ(expected.size, 30);
  EXPECT_EQ(expected.sparse[1].ids.size(), 30u * 3);
  EXPECT_EQ(expected.sparse[2].ids.size(), 30u * 2);
  for (bool with_labels : {true, false}) {
    std::istringstream in(with_labels ? labelled : unlabelled);
    auto source = OpenCriteoStream(&in, "mem", options);
    ASSERT_TRUE(source.ok()) << source.status();
    data::Batch b;
    ASSERT_TRUE(*(*source)->Next(100, &b));
    ASSERT_EQ(b.size, expected.size);
    EXPECT_EQ(b.dense, expected.dense);
    for (size_t t = 0; t < b.sparse.size(); ++t) {
      EXPECT_EQ(b.sparse[t].offsets, expected.sparse[t].offsets) << t;
      EXPECT_EQ(b.sparse[t].ids, expected.sparse[t].ids) << t;
    }
    if (with_labels) {
      EXPECT_EQ(b.labels, expected.labels);
    } else {
      EXPECT_EQ(b.labels, std::vector<float>(30, 0.0f));
    }
    EXPECT_TRUE(b.Validate(4, options.table_rows).ok());
  }
}

// --- end to end against dlrm_server -----------------------------------------

// Directory of this test binary; the server and CLI are found next to it in
// the build tree unless DLRM_SERVER / DLRM_CLIENT name them.
std::string BinaryPath(const char* env, const fs::path& relative) {
  return test::BuildBinary(env, relative.string());
}

// Runs `args` with stdin from `stdin_path` (empty: /dev/null), returning the
// exit status (-1 if it did not run) and its stdout and stderr.
using CommandResult = test::RunResult;

CommandResult RunCommand(const std::vector<std::string>& args,
                         const fs::path& dir,
                         const std::string& stdin_path = "") {
  return test::Run(args, dir.string(), {}, stdin_path);
}

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// Connects to `server` and reads its (normalised) model config.
absl::Status ConnectAndReadConfig(const ServerProcess& server,
                                  std::unique_ptr<Client>* client,
                                  ModelConfig* config) {
  ASSIGN_OR_RETURN(*client, Client::Connect(server.address()));
  ASSIGN_OR_RETURN(ModelInfo info, (*client)->GetModelInfo());
  ASSIGN_OR_RETURN(*config, NormalizeModelConfig(info.config()));
  return absl::OkStatus();
}

using test::SyntheticBatches;

// Yields copies of the given batches in order, then ends; Rewind starts
// over. A batch larger than the caller's max_samples is InvalidArgument.
class BatchListSource final : public data::BatchSource {
 public:
  explicit BatchListSource(std::vector<data::Batch> batches)
      : batches_(std::move(batches)) {}

  absl::StatusOr<bool> Next(int64_t max_samples, data::Batch* batch) override {
    if (next_ == batches_.size()) {
      *batch = data::Batch();
      return false;
    }
    if (batches_[next_].size > max_samples) {
      return absl::InvalidArgumentError("batch larger than max_samples");
    }
    *batch = batches_[next_++];
    return true;
  }
  absl::Status Rewind() override {
    next_ = 0;
    return absl::OkStatus();
  }

 private:
  std::vector<data::Batch> batches_;
  size_t next_ = 0;
};

// The bit patterns of `values`, for exact comparisons (NaN included).
std::vector<uint32_t> Bits(const std::vector<float>& values) {
  std::vector<uint32_t> bits;
  for (const float v : values) bits.push_back(std::bit_cast<uint32_t>(v));
  return bits;
}

// One dlrm_server child process per test suite.
class ClientE2ETest : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    server_path_ = BinaryPath("DLRM_SERVER", "server/dlrm_server");
    client_path_ = BinaryPath("DLRM_CLIENT", "clients/dlrm_client");
    if (access(server_path_.c_str(), X_OK) != 0) return;
    dir_ = fs::path(testing::TempDir()) /
           ("clients_test_" + std::to_string(getpid()));
    fs::create_directories(dir_ / "ckpt");
    server_ = std::make_unique<ServerProcess>();
    start_status_ = server_->Start(
        {server_path_, "--listen", "127.0.0.1:0", "--metrics-listen",
         "127.0.0.1:0", "--config", "tiny", "--checkpoint-dir",
         (dir_ / "ckpt").string(), "--data-dir", dir_.string()},
        /*timeout_seconds=*/60);
    address_ = server_->address();
  }

  static void TearDownTestSuite() {
    if (server_ != nullptr) {
      const absl::Status stopped = server_->Stop(/*timeout_seconds=*/10);
      if (!stopped.ok()) ADD_FAILURE() << stopped;
      server_.reset();
    }
    std::error_code ignored;
    if (!dir_.empty()) fs::remove_all(dir_, ignored);
  }

  void SetUp() override {
    if (server_ == nullptr) {
      GTEST_SKIP() << "dlrm_server is not built (looked for " << server_path_
                   << "; set DLRM_SERVER to override)";
    }
    ASSERT_TRUE(start_status_.ok()) << start_status_;
    absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(address_);
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = std::move(*client);
    absl::StatusOr<ModelInfo> info = client_->GetModelInfo();
    ASSERT_TRUE(info.ok()) << info.status();
    absl::StatusOr<ModelConfig> config = NormalizeModelConfig(info->config());
    ASSERT_TRUE(config.ok()) << config.status();
    config_ = *config;
  }

  std::unique_ptr<data::BatchSource> Synthetic(int64_t samples,
                                               uint64_t sample_seed) {
    data::SyntheticOptions options;
    options.teacher_seed = config_.seed();
    options.sample_seed = sample_seed;
    options.num_samples = samples;
    absl::StatusOr<std::unique_ptr<data::BatchSource>> source =
        data::MakeSyntheticSource(config_, options);
    EXPECT_TRUE(source.ok()) << source.status();
    return source.ok() ? std::move(*source) : nullptr;
  }

  data::Batch SyntheticBatch(int64_t samples, uint64_t sample_seed) {
    data::Batch batch;
    std::unique_ptr<data::BatchSource> source = Synthetic(samples, sample_seed);
    if (source != nullptr) {
      EXPECT_TRUE(source->Next(samples, &batch).ok());
    }
    return batch;
  }

  std::vector<float> PredictOrDie(const data::Batch& batch) {
    absl::StatusOr<std::vector<float>> p = client_->Predict(batch);
    EXPECT_TRUE(p.ok()) << p.status();
    return p.ok() ? *p : std::vector<float>();
  }

  static inline std::string server_path_, client_path_, address_;
  static inline absl::Status start_status_;
  static inline fs::path dir_;
  static inline std::unique_ptr<ServerProcess> server_;

  std::unique_ptr<Client> client_;
  ModelConfig config_;
};

TEST_F(ClientE2ETest, InfoAndMetrics) {
  EXPECT_EQ(config_.num_dense_features(), 4);
  ASSERT_EQ(config_.tables_size(), 3);
  EXPECT_EQ(config_.tables(1).rows(), 20);
  absl::StatusOr<ModelInfo> info = client_->GetModelInfo();
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->embedding_parameters(), EmbeddingParameterCount(config_));
  EXPECT_EQ(info->dense_parameters(), DenseParameterCount(config_));
  EXPECT_GE(info->world_size(), 1);
  absl::StatusOr<std::string> metrics = client_->GetMetrics();
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  EXPECT_HAS_SUBSTR(*metrics, "dlrm_") << *metrics;
  // The standard process series and the build, one sample each.
  const auto value = [&](const std::string& series) {
    const size_t at = metrics->find("\n" + series + " ");
    EXPECT_NE(at, std::string::npos) << series << " in\n" << *metrics;
    return at == std::string::npos
               ? -1.0
               : std::stod(metrics->substr(at + series.size() + 2));
  };
  EXPECT_GT(value("process_resident_memory_bytes"), 1e6);
  EXPECT_GE(value("process_cpu_seconds_total"), 0);
  EXPECT_GT(value("process_open_fds"), 2);
  const double started = value("process_start_time_seconds");
  EXPECT_GT(started, 1.6e9);  // after 2020
  // btime and std::time are whole seconds.
  EXPECT_LE(started, static_cast<double>(std::time(nullptr)) + 2);
  EXPECT_HAS_SUBSTR(*metrics,
                    absl::StrCat("\ndlrm_build_info{version=\"", kVersion,
                                 "\",git=\"", kGitDescribe, "\"} 1\n"))
      << *metrics;
}

TEST_F(ClientE2ETest, StreamingTrainReportsOrderedFiniteSteps) {
  const int64_t before = client_->GetModelInfo()->steps();
  std::unique_ptr<data::BatchSource> source = Synthetic(1000, 11);
  TrainOptions options;
  options.batch_size = 128;
  options.max_in_flight = 2;
  std::vector<StepResult> results;
  absl::StatusOr<TrainSummary> summary = client_->Train(
      *source, options, [&](const StepResult& r) { results.push_back(r); });
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_EQ(summary->steps, 8);  // 7 x 128 + 104
  EXPECT_EQ(summary->samples, 1000);
  ASSERT_EQ(results.size(), 8u);
  for (size_t i = 0; i < results.size(); ++i) {
    EXPECT_EQ(results[i].step(), before + static_cast<int64_t>(i) + 1);
    EXPECT_TRUE(std::isfinite(results[i].loss())) << i;
    EXPECT_GT(results[i].loss(), 0);
    EXPECT_EQ(results[i].samples(), i == 7 ? 104 : 128);
  }
  EXPECT_EQ(summary->last_step, before + 8);
  EXPECT_DOUBLE_EQ(summary->final_loss, results.back().loss());
  EXPECT_TRUE(std::isfinite(summary->mean_loss));
  EXPECT_EQ(client_->GetModelInfo()->steps(), before + 8);

  // Epochs rewind the source; max_steps caps the call.
  options.batch_size = 100;
  options.epochs = 3;
  options.max_steps = 7;
  std::unique_ptr<data::BatchSource> small = Synthetic(250, 12);
  summary = client_->Train(*small, options, nullptr);
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_EQ(summary->steps, 7);  // 3 per epoch: 100, 100, 50
  EXPECT_EQ(summary->samples, 2 * 250 + 100);
}

// Trains on `tsv` (tiny-shaped lines, table t2 read as 1000 rows). The
// server may take a moment to notice a stream the client has cancelled, and
// until then answers FailedPrecondition (one training stream at a time), so
// that answer is retried for up to 5 s.
absl::Status TrainOnTsvWhenIdle(Client& client, const std::string& tsv,
                                int64_t batch_size) {
  data::CriteoOptions options;
  options.num_dense = 4;
  options.table_rows = {50, 20, 1000};
  TrainOptions train;
  train.batch_size = batch_size;
  absl::Status status;
  for (int attempt = 0; attempt < 100; ++attempt) {
    std::istringstream in(tsv);
    absl::StatusOr<std::unique_ptr<data::BatchSource>> source =
        OpenCriteoStream(&in, "tsv", options);
    if (!source.ok()) return source.status();
    status = client.Train(**source, train, nullptr).status();
    if (status.code() != absl::StatusCode::kFailedPrecondition) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return status;
}

TEST_F(ClientE2ETest, TrainErrorsKeepTheirCodes) {
  // Ids beyond the server's tables (999 in t2 of 100 rows): the server
  // rejects the batch, naming it.
  absl::Status status =
      TrainOnTsvWhenIdle(*client_, "1\t1\t1\t1\t1\t0\t0\t3e7\n", 16);
  ExpectInvalid(status, "sparse[2]");

  // A malformed line in the source: the source's own error comes back (the
  // second line, without a label, is fine).
  status = TrainOnTsvWhenIdle(*client_,
                              "1\t1\t1\t1\t1\t0\t0\t0\n"
                              "1\t1\t1\t1\t0\t0\t0\n"
                              "0\t1\t1\t1\t1\tqq\t0\t0\n",
                              1);
  ExpectInvalid(status, "tsv:3");

  // The server still trains after rejected streams.
  EXPECT_TRUE(
      TrainOnTsvWhenIdle(*client_, "1\t1\t1\t1\t1\t0\t0\t0\n", 16).ok());
}

TEST_F(ClientE2ETest, JobOnSyntheticDataRunsToTheEnd) {
  JobRequest request;
  request.mutable_train()->mutable_synthetic()->set_num_samples(2048);
  SyntheticData* eval = request.mutable_eval()->mutable_synthetic();
  eval->set_num_samples(512);
  eval->set_sample_seed(99);
  request.set_batch_size(256);
  absl::StatusOr<JobStatus> started = client_->StartJob(request);
  ASSERT_TRUE(started.ok()) << started.status();
  ASSERT_FALSE(started->id().empty());
  WaitOptions wait;
  wait.poll_interval_seconds = 0.05;
  wait.timeout_seconds = 30;
  int polls = 0;
  absl::StatusOr<JobStatus> done =
      client_->WaitJob(started->id(), wait, [&](const JobStatus&) { ++polls; });
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->state(), JobStatus::SUCCEEDED) << done->error();
  EXPECT_EQ(done->steps(), 8);
  EXPECT_EQ(done->samples(), 2048);
  EXPECT_TRUE(std::isfinite(done->loss()));
  EXPECT_EQ(done->eval().samples(), 512);
  EXPECT_GE(polls, 1);
  absl::StatusOr<std::vector<JobStatus>> jobs = client_->ListJobs();
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  ASSERT_FALSE(jobs->empty());
  EXPECT_EQ(jobs->back().id(), started->id());
  EXPECT_EQ(jobs->back().state(), JobStatus::SUCCEEDED);

  EXPECT_EQ(client_->GetJob("no-such-job").status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(ClientE2ETest, CancelledJobEndsCancelled) {
  JobRequest request;
  request.mutable_train()->mutable_synthetic()->set_num_samples(0);
  request.set_max_steps(1000000000);
  request.set_batch_size(64);
  absl::StatusOr<JobStatus> started = client_->StartJob(request);
  ASSERT_TRUE(started.ok()) << started.status();
  absl::StatusOr<JobStatus> cancelled = client_->CancelJob(started->id());
  ASSERT_TRUE(cancelled.ok()) << cancelled.status();
  // CancelJob answers once the job has stopped.
  EXPECT_EQ(cancelled->state(), JobStatus::CANCELLED);
  WaitOptions wait;
  wait.poll_interval_seconds = 0.05;
  wait.timeout_seconds = 30;
  absl::StatusOr<JobStatus> done = client_->WaitJob(started->id(), wait, {});
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->state(), JobStatus::CANCELLED);

  // WaitJob's own timeout.
  started = client_->StartJob(request);
  ASSERT_TRUE(started.ok()) << started.status();
  wait.timeout_seconds = 0.2;
  EXPECT_EQ(client_->WaitJob(started->id(), wait, {}).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(client_->CancelJob(started->id()).ok());
  wait.timeout_seconds = 30;
  done = client_->WaitJob(started->id(), wait, {});
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->state(), JobStatus::CANCELLED);
}

TEST_F(ClientE2ETest, EvaluateInlineAndOnTheServer) {
  std::unique_ptr<data::BatchSource> source = Synthetic(1000, 21);
  absl::StatusOr<EvaluateResponse> inline_eval =
      client_->EvaluateSource(*source, 256, 900);
  ASSERT_TRUE(inline_eval.ok()) << inline_eval.status();
  EXPECT_EQ(inline_eval->metrics().samples(), 900);
  EXPECT_GE(inline_eval->metrics().auc(), 0);
  EXPECT_LE(inline_eval->metrics().auc(), 1);
  EXPECT_TRUE(std::isfinite(inline_eval->metrics().log_loss()));

  EvaluateRequest request;
  request.mutable_dataset()->mutable_synthetic()->set_num_samples(0);
  request.set_max_samples(700);
  absl::StatusOr<EvaluateResponse> server_eval = client_->Evaluate(request);
  ASSERT_TRUE(server_eval.ok()) << server_eval.status();
  EXPECT_EQ(server_eval->metrics().samples(), 700);
  EXPECT_TRUE(server_eval->has_reference());
  EXPECT_GT(server_eval->reference().auc(), 0.5);
}

TEST_F(ClientE2ETest, PredictReturnsOneProbabilityPerSample) {
  const data::Batch batch = SyntheticBatch(37, 31);
  const std::vector<float> p = PredictOrDie(batch);
  ASSERT_EQ(p.size(), 37u);
  for (const float x : p) {
    EXPECT_GT(x, 0);
    EXPECT_LT(x, 1);
  }
  // The same samples predict the same.
  EXPECT_EQ(PredictOrDie(batch), p);

  data::Batch bad = batch;
  bad.sparse[0].ids[0] = 1 << 30;
  EXPECT_EQ(client_->Predict(bad).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(ClientE2ETest, CheckpointSaveAndRestore) {
  std::unique_ptr<data::BatchSource> source = Synthetic(512, 41);
  ASSERT_TRUE(client_->Train(*source, TrainOptions(), nullptr).ok());
  const data::Batch probe = SyntheticBatch(16, 42);
  const std::vector<float> at_save = PredictOrDie(probe);
  const std::string path = (dir_ / "ckpt" / "a").string();
  absl::StatusOr<CheckpointResponse> saved = client_->SaveCheckpoint(path);
  ASSERT_TRUE(saved.ok()) << saved.status();
  EXPECT_GT(saved->bytes(), 0);
  EXPECT_EQ(saved->step(), client_->GetModelInfo()->steps());

  source = Synthetic(512, 43);
  ASSERT_TRUE(client_->Train(*source, TrainOptions(), nullptr).ok());
  EXPECT_NE(PredictOrDie(probe), at_save);

  absl::StatusOr<CheckpointResponse> restored =
      client_->RestoreCheckpoint(path);
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_EQ(restored->step(), saved->step());
  EXPECT_EQ(client_->GetModelInfo()->steps(), saved->step());
  const std::vector<float> after = PredictOrDie(probe);
  ASSERT_EQ(after.size(), at_save.size());
  for (size_t i = 0; i < after.size(); ++i) {
    EXPECT_NEAR(after[i], at_save[i], 1e-6) << i;
  }

  EXPECT_NE(client_->RestoreCheckpoint((dir_ / "ckpt" / "missing").string())
                .status()
                .code(),
            absl::StatusCode::kOk);
}

// The weights export through the library and the CLI: the file lands
// under the server's --checkpoint-dir, and a path outside it is refused.
TEST_F(ClientE2ETest, ExportWritesWeightsUnderTheCheckpointDir) {
  absl::StatusOr<ExportResponse> exported =
      client_->ExportWeights("lib/weights.safetensors");
  ASSERT_TRUE(exported.ok()) << exported.status();
  const fs::path lib_file =
      fs::weakly_canonical(dir_ / "ckpt" / "lib" / "weights.safetensors");
  EXPECT_EQ(exported->path(), lib_file.string());
  EXPECT_EQ(exported->bytes(), static_cast<int64_t>(fs::file_size(lib_file)));
  EXPECT_EQ(exported->step(), client_->GetModelInfo()->steps());
  EXPECT_EQ(client_->ExportWeights("../escape.safetensors").status().code(),
            absl::StatusCode::kInvalidArgument);

  DLRM_SKIP_UNLESS_BUILT("dlrm_client", client_path_);
  CommandResult r = RunCommand({client_path_, "--server", address_, "export",
                                "--out", "cli/weights.safetensors"},
                               dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const fs::path cli_file =
      fs::weakly_canonical(dir_ / "ckpt" / "cli" / "weights.safetensors");
  EXPECT_TRUE(fs::exists(cli_file));
  EXPECT_HAS_SUBSTR(r.out, "exported " + cli_file.string() + ": step ")
      << r.out;
  EXPECT_HAS_SUBSTR(r.out, " tensors, ") << r.out;

  r = RunCommand({client_path_, "--server", address_, "export", "--out",
                  "../escape.safetensors"},
                 dir_);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_HAS_SUBSTR(r.err, "INVALID_ARGUMENT") << r.err;
  EXPECT_FALSE(fs::exists(dir_ / "escape.safetensors"));
  // --out is required.
  r = RunCommand({client_path_, "--server", address_, "export"}, dir_);
  EXPECT_NE(r.exit_code, 0);
}

// A refused connection ends the wait at once (with an hour to wait, a
// client that retried until the timeout would never come back), naming
// the address.
TEST(ClientConnectTest, RefusedConnectionFailsAtOnceNamingTheAddress) {
  ClientOptions options;
  options.connect_timeout_seconds = 3600;
  const absl::Status status = Client::Connect("127.0.0.1:1", options).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_HAS_SUBSTR(status.message(),
                    "at 127.0.0.1:1: the connection failed "
                    "(refused")
      << status;
}

TEST(ClientConnectTest, ConnectToAClosedPortIsUnavailable) {
  ClientOptions options;
  options.connect_timeout_seconds = 0.3;
  // Port 1 is privileged and never a dlrm_server here.
  EXPECT_EQ(Client::Connect("127.0.0.1:1", options).status().code(),
            absl::StatusCode::kUnavailable);
}

// dlrm_client set-learning-rate: Admin.SetLearningRate, the rates in force
// printed and shown by info's config; a negative rate is refused naming
// the field.
TEST_F(ClientE2ETest, CliSetLearningRate) {
  DLRM_SKIP_UNLESS_BUILT("dlrm_client", client_path_);
  CommandResult r = RunCommand({client_path_, "--server", address_,
                                "set-learning-rate", "--sparse", "0.05"},
                               dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_HAS_SUBSTR(r.out, "learning rates: dense 0.1, sparse 0.05") << r.out;
  auto client = Client::Connect(address_);
  ASSERT_TRUE(client.ok()) << client.status();
  auto info = (*client)->GetModelInfo();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->config().sparse_optimizer().learning_rate(), 0.05f);
  // The suite's other tests share the server: the preset's rate again.
  ASSERT_TRUE((*client)->SetLearningRate(std::nullopt, 0.1f).ok());
  r = RunCommand({client_path_, "--server", address_, "set-learning-rate",
                  "--dense", "-1"},
                 dir_);
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_HAS_SUBSTR(r.err, "INVALID_ARGUMENT") << r.err;
  EXPECT_HAS_SUBSTR(r.err, "dense_optimizer.learning_rate") << r.err;
}

TEST_F(ClientE2ETest, CliInfoTrainPredict) {
  DLRM_SKIP_UNLESS_BUILT("dlrm_client", client_path_);
  CommandResult r =
      RunCommand({client_path_, "--server", address_, "info"}, dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_HAS_SUBSTR(r.out, "dense features: 4  tables: 3") << r.out;

  r = RunCommand({client_path_, "--server", address_, "train", "--synthetic",
                  "512", "--batch", "128"},
                 dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_HAS_SUBSTR(r.out, "train: 4 steps") << r.out;

  // Tiny-shaped TSV: label, 4 ints, 3 hex categoricals; the last line has
  // no label (as in Kaggle's test.txt).
  const fs::path tsv = dir_ / "samples.tsv";
  {
    std::ofstream out(tsv);
    out << "1\t3\t0\t12\t\t0000002a\t00000003\t0badf00d\n"
        << "0\t\t1\t1\t7\t\t00000011\t00000001\n"
        << "0\t5\t5\t5\t5\t00000001\t00000002\t00000003\n"
        << "2\t0\t0\t1\t00000009\t0000000a\t0000000b\n";
  }
  r = RunCommand({client_path_, "--server", address_, "predict", tsv.string()},
                 dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::vector<std::string> lines = Lines(r.out);
  ASSERT_EQ(lines.size(), 4u) << r.out;
  for (const std::string& line : lines) {
    const double p = std::stod(line);
    EXPECT_GT(p, 0) << line;
    EXPECT_LT(p, 1) << line;
  }
  // The same samples from stdin, two per request.
  r = RunCommand(
      {client_path_, "--server", address_, "predict", "-", "--batch-size", "2"},
      dir_, tsv.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(Lines(r.out), lines);

  // Errors: the status message on stderr and a non-zero exit.
  {
    std::ofstream out(dir_ / "bad.tsv");
    out << "1\t3\t0\t12\n";
  }
  r = RunCommand({client_path_, "--server", address_, "predict",
                  (dir_ / "bad.tsv").string()},
                 dir_);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_HAS_SUBSTR(r.err, "INVALID_ARGUMENT") << r.err;
  EXPECT_HAS_SUBSTR(r.err, "bad.tsv:1") << r.err;
}

// A refused connection: the CLI fails at once (with an hour to wait),
// naming the address.
TEST_F(ClientE2ETest, CliRefusedConnectionFailsAtOnceNamingTheAddress) {
  DLRM_SKIP_UNLESS_BUILT("dlrm_client", client_path_);
  const CommandResult r = RunCommand({client_path_, "--server", "127.0.0.1:1",
                                      "--connect-timeout", "3600", "info"},
                                     dir_);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_HAS_SUBSTR(r.err, "cannot connect to dlrm-server at 127.0.0.1:1")
      << r.err;
}

// Ctrl-C on `job start --wait` ends the client (exit 130), not the job:
// it says so and prints the command that cancels it, which does.
TEST_F(ClientE2ETest, CliInterruptedWaitSaysTheJobGoesOnAndHowToCancelIt) {
  DLRM_SKIP_UNLESS_BUILT("dlrm_client", client_path_);
  const fs::path out = dir_ / "wait.out";
  const fs::path err = dir_ / "wait.err";
  const std::vector<std::string> args = {
      client_path_,  "--server", address_,  "job",       "start",
      "--synthetic", "0",        "--steps", "100000000", "--batch-size",
      "32",          "--wait",   "--poll",  "0.1"};
  test::SpawnOptions options;
  options.stdin_path = "/dev/null";
  options.stdout_path = out.string();
  options.stderr_path = err.string();
  const pid_t pid = test::Spawn(args, options).pid;
  ASSERT_NE(pid, -1);
  // The job's first line ("job job-N RUNNING ...") says it started.
  std::string id;
  for (int i = 0; i < 2400 && id.empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    const std::string text = ReadFile(out);
    const size_t at = text.find("job job-");
    const size_t end = at == std::string::npos ? at : text.find(' ', at + 4);
    if (end != std::string::npos) id = text.substr(at + 4, end - at - 4);
  }
  ASSERT_FALSE(id.empty()) << ReadFile(out) << ReadFile(err);
  kill(pid, SIGINT);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 130);
  const std::string said = ReadFile(err);
  EXPECT_HAS_SUBSTR(said, "interrupted; job " + id + " goes on on the server")
      << said;
  const std::string cancel =
      client_path_ + " --server " + address_ + " job cancel " + id;
  EXPECT_HAS_SUBSTR(said, "\n  " + cancel + "\n") << said;

  absl::StatusOr<JobStatus> job = client_->GetJob(id);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_FALSE(IsTerminal(job->state())) << job->DebugString();
  const CommandResult r = RunCommand({"/bin/sh", "-c", cancel}, dir_);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  WaitOptions wait;
  wait.poll_interval_seconds = 0.05;
  job = client_->WaitJob(id, wait, nullptr);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->state(), JobStatus::CANCELLED);
}

// The server reads dataset files only inside its --data-dir: a client
// naming another file (the report: `eval --server-data /etc/passwd` used to
// answer with the file's first line) gets PERMISSION_DENIED naming the path
// and nothing of the file.
TEST_F(ClientE2ETest, CliEvalOfServerFilesOutsideTheDataDirIsDenied) {
  DLRM_SKIP_UNLESS_BUILT("dlrm_client", client_path_);
  const std::string secret_name =
      "clients_test_secret_" + std::to_string(getpid()) + ".tsv";
  const fs::path secret = dir_.parent_path() / secret_name;
  std::ofstream(secret) << "TOPSECRET:x:0:0\t1\n";
  for (const std::string& path :
       {std::string("/etc/passwd"), secret.string(), "../" + secret_name}) {
    SCOPED_TRACE(path);
    const CommandResult r = RunCommand(
        {client_path_, "--server", address_, "eval", "--server-data", path},
        dir_);
    EXPECT_NE(r.exit_code, 0);
    EXPECT_HAS_SUBSTR(r.err, "PERMISSION_DENIED") << r.err;
    EXPECT_HAS_SUBSTR(r.err, "\"" + path + "\"") << r.err;
    EXPECT_NO_SUBSTR(r.err, "root:") << r.err;
    EXPECT_NO_SUBSTR(r.err, "TOPSECRET") << r.err;
  }
  fs::remove(secret);
  // A file inside --data-dir is read as before.
  WriteTinyTsv(dir_ / "eval.tsv", 100);
  const CommandResult r = RunCommand(
      {client_path_, "--server", address_, "eval", "--server-data", "eval.tsv"},
      dir_);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_HAS_SUBSTR(r.out, "samples 100") << r.out;
}

// --- health, through a generic call ----------------------------------------

// The health check is a generic call on serialised bytes
// (tests/support/health.h): Debian's gRPC ships no C++ stubs for it.
absl::StatusOr<int> CheckHealth(const std::string& address,
                                const std::string& service) {
  return test::CheckHealth(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()),
      service);
}

TEST_F(ClientE2ETest, HealthCheckAnswersServing) {
  for (const std::string service :
       {"", "dlrm.Trainer", "dlrm.Predictor", "dlrm.Admin"}) {
    absl::StatusOr<int> health = CheckHealth(address_, service);
    ASSERT_TRUE(health.ok()) << service << ": " << health.status();
    EXPECT_EQ(*health, test::kHealthServing) << service;
  }
  // A service the server does not have: NOT_FOUND (the health protocol).
  EXPECT_EQ(CheckHealth(address_, "no.such.Service").status().code(),
            absl::StatusCode::kNotFound);
}

// --- server processes started, stopped and restarted -----------------------

// Each test runs its own dlrm_server processes (tiny config, port 0).
class ClientServerProcessTest : public testing::Test {
 protected:
  void SetUp() override {
    server_path_ = BinaryPath("DLRM_SERVER", "server/dlrm_server");
    DLRM_SKIP_UNLESS_BUILT("dlrm_server", server_path_)
        << " (set DLRM_SERVER to override)";
    dir_ = fs::path(testing::TempDir()) /
           ("clients_process_test_" + std::to_string(getpid()) + "_" +
            testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_ / "ckpt");
  }

  void TearDown() override {
    std::error_code ignored;
    if (!dir_.empty()) fs::remove_all(dir_, ignored);
  }

  // Writes `text` to dir_/name and returns the path.
  std::string WriteFile(const std::string& name, const std::string& text) {
    const fs::path path = dir_ / name;
    std::ofstream(path) << text;
    return path.string();
  }

  std::string server_path_;
  fs::path dir_;
};

// The child's environment: this process's, with the given NAME=VALUE
// entries added or replacing theirs (dlrm_bench gives each GPU rank its
// CUDA_VISIBLE_DEVICES this way).
TEST(ServerProcessEnvTest, ChildGetsTheGivenEnvironment) {
  const fs::path out = fs::path(testing::TempDir()) /
                       ("server_process_env_" + std::to_string(getpid()));
  setenv("DLRM_ENV_TEST_KEPT", "kept", 1);
  setenv("DLRM_ENV_TEST_REPLACED", "old", 1);
  ServerProcess child;
  ASSERT_TRUE(child
                  .StartDetached(
                      {"/bin/sh", "-c",
                       "printf '%s %s %s' \"$DLRM_ENV_TEST_KEPT\" "
                       "\"$DLRM_ENV_TEST_REPLACED\" \"$DLRM_ENV_TEST_NEW\" > " +
                           out.string()},
                      {"DLRM_ENV_TEST_REPLACED=new", "DLRM_ENV_TEST_NEW=added"})
                  .ok());
  // The shell writes the whole line at once; wait for it before Stop.
  std::string got;
  for (int i = 0; i < 500 && got.size() < 14; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    std::ifstream in(out);
    got.assign(std::istreambuf_iterator<char>(in),
               std::istreambuf_iterator<char>());
  }
  EXPECT_EQ(got, "kept new added");
  // The shell may still be exiting: its status is not what this checks.
  child.Stop(30).IgnoreError();
  unsetenv("DLRM_ENV_TEST_KEPT");
  unsetenv("DLRM_ENV_TEST_REPLACED");
  std::error_code ignored;
  fs::remove(out, ignored);
}

TEST_F(ClientServerProcessTest, ConfigFileWithUnknownKeyIsRejected) {
  const std::string config =
      WriteFile("bad.toml", "listen = \"127.0.0.1:0\"\nlisten-port = 7\n");
  CommandResult r = RunCommand({server_path_, "--server-config", config}, dir_);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_HAS_SUBSTR(r.err, "listen-port") << r.err;
  // The error names the file and says what is wrong with the key.
  EXPECT_HAS_SUBSTR(r.err, "--server-config " + config +
                               ": unknown key "
                               "\"listen-port\"")
      << r.err;

  r = RunCommand(
      {server_path_, "--server-config", (dir_ / "missing.toml").string()},
      dir_);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_HAS_SUBSTR(r.err, "missing.toml") << r.err;
}

// --allow-data-path from the config file (a TOML array), with no
// --data-dir: files in that directory are read, others are denied.
TEST_F(ClientServerProcessTest, AllowDataPathFromTheConfigFile) {
  fs::create_directories(dir_ / "extra");
  fs::create_directories(dir_ / "other");
  WriteTinyTsv(dir_ / "extra" / "day.tsv", 60);
  WriteTinyTsv(dir_ / "other" / "day.tsv", 60);
  const std::string config_file =
      WriteFile("server.toml",
                "listen = \"127.0.0.1:0\"\n"
                "metrics-listen = \"\"\n"
                "config = \"tiny\"\n"
                "log-level = \"warn\"\n"
                "allow-data-path = [\"" +
                    (dir_ / "extra").string() + "\"]\n");
  ServerProcess server;
  const absl::Status started =
      server.Start({server_path_, "--server-config", config_file}, 60);
  ASSERT_TRUE(started.ok()) << started;
  std::unique_ptr<Client> client;
  ModelConfig config;
  const absl::Status connected = ConnectAndReadConfig(server, &client, &config);
  ASSERT_TRUE(connected.ok()) << connected;
  const auto evaluate = [&](const fs::path& path) {
    EvaluateRequest request;
    request.mutable_dataset()->mutable_criteo_tsv()->add_paths(path.string());
    return client->Evaluate(request);
  };
  absl::StatusOr<EvaluateResponse> allowed = evaluate(dir_ / "extra/day.tsv");
  ASSERT_TRUE(allowed.ok()) << allowed.status();
  EXPECT_EQ(allowed->metrics().samples(), 60);
  EXPECT_EQ(evaluate(dir_ / "other/day.tsv").status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(evaluate(dir_ / "extra/../other/day.tsv").status().code(),
            absl::StatusCode::kPermissionDenied);
  client.reset();
  const absl::Status stopped = server.Stop(/*timeout_seconds=*/10);
  EXPECT_TRUE(stopped.ok()) << stopped;
}

// Checkpoint, SIGTERM, a new process with --restore: the same samples get
// bit-identical probabilities, and training goes on identically (the
// optimizer state came back too). Both processes read their flags from a
// config file (listen address, preset, checkpoint dir).
TEST_F(ClientServerProcessTest, RestartFromCheckpointPredictsBitwiseIdentical) {
  const std::string config_file =
      WriteFile("server.toml",
                "# dlrm_server flags for this test\n"
                "listen = \"127.0.0.1:0\"\n"
                "metrics-listen = \"\"\n"
                "config = \"tiny\"\n"
                "checkpoint-dir = \"" +
                    (dir_ / "ckpt").string() +
                    "\"\n"
                    "log-level = \"warn\"\n");
  std::vector<uint32_t> at_save, after_more;
  int64_t saved_step = 0;
  std::vector<data::Batch> probe, more;
  {
    ServerProcess server;
    const absl::Status error =
        server.Start({server_path_, "--server-config", config_file}, 60);
    ASSERT_TRUE(error.ok()) << error;
    // The listen address came from the file (not the default port 50051).
    EXPECT_EQ(server.address().rfind("127.0.0.1:", 0), 0u) << server.address();
    EXPECT_NE(server.address(), "127.0.0.1:50051");
    std::unique_ptr<Client> client;
    ModelConfig config;
    const absl::Status connected =
        ConnectAndReadConfig(server, &client, &config);
    ASSERT_TRUE(connected.ok()) << connected;
    // So did the preset: tiny, not the default kaggle.
    EXPECT_EQ(config.num_dense_features(), 4);
    EXPECT_EQ(config.tables_size(), 3);

    BatchListSource train(SyntheticBatches(config, 4, 128, 51));
    TrainOptions options;
    options.batch_size = 128;
    ASSERT_TRUE(client->Train(train, options, nullptr).ok());
    probe = SyntheticBatches(config, 1, 64, 52);
    more = SyntheticBatches(config, 2, 128, 53);
    ASSERT_EQ(probe.size(), 1u);
    absl::StatusOr<std::vector<float>> p = client->Predict(probe[0]);
    ASSERT_TRUE(p.ok()) << p.status();
    at_save = Bits(*p);
    absl::StatusOr<CheckpointResponse> saved =
        client->SaveCheckpoint("before-restart");
    ASSERT_TRUE(saved.ok()) << saved.status();
    saved_step = saved->step();
    EXPECT_EQ(saved_step, 4);

    // Training after the save, to compare with the restored server's.
    BatchListSource more_source(more);
    ASSERT_TRUE(client->Train(more_source, options, nullptr).ok());
    p = client->Predict(probe[0]);
    ASSERT_TRUE(p.ok()) << p.status();
    after_more = Bits(*p);
    EXPECT_NE(after_more, at_save);
    client.reset();
    const absl::Status stop_error = server.Stop(/*timeout_seconds=*/10);
    ASSERT_TRUE(stop_error.ok()) << stop_error;
  }

  ServerProcess restarted;
  const absl::Status error = restarted.Start(
      {server_path_, "--server-config", config_file, "--restore",
       (dir_ / "ckpt" / "before-restart").string()},
      60);
  ASSERT_TRUE(error.ok()) << error;
  std::unique_ptr<Client> client;
  ModelConfig config;
  const absl::Status connected =
      ConnectAndReadConfig(restarted, &client, &config);
  ASSERT_TRUE(connected.ok()) << connected;
  absl::StatusOr<ModelInfo> info = client->GetModelInfo();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->steps(), saved_step);
  absl::StatusOr<std::vector<float>> p = client->Predict(probe[0]);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(Bits(*p), at_save);

  BatchListSource more_source(more);
  TrainOptions options;
  options.batch_size = 128;
  ASSERT_TRUE(client->Train(more_source, options, nullptr).ok());
  p = client->Predict(probe[0]);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(Bits(*p), after_more);
  client.reset();
  const absl::Status stop_error = restarted.Stop(/*timeout_seconds=*/10);
  EXPECT_TRUE(stop_error.ok()) << stop_error;
}

// Predict from several threads while a Train stream runs: every call
// succeeds, and every answer is exactly the model's at some step boundary
// (predictions never see a half-applied step), never going back in time for
// one caller. The reference answers come from replaying the same batches one
// step at a time from a checkpoint of the starting state.
TEST_F(ClientServerProcessTest, PredictDuringTrainingSeesWholeSteps) {
  ServerProcess server;
  const absl::Status error = server.Start(
      {server_path_, "--listen", "127.0.0.1:0", "--metrics-listen", "",
       "--config", "tiny", "--checkpoint-dir", (dir_ / "ckpt").string(),
       "--log-level", "warn", "--predict-max-wait-us", "200"},
      60);
  ASSERT_TRUE(error.ok()) << error;
  std::unique_ptr<Client> client;
  ModelConfig config;
  const absl::Status connected = ConnectAndReadConfig(server, &client, &config);
  ASSERT_TRUE(connected.ok()) << connected;
  ASSERT_TRUE(client->SaveCheckpoint("start").ok());

  constexpr int kSteps = 150;
  constexpr int kThreads = 4;
  constexpr int64_t kProbeSize = 24;
  const std::vector<data::Batch> batches =
      SyntheticBatches(config, kSteps, 256, 61);
  const data::Batch probe = SyntheticBatches(config, 1, kProbeSize, 62)[0];

  std::atomic<bool> training_done{false};
  std::vector<std::vector<std::vector<float>>> answers(kThreads);
  std::vector<absl::Status> errors(kThreads);
  std::vector<std::thread> predictors;
  for (int t = 0; t < kThreads; ++t) {
    predictors.emplace_back([&, t] {
      // At least 10 calls each, so some overlap even a fast training run.
      while (!training_done.load() || answers[t].size() < 10) {
        absl::StatusOr<std::vector<float>> p = client->Predict(probe);
        if (!p.ok()) {
          errors[t] = p.status();
          return;
        }
        answers[t].push_back(std::move(*p));
      }
    });
  }
  BatchListSource source(batches);
  TrainOptions options;
  options.batch_size = 256;
  absl::StatusOr<TrainSummary> summary =
      client->Train(source, options, nullptr);
  training_done = true;
  for (std::thread& t : predictors) t.join();
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_EQ(summary->steps, kSteps);

  // The model after each step k (k = 0: the start), one step at a time.
  ASSERT_TRUE(client->RestoreCheckpoint("start").ok());
  std::map<std::vector<uint32_t>, int> step_of;
  for (int k = 0; k <= kSteps; ++k) {
    absl::StatusOr<std::vector<float>> p = client->Predict(probe);
    ASSERT_TRUE(p.ok()) << p.status();
    step_of.emplace(Bits(*p), k);
    if (k == kSteps) break;
    BatchListSource one({batches[k]});
    ASSERT_TRUE(client->Train(one, options, nullptr).ok());
  }
  ASSERT_GT(step_of.size(), kSteps / 2u) << "steps barely change the model";

  std::set<int> steps_seen;
  int64_t calls = 0;
  for (int t = 0; t < kThreads; ++t) {
    ASSERT_TRUE(errors[t].ok()) << "thread " << t << ": " << errors[t];
    int last = 0;
    for (const std::vector<float>& p : answers[t]) {
      ++calls;
      ASSERT_EQ(p.size(), static_cast<size_t>(kProbeSize));
      for (const float x : p) {
        ASSERT_GT(x, 0);
        ASSERT_LT(x, 1);
      }
      const auto it = step_of.find(Bits(p));
      ASSERT_NE(it, step_of.end())
          << "thread " << t << " got a prediction of no step boundary";
      EXPECT_GE(it->second, last) << "thread " << t << " went back in time";
      last = it->second;
      steps_seen.insert(it->second);
    }
  }
  // Some predictions ran while training was under way.
  EXPECT_GE(steps_seen.size(), 2u) << calls << " predictions";
  std::printf("%lld predictions saw %zu of %d step boundaries\n",
              static_cast<long long>(calls), steps_seen.size(), kSteps + 1);
  client.reset();
  const absl::Status stop_error = server.Stop(/*timeout_seconds=*/10);
  EXPECT_TRUE(stop_error.ok()) << stop_error;
}

// --- a user's first hour: ports, paths, warnings, the CLI's answers ------

// A second dlrm_server on a port the first holds exits 1 naming the flag,
// the address and the reason, for the gRPC port and the metrics port (both
// used to bind with SO_REUSEPORT and share the port); the first serves on.
TEST_F(ClientServerProcessTest, SecondServerOnATakenPortFailsNamingIt) {
  const int metrics_port = FreePort();
  ASSERT_GT(metrics_port, 0);
  const std::string metrics = absl::StrCat("127.0.0.1:", metrics_port);
  ServerProcess first;
  const absl::Status started =
      first.Start({server_path_, "--listen", "127.0.0.1:0", "--metrics-listen",
                   metrics, "--config", "tiny", "--log-level", "warn"},
                  60);
  ASSERT_TRUE(started.ok()) << started;

  CommandResult r =
      RunCommand({server_path_, "--listen", first.address(), "--metrics-listen",
                  "", "--config", "tiny", "--log-level", "warn"},
                 dir_);
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_HAS_SUBSTR(r.err,
                    "--listen " + first.address() + ": address already in use")
      << r.err;
  EXPECT_NO_SUBSTR(r.out, "listening on") << r.out;

  r = RunCommand({server_path_, "--listen", "127.0.0.1:0", "--metrics-listen",
                  metrics, "--config", "tiny", "--log-level", "warn"},
                 dir_);
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_HAS_SUBSTR(r.err,
                    "--metrics-listen " + metrics + ": address already in use")
      << r.err;
  EXPECT_NO_SUBSTR(r.out, "listening on") << r.out;

  absl::StatusOr<std::unique_ptr<Client>> client =
      Client::Connect(first.address());
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_TRUE((*client)->GetModelInfo().ok());
  client->reset();
  const absl::Status stopped = first.Stop();
  EXPECT_TRUE(stopped.ok()) << stopped;
}

// Every path flag is checked before anything starts, --dry-run included,
// each error naming the flag and the path; a checkpoint directory that
// does not exist yet but can be made passes (and is not made by a dry run).
TEST_F(ClientServerProcessTest, PathFlagsAreCheckedAtStartNamingTheFlag) {
  const std::string file = WriteFile("afile", "not a directory\n");
  const std::string missing = (dir_ / "missing").string();
  struct Case {
    std::vector<std::string> flags;
    std::string error;
  };
  const std::vector<Case> cases = {
      {{"--checkpoint-dir", file},
       "--checkpoint-dir " + file + " is not a directory"},
      {{"--checkpoint-dir", file + "/sub"},
       "--checkpoint-dir " + file + "/sub is not a directory"},
      // Not writable even for root.
      {{"--checkpoint-dir", "/proc/dlrm_clients_test"},
       "--checkpoint-dir /proc/dlrm_clients_test is not writable"},
      {{"--data-dir", missing}, "--data-dir " + missing + " does not exist"},
      {{"--data-dir", file}, "--data-dir " + file + " is not a directory"},
      {{"--allow-data-path", missing},
       "--allow-data-path " + missing + " does not exist"},
  };
  for (const Case& c : cases) {
    for (const bool dry_run : {true, false}) {
      SCOPED_TRACE(absl::StrCat(c.flags[0], " ", c.flags[1],
                                dry_run ? " --dry-run" : ""));
      std::vector<std::string> args = {
          server_path_, "--listen", "127.0.0.1:0", "--metrics-listen",
          "",           "--config", "tiny"};
      args.insert(args.end(), c.flags.begin(), c.flags.end());
      if (dry_run) args.push_back("--dry-run");
      const CommandResult r = RunCommand(args, dir_);
      EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
      EXPECT_HAS_SUBSTR(r.err, c.error) << r.err;
      EXPECT_NO_SUBSTR(r.out, "listening on") << r.out;
    }
  }
  const fs::path later = dir_ / "made" / "later";
  const CommandResult r =
      RunCommand({server_path_, "--config", "tiny", "--checkpoint-dir",
                  later.string(), "--dry-run"},
                 dir_);
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_FALSE(fs::exists(dir_ / "made"));
}

// dlrm_train checks its path flags the same way, before it allocates.
TEST_F(ClientServerProcessTest, TrainerPathFlagsAreCheckedAtStart) {
  const std::string train = BinaryPath("DLRM_TRAIN", "model/dlrm_train");
  DLRM_SKIP_UNLESS_BUILT("dlrm_train", train);
  const std::string file = WriteFile("afile", "not a directory\n");
  const std::string missing = (dir_ / "missing.tsv").string();
  CommandResult r = RunCommand(
      {train, "--config", "tiny", "--rocksdb-dir", file, "--steps", "1"}, dir_);
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_HAS_SUBSTR(r.err, "--rocksdb-dir " + file + " is not a directory")
      << r.err;
  r = RunCommand({train, "--config", "tiny", "--train", missing}, dir_);
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_HAS_SUBSTR(r.err, "--train " + missing + " does not exist") << r.err;
  r = RunCommand({train, "--config", "tiny", "--eval", dir_.string()}, dir_);
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_HAS_SUBSTR(r.err, "--eval " + dir_.string() + " is not a file")
      << r.err;
}

// Each binary's --version: the program, then the project version (and git
// describe when the build had it), exit 0.
TEST(VersionFlagTest, EveryBinaryPrintsTheVersion) {
  for (const auto& [env, relative, name] :
       std::vector<std::tuple<const char*, const char*, std::string>>{
           {"DLRM_SERVER", "server/dlrm_server", "dlrm_server"},
           {"DLRM_CLIENT", "clients/dlrm_client", "dlrm_client"},
           {"DLRM_TRAIN", "model/dlrm_train", "dlrm_train"}}) {
    const std::string path = BinaryPath(env, relative);
    if (access(path.c_str(), X_OK) != 0) {
      std::printf("skipped %s: not built (%s)\n", name.c_str(), path.c_str());
      continue;
    }
    const fs::path dir = fs::path(testing::TempDir());
    const CommandResult r = RunCommand({path, "--version"}, dir);
    EXPECT_EQ(r.exit_code, 0) << name << ": " << r.err;
    EXPECT_EQ(r.out, name + " " + kVersionString + "\n") << name;
  }
}

// Runs `args` as `exec ARGS 2>LOG` under /bin/sh, so that ServerProcess
// reads the listening line while the log goes to `log`.
std::vector<std::string> WithLog(const std::vector<std::string>& args,
                                 const fs::path& log) {
  std::vector<std::string> out = {
      "/bin/sh", "-c", "exec \"$@\" 2>\"" + log.string() + "\"", "sh"};
  out.insert(out.end(), args.begin(), args.end());
  return out;
}

// Trains `count` synthetic batches of 32 samples (seed `seed`) on `server`
// through a client, then stops it: each part succeeds.
void TrainThenStop(ServerProcess& server, int count, uint64_t seed) {
  std::unique_ptr<Client> client;
  ModelConfig config;
  const absl::Status connected = ConnectAndReadConfig(server, &client, &config);
  ASSERT_TRUE(connected.ok()) << connected;
  BatchListSource batches(SyntheticBatches(config, count, 32, seed));
  TrainOptions options;
  options.batch_size = 32;
  ASSERT_TRUE(client->Train(batches, options, nullptr).ok());
  client.reset();
  const absl::Status stopped = server.Stop();
  EXPECT_TRUE(stopped.ok()) << stopped;
}

// A training server without --checkpoint-dir says at start that trained
// steps are lost at a stop, and at the stop how many are; one that saves
// on exit says neither.
TEST_F(ClientServerProcessTest, UnsavedStepsAreWarnedOfAtStartAndAtStop) {
  const fs::path log = dir_ / "server.log";
  {
    ServerProcess server;
    const absl::Status started = server.Start(
        WithLog({server_path_, "--listen", "127.0.0.1:0", "--metrics-listen",
                 "", "--config", "tiny", "--threads", "1"},
                log),
        60);
    ASSERT_TRUE(started.ok()) << started;
    EXPECT_HAS_SUBSTR(ReadFile(log),
                      "no --checkpoint-dir: trained steps are "
                      "lost when it stops; pass --checkpoint-dir")
        << ReadFile(log);
    ASSERT_NO_FATAL_FAILURE(TrainThenStop(server, 3, 5));
  }
  EXPECT_HAS_SUBSTR(ReadFile(log),
                    "stopping with 3 trained steps (the model is "
                    "at step 3) that no checkpoint holds: they "
                    "are lost")
      << ReadFile(log);

  ServerProcess saving;
  const absl::Status started = saving.Start(
      WithLog({server_path_, "--listen", "127.0.0.1:0", "--metrics-listen", "",
               "--config", "tiny", "--threads", "1", "--checkpoint-dir",
               (dir_ / "ckpt").string(), "--checkpoint-on-exit"},
              log),
      60);
  ASSERT_TRUE(started.ok()) << started;
  ASSERT_NO_FATAL_FAILURE(TrainThenStop(saving, 2, 6));
  const std::string text = ReadFile(log);
  EXPECT_NO_SUBSTR(text, "no --checkpoint-dir") << text;
  EXPECT_NO_SUBSTR(text, "they are lost") << text;
  EXPECT_HAS_SUBSTR(text, "saved checkpoint to") << text;
}

// `job list` on a server with no jobs says so; `info` prints its memory
// lines sorted, the same on every call.
TEST_F(ClientServerProcessTest, CliJobListSaysWhenEmptyAndInfoIsStable) {
  const std::string client_path =
      BinaryPath("DLRM_CLIENT", "clients/dlrm_client");
  DLRM_SKIP_UNLESS_BUILT("dlrm_client", client_path);
  ServerProcess server;
  const absl::Status started =
      server.Start({server_path_, "--listen", "127.0.0.1:0", "--metrics-listen",
                    "", "--config", "tiny", "--log-level", "warn"},
                   60);
  ASSERT_TRUE(started.ok()) << started;
  CommandResult r = RunCommand(
      {client_path, "--server", server.address(), "job", "list"}, dir_);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "no jobs on " + server.address() +
                       " (start one with: job start)\n");
  std::vector<std::string> first;
  for (int call = 0; call < 3; ++call) {
    r = RunCommand({client_path, "--server", server.address(), "info"}, dir_);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    std::vector<std::string> memory;
    for (const std::string& line : Lines(r.out)) {
      if (line.rfind("memory ", 0) == 0) memory.push_back(line);
    }
    EXPECT_FALSE(memory.empty()) << r.out;
    EXPECT_TRUE(std::is_sorted(memory.begin(), memory.end())) << r.out;
    if (call == 0) first = memory;
    EXPECT_EQ(memory, first);
  }
  const absl::Status stopped = server.Stop();
  EXPECT_TRUE(stopped.ok()) << stopped;
}

}  // namespace
}  // namespace dlrm::clients
