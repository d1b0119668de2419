// Saving a model on any number of ranks into a checkpoint directory (each
// rank's shards, the dense part, config, plan, layout, MANIFEST.json) and
// restoring one on any number of ranks (model/checkpoint_layout.h).
#include "model/checkpoint.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <map>
#include <string_view>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/config.h"
#include "core/status.h"
#include "embedding/dynamic_route.h"
#include "embedding/dynamic_store.h"
#include "google/protobuf/text_format.h"
#include "model/checkpoint_layout.h"
#include "model/checkpoint_manifest.h"
#include "model/safetensors.h"
#include "optim/optimizer.h"
#include "spdlog/spdlog.h"

namespace dlrm::model {
namespace {

namespace fs = std::filesystem;

constexpr char kConfig[] = "config.textproto";
constexpr char kPlan[] = "plan.txt";

// The parts of a config that fix the shapes of weights and state.
absl::Status CheckSameArchitecture(const ModelConfig& a, const ModelConfig& b) {
  auto mismatch = [](const std::string& what) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint does not match the model: ", what, " differs"));
  };
  if (a.num_dense_features() != b.num_dense_features()) {
    return mismatch("num_dense_features");
  }
  if (a.tables_size() != b.tables_size()) return mismatch("number of tables");
  for (int i = 0; i < a.tables_size(); ++i) {
    const auto& x = a.tables(i);
    const auto& y = b.tables(i);
    if (x.name() != y.name() || x.rows() != y.rows() || x.dim() != y.dim() ||
        x.pooling() != y.pooling() || x.dynamic() != y.dynamic()) {
      return mismatch(absl::StrCat("tables[", i, "] (", y.name(), ")"));
    }
    // The tier may differ: a restore reads and writes rows through stores.
  }
  if (!std::equal(a.bottom_mlp().begin(), a.bottom_mlp().end(),
                  b.bottom_mlp().begin(), b.bottom_mlp().end())) {
    return mismatch("bottom_mlp");
  }
  if (!std::equal(a.top_mlp().begin(), a.top_mlp().end(), b.top_mlp().begin(),
                  b.top_mlp().end())) {
    return mismatch("top_mlp");
  }
  if (a.interaction() != b.interaction()) return mismatch("interaction");
  if (a.dcn_num_layers() != b.dcn_num_layers()) {
    return mismatch("dcn_num_layers");
  }
  if (a.dcn_low_rank_dim() != b.dcn_low_rank_dim()) {
    return mismatch("dcn_low_rank_dim");
  }
  if (a.dense_optimizer().type() != b.dense_optimizer().type()) {
    return mismatch("dense_optimizer.type");
  }
  if (a.sparse_optimizer().type() != b.sparse_optimizer().type()) {
    return mismatch("sparse_optimizer.type");
  }
  return absl::OkStatus();
}

absl::StatusOr<ModelConfig> ReadCheckpointConfig(const fs::path& dir,
                                                 FileSystem* file_system) {
  if (!fs::exists(dir / kManifestFile)) {
    return absl::NotFoundError(absl::StrCat("no checkpoint in ", dir.string(),
                                            " (no ", kManifestFile, ")"));
  }
  ASSIGN_OR_RETURN(std::string text,
                   ReadFile(*file_system, (dir / kConfig).string()));
  ASSIGN_OR_RETURN(ModelConfig config, ParseModelConfigText(text));
  return NormalizeModelConfig(std::move(config));
}

// kill the process in the middle of a save
// (tests/server/server_process_test.cc).
void TestOnlyDelay() {
  const char* env = std::getenv("DLRM_TEST_CHECKPOINT_DELAY_MS");
  int ms = 0;
  if (env == nullptr || !absl::SimpleAtoi(env, &ms) || ms <= 0) return;
  std::this_thread::sleep_for(std::chrono::milliseconds(ms));
}

// A test hook that stands for a rank frozen in the middle of a save:
// DLRM_TEST_CHECKPOINT_FREEZE=<rank>:<point> makes that rank stop itself
// (SIGSTOP) at `point` of its next save: "write", before it writes its
// part, or "commit", once its part is written and agreed on, before it
// learns rank 0's commit (tests/server/launch_test.cc).
void TestOnlyFreeze(int rank, std::string_view point) {
  const char* env = std::getenv("DLRM_TEST_CHECKPOINT_FREEZE");
  if (env == nullptr) return;
  const std::string_view spec(env);
  const size_t colon = spec.find(':');
  int frozen = -1;
  if (colon == std::string_view::npos ||
      !absl::SimpleAtoi(std::string(spec.substr(0, colon)), &frozen) ||
      frozen != rank || spec.substr(colon + 1) != point) {
    return;
  }
  spdlog::warn("rank {}: DLRM_TEST_CHECKPOINT_FREEZE: stopping at {}", rank,
               point);
  ::raise(SIGSTOP);
}

// A dynamic table's id map in a checkpoint (docs/dynamic.md
// "Checkpoints"), beside its shard's rows in the rank's safetensors file:
// "<base>.dynamic_map" [usable rows, 6], each row's key, last step seen
// and sightings as int64 bit patterns in float32 words (safetensors files
// here hold F32 only: the words are never read as numbers), and, under
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

// A restore read and checked on this rank, not yet applied.
struct StagedRestore {
  Manifest manifest;
  std::unique_ptr<TableRestore> tables;
  std::vector<std::unique_ptr<SafetensorsFile>> dense_files;
  struct Copy {
    std::span<const float> from;
    float* to;
  };
  std::vector<Copy> dense;
  int64_t step = 0, dense_step = 0;
  // The id maps of this rank's dynamic shards, by local shard index.
  std::vector<std::pair<int, embedding::DynamicIdMap>> maps;
};

// Reads the manifest, config and layout of the checkpoint in `dir`, checks
// the files this rank reads and stages its part (docs/checkpoints.md
// "Resharding"). Changes nothing.
absl::StatusOr<StagedRestore> StageRestore(Model& model, const fs::path& dir,
                                           bool weights_only,
                                           FileSystem* file_system) {
  StagedRestore r;
  ASSIGN_OR_RETURN(r.manifest, ReadManifest(dir.string(), file_system));
  const bool has_layout =
      std::any_of(r.manifest.files.begin(), r.manifest.files.end(),
                  [](const ManifestFile& f) { return f.path == kLayoutFile; });
  RETURN_IF_ERROR(VerifyCheckpointFiles(
      dir.string(), r.manifest,
      [](const std::string& p) {
        return p == kConfig || p == kLayoutFile || p == kPlan;
      },
      file_system));
  ASSIGN_OR_RETURN(ModelConfig saved, ReadCheckpointConfig(dir, file_system));
  RETURN_IF_ERROR(CheckSameArchitecture(saved, model.config()));
  SavedLayout layout;
  if (has_layout) {
    const std::string path = (dir / kLayoutFile).string();
    ASSIGN_OR_RETURN(std::string text, ReadFile(*file_system, path));
    absl::StatusOr<SavedLayout> parsed = LayoutFromJson(text, saved, path);
    if (!parsed.ok()) return absl::DataLossError(parsed.status().message());
    layout = *std::move(parsed);
  } else if (r.manifest.format == kLegacyMultiRankFormat) {
    // Written before checkpoints carried their layout: its blocks are known
    // only as the plan it was saved with.
    ASSIGN_OR_RETURN(std::string plan_text,
                     ReadFile(*file_system, (dir / kPlan).string()));
    if (r.manifest.world_size != model.world_size() ||
        plan_text != model.plan().ToString(model.config())) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the checkpoint in ", dir.string(),
          " was written by an earlier version on ", r.manifest.world_size,
          " ranks with another sharding plan, which it does not record; "
          "restore it on its own plan and save it again to reshard it. Its "
          "plan:\n",
          plan_text));
    }
    layout = MultiRankLayout(model.config(), model.plan());
  } else {
    layout = OneProcessLayout(saved);
  }
  const std::set<std::string> needed =
      TableRestore::FilesNeeded(model, layout, weights_only);
  RETURN_IF_ERROR(VerifyCheckpointFiles(
      dir.string(), r.manifest,
      [&needed](const std::string& p) {
        return TableRestore::Needed(needed, p);
      },
      file_system));
  // Dynamic tables' id maps (with weights_only too: predictions need them),
  // and the rows of those whose ids are re-routed.
  ASSIGN_OR_RETURN(
      TableRestore::RoutedRows routed,
      StageIdMaps(model, dir, saved, layout, r.manifest, file_system, &r.maps));
  ASSIGN_OR_RETURN(r.tables, TableRestore::Stage(model, dir, saved, layout,
                                                 weights_only, routed));

  auto open =
      [&](const std::string& name) -> absl::StatusOr<const SafetensorsFile*> {
    ASSIGN_OR_RETURN(auto f, SafetensorsFile::Open((dir / name).string()));
    r.dense_files.push_back(std::move(f));
    return r.dense_files.back().get();
  };
  auto add = [&](const SafetensorsFile& file,
                 const dense::ParamRef& p) -> absl::Status {
    absl::StatusOr<std::span<const float>> from = file.GetFlat(p.name, p.size);
    if (!from.ok()) {
      return absl::IsNotFound(from.status())
                 ? from.status()
                 : absl::FailedPreconditionError(from.status().message());
    }
    r.dense.push_back({*from, p.value});
    return absl::OkStatus();
  };
  ASSIGN_OR_RETURN(const SafetensorsFile* weights,
                   open(layout.dense_weights_file));
  for (const dense::ParamRef& p : model.dense_params()) {
    RETURN_IF_ERROR(add(*weights, p));
  }
  r.step = MetadataStep(weights->metadata(), "step");
  if (!weights_only) {
    const SafetensorsFile* state = weights;
    if (layout.dense_state_file != layout.dense_weights_file) {
      ASSIGN_OR_RETURN(state, open(layout.dense_state_file));
    }
    for (const dense::ParamRef& p : model.dense_optimizer().State()) {
      RETURN_IF_ERROR(add(*state, p));
    }
    r.dense_step = MetadataStep(state->metadata(), "dense_optimizer_step");
  }
  return r;
}

