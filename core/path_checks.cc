// The path flags' start-up checks (core/path_checks.h).
#include "core/path_checks.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace dlrm {
namespace {

namespace fs = std::filesystem;

std::string Named(const std::string& flag, const std::string& path) {
  return absl::StrCat(flag, " ", path);
}

// Whether a file can be made in directory `dir`: access() first, then a
// file made and removed at once, since access() answers yes to root for
// every mode and knows nothing of read-only mounts (/proc, a read-only
// volume).
bool CanCreateFileIn(const fs::path& dir) {
  if (access(dir.c_str(), W_OK | X_OK) != 0) return false;
  const fs::path probe =
      dir / absl::StrCat(".dlrm-write-check-", static_cast<long>(getpid()));
  const int fd = open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0600);
  if (fd < 0) return errno == EEXIST;
  close(fd);
  unlink(probe.c_str());
  return true;
}

}  // namespace

absl::Status CheckWritableDir(const std::string& flag,
                              const std::string& path) {
  if (path.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(flag, " is empty"));
  }
  // The path itself, or the nearest ancestor that exists.
  fs::path existing = fs::absolute(fs::path(path));
  std::error_code ec;
  while (!fs::exists(existing, ec) && existing.has_relative_path()) {
    existing = existing.parent_path();
  }
  const bool is_self = fs::equivalent(existing, fs::absolute(path), ec);
  if (!fs::is_directory(existing, ec)) {
    return absl::InvalidArgumentError(absl::StrCat(
        Named(flag, path), " is not a directory",
        is_self ? "" : absl::StrCat(" (", existing.string(), " is a file)")));
  }
  if (!CanCreateFileIn(existing)) {
    return absl::PermissionDeniedError(absl::StrCat(
        Named(flag, path), " is not writable",
        is_self ? ""
                : absl::StrCat(" (it does not exist and ", existing.string(),
                               ", where it would be made, is not writable)")));
  }
  return absl::OkStatus();
}

namespace {

// NotFound, InvalidArgument or PermissionDenied naming `flag` and `path`
// unless `path` is a readable directory (`directory`; searchable too) or
// a readable regular file.
absl::Status CheckReadable(const std::string& flag, const std::string& path,
                           bool directory) {
  std::error_code ec;
  if (!fs::exists(path, ec)) {
    return absl::NotFoundError(
        absl::StrCat(Named(flag, path), " does not exist"));
  }
  if (directory ? !fs::is_directory(path, ec)
                : !fs::is_regular_file(path, ec)) {
    return absl::InvalidArgumentError(
        absl::StrCat(Named(flag, path),
                     directory ? " is not a directory" : " is not a file"));
  }
  if (access(path.c_str(), directory ? R_OK | X_OK : R_OK) != 0) {
    return absl::PermissionDeniedError(
        absl::StrCat(Named(flag, path), " is not readable"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckReadableDir(const std::string& flag,
                              const std::string& path) {
  if (path.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(flag, " is empty"));
  }
  return CheckReadable(flag, path, /*directory=*/true);
}

absl::Status CheckReadableFiles(const std::string& flag,
                                const std::vector<std::string>& paths) {
  for (const std::string& path : paths) {
    if (path == "-") continue;
    RETURN_IF_ERROR(CheckReadable(flag, path, /*directory=*/false));
  }
  return absl::OkStatus();
}

}  // namespace dlrm
