// Tests for the server's security: the bearer token (server/auth.h) and TLS
// on the gRPC port, with mutual TLS. In-process servers on ephemeral ports
// with the "tiny" model, driven by the C++ client library; certificates are
// made at test time by the openssl command-line tool.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "clients/client.h"
#include "comm/grpc_auth.h"
#include "core/config.h"
#include "core/secrets.h"
#include "data/synthetic.h"
#include "model/model.h"
#include "server/auth.h"
#include "server/dlrm_server.h"
#include "server/health_probe.h"
#include "tests/server/raw_call.h"
#include "tests/support/files.h"
#include "tests/support/synthetic.h"
#include "tests/support/test_certs.h"

namespace dlrm::server {
namespace {

using test::MakeTempDir;
using test::WriteFile;

namespace fs = std::filesystem;

constexpr char kToken[] = "0123456789abcdef0123456789abcdef";
constexpr char kWrongSameLength[] = "0123456789abcdef0123456789abcdeX";

ModelConfig Tiny() {
  absl::StatusOr<ModelConfig> c = LoadModelConfig("tiny");
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

ServerOptions BaseOptions() {
  ServerOptions o;
  o.listen = "127.0.0.1:0";
  o.metrics_listen = "";
  o.predict_max_wait_us = 100;
  return o;
}

absl::StatusOr<std::unique_ptr<DlrmServer>> StartServer(ServerOptions o) {
  absl::StatusOr<std::unique_ptr<model::Model>> model =
      model::Model::Create(Tiny());
  if (!model.ok()) return model.status();
  return DlrmServer::Start(*std::move(model), std::move(o));
}

clients::ClientOptions QuickClient() {
  clients::ClientOptions o;
  o.connect_timeout_seconds = 3;
  o.call_timeout_seconds = 30;
  return o;
}

// `samples` samples of the tiny model's synthetic stream 8 (teacher 7).
data::SyntheticOptions TinyStream(int64_t samples) {
  data::SyntheticOptions o;
  o.num_samples = samples;
  o.teacher_seed = 7;
  o.sample_seed = 8;
  return o;
}

std::unique_ptr<data::BatchSource> Synthetic(int64_t samples) {
  absl::StatusOr<std::unique_ptr<data::BatchSource>> source =
      data::MakeSyntheticSource(Tiny(), TinyStream(samples));
  EXPECT_TRUE(source.ok()) << source.status();
  return *std::move(source);
}

data::Batch SyntheticBatch(int64_t n) {
  return test::SyntheticBatch(Tiny(), n, TinyStream(n));
}

absl::Status TrainTwoSteps(clients::Client& client) {
  std::unique_ptr<data::BatchSource> source = Synthetic(64);
  clients::TrainOptions o;
  o.batch_size = 32;
  return client.Train(*source, o, nullptr).status();
}

// grpc.health.v1.Health/Check of the whole server over `channel`: the RPC
// status (the payload is not looked at).
grpc::Status HealthCheck(const std::shared_ptr<grpc::Channel>& channel) {
  return server::CallHealthCheck(channel, 10);
}

// ------------------------------------------------------------ unit checks

TEST(ConstantTimeEqualsTest, ComparesWholeStrings) {
  EXPECT_TRUE(ConstantTimeEquals(kToken, kToken));
  EXPECT_TRUE(ConstantTimeEquals("", ""));
  EXPECT_FALSE(ConstantTimeEquals(kToken, kWrongSameLength));
  EXPECT_FALSE(ConstantTimeEquals("0123456789abcdef", kToken));  // prefix
  EXPECT_FALSE(ConstantTimeEquals(kToken, "0123456789abcdef"));
  EXPECT_FALSE(ConstantTimeEquals("", kToken));
  EXPECT_FALSE(ConstantTimeEquals(kToken, ""));
}

TEST(AuthOptionsTest, ValidateRejectsWeakTokensAndOrphanFlags) {
  AuthOptions o;
  EXPECT_TRUE(o.Validate().ok());
  o.predict_requires_token = true;
  EXPECT_EQ(o.Validate().code(), absl::StatusCode::kInvalidArgument);
  o.token = "short";
  EXPECT_EQ(o.Validate().code(), absl::StatusCode::kInvalidArgument);
  o.token = "0123456789 abcdef";  // a space
  EXPECT_EQ(o.Validate().code(), absl::StatusCode::kInvalidArgument);
  o.token = kToken;
  EXPECT_TRUE(o.Validate().ok());
}

TEST(TlsOptionsTest, ValidateNeedsCertAndKeyTogether) {
  comm::TlsServerOptions o;
  EXPECT_TRUE(o.Validate().ok());
  o.cert_file = "server.pem";
  EXPECT_EQ(o.Validate().code(), absl::StatusCode::kInvalidArgument);
  o.key_file = "server.key";
  EXPECT_TRUE(o.Validate().ok());
  o = comm::TlsServerOptions();
  o.client_ca_file = "ca.pem";
  EXPECT_EQ(o.Validate().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ReadSecretFileTest, StripsTheNewlineAndRefusesEmptyOrMissingFiles) {
  const fs::path dir = MakeTempDir("secret");
  WriteFile(dir / "token", std::string(kToken) + "\n");
  absl::StatusOr<std::string> token =
      ReadSecretFile((dir / "token").string(), "--auth-token-file");
  ASSERT_TRUE(token.ok()) << token.status();
  EXPECT_EQ(*token, kToken);
  WriteFile(dir / "empty", "\n");
  EXPECT_EQ(ReadSecretFile((dir / "empty").string(), "--auth-token-file")
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ReadSecretFile((dir / "missing").string(), "--auth-token-file")
                .status()
                .code(),
            absl::StatusCode::kNotFound);
  fs::remove_all(dir);
}

TEST(ClientOptionsTest, TlsFilesNeedTlsAndCertNeedsKey) {
  clients::ClientOptions o;
  o.tls_ca_file = "ca.pem";
  EXPECT_EQ(o.Validate().code(), absl::StatusCode::kInvalidArgument);
  o.tls = true;
  EXPECT_TRUE(o.Validate().ok());
  o.tls_cert_file = "client.pem";
  EXPECT_EQ(o.Validate().code(), absl::StatusCode::kInvalidArgument);
  o.tls_key_file = "client.key";
  EXPECT_TRUE(o.Validate().ok());
  o.auth_token = "has a space";
  EXPECT_EQ(o.Validate().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ServerOptionsTest, MaxConcurrentStreamsMustNotBeNegative) {
  ServerOptions o = BaseOptions();
  o.max_concurrent_streams = -1;
  EXPECT_EQ(o.Validate().code(), absl::StatusCode::kInvalidArgument);
  o.max_concurrent_streams = 1;
  EXPECT_TRUE(o.Validate().ok());
}

// ------------------------------------------------------------ the token

class TokenTest : public ::testing::Test {
 protected:
  void StartWithToken(bool predict_requires_token) {
    ServerOptions o = BaseOptions();
    o.auth.token = kToken;
    o.auth.predict_requires_token = predict_requires_token;
    absl::StatusOr<std::unique_ptr<DlrmServer>> server = StartServer(o);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }

  std::unique_ptr<clients::Client> Connect(const std::string& token) {
    clients::ClientOptions o = QuickClient();
    o.auth_token = token;
    absl::StatusOr<std::unique_ptr<clients::Client>> client =
        clients::Client::Connect(server_->address(), o);
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? *std::move(client) : nullptr;
  }

  std::unique_ptr<DlrmServer> server_;
};

TEST_F(TokenTest, WithoutTheTokenTrainerAndAdminAreUnauthenticated) {
  StartWithToken(/*predict_requires_token=*/false);
  std::unique_ptr<clients::Client> client = Connect("");
  ASSERT_NE(client, nullptr);
  constexpr auto kUnauth = absl::StatusCode::kUnauthenticated;
  EXPECT_EQ(client->GetModelInfo().status().code(), kUnauth);
  EXPECT_EQ(client->GetMetrics().status().code(), kUnauth);
  EXPECT_EQ(client->SaveCheckpoint("x").status().code(), kUnauth);
  EXPECT_EQ(client->RestoreCheckpoint("x").status().code(), kUnauth);
  EXPECT_EQ(client->ExportWeights("x").status().code(), kUnauth);
  EXPECT_EQ(client->ListJobs().status().code(), kUnauth);
  EXPECT_EQ(client->GetJob("job-1").status().code(), kUnauth);
  EXPECT_EQ(client->CancelJob("job-1").status().code(), kUnauth);
  JobRequest job;
  job.mutable_train()->mutable_synthetic()->set_num_samples(64);
  EXPECT_EQ(client->StartJob(job).status().code(), kUnauth);
  EvaluateRequest eval;
  eval.mutable_dataset()->mutable_synthetic()->set_num_samples(64);
  EXPECT_EQ(client->Evaluate(eval).status().code(), kUnauth);
  EXPECT_EQ(TrainTwoSteps(*client).code(), kUnauth);
  EXPECT_EQ(server_->host()->steps(), 0);
}

TEST_F(TokenTest, PredictAndHealthStayOpenWithoutTheToken) {
  StartWithToken(/*predict_requires_token=*/false);
  std::unique_ptr<clients::Client> client = Connect("");
  ASSERT_NE(client, nullptr);
  absl::StatusOr<std::vector<float>> probs = client->Predict(SyntheticBatch(8));
  ASSERT_TRUE(probs.ok()) << probs.status();
  EXPECT_EQ(probs->size(), 8u);
  const grpc::Status health = HealthCheck(grpc::CreateChannel(
      server_->address(), grpc::InsecureChannelCredentials()));
  EXPECT_TRUE(health.ok()) << health.error_message();
}

TEST_F(TokenTest, WrongTokensAreRefused) {
  StartWithToken(/*predict_requires_token=*/false);
  for (const std::string& token :
       {std::string(kWrongSameLength), std::string("0123456789abcdef"),
        std::string(kToken) + "0"}) {
    SCOPED_TRACE(token);
    std::unique_ptr<clients::Client> client = Connect(token);
    ASSERT_NE(client, nullptr);
    EXPECT_EQ(client->GetModelInfo().status().code(),
              absl::StatusCode::kUnauthenticated);
    EXPECT_EQ(TrainTwoSteps(*client).code(),
              absl::StatusCode::kUnauthenticated);
  }
  EXPECT_EQ(server_->host()->steps(), 0);
}

TEST_F(TokenTest, TheRightTokenWorksEverywhere) {
  StartWithToken(/*predict_requires_token=*/false);
  std::unique_ptr<clients::Client> client = Connect(kToken);
  ASSERT_NE(client, nullptr);
  absl::StatusOr<ModelInfo> info = client->GetModelInfo();
  ASSERT_TRUE(info.ok()) << info.status();
  const absl::Status trained = TrainTwoSteps(*client);
  ASSERT_TRUE(trained.ok()) << trained;
  EXPECT_EQ(server_->host()->steps(), 2);
  EXPECT_TRUE(client->ListJobs().ok());
  EXPECT_TRUE(client->Predict(SyntheticBatch(4)).ok());
  // The refusals of the earlier calls are counted like any other code.
  absl::StatusOr<std::string> metrics = client->GetMetrics();
  ASSERT_TRUE(metrics.ok()) << metrics.status();
}

TEST_F(TokenTest, PredictRequiresTheTokenWhenAskedTo) {
  StartWithToken(/*predict_requires_token=*/true);
  std::unique_ptr<clients::Client> anonymous = Connect("");
  ASSERT_NE(anonymous, nullptr);
  EXPECT_EQ(anonymous->Predict(SyntheticBatch(4)).status().code(),
            absl::StatusCode::kUnauthenticated);
  std::unique_ptr<clients::Client> wrong = Connect(kWrongSameLength);
  ASSERT_NE(wrong, nullptr);
  EXPECT_EQ(wrong->Predict(SyntheticBatch(4)).status().code(),
            absl::StatusCode::kUnauthenticated);
  std::unique_ptr<clients::Client> client = Connect(kToken);
  ASSERT_NE(client, nullptr);
  absl::StatusOr<std::vector<float>> probs = client->Predict(SyntheticBatch(4));
  ASSERT_TRUE(probs.ok()) << probs.status();
  EXPECT_EQ(probs->size(), 4u);
}

TEST_F(TokenTest, TheSchemeIsCaseInsensitiveAndOtherSchemesAreRefused) {
  StartWithToken(/*predict_requires_token=*/false);
  std::shared_ptr<grpc::Channel> channel = grpc::CreateChannel(
      server_->address(), grpc::InsecureChannelCredentials());
  std::unique_ptr<Admin::Stub> admin = Admin::NewStub(channel);
  const auto get_info = [&](const std::string& authorization) {
    grpc::ClientContext context;
    context.AddMetadata("authorization", authorization);
    ModelInfo info;
    return admin->GetModelInfo(&context, ModelInfoRequest(), &info);
  };
  EXPECT_TRUE(get_info(std::string("bearer ") + kToken).ok());
  EXPECT_EQ(get_info(std::string("Basic ") + kToken).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(get_info(kToken).error_code(), grpc::StatusCode::UNAUTHENTICATED);
}

// Raw bytes (Train and Predict read them raw, server/raw_message.h): the
// token is checked before the bytes are looked at, so a caller without it
// learns nothing from them, and one with it gets the parse error.
TEST_F(TokenTest, UnparseableBytesAreRefusedForTheTokenFirst) {
  StartWithToken(/*predict_requires_token=*/true);
  const std::shared_ptr<grpc::Channel> channel = grpc::CreateChannel(
      server_->address(), grpc::InsecureChannelCredentials());
  const std::string garbage(64, '\xff');
  const test::Metadata with_token = {
      {"authorization", std::string("Bearer ") + kToken}};
  for (const test::Metadata& metadata : {test::Metadata(), with_token}) {
    const grpc::StatusCode want = metadata.empty()
                                      ? grpc::StatusCode::UNAUTHENTICATED
                                      : grpc::StatusCode::INVALID_ARGUMENT;
    EXPECT_EQ(test::RawUnaryCall(channel, "/dlrm.Predictor/Predict", garbage,
                                 metadata)
                  .status.error_code(),
              want);
    EXPECT_EQ(
        test::RawStreamCall(channel, "/dlrm.Trainer/Train", {garbage}, metadata)
            .status.error_code(),
        want);
  }
  EXPECT_EQ(server_->host()->steps(), 0);
}

// ------------------------------------------------------------ TLS

// A CA, a server certificate for localhost / 127.0.0.1 and a client
// certificate, made once per suite (tests/support/test_certs.h).
class TlsTest : public test::TestCertificatesTest {
 protected:
  void Start(bool require_client_cert, const std::string& token = "") {
    ServerOptions o = BaseOptions();
    o.tls.cert_file = File("server.pem");
    o.tls.key_file = File("server.key");
    if (require_client_cert) o.tls.client_ca_file = File("ca.pem");
    o.auth.token = token;
    absl::StatusOr<std::unique_ptr<DlrmServer>> server = StartServer(o);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }

  clients::ClientOptions TlsClient() const {
    clients::ClientOptions o = QuickClient();
    o.tls = true;
    o.tls_ca_file = File("ca.pem");
    return o;
  }

  absl::StatusOr<std::unique_ptr<clients::Client>> Connect(
      const clients::ClientOptions& o) {
    return clients::Client::Connect(server_->address(), o);
  }

  std::unique_ptr<DlrmServer> server_;
};

TEST_F(TlsTest, HandshakeWorksWithTheCaAndCallsSucceed) {
  Start(/*require_client_cert=*/false);
  absl::StatusOr<std::unique_ptr<clients::Client>> client =
      Connect(TlsClient());
  ASSERT_TRUE(client.ok()) << client.status();
  absl::StatusOr<ModelInfo> info = (*client)->GetModelInfo();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_TRUE(TrainTwoSteps(**client).ok());
  EXPECT_TRUE((*client)->Predict(SyntheticBatch(4)).ok());
  // By name too, when the address holds no name the certificate carries.
  clients::ClientOptions by_name = TlsClient();
  by_name.tls_server_name = "localhost";
  client = Connect(by_name);
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_TRUE((*client)->GetModelInfo().ok());
}

TEST_F(TlsTest, PlaintextClientToTlsServerFails) {
  Start(/*require_client_cert=*/false);
  clients::ClientOptions o = QuickClient();
  o.connect_timeout_seconds = 1;
  EXPECT_EQ(Connect(o).status().code(), absl::StatusCode::kUnavailable);
  // Without waiting for the connection, the first call fails instead.
  o.connect_timeout_seconds = 0;
  o.call_timeout_seconds = 2;
  absl::StatusOr<std::unique_ptr<clients::Client>> client = Connect(o);
  ASSERT_TRUE(client.ok()) << client.status();
  const absl::StatusCode code = (*client)->GetModelInfo().status().code();
  EXPECT_TRUE(code == absl::StatusCode::kUnavailable ||
              code == absl::StatusCode::kDeadlineExceeded)
      << code;
}

TEST_F(TlsTest, UntrustedServerCertificateFails) {
  Start(/*require_client_cert=*/false);
  clients::ClientOptions o = TlsClient();
  o.tls_ca_file = File("other-ca.pem");
  o.connect_timeout_seconds = 1;
  EXPECT_EQ(Connect(o).status().code(), absl::StatusCode::kUnavailable);
}

TEST_F(TlsTest, ClientCertificateModeRefusesClientsWithoutOne) {
  Start(/*require_client_cert=*/true);
  clients::ClientOptions o = TlsClient();
  o.connect_timeout_seconds = 1;
  EXPECT_EQ(Connect(o).status().code(), absl::StatusCode::kUnavailable);
  // A certificate from a CA the server does not trust is refused too.
  o.tls_cert_file = File("stranger.pem");
  o.tls_key_file = File("client.key");
  EXPECT_EQ(Connect(o).status().code(), absl::StatusCode::kUnavailable);
  o.tls_cert_file = File("client.pem");
  absl::StatusOr<std::unique_ptr<clients::Client>> client = Connect(o);
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_TRUE((*client)->GetModelInfo().ok());
}

TEST_F(TlsTest, TokenAndTlsTogether) {
  Start(/*require_client_cert=*/false, kToken);
  clients::ClientOptions o = TlsClient();
  absl::StatusOr<std::unique_ptr<clients::Client>> client = Connect(o);
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_EQ((*client)->GetModelInfo().status().code(),
            absl::StatusCode::kUnauthenticated);
  o.auth_token = kToken;
  client = Connect(o);
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_TRUE((*client)->GetModelInfo().ok());
}

TEST_F(TlsTest, BadOrMissingPemFilesFailAtStart) {
  ServerOptions o = BaseOptions();
  o.tls.cert_file = File("missing.pem");
  o.tls.key_file = File("server.key");
  EXPECT_EQ(StartServer(o).status().code(), absl::StatusCode::kNotFound);
  WriteFile(File("not-pem.pem"), "hello\n");
  o.tls.cert_file = File("not-pem.pem");
  EXPECT_EQ(StartServer(o).status().code(), absl::StatusCode::kInvalidArgument);
  clients::ClientOptions c = TlsClient();
  c.tls_ca_file = File("missing.pem");
  EXPECT_EQ(clients::Client::Connect("127.0.0.1:1", c).status().code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace dlrm::server
