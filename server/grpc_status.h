// How the public services' handlers turn a Status into a grpc::Status (the
// coordinator's service in comm/ maps its own, unescaped), and the common
// ending of every RPC: count it in the metrics, log failures, finish; and
// the common start of the unary ones, the token check.
#pragma once

#include <grpcpp/grpcpp.h>

#include <functional>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/auth.h"
#include "server/metrics.h"
#include "server/work_queue.h"

namespace dlrm::server {

// Same code (absl and gRPC share code numbers) and message, with control
// and non-ASCII bytes escaped (EscapeForMessage, core/escape.h): a path or
// field from a client or a file can put no raw bytes into a reply.
grpc::Status ToGrpcStatus(const absl::Status& status);

// Records `status` for `method` (the full name, "/dlrm.Admin/GetMetrics"),
// logs it (escaped) when it is an error, and finishes `reactor` with it.
void FinishUnary(grpc::ServerUnaryReactor* reactor, ServerMetrics* metrics,
                 absl::string_view method, const absl::Status& status);

// FinishUnary of `result`'s status, its value moved into *response first
// when it is OK.
template <typename T>
void FinishWith(absl::StatusOr<T> result, T* response,
                grpc::ServerUnaryReactor* reactor, ServerMetrics* metrics,
                absl::string_view method) {
  if (result.ok()) *response = *std::move(result);
  FinishUnary(reactor, metrics, method, result.status());
}

// Queues `work` (which finishes `reactor` itself) on `queue`; when the
// queue takes no more work (the server is shutting down), finishes
// `reactor` with Unavailable for `method` instead.
void SubmitUnary(WorkQueue& queue, std::function<void()> work,
                 grpc::ServerUnaryReactor* reactor, ServerMetrics* metrics,
                 absl::string_view method);

// True when `auth` lets the call of `context` pass for `access`; else
// finishes `reactor` with the refusal as FinishUnary does (for `method`)
// and returns false: the handler then returns `reactor`.
bool AdmitUnary(const TokenAuth& auth,
                const grpc::CallbackServerContext& context, RpcAccess access,
                grpc::ServerUnaryReactor* reactor, ServerMetrics* metrics,
                absl::string_view method);

}  // namespace dlrm::server
