// Start-up checks of the path flags of the binaries (dlrm_server,
// dlrm_train): each names the flag and the path, so that a directory that
// is a file or is not writable is found at start (and by --dry-run), not at
// the first save.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"

namespace dlrm {

// OK when `path` is a directory this process may create files in, or does
// not exist yet and its nearest existing ancestor is such a directory (the
// first save creates it). InvalidArgument "<flag> <path> is not a
// directory" when it (or that ancestor) is something else; PermissionDenied
// "<flag> <path> is not writable" when no file can be made there (tried
// with a file made and removed at once: root passes access() everywhere,
// a read-only mount fails only the write). Creates nothing else.
absl::Status CheckWritableDir(const std::string& flag, const std::string& path);

// OK when `path` is an existing directory this process may list and read.
// NotFound "<flag> <path> does not exist"; InvalidArgument "... is not a
// directory"; PermissionDenied "... is not readable".
absl::Status CheckReadableDir(const std::string& flag, const std::string& path);

// OK when each of `paths` is a readable regular file ("-" is stdin and
// passes). NotFound "<flag> <path> does not exist"; InvalidArgument "... is
// not a file" (a directory, say); PermissionDenied "... is not readable".
absl::Status CheckReadableFiles(const std::string& flag,
                                const std::vector<std::string>& paths);

}  // namespace dlrm
