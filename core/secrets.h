// Shared secrets and PEM files read from disk: the bearer tokens of the
// public services and of the coordinator, and the TLS files of both. No
// gRPC here; comm/grpc_auth.h turns these into credentials.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dlrm {

// The contents of the secret file `path` (e.g. --auth-token-file) with
// trailing whitespace (a final newline) removed. NotFound when it cannot be
// read; InvalidArgument when it is empty. `flag` names it in errors.
absl::StatusOr<std::string> ReadSecretFile(const std::string& path,
                                           absl::string_view flag);

// The contents of the PEM file `path`. NotFound when it cannot be read;
// InvalidArgument when it holds no PEM block (gRPC would only say
// "handshaker creation failed", at the first connection). `what` names the
// file in errors, e.g. "the TLS certificate".
absl::StatusOr<std::string> ReadPemFile(const std::string& path,
                                        absl::string_view what);

// OK when `token` is a usable shared secret: at least 16 printable ASCII
// characters without spaces (e.g. `openssl rand -hex 32`); else
// InvalidArgument naming `what` (e.g. "the auth token"), never the token.
absl::Status ValidateSecretToken(absl::string_view token,
                                 absl::string_view what);

// True when `a` and `b` are equal; the time taken depends on their lengths
// only, never on where they first differ.
bool ConstantTimeEquals(absl::string_view a, absl::string_view b);

}  // namespace dlrm
