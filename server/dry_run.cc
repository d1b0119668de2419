// dlrm_server --dry-run (dry_run.h).
#include "server/dry_run.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/config.h"
#include "core/device.h"
#include "dense/cpu_isa.h"
#include "server/start_plan.h"
#include "server/startup_checks.h"

namespace dlrm::server {

absl::Status DryRun(const ServerFlags& f) {
  RETURN_IF_ERROR(ValidateServerFlags(f));
  ASSIGN_OR_RETURN(const StartPlan start, ChooseStart(f));
  std::string model_spec = f.restore.empty() ? f.config : f.restore;
  std::optional<ModelConfig> config;
  // A resume's model is the newest checkpoint's, with --config's changes
  // (ResumedConfig; an immutable one is this run's error too).
  std::vector<ConfigDifference> changes;
  std::string resume_from;
  if (start.kind == StartPlan::Kind::kFollow) {
    // A replica's model is the newest checkpoint in --follow's directory;
    // there may be none yet.
    model_spec.clear();
    for (const model::CheckpointEntry& e :
         model::ListCheckpoints(f.server.follow_dir)) {
      if (!e.manifest.ok()) continue;
      model_spec = e.dir;
      ASSIGN_OR_RETURN(
          config,
          ConfigOnDevice(
              f, (std::filesystem::path(e.dir) / "config.textproto").string()));
      break;
    }
  } else {
    ASSIGN_OR_RETURN(config, StartConfig(f, start, &changes));
    if (start.kind == StartPlan::Kind::kResume) {
      resume_from = absl::StrCat(start.dir, " at step ",
                                 start.candidates.front().manifest->step);
      model_spec = start.dir;
    }
  }
  embedding::ShardingPlan plan;
  std::optional<model::MemoryPlan> memory;
  if (config.has_value()) {
    ASSIGN_OR_RETURN(plan, PlanShardingOf(f, *config));
    // The memory the model would take, refused as a run would.
    ASSIGN_OR_RETURN(memory, CheckMemoryOf(f, *config, &plan));
    // The tiers the model would choose (embedding::ApplyMemoryBudgets).
    ASSIGN_OR_RETURN(config, embedding::ApplyMemoryBudgets(*config, &plan));
  }
  const auto or_none = [](const std::string& s) {
    return s.empty() ? std::string("(none)") : s;
  };
  std::printf("dlrm_server --dry-run: the flags are valid; nothing started\n");
  std::printf("rank %d of %d\n", f.rank, f.world_size);
  if (!f.launcher_note.empty()) std::printf("%s\n", f.launcher_note.c_str());
  if (f.world_size > 1) {
    std::printf(
        "coordinator %s (%s; %s)\ncollectives bind %s (Gloo: plaintext, "
        "unauthenticated)\n",
        f.coordinator.c_str(), f.rank == 0 ? "rank 0 hosts it" : "dialled",
        ControlPlaneSummary(f).c_str(), f.comm_bind_address.c_str());
  }
  if (f.rank == 0) {
    std::printf("gRPC listen %s\nmetrics listen %s\n", f.server.listen.c_str(),
                f.server.metrics_listen.empty()
                    ? "off"
                    : f.server.metrics_listen.c_str());
  } else {
    std::printf("serves nothing (follows rank 0)\n");
  }
  if (!f.server.follow_dir.empty()) {
    std::printf(
        "follow %s every %g s (serves its newest complete checkpoint; "
        "listens once there is one)\n",
        f.server.follow_dir.c_str(), f.server.follow_poll_seconds);
  }
  if (config.has_value()) {
    std::printf(
        "model %s: %d tables, %lld embedding and %lld dense parameters\n",
        model_spec.c_str(), config->tables_size(),
        static_cast<long long>(EmbeddingParameterCount(*config)),
        static_cast<long long>(DenseParameterCount(*config)));
    std::printf(
        "device %s (the dense part), dense precision %s%s\n",
        DeviceName(config->device()),
        dense::DescribePrecision(config->device(), config->dense_precision())
            .c_str(),
        config->device() == DEVICE_CUDA
            ? (config->gpu_disable_tf32() ? ", tf32 GEMMs off"
                                          : ", tf32 GEMMs on")
            : "");
    const bool device_tables = std::any_of(
        config->tables().begin(), config->tables().end(),
        [](const TableConfig& t) { return t.storage() == STORAGE_DEVICE; });
    if (config->device_budget_bytes() > 0) {
      std::printf("device memory budget %lld MiB per rank\n",
                  static_cast<long long>(config->device_budget_bytes() >> 20));
    } else if (config->device() == DEVICE_CUDA && device_tables) {
      std::printf(
          "device memory budget: the GPU's free memory at start less the "
          "dense part's reserve\n");
    }
  } else {
    std::printf("model: none yet (no complete checkpoint in %s)\n",
                f.server.follow_dir.c_str());
  }
  std::printf("gRPC %s, auth token %s\n",
              f.server.tls.enabled() ? (f.server.tls.client_ca_file.empty()
                                            ? "TLS"
                                            : "TLS with client certificates")
                                     : "plaintext",
              f.server.auth.token.empty()
                  ? "off"
                  : (f.server.auth.predict_requires_token
                         ? "required by every service"
                         : "required by Trainer and Admin"));
  std::printf("restore %s%s\ncheckpoint-dir %s%s\ndata-dir %s\n",
              or_none(f.restore).c_str(),
              f.server.inference_only ? " (inference only)" : "",
              or_none(f.server.checkpoint_dir).c_str(),
              f.checkpoint_on_exit ? " (saves final/ on exit)" : "",
              or_none(f.server.data_dir).c_str());
  if (const std::string lost = NoCheckpointDirWarning(f.server);
      !lost.empty() && f.rank == 0) {
    std::printf("warning: %s\n", lost.c_str());
  }
  for (const std::string& dir : f.server.allowed_data_dirs) {
    std::printf("allow-data-path %s\n", dir.c_str());
  }
  if (f.server.data_dir.empty() && f.server.allowed_data_dirs.empty()) {
    std::printf(
        "dataset files off (no data-dir or allow-data-path): "
        "synthetic data only\n");
  }
  if (!f.server.checkpoint_dir.empty()) {
    std::printf(
        "resume %s\nperiodic checkpoints every %lld steps, %g s (0 = off), "
        "keeping %d\n",
        f.resume && f.restore.empty() && !f.server.inference_only
            ? "from the newest valid checkpoint in checkpoint-dir, if any"
            : "off",
        static_cast<long long>(f.server.checkpoint_every_steps),
        f.server.checkpoint_every_seconds, f.server.keep_checkpoints);
    if (!resume_from.empty()) {
      std::printf("resumes from %s%s\n", resume_from.c_str(),
                  f.config_given && changes.empty()
                      ? " (--config changes nothing)"
                      : "");
      for (const ConfigDifference& c : changes) {
        std::printf("%s\n", c.ToString().c_str());
      }
    }
  }
  if (config.has_value()) {
    std::printf("sharding plan (%d ranks):\n%s\n", f.world_size,
                plan.ToString(*config).c_str());
    std::printf("%s", memory->ToString().c_str());
  }
  return absl::OkStatus();
}

}  // namespace dlrm::server
