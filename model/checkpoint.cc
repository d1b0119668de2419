// Checkpoint directories: MANIFEST.json, config.textproto, model.safetensors
// (weights) and optimizer.safetensors (optimizer state and step counts).
#include "model/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/config.h"
#include "core/status.h"
#include "google/protobuf/text_format.h"
#include "model/safetensors.h"

namespace dlrm::model {
namespace {

namespace fs = std::filesystem;

constexpr char kManifest[] = "MANIFEST.json";
constexpr char kConfig[] = "config.textproto";
constexpr char kWeights[] = "model.safetensors";
constexpr char kOptimizer[] = "optimizer.safetensors";
// The RocksDB tier's checkpoint (rows and optimizer state of the
// STORAGE_ROCKSDB tables), present only when a table uses it.
constexpr char kRocksDb[] = "rocksdb";

// Weights [rows, dim] of table `k`, read row by row through its store.
absl::Status ReadTableWeights(DlrmModel& m, int k, std::vector<float>* out) {
  embedding::EmbeddingStore& store = m.store(k);
  const embedding::TableSpec& spec = store.spec();
  std::vector<float> record(
      spec.dim + embedding::StateFloatsPerRow(spec.optimizer, spec.dim));
  out->resize(spec.rows * spec.dim);
  for (int64_t row = 0; row < spec.rows; ++row) {
    RETURN_IF_ERROR(store.ReadRow(row, record.data()));
    std::memcpy(out->data() + row * spec.dim, record.data(),
                sizeof(float) * spec.dim);
  }
  return absl::OkStatus();
}

// Every weight tensor of the model with its documented name. RocksDB-tier
// tables are read into `buffers` (which must outlive the result); with
// `buffers` null they are left out (restore takes them from the RocksDB
// checkpoint instead).
absl::StatusOr<std::vector<TensorToWrite>> WeightTensors(
    DlrmModel& m, std::vector<std::vector<float>>* buffers) {
  std::vector<TensorToWrite> out;
  for (auto [mlp, prefix] :
       {std::pair{&m.bottom(), "bottom_mlp"}, std::pair{&m.top(), "top_mlp"}}) {
    for (size_t i = 0; i < mlp->layers().size(); ++i) {
      dense::Linear& l = mlp->layers()[i];
      out.push_back({absl::StrCat(prefix, ".", i, ".weight"),
                     {l.out(), l.in()},
                     l.weight()});
      out.push_back(
          {absl::StrCat(prefix, ".", i, ".bias"), {l.out()}, l.bias()});
    }
  }
  const ModelConfig& c = m.config();
  if (buffers != nullptr) buffers->resize(m.tables().size());
  for (size_t k = 0; k < m.tables().size(); ++k) {
    const std::string name =
        absl::StrCat("embedding_bags.", c.tables(k).name(), ".weight");
    const TableConfig& tc = c.tables(k);
    if (m.IsHostTable(k)) {
      out.push_back({name, {tc.rows(), tc.dim()}, m.tables()[k]->weights()});
    } else if (buffers != nullptr) {
      RETURN_IF_ERROR(ReadTableWeights(m, k, &(*buffers)[k]));
      out.push_back({name, {tc.rows(), tc.dim()}, (*buffers)[k].data()});
    }
  }
  return out;
}

// Optimizer state tensors (dense and per host-memory table), possibly none
// for SGD. RocksDB-tier tables keep theirs in the RocksDB checkpoint.
std::vector<TensorToWrite> OptimizerTensors(DlrmModel& m) {
  std::vector<TensorToWrite> out;
  for (const dense::ParamRef& p : m.dense_optimizer().State()) {
    out.push_back({p.name, {p.size}, p.value});
  }
  const ModelConfig& c = m.config();
  for (size_t k = 0; k < m.tables().size(); ++k) {
    if (!m.IsHostTable(k)) continue;
    for (const TableTensor& s :
         TableTensors(absl::StrCat("embedding_bags.", c.tables(k).name()),
                      *m.tables()[k], /*with_weight=*/false)) {
      out.push_back({s.name, s.shape, s.data});
    }
  }
  return out;
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
    // Rows move between tiers only through an export; not on restore.
    if (x.storage() != y.storage()) {
      return mismatch(absl::StrCat("tables[", i, "] (", y.name(), ").storage"));
    }
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
  if (a.dense_optimizer().type() != b.dense_optimizer().type()) {
    return mismatch("dense_optimizer.type");
  }
  if (a.sparse_optimizer().type() != b.sparse_optimizer().type()) {
    return mismatch("sparse_optimizer.type");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(absl::StrCat("cannot read ", path.string()));
  }
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

absl::StatusOr<ModelConfig> ReadCheckpointConfig(const fs::path& dir) {
  if (!fs::exists(dir / kManifest)) {
    return absl::NotFoundError(absl::StrCat("no checkpoint in ", dir.string(),
                                            " (no ", kManifest, ")"));
  }
  ASSIGN_OR_RETURN(std::string text, ReadFile(dir / kConfig));
  ASSIGN_OR_RETURN(ModelConfig config, ParseModelConfigText(text));
  return NormalizeModelConfig(std::move(config));
}

// Copies every tensor listed in `wanted` from `file` after checking all of
// them exist with the right shapes, so a bad file changes nothing.
absl::Status CopyAll(const SafetensorsFile& file,
                     const std::vector<TensorToWrite>& wanted) {
  std::vector<std::span<const float>> found;
  for (const auto& t : wanted) {
    ASSIGN_OR_RETURN(std::span<const float> data, file.Get(t.name, t.shape));
    found.push_back(data);
  }
  for (size_t i = 0; i < wanted.size(); ++i) {
    std::memcpy(const_cast<float*>(wanted[i].data), found[i].data(),
                found[i].size_bytes());
  }
  return absl::OkStatus();
}

// A step count from safetensors metadata; 0 when absent or malformed.
int64_t ParseStep(const std::map<std::string, std::string>& meta,
                  const std::string& key) {
  auto it = meta.find(key);
  int64_t step = 0;
  if (it == meta.end() || !absl::SimpleAtoi(it->second, &step)) return 0;
  return step;
}

absl::StatusOr<CheckpointInfo> Restore(DlrmModel& model, const fs::path& dir,
                                       bool weights_only) {
  ASSIGN_OR_RETURN(ModelConfig saved, ReadCheckpointConfig(dir));
  RETURN_IF_ERROR(CheckSameArchitecture(saved, model.config()));
  ASSIGN_OR_RETURN(auto weights, SafetensorsFile::Open(dir / kWeights));
  ASSIGN_OR_RETURN(std::vector<TensorToWrite> weight_tensors,
                   WeightTensors(model, /*buffers=*/nullptr));
  std::unique_ptr<SafetensorsFile> optimizer;
  // Check every file fully before anything changes.
  for (const auto& t : weight_tensors) {
    RETURN_IF_ERROR(weights->Get(t.name, t.shape).status());
  }
  if (!weights_only) {
    ASSIGN_OR_RETURN(optimizer, SafetensorsFile::Open(dir / kOptimizer));
    for (const auto& t : OptimizerTensors(model)) {
      RETURN_IF_ERROR(optimizer->Get(t.name, t.shape).status());
    }
  }
  // The RocksDB tier is swapped in whole (or not at all) before the
  // checked copies, which cannot fail.
  if (model.HasRocksDbTables()) {
    RETURN_IF_ERROR(model.RestoreRows((dir / kRocksDb).string()));
  }
  RETURN_IF_ERROR(CopyAll(*weights, weight_tensors));
  CheckpointInfo info;
  info.step = ParseStep(weights->metadata(), "step");
  model.set_steps(info.step);
  if (!weights_only) {
    RETURN_IF_ERROR(CopyAll(*optimizer, OptimizerTensors(model)));
    const auto& meta = optimizer->metadata();
    model.dense_optimizer().set_step(ParseStep(meta, "dense_optimizer_step"));
    for (size_t k = 0; k < model.tables().size(); ++k) {
      // RocksDB-tier tables got their step from the RocksDB checkpoint.
      if (!model.IsHostTable(k)) continue;
      model.tables()[k]->set_step(ParseStep(
          meta, absl::StrCat("table_step.", model.config().tables(k).name())));
    }
  }
  for (const auto& entry : fs::recursive_directory_iterator(dir)) {
    if (entry.is_regular_file()) info.bytes += entry.file_size();
  }
  return info;
}

}  // namespace

absl::Status WriteTextFile(const std::string& path_name,
                           const std::string& text) {
  const fs::path path(path_name);
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) {
    return absl::InternalError(absl::StrCat("cannot write ", path.string()));
  }
  bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  ok = std::fflush(f) == 0 && ok;
  ok = ::fsync(::fileno(f)) == 0 && ok;
  ok = std::fclose(f) == 0 && ok;
  if (!ok) return absl::InternalError(absl::StrCat("writing ", path.string()));
  return absl::OkStatus();
}

absl::Status SyncDirectory(const std::string& dir_name) {
  const fs::path dir(dir_name);
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0)
    return absl::InternalError(absl::StrCat("cannot open ", dir.string()));
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0)
    return absl::InternalError(absl::StrCat("cannot sync ", dir.string()));
  return absl::OkStatus();
}

