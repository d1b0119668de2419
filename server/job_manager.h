// JobManager: training jobs that read a dataset on the server (the fast path:
// no client pushes the bytes). Each job runs on its own thread, one step at
// a time through the ModelHost, every rank reading its own share of each
// step's samples, evaluating as asked, and stops at the next step boundary
// when cancelled. One job (or Train stream) trains at a time.
// A periodic checkpoint taken while a job runs records the job (its id,
// request and position in the data); a server resumed from that checkpoint
// restarts the job there (Resume), so a crash costs only the steps since
// (docs/checkpoints.md "Jobs").
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
#include "server/datasets.h"
#include "server/metrics.h"
#include "server/model_host.h"

namespace dlrm::server {

// Copies evaluation metrics into their wire form.
void EvalMetricsToProto(const model::EvalMetrics& metrics, EvalMetrics* out);

struct JobManagerOptions {
  // Where dataset files may be read from (--data-dir, --allow-data-path).
  // Default: none (only synthetic data).
  DataPathOptions data_paths;
  // Largest batch_size a job may ask for. Default: 65536.
  int64_t max_batch_samples = 65536;
  // Finished jobs remembered for GetJob/ListJobs; older ones are forgotten.
  // Default: 100.
  int max_finished_jobs = 100;
  // Samples per model call when a job evaluates. Default: 8192.
  int64_t eval_batch_size = 8192;
  // Where a job that ended for good (succeeded, cancelled through Cancel,
  // or failed on its own: bad data) leaves "job-<n>.end", its final status,
  // so that a checkpoint which recorded it running does not restart it;
  // new ids continue after the ones found here. The periodic checkpoints'
  // directory; empty = none. Default: empty.
  std::string state_dir;
  // End markers kept in state_dir (the newest by id). Default: 100.
  int keep_end_markers = 100;

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
  // (naming the field) for bad options, PermissionDenied for a file outside
  // options.data_paths, NotFound for a missing file,
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

  // Restarts the job of a checkpoint's job record (model::Manifest::job,
  // as the checkpoint the model was resumed from holds it) at its position,
  // under its id, and logs "resuming job <id> at step N of M". Call before
  // any Start. A job with an end marker in state_dir is not restarted (OK,
  // logged). InvalidArgument for a damaged record; Start's errors for its
  // request (the data may have moved).
  absl::Status Resume(const std::string& record);

  // After Shutdown(): the job record of a job that the shutdown stopped
  // mid-way (for the exit checkpoint, so that a restart resumes it); empty
  // when none was running.
  std::string InterruptedJob();

  // Cancels the running job, waits for it to stop, and refuses new ones.
  // Idempotent.
  void Shutdown();

 private:
  struct Job;

  // Checks `request` and opens its datasets.
  absl::StatusOr<std::unique_ptr<Job>> Prepare(const JobRequest& request);
  // Reserves training and starts `job` as job-<number>. Needs mu_.
  absl::StatusOr<JobStatus> Launch(std::unique_ptr<Job> job, int64_t number);
  void Run(Job* job);
  // The job record of `job` at its current position. Needs mu_.
  std::string Record(const Job& job) const;
  // Writes job-<n>.end for `job` (terminal) and prunes old markers.
  void WriteEndMarker(const Job& job, const JobStatus& status);
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
