// The RocksDB tier: a database holding every table's rows (one column
// family per table or shard), and a host cache of hot rows in front of each
// table that fetches with MultiGet, evicts by LRU or LFU, writes dirty rows
// back in batches and prefetches the next batch in the background.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "core/status.h"
#include "embedding/embedding_store.h"
#include "embedding/embedding_table.h"

namespace rocksdb {
class ColumnFamilyHandle;
class DB;
struct ColumnFamilyOptions;
}  // namespace rocksdb

namespace dlrm::embedding {

// One RocksDB database and its column families. Thread-safe.
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

  rocksdb::DB* db() { return db_.get(); }
  const RocksDbStoreOptions& options() const { return options_; }

 private:
  RowDatabase() = default;

  RocksDbStoreOptions options_;
  std::unique_ptr<rocksdb::DB> db_;
  // Options of every column family (shares one block cache).
  std::unique_ptr<rocksdb::ColumnFamilyOptions> family_options_;
  std::mutex mu_;
  // Every handle opened or created, by name; destroyed before db_ closes.
  std::vector<std::pair<std::string, rocksdb::ColumnFamilyHandle*>> families_;
};

// Name of the column family that holds `spec`'s rows: one per table, or per
// shard when the spec is a slice.
std::string ColumnFamilyName(const TableSpec& spec);

// A fixed number of slots (options.cache_rows) in host memory with the
// layout of EmbeddingTable, an id -> slot map, and RocksDB behind it. A row
// is stored as one value, its weights and optimizer state together (the
// ReadRow record, little-endian floats), under its 8-byte big-endian row
// number; rows never written are initialised from InitialValue. Trains
// bitwise like a HostStore of the same spec. Thread safety as
// EmbeddingStore.
class RocksDbCachedStore final : public EmbeddingStore {
 public:
  // `db` is borrowed and must outlive the store. Reads the step counter a
  // previous Flush left in the table's column family. InvalidArgument for
  // bad spec or options.
  static absl::StatusOr<std::unique_ptr<RocksDbCachedStore>> Create(
      const TableSpec& spec, const RocksDbStoreOptions& options,
      RowDatabase* db);

  // Waits for a running prefetch. Dirty rows not flushed are dropped.
  ~RocksDbCachedStore() override;

  const TableSpec& spec() const override { return spec_; }
  absl::StatusOr<const data::SparseFeature*> Prepare(
      const data::SparseFeature& ids) override;
  absl::Status Forward(const data::SparseFeature& prepared, float* out,
                       int64_t out_stride) const override;
  absl::Status BackwardUpdate(const data::SparseFeature& prepared,
                              const float* grad, int64_t grad_stride) override;
  // A failed background read is returned by the next call that waits for it
  // (Prepare, ReadRow, Flush, Prefetch); Internal when
  // no thread can be started.
  absl::Status Prefetch(const data::SparseFeature& next_ids) override;
  absl::Status ReadRow(int64_t row, float* out) override;
  absl::Status Flush() override;
  int64_t step() const override { return slots_->step(); }
  StoreMetrics metrics() const override { return metrics_; }

  // Whether `row` is in a slot now.
  bool IsResident(int64_t row) const { return slot_of_.contains(row); }
  // Whether `row` is resident and updated since it was last written back.
  bool IsDirty(int64_t row) const;
  int64_t capacity() const { return slots_->rows(); }
  // The slot array the kernels run on (rows() == capacity(); row i is slot
  // i, not table row i). For memory accounting and inspection only.
  EmbeddingTable& slot_array() { return *slots_; }

 private:
  struct Slot {
    // Row held, -1 when free.
    int64_t row = -1;
    bool dirty = false;
    // Tick of the last batch that used the row (LRU), and how many batches
    // used it since it became resident (LFU).
    int64_t last_use = 0;
    int64_t uses = 0;
  };
  // Eviction order key: (uses or 0 under LRU, last_use, slot); smallest
  // first.
  using EvictionKey = std::tuple<int64_t, int64_t, int64_t>;

  RocksDbCachedStore(const TableSpec& spec, const RocksDbStoreOptions& options,
                     RowDatabase* db, rocksdb::ColumnFamilyHandle* family);

  EvictionKey KeyOf(int64_t slot) const;
  // Floats of one record: dim weights + state.
  int RecordFloats() const { return spec_.dim + state_floats_; }
  void CopySlotToRecord(int64_t slot, float* record) const;
  void CopyRecordToSlot(const float* record, int64_t slot);
  void InitialRecord(int64_t row, float* record) const;
  // Reads `rows` from RocksDB into records (RecordFloats() apart),
  // initialising rows never written; counts rows/bytes read into `metrics`.
  absl::Status ReadRecords(const std::vector<int64_t>& rows, float* records,
                           StoreMetrics* metrics) const;
  // Writes the records of `slots` (and the step counter if asked) in one
  // WriteBatch without the WAL.
  absl::Status WriteSlots(const std::vector<int64_t>& slots, bool with_step);
  // FailedPrecondition unless `prepared` is the last successful Prepare's.
  absl::Status CheckPrepared(const data::SparseFeature& prepared) const;
  // Joins the background prefetch; returns its error, if any.
  absl::Status WaitForPrefetch();

  TableSpec spec_;
  RocksDbStoreOptions options_;
  RowDatabase* db_;
  rocksdb::ColumnFamilyHandle* family_;
  int state_floats_;
  // The slot array the kernels run on.
  std::unique_ptr<EmbeddingTable> slots_;
  std::vector<Slot> slot_info_;
  absl::flat_hash_map<int64_t, int64_t> slot_of_;
  std::vector<int64_t> free_slots_;
  // Resident slots in eviction order.
  std::set<EvictionKey> eviction_order_;
  int64_t tick_ = 0;
  StoreMetrics metrics_;

  // The last prepared batch: its remapped ids and its unique slots.
  data::SparseFeature remapped_;
  bool prepared_ = false;
  std::vector<int64_t> batch_slots_;
  // Prepare's scratch: row -> unique index, unique rows in first-occurrence
  // order, the unique index of every id, loaded records.
  absl::flat_hash_map<int64_t, int64_t> batch_index_;
  std::vector<int64_t> batch_rows_, unique_of_pos_;
  std::vector<float> loaded_;

  // Background prefetch. While prefetch_thread_ runs it alone writes the
  // staged_* members and prefetch_status_; everything else touches them
  // only after WaitForPrefetch. A staged row is never resident and RocksDB
  // still holds its staged value: rows reach RocksDB only from slots, and a
  // staged row leaves the staging area when it enters a slot.
  std::thread prefetch_thread_;
  absl::Status prefetch_status_;
  std::vector<int64_t> staged_rows_;
  std::vector<float> staged_records_;
  // Row -> index into staged_rows_; erased when consumed.
  absl::flat_hash_map<int64_t, int64_t> staged_index_;
  StoreMetrics prefetch_metrics_;
};

}  // namespace dlrm::embedding
