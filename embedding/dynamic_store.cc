// DynamicStore: a dynamic table's id map in front of any tier's store.
#include "embedding/dynamic_store.h"

#include <mutex>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "optim/optimizer.h"

namespace dlrm::embedding {

absl::Status DynamicStoreOptions::Validate() const {
  RETURN_IF_ERROR(ids.Validate());
  if (!UnadmittedIds_IsValid(unadmitted)) {
    return absl::InvalidArgumentError(
        absl::StrCat("unadmitted is invalid: ", unadmitted));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<DynamicStore>> DynamicStore::Create(
    std::unique_ptr<EmbeddingStore> inner, const DynamicStoreOptions& options) {
  if (inner == nullptr) {
    return absl::InvalidArgumentError("a dynamic table needs an inner store");
  }
  const TableSpec& spec = inner->spec();
  if (absl::Status s = options.Validate(); !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("table ", spec.table_index, ": ", s.message()));
  }
  if (options.ids.rows != spec.rows) {
    return absl::InvalidArgumentError(
        absl::StrCat("table ", spec.table_index, ": the map has ",
                     options.ids.rows, " rows, the store ", spec.rows));
  }
  std::unique_ptr<DynamicStore> store(
      new DynamicStore(std::move(inner), options));
  if (options.unadmitted == UNADMITTED_ZERO) {
    RETURN_IF_ERROR(store->ZeroKeptRow());
  }
  return store;
}

void DynamicStore::InitialRecord(int64_t id, float* record) const {
  const TableSpec& s = spec();
  const int64_t table_rows =
      s.slice.table_rows > 0 ? s.slice.table_rows : s.rows;
  InitialRow(s.seed, s.table_index, table_rows, id, s.slice.col_begin, s.dim,
             record);
  optim::InitialSparseState(s.optimizer, s.dim, record + s.dim);
}

absl::Status DynamicStore::ZeroKeptRow() {
  const TableSpec& s = spec();
  std::vector<float> record(s.RecordFloats(), 0.0f);
  optim::InitialSparseState(s.optimizer, s.dim, record.data() + s.dim);
  return inner_->WriteRows(map_.kept_row(), 1, record.data());
}

absl::StatusOr<const data::SparseFeature*> DynamicStore::Prepare(
    const data::SparseFeature& ids) {
  ASSIGN_OR_RETURN(const data::SparseFeature* prepared, PrepareStaged(ids));
  RETURN_IF_ERROR(CommitPrepared());
  return prepared;
}

absl::StatusOr<const data::SparseFeature*> DynamicStore::PrepareStaged(
    const data::SparseFeature& ids) {
  staged_ = false;
  // The update this batch applies is the store's next step.
  const int64_t step = inner_->step() + 1;
  if (absl::Status s = map_.MakePlan(ids.ids, step, &plan_); !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("table ", spec().table_index, ": ", s.message()));
  }
  mapped_.offsets = ids.offsets;
  mapped_.ids.resize(ids.ids.size());
  const int64_t kept = map_.kept_row();
  kept_touched_ = false;
  for (size_t p = 0; p < plan_.rows.size(); ++p) {
    const int64_t r = plan_.rows[p];
    mapped_.ids[p] = r >= 0 ? r : kept;
    kept_touched_ |= r < 0;
  }
  ASSIGN_OR_RETURN(const data::SparseFeature* prepared,
                   inner_->Prepare(mapped_));
  staged_ = true;
  return prepared;
}

absl::Status DynamicStore::CommitPrepared() {
  if (!staged_) return absl::OkStatus();
  staged_ = false;
  const TableSpec& s = spec();
  const int64_t floats = s.RecordFloats();
  records_.resize(plan_.admitted.size() * floats);
  for (size_t i = 0; i < plan_.admitted.size(); ++i) {
    InitialRecord(plan_.admitted[i].id, records_.data() + i * floats);
  }
  std::unique_lock lock(mutex_);
  for (size_t i = 0; i < plan_.admitted.size(); ++i) {
    // On the host and RocksDB tiers a resident row's write cannot fail;
    // should one, the map stays as it was and the step fails.
    RETURN_IF_ERROR(inner_->WriteRows(plan_.admitted[i].row, 1,
                                      records_.data() + i * floats));
  }
  map_.Commit(plan_);
  return absl::OkStatus();
}

void DynamicStore::AbandonPrepared() { staged_ = false; }

absl::Status DynamicStore::Forward(const data::SparseFeature& prepared,
                                   float* out, int64_t out_stride) const {
  if (staged_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "table ", spec().table_index,
        ": Forward after PrepareStaged needs CommitPrepared first"));
  }
  return inner_->Forward(prepared, out, out_stride);
}

