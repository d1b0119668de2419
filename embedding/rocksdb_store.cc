// The RocksDB tier's host row cache in front of a RowDatabase
// (embedding/rocksdb_store.h).
#include "embedding/rocksdb_store.h"

#include <rocksdb/db.h>
#include <rocksdb/write_batch.h>

#include <algorithm>
#include <cstring>

#include "embedding/row_precision.h"
#include "optim/optimizer.h"

namespace dlrm::embedding {
namespace {

// Key of the table's step counter: 4 bytes, so it never equals a row key.
constexpr char kStepKey[] = "step";
// Rows per WriteBatch when flushing, to bound the batch's memory.
constexpr size_t kFlushBatchRows = 16384;

// Big-endian, so RocksDB's byte order is row order.
void EncodeRowKey(int64_t row, char* key) {
  const auto u = static_cast<uint64_t>(row);
  for (int i = 0; i < 8; ++i) key[i] = static_cast<char>(u >> (56 - 8 * i));
}

}  // namespace

absl::StatusOr<std::unique_ptr<RocksDbCachedStore>> RocksDbCachedStore::Create(
    const TableSpec& spec, const RocksDbStoreOptions& options,
    RowDatabase* db) {
  RETURN_IF_ERROR(spec.Validate());
  RETURN_IF_ERROR(options.Validate());
  if (db == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("table ", spec.table_index, ": RowDatabase is null"));
  }
  ASSIGN_OR_RETURN(rocksdb::ColumnFamilyHandle * family,
                   db->ColumnFamily(ColumnFamilyName(spec)));
  std::unique_ptr<RocksDbCachedStore> store(
      new RocksDbCachedStore(spec, options, db, family));

  std::string value;
  const rocksdb::Status s =
      db->db()->Get(rocksdb::ReadOptions(), family, kStepKey, &value);
  if (s.ok()) {
    int64_t step = 0;
    if (value.size() != sizeof(step)) {
      return absl::DataLossError(
          absl::StrCat("table ", spec.table_index, ": step counter has ",
                       value.size(), " bytes, expected 8"));
    }
    std::memcpy(&step, value.data(), sizeof(step));
    store->slots_->set_step(step);
  } else if (!s.IsNotFound()) {
    return RocksDbStatus(s,
                         absl::StrCat("read step of table ", spec.table_index));
  }
  return store;
}

RocksDbCachedStore::RocksDbCachedStore(const TableSpec& spec,
                                       const RocksDbStoreOptions& options,
                                       RowDatabase* db,
                                       rocksdb::ColumnFamilyHandle* family)
    : spec_(spec),
      options_(options),
      db_(db),
      family_(family),
      state_floats_(StateFloatsPerRow(spec.optimizer, spec.dim)),
      // More slots than rows could never be used.
      slots_(EmbeddingTable::SlotArray(
          spec.table_index, std::min(options.cache_rows, spec.rows), spec.dim,
          spec.pooling, spec.optimizer, spec.precision, spec.seed, spec.slice)),
      manager_(spec.table_index, spec.rows, slots_->rows(), options.eviction,
               "the row cache", "RocksDbStoreOptions.cache_rows") {}

RocksDbCachedStore::~RocksDbCachedStore() {
  // The jobs use this store; their errors have no one left to go to.
  std::unique_lock<std::mutex> lock(jobs_mu_);
  jobs_cv_.wait(lock,
                [this] { return pending_reads_ == 0 && pending_writes_ == 0; });
}

bool RocksDbCachedStore::IsDirty(int64_t row) const {
  const int64_t slot = manager_.SlotOf(row);
  return slot >= 0 && manager_.IsDirty(slot);
}

void RocksDbCachedStore::CopySlotToRecord(int64_t slot, float* record) const {
  slots_->ReadRecord(slot, record);
}

void RocksDbCachedStore::CopyRecordToSlot(const float* record, int64_t slot,
                                          int64_t row) {
  slots_->WriteRecord(slot, record);
  slots_->set_slot_row(slot, row);
}

