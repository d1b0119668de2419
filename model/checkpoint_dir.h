// The life of checkpoint directories on disk: committing a save (or an
// export file) atomically through a temporary name, and the periodic
// checkpoints under one root: naming, listing, pruning, and cleaning up
// after a crash. Every file is written, renamed and removed through a
// FileSystem (the real one unless a test passes another).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/file_system.h"
#include "model/checkpoint_manifest.h"

namespace dlrm::model {

// ---- Writing a directory or file so that a crash never leaves half of it:
// what a save, the weights export (model/weights_export.h,
// server/rank_group.h) and the job record (server/job_manager.h) commit.
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
// Removes what a failed save left under `path`; a failure is only logged
// (CleanPartialCheckpoints removes it at the next start).
void RemoveLeftover(const std::string& path,
                    FileSystem* file_system = DefaultFileSystem());
// The directory holding `path` ("." for a bare name).
std::string ParentDirectory(const std::string& path);

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
