// ModelHost: the model behind one lock, plus the training reservation.
#include "server/model_host.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <utility>

#include "absl/strings/str_cat.h"
#include "comm/communicator.h"
#include "core/clock.h"
#include "core/config.h"
#include "core/status.h"
#include "dense/cpu_isa.h"
#include "embedding/sharding.h"
#include "model/memory_plan.h"
#include "model/metrics.h"
#include "spdlog/spdlog.h"

namespace dlrm::server {
namespace {

data::BatchShape ShapeOf(const ModelConfig& config) {
  data::BatchShape shape;
  shape.num_dense = config.num_dense_features();
  shape.id_limits = data::TableIdLimits(config);
  return shape;
}

// True when a model of `b` can take the place of one of `a`: same inputs,
// tables and layers (optimizers and seeds may differ).
bool SameArchitecture(const ModelConfig& a, const ModelConfig& b) {
  if (a.num_dense_features() != b.num_dense_features() ||
      a.tables_size() != b.tables_size() ||
      a.interaction() != b.interaction() ||
      !DifferentInteractionField(a, b).empty() ||
      a.bottom_mlp_size() != b.bottom_mlp_size() ||
      a.top_mlp_size() != b.top_mlp_size()) {
    return false;
  }
  for (int t = 0; t < a.tables_size(); ++t) {
    const TableConfig &x = a.tables(t), &y = b.tables(t);
    if (x.rows() != y.rows() || x.dim() != y.dim() ||
        x.pooling() != y.pooling()) {
      return false;
    }
  }
  for (int i = 0; i < a.bottom_mlp_size(); ++i) {
    if (a.bottom_mlp(i) != b.bottom_mlp(i)) return false;
  }
  for (int i = 0; i < a.top_mlp_size(); ++i) {
    if (a.top_mlp(i) != b.top_mlp(i)) return false;
  }
  return true;
}

// A one-process model in a rank group of one (its own single-rank
// communicator; the group's only carries the no-op commands).
absl::StatusOr<std::unique_ptr<RankGroup>> GroupOfOne(
    std::unique_ptr<model::Model> model) {
  return RankGroup::Create(comm::MakeSingleRankCommunicator(), std::move(model),
                           RankGroupOptions());
}

// The served-checkpoint record of `dir`, restored at `step`.
ServedCheckpoint ServedFrom(const std::string& dir, int64_t step) {
  ServedCheckpoint served;
  served.dir = dir;
  served.step = step;
  absl::StatusOr<model::Manifest> manifest = model::ReadManifest(dir);
  if (manifest.ok()) served.created_ms = manifest->created_ms;
  return served;
}

}  // namespace

absl::Status ModelHostOptions::Validate() const {
  if (checkpoint_every_steps < 0 || !(checkpoint_every_seconds >= 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint_every_steps (", checkpoint_every_steps,
                     ") and checkpoint_every_seconds (",
                     checkpoint_every_seconds, ") must be >= 0"));
  }
  if (compute_threads < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("compute_threads = ", compute_threads, " must be >= 0"));
  }
  if (keep_checkpoints < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("keep_checkpoints = ", keep_checkpoints, " must be >= 0"));
  }
  if (periodic() && checkpoint_dir.empty()) {
    return absl::InvalidArgumentError(
        "periodic checkpoints (checkpoint_every_steps or "
        "checkpoint_every_seconds) need checkpoint_dir");
  }
  if (periodic() && inference_only) {
    return absl::InvalidArgumentError(
        "an inference-only server does not train, so it takes no periodic "
        "checkpoints");
  }
  return absl::OkStatus();
}

ModelHost::TrainingLease::TrainingLease(TrainingLease&& other) noexcept
    : host_(std::exchange(other.host_, nullptr)) {}

ModelHost::TrainingLease& ModelHost::TrainingLease::operator=(
    TrainingLease&& other) noexcept {
  if (this != &other) {
    if (host_ != nullptr) host_->ReleaseTraining();
    host_ = std::exchange(other.host_, nullptr);
  }
  return *this;
}

ModelHost::TrainingLease::~TrainingLease() {
  if (host_ != nullptr) host_->ReleaseTraining();
}

