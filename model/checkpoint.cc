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
#include <set>
#include <string_view>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/config.h"
#include "core/status.h"
#include "embedding/dynamic_store.h"
#include "google/protobuf/text_format.h"
#include "model/checkpoint_layout.h"
#include "model/checkpoint_manifest.h"
#include "model/checkpoint_maps.h"
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
  if (const std::string field = DifferentInteractionField(a, b);
      !field.empty()) {
    return mismatch(field);
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
    AppendIdMapTensors(map, base_, &words_, tensors_, meta_);
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