// Collective: every rank stages its part, the ranks agree, and only then
// does any rank change its model.
absl::StatusOr<CheckpointInfo> Restore(Model& model, const fs::path& dir,
                                       bool weights_only,
                                       FileSystem* file_system) {
  absl::StatusOr<StagedRestore> staged =
      StageRestore(model, dir, weights_only, file_system);
  if (!staged.ok()) {
    spdlog::warn("rank {}: cannot restore {}: {}", model.rank(), dir.string(),
                 staged.status().ToString());
  }
  RETURN_IF_ERROR(model.Agree(staged.status()));
  {
    // Readers on other threads see the old weights or the new, never a mix.
    Model::WeightsWriter writing(model);
    staged->tables->Apply();
    // After Apply: it may have replaced the stores of the database form.
    for (auto& [j, map] : staged->maps) {
      static_cast<embedding::DynamicStore*>(model.shards().store(j))
          ->ReplaceMap(std::move(map));
    }
    for (const StagedRestore::Copy& c : staged->dense) {
      std::copy(c.from.begin(), c.from.end(), c.to);
    }
    if (!weights_only) model.dense_optimizer().set_step(staged->dense_step);
    model.set_steps(staged->step);
    // On CUDA the dense weights go up to the device now, before readers
    // copy them from there.
    RETURN_IF_ERROR(model.PublishDenseParams());
  }
  CheckpointInfo info;
  info.step = staged->step;
  for (const ManifestFile& f : staged->manifest.files) info.bytes += f.bytes;
  return info;
}

