// DynamicIdMap: the set-associative id -> row map of dynamic tables.
#include "embedding/dynamic_ids.h"

#include <algorithm>
#include <bit>
#include <limits>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "core/random.h"

namespace dlrm::embedding {
namespace {

// Streams of the hashes, so that the bucket, the sketch's rows and the
// admission draw are independent functions of the id.
constexpr uint64_t kSketchStream = 0x5ce7c4a11d0f1e55ULL;
constexpr uint64_t kAdmitStream = 0xad317a1b0b5eed01ULL;

}  // namespace

absl::Status DynamicIdOptions::Validate() const {
  if (rows < 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a dynamic table needs rows >= 2 (one is kept for ids without a "
        "row), got ",
        rows));
  }
  if (admission == Admission::ADMIT_AFTER_SIGHTINGS && min_sightings < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "admission.min_sightings must be >= 1, got ", min_sightings));
  }
  if (admission == Admission::ADMIT_WITH_PROBABILITY &&
      !(probability > 0.0 && probability <= 1.0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "admission.probability must be in (0, 1], got ", probability));
  }
  if (!Admission::Kind_IsValid(admission)) {
    return absl::InvalidArgumentError(
        absl::StrCat("admission.kind is invalid: ", admission));
  }
  if (ttl_steps < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("eviction.ttl_steps must be >= 0, got ", ttl_steps));
  }
  return absl::OkStatus();
}

bool AdmittedWithProbability(uint64_t seed, int64_t step, int64_t id,
                             double probability) {
  const uint64_t h = HashKey(seed ^ kAdmitStream, static_cast<uint64_t>(step),
                             static_cast<uint64_t>(id));
  return BitsToOpenUnitDouble(h) < probability;
}

DynamicIdOptions DynamicIdOptionsFor(const Admission& admission,
                                     const Eviction& eviction, int64_t rows,
                                     uint64_t seed) {
  DynamicIdOptions o;
  o.rows = rows;
  o.admission = admission.kind();
  if (admission.min_sightings() > 0)
    o.min_sightings = admission.min_sightings();
  if (o.admission == Admission::ADMIT_WITH_PROBABILITY) {
    o.probability = admission.probability();
  }
  o.seed = seed;
  o.eviction = eviction.kind() == Eviction::EVICT_LFU ? EvictionPolicy::kLfu
                                                      : EvictionPolicy::kLru;
  o.ttl_steps = eviction.ttl_steps();
  return o;
}

DynamicIdMap::DynamicIdMap(const DynamicIdOptions& options)
    : options_(options) {
  const int64_t usable = usable_rows();
  num_buckets_ = (usable + kBucketRows - 1) / kBucketRows;
  keys_.assign(usable, -1);
  last_.assign(usable, 0);
  sightings_.assign(usable, 0);
  claimed_.assign(usable, 0);
  if (options_.admission == Admission::ADMIT_AFTER_SIGHTINGS) {
    // About one counter per row and sketch row: a new id's estimate is
    // then off by the few others that share its cells.
    sketch_width_ = static_cast<int64_t>(std::bit_ceil(
        static_cast<uint64_t>(std::max<int64_t>(1024, options_.rows))));
    sketch_.assign(kSketchDepth * sketch_width_, 0);
  }
}

int64_t DynamicIdMap::Bucket(int64_t id) const {
  return static_cast<int64_t>(Mix64(static_cast<uint64_t>(id)) %
                              static_cast<uint64_t>(num_buckets_));
}

int DynamicIdMap::BucketSize(int64_t bucket) const {
  return static_cast<int>(
      std::min<int64_t>(kBucketRows, usable_rows() - BucketBegin(bucket)));
}

int64_t DynamicIdMap::Find(int64_t id) const {
  const int64_t b = Bucket(id);
  const int64_t begin = BucketBegin(b);
  const int64_t end = begin + BucketSize(b);
  for (int64_t r = begin; r < end; ++r) {
    if (keys_[r] == id) return r;
  }
  return -1;
}

