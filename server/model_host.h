// ModelHost: the one place the server touches the model. It owns the
// leader's RankGroup (of one rank or several) and serialises what reads or
// writes the model through it (training steps, checkpoints, exports)
// behind one mutex. Predictions on a CPU model run beside a training step
// instead, from the weights of the last completed step: on one process a
// model::SnapshotPredictor (tables in host memory or on RocksDB), on several
// ranks the group's model::RanksPredictor (the same tables; it falls back
// to the mutex when the ranks do not agree on a step);
// elsewhere they take the mutex and run between two steps. Either way a
// prediction never sees a half-updated row. Services and jobs only talk to
// this class.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "data/batch.h"
#include "data/source.h"
#include "data/wire.h"
#include "dlrm/config.pb.h"
#include "model/checkpoint.h"
#include "model/predictor.h"
#include "model/trainer.h"
#include "model/weights_export.h"
#include "server/rank_group.h"

namespace dlrm::server {

struct ModelHostOptions {
  // Serve predictions only: training and checkpoint saves are refused
  // (FailedPrecondition), restores read weights only. Default: false.
  bool inference_only = false;
  // Where periodic checkpoints go, as <dir>/ckpt-<step>; needed when either
  // period below is set. Default: empty.
  std::string checkpoint_dir;
  // Save a periodic checkpoint after every step whose number is a multiple
  // of this; 0 = never by steps. Default: 0.
  int64_t checkpoint_every_steps = 0;
  // Save a periodic checkpoint after the first step that ends this many
  // seconds after the last checkpoint (or the host's start); 0 = never by
  // time. Default: 0.
  double checkpoint_every_seconds = 0;
  // Periodic checkpoints kept (the newest); older ones are removed after
  // each save. 0 keeps every one. Default: 3.
  int keep_checkpoints = 3;
  // OpenMP threads every model call runs with, on whichever thread makes it
  // (a job's, a stream's, the predict batcher's): OpenMP's thread count is
  // per thread, so setting it once in main() reaches none of them. 0 leaves
  // each thread's own (the OpenMP default: all cores). Default: 0.
  int compute_threads = 0;
  // The checkpoint directory the model given to Create was loaded from,
  // reported as the served checkpoint (ServedCheckpoint) until a restore
  // replaces the weights; empty when it came from no checkpoint. Default:
  // empty.
  std::string loaded_from;
  // Inference-only hosts: applied to the config of every checkpoint
  // RestoreCheckpoint loads (a binary's --device, --precision, --tf32,
  // --device-memory-budget-mb; model::LoadCheckpointWith), its error
  // returned as is. Null: each checkpoint's own settings. Default: null.
  std::function<absl::Status(ModelConfig*)> adjust_loaded_config;

