// gRPC-level abuse of a real dlrm_server process (tiny config, port 0):
// oversized messages, bytes that are not messages, streams opened and
// abandoned, a connection dropped mid-message, deadlines that expire. After
// each, the server must keep serving (Predict answers, a new Train stream can
// start) and, where the abuse trains on nothing, the model's weight checksum
// must not move.
#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "clients/client.h"
#include "clients/server_process.h"
#include "core/config.h"
#include "data/synthetic.h"
#include "data/wire.h"
#include "dlrm/service.grpc.pb.h"
#include "tests/server/raw_call.h"
#include "tests/server/rpc.h"
#include "tests/support/expect.h"
#include "tests/support/process.h"

namespace dlrm {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr int kMaxConcurrentStreams = 8;
// The server's --train-idle-timeout-s.
constexpr int kIdleSeconds = 2;

std::string ServerPath() { return test::ServerBinary(); }

// One server for the whole suite: the point is that it survives every test
// in turn.
class ServerAbuseTest : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    path_ = ServerPath();
    if (access(path_.c_str(), X_OK) != 0) return;
    server_ = std::make_unique<clients::ServerProcess>();
    start_status_ = server_->Start({path_,
                                    "--listen",
                                    "127.0.0.1:0",
                                    "--metrics-listen",
                                    "",
                                    "--config",
                                    "tiny",
                                    "--threads",
                                    "1",
                                    "--max-message-mb",
                                    "1",
                                    "--max-batch-samples",
                                    "2048",
                                    "--max-concurrent-streams",
                                    std::to_string(kMaxConcurrentStreams),
                                    "--predict-max-wait-us",
                                    "100",
                                    "--train-idle-timeout-s",
                                    std::to_string(kIdleSeconds),
                                    "--log-level",
                                    "warn"},
                                   /*timeout_seconds=*/60);
  }

  static void TearDownTestSuite() {
    if (server_ == nullptr) return;
    // Exit 0 after all of it: no crash, an orderly shutdown.
    const absl::Status stopped = server_->Stop(/*timeout_seconds=*/20);
    EXPECT_TRUE(stopped.ok()) << stopped;
    server_.reset();
  }

  void SetUp() override {
    if (server_ == nullptr) {
      GTEST_SKIP() << "dlrm_server is not built (looked for " << path_
                   << "; set DLRM_SERVER to override)";
    }
    ASSERT_TRUE(start_status_.ok()) << start_status_;
    auto client = clients::Client::Connect(server_->address());
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = std::move(*client);
    auto info = client_->GetModelInfo();
    ASSERT_TRUE(info.ok()) << info.status();
    auto config = NormalizeModelConfig(info->config());
    ASSERT_TRUE(config.ok()) << config.status();
    config_ = *config;
    channel_ = grpc::CreateChannel(server_->address(),
                                   grpc::InsecureChannelCredentials());
    trainer_ = Trainer::NewStub(channel_);
    predictor_ = Predictor::NewStub(channel_);
  }

  // `samples` synthetic samples for the served model, as a wire batch.
  Batch WireBatch(int64_t samples, uint64_t seed) {
    data::SyntheticOptions options;
    options.teacher_seed = config_.seed();
    options.sample_seed = seed;
    auto source = data::MakeSyntheticSource(config_, options);
    EXPECT_TRUE(source.ok()) << source.status();
    data::Batch batch;
    EXPECT_TRUE((*source)->Next(samples, &batch).ok());
    Batch wire;
    data::BatchToProto(batch, /*include_labels=*/true, &wire);
    return wire;
  }

  uint64_t Checksum() {
    auto info = client_->GetModelInfo(/*include_weight_checksum=*/true);
    EXPECT_TRUE(info.ok()) << info.status();
    return info.ok() ? info->weight_checksum() : 0;
  }

  int64_t Steps() {
    auto info = client_->GetModelInfo();
    EXPECT_TRUE(info.ok()) << info.status();
    return info.ok() ? info->steps() : -1;
  }

  // The server still answers a Predict on a fresh connection.
  void ExpectPredictWorks() {
    auto client = clients::Client::Connect(server_->address());
    ASSERT_TRUE(client.ok()) << client.status();
    Batch wire = WireBatch(4, 99);
    data::Batch batch;
    data::BatchShape shape;
    shape.num_dense = config_.num_dense_features();
    shape.id_limits = data::TableIdLimits(config_);
    ASSERT_TRUE(data::BatchFromProto(wire, shape, data::Labels::kRequired, 0,
                                     "batch", &batch)
                    .ok());
    auto probs = (*client)->Predict(batch);
    ASSERT_TRUE(probs.ok()) << probs.status();
    EXPECT_EQ(probs->size(), 4u);
  }

  // A Train stream that trains one batch, retrying while the training slot
  // is still held by a stream the server is tearing down: the slot must come
  // free within `seconds`. Returns the final status.
  grpc::Status TrainOneBatch(double seconds) {
    const Clock::time_point deadline =
        Clock::now() + std::chrono::duration_cast<Clock::duration>(
                           std::chrono::duration<double>(seconds));
    TrainRequest request;
    *request.mutable_batch() = WireBatch(8, 5);
    while (true) {
      grpc::ClientContext context;
      auto stream = trainer_->Train(&context);
      TrainResponse response;
      const bool wrote = stream->Write(request);
      stream->WritesDone();
      const bool read = wrote && stream->Read(&response);
      while (stream->Read(&response)) {
      }
      grpc::Status status = stream->Finish();
      if (status.ok() && !read) {
        status = grpc::Status(grpc::StatusCode::INTERNAL, "no step result");
      }
      if (status.error_code() != grpc::StatusCode::FAILED_PRECONDITION ||
          Clock::now() > deadline) {
        return status;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }

  static inline std::string path_;
  static inline absl::Status start_status_;
  static inline std::unique_ptr<clients::ServerProcess> server_;
  std::unique_ptr<clients::Client> client_;
  ModelConfig config_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<Trainer::Stub> trainer_;
  std::unique_ptr<Predictor::Stub> predictor_;
};

TEST_F(ServerAbuseTest, OversizedMessagesAreRefusedAndChangeNothing) {
  const uint64_t before = Checksum();
  const int64_t steps = Steps();
  // 2048 tiny samples are about 56 KB; 50000 are over the 1 MiB limit
  // (and over --max-batch-samples, which gRPC never gets to check).
  PredictRequest big;
  *big.mutable_batch() = WireBatch(50000, 11);
  ASSERT_GT(big.ByteSizeLong(), size_t{1} << 20);
  {
    grpc::ClientContext context;
    PredictResponse response;
    const grpc::Status s = predictor_->Predict(&context, big, &response);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
        << s.error_message();
  }
  {
    grpc::ClientContext context;
    auto stream = trainer_->Train(&context);
    TrainRequest request;
    *request.mutable_batch() = big.batch();
    stream->Write(request);
    stream->WritesDone();
    TrainResponse response;
    EXPECT_FALSE(stream->Read(&response));
    const grpc::Status s = stream->Finish();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
        << s.error_message();
  }
  // Under the byte limit but over the sample limit: the server's own check.
  {
    PredictRequest many;
    *many.mutable_batch() = WireBatch(2049, 12);
    ASSERT_LT(many.ByteSizeLong(), size_t{1} << 20);
    grpc::ClientContext context;
    PredictResponse response;
    test::ExpectRpcError(predictor_->Predict(&context, many, &response),
                         grpc::StatusCode::INVALID_ARGUMENT,
                         "exceeds the limit of 2048");
  }
  ExpectPredictWorks();
  EXPECT_EQ(Checksum(), before);
  EXPECT_EQ(Steps(), steps);
}

// Bytes that are not a message at all, on Predict and inside a Train
// stream: INVALID_ARGUMENT naming what could not be parsed (gRPC alone
// would answer UNIMPLEMENTED, or end the stream with OK as if the client
// had closed it), nothing trained, the server serving on.
TEST_F(ServerAbuseTest, UnparseableMessagesAreInvalidArgument) {
  const uint64_t before = Checksum();
  const int64_t steps = Steps();
  const std::string garbage(1000, '\xff');
  const test::RawUnaryReply predict =
      test::RawUnaryCall(channel_, "/dlrm.Predictor/Predict", garbage);
  EXPECT_EQ(predict.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(predict.status.error_message(),
            "request could not be parsed as PredictRequest");
  for (int attempt = 0; attempt < 250; ++attempt) {
    const test::RawStreamReply train =
        test::RawStreamCall(channel_, "/dlrm.Trainer/Train", {garbage});
    // A stream of an earlier test may still be giving training back.
    if (train.status.error_code() == grpc::StatusCode::FAILED_PRECONDITION) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      continue;
    }
    EXPECT_EQ(train.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_EQ(train.status.error_message(),
              "stream message 0 could not be parsed as TrainRequest");
    EXPECT_TRUE(train.messages.empty());
    break;
  }
  ExpectPredictWorks();
  EXPECT_EQ(Checksum(), before);
  EXPECT_EQ(Steps(), steps);
  const grpc::Status next = TrainOneBatch(/*seconds=*/10);
  EXPECT_TRUE(next.ok()) << next.error_code() << " " << next.error_message();
}

TEST_F(ServerAbuseTest, AbandonedStreamsAreFreed) {
  const uint64_t before = Checksum();
  // Three times the per-connection stream limit, on one channel: each is
  // opened and cancelled without a batch and without WritesDone. Were
  // cancelled streams kept, the ninth would wait forever for a free slot.
  for (int i = 0; i < 3 * kMaxConcurrentStreams; ++i) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(10));
    auto stream = trainer_->Train(&context);
    context.TryCancel();
    const grpc::Status s = stream->Finish();
    EXPECT_NE(s.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << i;
  }
  // Many at once, then all dropped: all but one are refused (one training
  // stream at a time), the one that got the slot gives it back.
  {
    std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
    std::vector<
        std::unique_ptr<grpc::ClientReaderWriter<TrainRequest, TrainResponse>>>
        streams;
    for (int i = 0; i < kMaxConcurrentStreams; ++i) {
      contexts.push_back(std::make_unique<grpc::ClientContext>());
      streams.push_back(trainer_->Train(contexts.back().get()));
    }
    for (auto& c : contexts) c->TryCancel();
    for (auto& s : streams) s->Finish();
  }
  EXPECT_EQ(Checksum(), before);
  ExpectPredictWorks();

  // Streams that train a batch, read its result, then vanish mid-stream.
  const int64_t steps = Steps();
  for (int i = 0; i < 5; ++i) {
    grpc::Status status;
    for (int attempt = 0; attempt < 250; ++attempt) {
      grpc::ClientContext context;
      auto stream = trainer_->Train(&context);
      TrainRequest request;
      *request.mutable_batch() = WireBatch(8, 100 + i);
      TrainResponse response;
      if (stream->Write(request) && stream->Read(&response)) {
        context.TryCancel();
        status = stream->Finish();
        break;
      }
      status = stream->Finish();
      if (status.error_code() != grpc::StatusCode::FAILED_PRECONDITION) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    EXPECT_EQ(status.error_code(), grpc::StatusCode::CANCELLED)
        << status.error_message();
  }
  EXPECT_EQ(Steps(), steps + 5);
  const grpc::Status next = TrainOneBatch(/*seconds=*/10);
  EXPECT_TRUE(next.ok()) << next.error_code() << " " << next.error_message();
  ExpectPredictWorks();
}

// Speaks just enough HTTP/2 by hand to open a Train call and send the first
// part of a message (a gRPC length prefix promising more bytes than follow),
// which no gRPC client library can do.
class RawHttp2Stream {
 public:
  // Connects to the port of `address` (host:port) on loopback; false if
  // the port does not parse or the connection fails.
  bool Connect(const std::string& address) {
    int port = 0;
    if (!absl::SimpleAtoi(address.substr(address.rfind(':') + 1), &port)) {
      return false;
    }
    fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    return fd_ >= 0 &&
           connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  }

  // Preface, settings (acknowledging the server's), then HEADERS of a Train
  // call on stream 1 and a DATA frame with `sent` of the `promised` message
  // bytes. False if a write fails or the server's settings never come.
  bool SendPartialTrainMessage(const std::string& authority, uint32_t promised,
                               uint32_t sent) {
    std::string out = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    AppendFrame(&out, /*type=*/4, /*flags=*/0, /*stream=*/0, "");
    if (!WriteAll(out) || !AckServerSettings()) return false;
    std::string headers;
    for (const auto& [name, value] :
         std::vector<std::pair<std::string, std::string>>{
             {":method", "POST"},
             {":scheme", "http"},
             {":path", "/dlrm.Trainer/Train"},
             {":authority", authority},
             {"content-type", "application/grpc"},
             {"te", "trailers"}}) {
      // HPACK literal without indexing, new name, no Huffman coding.
      headers.push_back('\0');
      headers.push_back(static_cast<char>(name.size()));
      headers += name;
      headers.push_back(static_cast<char>(value.size()));
      headers += value;
    }
    out.clear();
    AppendFrame(&out, /*type=*/1, /*flags=END_HEADERS*/ 4, 1, headers);
    std::string data(5, '\0');
    for (int i = 0; i < 4; ++i) {
      data[1 + i] = static_cast<char>(promised >> (24 - 8 * i));
    }
    data += std::string(sent, '\x0a');
    AppendFrame(&out, /*type=*/0, /*flags=*/0, 1, data);
    return WriteAll(out);
  }

  // Drops the connection without a goodbye (no RST_STREAM, no GOAWAY), as a
  // client process that dies does.
  void Drop() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }

  ~RawHttp2Stream() { Drop(); }

 private:
  static void AppendFrame(std::string* out, uint8_t type, uint8_t flags,
                          uint32_t stream, const std::string& payload) {
    const uint32_t n = static_cast<uint32_t>(payload.size());
    out->push_back(static_cast<char>(n >> 16));
    out->push_back(static_cast<char>(n >> 8));
    out->push_back(static_cast<char>(n));
    out->push_back(static_cast<char>(type));
    out->push_back(static_cast<char>(flags));
    for (int i = 0; i < 4; ++i) {
      out->push_back(static_cast<char>(stream >> (24 - 8 * i)));
    }
    *out += payload;
  }

  bool WriteAll(const std::string& bytes) {
    size_t done = 0;
    while (done < bytes.size()) {
      const ssize_t n =
          send(fd_, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
      if (n <= 0) return false;
      done += static_cast<size_t>(n);
    }
    return true;
  }

  // Reads frames until the server's SETTINGS (not an ACK) and acknowledges
  // it; gRPC drops a peer that never does.
  bool AckServerSettings() {
    std::string in;
    const Clock::time_point deadline = Clock::now() + std::chrono::seconds(10);
    while (Clock::now() < deadline) {
      while (in.size() >= 9) {
        const uint32_t n = (static_cast<uint8_t>(in[0]) << 16) |
                           (static_cast<uint8_t>(in[1]) << 8) |
                           static_cast<uint8_t>(in[2]);
        if (in.size() < 9 + n) break;
        const uint8_t type = static_cast<uint8_t>(in[3]);
        const uint8_t flags = static_cast<uint8_t>(in[4]);
        in.erase(0, 9 + n);
        if (type == 4 && (flags & 1) == 0) {
          std::string ack;
          AppendFrame(&ack, 4, /*ACK*/ 1, 0, "");
          return WriteAll(ack);
        }
      }
      pollfd p{fd_, POLLIN, 0};
      if (poll(&p, 1, 100) <= 0) continue;
      char buffer[4096];
      const ssize_t got = recv(fd_, buffer, sizeof(buffer), 0);
      if (got <= 0) return false;
      in.append(buffer, static_cast<size_t>(got));
    }
    return false;
  }

  int fd_ = -1;
};

TEST_F(ServerAbuseTest, HalfAMessageThenStallThenDrop) {
  const uint64_t before = Checksum();
  const int64_t steps = Steps();
  const std::string address = server_->address();
  RawHttp2Stream raw;
  ASSERT_TRUE(raw.Connect(address));
  ASSERT_TRUE(raw.SendPartialTrainMessage(address, /*promised=*/100000,
                                          /*sent=*/300));
  // While it stalls holding the training slot, inference goes on and a
  // second trainer is told why it cannot start.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  ExpectPredictWorks();
  {
    grpc::ClientContext context;
    auto stream = trainer_->Train(&context);
    stream->WritesDone();
    TrainResponse response;
    while (stream->Read(&response)) {
    }
    const grpc::Status s = stream->Finish();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION)
        << s.error_message();
    EXPECT_HAS_SUBSTR(s.error_message(), "training is busy")
        << s.error_message();
  }
  // The client vanishes: the server cancels the call and frees the slot.
  raw.Drop();
  const grpc::Status next = TrainOneBatch(/*seconds=*/10);
  EXPECT_TRUE(next.ok()) << next.error_code() << " " << next.error_message();
  EXPECT_EQ(Steps(), steps + 1);
  EXPECT_NE(Checksum(), before);  // the one real batch trained
  ExpectPredictWorks();
}

// A client that stalls without going away (the connection stays open) is
// cut off after --train-idle-timeout-s, whether it stalls inside a message
// or between batches, and training comes free.
TEST_F(ServerAbuseTest, StalledStreamsEndAfterTheIdleTimeout) {
  const std::string address = server_->address();
  RawHttp2Stream raw;
  ASSERT_TRUE(raw.Connect(address));
  ASSERT_TRUE(raw.SendPartialTrainMessage(address, /*promised=*/5000,
                                          /*sent=*/10));
  const Clock::time_point stalled = Clock::now();
  // Let the server start the call (it takes the training slot) first.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const grpc::Status next = TrainOneBatch(/*seconds=*/4 * kIdleSeconds);
  EXPECT_TRUE(next.ok()) << next.error_code() << " " << next.error_message();
  EXPECT_GE(Clock::now() - stalled, std::chrono::seconds(kIdleSeconds) -
                                        std::chrono::milliseconds(100));
  ExpectPredictWorks();

  // Between batches: one batch trained, then silence.
  grpc::ClientContext context;
  std::unique_ptr<test::TrainStream> stream =
      test::TrainedOneBatch(*trainer_, &context, WireBatch(8, 31));
  ASSERT_NE(stream, nullptr);
  TrainResponse response;
  EXPECT_FALSE(stream->Read(&response));  // returns when the server ends it
  const grpc::Status s = stream->Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED)
      << s.error_message();
  EXPECT_HAS_SUBSTR(s.error_message(), "--train-idle-timeout-s")
      << s.error_message();
  const grpc::Status after = TrainOneBatch(/*seconds=*/4 * kIdleSeconds);
  EXPECT_TRUE(after.ok()) << after.error_code() << " " << after.error_message();
}

