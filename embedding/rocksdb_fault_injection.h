// A rocksdb::FileSystem for tests that forwards to another one (RocksDB's
// default) and fails writes to chosen files, in the spirit of
// RocksDB's own FaultInjectionTestFS: it makes RocksDB's flushes fail, so
// that the RocksDB tier's handling of them (write-back retries, recovery,
// clear errors) runs in tests. Set it as RocksDbStoreOptions::file_system.
#pragma once

#include <rocksdb/file_system.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

namespace dlrm::embedding {

// What an injected failure looks like to RocksDB.
enum class RocksDbFault {
  // An I/O error marked retryable (a transient fault): RocksDB stops
  // flushing and recovers when asked.
  kRetryable,
  // ENOSPC: RocksDB refuses writes until it recovers, which it can once
  // there is room again.
  kNoSpace,
  // A plain I/O error: RocksDB turns read-only for good.
  kFatal,
};

// Thread-safe (RocksDB writes from its background threads).
class RocksDbFaultInjectionFs final : public rocksdb::FileSystemWrapper {
 public:
  explicit RocksDbFaultInjectionFs(const std::shared_ptr<rocksdb::FileSystem>&
                                       target = rocksdb::FileSystem::Default());

  static const char* kClassName() { return "DlrmFaultInjectionFs"; }
  const char* Name() const override { return kClassName(); }

  // The next `n` appends to files whose name contains `name_part` (".sst":
  // the table files a flush writes) fail with `fault`.
  void FailWrites(int64_t n, RocksDbFault fault,
                  const std::string& name_part = ".sst");
  // Every append to such files fails with `fault` until Reset() (a disk
  // that stays full, a device that stays broken).
  void FailAllWrites(RocksDbFault fault, const std::string& name_part = ".sst");
  // Drops every fault.
  void Reset();
  // Failures injected so far.
  int64_t injected() const;

  rocksdb::IOStatus NewWritableFile(
      const std::string& fname, const rocksdb::FileOptions& options,
      std::unique_ptr<rocksdb::FSWritableFile>* result,
      rocksdb::IODebugContext* dbg) override;
  rocksdb::IOStatus ReopenWritableFile(
      const std::string& fname, const rocksdb::FileOptions& options,
      std::unique_ptr<rocksdb::FSWritableFile>* result,
      rocksdb::IODebugContext* dbg) override;
  rocksdb::IOStatus ReuseWritableFile(
      const std::string& fname, const std::string& old_fname,
      const rocksdb::FileOptions& options,
      std::unique_ptr<rocksdb::FSWritableFile>* result,
      rocksdb::IODebugContext* dbg) override;

 private:
  class File;
  struct Rule {
    std::string name_part;
    int64_t left = 0;  // < 0: every call
    RocksDbFault fault = RocksDbFault::kRetryable;
  };

  // The failure an append to `fname` gets; OK for none.
  rocksdb::IOStatus Check(const std::string& fname);
  void Wrap(const std::string& fname,
            std::unique_ptr<rocksdb::FSWritableFile>* result);

  mutable std::mutex mu_;
  Rule writes_;
  int64_t injected_ = 0;
};

}  // namespace dlrm::embedding
