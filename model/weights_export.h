// The weights export for PyTorch (docs/export.md "Weights export"): a
// model's dense parameters and whole tables as one safetensors file, named
// and shaped as WeightSpecs says. Earlier versions' one-process checkpoints
// held their weights in this format (model.safetensors, read by
// model/checkpoint_layout.h).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/file_system.h"
#include "dense/linear.h"
#include "dlrm/config.pb.h"
#include "model/model.h"
#include "model/safetensors.h"

namespace dlrm::model {

// The weight tensors of a model of `config` (normalised) in file order:
// first each dynamic table's ids in config order,
// "embedding_bags.<name>.ids" [rows] int64 (the raw id row r holds,
// kFreeRowId / kKeptRowId for a row without one: Model::GatherTableIds),
// placed first so that every tensor of the file is aligned to its element;
// then the dense parameters in the dense backend's order, named as it
// names them (dense/param_names.h): each layer i of the bottom MLP,
// "bottom_mlp.<i>.weight" [out, in] and ".bias" [out]; under DCN each
// cross layer l, "interaction.crossnet.<l>.V" [r, N], ".W" [N, r] and
// ".bias" [N]; the top MLP's layers as the bottom's, "top_mlp...."); then
// each table in config order, "embedding_bags.<name>.weight" [rows, dim].
// All but the ids float32; row-major.
std::vector<TensorSpec> WeightSpecs(const ModelConfig& config);

// The name of `table`'s weights in the export (and in TorchRecTensors):
// "embedding_bags.<name>.weight".
std::string TableWeightName(const TableConfig& table);
// The name of dynamic table `table`'s ids in the export:
// "embedding_bags.<name>.ids".
std::string TableIdsName(const TableConfig& table);

// Table k's weights, rows x dim row-major: a pointer into the model (valid
// until the next call), or into `*scratch` after filling it (rows read
// through a store, gathered from ranks).
using TableWeightsFn = std::function<absl::StatusOr<const float*>(
    int k, std::vector<float>* scratch)>;
// Dynamic table k's ids by row into `*ids` (Model::GatherTableIds).
using TableIdsFn =
    std::function<absl::Status(int k, std::vector<int64_t>* ids)>;

struct ExportInfo {
  int64_t step = 0;
  int64_t bytes = 0;
  int64_t tensors = 0;
};

// Writes the weights of a model of `config` with the dense parameters
// `dense` (Model::dense_params(), WeightSpecs' dense tensors in their order)
// to the safetensors file `path` (replacing it, creating its directory;
// metadata "format": "dlrm-server", "step"), one table in memory at a time
// (and every dynamic table's ids). `ids` is called for every dynamic table
// in config order, then `table` for every table in order, even after an
// error (ranks gather tables together); the first error is returned, the
// file system's naming the path; Internal when `dense` is not WeightSpecs'
// list.
absl::StatusOr<ExportInfo> WriteWeights(
    const std::string& path, const ModelConfig& config,
    const std::vector<dense::ParamRef>& dense, int64_t step,
    const TableWeightsFn& table, const TableIdsFn& ids,
    FileSystem* file_system = DefaultFileSystem());

// Writes the weights of a one-process model (every table whole on its one
// rank; a job of several ranks exports through server::RankGroup) to the
// safetensors file `path` through a temporary file renamed into place, so
// `path` is the old file or the complete new one at every moment. Errors as
// WriteWeights', and a table's store's read errors.
absl::StatusOr<ExportInfo> ExportSafetensors(
    Model& model, const std::string& path,
    FileSystem* file_system = DefaultFileSystem());

}  // namespace dlrm::model
