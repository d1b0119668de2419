// Bearer-token authentication of the dlrm services and the TLS credentials
// of the gRPC port. The token check is one helper that every Trainer,
// Predictor and Admin handler calls first: gRPC 1.51's AuthMetadataProcessor
// runs only on secure ports, and its server interceptors cannot end a call
// with a status of their own, so neither covers a plaintext port.
#pragma once

#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server_context.h>

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

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

// True when `a` and `b` are equal; the time taken depends on their lengths
// only, never on where they first differ.
bool ConstantTimeEquals(absl::string_view a, absl::string_view b);

// The contents of the secret file `path` (e.g. --auth-token-file) with
// trailing whitespace (a final newline) removed. NotFound when it cannot be
// read; InvalidArgument when it is empty. `flag` names it in errors.
absl::StatusOr<std::string> ReadSecretFile(const std::string& path,
                                           absl::string_view flag);

struct TlsOptions {
  // PEM certificate chain of the server; empty serves plaintext.
  // Default: empty.
  std::string cert_file;
  // PEM private key of cert_file; set exactly when cert_file is.
  // Default: empty.
  std::string key_file;
  // PEM CA certificates: when set, clients must present a certificate
  // signed by one of them (mutual TLS). Needs cert_file. Default: empty.
  std::string client_ca_file;

  absl::Status Validate() const;
  bool enabled() const { return !cert_file.empty(); }
};

// The credentials of the gRPC port: InsecureServerCredentials when TLS is
// off, else SslServerCredentials from the PEM files (read now). NotFound
// when a file cannot be read; InvalidArgument when one holds no PEM block.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const TlsOptions& options);

}  // namespace dlrm::server