size_t RocksDbCachedStore::ValueBytes() const {
  return static_cast<size_t>(spec_.dim) * WeightBytes(spec_.precision) +
         static_cast<size_t>(state_floats_) * sizeof(float);
}

void RocksDbCachedStore::EncodeValue(const float* record, char* value) const {
  if (spec_.precision == ROW_FP32) {
    std::memcpy(value, record, RecordFloats() * sizeof(float));
    return;
  }
  for (int c = 0; c < spec_.dim; ++c) {
    const uint16_t word = FloatToWord(spec_.precision, record[c]);
    std::memcpy(value + 2 * c, &word, sizeof(word));
  }
  std::memcpy(value + 2 * spec_.dim, record + spec_.dim,
              state_floats_ * sizeof(float));
}

void RocksDbCachedStore::DecodeValue(const char* value, float* record) const {
  if (spec_.precision == ROW_FP32) {
    std::memcpy(record, value, RecordFloats() * sizeof(float));
    return;
  }
  for (int c = 0; c < spec_.dim; ++c) {
    uint16_t word;
    std::memcpy(&word, value + 2 * c, sizeof(word));
    record[c] = WordToFloat(spec_.precision, word);
  }
  std::memcpy(record + spec_.dim, value + 2 * spec_.dim,
              state_floats_ * sizeof(float));
}

void RocksDbCachedStore::InitialRecord(int64_t row, float* record) const {
  const TableSlice& slice = spec_.slice;
  const int64_t table_rows =
      slice.table_rows > 0 ? slice.table_rows : spec_.rows;
  InitialRow(spec_.seed, spec_.table_index, table_rows, slice.row_begin + row,
             slice.col_begin, spec_.dim, record);
  // A 16-bit table starts from InitialValue rounded to nearest, as the host
  // tier's (EmbeddingTable's constructor).
  if (spec_.precision != ROW_FP32) {
    for (int c = 0; c < spec_.dim; ++c) {
      record[c] =
          WordToFloat(spec_.precision, FloatToWord(spec_.precision, record[c]));
    }
  }
  optim::InitialSparseState(spec_.optimizer, spec_.dim, record + spec_.dim);
}

absl::Status RocksDbCachedStore::ReadRecords(const std::vector<int64_t>& rows,
                                             float* records,
                                             StoreMetrics* metrics) const {
  const size_t n = rows.size();
  if (n == 0) return absl::OkStatus();
  std::vector<char> key_bytes(8 * n);
  std::vector<rocksdb::Slice> keys(n);
  for (size_t i = 0; i < n; ++i) {
    EncodeRowKey(rows[i], key_bytes.data() + 8 * i);
    keys[i] = rocksdb::Slice(key_bytes.data() + 8 * i, 8);
  }
  std::vector<rocksdb::PinnableSlice> values(n);
  std::vector<rocksdb::Status> statuses(n);
  db_->db()->MultiGet(rocksdb::ReadOptions(), family_, n, keys.data(),
                      values.data(), statuses.data());
  const size_t record_bytes = ValueBytes();
  for (size_t i = 0; i < n; ++i) {
    float* record = records + i * RecordFloats();
    if (statuses[i].ok()) {
      if (values[i].size() != record_bytes) {
        return absl::DataLossError(absl::StrCat(
            "table ", spec_.table_index, ": row ", rows[i], " has ",
            values[i].size(), " bytes in RocksDB, expected ", record_bytes,
            " (", RowPrecision_Name(spec_.precision), " weights)"));
      }
      DecodeValue(values[i].data(), record);
      ++metrics->rows_read;
      metrics->bytes_read += static_cast<int64_t>(record_bytes);
    } else if (statuses[i].IsNotFound()) {
      InitialRecord(rows[i], record);
      ++metrics->rows_initialized;
    } else {
      return RocksDbStatus(
          statuses[i],
          absl::StrCat("read row ", rows[i], " of table ", spec_.table_index));
    }
  }
  return absl::OkStatus();
}

