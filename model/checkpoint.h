// Checkpoints of a model::Model on R >= 1 ranks, in one format for any R
// (docs/checkpoints.md): a directory with each rank's shards (rank-<r>.*),
// the dense part, the config, the plan, the layout of every table's saved
// blocks, and a manifest with every file's size and CRC-32C. A checkpoint
// restores on any number of ranks with any plan: each rank reads its rows
// and columns from the saved blocks that overlap them. Written to a
// temporary directory, synced, then renamed into place, so a crash never
// leaves a half-written one; loading checks the checksums of what it reads.
// Also the periodic checkpoints' housekeeping: listing, pruning, cleaning up
// after a crash, and the weights export for PyTorch (docs/server.md
// "Weights export"). Every file is written, renamed and removed through a
// FileSystem (the real one unless a test passes another); tensors are read
// by mmap after their checksums were verified through it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/file_system.h"
#include "dense/linear.h"
#include "embedding/embedding_table.h"
#include "model/model.h"
#include "model/safetensors.h"

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

// Collective: every rank of `model` calls it with the same `dir`. Writes the
// model (config, weights, optimizer state, step) to `dir`: each rank its
// shards, rank 0 the rest and, once every rank's part is written, the
// manifest; then rank 0 replaces a previous checkpoint there (if any) with
// the new one. `job` (a JSON object, or empty; rank 0's counts) goes into
// the manifest as Manifest::job. On an error nothing of the new checkpoint
// is left (the previous one, if any, stays), except when only the final
// sync of the parent directory fails: then `dir` may already hold the new,
// complete checkpoint. Every rank returns the same outcome: errors name the
// path (ResourceExhausted for a full disk, Internal for other I/O errors,
// RocksDB's own for the RocksDB tier's part), and another rank's error is
// prefixed "rank <r>: ". A communicator error leaves the model's
// communicator_failed() true. CheckpointInfo::bytes is rank 0's count (0
// elsewhere).
absl::StatusOr<CheckpointInfo> SaveCheckpoint(
    Model& model, const std::string& dir, const std::string& job = "",
    FileSystem* file_system = DefaultFileSystem());

// Collective: loads weights, optimizer state and step from the checkpoint
// in `dir` into `model`, whatever rank count and plan wrote it (and the
// formats of earlier versions: one process; several ranks on this model's
// own plan). The architecture (tables, rows, dims, MLP widths, interaction,
// optimizer types) must match the checkpoint's config: FailedPrecondition
// otherwise; a table's tier may differ. NotFound if `dir` holds no
// checkpoint; DataLoss naming the file when a file this rank reads differs
// from the manifest's size or CRC-32C, or the manifest is damaged. The
// ranks agree before any changes: on error no rank's model changes.
absl::StatusOr<CheckpointInfo> RestoreCheckpoint(
    Model& model, const std::string& dir,
    FileSystem* file_system = DefaultFileSystem());

// Creates a one-process model from a checkpoint's own config and restores
// it (from any rank count); with `weights_only`, optimizer state is not
// read (inference-only serving) and need not be present.
absl::StatusOr<std::unique_ptr<Model>> LoadCheckpoint(
    const std::string& dir, bool weights_only,
    FileSystem* file_system = DefaultFileSystem());
// As LoadCheckpoint, with the model's dense part on `device` when given
// (the device is no part of a checkpoint's architecture: a checkpoint
// restores on either; on the CPU, tables saved from device memory,
// STORAGE_DEVICE, are restored into host memory).
absl::StatusOr<std::unique_ptr<Model>> LoadCheckpointOn(
    const std::string& dir, bool weights_only,
    std::optional<ComputeDevice> device,
    FileSystem* file_system = DefaultFileSystem());
// As LoadCheckpoint, with the checkpoint's config changed by `adjust`
// first (a binary's --device, --precision, --tf32: core/dense_flags.h);
// `adjust`'s error is returned as is. Tables saved from device memory are
// restored into host memory when the adjusted device is not CUDA.
absl::StatusOr<std::unique_ptr<Model>> LoadCheckpointWith(
    const std::string& dir, bool weights_only,
    const std::function<absl::Status(ModelConfig*)>& adjust,
    FileSystem* file_system = DefaultFileSystem());

