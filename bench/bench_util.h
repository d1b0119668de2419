// What the benchmarks share: the median they report, synthetic batches
// generated ahead of the timing, and timed training steps of a model in
// this process.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/statusor.h"
#include "data/batch.h"
#include "data/synthetic.h"
#include "dlrm/config.pb.h"
#include "model/model.h"

namespace dlrm::bench {

// The median of `v` (the upper one of an even count); 0 when empty.
double Median(std::vector<double> v);

// `count` batches of `size` samples of `config`'s shape from the synthetic
// stream of `options`. Internal if the stream ends first (it has
// options.num_samples > 0 and too few).
absl::StatusOr<std::vector<data::Batch>> SyntheticBatches(
    const ModelConfig& config, const data::SyntheticOptions& options, int count,
    int64_t size);

// Runs `steps` training steps of `model` on `batches` in rotation, from
// batch *next on (advanced past them), and returns their samples per
// second of wall time. The model's errors.
absl::StatusOr<double> TimedSteps(model::Model& model,
                                  const std::vector<data::Batch>& batches,
                                  int steps, int64_t* next);

// What RunTimedSteps measured.
struct StepTimings {
  // Samples per second of each round.
  std::vector<double> rates;
  // The timed steps' stage times and exchanged bytes, summed.
  model::StageTimes times;
  // The RocksDB tables' counters after the warm-up and after the rounds.
  embedding::StoreMetrics warm, timed;
};

// `warmup` untimed steps of `model`, then `repeats` rounds of `iters` timed
// ones, on `batches` in rotation (each step given the next batch, for the
// prefetch, when `prefetch`); `before_round` (may be empty) runs before
// each round's clock starts. A round's rate counts `batch` samples a step
// (the global batch on several ranks). The model's errors.
absl::StatusOr<StepTimings> RunTimedSteps(
    model::Model& model, const std::vector<data::Batch>& batches, bool prefetch,
    int warmup, int repeats, int iters, int64_t batch,
    const std::function<absl::Status()>& before_round = nullptr);

}  // namespace dlrm::bench