absl::Status RocksDbCachedStore::WriteRecords(const int64_t* rows,
                                              const float* records,
                                              size_t count,
                                              bool with_step) const {
  if (count == 0 && !with_step) return absl::OkStatus();
  rocksdb::WriteBatch batch;
  const size_t record_bytes = ValueBytes();
  // Put copies the value into the batch: one buffer serves every row.
  std::vector<char> value(record_bytes);
  char key[8];
  for (size_t i = 0; i < count; ++i) {
    EncodeRowKey(rows[i], key);
    EncodeValue(records + i * RecordFloats(), value.data());
    batch.Put(family_, rocksdb::Slice(key, 8),
              rocksdb::Slice(value.data(), record_bytes));
  }
  // Only Flush, on the caller's thread, writes the step: the write-backs on
  // the worker leave the counter (which BackwardUpdate changes) alone.
  if (with_step) {
    const int64_t step = slots_->step();
    batch.Put(
        family_, kStepKey,
        rocksdb::Slice(reinterpret_cast<const char*>(&step), sizeof(step)));
  }
  rocksdb::WriteOptions write_options;
  write_options.disableWAL = true;
  const rocksdb::Status s = db_->db()->Write(write_options, &batch);
  if (!s.ok()) {
    return RocksDbStatus(
        s, absl::StrCat("write ", count, " rows of table ", spec_.table_index));
  }
  return absl::OkStatus();
}

absl::Status RocksDbCachedStore::WriteRecordsRetrying(const int64_t* rows,
                                                      const float* records,
                                                      size_t count,
                                                      bool with_step) {
  absl::Status status = WriteRecords(rows, records, count, with_step);
  for (int retry = 0; !status.ok() && retry < options_.write_retries; ++retry) {
    // A flush that failed stops RocksDB's writes until it recovers, which
    // flushes again.
    if (const absl::Status recovered = db_->Recover(); !recovered.ok()) {
      return absl::Status(status.code(), absl::StrCat(status.message(), "; ",
                                                      recovered.message()));
    }
    ++metrics_.write_retries;
    status = WriteRecords(rows, records, count, with_step);
  }
  return status;
}

void RocksDbCachedStore::Submit(bool read, std::function<void()> job) {
  {
    std::lock_guard<std::mutex> lock(jobs_mu_);
    ++(read ? pending_reads_ : pending_writes_);
  }
  db_->Submit([this, read, job = std::move(job)] {
    job();
    // Notify under the lock: the store may be destroyed as soon as a waiter
    // sees its count reach 0.
    std::lock_guard<std::mutex> lock(jobs_mu_);
    --(read ? pending_reads_ : pending_writes_);
    jobs_cv_.notify_all();
  });
}

absl::Status RocksDbCachedStore::WaitForReads() {
  {
    std::unique_lock<std::mutex> lock(jobs_mu_);
    jobs_cv_.wait(lock, [this] { return pending_reads_ == 0; });
  }
  metrics_.rows_read += job_metrics_.rows_read;
  metrics_.rows_initialized += job_metrics_.rows_initialized;
  metrics_.bytes_read += job_metrics_.bytes_read;
  job_metrics_ = {};
  if (!staged_valid_) {
    staged_index_.clear();
    staged_valid_ = true;
  }
  absl::Status status = std::move(prefetch_status_);
  prefetch_status_ = absl::OkStatus();
  if (!status.ok()) staged_index_.clear();
  return status;
}

absl::Status RocksDbCachedStore::WaitForJobs() {
  {
    std::unique_lock<std::mutex> lock(jobs_mu_);
    jobs_cv_.wait(
        lock, [this] { return pending_reads_ == 0 && pending_writes_ == 0; });
  }
  if (!writeback_rows_.empty()) {
    // The background write failed: the buffer is the only copy of those
    // rows, so write it before anything reads RocksDB again. While it
    // cannot be written, every call that waits fails with the error, and
    // the rows stay buffered.
    staged_valid_ = false;
    const absl::Status status =
        WriteRecordsRetrying(writeback_rows_.data(), writeback_records_.data(),
                             writeback_rows_.size(), /*with_step=*/false);
    if (!status.ok()) {
      WaitForReads().IgnoreError();
      return status;
    }
    std::lock_guard<std::mutex> lock(cache_mu_);
    writeback_rows_.clear();
  }
  return WaitForReads();
}

