// CachedStore: moving records between the backing store and the slots
// around each batch, and HostSlots.
#include "embedding/cached_store.h"

#include <algorithm>
#include <cstring>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace dlrm::embedding {

HostSlots::HostSlots(const TableSpec& spec, int64_t slots)
    : table_(EmbeddingTable::SlotArray(spec.table_index, slots, spec.dim,
                                       spec.pooling, spec.optimizer,
                                       spec.precision, spec.seed, spec.slice)),
      record_floats_(spec.RecordFloats()) {}

absl::Status HostSlots::ReadSlots(const int64_t* slots, int64_t n,
                                  float* records) {
  for (int64_t i = 0; i < n; ++i) {
    table_->ReadRecord(slots[i], records + i * record_floats_);
  }
  return absl::OkStatus();
}

absl::Status HostSlots::WriteSlots(const int64_t* slots, int64_t n,
                                   const float* records) {
  for (int64_t i = 0; i < n; ++i) {
    table_->WriteRecord(slots[i], records + i * record_floats_);
  }
  return absl::OkStatus();
}

bool HostSlots::MapHostTable(EmbeddingTable& table) {
  mapped_ = nullptr;
  if (table.dim() != table_->dim() ||
      table.precision() != table_->precision() ||
      table.state_floats(0) != table_->state_floats(0) ||
      table.state_floats(1) != table_->state_floats(1)) {
    return false;
  }
  mapped_ = &table;
  return true;
}

absl::Status HostSlots::CheckMapped(const EmbeddingTable& table) const {
  if (&table != mapped_) {
    return absl::FailedPreconditionError(
        absl::StrCat("table ", table.table_index(),
                     ": not the host table mapped into the slots"));
  }
  return absl::OkStatus();
}

absl::Status HostSlots::LoadRows(const EmbeddingTable& table,
                                 const int64_t* rows, const int64_t* slots,
                                 int64_t n) {
  RETURN_IF_ERROR(CheckMapped(table));
  CopyRecords(table, rows, *table_, slots, n);
  return absl::OkStatus();
}

absl::Status HostSlots::StoreRows(const int64_t* slots, const int64_t* rows,
                                  int64_t n, EmbeddingTable& table) {
  RETURN_IF_ERROR(CheckMapped(table));
  CopyRecords(*table_, slots, table, rows, n);
  return absl::OkStatus();
}

absl::Status HostSlots::Forward(float* out, int64_t out_stride) const {
  table_->Forward(*batch_, out, out_stride);
  return absl::OkStatus();
}

absl::Status HostSlots::BackwardUpdate(const float* grad, int64_t grad_stride) {
  table_->BackwardUpdate(*batch_, grad, grad_stride);
  return absl::OkStatus();
}

CachedStore::CachedStore(const TableSpec& spec, const CacheOptions& options,
                         std::unique_ptr<SlotStorage> slots,
                         std::unique_ptr<EmbeddingStore> backing,
                         EmbeddingTable* host_table)
    : spec_(spec),
      record_floats_(spec.RecordFloats()),
      slots_(std::move(slots)),
      backing_(std::move(backing)),
      host_table_(host_table),
      manager_(spec.table_index, spec.rows, options.cache_rows,
               options.eviction, "the cache", "CacheOptions.cache_rows"),
      background_prefetch_(options.background_prefetch) {}

CachedStore::~CachedStore() {
  if (worker_.joinable()) {
    {
      std::lock_guard<std::mutex> lock(read_mu_);
      stopping_ = true;
    }
    read_cv_.notify_all();
    worker_.join();
  }
  if (slots_ != nullptr) slots_->Synchronize().IgnoreError();
  // Before the backing store: device slots unregister its arrays.
  slots_.reset();
}

void CachedStore::PrefetchLoop() {
  std::unique_lock<std::mutex> lock(read_mu_);
  while (true) {
    read_cv_.wait(lock, [this] { return read_queued_ || stopping_; });
    // Stops only with no read queued: a queued read runs first.
    if (!read_queued_) return;
    read_queued_ = false;
    lock.unlock();
    ReadStaged();
    lock.lock();
    read_pending_ = false;
    read_cv_.notify_all();
  }
}