int64_t DynamicIdMap::Lookup(int64_t id) const {
  if (id < 0) return -1;
  const int64_t r = Find(id);
  return r >= 0 && !Expired(r, step_) ? r : -1;
}

uint64_t DynamicIdMap::SketchCell(int d, int64_t id) const {
  const uint64_t h = HashKey(kSketchStream, static_cast<uint64_t>(d),
                             static_cast<uint64_t>(id));
  return d * static_cast<uint64_t>(sketch_width_) +
         (h & static_cast<uint64_t>(sketch_width_ - 1));
}

uint32_t DynamicIdMap::SketchCount(int64_t id) const {
  if (sketch_.empty()) return 0;
  uint32_t count = std::numeric_limits<uint32_t>::max();
  for (int d = 0; d < kSketchDepth; ++d) {
    count = std::min(count, sketch_[SketchCell(d, id)]);
  }
  return count;
}

bool DynamicIdMap::Admit(int64_t id, int64_t step) const {
  switch (options_.admission) {
    case Admission::ADMIT_AFTER_SIGHTINGS:
      // This batch's sighting counts.
      return static_cast<int64_t>(SketchCount(id)) + 1 >=
             options_.min_sightings;
    case Admission::ADMIT_WITH_PROBABILITY:
      return AdmittedWithProbability(options_.seed, step, id,
                                     options_.probability);
    case Admission::ADMIT_ALWAYS:
    default:
      return true;
  }
}

absl::Status DynamicIdMap::MakePlan(std::span<const int64_t> ids, int64_t step,
                                    Plan* plan) {
  plan->step = step;
  plan->rows.assign(ids.size(), -1);
  plan->hits.clear();
  plan->admitted.clear();
  plan->new_ids.clear();
  plan->refused = 0;
  if (++plan_number_ == 0) {
    // Wrapped: no stamp of an earlier plan may match.
    std::fill(claimed_.begin(), claimed_.end(), 0);
    plan_number_ = 1;
  }
  // Ids that hold a row claim it first (the claim stamp also marks a
  // repeated id's row as seen), so that no new id of the batch takes it;
  // a new id's position holds -2 - its index in new_ids until it is
  // decided.
  expired_row_.clear();
  new_index_.clear();
  for (size_t p = 0; p < ids.size(); ++p) {
    const int64_t id = ids[p];
    if (id < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("id ", id, " at position ", p,
                       " is negative (a dynamic table takes ids >= 0)"));
    }
    const int64_t r = Find(id);
    if (r >= 0 && !Expired(r, step)) {
      plan->rows[p] = r;
      if (claimed_[r] != plan_number_) {
        claimed_[r] = plan_number_;
        plan->hits.push_back(r);
      }
      continue;
    }
    const auto [it, inserted] =
        new_index_.try_emplace(id, static_cast<int64_t>(plan->new_ids.size()));
    if (inserted) {
      plan->new_ids.push_back(id);
      expired_row_.push_back(r);
    }
    plan->rows[p] = -2 - it->second;
  }
  new_rows_.assign(plan->new_ids.size(), -1);
  for (size_t k = 0; k < plan->new_ids.size(); ++k) {
    const int64_t id = plan->new_ids[k];
    if (!Admit(id, step)) continue;
    const int64_t b = Bucket(id);
    const int64_t begin = BucketBegin(b);
    const int64_t end = begin + BucketSize(b);
    // An expired id that comes back takes its own row when it is still
    // free (so that no id is ever in two rows).
    const int64_t own = expired_row_[k];
    int64_t chosen = own >= 0 && claimed_[own] != plan_number_ ? own : -1;
    for (int64_t r = chosen >= 0 ? end : begin; r < end; ++r) {
      if (claimed_[r] == plan_number_) continue;
      if (keys_[r] < 0 || Expired(r, step)) {
        chosen = r;
        break;
      }
      if (chosen < 0) {
        chosen = r;
        continue;
      }
      // Least recently seen first; LFU: fewest sightings, then that.
      const bool better = options_.eviction == EvictionPolicy::kLfu
                              ? (sightings_[r] < sightings_[chosen] ||
                                 (sightings_[r] == sightings_[chosen] &&
                                  last_[r] < last_[chosen]))
                              : last_[r] < last_[chosen];
      if (better) chosen = r;
    }
    if (chosen < 0) {
      ++plan->refused;
      continue;
    }
    claimed_[chosen] = plan_number_;
    new_rows_[k] = chosen;
    plan->admitted.push_back({id, chosen, keys_[chosen]});
  }
  for (int64_t& r : plan->rows) {
    if (r <= -2) r = new_rows_[-2 - r];
  }
  return absl::OkStatus();
}

