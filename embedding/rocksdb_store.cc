// RowDatabase over rocksdb::DB, and the host row cache in front of it.
#include "embedding/rocksdb_store.h"

#include <rocksdb/cache.h>
#include <rocksdb/db.h>
#include <rocksdb/filter_policy.h>
#include <rocksdb/table.h>
#include <rocksdb/utilities/checkpoint.h>
#include <rocksdb/write_batch.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <system_error>

namespace dlrm::embedding {
namespace {

// Key of the table's step counter: 4 bytes, so it never equals a row key.
constexpr char kStepKey[] = "step";
// Rows per WriteBatch when flushing, to bound the batch's memory.
constexpr size_t kFlushBatchRows = 16384;

// Maps a RocksDB status to the closest absl code, naming the operation.
absl::Status ToStatus(const rocksdb::Status& s, const std::string& what) {
  const std::string message =
      absl::StrCat("RocksDB ", what, ": ", s.ToString());
  if (s.IsNotFound()) return absl::NotFoundError(message);
  if (s.IsCorruption()) return absl::DataLossError(message);
  if (s.IsInvalidArgument()) return absl::InvalidArgumentError(message);
  if (s.IsNotSupported()) return absl::UnimplementedError(message);
  if (s.IsBusy() || s.IsTimedOut() || s.IsTryAgain()) {
    return absl::UnavailableError(message);
  }
  return absl::InternalError(message);
}

// Big-endian, so RocksDB's byte order is row order.
void EncodeRowKey(int64_t row, char* key) {
  const auto u = static_cast<uint64_t>(row);
  for (int i = 0; i < 8; ++i) key[i] = static_cast<char>(u >> (56 - 8 * i));
}

bool IsRowwiseAdagrad(const OptimizerConfig& optimizer) {
  return optimizer.type() == OptimizerConfig::ADAGRAD ||
         optimizer.type() == OptimizerConfig::ROWWISE_ADAGRAD;
}

}  // namespace

// ---------------------------------------------------------------------------
// RowDatabase

absl::StatusOr<std::unique_ptr<RowDatabase>> RowDatabase::Open(
    const RocksDbStoreOptions& options) {
  RETURN_IF_ERROR(options.Validate());
  std::error_code ec;
  std::filesystem::create_directories(options.path, ec);
  if (ec) {
    return absl::UnavailableError(absl::StrCat(
        "cannot create RocksDB directory ", options.path, ": ", ec.message()));
  }
  std::unique_ptr<RowDatabase> db(new RowDatabase());
  db->options_ = options;

  rocksdb::DBOptions db_options;
  db_options.create_if_missing = true;
  db_options.create_missing_column_families = true;
  rocksdb::BlockBasedTableOptions table_options;
  if (options.block_cache_bytes > 0) {
    table_options.block_cache =
        rocksdb::NewLRUCache(static_cast<size_t>(options.block_cache_bytes));
  }
  if (options.bloom_bits_per_key > 0) {
    table_options.filter_policy.reset(
        rocksdb::NewBloomFilterPolicy(options.bloom_bits_per_key, false));
  }
  db->family_options_ = std::make_unique<rocksdb::ColumnFamilyOptions>();
  db->family_options_->table_factory.reset(
      rocksdb::NewBlockBasedTableFactory(table_options));

  // A new database has no list yet: it starts with the default family.
  std::vector<std::string> names;
  if (!rocksdb::DB::ListColumnFamilies(db_options, options.path, &names).ok() ||
      names.empty()) {
    names = {rocksdb::kDefaultColumnFamilyName};
  }
  std::vector<rocksdb::ColumnFamilyDescriptor> descriptors;
  for (const std::string& name : names) {
    descriptors.emplace_back(name, *db->family_options_);
  }
  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  rocksdb::DB* raw = nullptr;
  const rocksdb::Status s =
      rocksdb::DB::Open(db_options, options.path, descriptors, &handles, &raw);
  if (!s.ok()) return ToStatus(s, absl::StrCat("open ", options.path));
  db->db_.reset(raw);
  for (size_t i = 0; i < handles.size(); ++i) {
    db->families_.emplace_back(names[i], handles[i]);
  }
  return db;
}

absl::StatusOr<std::unique_ptr<RowDatabase>> RowDatabase::RestoreCheckpoint(
    const std::string& checkpoint_dir, const RocksDbStoreOptions& options) {
  RETURN_IF_ERROR(options.Validate());
  std::error_code ec;
  if (!std::filesystem::is_directory(checkpoint_dir, ec)) {
    return absl::NotFoundError(
        absl::StrCat("checkpoint ", checkpoint_dir, " is not a directory"));
  }
  if (std::filesystem::exists(options.path, ec) &&
      !std::filesystem::is_empty(options.path, ec)) {
    return absl::AlreadyExistsError(absl::StrCat(
        "cannot restore into ", options.path, ": it exists and is not empty"));
  }
  std::filesystem::create_directories(options.path, ec);
  if (!ec) {
    std::filesystem::copy(checkpoint_dir, options.path,
                          std::filesystem::copy_options::recursive, ec);
  }
  if (ec) {
    return absl::UnavailableError(
        absl::StrCat("copying checkpoint ", checkpoint_dir, " to ",
                     options.path, ": ", ec.message()));
  }
  return Open(options);
}

RowDatabase::~RowDatabase() {
  if (db_ == nullptr) return;
  for (auto& [name, handle] : families_) {
    db_->DestroyColumnFamilyHandle(handle);
  }
  // Close flushes memtables the WAL-less writes left unpersisted.
  db_->Close();
}

absl::StatusOr<rocksdb::ColumnFamilyHandle*> RowDatabase::ColumnFamily(
    const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [family_name, handle] : families_) {
    if (family_name == name) return handle;
  }
  rocksdb::ColumnFamilyHandle* handle = nullptr;
  const rocksdb::Status s =
      db_->CreateColumnFamily(*family_options_, name, &handle);
  if (!s.ok()) {
    return ToStatus(
        s, absl::StrCat("create column family ", name, " in ", options_.path));
  }
  families_.emplace_back(name, handle);
  return handle;
}