ModelHost::ModelHost(std::unique_ptr<RankGroup> group, ModelHostOptions options)
    : options_(std::move(options)),
      config_(group->config()),
      shape_(ShapeOf(config_)),
      group_(std::move(group)),
      serving_(MakeServing(group_)),
      steps_(group_->steps()),
      last_checkpoint_time_(MonotonicSeconds()),
      last_saved_step_(steps_.load()) {
  if (!options_.loaded_from.empty()) {
    served_ = ServedFrom(options_.loaded_from, steps_.load());
  }
}

namespace {

// Predictions between two training steps: the group's Predict under the
// host's model lock.
class BetweenSteps final : public model::Predictor {
 public:
  BetweenSteps(std::mutex* model_mu, RankGroup* group)
      : model_mu_(model_mu), group_(group) {}
  absl::Status Predict(const data::Batch& batch, std::vector<float>* probs,
                       int64_t* step) override {
    std::lock_guard<std::mutex> lock(*model_mu_);
    RETURN_IF_ERROR(group_->Predict(batch, probs));
    *step = group_->steps();
    return absl::OkStatus();
  }

 private:
  std::mutex* const model_mu_;
  RankGroup* const group_;
};

}  // namespace

std::shared_ptr<ModelHost::Serving> ModelHost::MakeServing(
    std::shared_ptr<RankGroup> group) {
  auto serving = std::make_shared<Serving>();
  serving->group = std::move(group);
  serving->between =
      std::make_unique<BetweenSteps>(&model_mu_, serving->group.get());
  serving->predictor = serving->between.get();
  if (serving->group->world_size() == 1) {
    absl::StatusOr<std::unique_ptr<model::SnapshotPredictor>> predictor =
        model::SnapshotPredictor::Create(serving->group->local_model());
    if (predictor.ok()) {
      serving->snapshot = std::move(*predictor);
      serving->predictor = serving->snapshot.get();
      const model::Model* m = serving->group->local_model();
      spdlog::info(
          "predictions run beside training steps, on the weights of the last "
          "completed one{}{}",
          m->shards().has_database()
              ? " (tables on RocksDB read through their caches, unchanged)"
              : "",
          m->config().device() == DEVICE_CUDA
              ? " (the dense part on a second CUDA backend, its own stream)"
              : "");
    } else {
      spdlog::info("predictions run between training steps: {}",
                   std::string(predictor.status().message()));
    }
  } else {
    model::RanksPredictor* ranks = serving->group->ranks_predictor();
    if (ranks != nullptr) {
      serving->fallback = std::make_unique<model::FallbackPredictor>(
          ranks, serving->between.get());
      serving->predictor = serving->fallback.get();
      spdlog::info("predictions run beside training on {} ranks",
                   serving->group->world_size());
    }
  }
  return serving;
}

std::shared_ptr<ModelHost::Serving> ModelHost::CurrentServing() {
  std::lock_guard<std::mutex> lock(serving_mu_);
  return serving_;
}

ServedCheckpoint ModelHost::served_checkpoint() {
  std::lock_guard<std::mutex> lock(served_mu_);
  return served_;
}

absl::StatusOr<std::unique_ptr<ModelHost>> ModelHost::Create(
    std::unique_ptr<RankGroup> group, ModelHostOptions options) {
  if (group == nullptr || group->rank() != 0) {
    return absl::InvalidArgumentError(
        "ModelHost needs the rank group of rank 0 (the leader)");
  }
  RETURN_IF_ERROR(options.Validate());
  if (options.inference_only && group->world_size() > 1) {
    return absl::InvalidArgumentError(
        "inference-only serving runs on one rank only");
  }
  return std::unique_ptr<ModelHost>(
      new ModelHost(std::move(group), std::move(options)));
}

absl::StatusOr<std::unique_ptr<ModelHost>> ModelHost::Create(
    std::unique_ptr<model::Model> model, ModelHostOptions options) {
  if (model == nullptr) {
    return absl::InvalidArgumentError("ModelHost needs a model");
  }
  ASSIGN_OR_RETURN(std::unique_ptr<RankGroup> group,
                   GroupOfOne(std::move(model)));
  return Create(std::move(group), std::move(options));
}