TEST_F(ServerAbuseTest, ExpiredDeadlinesLeaveTheServerServing) {
  const uint64_t before = Checksum();
  PredictRequest request;
  *request.mutable_batch() = WireBatch(64, 21);
  int expired = 0;
  for (int i = 0; i < 200; ++i) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::microseconds(i % 2 == 0 ? 1 : 300));
    PredictResponse response;
    const grpc::Status s = predictor_->Predict(&context, request, &response);
    if (s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) ++expired;
    EXPECT_TRUE(s.ok() || s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED)
        << s.error_code() << " " << s.error_message();
  }
  EXPECT_GT(expired, 0);
  EXPECT_EQ(Checksum(), before);

  // A Train stream whose deadline passes while it waits for the client's
  // next batch: it ends, and the slot comes free for the next trainer.
  // (First wait for the slot, which an earlier test's stream may still be
  // giving back.)
  ASSERT_TRUE(TrainOneBatch(/*seconds=*/10).ok());
  {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::milliseconds(300));
    auto stream = trainer_->Train(&context);
    TrainRequest train;
    *train.mutable_batch() = WireBatch(8, 22);
    EXPECT_TRUE(stream->Write(train));
    TrainResponse response;
    EXPECT_TRUE(stream->Read(&response));
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    while (stream->Read(&response)) {
    }
    const grpc::Status s = stream->Finish();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED)
        << s.error_message();
  }
  const grpc::Status next = TrainOneBatch(/*seconds=*/10);
  EXPECT_TRUE(next.ok()) << next.error_code() << " " << next.error_message();
  ExpectPredictWorks();
}

}  // namespace
}  // namespace dlrm