absl::Status RowDatabase::Checkpoint(const std::string& dir) {
  std::error_code ec;
  if (std::filesystem::exists(dir, ec)) {
    return absl::AlreadyExistsError(
        absl::StrCat("checkpoint directory ", dir, " already exists"));
  }
  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [name, handle] : families_) handles.push_back(handle);
  }
  // Spill writes skip the WAL, so the memtables must reach SST files before
  // the hard links are taken.
  rocksdb::Status s = db_->Flush(rocksdb::FlushOptions(), handles);
  if (!s.ok()) return ToStatus(s, absl::StrCat("flush ", options_.path));
  rocksdb::Checkpoint* raw = nullptr;
  s = rocksdb::Checkpoint::Create(db_.get(), &raw);
  if (!s.ok()) return ToStatus(s, "create checkpoint object");
  std::unique_ptr<rocksdb::Checkpoint> checkpoint(raw);
  s = checkpoint->CreateCheckpoint(dir);
  if (!s.ok()) return ToStatus(s, absl::StrCat("checkpoint to ", dir));
  return absl::OkStatus();
}

std::string ColumnFamilyName(const TableSpec& spec) {
  const TableSlice& slice = spec.slice;
  if (slice.table_rows == 0 && slice.row_begin == 0 && slice.col_begin == 0) {
    return absl::StrCat("table_", spec.table_index);
  }
  return absl::StrCat("table_", spec.table_index, "_rows_", slice.row_begin,
                      "_", slice.row_begin + spec.rows, "_cols_",
                      slice.col_begin, "_", slice.col_begin + spec.dim);
}

// ---------------------------------------------------------------------------
// RocksDbCachedStore

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
    return ToStatus(s, absl::StrCat("read step of table ", spec.table_index));
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
      state_floats_(StateFloatsPerRow(spec.optimizer, spec.dim)) {
  // More slots than rows could never be used.
  const int64_t capacity = std::min(options.cache_rows, spec.rows);
  slots_ = EmbeddingTable::SlotArray(spec.table_index, capacity, spec.dim,
                                     spec.pooling, spec.optimizer);
  slot_info_.resize(capacity);
  free_slots_.reserve(capacity);
  // Popped from the back: slots fill in order 0, 1, 2, ...
  for (int64_t s = capacity - 1; s >= 0; --s) free_slots_.push_back(s);
  slot_of_.reserve(capacity);
}

RocksDbCachedStore::~RocksDbCachedStore() {
  if (prefetch_thread_.joinable()) prefetch_thread_.join();
}

bool RocksDbCachedStore::IsDirty(int64_t row) const {
  const auto it = slot_of_.find(row);
  return it != slot_of_.end() && slot_info_[it->second].dirty;
}

RocksDbCachedStore::EvictionKey RocksDbCachedStore::KeyOf(int64_t slot) const {
  const Slot& info = slot_info_[slot];
  return {options_.eviction == EvictionPolicy::kLfu ? info.uses : 0,
          info.last_use, slot};
}

