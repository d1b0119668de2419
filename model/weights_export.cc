// The weights export: WeightSpecs' tensors written as one safetensors file
// (model/weights_export.h).
#include "model/weights_export.h"

#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/config.h"
#include "core/status.h"
#include "dense/param_names.h"
#include "model/checkpoint_dir.h"

namespace dlrm::model {
namespace {

// WriteWeights' tables of a one-process model: fp32 host tables in place,
// the others (RocksDB, device memory, 16-bit rows widened to fp32)
// gathered through their store.
TableWeightsFn ModelTables(Model& m) {
  return
      [&m](int k, std::vector<float>* scratch) -> absl::StatusOr<const float*> {
        embedding::EmbeddingTable* t = m.shards().WholeHostTable(k);
        if (t != nullptr && t->precision() == ROW_FP32) return t->weights();
        // One rank: no collective behind the gather.
        RETURN_IF_ERROR(m.GatherTable(k, scratch));
        return scratch->data();
      };
}

// ExportSafetensors writes every table whole: a model of one rank whose
// every table is whole on it (Model::Create(config)'s plan).
absl::Status CheckWholeTables(Model& model) {
  for (int k = 0; k < model.config().tables_size(); ++k) {
    if (model.world_size() != 1 || model.shards().WholeStore(k) == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          "a one-process export needs every table whole on one rank; "
          "table ",
          model.config().tables(k).name(), " is sharded over ",
          model.world_size(), " rank(s)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

std::string TableWeightName(const TableConfig& table) {
  return absl::StrCat("embedding_bags.", table.name(), ".weight");
}

std::string TableIdsName(const TableConfig& table) {
  return absl::StrCat("embedding_bags.", table.name(), ".ids");
}

std::vector<TensorSpec> WeightSpecs(const ModelConfig& config) {
  std::vector<TensorSpec> specs;
  for (const TableConfig& t : config.tables()) {
    if (t.dynamic()) {
      specs.push_back({TableIdsName(t), {t.rows()}, Dtype::kI64});
    }
  }
  auto add_mlp = [&specs](const char* prefix, int64_t in,
                          const google::protobuf::RepeatedField<int32_t>& w) {
    for (int i = 0; i < w.size(); ++i) {
      specs.push_back(
          {dense::ParamName(prefix, i, dense::kWeight), {w.Get(i), in}});
      specs.push_back({dense::ParamName(prefix, i, dense::kBias), {w.Get(i)}});
      in = w.Get(i);
    }
  };
  add_mlp(dense::kBottomMlpPrefix, config.num_dense_features(),
          config.bottom_mlp());
  const int64_t width = InteractionOutputDim(config);
  for (DenseParamSpec& p : InteractionParamSpecs(config)) {
    specs.push_back({std::move(p.name), std::move(p.shape)});
  }
  add_mlp(dense::kTopMlpPrefix, width, config.top_mlp());
  for (const TableConfig& t : config.tables()) {
    specs.push_back({TableWeightName(t), {t.rows(), t.dim()}});
  }
  return specs;
}

absl::StatusOr<ExportInfo> WriteWeights(
    const std::string& path, const ModelConfig& config,
    const std::vector<dense::ParamRef>& dense, int64_t step,
    const TableWeightsFn& table, const TableIdsFn& ids,
    FileSystem* file_system) {
  std::vector<TensorSpec> specs = WeightSpecs(config);
  // The ids come first, then the dense parameters in their order.
  int dynamic = 0;
  for (const TableConfig& t : config.tables()) dynamic += t.dynamic() ? 1 : 0;
  absl::Status status;
  if (dynamic + dense.size() + config.tables_size() != specs.size()) {
    status = absl::InternalError(absl::StrCat(
        "weights export: ", dense.size(), " dense parameters, ",
        specs.size() - config.tables_size() - dynamic, " expected"));
  }
  for (size_t i = 0; status.ok() && i < dense.size(); ++i) {
    const TensorSpec& spec = specs[dynamic + i];
    int64_t size = 1;
    for (const int64_t d : spec.shape) size *= d;
    if (dense[i].name != spec.name || dense[i].size != size) {
      status = absl::InternalError(absl::StrCat(
          "weights export: dense parameter ", i, " is ", dense[i].name, " of ",
          dense[i].size, " floats, expected ", spec.name, " of ", size));
    }
  }
  // Every dynamic table's ids, gathered before the file is created (they
  // are written first).
  std::vector<std::vector<int64_t>> table_ids;
  for (int k = 0; k < config.tables_size(); ++k) {
    if (!config.tables(k).dynamic()) continue;
    const absl::Status gathered = ids(k, &table_ids.emplace_back());
    if (status.ok()) status = gathered;
  }
  ExportInfo info;
  info.step = step;
  info.tensors = static_cast<int64_t>(specs.size());
  if (status.ok()) {
    status = file_system->CreateDirectories(ParentDirectory(path));
  }
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
  for (const std::vector<int64_t>& t : table_ids) {
    if (!status.ok()) break;
    status = writer->Append(t.data());
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
  absl::StatusOr<ExportInfo> info = WriteWeights(
      tmp, model.config(), model.dense_params(), model.steps(),
      ModelTables(model),
      [&model](int k, std::vector<int64_t>* ids) {
        return model.GatherTableIds(k, ids);
      },
      file_system);
  if (info.ok()) {
    const absl::Status committed = CommitFile(tmp, path, file_system);
    if (!committed.ok()) info = committed;
  }
  if (!info.ok()) RemoveLeftover(tmp, file_system);
  return info;
}

}  // namespace dlrm::model
