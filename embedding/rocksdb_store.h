// The RocksDB tier's store: a host cache of hot rows in front of each table
// that fetches with MultiGet, evicts by LRU or LFU, writes dirty rows back
// in batches and prefetches the next batch in the background. The database
// behind it (one for every table, a column family per table or shard) is
// in embedding/row_database.h.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "core/status.h"
#include "embedding/embedding_store.h"
#include "embedding/embedding_table.h"
#include "embedding/row_database.h"
#include "embedding/slot_manager.h"

namespace rocksdb {
class ColumnFamilyHandle;
class DB;
class Env;
struct ColumnFamilyOptions;
}  // namespace rocksdb

namespace dlrm::embedding {

// A fixed number of slots (options.cache_rows) in host memory with the
// layout of EmbeddingTable, an id -> slot map, and RocksDB behind it. A row
// is stored as one value, its weights and optimizer state together (the
// ReadRow record: little-endian floats, except that a 16-bit spec.precision
// stores its dim weights as little-endian 16-bit words, half the bytes),
// under its 8-byte big-endian row number; rows never written are
// initialised from InitialValue (rounded to nearest in 16 bits). The slots
// keep the spec's precision. Trains bitwise like a HostStore of the same
// spec, 16-bit rows included (the slots round each update by the row they
// hold). Thread safety as
// EmbeddingStore: PoolReadOnly may run on other threads beside the
// caller's Prepare, Prefetch, ReadRows, Flush and the background jobs (it
// synchronises with them through cache_mu_).
class RocksDbCachedStore final : public EmbeddingStore {
 public:
  // `db` is borrowed and must outlive the store. Reads the step counter a
  // previous Flush left in the table's column family. InvalidArgument for
  // bad spec or options.
  static absl::StatusOr<std::unique_ptr<RocksDbCachedStore>> Create(
      const TableSpec& spec, const RocksDbStoreOptions& options,
      RowDatabase* db);

  // Waits for its background jobs. Dirty rows not flushed are dropped.
  ~RocksDbCachedStore() override;

  const TableSpec& spec() const override { return spec_; }
  MemorySpace memory_space() const override { return MemorySpace::kHost; }
  absl::StatusOr<const data::SparseFeature*> Prepare(
      const data::SparseFeature& ids) override;
  absl::Status Forward(const data::SparseFeature& prepared, float* out,
                       int64_t out_stride) const override;
  absl::Status BackwardUpdate(const data::SparseFeature& prepared,
                              const float* grad, int64_t grad_stride) override;
  // The slots' EmbeddingTable::BeginUpdate / UpdateRows; EndUpdate marks
  // the batch's rows dirty. FailedPrecondition as Forward.
  absl::StatusOr<int64_t> BeginUpdate(const data::SparseFeature& prepared,
                                      const float* grad,
                                      int64_t grad_stride) override;
  absl::Status UpdateRange(int64_t begin, int64_t end) override {
    slots_->UpdateRows(begin, end);
    return absl::OkStatus();
  }
  absl::Status EndUpdate() override {
    manager_.MarkBatchDirty();
    return absl::OkStatus();
  }
  // Its kernels are done on return (the background jobs are waited for by
  // the calls that need them, not here).
  absl::Status Synchronize() override { return absl::OkStatus(); }
  // Queues the read on the database's worker, behind the write-back of the
  // last Prepare. A failed background read or write is returned by the next
  // call that waits for it (Prepare, ReadRow, Flush, Prefetch).
  absl::Status Prefetch(const data::SparseFeature& next_ids) override;
  // Each row from its slot, else from the write-back buffer (evicted dirty
  // rows not yet in RocksDB, or whose write failed), else from RocksDB (or
  // InitialValue); reads no staging area and changes nothing, so the step
  // beside it trains bitwise as without it. InvalidArgument naming the table,
  // the id and its position for an id outside [0, rows).
  absl::Status PoolReadOnly(const data::SparseFeature& ids, float* out,
                            int64_t out_stride) const override;
  absl::Status ReadRows(int64_t begin, int64_t count, float* out) override;
  // Waits for the background jobs; rows staged by a prefetch are dropped
  // from the staging area (RocksDB gets their new value).
  absl::Status WriteRows(int64_t begin, int64_t count,
                         const float* records) override;
  absl::Status Flush() override;
  int64_t step() const override { return slots_->step(); }
  void set_step(int64_t step) override { slots_->set_step(step); }
  // Waits for the background jobs (which read spec()), then sets it.
  absl::Status SetOptimizer(const OptimizerConfig& optimizer) override;
  StoreMetrics metrics() const override { return metrics_; }
  StoreCapabilities capabilities() const override;
  // Host: the slots and the column family's memtables; disk: its live
  // files (RocksDB's properties of the family).
  StoreBytes MemoryBytes() const override;
  // Flush, then the database (sink.Database).
  absl::Status Save(RowsSink& sink) override;

  // Whether `row` is in a slot now.
  bool IsResident(int64_t row) const { return manager_.SlotOf(row) >= 0; }
  // Whether `row` is resident and updated since it was last written back.
  bool IsDirty(int64_t row) const;
  int64_t capacity() const { return slots_->rows(); }

 private:
  RocksDbCachedStore(const TableSpec& spec, const RocksDbStoreOptions& options,
                     RowDatabase* db, rocksdb::ColumnFamilyHandle* family);

