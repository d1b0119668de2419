// Checkpoint directories of a model on any number of ranks (each rank's
// shards, the dense part, config, plan, layout, MANIFEST.json), restored on
// any number of ranks (checkpoint_layout.h); manifests with checksums;
// periodic checkpoints' housekeeping; the weights export.
#include "model/checkpoint.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string_view>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/config.h"
#include "core/crc32c.h"
#include "core/status.h"
#include "google/protobuf/text_format.h"
#include "model/checkpoint_layout.h"
#include "model/safetensors.h"
#include "spdlog/spdlog.h"

namespace dlrm::model {
namespace {

namespace fs = std::filesystem;

constexpr char kManifest[] = "MANIFEST.json";
constexpr char kConfig[] = "config.textproto";
// The RocksDB tier's checkpoint (rows and optimizer state of the
// STORAGE_ROCKSDB tables), present only when a table uses it.
constexpr char kRocksDb[] = "rocksdb";
constexpr char kPlan[] = "plan.txt";

// The directory holding `path` ("." for a bare name).
std::string ParentOf(const std::string& path) {
  const fs::path parent = fs::path(path).lexically_normal().parent_path();
  return parent.empty() ? "." : parent.string();
}

std::string LayerName(const char* mlp, size_t layer, const char* what) {
  return absl::StrCat(mlp, ".", layer, ".", what);
}

std::string TableWeightName(const TableConfig& table) {
  return absl::StrCat("embedding_bags.", table.name(), ".weight");
}

// WriteWeights' tables of a one-process model: host tables in place, the
// others (RocksDB, device memory) gathered through their store.
TableWeightsFn ModelTables(Model& m) {
  return
      [&m](int k, std::vector<float>* scratch) -> absl::StatusOr<const float*> {
        if (embedding::EmbeddingTable* t = m.WholeHostTable(k)) {
          return t->weights();
        }
        // One rank: no collective behind the gather.
        RETURN_IF_ERROR(m.GatherTable(k, scratch));
        return scratch->data();
      };
}

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
        x.pooling() != y.pooling()) {
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
  if (!fs::exists(dir / kManifest)) {
    return absl::NotFoundError(absl::StrCat("no checkpoint in ", dir.string(),
                                            " (no ", kManifest, ")"));
  }
  ASSIGN_OR_RETURN(std::string text,
                   ReadFile(*file_system, (dir / kConfig).string()));
  ASSIGN_OR_RETURN(ModelConfig config, ParseModelConfigText(text));
  return NormalizeModelConfig(std::move(config));
}

// The one-process format holds every table whole: a model of one rank
// whose every table is whole on it (Model::Create(config)'s plan).
absl::Status CheckWholeTables(Model& model) {
  for (int k = 0; k < model.config().tables_size(); ++k) {
    if (model.world_size() != 1 || model.WholeStore(k) == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          "a one-process export needs every table whole on one rank; "
          "table ",
          model.config().tables(k).name(), " is sharded over ",
          model.world_size(), " rank(s)"));
    }
  }
  return absl::OkStatus();
}

// A test hook that stands for a slow disk: DLRM_TEST_CHECKPOINT_DELAY_MS
// milliseconds of sleep after each file a save writes, so that a test can
// kill the process in the middle of a save (tests/server_process_test.cc).
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
// learns rank 0's commit (tests/launch_test.cc).
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
  ASSIGN_OR_RETURN(
      r.tables, TableRestore::Stage(model, dir, saved, layout, weights_only));

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

}  // namespace

absl::Status WriteTextFile(const std::string& path, const std::string& text,
                           FileSystem* file_system) {
  return WriteFile(*file_system, path, text);
}

absl::Status SyncDirectory(const std::string& dir, FileSystem* file_system) {
  return file_system->SyncDirectory(dir);
}

std::string TemporaryPath(const std::string& path) {
  return absl::StrCat(path, ".tmp-", ::getpid());
}