void ModelHost::UseComputeThreads() const {
  if (options_.compute_threads > 0)
    omp_set_num_threads(options_.compute_threads);
}

absl::StatusOr<ModelHost::TrainingLease> ModelHost::AcquireTraining(
    const std::string& holder) {
  if (options_.inference_only) {
    return absl::FailedPreconditionError(
        "the server is inference-only (started with --inference-only); it "
        "does not train");
  }
  {
    std::lock_guard<std::mutex> lock(model_mu_);
    if (training_stopped_) {
      return absl::UnavailableError("the server is shutting down");
    }
  }
  std::lock_guard<std::mutex> lock(lease_mu_);
  if (!training_holder_.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "training is busy: ", training_holder_,
        " is running; one training job or stream runs at a time (cancel it "
        "or wait for it to finish)"));
  }
  training_holder_ = holder.empty() ? "a trainer" : holder;
  return TrainingLease(this);
}

void ModelHost::ReleaseTraining() {
  std::lock_guard<std::mutex> lock(lease_mu_);
  training_holder_.clear();
}

absl::StatusOr<TrainStepOutcome> ModelHost::TrainStep(
    const TrainingLease& lease, const data::Batch& batch,
    const std::function<std::string()>& job, const data::Batch* next) {
  RETURN_IF_ERROR(CheckLease(lease, "TrainStep"));
  return LeasedStep(job, [&] { return group_->TrainStep(batch, next); });
}

absl::Status ModelHost::OpenTrainData(const TrainingLease& lease,
                                      const DatasetSpec& spec) {
  RETURN_IF_ERROR(CheckLease(lease, "OpenTrainData"));
  std::lock_guard<std::mutex> lock(model_mu_);
  return group_->OpenData(spec);
}

absl::Status ModelHost::CloseTrainData(const TrainingLease& lease) {
  RETURN_IF_ERROR(CheckLease(lease, "CloseTrainData"));
  std::lock_guard<std::mutex> lock(model_mu_);
  return group_->CloseData();
}

absl::StatusOr<TrainStepOutcome> ModelHost::TrainStepAt(
    const TrainingLease& lease, SampleRange batch,
    const std::function<std::string()>& job, const SampleRange* next) {
  RETURN_IF_ERROR(CheckLease(lease, "TrainStepAt"));
  return LeasedStep(job, [&] { return group_->TrainStepAt(batch, next); });
}

absl::Status ModelHost::CheckLease(const TrainingLease& lease,
                                   const char* what) const {
  if (lease.host_ == this) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat(what, " needs this host's training lease"));
}

absl::StatusOr<TrainStepOutcome> ModelHost::LeasedStep(
    const std::function<std::string()>& job,
    absl::FunctionRef<absl::StatusOr<model::StepResult>()> step) {
  std::lock_guard<std::mutex> lock(model_mu_);
  if (training_stopped_) {
    return absl::UnavailableError("the server is shutting down");
  }
  UseComputeThreads();
  const double start = MonotonicSeconds();
  ASSIGN_OR_RETURN(model::StepResult r, step());
  return Outcome(r, MonotonicSeconds() - start, job);
}

TrainStepOutcome ModelHost::Outcome(const model::StepResult& r, double seconds,
                                    const std::function<std::string()>& job) {
  TrainStepOutcome outcome;
  outcome.seconds = seconds;
  outcome.step = group_->steps();
  steps_.store(outcome.step);
  outcome.loss = r.loss;
  outcome.samples = r.samples;
  for (int st = 0; st < model::StageTimes::kNumStages; ++st) {
    outcome.stage_seconds.emplace_back(model::StageTimes::Name(st),
                                       r.times.seconds[st]);
  }
  if (group_->world_size() > 1) {
    for (int e = 0; e < model::StageTimes::kNumExchanges; ++e) {
      outcome.exchange_bytes.emplace_back(model::StageTimes::ExchangeName(e),
                                          r.times.bytes_sent[e]);
    }
  }
  last_dynamic_.clear();
  for (const model::RankTableStore& store : r.stores) {
    const TableConfig& t = config_.tables(store.table);
    outcome.stores.push_back(
        TableStoreStats{t.name(), store.rank, store.cache_rows, store.device,
                        store.metrics, store.dynamic, t.rows()});
    if (store.dynamic) last_dynamic_.push_back(outcome.stores.back());
  }
  outcome.checkpoint =
      MaybeCheckpoint(outcome.step, job, &outcome.checkpoint_failed);
  return outcome;
}

