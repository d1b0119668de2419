// A cache of hot rows and their optimizer state in a fixed number of slots
// in front of a backing store that holds every row: the slots in host
// memory (HostSlots) or in device memory (cuda::DeviceSlots,
// cuda/device_slots.h), one SlotManager (slot_manager.h) deciding what
// moves. The device tier's cache (TableConfig.device_cache_rows) is a
// CachedStore over device slots and a HostStore, whose pinned arrays the
// device reads and writes directly.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/device.h"
#include "data/batch.h"
#include "embedding/embedding_store.h"
#include "embedding/embedding_table.h"
#include "embedding/slot_manager.h"

namespace dlrm::embedding {

// Where a cache's slots live: a slot array with EmbeddingTable's kernels
// over slot numbers, and copies of whole records (weights then optimizer
// state, as EmbeddingStore::ReadRows lays them out) in and out of given
// slots. Records are host memory; Forward's `out` and BackwardUpdate's
// `grad` are in memory_space(). Not thread-safe.
class SlotStorage {
 public:
  virtual ~SlotStorage() = default;

  virtual MemorySpace memory_space() const = 0;
  // Number of slots.
  virtual int64_t slots() const = 0;

  // Copies the records of `slots[0, n)` into `records` (host memory, one
  // record after another), after every update queued before; done on
  // return. Slots must be in [0, slots()). The storage's errors otherwise.
  virtual absl::Status ReadSlots(const int64_t* slots, int64_t n,
                                 float* records) = 0;
  // Sets `slots[0, n)` (distinct, in [0, slots())) from `records` laid out
  // as ReadSlots writes them, ordered after the work queued before and
  // before the work queued after; `records` may be reused on return.
  virtual absl::Status WriteSlots(const int64_t* slots, int64_t n,
                                  const float* records) = 0;
  // Tells the storage that slots[i] now holds row rows[i] of the table for
  // i in [0, n) (CachedStore calls it for its misses before they are
  // loaded): 16-bit host slots round their updates by that row. Default:
  // nothing (slots whose updates need no row).
  virtual void SetSlotRows(const int64_t* slots, const int64_t* rows,
                           int64_t n) {}

  // Makes `table` (host memory, of the slots' dim and optimizer: a
  // HostStore's) one whose rows LoadRows and StoreRows copy directly, and
  // returns whether it is (false for a table of another dim or state
  // size): host slots always can; device slots pin and map its arrays,
  // and where that fails log why (naming the table) and return false. One
  // table per slots: a later call replaces the last. `table` must outlive
  // the slots and its arrays must not be reallocated.
  virtual bool MapHostTable(EmbeddingTable& table) = 0;
  // Sets slots[i] (distinct, in [0, slots())) to the record of row rows[i]
  // (in [0, table.rows())) of `table` for i in [0, n), ordered after the
  // work queued before and before the work queued after; done on return or
  // only queued, so the host must not write those rows of `table` until
  // Synchronize. `rows` and `slots` may be reused on return.
  // FailedPrecondition unless `table` is the mapped table; the storage's
  // errors otherwise.
  virtual absl::Status LoadRows(const EmbeddingTable& table,
                                const int64_t* rows, const int64_t* slots,
                                int64_t n) = 0;
  // Sets rows[i] (distinct) of `table` to the record of slots[i] for i in
  // [0, n), ordered and checked as LoadRows; the host must not read or
  // write those rows of `table` until Synchronize.
  virtual absl::Status StoreRows(const int64_t* slots, const int64_t* rows,
                                 int64_t n, EmbeddingTable& table) = 0;

  // Takes the batch the next Forward and BackwardUpdate run on: `slot_ids`
  // holds slot numbers in [0, slots()) and well-formed offsets, and must
  // stay valid and unchanged until the next SetBatch. Work still queued on
  // the previous batch finishes on that batch's ids.
  virtual absl::Status SetBatch(const data::SparseFeature& slot_ids) = 0;
  // EmbeddingTable::Forward / BackwardUpdate on the batch of the last
  // SetBatch; done on return, or queued (Synchronize).
  virtual absl::Status Forward(float* out, int64_t out_stride) const = 0;
  virtual absl::Status BackwardUpdate(const float* grad,
                                      int64_t grad_stride) = 0;
  // BackwardUpdate in pieces, as EmbeddingStore::BeginUpdate /
  // UpdateRange on the batch of the last SetBatch. Slots that cannot split
  // (device slots: queued kernels) keep the default: BeginUpdate runs the
  // whole BackwardUpdate and returns 0.
  virtual absl::StatusOr<int64_t> BeginUpdate(const float* grad,
                                              int64_t grad_stride) {
    RETURN_IF_ERROR(BackwardUpdate(grad, grad_stride));
    return 0;
  }
  virtual absl::Status UpdateRange(int64_t begin, int64_t end) {
    return absl::FailedPreconditionError(
        "UpdateRange: these slots' BeginUpdate does the whole update");
  }
  // Waits for queued work; returns the first error it met.
  virtual absl::Status Synchronize() = 0;

