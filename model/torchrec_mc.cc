// TorchRec's managed-collision buffers of a dynamic table's map
// (model/torchrec_mc.h).
#include "model/torchrec_mc.h"

#include <algorithm>
#include <limits>
#include <map>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace dlrm::model {
namespace {

// TorchRec's MCHManagedCollisionModule: the key of an empty slot in
// _mch_sorted_raw_ids (sorted after every id), and the length of
// _output_segments_tensor (at most 1024 row-wise shards).
constexpr int64_t kMcEmpty = std::numeric_limits<int64_t>::max();
constexpr int64_t kMcSegments = 1025;

}  // namespace

void AddMcTensors(const TableConfig& t, int k,
                  std::vector<TorchRecTensor>* out) {
  const std::string theirs = absl::StrCat(
      kTorchRecMcPrefix, "_managed_collision_modules.", t.name(), ".");
  const std::string ours = absl::StrCat("dynamic_map.", t.name(), ".");
  auto add = [&](const char* buffer, const char* our, int64_t size,
                 McBuffer mc) {
    TorchRecTensor x;
    x.torchrec_name = theirs + buffer;
    x.name = ours + our;
    x.shape = {size};
    x.dtype = Dtype::kI64;
    x.mc = mc;
    x.table = k;
    out->push_back(std::move(x));
  };
  add("_output_segments_tensor", "rows", kMcSegments,
      McBuffer::kOutputSegments);
  add("_current_iter_tensor", "step", 1, McBuffer::kCurrentIter);
  add("_mch_sorted_raw_ids", "ids", t.rows(), McBuffer::kSortedRawIds);
  add("_mch_remapped_ids_mapping", "rows_of_ids", t.rows(),
      McBuffer::kRemappedIdsMapping);
  if (t.eviction().kind() == Eviction::EVICT_LFU) {
    add("_mch_counts", "sightings", t.rows(), McBuffer::kCounts);
  } else {
    add("_mch_last_access_iter", "last_steps", t.rows(),
        McBuffer::kLastAccessIter);
  }
}

McState McStateOf(const embedding::DynamicIdMap& map) {
  const int64_t rows = map.options().rows;
  const int64_t ttl = map.options().ttl_steps;
  std::vector<std::pair<int64_t, int64_t>> held;  // (id, row)
  std::vector<bool> taken(rows, false);
  for (int64_t r = 0; r < map.usable_rows(); ++r) {
    const int64_t key = map.keys()[r];
    // An expired id has lost its row (DynamicIdMap::Lookup misses it).
    if (key < 0 || (ttl > 0 && map.step() - map.last_steps()[r] > ttl)) {
      continue;
    }
    held.emplace_back(key, r);
    taken[r] = true;
  }
  std::sort(held.begin(), held.end());
  McState s;
  s.segments.assign(kMcSegments, -1);
  s.segments[0] = 0;
  s.segments[1] = rows;
  s.iter = {map.step()};
  for (const auto& [id, row] : held) {
    s.sorted_ids.push_back(id);
    s.rows.push_back(row);
    s.last_access.push_back(map.last_steps()[row]);
    s.counts.push_back(map.sightings()[row]);
  }
  // Free rows after the ids, ascending, then the kept row (TorchRec's
  // default row for ids without one): a permutation of the rows, as
  // TorchRec's mapping is.
  for (int64_t r = 0; r < map.usable_rows(); ++r) {
    if (taken[r]) continue;
    s.sorted_ids.push_back(kMcEmpty);
    s.rows.push_back(r);
    s.last_access.push_back(0);
    s.counts.push_back(0);
  }
  s.sorted_ids.push_back(kMcEmpty);
  s.rows.push_back(map.kept_row());
  // What TorchRec's LRU and LFU policies hold in the last slot.
  s.last_access.push_back(map.step());
  s.counts.push_back(std::numeric_limits<int64_t>::max());
  return s;
}

const std::vector<int64_t>& McData(const McState& s, McBuffer mc) {
  switch (mc) {
    case McBuffer::kOutputSegments:
      return s.segments;
    case McBuffer::kCurrentIter:
      return s.iter;
    case McBuffer::kSortedRawIds:
      return s.sorted_ids;
    case McBuffer::kRemappedIdsMapping:
      return s.rows;
    case McBuffer::kLastAccessIter:
      return s.last_access;
    case McBuffer::kCounts:
    case McBuffer::kNone:
      break;
  }
  return s.counts;
}

