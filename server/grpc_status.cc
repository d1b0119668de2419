// Status mapping and the RPC ending.
#include "server/grpc_status.h"

#include <string>

#include "core/escape.h"
#include "spdlog/spdlog.h"

namespace dlrm::server {

static_assert(static_cast<int>(absl::StatusCode::kUnauthenticated) ==
                  static_cast<int>(grpc::StatusCode::UNAUTHENTICATED),
              "absl and gRPC status codes share numbers");

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      EscapeForMessage(std::string(status.message())));
}

void FinishUnary(grpc::ServerUnaryReactor* reactor, ServerMetrics* metrics,
                 absl::string_view method, const absl::Status& status) {
  metrics->RecordRpc(method, status.code());
  if (!status.ok()) {
    // Client mistakes are routine for a server; its own failures are not.
    const bool client_error =
        status.code() == absl::StatusCode::kInvalidArgument ||
        status.code() == absl::StatusCode::kNotFound ||
        status.code() == absl::StatusCode::kFailedPrecondition;
    spdlog::log(client_error ? spdlog::level::debug : spdlog::level::warn,
                "{}: {}", std::string(method),
                EscapeForMessage(status.ToString()));
  }
  reactor->Finish(ToGrpcStatus(status));
}

bool AdmitUnary(const TokenAuth& auth,
                const grpc::CallbackServerContext& context, RpcAccess access,
                grpc::ServerUnaryReactor* reactor, ServerMetrics* metrics,
                absl::string_view method) {
  const absl::Status allowed = auth.Check(context, access);
  if (allowed.ok()) return true;
  FinishUnary(reactor, metrics, method, allowed);
  return false;
}

void SubmitUnary(WorkQueue& queue, std::function<void()> work,
                 grpc::ServerUnaryReactor* reactor, ServerMetrics* metrics,
                 absl::string_view method) {
  if (!queue.Submit(std::move(work))) {
    FinishUnary(reactor, metrics, method,
                absl::UnavailableError("the server is shutting down"));
  }
}

}  // namespace dlrm::server