  // Updates applied (counted when queued).
  virtual int64_t step() const = 0;
  virtual void set_step(int64_t step) = 0;
  // The optimizer constants of the next BackwardUpdate on
  // (EmbeddingTable::set_optimizer; the same type).
  virtual void set_optimizer(const OptimizerConfig& optimizer) = 0;
};

// Slots in host memory: an EmbeddingTable::SlotArray and its kernels, in
// the spec's precision (16-bit slots round each update as the table would
// round the row the slot holds: SetSlotRows).
class HostSlots final : public SlotStorage {
 public:
  // `slots` slots of `spec`'s dim, pooling, optimizer and precision.
  HostSlots(const TableSpec& spec, int64_t slots);

  MemorySpace memory_space() const override { return MemorySpace::kHost; }
  int64_t slots() const override { return table_->rows(); }
  absl::Status ReadSlots(const int64_t* slots, int64_t n,
                         float* records) override;
  absl::Status WriteSlots(const int64_t* slots, int64_t n,
                          const float* records) override;
  void SetSlotRows(const int64_t* slots, const int64_t* rows,
                   int64_t n) override {
    for (int64_t i = 0; i < n; ++i) table_->set_slot_row(slots[i], rows[i]);
  }
  // Plain row copies (CopyRecords), done on return; false for a table of
  // another precision too.
  bool MapHostTable(EmbeddingTable& table) override;
  absl::Status LoadRows(const EmbeddingTable& table, const int64_t* rows,
                        const int64_t* slots, int64_t n) override;
  absl::Status StoreRows(const int64_t* slots, const int64_t* rows, int64_t n,
                         EmbeddingTable& table) override;
  absl::Status SetBatch(const data::SparseFeature& slot_ids) override {
    batch_ = &slot_ids;
    return absl::OkStatus();
  }
  absl::Status Forward(float* out, int64_t out_stride) const override;
  absl::Status BackwardUpdate(const float* grad, int64_t grad_stride) override;
  // EmbeddingTable::BeginUpdate / UpdateRows on the slot array.
  absl::StatusOr<int64_t> BeginUpdate(const float* grad,
                                      int64_t grad_stride) override {
    return table_->BeginUpdate(*batch_, grad, grad_stride);
  }
  absl::Status UpdateRange(int64_t begin, int64_t end) override {
    table_->UpdateRows(begin, end);
    return absl::OkStatus();
  }
  absl::Status Synchronize() override { return absl::OkStatus(); }
  int64_t step() const override { return table_->step(); }
  void set_step(int64_t step) override { table_->set_step(step); }
  void set_optimizer(const OptimizerConfig& optimizer) override {
    table_->set_optimizer(optimizer);
  }

 private:
  // FailedPrecondition unless `table` is mapped_.
  absl::Status CheckMapped(const EmbeddingTable& table) const;

  std::unique_ptr<EmbeddingTable> table_;
  int record_floats_;
  const data::SparseFeature* batch_ = nullptr;
  const EmbeddingTable* mapped_ = nullptr;
};

// A fixed number of slots (a SlotStorage) caching rows of `backing`, a
// store of the same spec holding every row. Prepare writes the dirty rows
// it evicts back to `backing`, loads its misses into their slots and hands
// the storage the batch remapped to slots; the kernels then run on the
// slots. The rows move one of two ways:
// - direct (a HostStore backing, CacheOptions::direct_host_access, and
//   slots that map its table: SlotStorage::MapHostTable): the slots copy
//   victims into the table's arrays (StoreRows) and misses out of them
//   (LoadRows), queued like the kernels; Prefetch stages nothing (the rows
//   are in host memory already), and every call that touches `backing` on
//   the host first waits for the slots' queued work.
// - staged (any other backing): victims through ReadSlots and backing
//   WriteRows, misses from the last Prefetch's staging or backing ReadRows
//   through WriteSlots.
// Trains like `backing` would on its own, either way: bitwise when the
// slots are host memory (HostSlots), within the device kernels' rounding
// otherwise. The step counter is the slots'; Flush writes every dirty row
// and the step to `backing` and flushes it. memory_space() is the slots'.
// Thread safety as EmbeddingStore: with CacheOptions::background_prefetch,
// Prefetch's reads of `backing` run on a thread of the store's own, and
// every call that touches `backing` or the staging first waits for them,
// so `backing` has one caller at a time.
class CachedStore final : public EmbeddingStore {
 public:
  // InvalidArgument for a bad spec or options, a backing store whose spec
  // has other rows, dim, optimizer or precision, or slots that are not
  // options.cache_rows of spec's record size; the backing store's step
  // becomes the slots' step. Maps a HostStore backing's table into the
  // slots (the direct path) when options.direct_host_access.
  static absl::StatusOr<std::unique_ptr<CachedStore>> Create(
      const TableSpec& spec, const CacheOptions& options,
      std::unique_ptr<SlotStorage> slots,
      std::unique_ptr<EmbeddingStore> backing);