absl::Status RocksDbCachedStore::UniqueRows(
    const data::SparseFeature& ids,
    absl::flat_hash_map<int64_t, int64_t>* index, std::vector<int64_t>* rows,
    std::vector<int64_t>* unique_of_pos) const {
  const int64_t bags = ids.num_bags();
  const int64_t total = bags > 0 ? ids.offsets[bags] : 0;
  index->clear();
  rows->clear();
  unique_of_pos->resize(total);
  for (int64_t p = 0; p < total; ++p) {
    const int64_t row = ids.ids[p];
    if (row < 0 || row >= spec_.rows) {
      return absl::InvalidArgumentError(
          absl::StrCat("table ", spec_.table_index, ": id ", row,
                       " at position ", p, " outside [0, ", spec_.rows, ")"));
    }
    const auto [it, inserted] =
        index->try_emplace(row, static_cast<int64_t>(rows->size()));
    if (inserted) rows->push_back(row);
    (*unique_of_pos)[p] = it->second;
  }
  return absl::OkStatus();
}

absl::StatusOr<const data::SparseFeature*> RocksDbCachedStore::Prepare(
    const data::SparseFeature& ids) {
  prepared_ = false;
  RETURN_IF_ERROR(WaitForJobs());
  // The plan checks the ids and picks the slots (hits keep theirs, misses
  // take free slots, then victims'); nothing changes until all checks and
  // reads have passed.
  RETURN_IF_ERROR(manager_.Plan(ids));
  const SlotPlan& plan = manager_.plan();
  const int64_t unique = static_cast<int64_t>(plan.rows.size());
  const size_t misses = plan.misses.size();

  // Records of the misses: staged by a prefetch, or read now. (The dirty
  // victims are written after the commit, in the background; no miss is a
  // victim, and every read waits for the writes queued before it.)
  const int record_floats = RecordFloats();
  miss_record_.resize(misses);
  to_read_.clear();
  to_read_miss_.clear();
  int64_t prefetch_hits = 0;
  for (size_t i = 0; i < misses; ++i) {
    const int64_t row = plan.rows[plan.misses[i]];
    const auto it = staged_index_.find(row);
    if (it != staged_index_.end()) {
      miss_record_[i] = staged_records_.data() + it->second * record_floats;
      ++prefetch_hits;
    } else {
      to_read_.push_back(row);
      to_read_miss_.push_back(i);
    }
  }
  loaded_.resize(to_read_.size() * record_floats);
  RETURN_IF_ERROR(ReadRecords(to_read_, loaded_.data(), &metrics_));
  for (size_t j = 0; j < to_read_.size(); ++j) {
    miss_record_[to_read_miss_[j]] = loaded_.data() + j * record_floats;
  }

  // Commit: nothing below fails. Dirty victims are copied out (in row order,
  // which RocksDB inserts fastest) for the background write before the
  // misses take their slots. Where rows live changes under cache_mu_, in one
  // piece for PoolReadOnly: a dirty victim is in the write-back buffer
  // before it leaves the slot map, and a miss is in its slot when it enters
  // the map.
  std::unique_lock<std::mutex> moving(cache_mu_);
  writeback_rows_ = plan.writeback_rows;
  writeback_records_.resize(writeback_rows_.size() * record_floats);
  for (size_t i = 0; i < writeback_rows_.size(); ++i) {
    CopySlotToRecord(plan.writeback_slots[i],
                     writeback_records_.data() + i * record_floats);
  }
  manager_.Commit();
  metrics_.evictions += plan.evictions;
  for (size_t i = 0; i < misses; ++i) {
    const int64_t k = plan.misses[i];
    CopyRecordToSlot(miss_record_[i], plan.slots[k], plan.rows[k]);
    staged_index_.erase(plan.rows[k]);
  }
  moving.unlock();
  metrics_.hits += unique - static_cast<int64_t>(misses);
  metrics_.misses += static_cast<int64_t>(misses);
  metrics_.prefetch_hits += prefetch_hits;
  if (!writeback_rows_.empty()) {
    metrics_.rows_written += static_cast<int64_t>(writeback_rows_.size());
    metrics_.bytes_written +=
        static_cast<int64_t>(writeback_rows_.size() * ValueBytes());
    Submit(/*read=*/false, [this] {
      // Written: the buffer is no longer the only copy. On failure it stays,
      // and WaitForJobs writes it again.
      if (WriteRecords(writeback_rows_.data(), writeback_records_.data(),
                       writeback_rows_.size(), /*with_step=*/false)
              .ok()) {
        std::lock_guard<std::mutex> lock(cache_mu_);
        writeback_rows_.clear();
      }
    });
  }
  prepared_ = true;
  return &plan.remapped;
}