absl::Status CommitDirectory(const std::string& tmp_name,
                             const std::string& dir_name,
                             FileSystem* file_system) {
  const fs::path tmp(tmp_name);
  const fs::path dir = fs::path(dir_name).lexically_normal();
  const std::string parent = ParentOf(dir.string());
  std::error_code ec;
  const bool replacing = fs::exists(dir, ec);
  if (replacing) {
    const absl::Status swapped =
        file_system->Exchange(tmp.string(), dir.string());
    if (swapped.ok()) {
      // One atomic swap: `dir` is the old or the new checkpoint at every
      // moment; `tmp` now holds the old one.
      RETURN_IF_ERROR(file_system->SyncDirectory(parent));
      if (const absl::Status s = file_system->RemoveAll(tmp.string());
          !s.ok()) {
        spdlog::warn("removing the replaced checkpoint: {}", s.ToString());
      }
      return absl::OkStatus();
    }
    if (!absl::IsUnimplemented(swapped)) return swapped;
  }
  // A file system without RENAME_EXCHANGE (or no old checkpoint): between
  // the two renames `dir` is missing; the old one is put back if the second
  // fails, or by CleanPartialCheckpoints after a crash there.
  const std::string old = dir.string() + ".old-" + std::to_string(::getpid());
  if (replacing) {
    if (const absl::Status s = file_system->Rename(dir.string(), old);
        !s.ok()) {
      return absl::Status(s.code(),
                          absl::StrCat("cannot move the old ", dir.string(),
                                       " aside: ", s.message()));
    }
  }
  if (const absl::Status s = file_system->Rename(tmp.string(), dir.string());
      !s.ok()) {
    if (replacing) {
      if (const absl::Status back = file_system->Rename(old, dir.string());
          !back.ok()) {
        spdlog::error(
            "cannot put {} back after a failed save ({}); the next start "
            "puts it back",
            old, back.ToString());
      }
    }
    return s;
  }
  RETURN_IF_ERROR(file_system->SyncDirectory(parent));
  if (replacing) {
    if (const absl::Status s = file_system->RemoveAll(old); !s.ok()) {
      spdlog::warn("removing the replaced checkpoint: {}", s.ToString());
    }
  }
  return absl::OkStatus();
}

absl::Status CommitFile(const std::string& tmp, const std::string& path,
                        FileSystem* file_system) {
  RETURN_IF_ERROR(file_system->Rename(tmp, path));
  return file_system->SyncDirectory(ParentOf(path));
}

std::vector<TableTensor> TableTensors(const std::string& base,
                                      embedding::EmbeddingTable& t,
                                      bool with_weight) {
  std::vector<TableTensor> out;
  if (with_weight) {
    out.push_back({base + ".weight", {t.rows(), t.dim()}, t.weights()});
  }
  if (!t.state1().empty()) {
    const bool per_row = static_cast<int64_t>(t.state1().size()) == t.rows();
    out.push_back({base + ".momentum1",
                   per_row ? std::vector<int64_t>{t.rows()}
                           : std::vector<int64_t>{t.rows(), t.dim()},
                   t.state1().data()});
  }
  if (!t.state2().empty()) {
    out.push_back(
        {base + ".momentum2", {t.rows(), t.dim()}, t.state2().data()});
  }
  return out;
}

