// Training jobs: request checks, the per-job training loop, bookkeeping.
#include "server/job_manager.h"

#include <chrono>
#include <deque>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "server/datasets.h"
#include "spdlog/spdlog.h"

namespace dlrm::server {
namespace {

using Clock = std::chrono::steady_clock;

// Steps the reported loss and samples/s are averaged over.
constexpr size_t kWindowSteps = 100;

bool Terminal(JobStatus::State s) {
  return s == JobStatus::SUCCEEDED || s == JobStatus::FAILED ||
         s == JobStatus::CANCELLED;
}

}  // namespace

void EvalMetricsToProto(const model::EvalMetrics& m, EvalMetrics* out) {
  out->set_samples(m.samples);
  out->set_auc(m.auc);
  out->set_log_loss(m.log_loss);
  out->set_accuracy(m.accuracy);
  out->set_ctr(m.ctr);
}

struct JobManager::Job {
  int64_t number = 0;
  int64_t batch_size = 0;
  int epochs = 0;
  int64_t max_steps = 0;
  int64_t eval_interval = 0;
  int64_t eval_samples = 0;
  OpenedDataset train;
  std::optional<OpenedDataset> eval;
  std::optional<ModelHost::TrainingLease> lease;
  std::atomic<bool> cancel{false};
  Clock::time_point start;
  bool started = false;
  double end_elapsed = 0;  // elapsed seconds once finished
  JobStatus status;        // guarded by JobManager::mu_
  std::thread thread;
};

absl::Status JobManagerOptions::Validate() const {
  if (max_batch_samples < 1) {
    return absl::InvalidArgumentError("max_batch_samples must be >= 1");
  }
  if (max_finished_jobs < 0) {
    return absl::InvalidArgumentError("max_finished_jobs must be >= 0");
  }
  if (eval_batch_size < 1) {
    return absl::InvalidArgumentError("eval_batch_size must be >= 1");
  }
  return absl::OkStatus();
}

JobManager::JobManager(ModelHost* host, ServerMetrics* metrics,
                       JobManagerOptions options)
    : host_(host), metrics_(metrics), options_(std::move(options)) {}

JobManager::~JobManager() { Shutdown(); }

absl::StatusOr<JobStatus> JobManager::Start(const JobRequest& request) {
  auto job = std::make_unique<Job>();
  job->batch_size = request.batch_size() == 0 ? 2048 : request.batch_size();
  if (job->batch_size < 1 || job->batch_size > options_.max_batch_samples) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch_size = ", request.batch_size(), " must be in [1, ",
                     options_.max_batch_samples, "] (0 means 2048)"));
  }
  job->epochs = request.epochs() == 0 ? 1 : request.epochs();
  if (job->epochs < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "epochs = ", request.epochs(), " must be >= 0 (0 means 1)"));
  }
  if (request.max_steps() < 0 || request.eval_interval() < 0 ||
      request.eval_samples() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_steps (", request.max_steps(), "), eval_interval (",
                     request.eval_interval(), ") and eval_samples (",
                     request.eval_samples(), ") must be >= 0"));
  }
  job->max_steps = request.max_steps();
  job->eval_interval = request.eval_interval();
  job->eval_samples = request.eval_samples();
  const ModelConfig& config = host_->config();
  ASSIGN_OR_RETURN(job->train,
                   OpenDataset(request.train(), config, options_.data_dir,
                               DatasetRole::kTrain, "train"));
  if (job->train.endless && job->max_steps == 0) {
    return absl::InvalidArgumentError(
        "train.synthetic.num_samples = 0 makes the data endless: set "
        "max_steps (or num_samples)");
  }
  if (request.has_eval()) {
    ASSIGN_OR_RETURN(OpenedDataset eval,
                     OpenDataset(request.eval(), config, options_.data_dir,
                                 DatasetRole::kEval, "eval"));
    if (eval.endless && job->eval_samples == 0) {
      return absl::InvalidArgumentError(
          "eval.synthetic.num_samples = 0 makes the data endless: set "
          "eval_samples (or num_samples)");
    }
    job->eval = std::move(eval);
  } else if (job->eval_interval > 0) {
    return absl::InvalidArgumentError(
        "eval_interval is set but eval (the evaluation data) is not");
  }

  std::lock_guard<std::mutex> lock(mu_);
  if (shut_down_) {
    return absl::UnavailableError("the server is shutting down");
  }
  job->number = next_id_;
  const std::string id = absl::StrCat("job-", job->number);
  ASSIGN_OR_RETURN(ModelHost::TrainingLease lease,
                   host_->AcquireTraining(absl::StrCat("job ", id)));
  ++next_id_;
  job->lease.emplace(std::move(lease));
  job->status.set_id(id);
  job->status.set_state(JobStatus::PENDING);
  Job* raw = job.get();
  jobs_[job->number] = std::move(job);
  raw->thread = std::thread([this, raw] { Run(raw); });
  Forget();
  spdlog::info("{} started: batch size {}, epochs {}, max steps {}", id,
               raw->batch_size, raw->epochs, raw->max_steps);
  return raw->status;
}

