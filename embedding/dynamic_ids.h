// The id map of a dynamic table (docs/dynamic.md): raw 64-bit ids to the
// rows of a table of fixed capacity, set-associative as HierarchicalKV's,
// with admission (always, after k sightings, with probability p) and
// eviction (LRU, LFU, a time to live). A pure function of the id batches
// and steps it is given: the same on every rank and run.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "dlrm/config.pb.h"
#include "embedding/embedding_store.h"

namespace dlrm::embedding {

// What a DynamicIdMap does; from a TableConfig's admission and eviction.
struct DynamicIdOptions {
  // Rows of the table, > 1: rows [0, rows - 1) are given to ids, the last
  // is kept for ids without a row. Default: 0 (invalid).
  int64_t rows = 0;
  // When a new id gets a row. Default: ADMIT_ALWAYS.
  Admission::Kind admission = Admission::ADMIT_ALWAYS;
  // ADMIT_AFTER_SIGHTINGS: batches an id must be seen in, >= 1. Default: 2.
  int min_sightings = 2;
  // ADMIT_WITH_PROBABILITY: in (0, 1]. Default: 1.
  double probability = 1.0;
  // Seed of ADMIT_WITH_PROBABILITY's hash (the model's). Default: 0.
  uint64_t seed = 0;
  // Which id of a full bucket gives its row to a new id. Default: kLru.
  EvictionPolicy eviction = EvictionPolicy::kLru;
  // > 0: an id last seen more than ttl_steps steps before the current one
  // has lost its row. 0: no time to live. Default: 0.
  int64_t ttl_steps = 0;

  // InvalidArgument naming the field when one is out of range.
  absl::Status Validate() const;
};

// Counters of a DynamicIdMap since it was made (or restored: they are not
// in checkpoints).
struct DynamicIdCounters {
  // New ids given a row.
  int64_t admitted = 0;
  // Ids that lost their row to a new id (expired ones included).
  int64_t evicted = 0;
  // New ids admitted by the policy that found no row to take (every row of
  // their bucket held an id of the same batch).
  int64_t refused = 0;
};

// The map. Rows [0, rows - 1) are split into buckets of kBucketRows
// consecutive rows (the last may be shorter); an id lives in bucket
// Mix64(id) mod buckets, found by a scan of its keys. Per row: the key
// (-1 when empty), the step it was last seen, the batches it was seen in
// since it was admitted. ADMIT_AFTER_SIGHTINGS counts new ids in a
// count-min sketch of kSketchDepth x sketch_width() counters.
// Thread safety: const methods may run together; Commit and Restore need
// exclusive access (DynamicStore's lock).
class DynamicIdMap {
 public:
  static constexpr int kBucketRows = 16;
  static constexpr int kSketchDepth = 4;

  // `options` must be valid.
  explicit DynamicIdMap(const DynamicIdOptions& options);

  const DynamicIdOptions& options() const { return options_; }
  // The row kept for ids without one: rows - 1.
  int64_t kept_row() const { return options_.rows - 1; }
  // Rows given to ids: rows - 1.
  int64_t usable_rows() const { return options_.rows - 1; }
  int64_t num_buckets() const { return num_buckets_; }
  // The bucket of `id`, and its first row and row count.
  int64_t Bucket(int64_t id) const;
  int64_t BucketBegin(int64_t bucket) const { return bucket * kBucketRows; }
  int BucketSize(int64_t bucket) const;

  // The row of `id` at the step of the last Commit (-1 when it has none:
  // never admitted, evicted, or expired). Changes nothing.
  int64_t Lookup(int64_t id) const;

  // A new id of a batch that got a row.
  struct Admitted {
    int64_t id = 0;
    int64_t row = 0;
    // The id that held the row (evicted or expired), or -1 for an empty
    // row.
    int64_t victim = -1;
  };
  // What Commit applies for one training batch.
  struct Plan {
    int64_t step = 0;
    // Per position of the batch: the id's row, or -1 (not admitted, or
    // refused: the caller pools the kept row).
    std::vector<int64_t> rows;
    // Unique rows of ids that already had one.
    std::vector<int64_t> hits;
    // Unique new ids given a row, in order of first appearance.
    std::vector<Admitted> admitted;
    // Unique new ids of the batch (admitted or not), for the sketch.
    std::vector<int64_t> new_ids;
    // New ids admitted by the policy without a row to take.
    int64_t refused = 0;
  };
  // Plans training batch `ids` at `step` (>= the last Commit's) into
  // `plan` without changing the map: ids that have a row keep it; then
  // each new id, in order of first appearance, is admitted or not by the
  // policy and, admitted, takes its own row if it expired there, else the
  // first empty or expired row of its bucket, else the policy's victim
  // among rows no id of this batch holds, else is refused. InvalidArgument for
  // a negative id. Not thread-safe with another MakePlan (scratch).
  absl::Status MakePlan(std::span<const int64_t> ids, int64_t step, Plan* plan);
  // Applies `plan`, made by MakePlan on this map as it is now.
  void Commit(const Plan& plan);
  // The counters and occupied rows as Commit(plan) would leave them.
  DynamicIdCounters CountersAfter(const Plan& plan) const;
  int64_t OccupiedAfter(const Plan& plan) const;