absl::StatusOr<RebuiltMap> RebuildMap(
    const SafetensorsFile& file, const std::vector<TorchRecTensor>& tensors,
    int k, const embedding::DynamicStore& store, TorchRecImportReport* report) {
  std::map<McBuffer, const TorchRecTensor*> buffers;
  for (const TorchRecTensor& t : tensors) {
    if (t.table == k) buffers[t.mc] = &t;
  }
  auto read = [&](McBuffer mc) -> absl::StatusOr<std::vector<int64_t>> {
    const TorchRecTensor& t = *buffers.at(mc);
    return file.GetInt64(t.torchrec_name, t.shape);
  };
  auto bad = [&](McBuffer mc, const std::string& why) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor ", buffers.at(mc)->torchrec_name, " ", why));
  };
  const embedding::DynamicIdOptions& options = store.map().options();
  const int64_t rows = options.rows;
  ASSIGN_OR_RETURN(const std::vector<int64_t> segments,
                   read(McBuffer::kOutputSegments));
  if (std::find(segments.begin(), segments.end(), 0) == segments.end() ||
      std::find(segments.begin(), segments.end(), rows) == segments.end()) {
    return bad(McBuffer::kOutputSegments,
               absl::StrCat("does not hold 0 and the table's rows, ", rows,
                            ": not the whole module of one table"));
  }
  ASSIGN_OR_RETURN(const std::vector<int64_t> iter,
                   read(McBuffer::kCurrentIter));
  if (iter[0] < 0) {
    return bad(McBuffer::kCurrentIter,
               absl::StrCat("is ", iter[0], "; a step is >= 0"));
  }
  ASSIGN_OR_RETURN(const std::vector<int64_t> ids,
                   read(McBuffer::kSortedRawIds));
  ASSIGN_OR_RETURN(const std::vector<int64_t> their_rows,
                   read(McBuffer::kRemappedIdsMapping));
  const bool lfu = buffers.count(McBuffer::kCounts) > 0;
  ASSIGN_OR_RETURN(const std::vector<int64_t> metadata,
                   read(lfu ? McBuffer::kCounts : McBuffer::kLastAccessIter));

  // The ids and their rows, checked.
  struct Held {
    int64_t id, row, metadata;
  };
  std::vector<Held> held;
  std::vector<bool> row_used(rows, false);
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t id = ids[i];
    if (id == kMcEmpty) continue;
    if (id < 0) {
      return bad(McBuffer::kSortedRawIds,
                 absl::StrCat("holds id ", id, " at ", i,
                              "; a dynamic table's ids are >= 0"));
    }
    if (i > 0 && ids[i - 1] >= id) {
      return bad(McBuffer::kSortedRawIds,
                 absl::StrCat("is not strictly ascending at ", i));
    }
    const int64_t row = their_rows[i];
    // TorchRec's last row is the default of ids without one, never an id's.
    if (row < 0 || row >= rows - 1) {
      return bad(McBuffer::kRemappedIdsMapping,
                 absl::StrCat("gives id ", id, " row ", row, ", outside [0, ",
                              rows - 1, ")"));
    }
    if (row_used[row]) {
      return bad(McBuffer::kRemappedIdsMapping,
                 absl::StrCat("gives id ", id, " row ", row,
                              ", the row of another id"));
    }
    row_used[row] = true;
    held.push_back({id, row, metadata[i]});
  }
  if (ids[rows - 1] != kMcEmpty) {
    return bad(McBuffer::kSortedRawIds,
               "holds an id in its last slot (TorchRec keeps it empty)");
  }

  // Placed in order of use (the most recent or most frequent first), each
  // in the first free row of its bucket.
  std::stable_sort(held.begin(), held.end(), [](const Held& a, const Held& b) {
    return a.metadata > b.metadata;
  });
  embedding::DynamicIdMap map(options);
  const int64_t usable = map.usable_rows();
  std::vector<int64_t> keys(usable, -1), last(usable, 0), sightings(usable, 0);
  std::vector<int64_t> source(rows, -1);
  for (const Held& h : held) {
    const int64_t b = map.Bucket(h.id);
    int64_t row = -1;
    for (int64_t r = map.BucketBegin(b);
         r < map.BucketBegin(b) + map.BucketSize(b); ++r) {
      if (keys[r] < 0) {
        row = r;
        break;
      }
    }
    if (row < 0) {
      if (report != nullptr) ++report->ids_dropped;
      continue;
    }
    keys[row] = h.id;
    last[row] = lfu ? iter[0] : h.metadata;
    sightings[row] = lfu ? h.metadata : 1;
    source[row] = h.row;
    if (report != nullptr) ++report->ids;
  }
  if (store.options().unadmitted == UNADMITTED_SHARED_ROW) {
    source[map.kept_row()] = rows - 1;
  }
  const absl::Status restored =
      map.Restore(std::move(keys), std::move(last), std::move(sightings),
                  std::vector<uint32_t>(map.sketch().size(), 0), iter[0]);
  if (!restored.ok()) {
    return absl::InternalError(absl::StrCat("TorchRec import: dynamic table ",
                                            k, ": ", restored.message()));
  }
  return RebuiltMap{std::move(map), std::move(source)};
}

}  // namespace dlrm::model