// Helpers shared with the weights export of server/rank_group.h.
// Each returns the file system's error naming the path (ResourceExhausted
// for a full disk, Internal for other I/O errors).
//
// Writes `text` to `path` (replacing it) and syncs it to disk.
absl::Status WriteTextFile(const std::string& path, const std::string& text,
                           FileSystem* file_system = DefaultFileSystem());
// Syncs the directory `dir` (its entries) to disk.
absl::Status SyncDirectory(const std::string& dir,
                           FileSystem* file_system = DefaultFileSystem());
// Moves the complete directory `tmp` to `dir`, replacing what `dir` held
// only once `tmp` is in place (one atomic exchange, or where the file
// system has none, two renames, the old one put back if the second fails);
// syncs the parent. On an error `dir` holds the old or (when only the sync
// failed) the new checkpoint, and `tmp` one that may be removed.
absl::Status CommitDirectory(const std::string& tmp, const std::string& dir,
                             FileSystem* file_system = DefaultFileSystem());
// Renames the complete file `tmp` to `path` (replacing it) and syncs the
// parent directory.
absl::Status CommitFile(const std::string& tmp, const std::string& path,
                        FileSystem* file_system = DefaultFileSystem());
// The temporary name a save of `path` writes to first: "<path>.tmp-<pid>"
// (CleanPartialCheckpoints removes what a crash leaves under it).
std::string TemporaryPath(const std::string& path);

// ---- Weights: the export for PyTorch (docs/server.md "Weights export"),
// also a checkpoint's model.safetensors.

// The weight tensors of a model of `config` (normalised) in file order: the
// dense parameters in the dense backend's order (each layer i of the bottom
// MLP, "bottom_mlp.<i>.weight" [out, in] and ".bias" [out]; under DCN each
// cross layer l, "interaction.crossnet.<l>.V" [r, N], ".W" [N, r] and
// ".bias" [N]; the top MLP's layers as the bottom's, "top_mlp...."); then
// each table in config order, "embedding_bags.<name>.weight" [rows, dim].
// All float32, row-major.
std::vector<TensorSpec> WeightSpecs(const ModelConfig& config);

// Table k's weights, rows x dim row-major: a pointer into the model (valid
// until the next call), or into `*scratch` after filling it (rows read
// through a store, gathered from ranks).
using TableWeightsFn = std::function<absl::StatusOr<const float*>(
    int k, std::vector<float>* scratch)>;

struct ExportInfo {
  int64_t step = 0;
  int64_t bytes = 0;
  int64_t tensors = 0;
};

// Writes the weights of a model of `config` with the dense parameters
// `dense` (Model::dense_params(), WeightSpecs' dense tensors in their order)
// to the safetensors file `path` (replacing it, creating its directory;
// metadata "format": "dlrm-server", "step"), one table in memory at a time.
// `table` is called for every table, in order, even after an error (ranks
// gather tables together); the first error is returned, the file system's
// naming the path; Internal when `dense` is not WeightSpecs' list.
absl::StatusOr<ExportInfo> WriteWeights(
    const std::string& path, const ModelConfig& config,
    const std::vector<dense::ParamRef>& dense, int64_t step,
    const TableWeightsFn& table, FileSystem* file_system = DefaultFileSystem());

// Writes the weights of a one-process model (every table whole on its one
// rank; a job of several ranks exports through server::RankGroup) to the
// safetensors file `path` through a temporary file renamed into place, so
// `path` is the old file or the complete new one at every moment. Errors as
// WriteWeights', and a table's store's read errors.
absl::StatusOr<ExportInfo> ExportSafetensors(
    Model& model, const std::string& path,
    FileSystem* file_system = DefaultFileSystem());

// ---- Manifests (MANIFEST.json, written last into a checkpoint directory).

// The format of a checkpoint (any rank count), and that of several ranks'
// checkpoints before one format served every count (read, not written).
inline constexpr char kCheckpointFormat[] = "dlrm-server-checkpoint";
inline constexpr char kLegacyMultiRankFormat[] =
    "dlrm-server-multirank-checkpoint";