  // ADMIT_AFTER_SIGHTINGS: the sketch's estimate of the training batches
  // `id` was new in (never below the true count, above it when all its
  // cells are shared with other ids); 0 without the sketch.
  uint32_t SketchCount(int64_t id) const;

  // Rows holding an id (expired ones until they are taken).
  int64_t occupied() const { return occupied_; }
  const DynamicIdCounters& counters() const { return counters_; }
  // The step of the last Commit (or Restore); 0 before any.
  int64_t step() const { return step_; }
  // Bytes of the map's arrays and sketch: BytesFor(options()).
  int64_t MemoryBytes() const;
  // The bytes a map of `options` holds (in host memory, whatever the tier
  // of the rows): 28 per usable row, and the sketch's 16 per counter column.
  static int64_t BytesFor(const DynamicIdOptions& options);

  // The state a checkpoint keeps: per row (usable_rows()) the key, the
  // last step seen and the sightings; the sketch, kSketchDepth x
  // sketch_width() (empty without ADMIT_AFTER_SIGHTINGS).
  const std::vector<int64_t>& keys() const { return keys_; }
  const std::vector<int64_t>& last_steps() const { return last_; }
  const std::vector<int64_t>& sightings() const { return sightings_; }
  const std::vector<uint32_t>& sketch() const { return sketch_; }
  int64_t sketch_width() const { return sketch_width_; }
  // Replaces the state with a saved one. InvalidArgument (nothing changed)
  // when a size differs, a key sits outside its bucket or twice.
  absl::Status Restore(std::vector<int64_t> keys,
                       std::vector<int64_t> last_steps,
                       std::vector<int64_t> sightings,
                       std::vector<uint32_t> sketch, int64_t step);

  // An id of another map's saved state, for PlaceSaved.
  struct SavedId {
    int64_t id = 0;
    int64_t last_step = 0;
    int64_t sightings = 0;
  };
  // Fills this map, empty as constructed, with `ids` (distinct, >= 0: the
  // saved ids of other maps, a restore on another shard count) at `step`:
  // each goes into its own bucket, most recently seen first (ties by id),
  // so a bucket given more ids than it has rows keeps the most recently
  // seen and counts the others as evicted (counters().evicted). Returns
  // each id's row, -1 for one left out. FailedPrecondition when the map
  // holds an id; InvalidArgument (nothing changed) for a negative or
  // repeated id.
  absl::StatusOr<std::vector<int64_t>> PlaceSaved(std::span<const SavedId> ids,
                                                  int64_t step);
  // ADMIT_AFTER_SIGHTINGS: adds a saved sketch of kSketchDepth x `width`
  // counters (width a power of two; any other map's) to this one's,
  // saturating, folded or repeated to this width, so that no id's estimate
  // falls below its count in either. Nothing without a sketch here;
  // InvalidArgument when `saved` is not kSketchDepth x `width`.
  absl::Status MergeSketch(std::span<const uint32_t> saved, int64_t width);

 private:
  bool Expired(int64_t row, int64_t step) const {
    return options_.ttl_steps > 0 && keys_[row] >= 0 &&
           step - last_[row] > options_.ttl_steps;
  }
  // The row holding `id` (expired or not), or -1.
  int64_t Find(int64_t id) const;
  uint64_t SketchCell(int d, int64_t id) const;
  bool Admit(int64_t id, int64_t step) const;

  DynamicIdOptions options_;
  int64_t num_buckets_ = 0;
  int64_t sketch_width_ = 0;
  std::vector<int64_t> keys_, last_, sightings_;
  std::vector<uint32_t> sketch_;
  int64_t occupied_ = 0;
  int64_t step_ = 0;
  DynamicIdCounters counters_;
  // MakePlan's scratch: rows claimed by the batch being planned (stamped
  // with its plan number), and the batch's ids.
  std::vector<uint32_t> claimed_;
  uint32_t plan_number_ = 0;
  // Per new id of the plan: the row it holds expired, or -1.
  std::vector<int64_t> expired_row_;
  // MakePlan's scratch: each new id's index in Plan::new_ids, and the row
  // each got (-1: none).
  absl::flat_hash_map<int64_t, int64_t> new_index_;
  std::vector<int64_t> new_rows_;
};

// ADMIT_WITH_PROBABILITY's draw: whether `id` seen at `step` is admitted
// under `seed` with probability `probability` (a hash of the three).
bool AdmittedWithProbability(uint64_t seed, int64_t step, int64_t id,
                             double probability);

// A DynamicIdMap's options from a dynamic table's admission and eviction
// (TableConfig's, normalised) and the model's seed, for `rows` rows.
DynamicIdOptions DynamicIdOptionsFor(const Admission& admission,
                                     const Eviction& eviction, int64_t rows,
                                     uint64_t seed);

}  // namespace dlrm::embedding