absl::Status CommitDirectory(const std::string& tmp_name,
                             const std::string& dir_name) {
  const fs::path tmp(tmp_name);
  const fs::path dir = fs::path(dir_name).lexically_normal();
  std::error_code ec;
  const fs::path old = dir.string() + ".old-" + std::to_string(::getpid());
  if (fs::exists(dir)) {
    fs::rename(dir, old, ec);
    if (ec) {
      return absl::InternalError(absl::StrCat(
          "cannot move the old ", dir.string(), ": ", ec.message()));
    }
  }
  fs::rename(tmp, dir, ec);
  if (ec) {
    return absl::InternalError(
        absl::StrCat("cannot rename into ", dir.string(), ": ", ec.message()));
  }
  RETURN_IF_ERROR(SyncDirectory(dir.parent_path().string()));
  fs::remove_all(old, ec);
  return absl::OkStatus();
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

absl::StatusOr<CheckpointInfo> SaveCheckpoint(DlrmModel& model,
                                              const std::string& dir_name) {
  const fs::path dir = fs::absolute(dir_name).lexically_normal();
  const fs::path tmp = dir.string() + ".tmp-" + std::to_string(::getpid());
  std::error_code ec;
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp, ec);
  if (ec) {
    return absl::InternalError(
        absl::StrCat("cannot create ", tmp.string(), ": ", ec.message()));
  }
  const std::string step = std::to_string(model.steps());
  {
    std::vector<std::vector<float>> buffers;
    ASSIGN_OR_RETURN(std::vector<TensorToWrite> tensors,
                     WeightTensors(model, &buffers));
    RETURN_IF_ERROR(
        WriteSafetensors((tmp / kWeights).string(), tensors,
                         {{"format", "dlrm-server"}, {"step", step}}));
  }
  std::map<std::string, std::string> meta = {
      {"step", step},
      {"dense_optimizer_step", std::to_string(model.dense_optimizer().step())}};
  for (size_t k = 0; k < model.tables().size(); ++k) {
    meta[absl::StrCat("table_step.", model.config().tables(k).name())] =
        std::to_string(model.store(k).step());
  }
  RETURN_IF_ERROR(WriteSafetensors((tmp / kOptimizer).string(),
                                   OptimizerTensors(model), meta));
  std::string config_text;
  google::protobuf::TextFormat::PrintToString(model.config(), &config_text);
  RETURN_IF_ERROR(WriteTextFile((tmp / kConfig).string(), config_text));

  nlohmann::json manifest = {{"format", "dlrm-server-checkpoint"},
                             {"version", 1},
                             {"step", model.steps()}};
  CheckpointInfo info;
  info.step = model.steps();
  for (const char* name : {kWeights, kOptimizer, kConfig}) {
    const auto bytes = fs::file_size(tmp / name);
    manifest["files"][name] = {{"bytes", bytes}};
    info.bytes += bytes;
  }
  if (model.HasRocksDbTables()) {
    RETURN_IF_ERROR(model.CheckpointRows((tmp / kRocksDb).string()));
    int64_t bytes = 0;
    for (const auto& entry : fs::recursive_directory_iterator(tmp / kRocksDb)) {
      if (entry.is_regular_file()) bytes += entry.file_size();
    }
    manifest["files"][kRocksDb] = {{"bytes", bytes}};
    info.bytes += bytes;
  }
  // The manifest is written last: its presence marks a complete checkpoint.
  RETURN_IF_ERROR(
      WriteTextFile((tmp / kManifest).string(), manifest.dump(2) + "\n"));
  RETURN_IF_ERROR(SyncDirectory(tmp.string()));

  RETURN_IF_ERROR(CommitDirectory(tmp.string(), dir.string()));
  return info;
}

absl::StatusOr<CheckpointInfo> RestoreCheckpoint(DlrmModel& model,
                                                 const std::string& dir) {
  return Restore(model, dir, /*weights_only=*/false);
}

absl::StatusOr<std::unique_ptr<DlrmModel>> LoadCheckpoint(
    const std::string& dir, bool weights_only) {
  ASSIGN_OR_RETURN(ModelConfig config, ReadCheckpointConfig(dir));
  ASSIGN_OR_RETURN(std::unique_ptr<DlrmModel> model, DlrmModel::Create(config));
  RETURN_IF_ERROR(Restore(*model, dir, weights_only).status());
  return model;
}

absl::Status ExportSafetensors(DlrmModel& model, const std::string& path) {
  std::vector<std::vector<float>> buffers;
  ASSIGN_OR_RETURN(std::vector<TensorToWrite> tensors,
                   WeightTensors(model, &buffers));
  return WriteSafetensors(
      path, tensors,
      {{"format", "dlrm-server"}, {"step", std::to_string(model.steps())}});
}

}  // namespace dlrm::model