  absl::Status Validate() const;
  bool periodic() const {
    return checkpoint_every_steps > 0 || checkpoint_every_seconds > 0;
  }
};

// The row cache of one RocksDB-tier table: its size and its counters since
// the store was created (a checkpoint restore starts them again).
struct TableStoreStats {
  std::string table;
  // The rank whose caches these are (their shards of the table together).
  int rank = -1;
  int64_t cache_rows = 0;
  // Device caches of a STORAGE_DEVICE table (device_cache_rows), not the
  // row caches of a table on RocksDB.
  bool device = false;
  embedding::StoreMetrics metrics;
  // A dynamic table (its metrics' ids_* fields count its maps); cache_rows
  // is 0 when it has no cache.
  bool dynamic = false;
  // The table's rows (a dynamic table's capacity).
  int64_t rows = 0;
};

// One training step as the host ran it.
struct TrainStepOutcome {
  // Steps the model has taken, this one included.
  int64_t step = 0;
  // Mean BCE loss of the batch before the update.
  double loss = 0;
  int64_t samples = 0;
  // Wall time of the step, not waiting for the lock (for TrainStepAt, the
  // ranks' reading of their shares included).
  double seconds = 0;
  // Seconds of each stage of the step, by stage name (model::StageTimes).
  std::vector<std::pair<std::string, double>> stage_seconds;
  // Bytes rank 0 sent to the other ranks, by exchange (several ranks only).
  std::vector<std::pair<std::string, int64_t>> exchange_bytes;
  // The periodic checkpoint saved right after this step, if one was.
  std::string checkpoint;
  // A periodic checkpoint was due after this step and could not be saved
  // (training goes on; the error is logged).
  bool checkpoint_failed = false;
  // Every RocksDB-tier table's cache after the step, in config order (then
  // rank order on several ranks); empty when every table is in host memory.
  std::vector<TableStoreStats> stores;
};

// The checkpoint whose weights the host serves: the last one restored (or
// the one the model was loaded from). The version an inference replica
// reports (Admin.GetModelInfo, /metrics).
struct ServedCheckpoint {
  // Its directory; empty when the weights came from no checkpoint.
  std::string dir;
  // The step its weights were saved at.
  int64_t step = 0;
  // Its manifest's commit time (model::Manifest::created_ms); -1 when
  // unknown (no checkpoint, or its manifest could not be read).
  int64_t created_ms = -1;
};

// What Admin.GetModelInfo reports.
struct ModelSummary {
  ModelConfig config;
  int64_t embedding_parameters = 0;
  int64_t dense_parameters = 0;
  int64_t steps = 0;
  // Human-readable: which rank and tier holds each table ("C3 (1000000 x
  // 16) on rocksdb with a cache of 100000 rows").
  std::string sharding_plan;
  // Bytes of weights and optimizer state per storage tier.
  std::map<std::string, int64_t> memory_bytes;
  int world_size = 1;
  bool inference_only = false;
  // The precision the dense GEMMs run at (Model::dense_precision()).
  DensePrecision dense_precision = PRECISION_FP32;
  // Rank 0's CPU and the oneDNN matmul its dense part runs (ModelInfo's
  // cpu_model, dense_isa).
  std::string cpu_model;
  std::string dense_isa;
  // WeightChecksum() when asked for (0 otherwise, or when it failed).
  uint64_t weight_checksum = 0;
  ServedCheckpoint served;
  // Each rank's counters of each dynamic table, as of the last training
  // step (empty before one).
  std::vector<TableStoreStats> dynamic_tables;
};

// Thread-safe: every method may be called from any thread.
class ModelHost {
 public:
  // The right to run training steps. At most one exists per host at a time
  // (one training job or stream); destroying it gives the right back.
  class TrainingLease {
   public:
    TrainingLease(TrainingLease&& other) noexcept;
    TrainingLease& operator=(TrainingLease&& other) noexcept;
    TrainingLease(const TrainingLease&) = delete;
    TrainingLease& operator=(const TrainingLease&) = delete;
    ~TrainingLease();

   private:
    friend class ModelHost;
    explicit TrainingLease(ModelHost* host) : host_(host) {}
    ModelHost* host_;
  };

  // Serves the model of a job through its leader: takes ownership of
  // `group` (rank 0's). InvalidArgument for a follower's group, or with
  // options.inference_only on several ranks (not supported there).
  static absl::StatusOr<std::unique_ptr<ModelHost>> Create(
      std::unique_ptr<RankGroup> group, ModelHostOptions options);

  // A one-process model (non-null; config normalised) in a group of one.
  static absl::StatusOr<std::unique_ptr<ModelHost>> Create(
      std::unique_ptr<model::Model> model, ModelHostOptions options);

  // What a batch must look like for this model. Fixed for the host's life
  // (a restore must keep the architecture).
  const data::BatchShape& shape() const { return shape_; }
  // The model's normalised config as the host started (fixed for the
  // host's life; the optimizers' constants SetLearningRates changes since
  // are in Summary's).
  const ModelConfig& config() const { return config_; }
  // Replaces the learning rate of the dense optimizer (`dense`) and of the
  // tables' (`sparse`), each where given, on every rank between two steps
  // (RankGroup::SetOptimizers): the next step uses them, Summary reports
  // them and the next checkpoint saves them. A schedule multiplies the new
  // rate as it did the old. Returns the optimizers now in force.
  // InvalidArgument naming the field for a rate that is not a finite
  // number > 0 (nothing changes); FailedPrecondition on an inference-only
  // host; Unavailable once the ranks are out of service.
  absl::StatusOr<std::pair<OptimizerConfig, OptimizerConfig>> SetLearningRates(
      std::optional<float> dense, std::optional<float> sparse);
  bool inference_only() const { return options_.inference_only; }

  // Reserves training for `holder` (a description such as "job job-2",
  // used in the error others get). FailedPrecondition when another holder
  // has it or the host is inference-only; Unavailable after StopTraining().
  absl::StatusOr<TrainingLease> AcquireTraining(const std::string& holder);

  // One training step on `batch` under the model lock, then the periodic
  // checkpoint when one is due (still under the lock, so it holds exactly
  // this step's weights; a failed save is logged and training goes on).
  // When a checkpoint is taken, `job` (may be empty) is called for the
  // record of the running job as it stands after this step
  // (model::Manifest::job). InvalidArgument for a batch that does not fit
  // (the model is then unchanged); Unavailable after StopTraining().
  // `next`, when not null, is the batch the caller will train on next: the
  // rows of its ids on RocksDB start loading while this step computes (it
  // steers only that; a bad one is ignored).
  absl::StatusOr<TrainStepOutcome> TrainStep(
      const TrainingLease& lease, const data::Batch& batch,
      const std::function<std::string()>& job = nullptr,
      const data::Batch* next = nullptr);

