// TLS credentials and bearer-token metadata of gRPC ports and channels,
// shared by the coordinator (comm/coordinator.h) and the public services
// (server/auth.h). They live here, in the lowest module that speaks gRPC,
// so that both use one implementation.
#pragma once

#include <grpcpp/channel.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server_context.h>
#include <grpcpp/support/channel_arguments.h>

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dlrm::comm {

// The TLS files of a gRPC server port.
struct TlsServerOptions {
  // PEM certificate chain the server presents; empty serves plaintext.
  // Default: empty.
  std::string cert_file;
  // PEM private key of cert_file; set exactly when cert_file is.
  // Default: empty.
  std::string key_file;
  // PEM CA certificates: when set, clients must present a certificate
  // signed by one of them (mutual TLS). Needs cert_file. Default: empty.
  std::string client_ca_file;

  // InvalidArgument for a certificate without its key (or the converse),
  // or a client CA without a certificate.
  absl::Status Validate() const;
  bool enabled() const { return !cert_file.empty(); }
};

// How a gRPC channel dials over TLS.
struct TlsClientOptions {
  // Dial over TLS. Default: false.
  bool enabled = false;
  // PEM CA certificates that sign the server's certificate; empty trusts
  // the system's roots. Default: empty.
  std::string ca_file;
  // PEM certificate chain and its key, presented to a server that asks for
  // a client certificate; both or neither. Default: empty.
  std::string cert_file;
  std::string key_file;
  // The name the server's certificate must carry, when it is not the host
  // of the dialled address. Default: empty.
  std::string server_name;

  // InvalidArgument for files or a server name without `enabled`, or a
  // certificate without its key (or the converse).
  absl::Status Validate() const;
};

// The credentials of a server port: InsecureServerCredentials when TLS is
// off, else SslServerCredentials from the PEM files (read now). Errors:
// InvalidArgument for invalid options or a file with no PEM block,
// NotFound when a file cannot be read.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const TlsServerOptions& options);

// The credentials of a channel: InsecureChannelCredentials when TLS is
// off, else SslCredentials from the PEM files (read now). Errors as
// MakeServerCredentials.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>>
MakeChannelCredentials(const TlsClientOptions& options);

// A channel to `target` over `options`' credentials with `args` (plus the
// server name override, if any); it connects lazily. Errors as
// MakeChannelCredentials.
absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeChannel(
    const std::string& target, const TlsClientOptions& options,
    grpc::ChannelArguments args = {});

// The metadata key and value a client sends its bearer token in:
// "authorization: Bearer <token>".
inline constexpr char kAuthorizationKey[] = "authorization";
std::string BearerValue(absl::string_view token);

// How a call's bearer token compares with the expected one.
enum class BearerMatch {
  kMatches,  // "authorization: Bearer <token>", the scheme in any case
  kMissing,  // no "authorization" metadata
  kWrong,    // another token, or another scheme
};

// Compares the call's "authorization" metadata with `token` in time that
// does not depend on where they differ. Thread-safe.
BearerMatch MatchBearerToken(const grpc::ServerContextBase& context,
                             absl::string_view token);

}  // namespace dlrm::comm
