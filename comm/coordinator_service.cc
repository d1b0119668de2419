// The Coordinator service's handlers over its state, and the standalone
// server that hosts it (comm/coordinator_service.h).
#include "comm/coordinator_service.h"

#include <grpcpp/server_builder.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "comm/coordinator_state.h"
#include "comm/listen_address.h"
#include "core/secrets.h"
#include "core/status.h"
#include "spdlog/spdlog.h"

namespace dlrm::comm {

namespace {

using Clock = CoordinatorState::Clock;

// The service answers with the core's Status as a grpc::Status; the codes
// have the same numbers in both.
grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      std::string(status.message()));
}

// A call that may wait: completed by the state through its DoneFn, or here
// when gRPC cancels it while it still waits. gRPC deletes it after Finish.
class WaitingCall final : public grpc::ServerUnaryReactor {
 public:
  WaitingCall(CoordinatorState* state, uint64_t call_id)
      : state_(state), call_id_(call_id) {}

  void OnCancel() override {
    // When the state no longer holds the call it has finished it (or is
    // about to), and finishing twice is not allowed.
    if (state_->Cancel(call_id_)) Finish(grpc::Status::CANCELLED);
  }
  void OnDone() override { delete this; }

 private:
  CoordinatorState* state_;
  const uint64_t call_id_;
};

// When a waiting call gives up: a little before the client's deadline, so
// that the answer naming what is missing arrives before the client's own
// DEADLINE_EXCEEDED, and never later than max_wait_seconds.
Clock::time_point WaitDeadline(const grpc::CallbackServerContext* context,
                               double max_wait_seconds) {
  using std::chrono::duration_cast;
  using std::chrono::nanoseconds;
  const auto max_wait = duration_cast<nanoseconds>(
      std::chrono::duration<double>(max_wait_seconds));
  auto remaining = max_wait;
  const auto client_deadline = context->deadline();
  const auto now = std::chrono::system_clock::now();
  if (client_deadline - now < max_wait) {
    remaining = duration_cast<nanoseconds>(client_deadline - now);
    const auto margin =
        std::min<nanoseconds>(std::chrono::milliseconds(200), remaining / 5);
    remaining = std::max<nanoseconds>(nanoseconds(0), remaining - margin);
  }
  return Clock::now() + remaining;
}

}  // namespace

