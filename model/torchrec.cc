// TorchRec state_dict names and the conversions (docs/torchrec.md).
#include "model/torchrec.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/config.h"
#include "core/status.h"
#include "dense/param_names.h"
#include "embedding/dynamic_store.h"
#include "model/torchrec_mc.h"
#include "model/weights_export.h"

namespace dlrm::model {
namespace {

namespace fs = std::filesystem;

constexpr char kTablePrefix[] =
    "sparse_arch.embedding_bag_collection.embedding_bags.";
// Rows copied through a table's store at a time.
constexpr int64_t kChunkRows = 4096;
// Problems listed in one error message; the rest are counted.
constexpr size_t kMaxListed = 20;

embedding::DynamicStore* DynamicStoreOf(Model& model, int k) {
  return dynamic_cast<embedding::DynamicStore*>(model.shards().WholeStore(k));
}

std::string Shape(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// A one-process model: every table whole on its one rank.
absl::Status CheckOneProcess(Model& model, const char* what) {
  for (int k = 0; k < model.config().tables_size(); ++k) {
    if (model.world_size() != 1 || model.shards().WholeStore(k) == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat("the TorchRec ", what,
                       " needs a one-process model holding every "
                       "table whole; table ",
                       model.config().tables(k).name(), " is sharded over ",
                       model.world_size(), " rank(s)"));
    }
  }
  return absl::OkStatus();
}

// Copies the [out, in] weight `from` to `to`, moving the pair columns
// (those after the first d): TorchRec's column d + order[p] is our column
// d + p. `to_torchrec` picks the direction.
void CopyPermuted(const float* from, float* to, int64_t out, int64_t in,
                  int64_t d, const std::vector<int>& order, bool to_torchrec) {
  for (int64_t o = 0; o < out; ++o) {
    const float* f = from + o * in;
    float* t = to + o * in;
    std::copy(f, f + d, t);
    for (size_t p = 0; p < order.size(); ++p) {
      const int64_t ours = d + static_cast<int64_t>(p);
      const int64_t theirs = d + order[p];
      if (to_torchrec) {
        t[theirs] = f[ours];
      } else {
        t[ours] = f[theirs];
      }
    }
  }
}

}  // namespace

absl::Status CheckTorchRecCompatible(const ModelConfig& config) {
  if (config.interaction() != INTERACTION_DOT &&
      config.interaction() != INTERACTION_DCN) {
    return absl::FailedPreconditionError(absl::StrCat(
        "interaction ", Interaction_Name(config.interaction()),
        " has no TorchRec counterpart: torchrec.models.dlrm.DLRM has the dot "
        "interaction (INTERACTION_DOT), DLRM_DCN the low-rank cross network "
        "(INTERACTION_DCN)"));
  }
  if (config.bottom_mlp_size() == 0) {
    return absl::FailedPreconditionError(
        "bottom_mlp is empty; TorchRec's DenseArch needs at least one layer");
  }
  const int d = config.bottom_mlp(config.bottom_mlp_size() - 1);
  for (int i = 0; i < config.tables_size(); ++i) {
    if (config.tables(i).dim() != d) {
      return absl::FailedPreconditionError(absl::StrCat(
          "tables[", i, "] (", config.tables(i).name(), ") has dim ",
          config.tables(i).dim(),
          "; TorchRec's DLRM needs every table's embedding_dim equal to the "
          "bottom MLP's output (bottom_mlp's last width, ",
          d, ")"));
    }
  }
  if (config.top_mlp_size() < 2) {
    return absl::FailedPreconditionError(absl::StrCat(
        "top_mlp has ", config.top_mlp_size(),
        " layer; TorchRec's OverArch needs at least 2 (an MLP and the final "
        "Linear)"));
  }
  return absl::OkStatus();
}

std::vector<int> TorchRecDotPairOrder(int n) {
  std::vector<int> order;
  order.reserve(static_cast<size_t>(n) * (n - 1) / 2);
  // Ours: pair (i, j), i > j, at i(i-1)/2 + j. TorchRec: pair (j, i) of the
  // upper triangle at j*n - j(j+1)/2 + (i - j - 1).
  for (int i = 1; i < n; ++i) {
    for (int j = 0; j < i; ++j) {
      order.push_back(j * n - j * (j + 1) / 2 + (i - j - 1));
    }
  }
  return order;
}

absl::StatusOr<std::vector<TorchRecTensor>> TorchRecTensors(
    const ModelConfig& config) {
  RETURN_IF_ERROR(CheckTorchRecCompatible(config));
  std::vector<TorchRecTensor> out;
  for (const TableConfig& t : config.tables()) {
    out.push_back({absl::StrCat(kTablePrefix, t.name(), ".weight"),
                   TableWeightName(t),
                   {t.rows(), t.dim()}});
  }
  // Layer `layer` of our MLP `prefix`, TorchRec's Linear `theirs`.
  auto linear = [&out](const std::string& theirs, const char* prefix, int layer,
                       int64_t o, int64_t i) {
    out.push_back({theirs + "weight",
                   dense::ParamName(prefix, layer, dense::kWeight),
                   {o, i}});
    out.push_back(
        {theirs + "bias", dense::ParamName(prefix, layer, dense::kBias), {o}});
  };
  int64_t in = config.num_dense_features();
  for (int i = 0; i < config.bottom_mlp_size(); ++i) {
    linear(absl::StrCat("dense_arch.model._mlp.", i, "._linear."),
           dense::kBottomMlpPrefix, i, config.bottom_mlp(i), in);
    in = config.bottom_mlp(i);
  }
  const int64_t width = InteractionOutputDim(config);
  if (config.interaction() == INTERACTION_DCN) {
    // Ours per layer: V, W, bias (InteractionParamSpecs); TorchRec's
    // ParameterLists, each layer by layer: W, then V, then bias.
    const std::vector<DenseParamSpec> ours = InteractionParamSpecs(config);
    const int layers = config.dcn_num_layers();
    for (const auto& [list, k] :
         {std::pair{"W_kernels", 1}, std::pair{"V_kernels", 0},
          std::pair{"bias", 2}}) {
      for (int l = 0; l < layers; ++l) {
        const DenseParamSpec& p = ours[3 * l + k];
        out.push_back({absl::StrCat("inter_arch.crossnet.", list, ".", l),
                       p.name, p.shape});
      }
    }
  }
  in = width;
  const int top = config.top_mlp_size();
  for (int i = 0; i < top; ++i) {
    // OverArch: Sequential(MLP(all but the last layer), Linear(the last)).
    const std::string theirs =
        i + 1 < top ? absl::StrCat("over_arch.model.0._mlp.", i, "._linear.")
                    : std::string("over_arch.model.1.");
    linear(theirs, dense::kTopMlpPrefix, i, config.top_mlp(i), in);
    in = config.top_mlp(i);
  }
  if (config.interaction() == INTERACTION_DOT) {
    for (TorchRecTensor& t : out) {
      if (t.name == dense::ParamName(dense::kTopMlpPrefix, 0, dense::kWeight)) {
        t.pair_columns_permuted = true;
      }
    }
  }
  for (int k = 0; k < config.tables_size(); ++k) {
    if (config.tables(k).dynamic()) AddMcTensors(config.tables(k), k, &out);
  }
  return out;
}

absl::Status CheckTorchRecStateDict(const SafetensorsFile& file,
                                    const ModelConfig& config) {
  ASSIGN_OR_RETURN(const std::vector<TorchRecTensor> tensors,
                   TorchRecTensors(config));
  std::vector<std::string> problems;
  std::set<std::string> expected;
  for (const TorchRecTensor& t : tensors) {
    expected.insert(t.torchrec_name);
    const absl::StatusOr<std::vector<int64_t>> shape =
        file.Shape(t.torchrec_name);
    if (!shape.ok()) {
      problems.push_back(absl::StrCat("missing tensor ", t.torchrec_name, " ",
                                      Shape(t.shape), " (our ", t.name, ")"));
    } else if (*shape != t.shape) {
      problems.push_back(absl::StrCat("tensor ", t.torchrec_name, " has shape ",
                                      Shape(*shape), ", expected ",
                                      Shape(t.shape), " (our ", t.name, ")"));
    } else if (const Dtype dtype = *file.DtypeOf(t.torchrec_name);
               dtype != t.dtype) {
      problems.push_back(absl::StrCat(
          "tensor ", t.torchrec_name, " has dtype ", DtypeName(dtype),
          ", expected ", DtypeName(t.dtype), " (our ", t.name,
          t.dtype == Dtype::kF32
              ? "; convert the state_dict with .float() before saving it)"
              : ")"));
    }
  }
  for (const std::string& name : file.Names()) {
    if (expected.count(name) > 0) continue;
    std::string problem =
        absl::StrCat("unexpected tensor ", name, ": a TorchRec DLRM",
                     config.interaction() == INTERACTION_DCN ? "_DCN" : "",
                     " of this config has no such key");
    if (name.starts_with(kTorchRecMcPrefix)) {
      absl::StrAppend(
          &problem,
          " (managed-collision state imports into a dynamic table only, "
          "with the buffers of its eviction: _mch_last_access_iter for "
          "EVICT_LRU, _mch_counts for EVICT_LFU)");
    }
    for (const std::string& e : expected) {
      if (name.size() > e.size() && name.ends_with("." + e)) {
        absl::StrAppend(&problem, " (", e,
                        " with a prefix: scripts/torchrec_convert.py drops "
                        "\"module.\" and \"_orig_mod.\")");
        break;
      }
    }
    problems.push_back(std::move(problem));
  }
  if (problems.empty()) return absl::OkStatus();
  const size_t listed = std::min(problems.size(), kMaxListed);
  std::string message = absl::StrCat(
      "the TorchRec state_dict does not match the model config (",
      problems.size(), " problem", problems.size() == 1 ? "" : "s",
      "): ", absl::StrJoin(problems.begin(), problems.begin() + listed, "; "));
  if (listed < problems.size()) {
    absl::StrAppend(&message, "; and ", problems.size() - listed, " more");
  }
  return absl::InvalidArgumentError(message);
}

absl::Status ImportTorchRecWeights(const SafetensorsFile& file, Model& model,
                                   TorchRecImportReport* report) {
  const ModelConfig& config = model.config();
  RETURN_IF_ERROR(CheckOneProcess(model, "import"));
  RETURN_IF_ERROR(CheckTorchRecStateDict(file, config));
  ASSIGN_OR_RETURN(const std::vector<TorchRecTensor> tensors,
                   TorchRecTensors(config));
  // Dynamic tables' maps, rebuilt and checked before anything changes.
  std::map<int, RebuiltMap> maps;
  TorchRecImportReport counted;
  for (int k = 0; k < config.tables_size(); ++k) {
    if (!config.tables(k).dynamic()) continue;
    embedding::DynamicStore* store = DynamicStoreOf(model, k);
    if (store == nullptr) {
      return absl::InternalError(absl::StrCat("TorchRec import: dynamic table ",
                                              config.tables(k).name(),
                                              " has no id map"));
    }
    ASSIGN_OR_RETURN(RebuiltMap rebuilt,
                     RebuildMap(file, tensors, k, *store, &counted));
    maps.emplace(k, std::move(rebuilt));
  }
  if (report != nullptr) *report = counted;
  std::map<std::string, const TorchRecTensor*> by_ours;
  for (const TorchRecTensor& t : tensors) by_ours[t.name] = &t;

  // Dense parameters: every lookup below was checked above.
  const int d = config.bottom_mlp(config.bottom_mlp_size() - 1);
  const std::vector<int> order = TorchRecDotPairOrder(config.tables_size() + 1);
  for (const dense::ParamRef& p : model.dense_params()) {
    auto it = by_ours.find(p.name);
    if (it == by_ours.end()) {
      return absl::InternalError(
          absl::StrCat("TorchRec import: no TorchRec tensor for ", p.name));
    }
    const TorchRecTensor& t = *it->second;
    ASSIGN_OR_RETURN(std::span<const float> from,
                     file.Get(t.torchrec_name, t.shape));
    if (static_cast<int64_t>(from.size()) != p.size) {
      return absl::InternalError(
          absl::StrCat("TorchRec import: ", p.name, " has ", p.size,
                       " floats, ", t.torchrec_name, " ", from.size()));
    }
    if (t.pair_columns_permuted) {
      CopyPermuted(from.data(), p.value, t.shape[0], t.shape[1], d, order,
                   /*to_torchrec=*/false);
    } else {
      std::copy(from.begin(), from.end(), p.value);
    }
  }

  // Tables, through their stores (any tier): each row's record keeps the
  // optimizer state it has, its weights are replaced.
  for (int k = 0; k < config.tables_size(); ++k) {
    const TorchRecTensor& t = tensors[k];
    ASSIGN_OR_RETURN(std::span<const float> from,
                     file.Get(t.torchrec_name, t.shape));
    embedding::EmbeddingStore& store = *model.shards().WholeStore(k);
    const embedding::TableSpec& spec = store.spec();
    const int64_t record =
        spec.dim + embedding::StateFloatsPerRow(spec.optimizer, spec.dim);
    // A dynamic table's rows take the weights of their ids' TorchRec rows.
    const auto rebuilt = maps.find(k);
    const std::vector<int64_t>* source =
        rebuilt == maps.end() ? nullptr : &rebuilt->second.source;
    std::vector<float> records;
    for (int64_t begin = 0; begin < spec.rows; begin += kChunkRows) {
      const int64_t count = std::min(kChunkRows, spec.rows - begin);
      records.resize(count * record);
      RETURN_IF_ERROR(store.ReadRows(begin, count, records.data()));
      for (int64_t r = 0; r < count; ++r) {
        const int64_t theirs =
            source == nullptr ? begin + r : (*source)[begin + r];
        if (theirs < 0) continue;
        const float* row = from.data() + theirs * spec.dim;
        std::copy(row, row + spec.dim, records.data() + r * record);
      }
      RETURN_IF_ERROR(store.WriteRows(begin, count, records.data()));
    }
    if (rebuilt != maps.end()) {
      DynamicStoreOf(model, k)->ReplaceMap(std::move(rebuilt->second.map));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<ExportInfo> ExportTorchRec(Model& model, const std::string& path,
                                          FileSystem* file_system) {
  const ModelConfig& config = model.config();
  RETURN_IF_ERROR(CheckOneProcess(model, "export"));
  ASSIGN_OR_RETURN(const std::vector<TorchRecTensor> tensors,
                   TorchRecTensors(config));
  std::map<std::string, const dense::ParamRef*> params;
  for (const dense::ParamRef& p : model.dense_params()) params[p.name] = &p;
  for (size_t i = config.tables_size(); i < tensors.size(); ++i) {
    if (tensors[i].mc == McBuffer::kNone &&
        params.count(tensors[i].name) == 0) {
      return absl::InternalError(absl::StrCat(
          "TorchRec export: the model has no parameter ", tensors[i].name));
    }
  }

  // The managed-collision buffers (int64) first in the file, so that every
  // tensor is aligned to its element; the header lists names sorted anyway.
  std::vector<size_t> file_order;
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (tensors[i].mc != McBuffer::kNone) file_order.push_back(i);
  }
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (tensors[i].mc == McBuffer::kNone) file_order.push_back(i);
  }
  std::map<int, McState> mc_states;
  for (int k = 0; k < config.tables_size(); ++k) {
    if (!config.tables(k).dynamic()) continue;
    const embedding::DynamicStore* store = DynamicStoreOf(model, k);
    if (store == nullptr) {
      return absl::InternalError(absl::StrCat("TorchRec export: dynamic table ",
                                              config.tables(k).name(),
                                              " has no id map"));
    }
    mc_states[k] = McStateOf(store->map());
  }
  std::vector<TensorSpec> specs;
  for (const size_t i : file_order) {
    specs.push_back(
        {tensors[i].torchrec_name, tensors[i].shape, tensors[i].dtype});
  }
  const std::string tmp = TemporaryPath(path);
  const std::string parent =
      fs::path(path).lexically_normal().parent_path().string();
  absl::Status status =
      file_system->CreateDirectories(parent.empty() ? "." : parent);
  std::unique_ptr<SafetensorsWriter> writer;
  if (status.ok()) {
    absl::StatusOr<std::unique_ptr<SafetensorsWriter>> created =
        SafetensorsWriter::Create(tmp, specs,
                                  {{"format", "pt"},
                                   {"source", "dlrm-server"},
                                   {"step", std::to_string(model.steps())}},
                                  file_system);
    status = created.status();
    if (status.ok()) writer = *std::move(created);
  }
  const int d = config.bottom_mlp(config.bottom_mlp_size() - 1);
  const std::vector<int> order = TorchRecDotPairOrder(config.tables_size() + 1);
  std::vector<float> scratch;
  for (size_t n = 0; status.ok() && n < file_order.size(); ++n) {
    const size_t i = file_order[n];
    const TorchRecTensor& t = tensors[i];
    if (t.mc != McBuffer::kNone) {
      status = writer->Append(McData(mc_states.at(t.table), t.mc).data());
      continue;
    }
    if (static_cast<int>(i) < config.tables_size()) {
      const int k = static_cast<int>(i);
      // fp32 host rows in place; the others (16-bit rows widened to fp32
      // included) through the store's records.
      embedding::EmbeddingTable* host = model.shards().WholeHostTable(k);
      if (host != nullptr && host->precision() == ROW_FP32) {
        status = writer->Append(host->weights());
        continue;
      }
      embedding::EmbeddingStore& store = *model.shards().WholeStore(k);
      const embedding::TableSpec& spec = store.spec();
      const int64_t record =
          spec.dim + embedding::StateFloatsPerRow(spec.optimizer, spec.dim);
      scratch.resize(spec.rows * spec.dim);
      std::vector<float> records;
      for (int64_t begin = 0; status.ok() && begin < spec.rows;
           begin += kChunkRows) {
        const int64_t count = std::min(kChunkRows, spec.rows - begin);
        records.resize(count * record);
        status = store.ReadRows(begin, count, records.data());
        for (int64_t r = 0; status.ok() && r < count; ++r) {
          std::copy(records.data() + r * record,
                    records.data() + r * record + spec.dim,
                    scratch.data() + (begin + r) * spec.dim);
        }
      }
      if (status.ok()) status = writer->Append(scratch.data());
      continue;
    }
    const dense::ParamRef& p = *params[t.name];
    if (t.pair_columns_permuted) {
      scratch.resize(p.size);
      CopyPermuted(p.value, scratch.data(), t.shape[0], t.shape[1], d, order,
                   /*to_torchrec=*/true);
      status = writer->Append(scratch.data());
    } else {
      status = writer->Append(p.value);
    }
  }
  if (status.ok()) status = writer->Finish();
  if (status.ok()) status = CommitFile(tmp, path, file_system);
  if (!status.ok()) {
    writer.reset();
    (void)file_system->RemoveAll(tmp);
    return status;
  }
  ExportInfo info;
  info.step = model.steps();
  info.bytes = writer->bytes();
  info.tensors = static_cast<int64_t>(tensors.size());
  return info;
}

absl::StatusOr<CheckpointInfo> ImportTorchRecCheckpoint(
    const std::string& state_dict, const ModelConfig& config,
    const std::string& dir, const TorchRecImportOptions& options,
    TorchRecImportReport* report) {
  if (!options.overwrite && fs::exists(dir)) {
    return absl::AlreadyExistsError(
        absl::StrCat(dir, " exists; choose a new directory"));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> file,
                   SafetensorsFile::Open(state_dict));
  // Checked before the model's tables are allocated.
  {
    const absl::Status checked = CheckTorchRecStateDict(*file, config);
    if (!checked.ok()) {
      return absl::Status(checked.code(),
                          absl::StrCat(state_dict, ": ", checked.message()));
    }
  }
  ASSIGN_OR_RETURN(std::unique_ptr<Model> model, Model::Create(config));
  const absl::Status imported = ImportTorchRecWeights(*file, *model, report);
  if (!imported.ok()) {
    return absl::Status(imported.code(),
                        absl::StrCat(state_dict, ": ", imported.message()));
  }
  return SaveCheckpoint(*model, dir);
}

absl::StatusOr<ExportInfo> ExportTorchRecCheckpoint(const std::string& dir,
                                                    const std::string& path) {
  ASSIGN_OR_RETURN(std::unique_ptr<Model> model,
                   LoadCheckpointOn(dir, /*weights_only=*/true, DEVICE_CPU));
  return ExportTorchRec(*model, path);
}

}  // namespace dlrm::model