std::string ModelHost::MaybeCheckpoint(int64_t step,
                                       const std::function<std::string()>& job,
                                       bool* failed) {
  *failed = false;
  if (!options_.periodic()) return "";
  const double now = MonotonicSeconds();
  const bool by_steps = options_.checkpoint_every_steps > 0 &&
                        step % options_.checkpoint_every_steps == 0;
  const bool by_time =
      options_.checkpoint_every_seconds > 0 &&
      now - last_checkpoint_time_ >= options_.checkpoint_every_seconds;
  if (!by_steps && !by_time) return "";
  last_checkpoint_time_ = now;
  return SavePeriodicLocked(step, job ? job() : std::string(), failed);
}

std::string ModelHost::SavePeriodicLocked(int64_t step, const std::string& job,
                                          bool* failed) {
  const double now = MonotonicSeconds();
  const std::string dir = (std::filesystem::path(options_.checkpoint_dir) /
                           model::PeriodicCheckpointName(step))
                              .string();
  absl::StatusOr<model::CheckpointInfo> info = SaveLocked(dir, job);
  if (!info.ok()) {
    // The outcome is what is on disk: a save that failed after its commit
    // (the parent directory's last sync) left a complete checkpoint.
    absl::StatusOr<model::Manifest> on_disk = model::ReadManifest(dir);
    if (on_disk.ok() && on_disk->step == step &&
        model::VerifyCheckpointFiles(dir, *on_disk).ok()) {
      spdlog::warn(
          "periodic checkpoint {} is complete on disk although its save "
          "reported: {}",
          dir, info.status().ToString());
      info = model::CheckpointInfo{step, 0};
      for (const model::ManifestFile& f : on_disk->files)
        info->bytes += f.bytes;
    }
  }
  if (!info.ok()) {
    spdlog::error(
        "periodic checkpoint at step {} failed (training goes on): {}", step,
        info.status().ToString());
    *failed = true;
    return "";
  }
  last_saved_step_ = step;
  spdlog::info("periodic checkpoint {} at step {} ({} bytes, {:.3f} s)", dir,
               step, info->bytes, MonotonicSeconds() - now);
  const absl::Status pruned = model::PruneCheckpoints(
      options_.checkpoint_dir, options_.keep_checkpoints);
  if (!pruned.ok()) {
    spdlog::warn("pruning old checkpoints: {}", pruned.ToString());
  }
  return dir;
}

absl::StatusOr<model::CheckpointInfo> ModelHost::SaveLocked(
    const std::string& dir, const std::string& job) {
  return group_->SaveCheckpoint(dir, job);
}

absl::Status ModelHost::Predict(const data::Batch& batch,
                                std::vector<float>* probs, int64_t* step) {
  if (shut_down_.load()) {
    return absl::UnavailableError("the server's ranks are shut down");
  }
  const std::shared_ptr<Serving> serving = CurrentServing();
  UseComputeThreads();
  int64_t at = 0;
  RETURN_IF_ERROR(serving->predictor->Predict(batch, probs, &at));
  if (step != nullptr) *step = at;
  return absl::OkStatus();
}

absl::StatusOr<model::EvalResult> ModelHost::Evaluate(
    data::BatchSource& source, const model::EvalOptions& options,
    const model::ReferenceScorer& reference, const std::atomic<bool>* cancel) {
  // One Predict per batch, so other predictions interleave.
  return model::Evaluate(
      [this](const data::Batch& batch, std::vector<float>* probs) {
        return Predict(batch, probs);
      },
      source, options, reference, cancel);
}

