// Training jobs: request checks, the per-job training loop, bookkeeping.
#include "server/job_manager.h"

#include <algorithm>
#include <chrono>
#include <deque>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/escape.h"
#include "core/status.h"
#include "google/protobuf/text_format.h"
#include "model/checkpoint.h"
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

namespace fs = std::filesystem;

constexpr char kJobPrefix[] = "job-";
constexpr char kEndSuffix[] = ".end";

// The number of "job-<n>" (or of the marker "job-<n>.end" with `suffix`);
// -1 when `name` is neither.
int64_t JobNumber(const std::string& name, const std::string& suffix = "") {
  if (!name.starts_with(kJobPrefix) || !name.ends_with(suffix)) return -1;
  const std::string digits =
      name.substr(sizeof(kJobPrefix) - 1,
                  name.size() - (sizeof(kJobPrefix) - 1) - suffix.size());
  int64_t n = 0;
  if (digits.empty() || digits.size() > 18 ||
      !std::all_of(digits.begin(), digits.end(),
                   [](char c) { return c >= '0' && c <= '9'; }) ||
      !absl::SimpleAtoi(digits, &n) || n < 1) {
    return -1;
  }
  return n;
}

// Job numbers of the end markers in `dir`, ascending.
std::vector<int64_t> EndMarkers(const std::string& dir) {
  std::vector<int64_t> out;
  std::error_code ec;
  for (auto it = fs::directory_iterator(dir, ec);
       !ec && it != fs::directory_iterator(); it.increment(ec)) {
    const int64_t n = JobNumber(it->path().filename().string(), kEndSuffix);
    if (n > 0) out.push_back(n);
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::string EndMarkerPath(const std::string& dir, int64_t number) {
  return (fs::path(dir) / absl::StrCat(kJobPrefix, number, kEndSuffix))
      .string();
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
  JobRequest request;
  int64_t number = 0;
  int64_t batch_size = 0;
  int epochs = 0;
  int64_t max_steps = 0;
  int64_t eval_interval = 0;
  int64_t eval_samples = 0;
  // The training data as every rank opens it (ResolveDataset's), and the
  // leader's own copy, which it only skips through: it learns there how
  // many samples each step's range holds without reading them.
  DatasetSpec train_spec;
  OpenedDataset train;
  std::optional<OpenedDataset> eval;
  std::optional<ModelHost::TrainingLease> lease;
  std::atomic<bool> cancel{false};
  Clock::time_point start;
  bool started = false;
  double end_elapsed = 0;  // elapsed seconds once finished
  JobStatus status;        // guarded by JobManager::mu_
  // Where the job stands in its data, guarded by mu_: the epoch being read
  // (0-based) and the batches read in it. Resume starts from here.
  int epoch = 0;
  int64_t epoch_batches = 0;
  // Steps the whole job takes, as text for the resume log line.
  std::string total_steps;
  // Guarded by mu_: Cancel() asked for the stop (Shutdown() does not set
  // it); the job stopped without ending for good (shutdown, a rank lost),
  // so a restart resumes it.
  bool client_cancel = false;
  bool interrupted = false;
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
  if (keep_end_markers < 1) {
    return absl::InvalidArgumentError("keep_end_markers must be >= 1");
  }
  return data_paths.Validate();
}

JobManager::JobManager(ModelHost* host, ServerMetrics* metrics,
                       JobManagerOptions options)
    : host_(host), metrics_(metrics), options_(std::move(options)) {
  // Ids go on after the jobs of earlier runs over the same checkpoints, so
  // a marker or a checkpoint's record never names a new job.
  if (!options_.state_dir.empty()) {
    const std::vector<int64_t> ended = EndMarkers(options_.state_dir);
    if (!ended.empty()) next_id_ = ended.back() + 1;
  }
}

JobManager::~JobManager() { Shutdown(); }

absl::StatusOr<std::unique_ptr<JobManager::Job>> JobManager::Prepare(
    const JobRequest& request) {
  auto job = std::make_unique<Job>();
  job->request = request;
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
  ASSIGN_OR_RETURN(job->train_spec,
                   ResolveDataset(request.train(), config, options_.data_paths,
                                  DatasetRole::kTrain, "train"));
  ASSIGN_OR_RETURN(job->train,
                   OpenResolvedDataset(job->train_spec, config, "train"));
  if (job->train.endless && job->max_steps == 0) {
    return absl::InvalidArgumentError(
        "train.synthetic.num_samples = 0 makes the data endless: set "
        "max_steps (or num_samples)");
  }
  if (request.has_eval()) {
    ASSIGN_OR_RETURN(OpenedDataset eval,
                     OpenDataset(request.eval(), config, options_.data_paths,
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
  // Known up front only for synthetic data of a set size, or a step cap.
  const int64_t n = request.train().has_synthetic()
                        ? request.train().synthetic().num_samples()
                        : -1;
  if (n > 0) {
    int64_t total = job->epochs * ((n + job->batch_size - 1) / job->batch_size);
    if (job->max_steps > 0) total = std::min(total, job->max_steps);
    job->total_steps = absl::StrCat(total);
  } else if (job->max_steps > 0) {
    job->total_steps = absl::StrCat(n == 0 ? "" : "at most ", job->max_steps);
  } else {
    job->total_steps = "an unknown number (the data is read to its end)";
  }
  return job;
}

absl::StatusOr<JobStatus> JobManager::Start(const JobRequest& request) {
  ASSIGN_OR_RETURN(std::unique_ptr<Job> job, Prepare(request));
  std::lock_guard<std::mutex> lock(mu_);
  ASSIGN_OR_RETURN(JobStatus status, Launch(std::move(job), next_id_));
  ++next_id_;
  return status;
}

absl::StatusOr<JobStatus> JobManager::Launch(std::unique_ptr<Job> job,
                                             int64_t number) {
  if (shut_down_) {
    return absl::UnavailableError("the server is shutting down");
  }
  job->number = number;
  const std::string id = absl::StrCat(kJobPrefix, job->number);
  ASSIGN_OR_RETURN(ModelHost::TrainingLease lease,
                   host_->AcquireTraining(absl::StrCat("job ", id)));
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

std::string JobManager::Record(const Job& job) const {
  std::string request;
  google::protobuf::TextFormat::PrintToString(job.request, &request);
  const nlohmann::json record = {
      {"id", job.status.id()},       {"request", request},
      {"steps", job.status.steps()}, {"samples", job.status.samples()},
      {"epoch", job.epoch},          {"epoch_batches", job.epoch_batches}};
  return record.dump();
}

absl::Status JobManager::Resume(const std::string& text) {
  auto damaged = [](const std::string& why) {
    return absl::InvalidArgumentError(
        absl::StrCat("the checkpoint's job record is damaged: ", why));
  };
  const nlohmann::json record =
      nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!record.is_object()) return damaged("not a JSON object");
  std::string id, request_text;
  int64_t steps = 0, samples = 0, epoch_batches = 0;
  int epoch = 0;
  // nlohmann throws on a missing field or one of the wrong type; the
  // message names the field.
  std::string field;
  try {
    id = record.at(field = "id").get<std::string>();
    request_text = record.at(field = "request").get<std::string>();
    steps = record.at(field = "steps").get<int64_t>();
    samples = record.at(field = "samples").get<int64_t>();
    epoch = record.at(field = "epoch").get<int>();
    epoch_batches = record.at(field = "epoch_batches").get<int64_t>();
  } catch (const nlohmann::json::exception& e) {
    return damaged(absl::StrCat(field, ": ", e.what()));
  }
  const int64_t number = JobNumber(id);
  if (number < 1)
    return damaged(absl::StrCat("id \"", id, "\" is not job-<n>"));
  if (steps < 0 || samples < 0 || epoch < 0 || epoch_batches < 0) {
    return damaged("steps, samples, epoch and epoch_batches must be >= 0");
  }
  JobRequest request;
  if (!google::protobuf::TextFormat::ParseFromString(request_text, &request)) {
    return damaged("its request does not parse");
  }
  {
    // Whatever happens below, new jobs get other ids.
    std::lock_guard<std::mutex> lock(mu_);
    next_id_ = std::max(next_id_, number + 1);
  }
  if (!options_.state_dir.empty()) {
    const std::string marker = EndMarkerPath(options_.state_dir, number);
    std::error_code ec;
    if (fs::exists(marker, ec)) {
      std::ifstream in(marker);
      std::stringstream contents;
      contents << in.rdbuf();
      JobStatus ended;
      const std::string state =
          google::protobuf::TextFormat::ParseFromString(contents.str(), &ended)
              ? JobStatus::State_Name(ended.state())
              : "see " + marker;
      spdlog::info(
          "job {} of the checkpoint had already ended ({}): not "
          "restarting it",
          id, state);
      return absl::OkStatus();
    }
  }
  ASSIGN_OR_RETURN(std::unique_ptr<Job> job, Prepare(request));
  job->epoch = epoch;
  job->epoch_batches = epoch_batches;
  job->status.set_steps(steps);
  job->status.set_samples(samples);
  const std::string total = job->total_steps;
  std::lock_guard<std::mutex> lock(mu_);
  RETURN_IF_ERROR(Launch(std::move(job), number).status());
  spdlog::info("resuming job {} at step {} of {} (epoch {}, batch {} of it)",
               id, steps, total, epoch + 1, epoch_batches);
  return absl::OkStatus();
}

std::string JobManager::InterruptedJob() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = jobs_.rbegin(); it != jobs_.rend(); ++it) {
    const Job& job = *it->second;
    if (job.interrupted && Terminal(job.status.state())) return Record(job);
  }
  return "";
}

void JobManager::WriteEndMarker(const Job& job, const JobStatus& status) {
  if (options_.state_dir.empty()) return;
  std::string text;
  google::protobuf::TextFormat::PrintToString(status, &text);
  std::error_code ec;
  fs::create_directories(options_.state_dir, ec);
  const absl::Status written =
      model::WriteTextFile(EndMarkerPath(options_.state_dir, job.number), text);
  if (!written.ok()) {
    // The job has ended anyway; the cost is a needless restart after a
    // crash from a checkpoint that recorded it.
    spdlog::warn("{}: cannot record its end: {}", status.id(),
                 written.ToString());
    return;
  }
  const std::vector<int64_t> ended = EndMarkers(options_.state_dir);
  for (size_t i = 0; i + options_.keep_end_markers < ended.size(); ++i) {
    fs::remove(EndMarkerPath(options_.state_dir, ended[i]), ec);
  }
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
  // Where to start: 0 for a new job, the recorded position for a resumed
  // one.
  int64_t steps = 0, samples = 0, skip_batches = 0;
  int first_epoch = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    job->start = Clock::now();
    job->started = true;
    job->status.set_state(JobStatus::RUNNING);
    steps = job->status.steps();
    samples = job->status.samples();
    first_epoch = job->epoch;
    skip_batches = job->epoch_batches;
    cv_.notify_all();
  }
  std::deque<TrainStepOutcome> window;
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
    // Every rank reads its own share of each step's samples (docs/server.md
    // "Dataset jobs on several ranks"). The leader's copy of the data only
    // counts them: skipping a batch tells how many samples it holds, so the
    // ranges sent are the batches Next would have read.
    RETURN_IF_ERROR(host_->OpenTrainData(*job->lease, job->train_spec));
    data::BatchSource& data = *job->train.source;
    bool evaluated_last = false;
    for (int epoch = first_epoch; epoch < job->epochs; ++epoch) {
      if (epoch > 0) RETURN_IF_ERROR(data.Rewind());
      // A resumed job starts after the batches it had trained on: the
      // sources are deterministic (files in order, seeded synthetic data),
      // and every batch of an epoch but its last is full.
      int64_t batches = 0, position = 0;
      if (epoch == first_epoch && skip_batches > 0) {
        const int64_t most =
            std::numeric_limits<int64_t>::max() / job->batch_size;
        ASSIGN_OR_RETURN(position, data.Skip(std::min(skip_batches, most) *
                                             job->batch_size));
        batches = (position + job->batch_size - 1) / job->batch_size;
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        job->epoch = epoch;
        job->epoch_batches = batches;
      }
      // The range after this step's, counted one step ahead (each rank
      // reads its share of it early when tables are on RocksDB, whose rows
      // then load during this step).
      std::optional<SampleRange> next;
      while (job->max_steps == 0 || steps < job->max_steps) {
        if (job->cancel.load()) {
          cancelled = true;
          return absl::OkStatus();
        }
        SampleRange batch;
        if (next.has_value()) {
          batch = *next;
        } else {
          ASSIGN_OR_RETURN(const int64_t n, data.Skip(job->batch_size));
          if (n == 0) break;
          batch = {position, n};
        }
        position = batch.begin + batch.size;
        // Count ahead, unless this is the job's last step.
        next.reset();
        bool epoch_ends = false;
        if (job->max_steps == 0 || steps + 1 < job->max_steps) {
          ASSIGN_OR_RETURN(const int64_t n, data.Skip(job->batch_size));
          if (n > 0) next = SampleRange{position, n};
          epoch_ends = n == 0;
        }
        // The job as it will stand after this step, for a checkpoint taken
        // right after it.
        auto record = [&] {
          Job after;
          after.request = job->request;
          after.status.set_id(job->status.id());
          after.status.set_steps(steps + 1);
          after.status.set_samples(samples + batch.size);
          after.epoch = epoch;
          after.epoch_batches = batches + 1;
          return Record(after);
        };
        ASSIGN_OR_RETURN(
            TrainStepOutcome step,
            host_->TrainStepAt(*job->lease, batch, record,
                               next.has_value() ? &*next : nullptr));
        metrics_->RecordTrainStep(step);
        ++steps;
        ++batches;
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
          job->epoch_batches = batches;
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
        if (epoch_ends) break;
      }
      if (job->max_steps > 0 && steps >= job->max_steps) break;
    }
    if (!evaluated_last && steps > 0) RETURN_IF_ERROR(evaluate());
    return absl::OkStatus();
  };

  const absl::Status status = train();
  // The ranks close their files; a group already broken has none to close.
  host_->CloseTrainData(*job->lease).IgnoreError();
  bool by_client = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    by_client = job->client_cancel;
  }
  if (status.ok() && (!cancelled || by_client)) {
    // Ended for good between two periodic checkpoints: its last steps are
    // saved for a replica to follow (not on the server's shutdown, which
    // --checkpoint-on-exit covers).
    bool failed = false;
    const std::string saved =
        host_->CheckpointStoppedTraining(*job->lease, &failed);
    metrics_->RecordCheckpoint(saved, host_->steps(), failed);
  }
  // Give training back before reporting the end, so a client that sees the
  // job finished can start the next one at once.
  job->lease.reset();
  JobStatus final_status;
  bool interrupted = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    final_status = job->status;
    if (cancelled || status.code() == absl::StatusCode::kCancelled) {
      final_status.set_state(JobStatus::CANCELLED);
    } else if (!status.ok()) {
      final_status.set_state(JobStatus::FAILED);
      final_status.set_error(EscapeForMessage(status.ToString()));
    } else {
      final_status.set_state(JobStatus::SUCCEEDED);
    }
    // Stopped by the server's shutdown or a lost rank (Unavailable) rather
    // than ended for good: a restart from a checkpoint resumes it.
    interrupted = !job->client_cancel &&
                  (final_status.state() == JobStatus::CANCELLED ||
                   status.code() == absl::StatusCode::kUnavailable);
    job->interrupted = interrupted;
    job->end_elapsed =
        std::chrono::duration<double>(Clock::now() - job->start).count();
    final_status.set_elapsed_seconds(job->end_elapsed);
  }
  // Recorded before anyone can see the end, so a crash right after that
  // cannot restart the job.
  if (!interrupted) WriteEndMarker(*job, final_status);
  std::lock_guard<std::mutex> lock(mu_);
  job->status = final_status;
  spdlog::info("{} {} after {} steps{}{}{}", job->status.id(),
               JobStatus::State_Name(job->status.state()), steps,
               status.ok() ? "" : ": ",
               status.ok() ? "" : EscapeForMessage(status.ToString()),
               interrupted ? " (interrupted: resumed on restart)" : "");
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
    job->client_cancel = true;
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
