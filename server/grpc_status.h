// How the public services' handlers turn a Status into a grpc::Status (the
// coordinator's service in comm/ maps its own, unescaped), and the common
// ending of every RPC: count it in the metrics, log failures, finish; and
// the common frame of the unary ones: the token check, then the handler's
// work (UnaryFrame).
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

// The frame of one service's unary handlers: the token check of `auth`
// for `access`, then the handler's work; every call counted in `metrics`.
// The pointers are borrowed and must outlive the frame.
class UnaryFrame {
 public:
  UnaryFrame(const TokenAuth* auth, RpcAccess access, ServerMetrics* metrics)
      : auth_(auth), access_(access), metrics_(metrics) {}

  // `context`'s default reactor, `handle` called with it when the call is
  // admitted, else the reactor finished with the refusal (AdmitUnary, for
  // `method`). `handle` finishes the reactor itself, at once or from work
  // it queues. Returns the reactor, for the handler to return to gRPC.
  template <typename Handle>
  grpc::ServerUnaryReactor* operator()(grpc::CallbackServerContext* context,
                                       absl::string_view method,
                                       Handle&& handle) const {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    if (AdmitUnary(*auth_, *context, access_, reactor, metrics_, method)) {
      handle(reactor);
    }
    return reactor;
  }

 private:
  const TokenAuth* const auth_;
  const RpcAccess access_;
  ServerMetrics* const metrics_;
};

}  // namespace dlrm::server