// One tensor of a table (or shard) in a checkpoint; `data` borrows the
// table's buffer, of `dtype`.
struct TableTensor {
  std::string name;
  std::vector<int64_t> shape;
  const void* data;
  Dtype dtype = Dtype::kF32;
};

// The tensors a checkpoint holds for table (or shard) `t` under `base`:
// "<base>.weight" [rows, dim] when `with_weight` (F32, or the 16-bit words
// of a ROW_FP16 / ROW_BF16 table as F16 / BF16), then each state array of
// its optimizer (optim::SparseState: state1, state2 in order), named and
// shaped as the restore reads them (StateTensorName, StateTensorShape):
// "<base>.momentum1" ([rows] for row-wise Adagrad, [rows, dim] for Adam)
// and "<base>.momentum2" [rows, dim] (Adam). None of the state for SGD.
std::vector<TableTensor> TableTensors(const std::string& base,
                                      const embedding::EmbeddingTable& t,
                                      bool with_weight) {
  std::vector<TableTensor> out;
  if (with_weight) {
    switch (t.precision()) {
      case ROW_FP16:
        out.push_back(
            {base + ".weight", {t.rows(), t.dim()}, t.words(), Dtype::kF16});
        break;
      case ROW_BF16:
        out.push_back(
            {base + ".weight", {t.rows(), t.dim()}, t.words(), Dtype::kBF16});
        break;
      default:
        out.push_back({base + ".weight", {t.rows(), t.dim()}, t.weights()});
        break;
    }
  }
  const std::span<const optim::StateArray> arrays =
      optim::SparseState(t.optimizer());
  const float* const state[] = {t.state1().data(), t.state2().data()};
  for (size_t a = 0; a < arrays.size() && a < std::size(state); ++a) {
    out.push_back({StateTensorName(base, arrays[a]),
                   StateTensorShape(arrays[a], t.rows(), t.dim()), state[a]});
  }
  return out;
}