  // Waits for the background prefetch and the slots' queued work, and
  // destroys the slots before the backing store (they may have mapped its
  // memory). Dirty rows not flushed are dropped.
  ~CachedStore() override;

  const TableSpec& spec() const override { return spec_; }
  MemorySpace memory_space() const override { return slots_->memory_space(); }
  // Errors as SlotManager::Plan, then the slots' and the backing store's.
  // A Prepare that fails before its misses are copied into their slots
  // (bad ids, a full cache, a backing store's read or write error) leaves
  // every row's value unchanged (a dirty victim may already be written
  // back, and stays resident and dirty); one that fails in that copy or
  // the batch's upload (a device fault) leaves the misses' slots
  // undefined.
  absl::StatusOr<const data::SparseFeature*> Prepare(
      const data::SparseFeature& ids) override;
  // FailedPrecondition when `prepared` is not the last successful
  // Prepare's result; the slots' errors otherwise (device: `out` / `grad`
  // must be device memory).
  absl::Status Forward(const data::SparseFeature& prepared, float* out,
                       int64_t out_stride) const override;
  absl::Status BackwardUpdate(const data::SparseFeature& prepared,
                              const float* grad, int64_t grad_stride) override;
  // The slots' BeginUpdate / UpdateRange (host slots split, device slots
  // run whole in BeginUpdate); EndUpdate marks the batch's rows dirty.
  // Errors as BackwardUpdate.
  absl::StatusOr<int64_t> BeginUpdate(const data::SparseFeature& prepared,
                                      const float* grad,
                                      int64_t grad_stride) override;
  absl::Status UpdateRange(int64_t begin, int64_t end) override {
    return slots_->UpdateRange(begin, end);
  }
  absl::Status EndUpdate() override;
  absl::Status Synchronize() override { return slots_->Synchronize(); }
  // On the direct path, nothing (returns OK). Otherwise reads the records
  // of the rows of `next_ids` that are not resident now from the backing
  // store into a host staging area, replacing the last call's: on the store's
  // thread (background_prefetch; it returns at once, and the read overlaps the
  // caller's compute and the device's queued kernels) or before it returns. The
  // read sees every write-back before the call (the last Prepare's) and stages
  // only rows no later write-back can change (they are not resident, and leave
  // the staging when they enter a slot or are written). Ids outside [0, rows)
  // are left for Prepare to report. The backing store's errors: of this read
  // when not in the background, of a failed background read otherwise (the next
  // call that waits for it returns it once: Prepare, Prefetch, ReadRows,
  // WriteRows, Flush).
  absl::Status Prefetch(const data::SparseFeature& next_ids) override;
  // FailedPrecondition: the slot map and the slots change as the caller
  // prepares batches, unguarded (predictions read such tables between
  // steps).
  absl::Status PoolReadOnly(const data::SparseFeature& ids, float* out,
                            int64_t out_stride) const override;
  // The backing store's records, with resident rows' taken from their
  // slots.
  absl::Status ReadRows(int64_t begin, int64_t count, float* out) override;
  // Writes the records to the backing store, and into the slots of
  // resident rows (which become dirty); drops staged copies of the rows.
  absl::Status WriteRows(int64_t begin, int64_t count,
                         const float* records) override;
  absl::Status Flush() override;
  int64_t step() const override { return slots_->step(); }
  void set_step(int64_t step) override { slots_->set_step(step); }
  // Waits for the prefetch and the slots' queued work, then sets the
  // slots' and the backing store's optimizer.
  absl::Status SetOptimizer(const OptimizerConfig& optimizer) override;
  // hits, misses, prefetch_hits, evictions; rows_read / rows_written count
  // records read from and written to the backing store: on the direct path
  // the misses loaded from its table and the dirty rows stored into it
  // (victims and flushes, counted when queued), on the staged path the
  // rows its reads and the prefetch's returned and the rows written back.
  // bytes_read / bytes_written: those records' bytes.
  StoreMetrics metrics() const override { return metrics_; }
  // A cache of capacity() rows in the slots' memory, read through the
  // caller only, saved as tensors (through ReadRows), taking no prefetch
  // from the step.
  StoreCapabilities capabilities() const override;
  // The slots' records in their memory space, plus the backing store's.
  StoreBytes MemoryBytes() const override;
  // Flush, then SaveHostCopy: the same tensors whatever tier is behind.
  absl::Status Save(RowsSink& sink) override;