void RocksDbCachedStore::CopySlotToRecord(int64_t slot, float* record) const {
  const int dim = spec_.dim;
  std::memcpy(record, slots_->weights() + slot * dim, dim * sizeof(float));
  if (state_floats_ == 1) {
    record[dim] = slots_->state1()[slot];
  } else if (state_floats_ > 0) {
    std::memcpy(record + dim, slots_->state1().data() + slot * dim,
                dim * sizeof(float));
    std::memcpy(record + 2 * dim, slots_->state2().data() + slot * dim,
                dim * sizeof(float));
  }
}

void RocksDbCachedStore::CopyRecordToSlot(const float* record, int64_t slot) {
  const int dim = spec_.dim;
  std::memcpy(slots_->weights() + slot * dim, record, dim * sizeof(float));
  if (state_floats_ == 1) {
    slots_->state1()[slot] = record[dim];
  } else if (state_floats_ > 0) {
    std::memcpy(slots_->state1().data() + slot * dim, record + dim,
                dim * sizeof(float));
    std::memcpy(slots_->state2().data() + slot * dim, record + 2 * dim,
                dim * sizeof(float));
  }
}

void RocksDbCachedStore::InitialRecord(int64_t row, float* record) const {
  const TableSlice& slice = spec_.slice;
  const int64_t table_rows =
      slice.table_rows > 0 ? slice.table_rows : spec_.rows;
  InitialRow(spec_.seed, spec_.table_index, table_rows, slice.row_begin + row,
             slice.col_begin, spec_.dim, record);
  if (IsRowwiseAdagrad(spec_.optimizer)) {
    record[spec_.dim] = spec_.optimizer.initial_accumulator();
  } else {
    std::fill(record + spec_.dim, record + RecordFloats(), 0.0f);
  }
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
  const size_t record_bytes = RecordFloats() * sizeof(float);
  for (size_t i = 0; i < n; ++i) {
    float* record = records + i * RecordFloats();
    if (statuses[i].ok()) {
      if (values[i].size() != record_bytes) {
        return absl::DataLossError(absl::StrCat(
            "table ", spec_.table_index, ": row ", rows[i], " has ",
            values[i].size(), " bytes in RocksDB, expected ", record_bytes));
      }
      std::memcpy(record, values[i].data(), record_bytes);
      ++metrics->rows_read;
      metrics->bytes_read += static_cast<int64_t>(record_bytes);
    } else if (statuses[i].IsNotFound()) {
      InitialRecord(rows[i], record);
      ++metrics->rows_initialized;
    } else {
      return ToStatus(
          statuses[i],
          absl::StrCat("read row ", rows[i], " of table ", spec_.table_index));
    }
  }
  return absl::OkStatus();
}

absl::Status RocksDbCachedStore::WriteSlots(const std::vector<int64_t>& slots,
                                            bool with_step) {
  if (slots.empty() && !with_step) return absl::OkStatus();
  rocksdb::WriteBatch batch;
  std::vector<float> record(RecordFloats());
  const size_t record_bytes = record.size() * sizeof(float);
  char key[8];
  for (const int64_t slot : slots) {
    CopySlotToRecord(slot, record.data());
    EncodeRowKey(slot_info_[slot].row, key);
    batch.Put(family_, rocksdb::Slice(key, 8),
              rocksdb::Slice(reinterpret_cast<const char*>(record.data()),
                             record_bytes));
  }
  const int64_t step = slots_->step();
  if (with_step) {
    batch.Put(
        family_, kStepKey,
        rocksdb::Slice(reinterpret_cast<const char*>(&step), sizeof(step)));
  }
  rocksdb::WriteOptions write_options;
  write_options.disableWAL = true;
  const rocksdb::Status s = db_->db()->Write(write_options, &batch);
  if (!s.ok()) {
    return ToStatus(s, absl::StrCat("write ", slots.size(), " rows of table ",
                                    spec_.table_index));
  }
  metrics_.rows_written += static_cast<int64_t>(slots.size());
  metrics_.bytes_written += static_cast<int64_t>(slots.size() * record_bytes);
  return absl::OkStatus();
}

absl::Status RocksDbCachedStore::WaitForPrefetch() {
  if (!prefetch_thread_.joinable()) return absl::OkStatus();
  prefetch_thread_.join();
  metrics_.rows_read += prefetch_metrics_.rows_read;
  metrics_.rows_initialized += prefetch_metrics_.rows_initialized;
  metrics_.bytes_read += prefetch_metrics_.bytes_read;
  prefetch_metrics_ = {};
  absl::Status status = std::move(prefetch_status_);
  prefetch_status_ = absl::OkStatus();
  if (!status.ok()) staged_index_.clear();
  return status;
}