// Collects what a rank's stores hand a checkpoint (EmbeddingStore::Save):
// the tensors of its shards, with the host copies that back them, and the
// database that holds the rows of the database form.
class PartSink final : public embedding::RowsSink {
 public:
  PartSink(const ModelConfig& config, std::vector<TensorToWrite>* tensors,
           std::map<std::string, std::string>* meta)
      : config_(config), tensors_(tensors), meta_(meta) {}

  // The next Save is of shard `shard` of table `table`.
  void SetShard(int table, int shard) {
    base_ = ShardBase(config_, table, shard);
  }
  absl::Status Tensors(const embedding::EmbeddingTable& rows,
                       std::unique_ptr<embedding::HostStore> copy) override {
    for (const TableTensor& t :
         TableTensors(base_, rows, /*with_weight=*/true)) {
      tensors_->push_back({t.name, t.shape, t.data, t.dtype});
    }
    (*meta_)["table_step." + base_] = std::to_string(rows.step());
    if (copy != nullptr) copies_.push_back(std::move(copy));
    return absl::OkStatus();
  }
  absl::Status Database(embedding::RowDatabase& db) override {
    if (database_ != nullptr && database_ != &db) {
      return absl::InternalError(
          "a rank's stores of the database form are in two databases");
    }
    database_ = &db;
    return absl::OkStatus();
  }
  absl::Status IdMap(const embedding::DynamicIdMap& map) override {
    const int64_t rows = map.usable_rows();
    std::vector<float>& words = words_.emplace_back(rows * kMapWords);
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t fields[3] = {map.keys()[r], map.last_steps()[r],
                                 map.sightings()[r]};
      std::memcpy(words.data() + r * kMapWords, fields, sizeof(fields));
    }
    tensors_->push_back(
        {MapTensorName(base_), {rows, kMapWords}, words.data()});
    if (!map.sketch().empty()) {
      std::vector<float>& sketch = words_.emplace_back(map.sketch().size());
      std::memcpy(sketch.data(), map.sketch().data(),
                  sketch.size() * sizeof(float));
      tensors_->push_back(
          {SketchTensorName(base_),
           {embedding::DynamicIdMap::kSketchDepth, map.sketch_width()},
           sketch.data()});
    }
    (*meta_)[MapStepKey(base_)] = std::to_string(map.step());
    return absl::OkStatus();
  }
  embedding::RowDatabase* database() const { return database_; }

 private:
  const ModelConfig& config_;
  std::vector<TensorToWrite>* tensors_;
  std::map<std::string, std::string>* meta_;
  std::string base_;
  // Host copies of the shards not in host memory, alive until written.
  std::vector<std::unique_ptr<embedding::HostStore>> copies_;
  // The id maps' words, alive until written (a deque: no element moves).
  std::deque<std::vector<float>> words_;
  embedding::RowDatabase* database_ = nullptr;
};

