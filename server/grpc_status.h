// How the public services' handlers turn a Status into a grpc::Status (the
// coordinator's service in comm/ maps its own, unescaped), and the common
// ending of every RPC: count it in the metrics, log failures, finish; and
// the common start of the unary ones, the token check.
#pragma once

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "server/auth.h"
#include "server/metrics.h"

namespace dlrm::server {

// Same code (absl and gRPC share code numbers) and message, with control
// and non-ASCII bytes escaped (EscapeForMessage, core/escape.h): a path or
// field from a client or a file can put no raw bytes into a reply.
grpc::Status ToGrpcStatus(const absl::Status& status);

// Records `status` for `method` (the full name, "/dlrm.Admin/GetMetrics"),
// logs it (escaped) when it is an error, and finishes `reactor` with it.
void FinishUnary(grpc::ServerUnaryReactor* reactor, ServerMetrics* metrics,
                 absl::string_view method, const absl::Status& status);

// True when `auth` lets the call of `context` pass for `access`; else
// finishes `reactor` with the refusal as FinishUnary does (for `method`)
// and returns false: the handler then returns `reactor`.
bool AdmitUnary(const TokenAuth& auth,
                const grpc::CallbackServerContext& context, RpcAccess access,
                grpc::ServerUnaryReactor* reactor, ServerMetrics* metrics,
                absl::string_view method);

}  // namespace dlrm::server
