// Checkpoints of a DlrmModel: a directory with the config, the weights as
// safetensors (loadable in PyTorch; names in docs/checkpoints.md), the
// optimizer state, and a manifest. Written to a temporary directory, synced,
// then renamed into place, so a crash never leaves a half-written one.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "embedding/embedding_table.h"
#include "model/dlrm_model.h"

namespace dlrm::model {

// One tensor of a table (or shard) in a checkpoint; `data` borrows the
// table's buffer.
struct TableTensor {
  std::string name;
  std::vector<int64_t> shape;
  float* data;
};

// The tensors a checkpoint holds for table (or shard) `t` under `base`:
// "<base>.weight" [rows, dim] when `with_weight`, then the optimizer state
// it keeps: "<base>.momentum1" ([rows] for row-wise Adagrad, [rows, dim] for
// Adam) and "<base>.momentum2" [rows, dim] (Adam). None of the state for
// SGD.
std::vector<TableTensor> TableTensors(const std::string& base,
                                      embedding::EmbeddingTable& t,
                                      bool with_weight);

struct CheckpointInfo {
  int64_t step = 0;
  int64_t bytes = 0;
};

// Writes the model (config, weights, optimizer state, step) to `dir`,
// replacing a previous checkpoint there. Internal on I/O errors.
absl::StatusOr<CheckpointInfo> SaveCheckpoint(DlrmModel& model,
                                              const std::string& dir);

// Loads weights, optimizer state and step from `dir` into `model`, whose
// architecture (tables, dims, MLP widths, interaction) must match the
// checkpoint's config: FailedPrecondition otherwise. NotFound if `dir`
// holds no checkpoint. On error the model is unchanged.
absl::StatusOr<CheckpointInfo> RestoreCheckpoint(DlrmModel& model,
                                                 const std::string& dir);

// Creates a model from a checkpoint's own config and restores it; with
// `weights_only`, optimizer state is not read (inference-only serving) and
// need not be present.
absl::StatusOr<std::unique_ptr<DlrmModel>> LoadCheckpoint(
    const std::string& dir, bool weights_only);

// Helpers shared with the multi-rank checkpoints of server/rank_group.h.
// Each returns Internal naming the path on an I/O error.
//
// Writes `text` to `path` (replacing it) and syncs it to disk.
absl::Status WriteTextFile(const std::string& path, const std::string& text);
// Syncs the directory `dir` (its entries) to disk.
absl::Status SyncDirectory(const std::string& dir);
// Moves the complete directory `tmp` to `dir`, replacing what `dir` held
// only once `tmp` is in place; syncs the parent.
absl::Status CommitDirectory(const std::string& tmp, const std::string& dir);

// Writes only the weights as one safetensors file (the export for PyTorch).
absl::Status ExportSafetensors(DlrmModel& model, const std::string& path);

}  // namespace dlrm::model