// This rank's part of a checkpoint, into the directory `tmp`: its shards in
// host memory (a data-parallel table's copy on rank 0 only) in
// rank-<r>.safetensors and its shards on RocksDB as a checkpoint of its
// database in rank-<r>.rocksdb; rank 0 also the dense part, the config, the
// plan and the layout.
absl::Status WritePart(Model& model, const fs::path& tmp,
                       FileSystem* file_system) {
  const ModelConfig& config = model.config();
  const int rank = model.rank();
  std::vector<TensorToWrite> tensors;
  std::map<std::string, std::string> meta = {{"format", "dlrm-server-rank"},
                                             {"rank", std::to_string(rank)}};
  // Every store saves itself in its checkpoint form: the tensor form into
  // rank-<r>.safetensors (a data-parallel table's copy on rank 0 only),
  // the database form as a checkpoint of the rank's database (every copy
  // in it: a restore on the same plan takes the database as it is).
  PartSink sink(config, &tensors, &meta);
  const ShardSet& shards = model.shards();
  for (int j = 0; j < shards.size(); ++j) {
    const ShardSet::Shard& s = shards[j];
    if (model.plan().tables[s.table].kind == SHARDING_DATA_PARALLEL &&
        rank != 0 &&
        s.store->capabilities().checkpoint ==
            embedding::CheckpointForm::kTensors) {
      continue;
    }
    sink.SetShard(s.table, s.shard);
    RETURN_IF_ERROR(s.store->Save(sink));
  }
  // The 4- and 8-byte tensors first, 16-bit rows after them, so every
  // tensor stays aligned to its element (SafetensorsWriter).
  std::stable_partition(
      tensors.begin(), tensors.end(),
      [](const TensorToWrite& t) { return DtypeBytes(t.dtype) >= 4; });
  RETURN_IF_ERROR(WriteSafetensors((tmp / RankFileName(rank)).string(), tensors,
                                   meta, file_system));
  TestOnlyDelay();
  if (sink.database() != nullptr) {
    // RocksDB's checkpoint, written through RocksDB's own file system: its
    // files are checksummed like the others.
    RETURN_IF_ERROR(
        sink.database()->Checkpoint((tmp / RankRocksDbDir(rank)).string()));
    TestOnlyDelay();
  }
  if (rank != 0) return absl::OkStatus();

  // The MLPs are the same on every rank: rank 0 writes them.
  tensors.clear();
  for (const dense::ParamRef& p : model.dense_params()) {
    tensors.push_back({p.name, {p.size}, p.value});
  }
  for (const dense::ParamRef& p : model.dense_optimizer().State()) {
    tensors.push_back({p.name, {p.size}, p.value});
  }
  RETURN_IF_ERROR(
      WriteSafetensors((tmp / kDenseFile).string(), tensors,
                       {{"format", "dlrm-server"},
                        {"step", std::to_string(model.steps())},
                        {"dense_optimizer_step",
                         std::to_string(model.dense_optimizer().step())}},
                       file_system));
  TestOnlyDelay();
  std::string config_text;
  google::protobuf::TextFormat::PrintToString(config, &config_text);
  RETURN_IF_ERROR(
      WriteTextFile((tmp / kConfig).string(), config_text, file_system));
  RETURN_IF_ERROR(WriteTextFile((tmp / kPlan).string(),
                                model.plan().ToString(config), file_system));
  RETURN_IF_ERROR(WriteTextFile((tmp / kLayoutFile).string(),
                                LayoutToJson(LayoutOf(model), config),
                                file_system));
  TestOnlyDelay();
  return absl::OkStatus();
}

// Rank 0, once every rank wrote its part: the manifest, then the commit.
absl::StatusOr<CheckpointInfo> FinishSave(Model& model, const fs::path& tmp,
                                          const fs::path& dir,
                                          const std::string& job,
                                          FileSystem* file_system) {
  Manifest fields;
  fields.format = kCheckpointFormat;
  fields.step = model.steps();
  fields.world_size = model.world_size();
  google::protobuf::TextFormat::PrintToString(model.config(),
                                              &fields.config_text);
  fields.sharding_plan = model.plan().ToString(model.config());
  fields.job = job;
  // Written last, with every rank's files' checksums (the directory is
  // shared): its presence marks a complete checkpoint.
  ASSIGN_OR_RETURN(Manifest manifest,
                   WriteManifest(tmp.string(), fields, file_system));
  TestOnlyDelay();
  RETURN_IF_ERROR(CommitDirectory(tmp.string(), dir.string(), file_system));
  CheckpointInfo info;
  info.step = model.steps();
  for (const ManifestFile& f : manifest.files) info.bytes += f.bytes;
  return info;
}
}  // namespace