absl::Status CoordinatorOptions::Validate() const {
  if (!(max_wait_seconds > 0)) {
    return absl::InvalidArgumentError("max_wait_seconds must be > 0");
  }
  if (max_value_bytes <= 0) {
    return absl::InvalidArgumentError("max_value_bytes must be > 0");
  }
  if (!join_token.empty()) {
    RETURN_IF_ERROR(ValidateSecretToken(join_token, "the join token"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<CoordinatorService>> CoordinatorService::Create(
    const CoordinatorOptions& options) {
  RETURN_IF_ERROR(options.Validate());
  return std::unique_ptr<CoordinatorService>(new CoordinatorService(options));
}

CoordinatorService::CoordinatorService(const CoordinatorOptions& options)
    : options_(options), state_(std::make_unique<CoordinatorState>(options)) {}

CoordinatorService::~CoordinatorService() = default;

void CoordinatorService::Shutdown() { state_->Shutdown(); }

grpc::ServerUnaryReactor* CoordinatorService::RefuseWithoutToken(
    grpc::CallbackServerContext* context, absl::string_view rpc) {
  if (options_.join_token.empty()) return nullptr;
  const BearerMatch match = MatchBearerToken(*context, options_.join_token);
  if (match == BearerMatch::kMatches) return nullptr;
  // Says whether a token came, never how close it was.
  const std::string why =
      match == BearerMatch::kMissing
          ? "join token rejected: the call carries no \"authorization: "
            "Bearer <token>\" metadata"
          : "join token rejected";
  spdlog::warn("coordinator: refused {} from {}: {}", std::string(rpc),
               context->peer(), why);
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status(grpc::StatusCode::UNAUTHENTICATED, why));
  return reactor;
}

grpc::ServerUnaryReactor* CoordinatorService::RegisterRank(
    grpc::CallbackServerContext* context, const RegisterRankRequest* request,
    RegisterRankResponse* response) {
  if (auto* refused = RefuseWithoutToken(context, "RegisterRank")) {
    return refused;
  }
  const uint64_t call_id = state_->NextCallId();
  auto* call = new WaitingCall(state_.get(), call_id);
  state_->RegisterRank(call_id, *request,
                       WaitDeadline(context, options_.max_wait_seconds),
                       [call, response](CoordinatorState::Outcome outcome) {
                         response->set_session_id(outcome.session_id);
                         call->Finish(ToGrpcStatus(outcome.status));
                       });
  return call;
}

grpc::ServerUnaryReactor* CoordinatorService::StoreSet(
    grpc::CallbackServerContext* context, const StoreSetRequest* request,
    StoreSetResponse* response) {
  if (auto* refused = RefuseWithoutToken(context, "StoreSet")) return refused;
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(state_->StoreSet(*request)));
  return reactor;
}

grpc::ServerUnaryReactor* CoordinatorService::StoreGet(
    grpc::CallbackServerContext* context, const StoreGetRequest* request,
    StoreGetResponse* response) {
  if (auto* refused = RefuseWithoutToken(context, "StoreGet")) return refused;
  const uint64_t call_id = state_->NextCallId();
  auto* call = new WaitingCall(state_.get(), call_id);
  state_->StoreWait(call_id, request->session_id(), {request->key()},
                    /*want_value=*/true,
                    WaitDeadline(context, options_.max_wait_seconds),
                    [call, response](CoordinatorState::Outcome outcome) {
                      *response->mutable_value() = std::move(outcome.value);
                      call->Finish(ToGrpcStatus(outcome.status));
                    });
  return call;
}

grpc::ServerUnaryReactor* CoordinatorService::StoreWait(
    grpc::CallbackServerContext* context, const StoreWaitRequest* request,
    StoreWaitResponse* response) {
  if (auto* refused = RefuseWithoutToken(context, "StoreWait")) {
    return refused;
  }
  const uint64_t call_id = state_->NextCallId();
  auto* call = new WaitingCall(state_.get(), call_id);
  state_->StoreWait(
      call_id, request->session_id(),
      std::vector<std::string>(request->keys().begin(), request->keys().end()),
      /*want_value=*/false, WaitDeadline(context, options_.max_wait_seconds),
      [call](CoordinatorState::Outcome outcome) {
        call->Finish(ToGrpcStatus(outcome.status));
      });
  return call;
}

grpc::ServerUnaryReactor* CoordinatorService::Heartbeat(
    grpc::CallbackServerContext* context, const HeartbeatRequest* request,
    HeartbeatResponse* response) {
  if (auto* refused = RefuseWithoutToken(context, "Heartbeat")) {
    return refused;
  }
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (request->job_id().empty() || request->rank() < 0) {
    reactor->Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                 "Heartbeat: needs a job_id and a rank >= 0"));
    return reactor;
  }
  {
    std::lock_guard<std::mutex> lock(beats_mu_);
    beats_[request->job_id()][request->rank()] =
        Beat{request->host(), std::chrono::steady_clock::now()};
  }
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

std::vector<RankHeartbeat> CoordinatorService::Heartbeats(
    const std::string& job_id) const {
  std::vector<RankHeartbeat> out;
  const auto now = std::chrono::steady_clock::now();
  std::lock_guard<std::mutex> lock(beats_mu_);
  const auto job = beats_.find(job_id);
  if (job == beats_.end()) return out;
  for (const auto& [rank, beat] : job->second) {
    out.push_back(RankHeartbeat{
        rank, beat.host, std::chrono::duration<double>(now - beat.at).count()});
  }
  return out;
}

absl::Status CoordinatorServerOptions::Validate() const {
  if (listen_address.empty() || listen_address.find(':') == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("listen_address '", listen_address, "' is not host:port"));
  }
  RETURN_IF_ERROR(tls.Validate());
  return coordinator.Validate();
}

absl::StatusOr<std::unique_ptr<CoordinatorServer>> CoordinatorServer::Start(
    const CoordinatorServerOptions& options) {
  RETURN_IF_ERROR(options.Validate());
  ASSIGN_OR_RETURN(std::shared_ptr<grpc::ServerCredentials> credentials,
                   MakeServerCredentials(options.tls));
  ASSIGN_OR_RETURN(std::unique_ptr<CoordinatorService> service,
                   CoordinatorService::Create(options.coordinator));
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(options.listen_address, credentials, &port);
  // The port is this coordinator's alone: with SO_REUSEPORT (gRPC's
  // default) a second job's rank 0 would share it and split the ranks.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.RegisterService(service.get());
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    return ListenFailure("--coordinator", options.listen_address);
  }
  const std::string host =
      options.listen_address.substr(0, options.listen_address.rfind(':'));
  return std::unique_ptr<CoordinatorServer>(
      new CoordinatorServer(std::move(service), std::move(server),
                            absl::StrCat(host, ":", port), port));
}

CoordinatorServer::CoordinatorServer(
    std::unique_ptr<CoordinatorService> service,
    std::unique_ptr<grpc::Server> server, std::string address, int port)
    : service_(std::move(service)),
      server_(std::move(server)),
      address_(std::move(address)),
      port_(port) {}

CoordinatorServer::~CoordinatorServer() {
  service_->Shutdown();
  // A rank's heartbeat cut off mid-call (a partitioned link) would hold a
  // Shutdown without a deadline forever; after it, calls are cancelled.
  server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  server_->Wait();
}

}  // namespace dlrm::comm
