// JobManager: training jobs that read a dataset on the server (the fast path:
// no client pushes the bytes). Each job runs on its own thread, one step at
// a time through the ModelHost, evaluating as asked, and stops at the next
// step boundary when cancelled. One job (or Train stream) trains at a time.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "dlrm/service.pb.h"
#include "model/metrics.h"
#include "server/metrics.h"
#include "server/model_host.h"

namespace dlrm::server {

// Copies evaluation metrics into their wire form.
void EvalMetricsToProto(const model::EvalMetrics& metrics, EvalMetrics* out);

struct JobManagerOptions {
  // Relative dataset paths resolve here; empty = the working directory.
  // Default: empty.
  std::string data_dir;
  // Largest batch_size a job may ask for. Default: 65536.
  int64_t max_batch_samples = 65536;
  // Finished jobs remembered for GetJob/ListJobs; older ones are forgotten.
  // Default: 100.
  int max_finished_jobs = 100;
  // Samples per model call when a job evaluates. Default: 8192.
  int64_t eval_batch_size = 8192;

  absl::Status Validate() const;
};

// Thread-safe.
class JobManager {
 public:
  // `host` and `metrics` are borrowed and must outlive the manager.
  // `options` must be valid.
  JobManager(ModelHost* host, ServerMetrics* metrics,
             JobManagerOptions options);
  // Shutdown().
  ~JobManager();

  // Checks `request`, opens its datasets, reserves training and starts the
  // job; returns its first status (PENDING or RUNNING). InvalidArgument
  // (naming the field) for bad options, NotFound for a missing file,
  // FailedPrecondition when training is busy or the server is
  // inference-only, Unavailable after Shutdown().
  absl::StatusOr<JobStatus> Start(const JobRequest& request);

  // The job's current status. NotFound for an unknown (or forgotten) id.
  absl::StatusOr<JobStatus> Get(const std::string& id);

  // Asks the job to stop at its next step boundary and waits up to `wait`
  // for it to stop; returns its status then (CANCELLED once stopped; a job
  // that had already finished keeps its state). NotFound for an unknown id.
  absl::StatusOr<JobStatus> Cancel(const std::string& id, absl::Duration wait);

  // Every remembered job, oldest first.
  std::vector<JobStatus> List();

  // Cancels the running job, waits for it to stop, and refuses new ones.
  // Idempotent.
  void Shutdown();

 private:
  struct Job;

  void Run(Job* job);
  // Drops the oldest finished jobs beyond max_finished_jobs. Needs mu_.
  void Forget();

  ModelHost* const host_;
  ServerMetrics* const metrics_;
  const JobManagerOptions options_;

  std::mutex mu_;
  std::condition_variable cv_;                    // a job changed state
  std::map<int64_t, std::unique_ptr<Job>> jobs_;  // by number, oldest first
  int64_t next_id_ = 1;
  bool shut_down_ = false;
};

}  // namespace dlrm::server