absl::StatusOr<const data::SparseFeature*> RocksDbCachedStore::Prepare(
    const data::SparseFeature& ids) {
  prepared_ = false;
  RETURN_IF_ERROR(WaitForPrefetch());
  const int64_t bags = ids.num_bags();
  const int64_t total = bags > 0 ? ids.offsets[bags] : 0;

  // Unique rows in first-occurrence order; nothing changes until all checks
  // and reads have passed.
  batch_index_.clear();
  batch_rows_.clear();
  unique_of_pos_.resize(total);
  for (int64_t p = 0; p < total; ++p) {
    const int64_t row = ids.ids[p];
    if (row < 0 || row >= spec_.rows) {
      return absl::InvalidArgumentError(
          absl::StrCat("table ", spec_.table_index, ": id ", row,
                       " at position ", p, " outside [0, ", spec_.rows, ")"));
    }
    const auto [it, inserted] =
        batch_index_.try_emplace(row, static_cast<int64_t>(batch_rows_.size()));
    if (inserted) batch_rows_.push_back(row);
    unique_of_pos_[p] = it->second;
  }
  const int64_t unique = static_cast<int64_t>(batch_rows_.size());
  if (unique > capacity()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "table ", spec_.table_index, ": batch has ", unique,
        " unique ids but the row cache holds ", capacity(),
        " rows (RocksDbStoreOptions.cache_rows); use smaller batches or a "
        "bigger cache"));
  }

  // Hits keep their slot; misses take free slots, then evicted ones.
  std::vector<int64_t> unique_slot(unique, -1);
  std::vector<int64_t> misses;
  for (int64_t k = 0; k < unique; ++k) {
    const auto it = slot_of_.find(batch_rows_[k]);
    if (it != slot_of_.end()) {
      unique_slot[k] = it->second;
    } else {
      misses.push_back(k);
    }
  }
  const int64_t needed = static_cast<int64_t>(misses.size()) -
                         static_cast<int64_t>(free_slots_.size());
  std::vector<int64_t> victims, dirty_victims;
  for (auto it = eviction_order_.begin();
       it != eviction_order_.end() &&
       static_cast<int64_t>(victims.size()) < needed;
       ++it) {
    const int64_t slot = std::get<2>(*it);
    // A row of this batch stays.
    if (batch_index_.contains(slot_info_[slot].row)) continue;
    victims.push_back(slot);
    if (slot_info_[slot].dirty) dirty_victims.push_back(slot);
  }

  // Write back first: once written, a dirty victim is clean, so a failed
  // read below leaves a consistent cache.
  RETURN_IF_ERROR(WriteSlots(dirty_victims, /*with_step=*/false));
  for (const int64_t slot : dirty_victims) slot_info_[slot].dirty = false;

  // Records of the misses: staged by a prefetch, or read now.
  const int record_floats = RecordFloats();
  std::vector<const float*> miss_record(misses.size());
  std::vector<int64_t> to_read;
  std::vector<size_t> to_read_miss;
  int64_t prefetch_hits = 0;
  for (size_t i = 0; i < misses.size(); ++i) {
    const auto it = staged_index_.find(batch_rows_[misses[i]]);
    if (it != staged_index_.end()) {
      miss_record[i] = staged_records_.data() + it->second * record_floats;
      ++prefetch_hits;
    } else {
      to_read.push_back(batch_rows_[misses[i]]);
      to_read_miss.push_back(i);
    }
  }
  loaded_.resize(to_read.size() * record_floats);
  RETURN_IF_ERROR(ReadRecords(to_read, loaded_.data(), &metrics_));
  for (size_t j = 0; j < to_read.size(); ++j) {
    miss_record[to_read_miss[j]] = loaded_.data() + j * record_floats;
  }

  // Commit: nothing below fails.
  for (const int64_t slot : victims) {
    eviction_order_.erase(KeyOf(slot));
    slot_of_.erase(slot_info_[slot].row);
    slot_info_[slot] = Slot{};
    free_slots_.push_back(slot);
  }
  metrics_.evictions += static_cast<int64_t>(victims.size());
  for (int64_t k = 0; k < unique; ++k) {
    if (unique_slot[k] >= 0) eviction_order_.erase(KeyOf(unique_slot[k]));
  }
  for (size_t i = 0; i < misses.size(); ++i) {
    const int64_t row = batch_rows_[misses[i]];
    const int64_t slot = free_slots_.back();
    free_slots_.pop_back();
    slot_info_[slot] = Slot{row, false, 0, 0};
    slot_of_.emplace(row, slot);
    CopyRecordToSlot(miss_record[i], slot);
    staged_index_.erase(row);
    unique_slot[misses[i]] = slot;
  }
  for (int64_t k = 0; k < unique; ++k) {
    Slot& info = slot_info_[unique_slot[k]];
    info.last_use = ++tick_;
    ++info.uses;
    eviction_order_.insert(KeyOf(unique_slot[k]));
  }
  metrics_.hits += unique - static_cast<int64_t>(misses.size());
  metrics_.misses += static_cast<int64_t>(misses.size());
  metrics_.prefetch_hits += prefetch_hits;

  batch_slots_ = std::move(unique_slot);
  remapped_.offsets = ids.offsets;
  remapped_.ids.resize(total);
  for (int64_t p = 0; p < total; ++p) {
    remapped_.ids[p] = batch_slots_[unique_of_pos_[p]];
  }
  prepared_ = true;
  return &remapped_;
}

