// The file-system calls of the storage code (checkpoints, manifests,
// safetensors files, exports) behind one small interface, so that tests can
// put a fault-injecting layer (core/fault_injection_file_system.h) between
// that code and the OS. Metadata queries (exists, sizes, listings) and
// memory-mapped reads go to the OS directly.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace dlrm {

// Every error below names the path and the OS's reason, with the code
// ErrnoStatus gives it: ResourceExhausted for a full disk or quota,
// NotFound for a missing file, Internal for other I/O errors.

// A file open for writing. Not thread-safe. Destroying it without Close()
// closes it and drops the close's error.
class WritableFile {
 public:
  virtual ~WritableFile() = default;
  // Appends `data` at the end.
  virtual absl::Status Append(std::string_view data) = 0;
  // Makes everything appended durable (fsync).
  virtual absl::Status Sync() = 0;
  // Closes the file; every later call fails with FailedPrecondition.
  virtual absl::Status Close() = 0;
};

// A file open for reading from its start. Not thread-safe.
class SequentialFile {
 public:
  virtual ~SequentialFile() = default;
  // Reads up to `n` bytes into `buffer`; returns how many, 0 at the end.
  virtual absl::StatusOr<size_t> Read(char* buffer, size_t n) = 0;
};

// Implementations are thread-safe.
class FileSystem {
 public:
  virtual ~FileSystem() = default;
  // Creates `path` for writing, truncating a file already there.
  virtual absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(
      const std::string& path) = 0;
  // Opens `path` for reading. NotFound when it does not exist.
  virtual absl::StatusOr<std::unique_ptr<SequentialFile>> NewSequentialFile(
      const std::string& path) = 0;
  // Renames `from` to `to`, atomically replacing a file (or an empty
  // directory) at `to`.
  virtual absl::Status Rename(const std::string& from,
                              const std::string& to) = 0;
  // Swaps the existing entries `a` and `b` atomically (renameat2 with
  // RENAME_EXCHANGE). Unimplemented where the file system cannot.
  virtual absl::Status Exchange(const std::string& a, const std::string& b) = 0;
  // Removes `path` and everything under it; OK when it does not exist.
  virtual absl::Status RemoveAll(const std::string& path) = 0;
  // Creates the directory `path` and its missing parents; OK when it
  // exists.
  virtual absl::Status CreateDirectories(const std::string& path) = 0;
  // Makes the directory's entries (creations, renames) durable (fsync).
  virtual absl::Status SyncDirectory(const std::string& path) = 0;
};

// The real file system (POSIX calls). Never null; lives for the process.
FileSystem* DefaultFileSystem();

// Writes `data` to `path` (replacing it), syncs and closes it.
absl::Status WriteFile(FileSystem& fs, const std::string& path,
                       std::string_view data);

// The whole content of `path`.
absl::StatusOr<std::string> ReadFile(FileSystem& fs, const std::string& path);

// The status of an OS error `err` (an errno value) while `what` ("writing",
// "renaming ... to") `path`: ResourceExhausted for ENOSPC and EDQUOT,
// NotFound for ENOENT, Internal otherwise. The message is "<what> <path>:
// <strerror>".
absl::Status ErrnoStatus(int err, std::string_view what,
                         const std::string& path);

}  // namespace dlrm