  // Floats of one record: dim weights + state.
  int RecordFloats() const { return spec_.dim + state_floats_; }
  void CopySlotToRecord(int64_t slot, float* record) const;
  // Sets `slot` from `record`; the slot then holds `row`.
  void CopyRecordToSlot(const float* record, int64_t slot, int64_t row);
  // Bytes of one RocksDB value: dim weights of spec.precision, then the
  // state floats.
  size_t ValueBytes() const;
  // A record as its RocksDB value (ValueBytes() at `value`; 16-bit weights
  // rounded to nearest, exact for a record of the table's values), and
  // back (16-bit weights widened, exact).
  void EncodeValue(const float* record, char* value) const;
  void DecodeValue(const char* value, float* record) const;
  void InitialRecord(int64_t row, float* record) const;
  // Reads `rows` from RocksDB into records (RecordFloats() apart),
  // initialising rows never written; counts rows/bytes read into `metrics`.
  // Thread-safe (PoolReadOnly reads through it with metrics of its own).
  absl::Status ReadRecords(const std::vector<int64_t>& rows, float* records,
                           StoreMetrics* metrics) const;
  // Writes `count` records (rows[i] from records + i * RecordFloats()), and
  // the step counter if asked, in one WriteBatch without the WAL.
  absl::Status WriteRecords(const int64_t* rows, const float* records,
                            size_t count, bool with_step) const;
  // WriteRecords, and up to options_.write_retries more times after asking
  // the database to recover, while it fails. The last error otherwise.
  // Counts the retries in metrics_.
  absl::Status WriteRecordsRetrying(const int64_t* rows, const float* records,
                                    size_t count, bool with_step);
  // The unique rows of `ids` into *rows in first-occurrence order, the
  // index of every id's row in *rows into *unique_of_pos, with *index (row
  // -> that index) as the scratch map. InvalidArgument naming the table, the
  // id and its position for an id outside [0, rows).
  absl::Status UniqueRows(const data::SparseFeature& ids,
                          absl::flat_hash_map<int64_t, int64_t>* index,
                          std::vector<int64_t>* rows,
                          std::vector<int64_t>* unique_of_pos) const;
  // FailedPrecondition unless `prepared` is the last successful Prepare's.
  absl::Status CheckPrepared(const data::SparseFeature& prepared) const;
  // Waits for this store's background reads and returns a failed one's
  // error; the staging area is then the caller's.
  absl::Status WaitForReads();
  // Waits for every background job of this store and returns its error, if
  // any. A write-back that failed in the background is retried here, so
  // its rows are never lost while the store lives.
  absl::Status WaitForJobs();
  // Queues `job` on the database's worker as a read (prefetch) or a write.
  void Submit(bool read, std::function<void()> job);

  TableSpec spec_;
  RocksDbStoreOptions options_;
  RowDatabase* db_;
  rocksdb::ColumnFamilyHandle* family_;
  int state_floats_;
  // The slot array the kernels run on, and which row each slot holds (the
  // eviction order, dirty bits and each batch's plan: slot_manager.h).
  std::unique_ptr<EmbeddingTable> slots_;
  SlotManager manager_;
  // Keeps PoolReadOnly's lookups apart from the changes to where rows live:
  // held by the caller's thread while it changes manager_'s slot map
  // (Commit), copies records into slots (Prepare's commit) or fills or
  // empties writeback_rows_, and by the worker while it empties
  // writeback_rows_; the caller reads these without it (it is their only
  // writer; manager_.Plan changes no slot map). Never held across a RocksDB
  // call.
  mutable std::mutex cache_mu_;
  StoreMetrics metrics_;
  // Whether manager_.plan().remapped is the last Prepare's result.
  bool prepared_ = false;
  // Prepare's scratch, reused: the rows to read, their misses, the records
  // of the misses, loaded records.
  std::vector<int64_t> to_read_;
  std::vector<size_t> to_read_miss_;
  std::vector<const float*> miss_record_;
  std::vector<float> loaded_;

  // Background jobs on db_'s worker (write-back of dirty victims, prefetch
  // reads), in submission order, so a read always sees the writes submitted
  // before it. While a write is pending only it touches writeback_* (and
  // PoolReadOnly reads them, under cache_mu_); while
  // a read is pending only it touches prefetch_ids_, staged_*,
  // prefetch_status_ and job_metrics_ (and reads writeback_rows_, after the
  // writes before it, and manager_'s slot map, which only Prepare changes).
  // A staged row is never resident and RocksDB (after the queued writes)
  // holds its staged value: rows reach RocksDB only from slots, and a staged
  // row leaves the staging area when it enters a slot.
  std::mutex jobs_mu_;
  std::condition_variable jobs_cv_;
  int pending_reads_ = 0;
  int pending_writes_ = 0;
  // Dirty victims of the last Prepare, sorted by row (so RocksDB inserts
  // them in key order), waiting to be written; kept until written, and
  // emptied (under cache_mu_) only once RocksDB holds them.
  std::vector<int64_t> writeback_rows_;
  std::vector<float> writeback_records_;
  // Ids of the last Prefetch, the rows staged from them, their records, and
  // row -> index into staged_rows_ (erased when consumed). staged_valid_ is
  // false when the read was skipped because the write-back before it
  // failed.
  std::vector<int64_t> prefetch_ids_;
  std::vector<int64_t> staged_rows_;
  std::vector<float> staged_records_;
  absl::flat_hash_map<int64_t, int64_t> staged_index_;
  bool staged_valid_ = true;
  absl::Status prefetch_status_;
  StoreMetrics job_metrics_;
};

}  // namespace dlrm::embedding
