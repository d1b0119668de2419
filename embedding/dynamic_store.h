// The store of a dynamic table (docs/dynamic.md): any tier's store of the
// table's `rows` rows, with a DynamicIdMap in front that maps the raw ids
// of each batch to those rows, admitting and evicting as the table's
// config says.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <shared_mutex>
#include <vector>

#include "absl/status/statusor.h"
#include "dlrm/config.pb.h"
#include "embedding/dynamic_ids.h"
#include "embedding/embedding_store.h"

namespace dlrm::embedding {

// What a DynamicStore does beyond its map.
struct DynamicStoreOptions {
  // The map's options; ids.rows must be the inner store's spec().rows.
  // Default: see DynamicIdOptions.
  DynamicIdOptions ids;
  // What ids without a row pool (the kept last row): held at zero, or
  // trained as a row shared by all of them. Default: UNADMITTED_ZERO.
  UnadmittedIds unadmitted = UNADMITTED_ZERO;

  // InvalidArgument naming the field when one is out of range.
  absl::Status Validate() const;
};

// An EmbeddingStore over raw ids: Prepare plans the batch in the map, has
// the inner store prepare the mapped rows (PrepareStaged), then (under the
// map's lock, CommitPrepared)
// writes each newly admitted row's initial record (InitialRow of the
// table's seed and the *id*, so that an id starts with the same value
// whatever row, rank count or run it lands in; fresh optimizer state) and
// commits the plan. Ids without a row pool the kept last row; with
// UNADMITTED_ZERO it is reset to zero after every BackwardUpdate that
// touched it, so their gradients are dropped. PoolReadOnly and
// PrepareLookup map with DynamicIdMap::Lookup and never admit. ReadRows,
// WriteRows, Flush, the step and Save's rows are the inner store's, by row.
// Thread safety: as EmbeddingStore; PoolReadOnly beside Prepare sees the
// map and rows before a batch's admissions or after, never half.
class DynamicStore final : public EmbeddingStore {
 public:
  // Wraps `inner` (a store of spec().rows = options.ids.rows rows).
  // InvalidArgument for bad options or a row count that differs; the inner
  // store's write error when it cannot zero the kept row.
  static absl::StatusOr<std::unique_ptr<DynamicStore>> Create(
      std::unique_ptr<EmbeddingStore> inner,
      const DynamicStoreOptions& options);