absl::StatusOr<model::EvalResult> ModelHost::EvaluateBatches(
    std::span<const data::Batch> batches) {
  model::MetricsAccumulator acc;
  std::vector<float> probs;
  for (const data::Batch& batch : batches) {
    RETURN_IF_ERROR(Predict(batch, &probs));
    acc.Add(probs, batch.labels);
  }
  if (acc.size() == 0) {
    return absl::InvalidArgumentError("evaluation needs at least one sample");
  }
  model::EvalResult result;
  result.model = acc.Compute();
  return result;
}

absl::StatusOr<model::CheckpointInfo> ModelHost::SaveCheckpoint(
    const std::string& dir, const std::string& job) {
  if (options_.inference_only) {
    return absl::FailedPreconditionError(
        "an inference-only server holds no optimizer state, so it cannot "
        "write a checkpoint");
  }
  std::lock_guard<std::mutex> lock(model_mu_);
  return SaveLocked(dir, job);
}

absl::StatusOr<model::ExportInfo> ModelHost::ExportWeights(
    const std::string& path) {
  std::lock_guard<std::mutex> lock(model_mu_);
  return group_->ExportWeights(path);
}

absl::StatusOr<model::CheckpointInfo> ModelHost::RestoreCheckpoint(
    const std::string& dir) {
  // Held throughout, so no training can start halfway through a restore.
  std::lock_guard<std::mutex> lease_lock(lease_mu_);
  if (!training_holder_.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot restore while ", training_holder_,
                     " is training; cancel it first"));
  }
  if (!options_.inference_only) {
    std::lock_guard<std::mutex> lock(model_mu_);
    UseComputeThreads();
    absl::StatusOr<model::CheckpointInfo> info = group_->RestoreCheckpoint(dir);
    steps_.store(group_->steps());
    if (info.ok()) {
      last_saved_step_ = info->step;
      std::lock_guard<std::mutex> served_lock(served_mu_);
      served_ = ServedFrom(dir, info->step);
    }
    return info;
  }
  // Weights only (one rank): load a fresh model outside the model lock
  // (predictions go on meanwhile), then swap it in. The manifest is read
  // first: a checkpoint replaced during the load is then recorded as older
  // than it is, and a follower loads it again rather than never.
  ServedCheckpoint served = ServedFrom(dir, 0);
  ASSIGN_OR_RETURN(
      std::unique_ptr<model::Model> loaded,
      options_.adjust_loaded_config
          ? model::LoadCheckpointWith(dir, /*weights_only=*/true,
                                      options_.adjust_loaded_config)
          : model::LoadCheckpoint(dir, /*weights_only=*/true));
  if (!SameArchitecture(config_, loaded->config())) {
    return absl::FailedPreconditionError(
        absl::StrCat("the checkpoint in ", dir,
                     " has a different architecture from the served model"));
  }
  model::CheckpointInfo info;
  info.step = loaded->steps();
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    if (entry.is_regular_file(ec)) info.bytes += entry.file_size(ec);
  }
  ASSIGN_OR_RETURN(std::shared_ptr<RankGroup> group,
                   GroupOfOne(std::move(loaded)));
  std::shared_ptr<Serving> serving = MakeServing(group);
  std::shared_ptr<Serving> old;  // released after the locks
  std::lock_guard<std::mutex> lock(model_mu_);
  group_ = std::move(group);
  {
    std::lock_guard<std::mutex> serving_lock(serving_mu_);
    old = std::exchange(serving_, std::move(serving));
  }
  served.step = info.step;
  {
    std::lock_guard<std::mutex> served_lock(served_mu_);
    served_ = std::move(served);
  }
  steps_.store(group_->steps());
  return info;
}

std::string ModelHost::CheckpointStoppedTraining(const TrainingLease& lease,
                                                 bool* failed) {
  *failed = false;
  if (lease.host_ != this || !options_.periodic()) return "";
  std::lock_guard<std::mutex> lock(model_mu_);
  const int64_t step = group_->steps();
  // Ranks put out of service by the failure that stopped training cannot
  // save; that is no checkpoint that failed.
  if (training_stopped_ || step == last_saved_step_ || group_->broken()) {
    return "";
  }
  spdlog::info(
      "training stopped at step {}, after the last periodic checkpoint (step "
      "{}): saving it",
      step, last_saved_step_);
  last_checkpoint_time_ = MonotonicSeconds();
  return SavePeriodicLocked(step, /*job=*/"", failed);
}

