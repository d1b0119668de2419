// Token checks, secret files and the TLS credentials of the gRPC port.
#include "server/auth.h"

#include <grpc/grpc_security_constants.h>
#include <grpcpp/security/server_credentials.h>

#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace dlrm::server {
namespace {

constexpr size_t kMinTokenLength = 16;
constexpr absl::string_view kBearer = "bearer ";

absl::StatusOr<std::string> ReadWholeFile(const std::string& path,
                                          absl::string_view what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(absl::StrCat("cannot read ", what, " ", path));
  }
  std::ostringstream contents;
  contents << in.rdbuf();
  if (in.bad()) {
    return absl::NotFoundError(absl::StrCat("cannot read ", what, " ", path));
  }
  return contents.str();
}

absl::StatusOr<std::string> ReadPem(const std::string& path,
                                    absl::string_view what) {
  ASSIGN_OR_RETURN(std::string pem, ReadWholeFile(path, what));
  // gRPC only says "handshaker creation failed" for a bad PEM, and only
  // when a client connects: catch the common mistakes at start-up.
  if (!absl::StrContains(pem, "-----BEGIN ")) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " ", path, " holds no PEM block"));
  }
  return pem;
}

}  // namespace

absl::Status AuthOptions::Validate() const {
  if (token.empty()) {
    if (predict_requires_token) {
      return absl::InvalidArgumentError(
          "predict_requires_token needs an auth token (--auth-token-file)");
    }
    return absl::OkStatus();
  }
  if (token.size() < kMinTokenLength) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the auth token has ", token.size(), " characters; use at least ",
        kMinTokenLength, " (e.g. `openssl rand -hex 32`)"));
  }
  for (const char c : token) {
    if (c < 0x21 || c > 0x7e) {
      return absl::InvalidArgumentError(
          "the auth token may hold printable ASCII only, without spaces");
    }
  }
  return absl::OkStatus();
}

TokenAuth::TokenAuth(AuthOptions options) : options_(std::move(options)) {}

absl::Status TokenAuth::Check(const grpc::ServerContextBase& context,
                              RpcAccess access) const {
  if (options_.token.empty()) return absl::OkStatus();
  if (access == RpcAccess::kPredict && !options_.predict_requires_token) {
    return absl::OkStatus();
  }
  const auto& metadata = context.client_metadata();
  const auto found = metadata.find("authorization");
  if (found == metadata.end()) {
    return absl::UnauthenticatedError(
        "this call needs \"authorization: Bearer <token>\" metadata");
  }
  const absl::string_view value(found->second.data(), found->second.size());
  if (!absl::StartsWithIgnoreCase(value, kBearer) ||
      !ConstantTimeEquals(value.substr(kBearer.size()), options_.token)) {
    return absl::UnauthenticatedError("invalid bearer token");
  }
  return absl::OkStatus();
}

bool ConstantTimeEquals(absl::string_view a, absl::string_view b) {
  // Every byte of `b` is visited whatever `a` holds; `a` is read modulo
  // its length so that a short `a` takes the same path.
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < b.size(); ++i) {
    const unsigned char x = a.empty() ? 0 : a[i % a.size()];
    diff |= x ^ static_cast<unsigned char>(b[i]);
  }
  return diff == 0;
}

absl::StatusOr<std::string> ReadSecretFile(const std::string& path,
                                           absl::string_view flag) {
  ASSIGN_OR_RETURN(std::string secret,
                   ReadWholeFile(path, absl::StrCat(flag, " file")));
  absl::StripTrailingAsciiWhitespace(&secret);
  if (secret.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, " file ", path, " is empty"));
  }
  return secret;
}

absl::Status TlsOptions::Validate() const {
  if (cert_file.empty() != key_file.empty()) {
    return absl::InvalidArgumentError(
        "TLS needs both a certificate and its key (--tls-cert, --tls-key)");
  }
  if (!client_ca_file.empty() && cert_file.empty()) {
    return absl::InvalidArgumentError(
        "--tls-client-ca needs the server's --tls-cert and --tls-key");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const TlsOptions& options) {
  RETURN_IF_ERROR(options.Validate());
  if (!options.enabled()) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions ssl(
      options.client_ca_file.empty()
          ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
          : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  grpc::SslServerCredentialsOptions::PemKeyCertPair pair;
  ASSIGN_OR_RETURN(pair.private_key, ReadPem(options.key_file, "--tls-key"));
  ASSIGN_OR_RETURN(pair.cert_chain, ReadPem(options.cert_file, "--tls-cert"));
  ssl.pem_key_cert_pairs.push_back(std::move(pair));
  if (!options.client_ca_file.empty()) {
    ASSIGN_OR_RETURN(ssl.pem_root_certs,
                     ReadPem(options.client_ca_file, "--tls-client-ca"));
  }
  return grpc::SslServerCredentials(ssl);
}

}  // namespace dlrm::server
