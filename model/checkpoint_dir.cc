// Committing checkpoint directories and files atomically, and the periodic
// checkpoints' housekeeping (model/checkpoint_dir.h).
#include "model/checkpoint_dir.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "spdlog/spdlog.h"

namespace dlrm::model {

namespace fs = std::filesystem;

std::string ParentDirectory(const std::string& path) {
  const fs::path parent = fs::path(path).lexically_normal().parent_path();
  return parent.empty() ? "." : parent.string();
}

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
  const std::string parent = ParentDirectory(dir.string());
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
  return file_system->SyncDirectory(ParentDirectory(path));
}

void RemoveLeftover(const std::string& path, FileSystem* file_system) {
  if (const absl::Status s = file_system->RemoveAll(path); !s.ok()) {
    spdlog::warn("cannot remove {} after a failed save: {}", path,
                 s.ToString());
  }
}

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
    if (!fs::exists(it->path() / kManifestFile, ignored)) continue;
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
