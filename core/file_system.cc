// The POSIX FileSystem and the helpers over any FileSystem.
#include "core/file_system.h"

#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace dlrm {
namespace {

namespace fs = std::filesystem;

absl::Status Closed(const std::string& path) {
  return absl::FailedPreconditionError(
      absl::StrCat(path, " is already closed"));
}

class PosixWritableFile final : public WritableFile {
 public:
  PosixWritableFile(std::string path, int fd)
      : path_(std::move(path)), fd_(fd) {}
  ~PosixWritableFile() override {
    if (fd_ >= 0) ::close(fd_);
  }

  absl::Status Append(std::string_view data) override {
    if (fd_ < 0) return Closed(path_);
    while (!data.empty()) {
      const ssize_t n = ::write(fd_, data.data(), data.size());
      if (n < 0) {
        if (errno == EINTR) continue;
        return ErrnoStatus(errno, "writing", path_);
      }
      data.remove_prefix(static_cast<size_t>(n));
    }
    return absl::OkStatus();
  }

  absl::Status Sync() override {
    if (fd_ < 0) return Closed(path_);
    if (::fsync(fd_) != 0) return ErrnoStatus(errno, "syncing", path_);
    return absl::OkStatus();
  }

  absl::Status Close() override {
    if (fd_ < 0) return Closed(path_);
    const int rc = ::close(fd_);
    fd_ = -1;
    // The descriptor is gone even when close fails (Linux): no retry.
    if (rc != 0) return ErrnoStatus(errno, "closing", path_);
    return absl::OkStatus();
  }

 private:
  const std::string path_;
  int fd_;
};

class PosixSequentialFile final : public SequentialFile {
 public:
  PosixSequentialFile(std::string path, int fd)
      : path_(std::move(path)), fd_(fd) {}
  ~PosixSequentialFile() override { ::close(fd_); }

  absl::StatusOr<size_t> Read(char* buffer, size_t n) override {
    for (;;) {
      const ssize_t got = ::read(fd_, buffer, n);
      if (got >= 0) return static_cast<size_t>(got);
      if (errno != EINTR) return ErrnoStatus(errno, "reading", path_);
    }
  }

 private:
  const std::string path_;
  const int fd_;
};

class PosixFileSystem final : public FileSystem {
 public:
  absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(
      const std::string& path) override {
    const int fd =
        ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return ErrnoStatus(errno, "cannot create", path);
    return std::make_unique<PosixWritableFile>(path, fd);
  }

  absl::StatusOr<std::unique_ptr<SequentialFile>> NewSequentialFile(
      const std::string& path) override {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return ErrnoStatus(errno, "cannot open", path);
    return std::make_unique<PosixSequentialFile>(path, fd);
  }

  absl::Status Rename(const std::string& from, const std::string& to) override {
    if (::rename(from.c_str(), to.c_str()) != 0) {
      return ErrnoStatus(errno, absl::StrCat("renaming ", from, " to"), to);
    }
    return absl::OkStatus();
  }

  absl::Status Exchange(const std::string& a, const std::string& b) override {
    if (::renameat2(AT_FDCWD, a.c_str(), AT_FDCWD, b.c_str(),
                    RENAME_EXCHANGE) == 0) {
      return absl::OkStatus();
    }
    const int err = errno;
    if (err == EINVAL || err == ENOSYS || err == ENOTSUP) {
      return absl::UnimplementedError(absl::StrCat(
          "the file system of ", b,
          " cannot exchange entries atomically: ", std::strerror(err)));
    }
    return ErrnoStatus(err, absl::StrCat("exchanging ", a, " with"), b);
  }

  absl::Status RemoveAll(const std::string& path) override {
    std::error_code ec;
    fs::remove_all(path, ec);
    if (ec) return ErrnoStatus(ec.value(), "removing", path);
    return absl::OkStatus();
  }

  absl::Status CreateDirectories(const std::string& path) override {
    std::error_code ec;
    fs::create_directories(path, ec);
    if (ec) return ErrnoStatus(ec.value(), "cannot create", path);
    return absl::OkStatus();
  }

  absl::Status SyncDirectory(const std::string& path) override {
    const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return ErrnoStatus(errno, "cannot open", path);
    const int rc = ::fsync(fd);
    const int err = errno;
    ::close(fd);
    if (rc != 0) return ErrnoStatus(err, "syncing", path);
    return absl::OkStatus();
  }
};

}  // namespace

FileSystem* DefaultFileSystem() {
  static PosixFileSystem* const fs = new PosixFileSystem();
  return fs;
}

absl::Status WriteFile(FileSystem& fs, const std::string& path,
                       std::string_view data) {
  ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file,
                   fs.NewWritableFile(path));
  RETURN_IF_ERROR(file->Append(data));
  RETURN_IF_ERROR(file->Sync());
  return file->Close();
}

absl::StatusOr<std::string> ReadFile(FileSystem& fs, const std::string& path) {
  ASSIGN_OR_RETURN(std::unique_ptr<SequentialFile> file,
                   fs.NewSequentialFile(path));
  std::string out;
  char buffer[1 << 16];
  for (;;) {
    ASSIGN_OR_RETURN(const size_t n, file->Read(buffer, sizeof(buffer)));
    if (n == 0) return out;
    out.append(buffer, n);
  }
}

absl::Status ErrnoStatus(int err, std::string_view what,
                         const std::string& path) {
  std::string message =
      absl::StrCat(std::string(what), " ", path, ": ", std::strerror(err));
  switch (err) {
    case ENOSPC:
    case EDQUOT:
      return absl::ResourceExhaustedError(std::move(message));
    case ENOENT:
      return absl::NotFoundError(std::move(message));
    default:
      return absl::InternalError(std::move(message));
  }
}

}  // namespace dlrm
