// TLS credentials from PEM files, and the bearer-token metadata.
#include "comm/grpc_auth.h"

#include <grpc/grpc_security_constants.h>
#include <grpcpp/create_channel.h>

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/secrets.h"
#include "core/status.h"

namespace dlrm::comm {
namespace {

constexpr absl::string_view kBearer = "bearer ";

}  // namespace

absl::Status TlsServerOptions::Validate() const {
  if (cert_file.empty() != key_file.empty()) {
    return absl::InvalidArgumentError(
        "TLS needs both a certificate and its private key");
  }
  if (!client_ca_file.empty() && cert_file.empty()) {
    return absl::InvalidArgumentError(
        "requiring client certificates (a client CA) needs the server's TLS "
        "certificate and key");
  }
  return absl::OkStatus();
}

absl::Status TlsClientOptions::Validate() const {
  if (!enabled && !(ca_file.empty() && cert_file.empty() && key_file.empty() &&
                    server_name.empty())) {
    return absl::InvalidArgumentError(
        "TLS files and a TLS server name need TLS to be on");
  }
  if (cert_file.empty() != key_file.empty()) {
    return absl::InvalidArgumentError(
        "a client certificate needs its private key, and a key its "
        "certificate");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const TlsServerOptions& options) {
  RETURN_IF_ERROR(options.Validate());
  if (!options.enabled()) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions ssl(
      options.client_ca_file.empty()
          ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
          : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  grpc::SslServerCredentialsOptions::PemKeyCertPair pair;
  ASSIGN_OR_RETURN(pair.private_key,
                   ReadPemFile(options.key_file, "the TLS key"));
  ASSIGN_OR_RETURN(pair.cert_chain,
                   ReadPemFile(options.cert_file, "the TLS certificate"));
  ssl.pem_key_cert_pairs.push_back(std::move(pair));
  if (!options.client_ca_file.empty()) {
    ASSIGN_OR_RETURN(ssl.pem_root_certs,
                     ReadPemFile(options.client_ca_file, "the client CA"));
  }
  return grpc::SslServerCredentials(ssl);
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>>
MakeChannelCredentials(const TlsClientOptions& options) {
  RETURN_IF_ERROR(options.Validate());
  if (!options.enabled) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions ssl;
  if (!options.ca_file.empty()) {
    ASSIGN_OR_RETURN(ssl.pem_root_certs,
                     ReadPemFile(options.ca_file, "the TLS CA"));
  }
  if (!options.cert_file.empty()) {
    ASSIGN_OR_RETURN(ssl.pem_cert_chain,
                     ReadPemFile(options.cert_file, "the TLS certificate"));
    ASSIGN_OR_RETURN(ssl.pem_private_key,
                     ReadPemFile(options.key_file, "the TLS key"));
  }
  return grpc::SslCredentials(ssl);
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeChannel(
    const std::string& target, const TlsClientOptions& options,
    grpc::ChannelArguments args) {
  ASSIGN_OR_RETURN(std::shared_ptr<grpc::ChannelCredentials> credentials,
                   MakeChannelCredentials(options));
  if (!options.server_name.empty()) {
    args.SetSslTargetNameOverride(options.server_name);
  }
  return grpc::CreateCustomChannel(target, credentials, args);
}

std::string BearerValue(absl::string_view token) {
  return absl::StrCat("Bearer ", token);
}

BearerMatch MatchBearerToken(const grpc::ServerContextBase& context,
                             absl::string_view token) {
  const auto& metadata = context.client_metadata();
  const auto found = metadata.find(kAuthorizationKey);
  if (found == metadata.end()) return BearerMatch::kMissing;
  const absl::string_view value(found->second.data(), found->second.size());
  if (!absl::StartsWithIgnoreCase(value, kBearer) ||
      !ConstantTimeEquals(value.substr(kBearer.size()), token)) {
    return BearerMatch::kWrong;
  }
  return BearerMatch::kMatches;
}

}  // namespace dlrm::comm