void JobManager::Forget() {
  int64_t finished = 0;
  for (const auto& [number, job] : jobs_) {
    finished += Terminal(job->status.state()) ? 1 : 0;
  }
  for (auto it = jobs_.begin();
       it != jobs_.end() && finished > options_.max_finished_jobs;) {
    if (Terminal(it->second->status.state())) {
      // The thread set the terminal state as its last act under mu_.
      it->second->thread.join();
      it = jobs_.erase(it);
      --finished;
    } else {
      ++it;
    }
  }
}

void JobManager::Run(Job* job) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    job->start = Clock::now();
    job->started = true;
    job->status.set_state(JobStatus::RUNNING);
    cv_.notify_all();
  }
  std::deque<TrainStepOutcome> window;
  int64_t steps = 0, samples = 0;
  bool cancelled = false;

  auto evaluate = [&]() -> absl::Status {
    if (!job->eval.has_value()) return absl::OkStatus();
    model::EvalOptions eo;
    eo.batch_size = options_.eval_batch_size;
    eo.max_samples = job->eval_samples;
    ASSIGN_OR_RETURN(model::EvalResult r,
                     host_->Evaluate(*job->eval->source, eo,
                                     job->eval->reference, &job->cancel));
    metrics_->RecordEval(r.model);
    std::lock_guard<std::mutex> lock(mu_);
    EvalMetricsToProto(r.model, job->status.mutable_eval());
    if (r.has_reference) {
      EvalMetricsToProto(r.reference, job->status.mutable_eval_reference());
    }
    spdlog::info("{} step {}: eval auc {:.4f} logloss {:.4f}", job->status.id(),
                 steps, r.model.auc, r.model.log_loss);
    return absl::OkStatus();
  };

  auto train = [&]() -> absl::Status {
    data::Batch batch;
    bool evaluated_last = false;
    for (int epoch = 0; epoch < job->epochs; ++epoch) {
      if (epoch > 0) RETURN_IF_ERROR(job->train.source->Rewind());
      while (job->max_steps == 0 || steps < job->max_steps) {
        if (job->cancel.load()) {
          cancelled = true;
          return absl::OkStatus();
        }
        ASSIGN_OR_RETURN(bool more,
                         job->train.source->Next(job->batch_size, &batch));
        if (!more || batch.size == 0) break;
        ASSIGN_OR_RETURN(TrainStepOutcome step,
                         host_->TrainStep(*job->lease, batch));
        metrics_->RecordTrainStep(step);
        ++steps;
        samples += step.samples;
        window.push_back(step);
        if (window.size() > kWindowSteps) window.pop_front();
        double loss = 0, seconds = 0;
        int64_t window_samples = 0;
        for (const TrainStepOutcome& s : window) {
          loss += s.loss;
          seconds += s.seconds;
          window_samples += s.samples;
        }
        {
          std::lock_guard<std::mutex> lock(mu_);
          job->status.set_steps(steps);
          job->status.set_samples(samples);
          job->status.set_loss(loss / static_cast<double>(window.size()));
          job->status.set_samples_per_second(
              seconds > 0 ? static_cast<double>(window_samples) / seconds : 0);
        }
        evaluated_last = false;
        if (job->eval_interval > 0 && steps % job->eval_interval == 0) {
          RETURN_IF_ERROR(evaluate());
          evaluated_last = true;
        }
      }
      if (job->max_steps > 0 && steps >= job->max_steps) break;
    }
    if (!evaluated_last && steps > 0) RETURN_IF_ERROR(evaluate());
    return absl::OkStatus();
  };

  const absl::Status status = train();
  // Give training back before reporting the end, so a client that sees the
  // job finished can start the next one at once.
  job->lease.reset();
  std::lock_guard<std::mutex> lock(mu_);
  if (cancelled || status.code() == absl::StatusCode::kCancelled) {
    job->status.set_state(JobStatus::CANCELLED);
  } else if (!status.ok()) {
    job->status.set_state(JobStatus::FAILED);
    job->status.set_error(status.ToString());
  } else {
    job->status.set_state(JobStatus::SUCCEEDED);
  }
  job->end_elapsed =
      std::chrono::duration<double>(Clock::now() - job->start).count();
  job->status.set_elapsed_seconds(job->end_elapsed);
  spdlog::info("{} {} after {} steps{}{}", job->status.id(),
               JobStatus::State_Name(job->status.state()), steps,
               status.ok() ? "" : ": ", status.ok() ? "" : status.ToString());
  cv_.notify_all();
}

