// The token rule of the dlrm services.
#include "server/auth.h"

#include <utility>

#include "comm/grpc_auth.h"
#include "core/secrets.h"

namespace dlrm::server {

absl::Status AuthOptions::Validate() const {
  if (token.empty()) {
    if (predict_requires_token) {
      return absl::InvalidArgumentError(
          "predict_requires_token needs an auth token (--auth-token-file)");
    }
    return absl::OkStatus();
  }
  return ValidateSecretToken(token, "the auth token");
}

TokenAuth::TokenAuth(AuthOptions options) : options_(std::move(options)) {}

absl::Status TokenAuth::Check(const grpc::ServerContextBase& context,
                              RpcAccess access) const {
  if (options_.token.empty()) return absl::OkStatus();
  if (access == RpcAccess::kPredict && !options_.predict_requires_token) {
    return absl::OkStatus();
  }
  switch (comm::MatchBearerToken(context, options_.token)) {
    case comm::BearerMatch::kMatches:
      return absl::OkStatus();
    case comm::BearerMatch::kMissing:
      return absl::UnauthenticatedError(
          "this call needs \"authorization: Bearer <token>\" metadata");
    case comm::BearerMatch::kWrong:
      break;
  }
  return absl::UnauthenticatedError("invalid bearer token");
}

}  // namespace dlrm::server
