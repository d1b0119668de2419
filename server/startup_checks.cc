// dlrm_server's start-up checks and stop warnings (server/startup_checks.h).
#include "server/startup_checks.h"

#include <algorithm>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "core/path_checks.h"
#include "core/status.h"
#include "model/checkpoint.h"

namespace dlrm::server {

absl::Status CheckServerPaths(const ServerOptions& options) {
  if (!options.checkpoint_dir.empty()) {
    RETURN_IF_ERROR(
        CheckWritableDir("--checkpoint-dir", options.checkpoint_dir));
  }
  if (!options.data_dir.empty()) {
    RETURN_IF_ERROR(CheckReadableDir("--data-dir", options.data_dir));
  }
  for (const std::string& dir : options.allowed_data_dirs) {
    if (dir.empty()) continue;  // ServerOptions::Validate names it
    RETURN_IF_ERROR(CheckReadableDir("--allow-data-path", dir));
  }
  std::error_code ec;
  if (!options.follow_dir.empty() &&
      std::filesystem::exists(options.follow_dir, ec)) {
    RETURN_IF_ERROR(CheckReadableDir("--follow", options.follow_dir));
  }
  return absl::OkStatus();
}

std::string NoCheckpointDirWarning(const ServerOptions& options) {
  if (options.inference_only || !options.checkpoint_dir.empty()) return "";
  return "no --checkpoint-dir: trained steps are lost when it stops; pass "
         "--checkpoint-dir DIR (with --checkpoint-on-exit or "
         "--checkpoint-every-steps N) to keep them";
}

std::string UnsavedStepsWarning(const ServerOptions& options,
                                bool saves_on_exit, int64_t steps,
                                int64_t start_steps) {
  if (options.inference_only || saves_on_exit) return "";
  int64_t saved = start_steps;
  std::string newest;
  if (!options.checkpoint_dir.empty()) {
    for (const model::CheckpointEntry& e :
         model::ListCheckpoints(options.checkpoint_dir)) {
      if (!e.manifest.ok()) continue;
      if (e.manifest->step >= saved) {
        saved = e.manifest->step;
        newest = e.dir;
      }
      break;  // newest first
    }
  }
  if (steps <= saved) return "";
  const int64_t lost = steps - saved;
  if (options.checkpoint_dir.empty()) {
    return absl::StrCat(
        "stopping with ", lost, " trained step", lost == 1 ? "" : "s",
        " (the model is at step ", steps,
        ") that no checkpoint holds: they are lost. Start with "
        "--checkpoint-dir DIR --checkpoint-on-exit to keep them");
  }
  return absl::StrCat(
      "stopping with ", lost, " trained step", lost == 1 ? "" : "s",
      " (the model is at step ", steps, ") newer than ",
      newest.empty() ? std::string("any checkpoint")
                     : absl::StrCat("the newest checkpoint, ", newest),
      ": they are lost. --checkpoint-on-exit saves them at a stop");
}

}  // namespace dlrm::server