  int64_t capacity() const { return manager_.capacity(); }
  // Whether rows move directly between the slots and the backing
  // HostStore's arrays (see the class comment); for the device tier,
  // whether its host tier is pinned and mapped.
  bool direct() const { return host_table_ != nullptr; }
  // Whether `row` is in a slot now, and dirty there.
  bool IsResident(int64_t row) const { return manager_.SlotOf(row) >= 0; }
  bool IsDirty(int64_t row) const;
  // The backing store, once the background prefetch (if any) and, on the
  // direct path, the slots' queued work are done (a device error that wait
  // meets is returned by the next call that synchronises).
  EmbeddingStore& backing();

 private:
  CachedStore(const TableSpec& spec, const CacheOptions& options,
              std::unique_ptr<SlotStorage> slots,
              std::unique_ptr<EmbeddingStore> backing,
              EmbeddingTable* host_table);

  int64_t RecordFloats() const { return record_floats_; }
  // FailedPrecondition unless `prepared` is the last successful Prepare's.
  absl::Status CheckPrepared(const data::SparseFeature& prepared) const;
  // Reads the slots' records of `slots` and writes them to `rows` of the
  // backing store.
  absl::Status WriteBack(const std::vector<int64_t>& rows,
                         const std::vector<int64_t>& slots);
  // Reads staged_rows_ from the backing store into staged_records_, setting
  // read_status_ and read_rows_ (the prefetch's job, on either thread).
  void ReadStaged();
  // Waits until no prefetch read is queued or running.
  void JoinPrefetch();
  // JoinPrefetch, then counts its rows read in metrics_ and returns a
  // failed read's error once (dropping the staging).
  absl::Status WaitForPrefetch();
  // The prefetch thread: runs each queued read until stopping_.
  void PrefetchLoop();
  // WaitForPrefetch, then on the direct path the slots' queued work (which
  // reads and writes the backing table): after it the host may use
  // backing_.
  absl::Status WaitForBacking();

  TableSpec spec_;
  int64_t record_floats_;
  std::unique_ptr<SlotStorage> slots_;
  std::unique_ptr<EmbeddingStore> backing_;
  // The backing HostStore's table on the direct path, else null.
  EmbeddingTable* host_table_;
  SlotManager manager_;
  StoreMetrics metrics_;
  bool prepared_ = false;
  bool background_prefetch_;
  // Records staged by the last Prefetch (row -> index into staged_records_;
  // a row leaves when it enters a slot or is written). A staged row is
  // never resident, and its staged record is the backing store's. Only the
  // caller's thread touches staged_index_ (after WaitForPrefetch).
  absl::flat_hash_map<int64_t, int64_t> staged_index_;
  std::vector<float> staged_records_;
  // The read of the last Prefetch: its rows, its outcome and rows read.
  // While read_pending_ only the prefetch thread touches these,
  // staged_records_ and backing_.
  std::vector<int64_t> staged_rows_;
  absl::Status read_status_;
  int64_t read_rows_ = 0;
  // The prefetch thread (started by the first background Prefetch; when
  // none can be started the store reads on the caller's thread) and its
  // hand-over: read_queued_ until it starts the read, read_pending_ until
  // it is done.
  std::thread worker_;
  std::mutex read_mu_;
  std::condition_variable read_cv_;
  bool read_queued_ = false;
  bool read_pending_ = false;
  bool stopping_ = false;
  // Prepare's scratch: records of the write-back and of the misses
  // (staged path), the misses' rows (direct path) and slots.
  std::vector<float> records_;
  std::vector<int64_t> miss_rows_, miss_slots_;
};

}  // namespace dlrm::embedding