absl::Status RocksDbCachedStore::CheckPrepared(
    const data::SparseFeature& prepared) const {
  if (&prepared != &remapped_ || !prepared_) {
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
  for (const int64_t slot : batch_slots_) slot_info_[slot].dirty = true;
  return absl::OkStatus();
}

absl::Status RocksDbCachedStore::Prefetch(const data::SparseFeature& next_ids) {
  RETURN_IF_ERROR(WaitForPrefetch());
  staged_rows_.clear();
  staged_index_.clear();
  const int64_t bags = next_ids.num_bags();
  const int64_t total = bags > 0 ? next_ids.offsets[bags] : 0;
  for (int64_t p = 0; p < total; ++p) {
    const int64_t row = next_ids.ids[p];
    // Bad ids are Prepare's to report.
    if (row < 0 || row >= spec_.rows || slot_of_.contains(row)) continue;
    if (staged_index_
            .try_emplace(row, static_cast<int64_t>(staged_rows_.size()))
            .second) {
      staged_rows_.push_back(row);
    }
  }
  if (staged_rows_.empty()) return absl::OkStatus();
  staged_records_.resize(staged_rows_.size() * RecordFloats());
  try {
    prefetch_thread_ = std::thread([this] {
      prefetch_status_ =
          ReadRecords(staged_rows_, staged_records_.data(), &prefetch_metrics_);
    });
  } catch (const std::system_error& e) {
    staged_index_.clear();
    return absl::InternalError(absl::StrCat(
        "table ", spec_.table_index, ": cannot start prefetch: ", e.what()));
  }
  return absl::OkStatus();
}

absl::Status RocksDbCachedStore::ReadRow(int64_t row, float* out) {
  if (row < 0 || row >= spec_.rows) {
    return absl::InvalidArgumentError(
        absl::StrCat("table ", spec_.table_index, ": row ", row,
                     " outside [0, ", spec_.rows, ")"));
  }
  RETURN_IF_ERROR(WaitForPrefetch());
  if (const auto it = slot_of_.find(row); it != slot_of_.end()) {
    CopySlotToRecord(it->second, out);
    return absl::OkStatus();
  }
  if (const auto it = staged_index_.find(row); it != staged_index_.end()) {
    std::memcpy(out, staged_records_.data() + it->second * RecordFloats(),
                RecordFloats() * sizeof(float));
    return absl::OkStatus();
  }
  return ReadRecords({row}, out, &metrics_);
}

absl::Status RocksDbCachedStore::Flush() {
  RETURN_IF_ERROR(WaitForPrefetch());
  std::vector<int64_t> dirty;
  for (int64_t slot = 0; slot < capacity(); ++slot) {
    if (slot_info_[slot].dirty) dirty.push_back(slot);
  }
  // The last chunk (possibly empty) carries the step counter.
  size_t begin = 0;
  do {
    const size_t end = std::min(dirty.size(), begin + kFlushBatchRows);
    const std::vector<int64_t> chunk(dirty.begin() + begin,
                                     dirty.begin() + end);
    RETURN_IF_ERROR(WriteSlots(chunk, /*with_step=*/end == dirty.size()));
    for (const int64_t slot : chunk) slot_info_[slot].dirty = false;
    begin = end;
  } while (begin < dirty.size());
  return absl::OkStatus();
}

}  // namespace dlrm::embedding