void CachedStore::ReadStaged() {
  const int64_t floats = RecordFloats();
  read_status_ = absl::OkStatus();
  read_rows_ = 0;
  for (size_t i = 0; i < staged_rows_.size(); ++i) {
    read_status_ =
        backing_->ReadRow(staged_rows_[i], staged_records_.data() + i * floats);
    if (!read_status_.ok()) return;
    ++read_rows_;
  }
}

void CachedStore::JoinPrefetch() {
  std::unique_lock<std::mutex> lock(read_mu_);
  read_cv_.wait(lock, [this] { return !read_pending_; });
}

absl::Status CachedStore::WaitForPrefetch() {
  JoinPrefetch();
  metrics_.rows_read += read_rows_;
  metrics_.bytes_read += read_rows_ * RecordFloats() * int64_t{sizeof(float)};
  read_rows_ = 0;
  if (read_status_.ok()) return absl::OkStatus();
  staged_index_.clear();
  return std::exchange(read_status_, absl::OkStatus());
}

absl::Status CachedStore::WaitForBacking() {
  RETURN_IF_ERROR(WaitForPrefetch());
  if (host_table_ != nullptr) RETURN_IF_ERROR(slots_->Synchronize());
  return absl::OkStatus();
}

EmbeddingStore& CachedStore::backing() {
  JoinPrefetch();
  // A device fault is the slots' to report again at the next Synchronize.
  if (host_table_ != nullptr) slots_->Synchronize().IgnoreError();
  return *backing_;
}

absl::StatusOr<std::unique_ptr<CachedStore>> CachedStore::Create(
    const TableSpec& spec, const CacheOptions& options,
    std::unique_ptr<SlotStorage> slots,
    std::unique_ptr<EmbeddingStore> backing) {
  RETURN_IF_ERROR(spec.Validate());
  RETURN_IF_ERROR(options.Validate());
  if (slots == nullptr || backing == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("table ", spec.table_index,
                     ": a cached store needs slots and a backing store"));
  }
  const TableSpec& b = backing->spec();
  if (b.rows != spec.rows || b.dim != spec.dim ||
      StateFloatsPerRow(b.optimizer, b.dim) !=
          StateFloatsPerRow(spec.optimizer, spec.dim) ||
      b.optimizer.type() != spec.optimizer.type()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "table ", spec.table_index, ": the backing store holds ", b.rows, " x ",
        b.dim, " rows of another optimizer, not the cached table's ", spec.rows,
        " x ", spec.dim));
  }
  if (b.precision != spec.precision) {
    return absl::InvalidArgumentError(
        absl::StrCat("table ", spec.table_index, ": the backing store keeps ",
                     RowPrecision_Name(b.precision), " rows, the cached table ",
                     RowPrecision_Name(spec.precision)));
  }
  if (slots->slots() != options.cache_rows) {
    return absl::InvalidArgumentError(
        absl::StrCat("table ", spec.table_index, ": ", slots->slots(),
                     " slots for a cache of ", options.cache_rows, " rows"));
  }
  slots->set_step(backing->step());
  EmbeddingTable* host_table = nullptr;
  if (options.direct_host_access) {
    // The one tier whose rows are host arrays the slots can address.
    if (auto* host = dynamic_cast<HostStore*>(backing.get());
        host != nullptr && slots->MapHostTable(host->table())) {
      host_table = &host->table();
    }
  }
  return std::unique_ptr<CachedStore>(new CachedStore(
      spec, options, std::move(slots), std::move(backing), host_table));
}

bool CachedStore::IsDirty(int64_t row) const {
  const int64_t slot = manager_.SlotOf(row);
  return slot >= 0 && manager_.IsDirty(slot);
}

