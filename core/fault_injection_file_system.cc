// FaultInjectionFileSystem: rules checked before each forwarded call.
#include "core/fault_injection_file_system.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace dlrm {
namespace {

absl::Status Injected(int err, FileOp op, const std::string& path) {
  const absl::Status s =
      ErrnoStatus(err, absl::StrCat(FileOpName(op), " of"), path);
  return absl::Status(s.code(), absl::StrCat(s.message(), " (injected)"));
}

}  // namespace

const char* FileOpName(FileOp op) {
  switch (op) {
    case FileOp::kCreate:
      return "create";
    case FileOp::kWrite:
      return "write";
    case FileOp::kSync:
      return "sync";
    case FileOp::kClose:
      return "close";
    case FileOp::kRename:
      return "rename";
    case FileOp::kRemove:
      return "remove";
    case FileOp::kMkdir:
      return "mkdir";
    case FileOp::kRead:
      return "read";
    case FileOp::kNumOps:
      break;
  }
  return "unknown";
}

class FaultInjectionFileSystem::File final : public WritableFile {
 public:
  File(FaultInjectionFileSystem* fs, std::string path,
       std::unique_ptr<WritableFile> target)
      : fs_(fs), path_(std::move(path)), target_(std::move(target)) {}

  absl::Status Append(std::string_view data) override {
    RETURN_IF_ERROR(fs_->Check(FileOp::kWrite, path_));
    const size_t fits = fs_->Reserve(data.size());
    RETURN_IF_ERROR(target_->Append(data.substr(0, fits)));
    if (fits < data.size()) return Injected(ENOSPC, FileOp::kWrite, path_);
    return absl::OkStatus();
  }
  absl::Status Sync() override {
    RETURN_IF_ERROR(fs_->Check(FileOp::kSync, path_));
    return target_->Sync();
  }
  absl::Status Close() override {
    RETURN_IF_ERROR(fs_->Check(FileOp::kClose, path_));
    return target_->Close();
  }

 private:
  FaultInjectionFileSystem* const fs_;
  const std::string path_;
  const std::unique_ptr<WritableFile> target_;
};

class FaultInjectionFileSystem::Reader final : public SequentialFile {
 public:
  Reader(FaultInjectionFileSystem* fs, std::string path,
         std::unique_ptr<SequentialFile> target)
      : fs_(fs), path_(std::move(path)), target_(std::move(target)) {}

  absl::StatusOr<size_t> Read(char* buffer, size_t n) override {
    RETURN_IF_ERROR(fs_->Check(FileOp::kRead, path_));
    ASSIGN_OR_RETURN(const size_t got, target_->Read(buffer, n));
    if (got > 0 && fs_->Corrupts(path_)) buffer[0] ^= 0x10;
    return got;
  }

 private:
  FaultInjectionFileSystem* const fs_;
  const std::string path_;
  const std::unique_ptr<SequentialFile> target_;
};

FaultInjectionFileSystem::FaultInjectionFileSystem(FileSystem* target)
    : target_(target) {}

void FaultInjectionFileSystem::FailNth(FileOp op, int64_t n, int err,
                                       const std::string& path_part) {
  std::lock_guard<std::mutex> lock(mu_);
  rules_.push_back({op, path_part, std::max<int64_t>(n, 1), err});
}

void FaultInjectionFileSystem::FailAll(FileOp op, int err,
                                       const std::string& path_part) {
  std::lock_guard<std::mutex> lock(mu_);
  rules_.push_back({op, path_part, 0, err});
}

void FaultInjectionFileSystem::SetFreeBytes(int64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  free_bytes_ = std::max<int64_t>(bytes, 0);
}

void FaultInjectionFileSystem::CorruptReads(const std::string& path_part) {
  std::lock_guard<std::mutex> lock(mu_);
  corrupt_.push_back(path_part);
}

void FaultInjectionFileSystem::SetExchangeSupported(bool supported) {
  std::lock_guard<std::mutex> lock(mu_);
  exchange_supported_ = supported;
}

