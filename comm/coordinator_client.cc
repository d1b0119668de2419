// The Coordinator service's client (comm/coordinator_client.h).
#include "comm/coordinator_client.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/secrets.h"
#include "core/status.h"

namespace dlrm::comm {
namespace {

std::chrono::system_clock::duration ToSystemDuration(double seconds) {
  return std::chrono::duration_cast<std::chrono::system_clock::duration>(
      std::chrono::duration<double>(seconds));
}

}  // namespace

absl::Status CoordinatorClientOptions::Validate() const {
  RETURN_IF_ERROR(tls.Validate());
  if (!join_token.empty()) {
    RETURN_IF_ERROR(ValidateSecretToken(join_token, "the join token"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<CoordinatorClient>> CoordinatorClient::Create(
    const std::string& address, const CoordinatorClientOptions& options) {
  if (address.empty()) {
    return absl::InvalidArgumentError("empty coordinator address");
  }
  RETURN_IF_ERROR(options.Validate());
  grpc::ChannelArguments args;
  // Ranks usually start before rank 0's coordinator listens; gRPC's default
  // reconnect backoff (1 s growing to 120 s) would make them miss it for
  // long after it came up.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 50);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 50);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 500);
  ASSIGN_OR_RETURN(std::shared_ptr<grpc::Channel> channel,
                   MakeChannel(address, options.tls, args));
  return std::unique_ptr<CoordinatorClient>(
      new CoordinatorClient(address, options, std::move(channel)));
}

CoordinatorClient::CoordinatorClient(std::string address,
                                     CoordinatorClientOptions options,
                                     std::shared_ptr<grpc::Channel> channel)
    : address_(std::move(address)),
      options_(std::move(options)),
      channel_(std::move(channel)),
      stub_(Coordinator::NewStub(channel_)) {}

void CoordinatorClient::PrepareContext(grpc::ClientContext& context,
                                       double timeout_seconds) const {
  context.set_deadline(std::chrono::system_clock::now() +
                       ToSystemDuration(timeout_seconds));
  context.set_wait_for_ready(true);
  if (!options_.join_token.empty()) {
    context.AddMetadata(kAuthorizationKey, BearerValue(options_.join_token));
  }
}

std::string CoordinatorClient::LastConnectionError() const {
  // Without wait_for_ready a call on a channel that failed to connect ends
  // at once with gRPC's last connection error. The request is one the
  // service refuses at once (no key), should the channel connect now.
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::milliseconds(500));
  if (!options_.join_token.empty()) {
    context.AddMetadata(kAuthorizationKey, BearerValue(options_.join_token));
  }
  StoreGetRequest request;
  StoreGetResponse response;
  const grpc::Status status = stub_->StoreGet(&context, request, &response);
  if (status.error_code() != grpc::StatusCode::UNAVAILABLE) return "";
  return status.error_message();
}

absl::Status CoordinatorClient::CallError(const grpc::Status& status,
                                          absl::string_view rpc,
                                          double timeout_seconds) const {
  const auto code = static_cast<absl::StatusCode>(status.error_code());
  if (code == absl::StatusCode::kUnauthenticated) {
    return absl::UnauthenticatedError(absl::StrCat(
        "the coordinator at ", address_, " refused this rank's join token (",
        options_.join_token.empty() ? "this rank has none"
                                    : "it is not the coordinator's",
        "): ", rpc, ": ", status.error_message()));
  }
  // A deadline that gRPC itself enforced (the coordinator never answered)
  // has no message of ours; say whether the coordinator was reachable, and
  // why not when gRPC knows (refused, a TLS handshake that failed).
  if (code == absl::StatusCode::kDeadlineExceeded &&
      channel_->GetState(false) != GRPC_CHANNEL_READY) {
    const TlsClientOptions& tls = options_.tls;
    const std::string hint =
        tls.enabled
            ? absl::StrCat(
                  "is rank 0 up, at this address, and does its TLS "
                  "certificate chain to this rank's CA and carry the name ",
                  tls.server_name.empty()
                      ? address_.substr(0, address_.rfind(':'))
                      : tls.server_name,
                  "?")
            : "is rank 0 up, at this address, and without TLS like this "
              "rank?";
    const std::string last = LastConnectionError();
    return absl::DeadlineExceededError(absl::StrFormat(
        "coordinator %s: %s: could not reach the coordinator in %.1f s (%s)%s",
        address_, rpc, timeout_seconds, hint,
        last.empty() ? "" : absl::StrCat("; last connection error: ", last)));
  }
  return absl::Status(code, absl::StrCat("coordinator ", address_, ": ", rpc,
                                         ": ", status.error_message()));
}

template <typename Request, typename Response>
absl::Status CoordinatorClient::Call(
    const char* name,
    grpc::Status (::dlrm::Coordinator::Stub::*rpc)(grpc::ClientContext*,
                                                   const Request&, Response*),
    const Request& request, Response* response, double timeout_seconds) {
  grpc::ClientContext context;
  PrepareContext(context, timeout_seconds);
  const grpc::Status status = (stub_.get()->*rpc)(&context, request, response);
  if (!status.ok()) return CallError(status, name, timeout_seconds);
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> CoordinatorClient::RegisterRank(
    std::string_view job_id, int64_t generation, int rank, int world_size,
    double timeout_seconds) {
  RegisterRankRequest request;
  request.set_job_id(std::string(job_id));
  request.set_generation(generation);
  request.set_rank(rank);
  request.set_world_size(world_size);
  RegisterRankResponse response;
  RETURN_IF_ERROR(Call("RegisterRank", &::dlrm::Coordinator::Stub::RegisterRank,
                       request, &response, timeout_seconds));
  return response.session_id();
}

absl::Status CoordinatorClient::StoreSet(uint64_t session_id,
                                         std::string_view key,
                                         std::string_view value,
                                         double timeout_seconds) {
  StoreSetRequest request;
  request.set_session_id(session_id);
  request.set_key(std::string(key));
  request.set_value(std::string(value));
  StoreSetResponse response;
  return Call("StoreSet", &::dlrm::Coordinator::Stub::StoreSet, request,
              &response, timeout_seconds);
}

absl::Status CoordinatorClient::Heartbeat(std::string_view job_id, int rank,
                                          std::string_view host,
                                          double timeout_seconds) {
  HeartbeatRequest request;
  request.set_job_id(std::string(job_id));
  request.set_rank(rank);
  request.set_host(std::string(host));
  HeartbeatResponse response;
  return Call("Heartbeat", &::dlrm::Coordinator::Stub::Heartbeat, request,
              &response, timeout_seconds);
}

absl::StatusOr<std::string> CoordinatorClient::StoreGet(
    uint64_t session_id, std::string_view key, double timeout_seconds) {
  StoreGetRequest request;
  request.set_session_id(session_id);
  request.set_key(std::string(key));
  StoreGetResponse response;
  RETURN_IF_ERROR(Call("StoreGet", &::dlrm::Coordinator::Stub::StoreGet,
                       request, &response, timeout_seconds));
  return std::move(*response.mutable_value());
}

absl::Status CoordinatorClient::StoreWait(uint64_t session_id,
                                          const std::vector<std::string>& keys,
                                          double timeout_seconds) {
  StoreWaitRequest request;
  request.set_session_id(session_id);
  for (const std::string& key : keys) request.add_keys(key);
  StoreWaitResponse response;
  return Call("StoreWait", &::dlrm::Coordinator::Stub::StoreWait, request,
              &response, timeout_seconds);
}

}  // namespace dlrm::comm