absl::Status CachedStore::WriteBack(const std::vector<int64_t>& rows,
                                    const std::vector<int64_t>& slots) {
  if (rows.empty()) return absl::OkStatus();
  const int64_t n = static_cast<int64_t>(rows.size());
  if (host_table_ != nullptr) {
    RETURN_IF_ERROR(
        slots_->StoreRows(slots.data(), rows.data(), n, *host_table_));
  } else {
    records_.resize(n * RecordFloats());
    RETURN_IF_ERROR(slots_->ReadSlots(slots.data(), n, records_.data()));
    // Runs of consecutive rows go in one call.
    for (int64_t i = 0; i < n;) {
      int64_t j = i + 1;
      while (j < n && rows[j] == rows[j - 1] + 1) ++j;
      RETURN_IF_ERROR(backing_->WriteRows(
          rows[i], j - i, records_.data() + i * RecordFloats()));
      i = j;
    }
  }
  metrics_.rows_written += n;
  metrics_.bytes_written += n * RecordFloats() * int64_t{sizeof(float)};
  return absl::OkStatus();
}

absl::StatusOr<const data::SparseFeature*> CachedStore::Prepare(
    const data::SparseFeature& ids) {
  prepared_ = false;
  // The staging and the backing store are the caller's from here on.
  RETURN_IF_ERROR(WaitForPrefetch());
  RETURN_IF_ERROR(manager_.Plan(ids));
  const SlotPlan& plan = manager_.plan();

  // Dirty victims to the backing store while they still hold their slots
  // (the slots' reads, and the direct path's stores, are ordered after the
  // last batch's update).
  RETURN_IF_ERROR(WriteBack(plan.writeback_rows, plan.writeback_slots));

  const int64_t misses = static_cast<int64_t>(plan.misses.size());
  const int64_t floats = RecordFloats();
  miss_rows_.resize(misses);
  miss_slots_.resize(misses);
  for (int64_t i = 0; i < misses; ++i) {
    miss_rows_[i] = plan.rows[plan.misses[i]];
    miss_slots_[i] = plan.slots[plan.misses[i]];
  }
  int64_t prefetch_hits = 0, rows_read = 0;
  if (host_table_ != nullptr) {
    // Commit, then the slots load the misses from the backing table, after
    // the victims' stores above.
    manager_.Commit();
    slots_->SetSlotRows(miss_slots_.data(), miss_rows_.data(), misses);
    RETURN_IF_ERROR(slots_->LoadRows(*host_table_, miss_rows_.data(),
                                     miss_slots_.data(), misses));
    rows_read = misses;
  } else {
    // The misses' records: staged by the last Prefetch, or read now.
    records_.resize(misses * floats);
    for (int64_t i = 0; i < misses; ++i) {
      const int64_t row = miss_rows_[i];
      float* record = records_.data() + i * floats;
      if (const auto it = staged_index_.find(row); it != staged_index_.end()) {
        std::memcpy(record, staged_records_.data() + it->second * floats,
                    floats * sizeof(float));
        ++prefetch_hits;
      } else {
        RETURN_IF_ERROR(backing_->ReadRow(row, record));
        ++rows_read;
      }
    }
    // Commit: the misses enter their slots.
    manager_.Commit();
    slots_->SetSlotRows(miss_slots_.data(), miss_rows_.data(), misses);
    for (const int64_t row : miss_rows_) staged_index_.erase(row);
    RETURN_IF_ERROR(
        slots_->WriteSlots(miss_slots_.data(), misses, records_.data()));
  }
  RETURN_IF_ERROR(slots_->SetBatch(plan.remapped));
  const int64_t unique = static_cast<int64_t>(plan.rows.size());
  metrics_.hits += unique - misses;
  metrics_.misses += misses;
  metrics_.prefetch_hits += prefetch_hits;
  metrics_.evictions += plan.evictions;
  metrics_.rows_read += rows_read;
  metrics_.bytes_read += rows_read * floats * int64_t{sizeof(float)};
  prepared_ = true;
  return &plan.remapped;
}

absl::Status CachedStore::CheckPrepared(
    const data::SparseFeature& prepared) const {
  if (!prepared_ || &prepared != &manager_.plan().remapped) {
    return absl::FailedPreconditionError(absl::StrCat(
        "table ", spec_.table_index,
        ": the batch is not the result of the last successful Prepare"));
  }
  return absl::OkStatus();
}