void DynamicIdMap::Commit(const Plan& plan) {
  for (const int64_t r : plan.hits) {
    last_[r] = plan.step;
    ++sightings_[r];
  }
  counters_ = CountersAfter(plan);
  occupied_ = OccupiedAfter(plan);
  for (const Admitted& a : plan.admitted) {
    keys_[a.row] = a.id;
    last_[a.row] = plan.step;
    sightings_[a.row] = 1;
  }
  if (!sketch_.empty()) {
    for (const int64_t id : plan.new_ids) {
      for (int d = 0; d < kSketchDepth; ++d) {
        uint32_t& c = sketch_[SketchCell(d, id)];
        if (c != std::numeric_limits<uint32_t>::max()) ++c;
      }
    }
  }
  step_ = plan.step;
}

DynamicIdCounters DynamicIdMap::CountersAfter(const Plan& plan) const {
  DynamicIdCounters c = counters_;
  for (const Admitted& a : plan.admitted) c.evicted += a.victim >= 0;
  c.admitted += static_cast<int64_t>(plan.admitted.size());
  c.refused += plan.refused;
  return c;
}

int64_t DynamicIdMap::OccupiedAfter(const Plan& plan) const {
  int64_t occupied = occupied_;
  for (const Admitted& a : plan.admitted) occupied += a.victim < 0;
  return occupied;
}

int64_t DynamicIdMap::BytesFor(const DynamicIdOptions& options) {
  // Key, last step and sightings (int64 each) and the plan's claim stamp.
  const int64_t per_row = 3 * sizeof(int64_t) + sizeof(uint32_t);
  int64_t bytes = (options.rows - 1) * per_row;
  if (options.admission == Admission::ADMIT_AFTER_SIGHTINGS) {
    const int64_t width = static_cast<int64_t>(std::bit_ceil(
        static_cast<uint64_t>(std::max<int64_t>(1024, options.rows))));
    bytes += kSketchDepth * width * static_cast<int64_t>(sizeof(uint32_t));
  }
  return bytes;
}

int64_t DynamicIdMap::MemoryBytes() const {
  return static_cast<int64_t>(
      keys_.size() * sizeof(int64_t) + last_.size() * sizeof(int64_t) +
      sightings_.size() * sizeof(int64_t) + sketch_.size() * sizeof(uint32_t) +
      claimed_.size() * sizeof(uint32_t));
}

