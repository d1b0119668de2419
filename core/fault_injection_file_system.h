// A FileSystem for tests that forwards to another one and injects faults
// at chosen points (in the spirit of RocksDB's FaultInjectionTestFS): the
// N-th call of an operation, every call on matching paths, a disk that
// fills up after N bytes, and reads that return corrupted bytes.
#pragma once

#include <cerrno>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/file_system.h"

namespace dlrm {

// The operations a fault can hit.
enum class FileOp {
  kCreate,  // FileSystem::NewWritableFile
  kWrite,   // WritableFile::Append
  kSync,    // WritableFile::Sync and FileSystem::SyncDirectory
  kClose,   // WritableFile::Close
  kRename,  // FileSystem::Rename and Exchange (either path matches)
  kRemove,  // FileSystem::RemoveAll
  kMkdir,   // FileSystem::CreateDirectories
  kRead,    // FileSystem::NewSequentialFile and SequentialFile::Read
  kNumOps
};

// "write", "sync", ...: for messages and test names.
const char* FileOpName(FileOp op);

// Thread-safe. An injected fault fails the call before it reaches the
// target (nothing is written, renamed or removed), with the status the
// real file system gives for the errno chosen, its message ending in
// "(injected)". A write cut short by a full disk writes what fits first,
// as a real one does.
class FaultInjectionFileSystem final : public FileSystem {
 public:
  // `target` is borrowed and must outlive this object.
  explicit FaultInjectionFileSystem(FileSystem* target);

  // Fails the `n`-th call (1-based, counted from now) of `op` on a path
  // containing `path_part` (any path when empty) with `err`, once.
  void FailNth(FileOp op, int64_t n, int err = EIO,
               const std::string& path_part = "");
  // Fails every call of `op` on a path containing `path_part` (any path
  // when empty) with `err` from now on, until Reset().
  void FailAll(FileOp op, int err = EIO, const std::string& path_part = "");
  // A disk with `bytes` free bytes from now on: appends beyond them write
  // what fits and fail with ENOSPC. Removing files frees nothing.
  void SetFreeBytes(int64_t bytes);
  // Every chunk read from a file whose path contains `path_part` comes back
  // with one bit of its first byte flipped, until Reset().
  void CorruptReads(const std::string& path_part);
  // With false, Exchange answers Unimplemented (without counting a call), as
  // on a file system without RENAME_EXCHANGE, until Reset().
  void SetExchangeSupported(bool supported);
  // Drops every fault, the disk limit, the read corruption and the lack of
  // Exchange (the counts below go on).
  void Reset();

  // Calls of `op` so far (failed or not).
  int64_t Count(FileOp op) const;
  // Faults injected so far (failed calls and corrupted reads).
  int64_t injected() const;

  absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(
      const std::string& path) override;
  absl::StatusOr<std::unique_ptr<SequentialFile>> NewSequentialFile(
      const std::string& path) override;
  absl::Status Rename(const std::string& from, const std::string& to) override;
  absl::Status Exchange(const std::string& a, const std::string& b) override;
  absl::Status RemoveAll(const std::string& path) override;
  absl::Status CreateDirectories(const std::string& path) override;
  absl::Status SyncDirectory(const std::string& path) override;

 private:
  class File;
  class Reader;

  struct Rule {
    FileOp op;
    std::string path_part;
    int64_t nth;  // 0: every matching call
    int err;
    int64_t seen = 0;
  };

  // Counts a call of `op` on `path` (and `other`, a rename's source) and
  // returns the fault it gets (OK for none). A rule's path part may match
  // either path; the error names `path`.
  absl::Status Check(FileOp op, const std::string& path,
                     const std::string& other = "");
  // How many of `want` bytes fit on the disk now; takes them.
  size_t Reserve(size_t want);
  bool Corrupts(const std::string& path);

  FileSystem* const target_;
  mutable std::mutex mu_;
  std::vector<Rule> rules_;
  int64_t counts_[static_cast<int>(FileOp::kNumOps)] = {};
  int64_t injected_ = 0;
  int64_t free_bytes_ = -1;  // -1: no limit
  std::vector<std::string> corrupt_;
  bool exchange_supported_ = true;
};

}  // namespace dlrm