void FaultInjectionFileSystem::Reset() {
  std::lock_guard<std::mutex> lock(mu_);
  rules_.clear();
  corrupt_.clear();
  free_bytes_ = -1;
  exchange_supported_ = true;
}

int64_t FaultInjectionFileSystem::Count(FileOp op) const {
  std::lock_guard<std::mutex> lock(mu_);
  return counts_[static_cast<int>(op)];
}

int64_t FaultInjectionFileSystem::injected() const {
  std::lock_guard<std::mutex> lock(mu_);
  return injected_;
}

absl::Status FaultInjectionFileSystem::Check(FileOp op, const std::string& path,
                                             const std::string& other) {
  std::lock_guard<std::mutex> lock(mu_);
  ++counts_[static_cast<int>(op)];
  for (auto it = rules_.begin(); it != rules_.end(); ++it) {
    if (it->op != op ||
        (path.find(it->path_part) == std::string::npos &&
         (other.empty() || other.find(it->path_part) == std::string::npos))) {
      continue;
    }
    ++it->seen;
    if (it->nth != 0 && it->seen != it->nth) continue;
    const int err = it->err;
    if (it->nth != 0) rules_.erase(it);
    ++injected_;
    return Injected(err, op, path);
  }
  return absl::OkStatus();
}

size_t FaultInjectionFileSystem::Reserve(size_t want) {
  std::lock_guard<std::mutex> lock(mu_);
  if (free_bytes_ < 0) return want;
  const size_t fits = std::min<size_t>(want, free_bytes_);
  free_bytes_ -= static_cast<int64_t>(fits);
  if (fits < want) ++injected_;
  return fits;
}

bool FaultInjectionFileSystem::Corrupts(const std::string& path) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const std::string& part : corrupt_) {
    if (path.find(part) != std::string::npos) {
      ++injected_;
      return true;
    }
  }
  return false;
}

absl::StatusOr<std::unique_ptr<WritableFile>>
FaultInjectionFileSystem::NewWritableFile(const std::string& path) {
  RETURN_IF_ERROR(Check(FileOp::kCreate, path));
  ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file,
                   target_->NewWritableFile(path));
  return std::make_unique<File>(this, path, std::move(file));
}

absl::StatusOr<std::unique_ptr<SequentialFile>>
FaultInjectionFileSystem::NewSequentialFile(const std::string& path) {
  RETURN_IF_ERROR(Check(FileOp::kRead, path));
  ASSIGN_OR_RETURN(std::unique_ptr<SequentialFile> file,
                   target_->NewSequentialFile(path));
  return std::make_unique<Reader>(this, path, std::move(file));
}

absl::Status FaultInjectionFileSystem::Rename(const std::string& from,
                                              const std::string& to) {
  RETURN_IF_ERROR(Check(FileOp::kRename, to, from));
  return target_->Rename(from, to);
}

absl::Status FaultInjectionFileSystem::Exchange(const std::string& a,
                                                const std::string& b) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!exchange_supported_) {
      return absl::UnimplementedError(
          absl::StrCat("the file system of ", b,
                       " cannot exchange entries atomically (injected)"));
    }
  }
  RETURN_IF_ERROR(Check(FileOp::kRename, b, a));
  return target_->Exchange(a, b);
}

absl::Status FaultInjectionFileSystem::RemoveAll(const std::string& path) {
  RETURN_IF_ERROR(Check(FileOp::kRemove, path));
  return target_->RemoveAll(path);
}

absl::Status FaultInjectionFileSystem::CreateDirectories(
    const std::string& path) {
  RETURN_IF_ERROR(Check(FileOp::kMkdir, path));
  return target_->CreateDirectories(path);
}

absl::Status FaultInjectionFileSystem::SyncDirectory(const std::string& path) {
  RETURN_IF_ERROR(Check(FileOp::kSync, path));
  return target_->SyncDirectory(path);
}

}  // namespace dlrm