int64_t DynamicStore::MapKnown(const data::SparseFeature& ids,
                               data::SparseFeature* out) const {
  out->offsets = ids.offsets;
  out->ids.resize(ids.ids.size());
  const int64_t kept = map_.kept_row();
  int64_t unknown = 0;
  for (size_t p = 0; p < ids.ids.size(); ++p) {
    const int64_t r = map_.Lookup(ids.ids[p]);
    out->ids[p] = r >= 0 ? r : kept;
    unknown += r < 0;
  }
  return unknown;
}

absl::StatusOr<const data::SparseFeature*> DynamicStore::PrepareLookup(
    const data::SparseFeature& ids) {
  staged_ = false;
  unknown_lookups_ += MapKnown(ids, &mapped_);
  // Nothing is admitted: BackwardUpdate is not called on this batch, and
  // the kept row needs no reset.
  kept_touched_ = false;
  return inner_->Prepare(mapped_);
}

absl::Status DynamicStore::BackwardUpdate(const data::SparseFeature& prepared,
                                          const float* grad,
                                          int64_t grad_stride) {
  RETURN_IF_ERROR(inner_->BackwardUpdate(prepared, grad, grad_stride));
  if (kept_touched_ && options_.unadmitted == UNADMITTED_ZERO) {
    // The gradient of ids without a row is dropped.
    RETURN_IF_ERROR(ZeroKeptRow());
  }
  return absl::OkStatus();
}

absl::Status DynamicStore::EndUpdate() {
  RETURN_IF_ERROR(inner_->EndUpdate());
  if (kept_touched_ && options_.unadmitted == UNADMITTED_ZERO) {
    RETURN_IF_ERROR(ZeroKeptRow());
  }
  return absl::OkStatus();
}

absl::Status DynamicStore::Prefetch(const data::SparseFeature& next_ids) {
  if (!inner_takes_prefetch_) return absl::OkStatus();
  mapped_next_.offsets.assign(1, 0);
  mapped_next_.ids.clear();
  for (const int64_t id : next_ids.ids) {
    const int64_t r = map_.Lookup(id);
    if (r >= 0) mapped_next_.ids.push_back(r);
  }
  mapped_next_.offsets.push_back(static_cast<int64_t>(mapped_next_.ids.size()));
  return inner_->Prefetch(mapped_next_);
}

absl::Status DynamicStore::PoolReadOnly(const data::SparseFeature& ids,
                                        float* out, int64_t out_stride) const {
  data::SparseFeature mapped;
  std::shared_lock lock(mutex_);
  unknown_lookups_ += MapKnown(ids, &mapped);
  return inner_->PoolReadOnly(mapped, out, out_stride);
}

StoreMetrics DynamicStore::metrics() const {
  StoreMetrics m = inner_->metrics();
  const DynamicIdCounters c =
      staged_ ? map_.CountersAfter(plan_) : map_.counters();
  m.ids_admitted = c.admitted;
  m.ids_evicted = c.evicted;
  m.ids_refused = c.refused;
  m.unknown_lookups = unknown_lookups_.load();
  m.ids_occupied = staged_ ? map_.OccupiedAfter(plan_) : map_.occupied();
  return m;
}

StoreBytes DynamicStore::MemoryBytes() const {
  StoreBytes b = inner_->MemoryBytes();
  b.host += map_.MemoryBytes();
  return b;
}

absl::Status DynamicStore::Save(RowsSink& sink) {
  RETURN_IF_ERROR(inner_->Save(sink));
  return sink.IdMap(map_);
}

void DynamicStore::ReplaceMap(DynamicIdMap map) {
  std::unique_lock lock(mutex_);
  map_ = std::move(map);
}

}  // namespace dlrm::embedding
