// Dynamic tables' id maps in checkpoints (docs/dynamic.md "Ranks,
// checkpoints, metrics"): the tensors a shard's map is saved as beside its
// rows, and the restore's staging of every dynamic shard's map, as saved
// where the plan keeps the table's row ranges, re-routed by hash of the id
// where it does not. Used by model/checkpoint.cc.
#pragma once

#include <deque>
#include <filesystem>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "core/file_system.h"
#include "dlrm/config.pb.h"
#include "embedding/dynamic_ids.h"
#include "model/checkpoint_layout.h"
#include "model/checkpoint_manifest.h"
#include "model/model.h"
#include "model/safetensors.h"

namespace dlrm::model {

// Appends the tensors of `map`, the map of the shard saved under `base`, to
// `tensors` (their words kept alive in `words` until the file is written)
// and its step to `metadata`.
void AppendIdMapTensors(const embedding::DynamicIdMap& map,
                        const std::string& base,
                        std::deque<std::vector<float>>* words,
                        std::vector<TensorToWrite>* tensors,
                        std::map<std::string, std::string>* metadata);

// Stages the id maps of this rank's dynamic shards into `maps` (by local
// shard index) and returns the rows of those to re-route (docs/dynamic.md
// "Ranks, checkpoints, metrics"). Where the plan keeps a table's saved row
// ranges, each shard takes the saved map of its range as it is. Otherwise every
// saved range's map is read, and each shard gets the saved ids that route to it
// (DynamicRowShard of the id over the shard count when row-wise; all of
// them otherwise), placed into its buckets (DynamicIdMap::PlaceSaved: a
// bucket too small keeps the most recently seen), each with its saved
// record; the kept row takes the first range's kept row; the sketches are
// merged, the step is the latest. Verifies the files it reads; errors as
// ReadIdMap, DataLoss for an id saved in two ranges.
absl::StatusOr<TableRestore::RoutedRows> StageIdMaps(
    Model& model, const std::filesystem::path& dir, const ModelConfig& saved,
    const SavedLayout& layout, const Manifest& manifest,
    FileSystem* file_system,
    std::vector<std::pair<int, embedding::DynamicIdMap>>* maps);

}  // namespace dlrm::model
