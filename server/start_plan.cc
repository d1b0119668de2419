// How dlrm_server starts (start_plan.h): the choice of start, the resume
// and the model config the flags make.
#include "server/start_plan.h"

#include <algorithm>
#include <filesystem>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/config.h"
#include "core/device.h"
#include "core/status.h"
#include "spdlog/spdlog.h"

namespace dlrm::server {
namespace {

// Device memory the automatic device budget leaves to the dense part of
// a model with `dense_parameters` on a GPU with `free_bytes` free: 1 GiB
// for workspaces and activations, a tenth of the free memory, and 16 bytes
// a dense parameter (weights, gradients, two optimizer state floats).
int64_t DenseDeviceReserve(int64_t dense_parameters, int64_t free_bytes) {
  return (int64_t{1} << 30) + free_bytes / 10 + 16 * dense_parameters;
}

// Sets config->device_budget_bytes: from --device-memory-budget-mb when
// given; else the config's own; else, when the model runs STORAGE_DEVICE
// tables on CUDA and a GPU is present (not on a dry run, which allocates
// nothing), the free memory of this rank's GPU (device 0 of the process)
// less DenseDeviceReserve. ResourceExhausted, naming the bytes, when the
// reserve takes every free byte; the device's error when it cannot be
// queried.
absl::Status ApplyDeviceBudget(const ServerFlags& f, ModelConfig* config) {
  if (f.device_memory_budget_mb > 0) {
    config->set_device_budget_bytes(f.device_memory_budget_mb << 20);
    return absl::OkStatus();
  }
  const bool device_tables = std::any_of(
      config->tables().begin(), config->tables().end(),
      [](const TableConfig& t) { return t.storage() == STORAGE_DEVICE; });
  if (config->device_budget_bytes() > 0 || f.dry_run ||
      config->device() != DEVICE_CUDA || !device_tables ||
      CudaDeviceCount() == 0) {
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(std::unique_ptr<Device> device, CreateCudaDevice(0));
  ASSIGN_OR_RETURN(const size_t free_bytes, device->FreeMemory());
  const int64_t free = static_cast<int64_t>(free_bytes);
  const int64_t reserve =
      DenseDeviceReserve(DenseParameterCount(*config), free);
  if (free <= reserve) {
    return absl::ResourceExhaustedError(absl::StrCat(
        device->name(), " has ", free, " bytes free, not more than the ",
        reserve,
        " bytes kept for the dense part and workspaces: no room for "
        "STORAGE_DEVICE tables; give --device-memory-budget-mb or put the "
        "tables in host memory (STORAGE_HOST)"));
  }
  config->set_device_budget_bytes(free - reserve);
  spdlog::info(
      "device memory budget {} MiB per rank: {} free less {} MiB "
      "kept for the dense part",
      (free - reserve) >> 20, device->name(), reserve >> 20);
  return absl::OkStatus();
}

// The flags that change a model config, given or not: the dense flags
// (--device, --precision, --tf32), the storage flags and the device budget.
absl::Status AdjustConfig(const ServerFlags& f, ModelConfig* config) {
  RETURN_IF_ERROR(f.dense.Apply(config));
  RETURN_IF_ERROR(f.storage.Apply(config));
  return ApplyDeviceBudget(f, config);
}

absl::Status NothingToResume(const std::string& root) {
  return absl::FailedPreconditionError(absl::StrCat(
      "no checkpoint in ", root,
      " could be loaded (each is named in a warning above); move the "
      "damaged ones away, or start afresh with --no-resume"));
}

}  // namespace

absl::StatusOr<StartPlan> ChooseStart(const ServerFlags& f) {
  StartPlan start;
  if (!f.server.follow_dir.empty()) {
    start.kind = StartPlan::Kind::kFollow;
    return start;
  }
  if (!f.restore.empty()) {
    start.kind = StartPlan::Kind::kRestore;
    start.dir = f.restore;
    return start;
  }
  if (!Resumes(f)) return start;
  const std::string& root = f.server.checkpoint_dir;
  if (!f.dry_run) model::CleanPartialCheckpoints(root);
  const std::vector<model::CheckpointEntry> entries =
      model::ListCheckpoints(root);
  for (const model::CheckpointEntry& e : entries) {
    if (!e.manifest.ok()) {
      if (!f.dry_run) {
        spdlog::warn("skipping checkpoint {}: {}", e.dir,
                     e.manifest.status().ToString());
      }
      continue;
    }
    if (e.manifest->world_size != f.world_size && !f.dry_run) {
      spdlog::info(
          "checkpoint {} was written by {} ranks, this job has {}: a "
          "restore reshards it",
          e.dir, e.manifest->world_size, f.world_size);
    }
    start.candidates.push_back(e);
  }
  if (start.candidates.empty()) {
    if (!entries.empty()) return NothingToResume(root);
    if (!f.dry_run) spdlog::info("no checkpoint in {}: starting afresh", root);
    return start;
  }
  start.kind = StartPlan::Kind::kResume;
  start.dir = start.candidates.front().dir;
  return start;
}

absl::Status ResumeNewestFirst(const StartPlan& start,
                               const RestoreCheckpointFn& restore,
                               ServerFlags* f) {
  for (const model::CheckpointEntry& e : start.candidates) {
    std::vector<ConfigDifference> changes;
    bool fatal = false;
    const absl::StatusOr<int64_t> step = restore(e, &changes, &fatal);
    // A config that changes what the checkpoint fixes, a model too big for
    // this machine and a broken job are refused, not skipped over for an
    // older checkpoint.
    if (fatal || absl::IsResourceExhausted(step.status()) ||
        absl::IsUnavailable(step.status())) {
      return step.status();
    }
    if (!step.ok()) {
      spdlog::warn("skipping checkpoint {}: {}", e.dir,
                   step.status().ToString());
      continue;
    }
    spdlog::info("resuming from {} at step {}", e.dir, *step);
    for (const ConfigDifference& c : changes) {
      spdlog::info("{}", c.ToString());
    }
    f->server.resume_job = e.manifest->job;
    f->server.loaded_from = e.dir;
    return absl::OkStatus();
  }
  return NothingToResume(f->server.checkpoint_dir);
}

absl::StatusOr<ModelConfig> StartConfig(
    const ServerFlags& f, const StartPlan& start,
    std::vector<ConfigDifference>* changes) {
  changes->clear();
  if (start.kind == StartPlan::Kind::kResume) {
    return ResumedConfig(f, start.dir, changes);
  }
  return RunConfig(f);
}

// The memory plan of this rank of `config` under `plan` (null: one process)
// at a job's default batch of 2048 samples, logged unless on a dry run, and
// checked against the machine's memory (model::CheckMemory) before the
// model is allocated: the plan, or ResourceExhausted naming the fix.
absl::StatusOr<model::MemoryPlan> CheckMemoryOf(
    const ServerFlags& f, const ModelConfig& config,
    const embedding::ShardingPlan* plan) {
  ASSIGN_OR_RETURN(const ModelConfig tiers,
                   embedding::ApplyMemoryBudgets(config, plan));
  model::MemoryPlanOptions o;
  o.rank = f.rank;
  ASSIGN_OR_RETURN(model::MemoryPlan memory, model::PlanMemory(tiers, plan, o));
  if (!f.dry_run) {
    std::string text = memory.ToString();
    if (!text.empty() && text.back() == '\n') text.pop_back();
    spdlog::info("{}", text);
  }
  ASSIGN_OR_RETURN(const model::MachineMemory machine,
                   model::AvailableMemory());
  RETURN_IF_ERROR(model::CheckMemory(tiers, memory, machine, plan));
  return memory;
}

// AdjustConfig, then for one process CheckMemoryOf: what a config loaded
// for a model of one process goes through.
absl::Status AdjustAndCheck(const ServerFlags& f, ModelConfig* config) {
  RETURN_IF_ERROR(AdjustConfig(f, config));
  if (f.world_size != 1) return absl::OkStatus();
  return CheckMemoryOf(f, *config, nullptr).status();
}

// The model config at `spec` (a preset, a file, a checkpoint's
// config.textproto) adjusted by the flags (AdjustConfig).
absl::StatusOr<ModelConfig> ConfigOnDevice(const ServerFlags& f,
                                           const std::string& spec) {
  ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(spec));
  RETURN_IF_ERROR(AdjustConfig(f, &config));
  return config;
}

// The sharding plan of a run of `config`: --world-size, --memory-budget-mb
// and the config's device budget; a table that fits nowhere says what
// --memory-budget-mb is (model::ExplainShardingBudget).
absl::StatusOr<embedding::ShardingPlan> PlanShardingOf(
    const ServerFlags& f, const ModelConfig& config) {
  embedding::PlannerOptions po;
  po.world_size = f.world_size;
  po.memory_budget_bytes = f.memory_budget_mb << 20;
  po.device_budget_bytes = config.device_budget_bytes();
  return model::ExplainShardingBudget(embedding::PlanSharding(config, po),
                                      "--memory-budget-mb");
}

// The model config a run uses: with --restore the checkpoint's, so that
// every rank plans from it (the restore itself checks the plan).
absl::StatusOr<ModelConfig> RunConfig(const ServerFlags& f) {
  return ConfigOnDevice(
      f,
      f.restore.empty()
          ? f.config
          : (std::filesystem::path(f.restore) / "config.textproto").string());
}

// A model from the checkpoint in `dir`, its config adjusted by the flags
// (AdjustConfig: a checkpoint restores on either device, in either
// precision).
absl::StatusOr<std::unique_ptr<model::Model>> LoadModel(const ServerFlags& f,
                                                        const std::string& dir,
                                                        bool weights_only) {
  return model::LoadCheckpointWith(
      dir, weights_only,
      [&f](ModelConfig* config) { return AdjustAndCheck(f, config); });
}

// The config a resume from the checkpoint in `dir` runs with: the
// checkpoint's, adjusted by the flags; with --config given, that config
// where it differs only in what a trained model may change
// (core/config_change.h), each change put in *changes.
// FailedPrecondition naming an immutable field that differs; the
// checkpoint config's own errors otherwise.
absl::StatusOr<ModelConfig> ResumedConfig(
    const ServerFlags& f, const std::string& dir,
    std::vector<ConfigDifference>* changes) {
  ASSIGN_OR_RETURN(
      ModelConfig saved,
      ConfigOnDevice(
          f, (std::filesystem::path(dir) / "config.textproto").string()));
  changes->clear();
  if (!f.config_given) return saved;
  ASSIGN_OR_RETURN(ModelConfig next, ConfigOnDevice(f, f.config));
  return ResumeConfig(saved, next, changes);
}

}  // namespace dlrm::server