absl::Status CachedStore::Forward(const data::SparseFeature& prepared,
                                  float* out, int64_t out_stride) const {
  RETURN_IF_ERROR(CheckPrepared(prepared));
  return slots_->Forward(out, out_stride);
}

absl::Status CachedStore::BackwardUpdate(const data::SparseFeature& prepared,
                                         const float* grad,
                                         int64_t grad_stride) {
  RETURN_IF_ERROR(CheckPrepared(prepared));
  RETURN_IF_ERROR(slots_->BackwardUpdate(grad, grad_stride));
  manager_.MarkBatchDirty();
  return absl::OkStatus();
}

absl::StatusOr<int64_t> CachedStore::BeginUpdate(
    const data::SparseFeature& prepared, const float* grad,
    int64_t grad_stride) {
  RETURN_IF_ERROR(CheckPrepared(prepared));
  return slots_->BeginUpdate(grad, grad_stride);
}

absl::Status CachedStore::EndUpdate() {
  manager_.MarkBatchDirty();
  return absl::OkStatus();
}

absl::Status CachedStore::Prefetch(const data::SparseFeature& next_ids) {
  // The direct path loads misses from host memory already: nothing to
  // stage, and no read of the backing store while the slots' copies into
  // it may be queued.
  if (host_table_ != nullptr) return absl::OkStatus();
  // The last read is done and its staging replaced; an error it met is
  // returned now, with nothing staged.
  const absl::Status last = WaitForPrefetch();
  staged_index_.clear();
  staged_rows_.clear();
  RETURN_IF_ERROR(last);
  // The rows to read are chosen here, on the caller's thread, which alone
  // changes the slot map. Every write-back so far is in the backing store;
  // a later one writes only resident rows, never these.
  for (const int64_t row : next_ids.ids) {
    if (row < 0 || row >= spec_.rows || manager_.SlotOf(row) >= 0) continue;
    if (staged_index_
            .try_emplace(row, static_cast<int64_t>(staged_rows_.size()))
            .second) {
      staged_rows_.push_back(row);
    }
  }
  if (staged_rows_.empty()) return absl::OkStatus();
  staged_records_.resize(staged_rows_.size() * RecordFloats());
  if (background_prefetch_ && !worker_.joinable()) {
    try {
      worker_ = std::thread([this] { PrefetchLoop(); });
    } catch (const std::system_error&) {
      // No thread to be had: this store reads on the caller's thread.
      background_prefetch_ = false;
    }
  }
  if (!background_prefetch_) {
    ReadStaged();
    return WaitForPrefetch();
  }
  {
    std::lock_guard<std::mutex> lock(read_mu_);
    read_queued_ = true;
    read_pending_ = true;
  }
  read_cv_.notify_all();
  return absl::OkStatus();
}

absl::Status CachedStore::PoolReadOnly(const data::SparseFeature& ids,
                                       float* out, int64_t out_stride) const {
  return absl::FailedPreconditionError(absl::StrCat(
      "table ", spec_.table_index,
      ": a cached table's rows are not read beside the caller that prepares "
      "its batches"));
}

absl::Status CachedStore::ReadRows(int64_t begin, int64_t count, float* out) {
  RETURN_IF_ERROR(CheckRowRange(spec_, begin, count));
  RETURN_IF_ERROR(WaitForBacking());
  RETURN_IF_ERROR(backing_->ReadRows(begin, count, out));
  // The resident rows of the range, found from whichever side is smaller.
  std::vector<int64_t> at, slots;
  if (count <= manager_.capacity()) {
    for (int64_t i = 0; i < count; ++i) {
      const int64_t slot = manager_.SlotOf(begin + i);
      if (slot < 0) continue;
      at.push_back(i);
      slots.push_back(slot);
    }
  } else {
    for (int64_t slot = 0; slot < manager_.capacity(); ++slot) {
      const int64_t row = manager_.RowOf(slot);
      if (row < begin || row >= begin + count) continue;
      at.push_back(row - begin);
      slots.push_back(slot);
    }
  }
  if (slots.empty()) return absl::OkStatus();
  const int64_t floats = RecordFloats();
  std::vector<float> records(slots.size() * floats);
  RETURN_IF_ERROR(slots_->ReadSlots(
      slots.data(), static_cast<int64_t>(slots.size()), records.data()));
  for (size_t i = 0; i < slots.size(); ++i) {
    std::memcpy(out + at[i] * floats, records.data() + i * floats,
                floats * sizeof(float));
  }
  return absl::OkStatus();
}

