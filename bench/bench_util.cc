// The benchmarks' shared pieces (bench_util.h).
#include "bench/bench_util.h"

#include <algorithm>
#include <chrono>
#include <memory>

#include "core/status.h"

namespace dlrm::bench {

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

absl::StatusOr<std::vector<data::Batch>> SyntheticBatches(
    const ModelConfig& config, const data::SyntheticOptions& options, int count,
    int64_t size) {
  ASSIGN_OR_RETURN(std::unique_ptr<data::BatchSource> source,
                   data::MakeSyntheticSource(config, options));
  std::vector<data::Batch> batches(count);
  for (data::Batch& b : batches) {
    ASSIGN_OR_RETURN(const bool more, source->Next(size, &b));
    if (!more) return absl::InternalError("synthetic source ended");
  }
  return batches;
}

absl::StatusOr<double> TimedSteps(model::Model& model,
                                  const std::vector<data::Batch>& batches,
                                  int steps, int64_t* next) {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point t0 = Clock::now();
  int64_t samples = 0;
  for (int i = 0; i < steps; ++i) {
    const data::Batch& batch = batches[(*next)++ % batches.size()];
    RETURN_IF_ERROR(model.TrainStep(batch).status());
    samples += batch.size;
  }
  const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
  return static_cast<double>(samples) / dt;
}

absl::StatusOr<StepTimings> RunTimedSteps(
    model::Model& model, const std::vector<data::Batch>& batches, bool prefetch,
    int warmup, int repeats, int iters, int64_t batch,
    const std::function<absl::Status()>& before_round) {
  StepTimings out;
  const size_t count = batches.size();
  int64_t step = 0;
  auto run_step = [&](bool record) -> absl::Status {
    const data::Batch& b = batches[step % count];
    const data::Batch* next = prefetch ? &batches[(step + 1) % count] : nullptr;
    ++step;
    ASSIGN_OR_RETURN(model::StepResult r, model.TrainStep(b, next));
    if (record) {
      for (int s = 0; s < model::StageTimes::kNumStages; ++s) {
        out.times.seconds[s] += r.times.seconds[s];
      }
      for (int e = 0; e < model::StageTimes::kNumExchanges; ++e) {
        out.times.bytes_sent[e] += r.times.bytes_sent[e];
      }
    }
    return absl::OkStatus();
  };
  for (int i = 0; i < warmup; ++i) RETURN_IF_ERROR(run_step(false));
  out.warm = model.shards().HostCacheMetrics();
  for (int rep = 0; rep < repeats; ++rep) {
    if (before_round) RETURN_IF_ERROR(before_round());
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) RETURN_IF_ERROR(run_step(true));
    const double dt =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
            .count();
    out.rates.push_back(batch * iters / dt);
  }
  out.timed = model.shards().HostCacheMetrics();
  return out;
}

}  // namespace dlrm::bench
