// Checkpoints of a model::Model on R >= 1 ranks, in one format for any R
// (docs/checkpoints.md): a directory with each rank's shards (rank-<r>.*),
// the dense part, the config, the plan, the layout of every table's saved
// blocks, and a manifest with every file's size and CRC-32C. A checkpoint
// restores on any number of ranks with any plan: each rank reads its rows
// and columns from the saved blocks that overlap them. Written to a
// temporary directory, synced, then renamed into place, so a crash never
// leaves a half-written one; loading checks the checksums of what it reads.
// Every file is written, renamed and removed through a FileSystem (the real
// one unless a test passes another); tensors are read by mmap after their
// checksums were verified through it. The manifest is in
// model/checkpoint_manifest.h, the commit and the periodic checkpoints'
// housekeeping (listing, pruning, cleaning up after a crash) in
// model/checkpoint_dir.h, which this header includes for its callers; the
// weights export for PyTorch in model/weights_export.h.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/file_system.h"
#include "model/checkpoint_dir.h"
#include "model/checkpoint_manifest.h"
#include "model/model.h"

namespace dlrm::model {

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

}  // namespace dlrm::model