struct ManifestFile {
  // Path relative to the checkpoint directory, '/'-separated.
  std::string path;
  int64_t bytes = 0;
  uint32_t crc32c = 0;
  // False for a manifest of version 1 (sizes only).
  bool has_crc32c = false;
};

struct Manifest {
  std::string format;  // kCheckpointFormat or kLegacyMultiRankFormat
  int version = 0;
  int64_t step = 0;
  int world_size = 1;
  // Wall-clock commit time (ms since the Unix epoch): "newest" means the
  // largest. 0 in version 1 manifests.
  int64_t created_ms = 0;
  // The model config (text format) and the sharding plan as printed.
  std::string config_text;
  std::string sharding_plan;
  // The server-side training job that was running when the checkpoint was
  // taken (server/job_manager.h: its id, request and position), as a JSON
  // object; empty when none was. Covered by the manifest's checksum.
  std::string job;
  // Every file of the checkpoint but the manifest, sorted by path.
  std::vector<ManifestFile> files;
};

// Writes `dir`/MANIFEST.json for `fields` (format, step, world_size,
// config_text, sharding_plan), listing every other file under `dir` (sub-
// directories included) with its size and CRC-32C, stamped with the time
// now and a CRC-32C of the manifest itself; syncs it and `dir`. Returns the
// manifest written. Internal naming the path on an I/O error.
absl::StatusOr<Manifest> WriteManifest(
    const std::string& dir, const Manifest& fields,
    FileSystem* file_system = DefaultFileSystem());

// Reads `dir`/MANIFEST.json. NotFound when there is none; DataLoss naming
// it when it does not parse or its own checksum does not match.
absl::StatusOr<Manifest> ReadManifest(
    const std::string& dir, FileSystem* file_system = DefaultFileSystem());

// Checks the size and CRC-32C of each file of `manifest` under `dir` for
// which `want(path)` is true (every file when `want` is empty). DataLoss
// naming the first file that is missing, has another size or checksum.
absl::Status VerifyCheckpointFiles(
    const std::string& dir, const Manifest& manifest,
    const std::function<bool(const std::string&)>& want = nullptr,
    FileSystem* file_system = DefaultFileSystem());

// The CRC-32C and size of the file at `path`, read through `file_system`. The
// file system's errors when unreadable.
absl::StatusOr<std::pair<uint32_t, int64_t>> FileCrc32c(
    const std::string& path, FileSystem* file_system = DefaultFileSystem());

// ---- Periodic checkpoints under one root directory.

// The directory name of the periodic checkpoint at `step`: "ckpt-<step>".
std::string PeriodicCheckpointName(int64_t step);

struct CheckpointEntry {
  std::string dir;   // full path
  std::string name;  // the directory's name under the root
  // The manifest, or why it could not be read (DataLoss, NotFound).
  absl::StatusOr<Manifest> manifest;
};

// Every checkpoint directly under `root` (a directory holding a
// MANIFEST.json, damaged or not), newest first: by the manifest's commit
// time, then step; entries whose manifest cannot be read come last.
// Temporary directories of unfinished saves are not listed. Empty when
// `root` does not exist.
std::vector<CheckpointEntry> ListCheckpoints(
    const std::string& root, FileSystem* file_system = DefaultFileSystem());

// Cleans up after a crash, directly under `root`: removes the temporary
// directories (and export files) of saves that never committed
// ("<name>.tmp-<pid>"), and puts
// back a checkpoint whose replacement a crash interrupted ("<name>.old-
// <pid>" when <name> is missing; else it is removed). Logs each action.
// Call only while no save into `root` runs.
void CleanPartialCheckpoints(const std::string& root,
                             FileSystem* file_system = DefaultFileSystem());

// Keeps the `keep` newest periodic checkpoints ("ckpt-<step>") under
// `root` (ListCheckpoints order) and removes the older ones; others (named
// saves, "final") are never removed. keep = 0 keeps every one. The file
// system's error on an I/O error.
absl::Status PruneCheckpoints(const std::string& root, int keep,
                              FileSystem* file_system = DefaultFileSystem());

}  // namespace dlrm::model
