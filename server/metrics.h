// The server's Prometheus metrics: training throughput and loss, the train
// stream's queue, evaluation results, prediction latency and micro-batch
// sizes, per-stage step times, the row caches of RocksDB-tier tables and
// requests by method and code, and the process' own series (CPU, memory,
// open files, start time, build). Rendered in
// the Prometheus text exposition format (version 0.0.4) for /metrics and
// Admin.GetMetrics. Series names are listed in docs/metrics.md.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "model/metrics.h"
#include "model/model.h"
#include "server/model_host.h"

namespace dlrm::server {

// Appends the standard process series of this process (from /proc:
// process_cpu_seconds_total, process_resident_memory_bytes,
// process_start_time_seconds, process_open_fds) and dlrm_build_info
// {version, git} (core/version.h) to `out`. A series whose source cannot
// be read is left out.
void RenderProcessMetrics(std::string* out);

// A Prometheus histogram with fixed bucket upper bounds (ascending; the
// +Inf bucket is implicit). Not thread-safe (ServerMetrics locks).
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);

  void Observe(double value);
  // Appends the _bucket, _sum and _count lines of series `name`.
  void Render(absl::string_view name, std::string* out) const;

  int64_t count() const { return count_; }
  double sum() const { return sum_; }

 private:
  std::vector<double> bounds_;
  std::vector<int64_t> counts_;  // per bucket, not cumulative
  int64_t count_ = 0;
  double sum_ = 0;
};

// Thread-safe: every method may be called from any thread.
class ServerMetrics {
 public:
  ServerMetrics();

  // One training step (from a stream or a job).
  void RecordTrainStep(const TrainStepOutcome& step);
  // A periodic checkpoint at `step` saved into `dir` (or failed, with an
  // empty `dir`), e.g. ModelHost::CheckpointStoppedTraining's.
  void RecordCheckpoint(const std::string& dir, int64_t step, bool failed);
  // The train stream's queue: batches read and waiting for the trainer.
  void SetTrainQueueDepth(int64_t depth);
  void SetTrainQueueCapacity(int64_t capacity);
  // The stream reactor held back a read because the queue was full.
  void RecordTrainReadStall();
  // An evaluation finished (Evaluate RPC or a job's evaluation).
  void RecordEval(const model::EvalMetrics& metrics);
  // One Predict request, from arrival to reply.
  void RecordPredictLatency(double seconds);
  // One model call of the micro-batcher: samples and requests it joined.
  void RecordPredictBatch(int64_t samples, int64_t requests);
  // A finished RPC; `method` is the full name ("/dlrm.Predictor/Predict").
  void RecordRpc(absl::string_view method, absl::StatusCode code);
  // A checkpoint follower (server/checkpoint_follower.h) swapped a newer
  // checkpoint in.
  void RecordCheckpointSwap();
  // A checkpoint follower skipped a checkpoint (damaged, half-written, of
  // another architecture), counted once per state of its files.
  void RecordCheckpointSwapFailure();

  // Where Render reads the ranks' heartbeats and failures from (a job of
  // several ranks: ModelHost::Health); unset, there are none. Call
  // before the server serves.
  void SetRankHealthSource(std::function<std::vector<RankHealth>()> source);
  // What Render reports as dlrm_dense_info{precision, isa, cpu}: the
  // precision the dense part runs at, the oneDNN matmul implementation
  // ("cuda" on a GPU) and the CPU model (ModelInfo's dense_precision,
  // dense_isa, cpu_model). Unset, the series is left out.
  void SetDenseInfo(DensePrecision precision, std::string isa, std::string cpu);

  // The text exposition; `model_steps` is the model's step count and
  // `served` the checkpoint it serves.
  std::string Render(int64_t model_steps,
                     const ServedCheckpoint& served = ServedCheckpoint()) const;

 private:
  // RecordCheckpoint with mu_ held.
  void RecordCheckpointLocked(const std::string& dir, int64_t step,
                              bool failed);

  mutable std::mutex mu_;
  int64_t train_steps_ = 0;
  int64_t train_samples_ = 0;
  double train_seconds_ = 0;
  double last_loss_ = 0;
  double last_samples_per_second_ = 0;
  // By stage name, in the order the model reports them.
  std::vector<std::pair<std::string, double>> last_stage_seconds_;
  std::map<std::string, double> total_stage_seconds_;
  // Bytes rank 0 sent to other ranks, by exchange (several ranks only).
  std::map<std::string, int64_t> exchange_bytes_total_;
  // Each RocksDB-tier table's cache as of the last training step.
  std::vector<TableStoreStats> stores_;
  // Periodic checkpoints saved and failed, and the step of the last saved.
  int64_t checkpoints_saved_ = 0;
  int64_t checkpoints_failed_ = 0;
  int64_t last_checkpoint_step_ = -1;
  // Checkpoints a follower swapped in and skipped.
  int64_t checkpoint_swaps_ = 0;
  int64_t checkpoint_swap_failures_ = 0;
  int64_t queue_depth_ = 0;
  int64_t queue_depth_max_ = 0;
  int64_t queue_capacity_ = 0;
  int64_t read_stalls_ = 0;
  bool has_eval_ = false;
  model::EvalMetrics last_eval_;
  int64_t evals_ = 0;
  Histogram predict_latency_;
  Histogram predict_batch_samples_;
  Histogram predict_batch_requests_;
  std::map<std::pair<std::string, std::string>, int64_t> rpcs_;
  std::function<std::vector<RankHealth>()> rank_health_;
  // SetDenseInfo's; empty isa_ until it is called.
  DensePrecision dense_precision_ = PRECISION_AUTO;
  std::string dense_isa_, cpu_model_;
};

}  // namespace dlrm::server
