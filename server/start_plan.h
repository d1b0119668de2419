// How dlrm_server starts: the one choice among a resume, a restore, a
// replica's follow and a fresh model (ChooseStart), the resume's try of
// each checkpoint newest first (ResumeNewestFirst), and the model config
// the flags make of a preset, a file or a checkpoint (AdjustAndCheck and
// the functions beside it). Used by a run (server_start.h) and --dry-run
// (dry_run.h) alike, so that a dry run fails where a run would.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/config_change.h"
#include "dlrm/config.pb.h"
#include "embedding/sharding.h"
#include "model/checkpoint.h"
#include "model/memory_plan.h"
#include "model/model.h"
#include "server/server_flags.h"

namespace dlrm::server {

// Where a run's model comes from, chosen once (ChooseStart).
struct StartPlan {
  enum class Kind {
    kFresh,    // a new model of --config
    kRestore,  // the checkpoint of --restore
    kResume,   // the newest checkpoint under --checkpoint-dir that restores
    kFollow,   // a replica: the newest checkpoint of --follow's directory
  };
  Kind kind = Kind::kFresh;
  // kRestore: --restore; kResume: the newest checkpoint with a valid
  // manifest, whose config every rank plans from; else empty.
  std::string dir;
  // kResume on the rank that chose (rank 0): every checkpoint with a valid
  // manifest, newest first, to try in turn; else empty.
  std::vector<model::CheckpointEntry> candidates;
};

// The start the flags ask for: --follow, else --restore, else a resume
// when --checkpoint-dir holds a checkpoint with a valid manifest
// (Resumes), else a fresh model. Listing a resume's checkpoints removes
// partial ones first and logs those skipped (not on a dry run, which
// touches and logs nothing). FailedPrecondition when there are checkpoints
// but none has a valid manifest: no silent fresh start.
absl::StatusOr<StartPlan> ChooseStart(const ServerFlags& f);

// Restores the checkpoint `entry` into the run's model and returns its
// step; puts what --config changes of its config in *changes. Sets *fatal
// when its error must end the resume instead of trying an older
// checkpoint (a config change the checkpoint forbids).
using RestoreCheckpointFn = std::function<absl::StatusOr<int64_t>(
    const model::CheckpointEntry& entry, std::vector<ConfigDifference>* changes,
    bool* fatal)>;

// A resume (start.kind kResume): `restore` of each of start.candidates,
// newest first, until one succeeds; a failed one is skipped with a
// warning. Logs the one resumed from and its config changes, and sets
// f->server.resume_job and f->server.loaded_from from it. An error
// `restore` marks fatal, ResourceExhausted (a model too big for this
// machine) and Unavailable (a broken job) end the resume with that error;
// FailedPrecondition naming --checkpoint-dir when none restores.
absl::Status ResumeNewestFirst(const StartPlan& start,
                               const RestoreCheckpointFn& restore,
                               ServerFlags* f);

// The config of a run of `start` that every rank plans from: a resume's
// (ResumedConfig of start.dir), else RunConfig. Clears *changes or fills
// them (a resume).
absl::StatusOr<ModelConfig> StartConfig(const ServerFlags& f,
                                        const StartPlan& start,
                                        std::vector<ConfigDifference>* changes);

// The model config at `spec` (a preset, a file, a checkpoint's
// config.textproto) adjusted by the flags: --device, --precision, --tf32,
// the storage flags and the device budget (--device-memory-budget-mb, else
// the config's, else on a GPU its free memory less a reserve for the dense
// part).
absl::StatusOr<ModelConfig> ConfigOnDevice(const ServerFlags& f,
                                           const std::string& spec);

// What a config loaded for a model goes through: the flags' adjustments
// (ConfigOnDevice) and, for one process, CheckMemoryOf.
absl::Status AdjustAndCheck(const ServerFlags& f, ModelConfig* config);

// The model config a run uses: with --restore the checkpoint's, so that
// every rank plans from it (the restore itself checks the plan).
absl::StatusOr<ModelConfig> RunConfig(const ServerFlags& f);

// The config a resume from the checkpoint in `dir` runs with: the
// checkpoint's, adjusted by the flags; with --config given, that config
// where it differs only in what a trained model may change
// (core/config_change.h), each change put in *changes.
// FailedPrecondition naming an immutable field that differs; the
// checkpoint config's own errors otherwise.
absl::StatusOr<ModelConfig> ResumedConfig(
    const ServerFlags& f, const std::string& dir,
    std::vector<ConfigDifference>* changes);

// A model from the checkpoint in `dir`, its config adjusted by the flags
// (AdjustAndCheck: a checkpoint restores on either device, in either
// precision).
absl::StatusOr<std::unique_ptr<model::Model>> LoadModel(const ServerFlags& f,
                                                        const std::string& dir,
                                                        bool weights_only);

// The sharding plan of a run of `config`: --world-size, --memory-budget-mb
// and the config's device budget; a table that fits nowhere says what
// --memory-budget-mb is (model::ExplainShardingBudget).
absl::StatusOr<embedding::ShardingPlan> PlanShardingOf(
    const ServerFlags& f, const ModelConfig& config);

// The memory plan of this rank of `config` under `plan` (null: one process)
// at a job's default batch of 2048 samples, logged unless on a dry run, and
// checked against the machine's memory (model::CheckMemory) before the
// model is allocated: the plan, or ResourceExhausted naming the fix.
absl::StatusOr<model::MemoryPlan> CheckMemoryOf(
    const ServerFlags& f, const ModelConfig& config,
    const embedding::ShardingPlan* plan);

}  // namespace dlrm::server