absl::StatusOr<CheckpointInfo> SaveCheckpoint(Model& model,
                                              const std::string& dir_name,
                                              const std::string& job,
                                              FileSystem* file_system) {
  const fs::path dir = fs::absolute(dir_name).lexically_normal();
  // Rank 0 makes the temporary directory, named after its process, and
  // every rank writes into it.
  absl::Status made;
  if (model.rank() == 0) {
    const std::string tmp = TemporaryPath(dir.string());
    made = file_system->RemoveAll(tmp);
    if (made.ok()) made = file_system->CreateDirectories(tmp);
  }
  std::vector<int64_t> pids;
  RETURN_IF_ERROR(model.Agree(made, {::getpid()}, &pids));
  const fs::path tmp = absl::StrCat(dir.string(), ".tmp-", pids[0]);
  TestOnlyFreeze(model.rank(), "write");
  const absl::Status written = WritePart(model, tmp, file_system);
  if (!written.ok()) {
    spdlog::warn("rank {}: cannot write its part of {}: {}", model.rank(),
                 dir.string(), written.ToString());
  }
  const absl::Status agreed = model.Agree(written);
  if (model.communicator_failed()) {
    // Rank 0 commits nothing now, so its temporary directory goes. Another
    // rank cannot tell whether rank 0 went on to commit (in a shared
    // directory its part may be in the checkpoint), so it leaves its part
    // to the next start's CleanPartialCheckpoints.
    if (model.rank() == 0) RemoveLeftover(tmp.string(), file_system);
    return agreed;
  }
  absl::StatusOr<CheckpointInfo> info = CheckpointInfo{model.steps(), 0};
  if (!agreed.ok()) info = agreed;
  if (model.rank() == 0 && info.ok()) {
    info = FinishSave(model, tmp, dir, job, file_system);
  }
  TestOnlyFreeze(model.rank(), "commit");
  // Every rank learns the outcome of the commit.
  const absl::Status outcome =
      model.Agree(model.rank() == 0 ? info.status() : absl::OkStatus());
  if (model.communicator_failed()) {
    // What is on disk decides: a checkpoint rank 0 committed is one, even
    // though the ranks cannot say so to each other any more (the caller
    // sees communicator_failed()).
    if (model.rank() == 0 && info.ok()) return info;
    if (model.rank() == 0) RemoveLeftover(tmp.string(), file_system);
    return outcome;
  }
  if (!outcome.ok()) {
    // Every rank knows no commit happens: rank 0 removes the temporary
    // directory, then (in a directory of their own, on another host) the
    // other ranks theirs; in a shared one it is gone by then.
    if (model.rank() == 0) RemoveLeftover(tmp.string(), file_system);
    if (model.Agree(absl::OkStatus()).ok() && model.rank() != 0) {
      RemoveLeftover(tmp.string(), file_system);
    }
    return outcome;
  }
  return info;
}

absl::StatusOr<CheckpointInfo> RestoreCheckpoint(Model& model,
                                                 const std::string& dir,
                                                 FileSystem* file_system) {
  return Restore(model, fs::absolute(dir).lexically_normal(),
                 /*weights_only=*/false, file_system);
}

absl::StatusOr<std::unique_ptr<Model>> LoadCheckpoint(const std::string& dir,
                                                      bool weights_only,
                                                      FileSystem* file_system) {
  return LoadCheckpointOn(dir, weights_only, std::nullopt, file_system);
}

absl::StatusOr<std::unique_ptr<Model>> LoadCheckpointOn(
    const std::string& dir, bool weights_only,
    std::optional<ComputeDevice> device, FileSystem* file_system) {
  return LoadCheckpointWith(
      dir, weights_only,
      [device](ModelConfig* config) {
        if (device.has_value()) config->set_device(*device);
        return absl::OkStatus();
      },
      file_system);
}

absl::StatusOr<std::unique_ptr<Model>> LoadCheckpointWith(
    const std::string& dir, bool weights_only,
    const std::function<absl::Status(ModelConfig*)>& adjust,
    FileSystem* file_system) {
  // Checked before the model is allocated.
  ASSIGN_OR_RETURN(Manifest manifest, ReadManifest(dir, file_system));
  RETURN_IF_ERROR(VerifyCheckpointFiles(
      dir, manifest, [](const std::string& p) { return p == kConfig; },
      file_system));
  ASSIGN_OR_RETURN(ModelConfig config, ReadCheckpointConfig(dir, file_system));
  RETURN_IF_ERROR(adjust(&config));
  // Tables that lived in the GPU's memory live in host memory on the CPU,
  // or on RocksDB when their device cache was backed by it; the device
  // cache's fields go (the config refuses them off STORAGE_DEVICE).
  if (config.device() != DEVICE_CUDA) {
    for (TableConfig& t : *config.mutable_tables()) {
      if (t.storage() == STORAGE_DEVICE) {
        t.set_storage(RowsOnRocksDb(t) ? STORAGE_ROCKSDB : STORAGE_HOST);
        t.clear_device_cache_rows();
        t.clear_device_cache_backing();
      }
    }
  }
  ASSIGN_OR_RETURN(std::unique_ptr<Model> model, Model::Create(config));
  RETURN_IF_ERROR(Restore(*model, fs::absolute(dir).lexically_normal(),
                          weights_only, file_system)
                      .status());
  return model;
}

}  // namespace dlrm::model