absl::StatusOr<JobStatus> JobManager::Get(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [number, job] : jobs_) {
    if (job->status.id() != id) continue;
    JobStatus s = job->status;
    if (job->started && !Terminal(s.state())) {
      s.set_elapsed_seconds(
          std::chrono::duration<double>(Clock::now() - job->start).count());
    }
    return s;
  }
  return absl::NotFoundError(absl::StrCat("no job with id \"", id, "\""));
}

absl::StatusOr<JobStatus> JobManager::Cancel(const std::string& id,
                                             absl::Duration wait) {
  {
    std::unique_lock<std::mutex> lock(mu_);
    Job* job = nullptr;
    for (const auto& [number, j] : jobs_) {
      if (j->status.id() == id) job = j.get();
    }
    if (job == nullptr) {
      return absl::NotFoundError(absl::StrCat("no job with id \"", id, "\""));
    }
    job->cancel.store(true);
    // Look the job up afresh on each wake-up: Start may forget finished
    // jobs while this waits.
    const int64_t number = job->number;
    cv_.wait_for(lock, absl::ToChronoNanoseconds(wait), [&] {
      auto it = jobs_.find(number);
      return it == jobs_.end() || Terminal(it->second->status.state());
    });
  }
  return Get(id);
}

std::vector<JobStatus> JobManager::List() {
  std::vector<std::string> ids;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [number, job] : jobs_) ids.push_back(job->status.id());
  }
  std::vector<JobStatus> out;
  for (const std::string& id : ids) {
    absl::StatusOr<JobStatus> s = Get(id);
    if (s.ok()) out.push_back(*std::move(s));
  }
  return out;
}

void JobManager::Shutdown() {
  std::vector<std::thread*> threads;
  {
    std::lock_guard<std::mutex> lock(mu_);
    shut_down_ = true;
    for (auto& [number, job] : jobs_) {
      job->cancel.store(true);
      if (job->thread.joinable()) threads.push_back(&job->thread);
    }
  }
  // Jobs are never erased after shut_down_ is set, so the pointers hold.
  for (std::thread* t : threads) t->join();
}

}  // namespace dlrm::server
