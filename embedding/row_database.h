// The RocksDB tier's database: one rocksdb::DB holding every table's rows
// (one column family per table or shard) and the worker thread that runs
// its stores' background reads and writes. The stores in front of it are
// in embedding/rocksdb_store.h.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "embedding/embedding_store.h"

namespace rocksdb {
class ColumnFamilyHandle;
class DB;
class Env;
class Status;
struct ColumnFamilyOptions;
}  // namespace rocksdb

namespace dlrm::embedding {

// One RocksDB database, its column families, and one background worker
// thread that runs its stores' write-back and prefetch reads in submission
// order (one thread per database: the reads and writes of every table
// overlap the step's compute without a thread per table). Thread-safe.
//
// A flush that fails (a full or failing disk) makes RocksDB refuse writes
// until it recovers. RocksDB's own automatic recovery is off: the stores
// ask for it (Recover) when a write fails, so that what happens under a
// fault does not depend on the timing of a background thread.
class RowDatabase {
 public:
  // Opens (creating if missing) the database at options.path with every
  // column family it already has. InvalidArgument for bad options;
  // RocksDB's errors otherwise.
  static absl::StatusOr<std::unique_ptr<RowDatabase>> Open(
      const RocksDbStoreOptions& options);

  // Copies the checkpoint in `checkpoint_dir` (made by Checkpoint) to
  // options.path and opens it there, leaving the checkpoint untouched.
  // AlreadyExists when options.path exists and is not empty; NotFound when
  // `checkpoint_dir` is not a directory.
  static absl::StatusOr<std::unique_ptr<RowDatabase>> RestoreCheckpoint(
      const std::string& checkpoint_dir, const RocksDbStoreOptions& options);

  ~RowDatabase();
  RowDatabase(const RowDatabase&) = delete;
  RowDatabase& operator=(const RowDatabase&) = delete;

  // The column family `name`, created if missing. Borrowed: valid while
  // this database lives.
  absl::StatusOr<rocksdb::ColumnFamilyHandle*> ColumnFamily(
      const std::string& name);

  // Flushes memtables and writes a consistent hard-linked copy of the
  // database to `dir` (which must not exist). Stores must Flush() first:
  // rows still dirty in a cache are not in it. AlreadyExists when `dir`
  // exists.
  absl::Status Checkpoint(const std::string& dir);

  // Asks RocksDB to recover from a background error (a failed flush): it
  // flushes the memtables again. OK when there was none or it recovered;
  // RocksDB's error otherwise (ResourceExhausted while the disk is full;
  // Internal for an error RocksDB cannot recover from: then the database
  // stays read-only).
  absl::Status Recover();

  rocksdb::DB* db() { return db_.get(); }
  const RocksDbStoreOptions& options() const { return options_; }

  // Runs `job` on the worker thread after every job submitted before it.
  // For the stores of this database: a job must not outlive what it uses
  // (a store waits for its jobs before it is destroyed).
  void Submit(std::function<void()> job);

 private:
  RowDatabase() = default;
  void WorkerLoop();

  RocksDbStoreOptions options_;
  // Over options_.file_system when set; declared before db_ to outlive it.
  std::unique_ptr<rocksdb::Env> env_;
  std::unique_ptr<rocksdb::DB> db_;
  // Options of every column family (shares one block cache).
  std::unique_ptr<rocksdb::ColumnFamilyOptions> family_options_;
  std::mutex mu_;
  // Every handle opened or created, by name; destroyed before db_ closes.
  std::vector<std::pair<std::string, rocksdb::ColumnFamilyHandle*>> families_;

  // The worker and its FIFO; stopped (after draining) before db_ closes.
  std::mutex queue_mu_;
  std::condition_variable queue_cv_;
  std::deque<std::function<void()>> queue_;
  bool stopping_ = false;
  std::thread worker_;
};

// Name of the column family that holds `spec`'s rows: one per table, or per
// shard when the spec is a slice.
std::string ColumnFamilyName(const TableSpec& spec);

// Maps a RocksDB status to the closest absl code (NotFound, ResourceExhausted
// for a full disk, DataLoss, InvalidArgument, Unimplemented, Unavailable,
// else Internal), its message naming the operation `what`.
absl::Status RocksDbStatus(const rocksdb::Status& s, const std::string& what);

}  // namespace dlrm::embedding