absl::Status RocksDbCachedStore::CheckPrepared(
    const data::SparseFeature& prepared) const {
  if (&prepared != &manager_.plan().remapped || !prepared_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "table ", spec_.table_index,
        ": the batch is not the result of the last successful Prepare"));
  }
  return absl::OkStatus();
}

absl::Status RocksDbCachedStore::Forward(const data::SparseFeature& prepared,
                                         float* out, int64_t out_stride) const {
  RETURN_IF_ERROR(CheckPrepared(prepared));
  slots_->Forward(prepared, out, out_stride);
  return absl::OkStatus();
}

absl::Status RocksDbCachedStore::BackwardUpdate(
    const data::SparseFeature& prepared, const float* grad,
    int64_t grad_stride) {
  RETURN_IF_ERROR(CheckPrepared(prepared));
  slots_->BackwardUpdate(prepared, grad, grad_stride);
  manager_.MarkBatchDirty();
  return absl::OkStatus();
}

absl::StatusOr<int64_t> RocksDbCachedStore::BeginUpdate(
    const data::SparseFeature& prepared, const float* grad,
    int64_t grad_stride) {
  RETURN_IF_ERROR(CheckPrepared(prepared));
  return slots_->BeginUpdate(prepared, grad, grad_stride);
}

absl::Status RocksDbCachedStore::Prefetch(const data::SparseFeature& next_ids) {
  // Only an earlier read uses the staging area: the write-back of the last
  // Prepare may still run, and this read is queued behind it.
  RETURN_IF_ERROR(WaitForReads());
  // The scan for rows to stage runs on the worker too (off the step's
  // critical path): nothing changes the slot map until the next Prepare,
  // which waits for this job.
  const int64_t bags = next_ids.num_bags();
  const int64_t total = bags > 0 ? next_ids.offsets[bags] : 0;
  prefetch_ids_.assign(next_ids.ids.begin(), next_ids.ids.begin() + total);
  staged_rows_.clear();
  staged_index_.clear();
  if (total == 0) return absl::OkStatus();
  Submit(/*read=*/true, [this] {
    // A failed write-back before this read: RocksDB lacks those rows, so
    // nothing may be staged from it (WaitForJobs retries the write).
    if (!writeback_rows_.empty()) {
      staged_valid_ = false;
      return;
    }
    for (const int64_t row : prefetch_ids_) {
      // Bad ids are Prepare's to report.
      if (row < 0 || row >= spec_.rows || manager_.SlotOf(row) >= 0) continue;
      if (staged_index_
              .try_emplace(row, static_cast<int64_t>(staged_rows_.size()))
              .second) {
        staged_rows_.push_back(row);
      }
    }
    staged_records_.resize(staged_rows_.size() * RecordFloats());
    prefetch_status_ =
        ReadRecords(staged_rows_, staged_records_.data(), &job_metrics_);
  });
  return absl::OkStatus();
}

