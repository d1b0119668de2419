// Secret and PEM files, the token rule, and a constant-time comparison.
#include "core/secrets.h"

#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace dlrm {
namespace {

constexpr size_t kMinTokenLength = 16;

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

}  // namespace

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

absl::StatusOr<std::string> ReadPemFile(const std::string& path,
                                        absl::string_view what) {
  ASSIGN_OR_RETURN(std::string pem, ReadWholeFile(path, what));
  if (!absl::StrContains(pem, "-----BEGIN ")) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " ", path, " holds no PEM block"));
  }
  return pem;
}

absl::Status ValidateSecretToken(absl::string_view token,
                                 absl::string_view what) {
  if (token.size() < kMinTokenLength) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " has ", token.size(), " characters; use at least ",
                     kMinTokenLength, " (e.g. `openssl rand -hex 32`)"));
  }
  for (const char c : token) {
    if (c < 0x21 || c > 0x7e) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " may hold printable ASCII only, without spaces"));
    }
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

}  // namespace dlrm
