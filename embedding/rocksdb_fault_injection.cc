// RocksDbFaultInjectionFs: writable files wrapped so that appends check the
// rule first.
#include "embedding/rocksdb_fault_injection.h"

#include <utility>

namespace dlrm::embedding {
namespace {

rocksdb::IOStatus Failure(RocksDbFault fault, const std::string& fname) {
  switch (fault) {
    case RocksDbFault::kNoSpace:
      return rocksdb::IOStatus::NoSpace(fname, "(injected)");
    case RocksDbFault::kFatal:
      return rocksdb::IOStatus::IOError(fname, "(injected)");
    case RocksDbFault::kRetryable:
      break;
  }
  rocksdb::IOStatus s = rocksdb::IOStatus::IOError(fname, "(injected)");
  s.SetRetryable(true);
  return s;
}

}  // namespace

class RocksDbFaultInjectionFs::File final
    : public rocksdb::FSWritableFileOwnerWrapper {
 public:
  File(RocksDbFaultInjectionFs* fs, std::string fname,
       std::unique_ptr<rocksdb::FSWritableFile> target)
      : FSWritableFileOwnerWrapper(std::move(target)),
        fs_(fs),
        fname_(std::move(fname)) {}

  rocksdb::IOStatus Append(const rocksdb::Slice& data,
                           const rocksdb::IOOptions& options,
                           rocksdb::IODebugContext* dbg) override {
    rocksdb::IOStatus s = fs_->Check(fname_);
    if (!s.ok()) return s;
    return FSWritableFileOwnerWrapper::Append(data, options, dbg);
  }
  rocksdb::IOStatus Append(const rocksdb::Slice& data,
                           const rocksdb::IOOptions& options,
                           const rocksdb::DataVerificationInfo& info,
                           rocksdb::IODebugContext* dbg) override {
    rocksdb::IOStatus s = fs_->Check(fname_);
    if (!s.ok()) return s;
    return FSWritableFileOwnerWrapper::Append(data, options, info, dbg);
  }
  rocksdb::IOStatus PositionedAppend(const rocksdb::Slice& data,
                                     uint64_t offset,
                                     const rocksdb::IOOptions& options,
                                     rocksdb::IODebugContext* dbg) override {
    rocksdb::IOStatus s = fs_->Check(fname_);
    if (!s.ok()) return s;
    return FSWritableFileOwnerWrapper::PositionedAppend(data, offset, options,
                                                        dbg);
  }
  rocksdb::IOStatus PositionedAppend(const rocksdb::Slice& data,
                                     uint64_t offset,
                                     const rocksdb::IOOptions& options,
                                     const rocksdb::DataVerificationInfo& info,
                                     rocksdb::IODebugContext* dbg) override {
    rocksdb::IOStatus s = fs_->Check(fname_);
    if (!s.ok()) return s;
    return FSWritableFileOwnerWrapper::PositionedAppend(data, offset, options,
                                                        info, dbg);
  }

 private:
  RocksDbFaultInjectionFs* const fs_;
  const std::string fname_;
};

RocksDbFaultInjectionFs::RocksDbFaultInjectionFs(
    const std::shared_ptr<rocksdb::FileSystem>& target)
    : FileSystemWrapper(target) {}

void RocksDbFaultInjectionFs::FailWrites(int64_t n, RocksDbFault fault,
                                         const std::string& name_part) {
  std::lock_guard<std::mutex> lock(mu_);
  writes_ = Rule{name_part, n, fault};
}

void RocksDbFaultInjectionFs::FailAllWrites(RocksDbFault fault,
                                            const std::string& name_part) {
  std::lock_guard<std::mutex> lock(mu_);
  writes_ = Rule{name_part, -1, fault};
}

void RocksDbFaultInjectionFs::Reset() {
  std::lock_guard<std::mutex> lock(mu_);
  writes_ = Rule{};
}

int64_t RocksDbFaultInjectionFs::injected() const {
  std::lock_guard<std::mutex> lock(mu_);
  return injected_;
}

rocksdb::IOStatus RocksDbFaultInjectionFs::Check(const std::string& fname) {
  std::lock_guard<std::mutex> lock(mu_);
  Rule& rule = writes_;
  if (rule.left == 0 || fname.find(rule.name_part) == std::string::npos) {
    return rocksdb::IOStatus::OK();
  }
  if (rule.left > 0) --rule.left;
  ++injected_;
  return Failure(rule.fault, fname);
}

void RocksDbFaultInjectionFs::Wrap(
    const std::string& fname,
    std::unique_ptr<rocksdb::FSWritableFile>* result) {
  *result = std::make_unique<File>(this, fname, std::move(*result));
}

rocksdb::IOStatus RocksDbFaultInjectionFs::NewWritableFile(
    const std::string& fname, const rocksdb::FileOptions& options,
    std::unique_ptr<rocksdb::FSWritableFile>* result,
    rocksdb::IODebugContext* dbg) {
  rocksdb::IOStatus s =
      FileSystemWrapper::NewWritableFile(fname, options, result, dbg);
  if (s.ok()) Wrap(fname, result);
  return s;
}

rocksdb::IOStatus RocksDbFaultInjectionFs::ReopenWritableFile(
    const std::string& fname, const rocksdb::FileOptions& options,
    std::unique_ptr<rocksdb::FSWritableFile>* result,
    rocksdb::IODebugContext* dbg) {
  rocksdb::IOStatus s =
      FileSystemWrapper::ReopenWritableFile(fname, options, result, dbg);
  if (s.ok()) Wrap(fname, result);
  return s;
}

rocksdb::IOStatus RocksDbFaultInjectionFs::ReuseWritableFile(
    const std::string& fname, const std::string& old_fname,
    const rocksdb::FileOptions& options,
    std::unique_ptr<rocksdb::FSWritableFile>* result,
    rocksdb::IODebugContext* dbg) {
  rocksdb::IOStatus s = FileSystemWrapper::ReuseWritableFile(
      fname, old_fname, options, result, dbg);
  if (s.ok()) Wrap(fname, result);
  return s;
}

}  // namespace dlrm::embedding