  const TableSpec& spec() const override { return inner_->spec(); }
  MemorySpace memory_space() const override { return inner_->memory_space(); }
  // A training batch: admits and evicts (see the class comment), that is,
  // PrepareStaged then CommitPrepared. InvalidArgument for a negative id;
  // the inner store's errors, after which the map and rows are unchanged.
  absl::StatusOr<const data::SparseFeature*> Prepare(
      const data::SparseFeature& ids) override;
  // Plans the batch in the map and has the inner store prepare the mapped
  // rows; the map and the rows stay as they were. Errors as Prepare.
  absl::StatusOr<const data::SparseFeature*> PrepareStaged(
      const data::SparseFeature& ids) override;
  // Writes the admitted rows' initial records and commits the plan, under
  // the map's lock. The inner store's write error, the map unchanged.
  absl::Status CommitPrepared() override;
  void AbandonPrepared() override;
  // Maps known ids, the others to the kept row; admits nothing.
  absl::StatusOr<const data::SparseFeature*> PrepareLookup(
      const data::SparseFeature& ids) override;
  // FailedPrecondition after a PrepareStaged not yet committed.
  absl::Status Forward(const data::SparseFeature& prepared, float* out,
                       int64_t out_stride) const override;
  absl::Status BackwardUpdate(const data::SparseFeature& prepared,
                              const float* grad, int64_t grad_stride) override;
  // The inner store's BeginUpdate / UpdateRange; EndUpdate is the inner
  // store's, then the kept row's reset as after BackwardUpdate.
  absl::StatusOr<int64_t> BeginUpdate(const data::SparseFeature& prepared,
                                      const float* grad,
                                      int64_t grad_stride) override {
    return inner_->BeginUpdate(prepared, grad, grad_stride);
  }
  absl::Status UpdateRange(int64_t begin, int64_t end) override {
    return inner_->UpdateRange(begin, end);
  }
  absl::Status EndUpdate() override;
  absl::Status Synchronize() override { return inner_->Synchronize(); }
  // Stages the rows of the known ids of `next_ids` (new ids have no row
  // yet: their initial value needs no read).
  absl::Status Prefetch(const data::SparseFeature& next_ids) override;
  absl::Status PoolReadOnly(const data::SparseFeature& ids, float* out,
                            int64_t out_stride) const override;
  absl::Status ReadRows(int64_t begin, int64_t count, float* out) override {
    return inner_->ReadRows(begin, count, out);
  }
  absl::Status WriteRows(int64_t begin, int64_t count,
                         const float* records) override {
    return inner_->WriteRows(begin, count, records);
  }
  absl::Status Flush() override { return inner_->Flush(); }
  int64_t step() const override { return inner_->step(); }
  void set_step(int64_t step) override { inner_->set_step(step); }
  absl::Status SetOptimizer(const OptimizerConfig& optimizer) override {
    return inner_->SetOptimizer(optimizer);
  }
  // The inner store's counters with the map's (ids_admitted, ids_evicted,
  // ids_refused, unknown_lookups, ids_occupied); between PrepareStaged and
  // CommitPrepared, the map's as the commit will leave them (the step
  // gathers them from every rank before it commits).
  StoreMetrics metrics() const override;
  StoreCapabilities capabilities() const override {
    return inner_->capabilities();
  }
  // The inner store's bytes, and the map's in host memory.
  StoreBytes MemoryBytes() const override;
  // The inner store's rows in its form, then the map (RowsSink::IdMap).
  absl::Status Save(RowsSink& sink) override;

  // Replaces the map with `map` (a restored one of this store's options:
  // DynamicIdMap::Restore checked it), under the map's lock.
  void ReplaceMap(DynamicIdMap map);

  const DynamicIdMap& map() const { return map_; }
  EmbeddingStore& inner() { return *inner_; }
  const DynamicStoreOptions& options() const { return options_; }

 private:
  DynamicStore(std::unique_ptr<EmbeddingStore> inner,
               const DynamicStoreOptions& options)
      : inner_(std::move(inner)),
        options_(options),
        map_(options.ids),
        inner_takes_prefetch_(inner_->capabilities().prefetch ||
                              inner_->capabilities().cache_rows > 0) {}
  // The record of an admitted id: its initial value and fresh state.
  void InitialRecord(int64_t id, float* record) const;
  // Writes the kept row's zero record (zero weights, fresh state).
  absl::Status ZeroKeptRow();
  // `ids` mapped by Lookup into `out`; returns the unknown ids.
  int64_t MapKnown(const data::SparseFeature& ids,
                   data::SparseFeature* out) const;

  std::unique_ptr<EmbeddingStore> inner_;
  DynamicStoreOptions options_;
  DynamicIdMap map_;
  // Held shared by PoolReadOnly, exclusively by Prepare's commit and the
  // admitted rows' reset.
  mutable std::shared_mutex mutex_;
  DynamicIdMap::Plan plan_;
  data::SparseFeature mapped_, mapped_next_;
  std::vector<float> records_;
  // Whether the prepared batch pools the kept row.
  bool kept_touched_ = false;
  // Whether plan_ waits for CommitPrepared.
  bool staged_ = false;
  // Whether the inner store does anything with Prefetch (a RocksDB tier, a
  // cache): otherwise the next batch is not even mapped.
  bool inner_takes_prefetch_;
  mutable std::atomic<int64_t> unknown_lookups_{0};
};

}  // namespace dlrm::embedding
