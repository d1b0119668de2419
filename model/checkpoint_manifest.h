// A checkpoint's manifest, MANIFEST.json: written last into a checkpoint
// directory, it lists every other file with its size and CRC-32C and marks
// the checkpoint complete; reading it and checking files against it.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/file_system.h"

namespace dlrm::model {

// The manifest's name in a checkpoint directory.
inline constexpr char kManifestFile[] = "MANIFEST.json";

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

}  // namespace dlrm::model