absl::Status RocksDbCachedStore::PoolReadOnly(const data::SparseFeature& ids,
                                              float* out,
                                              int64_t out_stride) const {
  // The batch over its unique rows: id p becomes the index of its row in
  // `rows`, which the rows gathered below are laid out in.
  absl::flat_hash_map<int64_t, int64_t> index;
  std::vector<int64_t> rows;
  data::SparseFeature local;
  local.offsets = ids.offsets;
  RETURN_IF_ERROR(UniqueRows(ids, &index, &rows, &local.ids));

  // Why this is each row's value after the caller's last BackwardUpdate:
  // values change only in BackwardUpdate and WriteRows, which never run
  // beside this (the contract). Prepare, the write-back and Flush only move
  // values: Prepare puts a dirty victim into the write-back buffer and takes
  // it out of the map in one piece under cache_mu_, and the buffer is
  // emptied, under cache_mu_, only after RocksDB holds it. So under the lock
  // a row is in a slot, or in the buffer, or RocksDB holds its value (or
  // lacks it, and it is InitialValue); in the last case RocksDB keeps that
  // value after the lock is released, since any later write of the row
  // (evicted again, flushed) carries the same value. The staging area is
  // not read: it only holds copies of RocksDB's values.
  const int dim = spec_.dim;
  const int floats = RecordFloats();
  std::vector<float> weights(rows.size() * dim);
  std::vector<int64_t> stored, stored_at;
  {
    std::lock_guard<std::mutex> lock(cache_mu_);
    for (size_t k = 0; k < rows.size(); ++k) {
      const float* from = nullptr;
      if (const int64_t slot = manager_.SlotOf(rows[k]); slot >= 0) {
        if (spec_.precision != ROW_FP32) {
          // A 16-bit slot's words, widened (exact).
          const uint16_t* w = slots_->words() + slot * dim;
          for (int c = 0; c < dim; ++c) {
            weights[k * dim + c] = WordToFloat(spec_.precision, w[c]);
          }
          continue;
        }
        from = slots_->weights() + slot * dim;
      } else if (const auto wb = std::lower_bound(
                     writeback_rows_.begin(), writeback_rows_.end(), rows[k]);
                 wb != writeback_rows_.end() && *wb == rows[k]) {
        from =
            writeback_records_.data() + (wb - writeback_rows_.begin()) * floats;
      }
      if (from != nullptr) {
        std::copy_n(from, dim, weights.data() + k * dim);
      } else {
        stored.push_back(rows[k]);
        stored_at.push_back(static_cast<int64_t>(k));
      }
    }
  }
  if (!stored.empty()) {
    std::vector<float> records(stored.size() * floats);
    // The store's counters are its caller's: this read is not counted.
    StoreMetrics uncounted;
    RETURN_IF_ERROR(ReadRecords(stored, records.data(), &uncounted));
    for (size_t j = 0; j < stored.size(); ++j) {
      std::copy_n(records.data() + j * floats, dim,
                  weights.data() + stored_at[j] * dim);
    }
  }
  PoolRows(weights.data(), dim, spec_.pooling, local, out, out_stride);
  return absl::OkStatus();
}

absl::Status RocksDbCachedStore::ReadRows(int64_t begin, int64_t count,
                                          float* out) {
  RETURN_IF_ERROR(CheckRowRange(spec_, begin, count));
  RETURN_IF_ERROR(WaitForJobs());
  const int floats = RecordFloats();
  // Resident and staged rows are copied; the rest are read in one MultiGet.
  std::vector<int64_t> rows, at;
  for (int64_t i = 0; i < count; ++i) {
    const int64_t row = begin + i;
    float* record = out + i * floats;
    if (const int64_t slot = manager_.SlotOf(row); slot >= 0) {
      CopySlotToRecord(slot, record);
    } else if (const auto st = staged_index_.find(row);
               st != staged_index_.end()) {
      std::memcpy(record, staged_records_.data() + st->second * floats,
                  floats * sizeof(float));
    } else {
      rows.push_back(row);
      at.push_back(i);
    }
  }
  if (rows.empty()) return absl::OkStatus();
  std::vector<float> read(rows.size() * floats);
  RETURN_IF_ERROR(ReadRecords(rows, read.data(), &metrics_));
  for (size_t j = 0; j < rows.size(); ++j) {
    std::memcpy(out + at[j] * floats, read.data() + j * floats,
                floats * sizeof(float));
  }
  return absl::OkStatus();
}