  // Every rank opens `spec` (ResolveDataset's, server/datasets.h) as the
  // data TrainStepAt reads: RankGroup::OpenData. FailedPrecondition without
  // this host's `lease`.
  absl::Status OpenTrainData(const TrainingLease& lease,
                             const DatasetSpec& spec);
  // Every rank drops that data. FailedPrecondition without `lease`.
  absl::Status CloseTrainData(const TrainingLease& lease);

  // TrainStep on samples `batch` of the data OpenTrainData opened, each
  // rank reading its own share (RankGroup::TrainStepAt, whose errors it
  // returns); `next` (may be null) the range the caller trains on next.
  // Checkpoints and `job` as TrainStep.
  absl::StatusOr<TrainStepOutcome> TrainStepAt(
      const TrainingLease& lease, SampleRange batch,
      const std::function<std::string()>& job = nullptr,
      const SampleRange* next = nullptr);

  // Click probabilities of every sample of `batch` into `probs` (resized),
  // and into *step (when not null) the number of training steps of the
  // weights that gave them. Beside a running step where the model allows it
  // (model::SnapshotPredictor, model::RanksPredictor), else between two
  // steps. InvalidArgument for a batch that does not fit; Unavailable after
  // ShutdownRanks().
  absl::Status Predict(const data::Batch& batch, std::vector<float>* probs,
                       int64_t* step = nullptr);

  // Scores up to options.max_samples samples of `source` (rewound first),
  // one Predict per batch, so other predictions interleave. `reference` may be
  // null. Stops with Cancelled when `cancel` (may be null) becomes true;
  // FailedPrecondition for an empty source; reading errors as the source's.
  absl::StatusOr<model::EvalResult> Evaluate(
      data::BatchSource& source, const model::EvalOptions& options,
      const model::ReferenceScorer& reference,
      const std::atomic<bool>* cancel = nullptr);

  // Scores already converted batches (each must fit the model).
  absl::StatusOr<model::EvalResult> EvaluateBatches(
      std::span<const data::Batch> batches);

  // Writes a checkpoint of the current weights to `dir` (taken between
  // steps), with `job` as its manifest's job record. FailedPrecondition on
  // an inference-only host; Internal on I/O errors.
  absl::StatusOr<model::CheckpointInfo> SaveCheckpoint(
      const std::string& dir, const std::string& job = "");

  // Writes the weights to the safetensors file `path` (docs/export.md
  // "Weights export"), replacing it only once the new one is complete;
  // taken between steps. On several ranks the leader gathers every table.
  // Errors name the path: ResourceExhausted for a full disk, Internal for
  // other I/O errors; Unavailable once the ranks are out of service.
  absl::StatusOr<model::ExportInfo> ExportWeights(const std::string& path);

  // Replaces weights (and optimizer state unless inference-only) from the
  // checkpoint in `dir`, which becomes the served checkpoint. On an
  // inference-only host the new model is loaded beside the served one and
  // swapped in, so predictions in flight finish on the old weights and
  // none waits for the load. FailedPrecondition while training is reserved
  // or when the checkpoint's architecture differs; NotFound when `dir`
  // holds no checkpoint; DataLoss naming the file when a file it reads
  // differs from the manifest's size or CRC-32C. On error the model (and
  // the served checkpoint) is unchanged.
  absl::StatusOr<model::CheckpointInfo> RestoreCheckpoint(
      const std::string& dir);

  // With periodic checkpoints on (options.checkpoint_every_steps or
  // _seconds), when training stopped between two (a job that ran to its
  // end or was cancelled by its client, a Train stream that ended): saves
  // the current step as <checkpoint_dir>/ckpt-<step> unless the last
  // periodic checkpoint holds it already, and prunes as a periodic save
  // does, so that a replica following the directory (--follow) catches
  // up. Returns the directory, or "" when none was due, after
  // StopTraining(), when the ranks are out of service (the failure that
  // stopped training broke them), or when the save failed (logged, *failed
  // set; training goes on). Needs this host's `lease`.
  std::string CheckpointStoppedTraining(const TrainingLease& lease,
                                        bool* failed);

  // Refuses every later training step and reservation (server shutdown):
  // a running trainer stops at its next step boundary. Irreversible.
  void StopTraining();

  // Tells the other ranks (if any) to exit once the current operation is
  // over; every later model call fails with Unavailable. Call after the
  // services have stopped. The error of a job already broken.
  absl::Status ShutdownRanks();