namespace {

// A host-memory copy of `store`'s rows, optimizer state and step (a shard
// in device memory, written like one in host memory).
absl::StatusOr<std::unique_ptr<embedding::HostStore>> HostCopy(
    embedding::EmbeddingStore& store) {
  const embedding::TableSpec& spec = store.spec();
  auto copy = std::make_unique<embedding::HostStore>(spec);
  const int64_t floats =
      spec.dim + embedding::StateFloatsPerRow(spec.optimizer, spec.dim);
  constexpr int64_t kChunkRows = 4096;
  std::vector<float> records;
  for (int64_t begin = 0; begin < spec.rows; begin += kChunkRows) {
    const int64_t count = std::min(kChunkRows, spec.rows - begin);
    records.resize(count * floats);
    RETURN_IF_ERROR(store.ReadRows(begin, count, records.data()));
    RETURN_IF_ERROR(copy->WriteRows(begin, count, records.data()));
  }
  copy->set_step(store.step());
  return copy;
}

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
  // Host copies of the shards in device memory, alive until written.
  std::vector<std::unique_ptr<embedding::HostStore>> copies;
  for (const Model::ShardState& s : model.LocalShards()) {
    if (model.plan().tables[s.table].kind == SHARDING_DATA_PARALLEL &&
        rank != 0) {
      continue;
    }
    embedding::EmbeddingTable* rows = s.storage;
    if (rows == nullptr) {
      // On RocksDB: below.
      if (s.store->memory_space() != MemorySpace::kDevice) continue;
      ASSIGN_OR_RETURN(copies.emplace_back(), HostCopy(*s.store));
      rows = &copies.back()->table();
    }
    const std::string base = ShardBase(config, s.table, s.shard);
    for (const TableTensor& t :
         TableTensors(base, *rows, /*with_weight=*/true)) {
      tensors.push_back({t.name, t.shape, t.data});
    }
    meta["table_step." + base] = std::to_string(rows->step());
  }
  RETURN_IF_ERROR(WriteSafetensors((tmp / RankFileName(rank)).string(), tensors,
                                   meta, file_system));
  TestOnlyDelay();
  if (model.HasRocksDbShards()) {
    // RocksDB's checkpoint, written through RocksDB's own file system: its
    // files are checksummed like the others.
    RETURN_IF_ERROR(
        model.CheckpointRows((tmp / RankRocksDbDir(rank)).string()));
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

// Removes what a failed save left under `path`; a failure is only logged
// (CleanPartialCheckpoints removes it at the next start).
void RemoveLeftover(const std::string& path, FileSystem* file_system) {
  if (const absl::Status s = file_system->RemoveAll(path); !s.ok()) {
    spdlog::warn("cannot remove {} after a failed save: {}", path,
                 s.ToString());
  }
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

// ------------------------------------------------------------------ weights

std::vector<TensorSpec> WeightSpecs(const ModelConfig& config) {
  std::vector<TensorSpec> specs;
  auto add_mlp = [&specs](const char* prefix, int64_t in,
                          const google::protobuf::RepeatedField<int32_t>& w) {
    for (int i = 0; i < w.size(); ++i) {
      specs.push_back({LayerName(prefix, i, "weight"), {w.Get(i), in}});
      specs.push_back({LayerName(prefix, i, "bias"), {w.Get(i)}});
      in = w.Get(i);
    }
  };
  add_mlp("bottom_mlp", config.num_dense_features(), config.bottom_mlp());
  const int64_t width = InteractionOutputDim(config);
  if (config.interaction() == INTERACTION_DCN) {
    const int64_t rank = config.dcn_low_rank_dim();
    for (int l = 0; l < config.dcn_num_layers(); ++l) {
      specs.push_back(
          {LayerName("interaction.crossnet", l, "V"), {rank, width}});
      specs.push_back(
          {LayerName("interaction.crossnet", l, "W"), {width, rank}});
      specs.push_back({LayerName("interaction.crossnet", l, "bias"), {width}});
    }
  }
  add_mlp("top_mlp", width, config.top_mlp());
  for (const TableConfig& t : config.tables()) {
    specs.push_back({TableWeightName(t), {t.rows(), t.dim()}});
  }
  return specs;
}

absl::StatusOr<ExportInfo> WriteWeights(
    const std::string& path, const ModelConfig& config,
    const std::vector<dense::ParamRef>& dense, int64_t step,
    const TableWeightsFn& table, FileSystem* file_system) {
  std::vector<TensorSpec> specs = WeightSpecs(config);
  // The dense parameters are the specs' first tensors, in their order.
  absl::Status status;
  if (dense.size() + config.tables_size() != specs.size()) {
    status = absl::InternalError(
        absl::StrCat("weights export: ", dense.size(), " dense parameters, ",
                     specs.size() - config.tables_size(), " expected"));
  }
  for (size_t i = 0; status.ok() && i < dense.size(); ++i) {
    int64_t size = 1;
    for (const int64_t d : specs[i].shape) size *= d;
    if (dense[i].name != specs[i].name || dense[i].size != size) {
      status = absl::InternalError(absl::StrCat(
          "weights export: dense parameter ", i, " is ", dense[i].name, " of ",
          dense[i].size, " floats, expected ", specs[i].name, " of ", size));
    }
  }
  ExportInfo info;
  info.step = step;
  info.tensors = static_cast<int64_t>(specs.size());
  if (status.ok()) status = file_system->CreateDirectories(ParentOf(path));
  std::unique_ptr<SafetensorsWriter> writer;
  if (status.ok()) {
    absl::StatusOr<std::unique_ptr<SafetensorsWriter>> created =
        SafetensorsWriter::Create(
            path, std::move(specs),
            {{"format", "dlrm-server"}, {"step", std::to_string(step)}},
            file_system);
    status = created.status();
    if (status.ok()) writer = *std::move(created);
  }
  for (const dense::ParamRef& p : dense) {
    if (!status.ok()) break;
    status = writer->Append(p.value);
  }
  std::vector<float> scratch;
  for (int k = 0; k < config.tables_size(); ++k) {
    absl::StatusOr<const float*> weights = table(k, &scratch);
    if (!status.ok()) continue;
    status = weights.status();
    if (status.ok()) status = writer->Append(*weights);
  }
  if (status.ok()) status = writer->Finish();
  RETURN_IF_ERROR(status);
  info.bytes = writer->bytes();
  return info;
}

absl::StatusOr<ExportInfo> ExportSafetensors(Model& model,
                                             const std::string& path,
                                             FileSystem* file_system) {
  RETURN_IF_ERROR(CheckWholeTables(model));
  const std::string tmp = TemporaryPath(path);
  absl::StatusOr<ExportInfo> info =
      WriteWeights(tmp, model.config(), model.dense_params(), model.steps(),
                   ModelTables(model), file_system);
  if (info.ok()) {
    const absl::Status committed = CommitFile(tmp, path, file_system);
    if (!committed.ok()) info = committed;
  }
  if (!info.ok()) RemoveLeftover(tmp, file_system);
  return info;
}

// ---------------------------------------------------------------- manifests

namespace {

constexpr char kManifestCrcKey[] = "manifest_crc32c";
constexpr int kManifestVersion = 2;

std::string Hex32(uint32_t v) { return absl::StrFormat("%08x", v); }

// The manifest's own checksum: the CRC-32C of its JSON (2-space indent,
// keys sorted, as nlohmann prints it) without the checksum field.
uint32_t ManifestCrc(nlohmann::json json) {
  json.erase(kManifestCrcKey);
  const std::string text = json.dump(2);
  return Crc32c(text.data(), text.size());
}

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

absl::StatusOr<Manifest> ParseManifest(
    const nlohmann::json& json, const fs::path& path,
    const std::function<absl::Status(const std::string&)>& damaged);

}  // namespace

absl::StatusOr<std::pair<uint32_t, int64_t>> FileCrc32c(
    const std::string& path, FileSystem* file_system) {
  ASSIGN_OR_RETURN(std::unique_ptr<SequentialFile> file,
                   file_system->NewSequentialFile(path));
  std::vector<char> buffer(size_t{4} << 20);
  uint32_t crc = 0;
  int64_t bytes = 0;
  for (;;) {
    ASSIGN_OR_RETURN(const size_t n, file->Read(buffer.data(), buffer.size()));
    if (n == 0) break;
    crc = Crc32cExtend(crc, buffer.data(), n);
    bytes += static_cast<int64_t>(n);
  }
  return std::make_pair(crc, bytes);
}

absl::StatusOr<Manifest> WriteManifest(const std::string& dir_name,
                                       const Manifest& fields,
                                       FileSystem* file_system) {
  const fs::path dir(dir_name);
  Manifest m = fields;
  m.version = kManifestVersion;
  m.created_ms = NowMs();
  m.files.clear();
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (!it->is_regular_file()) continue;
    const std::string rel = it->path().lexically_relative(dir).generic_string();
    if (rel == kManifest) continue;
    ASSIGN_OR_RETURN(auto crc, FileCrc32c(it->path().string(), file_system));
    m.files.push_back({rel, crc.second, crc.first, true});
  }
  if (ec) {
    return absl::InternalError(
        absl::StrCat("cannot list ", dir.string(), ": ", ec.message()));
  }
  std::sort(m.files.begin(), m.files.end(),
            [](const ManifestFile& a, const ManifestFile& b) {
              return a.path < b.path;
            });
  nlohmann::json json = {{"format", m.format},
                         {"version", m.version},
                         {"step", m.step},
                         {"world_size", m.world_size},
                         {"created_ms", m.created_ms},
                         {"config", m.config_text},
                         {"sharding_plan", m.sharding_plan},
                         {"files", nlohmann::json::object()}};
  for (const ManifestFile& f : m.files) {
    json["files"][f.path] = {{"bytes", f.bytes}, {"crc32c", Hex32(f.crc32c)}};
  }
  if (!m.job.empty()) {
    // Embedded as an object so the manifest stays readable; text that is
    // not JSON is kept as a string rather than lost.
    nlohmann::json job =
        nlohmann::json::parse(m.job, nullptr, /*allow_exceptions=*/false);
    json["job"] = job.is_discarded() ? nlohmann::json(m.job) : job;
  }
  json[kManifestCrcKey] = Hex32(ManifestCrc(json));
  RETURN_IF_ERROR(WriteTextFile((dir / kManifest).string(), json.dump(2) + "\n",
                                file_system));
  RETURN_IF_ERROR(SyncDirectory(dir.string(), file_system));
  return m;
}

absl::StatusOr<Manifest> ReadManifest(const std::string& dir_name,
                                      FileSystem* file_system) {
  const fs::path path = fs::path(dir_name) / kManifest;
  if (!fs::exists(path)) {
    return absl::NotFoundError(
        absl::StrCat("no checkpoint in ", dir_name, " (no ", kManifest, ")"));
  }
  absl::StatusOr<std::string> text = ReadFile(*file_system, path.string());
  if (!text.ok()) {
    return absl::DataLossError(absl::StrCat("cannot read ", path.string(), ": ",
                                            text.status().message()));
  }
  const nlohmann::json json =
      nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  auto damaged = [&](const std::string& why) -> absl::Status {
    return absl::DataLossError(absl::StrCat(
        "checkpoint manifest ", path.string(), " is damaged: ", why));
  };
  if (!json.is_object()) return damaged("not a JSON object");
  // nlohmann throws on a field of the wrong type; nothing escapes.
  try {
    return ParseManifest(json, path, damaged);
  } catch (const nlohmann::json::exception& e) {
    return damaged(e.what());
  }
}

namespace {

absl::StatusOr<Manifest> ParseManifest(
    const nlohmann::json& json, const fs::path& path,
    const std::function<absl::Status(const std::string&)>& damaged) {
  Manifest m;
  m.version = json.value("version", 0);
  if (json.contains(kManifestCrcKey)) {
    const std::string want = json.value(kManifestCrcKey, "");
    if (want != Hex32(ManifestCrc(json))) {
      return damaged("its own checksum does not match");
    }
  } else if (m.version >= kManifestVersion) {
    return damaged(absl::StrCat("no ", kManifestCrcKey));
  }
  m.format = json.value("format", "");
  m.step = json.value("step", int64_t{0});
  m.world_size = json.value("world_size", 1);
  m.created_ms = json.value("created_ms", int64_t{0});
  m.config_text = json.value("config", "");
  m.sharding_plan = json.value("sharding_plan", "");
  if (const auto job = json.find("job"); job != json.end()) {
    m.job = job->is_string() ? job->get<std::string>() : job->dump();
  }
  if (m.format != kCheckpointFormat && m.format != kLegacyMultiRankFormat) {
    return damaged(absl::StrCat("unknown format \"", m.format, "\""));
  }
  const auto files = json.find("files");
  if (files == json.end() || !files->is_object()) return damaged("no files");
  for (const auto& [name, entry] : files->items()) {
    if (!entry.is_object()) return damaged(absl::StrCat("files.", name));
    ManifestFile f;
    f.path = name;
    f.bytes = entry.value("bytes", int64_t{-1});
    uint32_t crc = 0;
    const std::string hex = entry.value("crc32c", "");
    if (!hex.empty()) {
      if (!absl::SimpleHexAtoi(hex, &crc)) {
        return damaged(absl::StrCat("files.", name, ".crc32c"));
      }
      f.has_crc32c = true;
      f.crc32c = crc;
    }
    // Version 1 listed the RocksDB directory as one entry with its total
    // size; only regular files are checked.
    if (m.version < kManifestVersion && name == kRocksDb) continue;
    m.files.push_back(std::move(f));
  }
  if (m.created_ms == 0) {
    std::error_code ec;
    const auto mtime = fs::last_write_time(path, ec);
    if (!ec) {
      m.created_ms =
          std::chrono::duration_cast<std::chrono::milliseconds>(
              std::chrono::file_clock::to_sys(mtime).time_since_epoch())
              .count();
    }
  }
  return m;
}

}  // namespace

absl::Status VerifyCheckpointFiles(
    const std::string& dir_name, const Manifest& manifest,
    const std::function<bool(const std::string&)>& want,
    FileSystem* file_system) {
  const fs::path dir(dir_name);
  for (const ManifestFile& f : manifest.files) {
    if (want && !want(f.path)) continue;
    const fs::path path = dir / f.path;
    std::error_code ec;
    const auto size = fs::file_size(path, ec);
    if (ec) {
      return absl::DataLossError(absl::StrCat("checkpoint file ", path.string(),
                                              " is missing: ", ec.message()));
    }
    if (static_cast<int64_t>(size) != f.bytes) {
      return absl::DataLossError(
          absl::StrCat("checkpoint file ", path.string(), " has ", size,
                       " bytes, the manifest says ", f.bytes));
    }
    if (!f.has_crc32c) continue;
    absl::StatusOr<std::pair<uint32_t, int64_t>> crc =
        FileCrc32c(path.string(), file_system);
    if (!crc.ok()) return absl::DataLossError(crc.status().message());
    if (crc->first != f.crc32c || crc->second != f.bytes) {
      return absl::DataLossError(absl::StrCat(
          "checkpoint file ", path.string(), " is corrupt: CRC-32C ",
          Hex32(crc->first), ", the manifest says ", Hex32(f.crc32c)));
    }
  }
  return absl::OkStatus();
}

// ------------------------------------------------------ periodic checkpoints

namespace {

constexpr char kPeriodicPrefix[] = "ckpt-";

// The step of a periodic checkpoint's name "ckpt-<step>", or -1.
int64_t PeriodicStep(const std::string& name) {
  if (!name.starts_with(kPeriodicPrefix)) return -1;
  const std::string digits = name.substr(sizeof(kPeriodicPrefix) - 1);
  int64_t step = -1;
  if (digits.empty() ||
      !std::all_of(digits.begin(), digits.end(),
                   [](char c) { return c >= '0' && c <= '9'; }) ||
      !absl::SimpleAtoi(digits, &step)) {
    return -1;
  }
  return step;
}

// Names of temporary directories of saves ("<name>.tmp-<pid>") and of
// checkpoints being replaced ("<name>.old-<pid>"); `base` gets <name>.
bool IsTemporary(const std::string& name, const char* marker,
                 std::string* base) {
  const size_t at = name.rfind(marker);
  if (at == std::string::npos || at == 0) return false;
  if (base != nullptr) *base = name.substr(0, at);
  return true;
}

}  // namespace

std::string PeriodicCheckpointName(int64_t step) {
  return absl::StrCat(kPeriodicPrefix, step);
}

std::vector<CheckpointEntry> ListCheckpoints(const std::string& root,
                                             FileSystem* file_system) {
  std::vector<CheckpointEntry> out;
  std::error_code ec;
  for (auto it = fs::directory_iterator(root, ec);
       !ec && it != fs::directory_iterator(); it.increment(ec)) {
    std::error_code ignored;
    if (!it->is_directory(ignored)) continue;
    const std::string name = it->path().filename().string();
    if (IsTemporary(name, ".tmp-", nullptr) ||
        IsTemporary(name, ".old-", nullptr)) {
      continue;
    }
    if (!fs::exists(it->path() / kManifest, ignored)) continue;
    out.push_back({it->path().string(), name,
                   ReadManifest(it->path().string(), file_system)});
  }
  std::sort(out.begin(), out.end(),
            [](const CheckpointEntry& a, const CheckpointEntry& b) {
              if (a.manifest.ok() != b.manifest.ok()) return a.manifest.ok();
              if (!a.manifest.ok()) return a.name < b.name;
              if (a.manifest->created_ms != b.manifest->created_ms) {
                return a.manifest->created_ms > b.manifest->created_ms;
              }
              if (a.manifest->step != b.manifest->step) {
                return a.manifest->step > b.manifest->step;
              }
              return a.name < b.name;
            });
  return out;
}

void CleanPartialCheckpoints(const std::string& root, FileSystem* file_system) {
  std::error_code ec;
  std::vector<fs::path> entries;
  for (auto it = fs::directory_iterator(root, ec);
       !ec && it != fs::directory_iterator(); it.increment(ec)) {
    entries.push_back(it->path());
  }
  auto failure = [](const absl::Status& s) {
    return s.ok() ? std::string() : absl::StrCat(": ", s.message());
  };
  for (const fs::path& path : entries) {
    const std::string name = path.filename().string();
    std::string base;
    if (IsTemporary(name, ".tmp-", &base)) {
      const absl::Status s = file_system->RemoveAll(path.string());
      spdlog::warn(
          "removed {}: an unfinished checkpoint or export (its save never "
          "committed, e.g. the process was killed){}",
          path.string(), failure(s));
    } else if (IsTemporary(name, ".old-", &base)) {
      const fs::path original = path.parent_path() / base;
      std::error_code e;
      if (!fs::exists(original, e)) {
        const absl::Status s =
            file_system->Rename(path.string(), original.string());
        spdlog::warn(
            "put {} back as {}: a crash interrupted its replacement by a "
            "newer save{}",
            path.string(), original.string(), failure(s));
      } else {
        const absl::Status s = file_system->RemoveAll(path.string());
        spdlog::warn("removed {}: a checkpoint already replaced by {}{}",
                     path.string(), original.string(), failure(s));
      }
    }
  }
  if (!entries.empty()) SyncDirectory(root, file_system).IgnoreError();
}

absl::Status PruneCheckpoints(const std::string& root, int keep,
                              FileSystem* file_system) {
  if (keep <= 0) return absl::OkStatus();
  int kept = 0;
  for (const CheckpointEntry& e : ListCheckpoints(root, file_system)) {
    if (PeriodicStep(e.name) < 0) continue;
    if (e.manifest.ok() && kept < keep) {
      ++kept;
      continue;
    }
    // Renamed first, so that a crash halfway through the removal leaves a
    // temporary directory (cleaned at the next start), not a damaged
    // checkpoint.
    const std::string doomed = TemporaryPath(e.dir) + "-pruned";
    if (const absl::Status s = file_system->Rename(e.dir, doomed); !s.ok()) {
      return absl::Status(
          s.code(), absl::StrCat("cannot remove old checkpoint ", e.dir, ": ",
                                 s.message()));
    }
    if (const absl::Status s = file_system->RemoveAll(doomed); !s.ok()) {
      spdlog::warn("removing old checkpoint {}: {}", e.dir, s.ToString());
    }
    spdlog::info("removed old checkpoint {} (keeping the {} newest)", e.dir,
                 keep);
  }
  return absl::OkStatus();
}

}  // namespace dlrm::model