absl::Status CachedStore::WriteRows(int64_t begin, int64_t count,
                                    const float* records) {
  RETURN_IF_ERROR(CheckRowRange(spec_, begin, count));
  RETURN_IF_ERROR(WaitForBacking());
  RETURN_IF_ERROR(backing_->WriteRows(begin, count, records));
  const int64_t floats = RecordFloats();
  std::vector<int64_t> slots;
  std::vector<float> resident;
  for (int64_t i = 0; i < count; ++i) {
    const int64_t row = begin + i;
    staged_index_.erase(row);
    const int64_t slot = manager_.SlotOf(row);
    if (slot < 0) continue;
    slots.push_back(slot);
    resident.insert(resident.end(), records + i * floats,
                    records + (i + 1) * floats);
  }
  if (slots.empty()) return absl::OkStatus();
  RETURN_IF_ERROR(slots_->WriteSlots(
      slots.data(), static_cast<int64_t>(slots.size()), resident.data()));
  for (const int64_t slot : slots) manager_.SetDirty(slot, true);
  return absl::OkStatus();
}

absl::Status CachedStore::SetOptimizer(const OptimizerConfig& optimizer) {
  RETURN_IF_ERROR(CheckOptimizerChange(spec_, optimizer));
  RETURN_IF_ERROR(WaitForBacking());
  RETURN_IF_ERROR(backing_->SetOptimizer(optimizer));
  spec_.optimizer = optimizer;
  slots_->set_optimizer(optimizer);
  return absl::OkStatus();
}

StoreCapabilities CachedStore::capabilities() const {
  StoreCapabilities c;
  c.cache_rows = capacity();
  c.device_cache = memory_space() == MemorySpace::kDevice;
  return c;
}

StoreBytes CachedStore::MemoryBytes() const {
  StoreBytes bytes = backing_->MemoryBytes();
  const int64_t slot_bytes = slots_->slots() * spec_.RecordFloats() *
                             static_cast<int64_t>(sizeof(float));
  (memory_space() == MemorySpace::kDevice ? bytes.device : bytes.host) +=
      slot_bytes;
  return bytes;
}

absl::Status CachedStore::Save(RowsSink& sink) {
  RETURN_IF_ERROR(Flush());
  return SaveHostCopy(*this, sink);
}

absl::Status CachedStore::Flush() {
  RETURN_IF_ERROR(WaitForPrefetch());
  const std::vector<int64_t> dirty = manager_.DirtySlots();
  // In row order, so that runs of rows go to the backing store together.
  std::vector<std::pair<int64_t, int64_t>> order;
  order.reserve(dirty.size());
  for (const int64_t slot : dirty)
    order.emplace_back(manager_.RowOf(slot), slot);
  std::sort(order.begin(), order.end());
  std::vector<int64_t> rows(order.size()), slots(order.size());
  for (size_t i = 0; i < order.size(); ++i) {
    rows[i] = order[i].first;
    slots[i] = order[i].second;
  }
  RETURN_IF_ERROR(WriteBack(rows, slots));
  for (const int64_t slot : slots) manager_.SetDirty(slot, false);
  // The direct path's stores are done before the backing store is used.
  if (host_table_ != nullptr) RETURN_IF_ERROR(slots_->Synchronize());
  backing_->set_step(slots_->step());
  return backing_->Flush();
}

}  // namespace dlrm::embedding
