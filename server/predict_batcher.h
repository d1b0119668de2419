// PredictBatcher: joins concurrent small prediction requests into one model
// call (up to a sample budget, waiting at most a fixed time for company),
// then splits the probabilities back per request.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "data/batch.h"
#include "server/metrics.h"
#include "server/model_host.h"

namespace dlrm::server {

struct PredictBatcherOptions {
  // Most samples joined into one model call; a larger request runs alone.
  // Default: 1024.
  int64_t max_batch_samples = 1024;
  // Longest a request waits for others to join it, in microseconds; 0 runs
  // whatever has arrived at once. Default: 1000.
  int64_t max_wait_us = 1000;

  absl::Status Validate() const;
};

// Thread-safe. One worker thread runs the model calls; `done` callbacks run
// on it, so they must be quick (finishing an RPC is).
class PredictBatcher {
 public:
  // Called with the request's probabilities (one per sample) and the
  // training steps of the weights that gave them, or the error.
  using Done =
      std::function<void(absl::Status, std::vector<float>, int64_t step)>;

  // `host` and `metrics` are borrowed and must outlive the batcher.
  // Starts the worker thread. `options` must be valid.
  PredictBatcher(ModelHost* host, ServerMetrics* metrics,
                 PredictBatcherOptions options);
  // Stop().
  ~PredictBatcher();

  // Queues `batch` (already validated against the host's shape). After
  // Stop(), `done` gets Unavailable at once.
  void Submit(data::Batch batch, Done done);

  // Runs every queued request, then ends the worker. Idempotent.
  void Stop();

 private:
  struct Request {
    data::Batch batch;
    Done done;
    std::chrono::steady_clock::time_point arrival;
  };

  void Run();
  // Runs `requests` as one model call and answers each.
  void RunGroup(std::vector<Request>& requests);

  ModelHost* const host_;
  ServerMetrics* const metrics_;
  const PredictBatcherOptions options_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Request> queue_;
  int64_t queued_samples_ = 0;
  bool stopping_ = false;
  std::thread worker_;
};

}  // namespace dlrm::server