  // What GetModelInfo reports; `with_checksum` adds WeightChecksum().
  ModelSummary Summary(bool with_checksum = false);
  // RankGroup::Health of the group predictions read: every rank > 0's last
  // heartbeat and failures (empty on one rank). Does not wait for a step.
  std::vector<RankHealth> Health();
  // Steps the model has taken; does not wait for a running step.
  int64_t steps() const { return steps_.load(); }
  // The checkpoint served now; does not wait for a running step.
  ServedCheckpoint served_checkpoint();
  // model::Model::WeightChecksum over every rank: equal for equal weights
  // whatever the rank count and plan. Unavailable when the job is broken.
  absl::StatusOr<uint64_t> WeightChecksum();

 private:
  ModelHost(std::unique_ptr<RankGroup> group, ModelHostOptions options);
  void ReleaseTraining();
  // Sets the calling thread's OpenMP thread count to
  // options_.compute_threads (when set), before model work on it.
  void UseComputeThreads() const;
  // OK when `lease` is this host's; FailedPrecondition naming `what` else.
  absl::Status CheckLease(const TrainingLease& lease, const char* what) const;
  // A training step under the model's lock: Unavailable once training has
  // stopped; else runs `step` on the compute threads and returns its
  // outcome for `job`.
  absl::StatusOr<TrainStepOutcome> LeasedStep(
      const std::function<std::string()>& job,
      absl::FunctionRef<absl::StatusOr<model::StepResult>()> step);
  // With model_mu_ held, after step `r` that took `seconds`: its outcome,
  // with the periodic checkpoint MaybeCheckpoint took.
  TrainStepOutcome Outcome(const model::StepResult& r, double seconds,
                           const std::function<std::string()>& job);
  // With model_mu_ held, after a step: saves and prunes the periodic
  // checkpoint if one is due; returns its directory ("" if none, and
  // *failed says whether one was due but could not be saved).
  std::string MaybeCheckpoint(int64_t step,
                              const std::function<std::string()>& job,
                              bool* failed);
  // With model_mu_ held: saves <checkpoint_dir>/ckpt-<step> with the job
  // record `job` and prunes; its directory, or "" with *failed set.
  std::string SavePeriodicLocked(int64_t step, const std::string& job,
                                 bool* failed);
  // With model_mu_ held.
  absl::StatusOr<model::CheckpointInfo> SaveLocked(const std::string& dir,
                                                   const std::string& job);

  // What predictions read: the group (kept alive while a prediction uses
  // its model, even after an inference-only restore replaced it) and the
  // one predictor a prediction calls: beside the step where the model
  // allows it (model::SnapshotPredictor on one rank, the group's
  // model::RanksPredictor on several, falling back to between steps when
  // the ranks cannot agree), else between steps under model_mu_.
  struct Serving {
    std::shared_ptr<RankGroup> group;
    std::unique_ptr<model::Predictor> snapshot;  // may be null
    std::unique_ptr<model::Predictor> between;
    std::unique_ptr<model::Predictor> fallback;  // may be null
    model::Predictor* predictor = nullptr;       // one of the above
  };
  // The Serving of `group`.
  std::shared_ptr<Serving> MakeServing(std::shared_ptr<RankGroup> group);
  std::shared_ptr<Serving> CurrentServing();

  const ModelHostOptions options_;
  const ModelConfig config_;
  const data::BatchShape shape_;

  std::mutex model_mu_;  // guards group_
  // The last training step's dynamic tables' counters (ModelSummary's);
  // guarded by model_mu_.
  std::vector<TableStoreStats> last_dynamic_;
  // The leader of the job's ranks (which takes its own lock per operation).
  std::shared_ptr<RankGroup> group_;
  std::mutex serving_mu_;               // guards serving_ (the pointer)
  std::shared_ptr<Serving> serving_;    // over group_
  std::atomic<bool> shut_down_{false};  // ShutdownRanks() was called
  bool training_stopped_ = false;       // guarded by model_mu_
  // group_->steps(), readable without waiting for a step to end.
  std::atomic<int64_t> steps_{0};
  // When the last periodic checkpoint (or the host's start) was; guarded
  // by model_mu_.
  double last_checkpoint_time_ = 0;
  // The step of the last periodic checkpoint, or of the weights the host
  // started with or restored (held by a checkpoint, or step 0); guarded by
  // model_mu_.
  int64_t last_saved_step_ = 0;

  std::mutex served_mu_;     // guards served_
  ServedCheckpoint served_;  // what served_checkpoint() returns

  std::mutex lease_mu_;          // guards training_holder_
  std::string training_holder_;  // empty = free
};

}  // namespace dlrm::server