void ModelHost::StopTraining() {
  std::lock_guard<std::mutex> lock(model_mu_);
  training_stopped_ = true;
}

absl::Status ModelHost::ShutdownRanks() {
  std::lock_guard<std::mutex> lock(model_mu_);
  training_stopped_ = true;
  shut_down_.store(true);
  return group_->Shutdown();
}

absl::StatusOr<std::pair<OptimizerConfig, OptimizerConfig>>
ModelHost::SetLearningRates(std::optional<float> dense,
                            std::optional<float> sparse) {
  if (options_.inference_only) {
    return absl::FailedPreconditionError(
        "the server is inference-only: it has no optimizer to change");
  }
  const auto check = [](std::optional<float> rate, const char* name,
                        const char* field) {
    if (!rate.has_value() || (std::isfinite(*rate) && *rate > 0)) {
      return absl::OkStatus();
    }
    return absl::InvalidArgumentError(
        absl::StrCat(name, " (", field, ") must be a finite number > 0, got ",
                     std::isnan(*rate) ? "nan" : absl::StrCat(*rate)));
  };
  RETURN_IF_ERROR(check(dense, "dense", "dense_optimizer.learning_rate"));
  RETURN_IF_ERROR(check(sparse, "sparse", "sparse_optimizer.learning_rate"));
  if (!dense.has_value() && !sparse.has_value()) {
    return absl::InvalidArgumentError(
        "give dense, sparse or both: the learning rates to set");
  }
  std::lock_guard<std::mutex> lock(model_mu_);
  if (shut_down_.load()) {
    return absl::UnavailableError("the job's ranks have been shut down");
  }
  OptimizerConfig d = group_->config().dense_optimizer();
  OptimizerConfig s = group_->config().sparse_optimizer();
  if (dense.has_value()) d.set_learning_rate(*dense);
  if (sparse.has_value()) s.set_learning_rate(*sparse);
  RETURN_IF_ERROR(group_->SetOptimizers(d, s));
  return std::make_pair(d, s);
}

std::vector<RankHealth> ModelHost::Health() {
  return CurrentServing()->group->Health();
}

ModelSummary ModelHost::Summary(bool with_checksum) {
  ModelSummary s;
  s.config = config_;
  s.embedding_parameters = EmbeddingParameterCount(config_);
  s.dense_parameters = DenseParameterCount(config_);
  s.inference_only = options_.inference_only;
  embedding::ShardingPlan plan;
  {
    // An inference-only restore replaces the group under the lock.
    std::lock_guard<std::mutex> lock(model_mu_);
    plan = group_->plan();
    s.world_size = group_->world_size();
    s.steps = group_->steps();
    s.dense_precision = group_->dense_precision();
    // SetLearningRates' changes (under this lock).
    *s.config.mutable_dense_optimizer() = group_->config().dense_optimizer();
    *s.config.mutable_sparse_optimizer() = group_->config().sparse_optimizer();
    s.dynamic_tables = last_dynamic_;
  }
  s.sharding_plan = plan.ToString(config_);
  s.cpu_model = dense::CpuModel();
  s.dense_isa = config_.device() == DEVICE_CUDA
                    ? "cuda"
                    : dense::MatmulIsa(s.dense_precision == PRECISION_BF16);
  s.served = served_checkpoint();
  s.memory_bytes = model::StateBytesByTier(config_, plan);
  if (with_checksum) {
    absl::StatusOr<uint64_t> checksum = WeightChecksum();
    s.weight_checksum = checksum.ok() ? *checksum : 0;
  }
  return s;
}

absl::StatusOr<uint64_t> ModelHost::WeightChecksum() {
  std::lock_guard<std::mutex> lock(model_mu_);
  return group_->WeightChecksum();
}

}  // namespace dlrm::server
