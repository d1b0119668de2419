// Dynamic tables' id maps in checkpoints (model/checkpoint_maps.h).
#include "model/checkpoint_maps.h"

#include <cstring>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "embedding/dynamic_route.h"
#include "embedding/dynamic_store.h"
#include "model/checkpoint_manifest.h"

namespace dlrm::model {
namespace {

namespace fs = std::filesystem;

// A dynamic table's id map in a checkpoint (docs/dynamic.md
// "Checkpoints"), beside its shard's rows in the rank's safetensors file:
// "<base>.dynamic_map" [usable rows, 6], each row's key, last step seen
// and sightings as int64 bit patterns in float32 words (the form
// kept from before the files held I64: the words are never read as
// numbers), and, under
// ADMIT_AFTER_SIGHTINGS, "<base>.dynamic_sketch" [4, width] (uint32 bit
// patterns); the map's step under metadata key "dynamic_step.<base>".
constexpr int kMapWords = 6;
std::string MapTensorName(const std::string& base) {
  return base + ".dynamic_map";
}
std::string SketchTensorName(const std::string& base) {
  return base + ".dynamic_sketch";
}
std::string MapStepKey(const std::string& base) {
  return "dynamic_step." + base;
}

// The saved id map of block `b` of dynamic table `k` (the saved shard of
// that index) for a map of `options` (its rows the block's), read from the
// block's rank file in `dir` (the column blocks of one row range hold the
// same map). FailedPrecondition naming the tensor when it is missing or
// has another shape; DataLoss when its keys are not a valid map.
absl::StatusOr<embedding::DynamicIdMap> ReadIdMap(
    const fs::path& dir, const ModelConfig& saved, const SavedLayout& layout,
    int k, int b, const embedding::DynamicIdOptions& options) {
  const std::string base = ShardBase(saved, k, b);
  const std::string file = RankFileName(layout.tables[k][b].rank);
  ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> f,
                   SafetensorsFile::Open((dir / file).string()));
  embedding::DynamicIdMap map(options);
  const int64_t rows = map.usable_rows();
  absl::StatusOr<std::span<const float>> words =
      f->Get(MapTensorName(base), {rows, kMapWords});
  if (!words.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("dynamic table ", saved.tables(k).name(), ": ", file, ": ",
                     words.status().message()));
  }
  std::vector<int64_t> keys(rows), last(rows), sightings(rows);
  for (int64_t r = 0; r < rows; ++r) {
    int64_t fields[3];
    std::memcpy(fields, words->data() + r * kMapWords, sizeof(fields));
    keys[r] = fields[0];
    last[r] = fields[1];
    sightings[r] = fields[2];
  }
  // The sketch, where both the saved and this table's admission keep one
  // (admission may change between runs: the counts then start again).
  std::vector<uint32_t> sketch(map.sketch().size(), 0);
  if (!sketch.empty() && f->Has(SketchTensorName(base))) {
    absl::StatusOr<std::span<const float>> saved_sketch =
        f->Get(SketchTensorName(base),
               {embedding::DynamicIdMap::kSketchDepth, map.sketch_width()});
    if (!saved_sketch.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat("dynamic table ", saved.tables(k).name(), ": ", file,
                       ": ", saved_sketch.status().message()));
    }
    std::memcpy(sketch.data(), saved_sketch->data(),
                sketch.size() * sizeof(uint32_t));
  }
  const absl::Status restored = map.Restore(
      std::move(keys), std::move(last), std::move(sightings), std::move(sketch),
      MetadataStep(f->metadata(), MapStepKey(base)));
  if (!restored.ok()) {
    return absl::DataLossError(absl::StrCat("dynamic table ",
                                            saved.tables(k).name(), ": ", file,
                                            ": ", restored.message()));
  }
  return map;
}

// The distinct row ranges of the saved blocks of table `k`, in order, each
// with the index of its first block.
struct SavedRows {
  int64_t begin, end;
  int block;
};
std::vector<SavedRows> SavedRowRanges(const SavedLayout& layout, int k) {
  std::vector<SavedRows> out;
  const std::vector<SavedShard>& blocks = layout.tables[k];
  for (int b = 0; b < static_cast<int>(blocks.size()); ++b) {
    const bool known = std::any_of(out.begin(), out.end(), [&](const auto& r) {
      return r.begin == blocks[b].row_begin;
    });
    if (!known) out.push_back({blocks[b].row_begin, blocks[b].row_end, b});
  }
  std::sort(out.begin(), out.end(),
            [](const auto& x, const auto& y) { return x.begin < y.begin; });
  return out;
}

// Whether the shards of `placement` hold the `saved` row ranges (then
// each shard's map is the saved one of its range and its rows are copied
// by range: bitwise the saved state); otherwise a dynamic table's ids are
// re-routed (StageIdMaps).
bool SameRowRanges(const std::vector<SavedRows>& saved,
                   const embedding::TablePlacement& placement) {
  std::vector<std::pair<int64_t, int64_t>> mine;
  for (const embedding::Shard& s : placement.shards) {
    const std::pair<int64_t, int64_t> range{s.row_begin,
                                            s.row_begin + s.row_count};
    if (std::find(mine.begin(), mine.end(), range) == mine.end()) {
      mine.push_back(range);
    }
  }
  std::sort(mine.begin(), mine.end());
  if (mine.size() != saved.size()) return false;
  for (size_t i = 0; i < mine.size(); ++i) {
    if (mine[i].first != saved[i].begin || mine[i].second != saved[i].end) {
      return false;
    }
  }
  return true;
}

}  // namespace