absl::Status DynamicIdMap::Restore(std::vector<int64_t> keys,
                                   std::vector<int64_t> last_steps,
                                   std::vector<int64_t> sightings,
                                   std::vector<uint32_t> sketch, int64_t step) {
  const size_t usable = static_cast<size_t>(usable_rows());
  if (keys.size() != usable || last_steps.size() != usable ||
      sightings.size() != usable || sketch.size() != sketch_.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a dynamic table's saved map has ", keys.size(), " rows and ",
        sketch.size(), " sketch counters; this table's has ", usable, " and ",
        sketch_.size()));
  }
  absl::flat_hash_set<int64_t> seen;
  int64_t occupied = 0;
  for (size_t r = 0; r < usable; ++r) {
    const int64_t id = keys[r];
    if (id < 0) continue;
    const int64_t b = Bucket(id);
    if (static_cast<int64_t>(r) < BucketBegin(b) ||
        static_cast<int64_t>(r) >= BucketBegin(b) + BucketSize(b)) {
      return absl::InvalidArgumentError(
          absl::StrCat("a dynamic table's saved map holds id ", id, " in row ",
                       r, ", outside its bucket ", b));
    }
    if (!seen.insert(id).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("a dynamic table's saved map holds id ", id, " twice"));
    }
    ++occupied;
  }
  keys_ = std::move(keys);
  last_ = std::move(last_steps);
  sightings_ = std::move(sightings);
  sketch_ = std::move(sketch);
  occupied_ = occupied;
  step_ = step;
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int64_t>> DynamicIdMap::PlaceSaved(
    std::span<const SavedId> ids, int64_t step) {
  if (occupied_ != 0) {
    return absl::FailedPreconditionError(
        "a dynamic table's map takes saved ids only when empty");
  }
  // Per bucket, the indices of its ids, most recently seen first.
  std::vector<std::vector<size_t>> buckets(num_buckets_);
  absl::flat_hash_set<int64_t> seen;
  for (size_t i = 0; i < ids.size(); ++i) {
    const int64_t id = ids[i].id;
    if (id < 0 || !seen.insert(id).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("a dynamic table's saved ids hold id ", id,
                       id < 0 ? ", which is negative" : " twice"));
    }
    buckets[Bucket(id)].push_back(i);
  }
  std::vector<int64_t> rows(ids.size(), -1);
  for (int64_t b = 0; b < num_buckets_; ++b) {
    std::vector<size_t>& in = buckets[b];
    std::sort(in.begin(), in.end(), [&ids](size_t x, size_t y) {
      if (ids[x].last_step != ids[y].last_step) {
        return ids[x].last_step > ids[y].last_step;
      }
      return ids[x].id < ids[y].id;
    });
    const int size = BucketSize(b);
    for (size_t n = 0; n < in.size(); ++n) {
      if (static_cast<int64_t>(n) >= size) {
        ++counters_.evicted;
        continue;
      }
      const int64_t r = BucketBegin(b) + static_cast<int64_t>(n);
      const SavedId& s = ids[in[n]];
      keys_[r] = s.id;
      last_[r] = s.last_step;
      sightings_[r] = s.sightings;
      rows[in[n]] = r;
      ++occupied_;
    }
  }
  step_ = step;
  return rows;
}

absl::Status DynamicIdMap::MergeSketch(std::span<const uint32_t> saved,
                                       int64_t width) {
  if (sketch_.empty()) return absl::OkStatus();
  if (width <= 0 || !std::has_single_bit(static_cast<uint64_t>(width)) ||
      saved.size() != static_cast<size_t>(kSketchDepth * width)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a dynamic table's saved sketch has ", saved.size(), " counters, not ",
        kSketchDepth, " x a power of two (", width, ")"));
  }
  // An id's cell is its hash's low bits: a wider sketch's cells fold onto
  // this one's (summed), a narrower one's cover several of this one's.
  const uint64_t mask = static_cast<uint64_t>(sketch_width_ - 1);
  const uint64_t saved_mask = static_cast<uint64_t>(width - 1);
  const int64_t cells = std::max(width, sketch_width_);
  for (int d = 0; d < kSketchDepth; ++d) {
    for (int64_t c = 0; c < cells; ++c) {
      const uint64_t from = static_cast<uint64_t>(c) & saved_mask;
      const uint64_t to = static_cast<uint64_t>(c) & mask;
      uint32_t& cell = sketch_[d * sketch_width_ + to];
      const uint64_t sum =
          static_cast<uint64_t>(cell) + saved[d * width + from];
      cell = static_cast<uint32_t>(
          std::min<uint64_t>(sum, std::numeric_limits<uint32_t>::max()));
    }
  }
  return absl::OkStatus();
}

}  // namespace dlrm::embedding
