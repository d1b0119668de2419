// Training and evaluation loops over BatchSources: Train for dlrm_train and
// the benchmarks, Evaluate also for the server (ModelHost::Evaluate).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>

#include "absl/status/statusor.h"
#include "data/batch.h"
#include "data/source.h"
#include "model/metrics.h"
#include "model/model.h"

namespace dlrm::model {

// Scores a batch with something other than the model (for synthetic data,
// the planted teacher): writes batch.size probabilities.
using ReferenceScorer = std::function<void(const data::Batch&, float*)>;

struct EvalOptions {
  // Samples per Predict call. Default: 8192.
  int64_t batch_size = 8192;
  // Stop after this many samples; 0 = the whole source. Default: 0.
  int64_t max_samples = 0;

  absl::Status Validate() const;
};

struct EvalResult {
  EvalMetrics model;
  // Metrics of the ReferenceScorer on the same samples, when one was given.
  EvalMetrics reference;
  bool has_reference = false;
};

// Click probabilities of a batch: a model's Predict, or a server's, which
// takes its lock per batch.
using PredictFn =
    std::function<absl::Status(const data::Batch&, std::vector<float>*)>;

// Rewinds `source`, then scores up to max_samples samples with `predict`,
// and with `reference` (may be null) beside it. Stops with Cancelled when
// `cancel` (may be null) becomes true; FailedPrecondition for an empty
// source; reading and prediction errors as they come.
absl::StatusOr<EvalResult> Evaluate(const PredictFn& predict,
                                    data::BatchSource& source,
                                    const EvalOptions& options,
                                    const ReferenceScorer& reference = nullptr,
                                    const std::atomic<bool>* cancel = nullptr);

// Evaluate with `model`'s Predict (collective on several ranks).
absl::StatusOr<EvalResult> Evaluate(Model& model, data::BatchSource& source,
                                    const EvalOptions& options,
                                    const ReferenceScorer& reference = nullptr);

struct TrainOptions {
  // Samples per step. Default: 2048.
  int64_t batch_size = 2048;
  // Passes over the training source. Default: 1.
  int epochs = 1;
  // Stop after this many steps; 0 = run all epochs. Default: 0.
  int64_t max_steps = 0;
  // Evaluate every this many steps (and at the end); 0 = only at the end.
  // Default: 0.
  int64_t eval_interval = 0;
  // Report progress every this many steps. Default: 100.
  int64_t log_interval = 100;

  absl::Status Validate() const;
};

struct TrainProgress {
  int64_t step = 0;
  int64_t samples = 0;
  int epoch = 0;
  // Mean loss over the steps since the last report.
  double loss = 0;
  // Training samples/s since the last report (model time only, not reading).
  double samples_per_second = 0;
  // Seconds of wall time since training began.
  double elapsed_seconds = 0;
  StageTimes stage_seconds;  // summed since the last report
};

struct TrainResult {
  int64_t steps = 0;
  int64_t samples = 0;
  double seconds = 0;        // wall time of the whole loop
  double model_seconds = 0;  // time inside TrainStep
  double final_loss = 0;     // mean loss of the last report window
  StageTimes stage_seconds;  // summed over all steps
};

struct TrainCallbacks {
  // Called every log_interval steps and at the end.
  std::function<void(const TrainProgress&)> on_progress;
  // Called after each evaluation (every eval_interval steps and at the end).
  std::function<void(int64_t step, const EvalResult&)> on_eval;
};

// Trains on `train` for the configured epochs/steps, evaluating on `eval`
// (may be null) as configured. Errors from reading or from a bad batch stop
// the loop and are returned.
absl::StatusOr<TrainResult> Train(Model& model, data::BatchSource& train,
                                  data::BatchSource* eval,
                                  const TrainOptions& options,
                                  const EvalOptions& eval_options,
                                  const TrainCallbacks& callbacks,
                                  const ReferenceScorer& reference = nullptr);

}  // namespace dlrm::model