void AppendIdMapTensors(const embedding::DynamicIdMap& map,
                        const std::string& base,
                        std::deque<std::vector<float>>* words,
                        std::vector<TensorToWrite>* tensors,
                        std::map<std::string, std::string>* metadata) {
  const int64_t rows = map.usable_rows();
  std::vector<float>& w = words->emplace_back(rows * kMapWords);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t fields[3] = {map.keys()[r], map.last_steps()[r],
                               map.sightings()[r]};
    std::memcpy(w.data() + r * kMapWords, fields, sizeof(fields));
  }
  tensors->push_back({MapTensorName(base), {rows, kMapWords}, w.data()});
  if (!map.sketch().empty()) {
    std::vector<float>& sketch = words->emplace_back(map.sketch().size());
    std::memcpy(sketch.data(), map.sketch().data(),
                sketch.size() * sizeof(float));
    tensors->push_back(
        {SketchTensorName(base),
         {embedding::DynamicIdMap::kSketchDepth, map.sketch_width()},
         sketch.data()});
  }
  (*metadata)[MapStepKey(base)] = std::to_string(map.step());
}

absl::StatusOr<TableRestore::RoutedRows> StageIdMaps(
    Model& model, const fs::path& dir, const ModelConfig& saved,
    const SavedLayout& layout, const Manifest& manifest,
    FileSystem* file_system,
    std::vector<std::pair<int, embedding::DynamicIdMap>>* maps) {
  TableRestore::RoutedRows routed;
  const ShardSet& shards = model.shards();
  const ModelConfig& config = model.config();
  // Per table re-routed: every saved range's map.
  std::map<int, std::vector<embedding::DynamicIdMap>> saved_maps;
  auto verify = [&](const std::string& file) {
    return VerifyCheckpointFiles(
        dir.string(), manifest,
        [&file](const std::string& p) {
          return p == file || (file.ends_with('/') && p.starts_with(file));
        },
        file_system);
  };
  for (int j = 0; j < shards.size(); ++j) {
    const auto* store =
        dynamic_cast<const embedding::DynamicStore*>(shards.store(j));
    if (store == nullptr) continue;
    const int k = shards[j].table;
    const embedding::TablePlacement& placement = model.plan().tables[k];
    const embedding::Shard& shard = placement.shards[shards[j].shard];
    const std::vector<SavedRows> ranges = SavedRowRanges(layout, k);
    if (SameRowRanges(ranges, placement)) {
      const auto same = std::find_if(
          ranges.begin(), ranges.end(),
          [&](const SavedRows& r) { return r.begin == shard.row_begin; });
      RETURN_IF_ERROR(verify(RankFileName(layout.tables[k][same->block].rank)));
      ASSIGN_OR_RETURN(embedding::DynamicIdMap map,
                       ReadIdMap(dir, saved, layout, k, same->block,
                                 store->map().options()));
      maps->emplace_back(j, std::move(map));
      continue;
    }
    const TableConfig& t = config.tables(k);
    auto [it, first] = saved_maps.try_emplace(k);
    if (first) {
      for (const SavedShard& b : layout.tables[k]) {
        RETURN_IF_ERROR(verify(RankFileName(b.rank)));
        RETURN_IF_ERROR(verify(b.rocksdb_dir.empty() ? b.weights_file
                                                     : b.rocksdb_dir + "/"));
      }
      for (const SavedRows& range : ranges) {
        ASSIGN_OR_RETURN(
            embedding::DynamicIdMap map,
            ReadIdMap(dir, saved, layout, k, range.block,
                      embedding::DynamicIdOptionsFor(
                          t.admission(), t.eviction(), range.end - range.begin,
                          config.seed())));
        it->second.push_back(std::move(map));
      }
    }
    const std::vector<embedding::DynamicIdMap>& from = it->second;
    const bool row_wise = placement.kind == SHARDING_ROW_WISE;
    const int count = static_cast<int>(placement.shards.size());
    // The saved ids this shard takes, and the saved row of each.
    std::vector<embedding::DynamicIdMap::SavedId> ids;
    std::vector<int64_t> saved_rows;
    int64_t step = 0;
    for (size_t g = 0; g < from.size(); ++g) {
      const embedding::DynamicIdMap& m = from[g];
      step = std::max(step, m.step());
      for (int64_t r = 0; r < m.usable_rows(); ++r) {
        const int64_t id = m.keys()[r];
        if (id < 0) continue;
        if (row_wise &&
            embedding::DynamicRowShard(id, count) != shards[j].shard) {
          continue;
        }
        ids.push_back({id, m.last_steps()[r], m.sightings()[r]});
        saved_rows.push_back(ranges[g].begin + r);
      }
    }
    embedding::DynamicIdMap map(store->map().options());
    absl::StatusOr<std::vector<int64_t>> rows = map.PlaceSaved(ids, step);
    if (!rows.ok()) {
      return absl::DataLossError(absl::StrCat("dynamic table ", t.name(), ": ",
                                              rows.status().message()));
    }
    for (size_t g = 0; g < from.size(); ++g) {
      RETURN_IF_ERROR(
          map.MergeSketch(from[g].sketch(), from[g].sketch_width()));
    }
    std::vector<int64_t>& mine = routed[j];
    mine.assign(shard.row_count, -1);
    for (size_t i = 0; i < ids.size(); ++i) {
      if ((*rows)[i] >= 0) mine[(*rows)[i]] = saved_rows[i];
    }
    // The kept row: the first saved range's.
    mine[map.kept_row()] = ranges[0].end - 1;
    maps->emplace_back(j, std::move(map));
  }
  return routed;
}

}  // namespace dlrm::model
