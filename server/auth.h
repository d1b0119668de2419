// Bearer-token authentication of the dlrm services. The token check is one
// helper that every Trainer, Predictor and Admin handler calls first: gRPC
// 1.51's AuthMetadataProcessor runs only on secure ports, and its server
// interceptors cannot end a call with a status of their own, so neither
// covers a plaintext port. The TLS credentials of the port, the metadata
// match and the secret files are shared with the coordinator
// (comm/grpc_auth.h, core/secrets.h).
#pragma once

#include <grpcpp/server_context.h>

#include <string>

#include "absl/status/status.h"

namespace dlrm::server {

// Which token rule applies to an RPC.
enum class RpcAccess {
  kTraining,  // dlrm.Trainer: always needs the token when one is set
  kAdmin,     // dlrm.Admin: always needs the token when one is set
  kPredict,   // dlrm.Predictor: needs it only with predict_requires_token
};

struct AuthOptions {
  // The shared secret clients send as "authorization: Bearer <token>";
  // empty turns authentication off. At least 16 printable ASCII characters
  // without spaces (e.g. `openssl rand -hex 32`). Default: empty.
  std::string token;
  // Predict needs the token too (it is open otherwise). Default: false.
  bool predict_requires_token = false;

  absl::Status Validate() const;
};

// Checks the bearer token of a call. Immutable after construction, so
// thread-safe.
class TokenAuth {
 public:
  // `options` must be valid (AuthOptions::Validate).
  explicit TokenAuth(AuthOptions options);

  // OK when `access` needs no token or the call's "authorization" metadata
  // is "Bearer <token>" (the scheme case-insensitive); else Unauthenticated
  // (never saying how close a wrong token was).
  absl::Status Check(const grpc::ServerContextBase& context,
                     RpcAccess access) const;

  bool enabled() const { return !options_.token.empty(); }

 private:
  const AuthOptions options_;
};

}  // namespace dlrm::server