absl::Status RocksDbCachedStore::WriteRows(int64_t begin, int64_t count,
                                           const float* records) {
  RETURN_IF_ERROR(CheckRowRange(spec_, begin, count));
  RETURN_IF_ERROR(WaitForJobs());
  const int floats = RecordFloats();
  std::vector<int64_t> rows;
  std::vector<float> to_write;
  for (int64_t i = 0; i < count; ++i) {
    const int64_t row = begin + i;
    const float* record = records + i * floats;
    if (const int64_t slot = manager_.SlotOf(row); slot >= 0) {
      CopyRecordToSlot(record, slot, row);
      manager_.SetDirty(slot, true);
      continue;
    }
    staged_index_.erase(row);
    rows.push_back(row);
    to_write.insert(to_write.end(), record, record + floats);
  }
  for (size_t b = 0; b < rows.size(); b += kFlushBatchRows) {
    const size_t n = std::min(rows.size() - b, size_t{kFlushBatchRows});
    RETURN_IF_ERROR(WriteRecordsRetrying(rows.data() + b,
                                         to_write.data() + b * floats, n,
                                         /*with_step=*/false));
    metrics_.rows_written += static_cast<int64_t>(n);
    metrics_.bytes_written += static_cast<int64_t>(n * ValueBytes());
  }
  return absl::OkStatus();
}

absl::Status RocksDbCachedStore::SetOptimizer(
    const OptimizerConfig& optimizer) {
  RETURN_IF_ERROR(CheckOptimizerChange(spec_, optimizer));
  RETURN_IF_ERROR(WaitForJobs());
  spec_.optimizer = optimizer;
  slots_->set_optimizer(optimizer);
  return absl::OkStatus();
}

StoreCapabilities RocksDbCachedStore::capabilities() const {
  StoreOptions options;
  options.kind = StoreKind::kRocksDbCache;
  options.rocksdb = options_;
  return TierCapabilities(options, spec_.rows);
}

StoreBytes RocksDbCachedStore::MemoryBytes() const {
  StoreBytes bytes{.host = TableBytes(*slots_)};
  uint64_t value = 0;
  if (db_->db()->GetIntProperty(family_, "rocksdb.cur-size-all-mem-tables",
                                &value)) {
    bytes.host += static_cast<int64_t>(value);
  }
  if (db_->db()->GetIntProperty(family_, "rocksdb.live-sst-files-size",
                                &value)) {
    bytes.disk = static_cast<int64_t>(value);
  }
  return bytes;
}

absl::Status RocksDbCachedStore::Save(RowsSink& sink) {
  RETURN_IF_ERROR(Flush());
  return sink.Database(*db_);
}

absl::Status RocksDbCachedStore::Flush() {
  RETURN_IF_ERROR(WaitForJobs());
  const std::vector<int64_t> dirty = manager_.DirtySlots();
  // The last chunk (possibly empty) carries the step counter.
  const int record_floats = RecordFloats();
  std::vector<int64_t> rows;
  std::vector<float> records;
  size_t begin = 0;
  do {
    const size_t end = std::min(dirty.size(), begin + kFlushBatchRows);
    rows.resize(end - begin);
    records.resize(rows.size() * record_floats);
    for (size_t i = begin; i < end; ++i) {
      rows[i - begin] = manager_.RowOf(dirty[i]);
      CopySlotToRecord(dirty[i], records.data() + (i - begin) * record_floats);
    }
    RETURN_IF_ERROR(WriteRecordsRetrying(rows.data(), records.data(),
                                         rows.size(),
                                         /*with_step=*/end == dirty.size()));
    for (size_t i = begin; i < end; ++i) manager_.SetDirty(dirty[i], false);
    metrics_.rows_written += static_cast<int64_t>(rows.size());
    metrics_.bytes_written += static_cast<int64_t>(rows.size() * ValueBytes());
    begin = end;
  } while (begin < dirty.size());
  return absl::OkStatus();
}

}  // namespace dlrm::embedding
