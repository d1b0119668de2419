// The Train stream: read -> bounded queue -> training thread -> writes.
// Start* calls are never made under mu_, since gRPC may run a reaction on
// the calling thread.
#include "server/train_stream.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/escape.h"
#include "data/wire.h"
#include "server/grpc_status.h"
#include "server/raw_message.h"
#include "spdlog/spdlog.h"

namespace dlrm::server {
namespace {

constexpr char kMethod[] = "/dlrm.Trainer/Train";

}  // namespace

absl::Status TrainStreamOptions::Validate() const {
  if (queue_depth < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("train queue depth must be >= 1, got ", queue_depth));
  }
  if (max_batch_samples < 1) {
    return absl::InvalidArgumentError("max_batch_samples must be >= 1");
  }
  if (max_unsent_results < 1) {
    return absl::InvalidArgumentError("max_unsent_results must be >= 1");
  }
  if (!(idle_timeout_seconds >= 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "train idle timeout must be >= 0 s, got ", idle_timeout_seconds));
  }
  return absl::OkStatus();
}

TrainStream::TrainStream(grpc::CallbackServerContext* context, ModelHost* host,
                         ServerMetrics* metrics,
                         const TrainStreamOptions& options)
    : context_(context),
      host_(host),
      metrics_(metrics),
      options_(options),
      last_activity_(std::chrono::steady_clock::now()) {
  // The holder's name goes into the error other clients get, so it names
  // no client address (the log below does).
  absl::StatusOr<ModelHost::TrainingLease> lease =
      host_->AcquireTraining("a Train stream");
  if (!lease.ok()) {
    metrics_->RecordRpc(kMethod, lease.status().code());
    spdlog::debug("{}: {}", kMethod, lease.status().ToString());
    Finish(ToGrpcStatus(lease.status()));
    return;
  }
  lease_.emplace(*std::move(lease));
  metrics_->SetTrainQueueCapacity(options_.queue_depth);
  spdlog::info("Train stream from {} started", context->peer());
  worker_ = std::thread([this] { Work(); });
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++starting_reads_;
  }
  StartRead(&request_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    --starting_reads_;
    cv_.notify_all();
  }
}

void TrainStream::OnReadDone(bool ok) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    last_activity_ = std::chrono::steady_clock::now();
  }
  if (!ok) {
    // The client closed its side (or the call is going away).
    std::lock_guard<std::mutex> lock(mu_);
    input_done_ = true;
    cv_.notify_all();
    return;
  }
  Item item;
  int64_t index;
  {
    std::lock_guard<std::mutex> lock(mu_);
    index = messages_read_++;
  }
  TrainRequest request;
  item.error =
      ParseRaw(&request_, &request, absl::StrCat("stream message ", index));
  if (item.error.ok()) {
    item.error = data::BatchFromProto(
        request.batch(), host_->shape(), data::Labels::kRequired,
        options_.max_batch_samples, "batch", &item.batch);
    if (!item.error.ok()) {
      item.error = absl::InvalidArgumentError(absl::StrCat(
          item.error.message(), " (in stream message ", index, ")"));
    }
  }
  bool read_more = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!item.error.ok()) input_done_ = true;  // nothing after a bad batch
    queue_.push_back(std::move(item));
    metrics_->SetTrainQueueDepth(static_cast<int64_t>(queue_.size()));
    if (!input_done_ && !cancelled_) {
      if (static_cast<int>(queue_.size()) < options_.queue_depth) {
        read_more = true;
        ++starting_reads_;
      } else {
        read_paused_ = true;
        metrics_->RecordTrainReadStall();
      }
    }
    cv_.notify_all();
  }
  if (read_more) {
    StartRead(&request_);
    std::lock_guard<std::mutex> lock(mu_);
    --starting_reads_;
    cv_.notify_all();
  }
}

const grpc::ByteBuffer* TrainStream::NextWrite() {
  if (writing_ || unsent_.empty()) return nullptr;
  writing_ = true;
  return &unsent_.front();
}

void TrainStream::OnWriteDone(bool ok) {
  const grpc::ByteBuffer* next = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    writing_ = false;
    last_activity_ = std::chrono::steady_clock::now();
    unsent_.pop_front();
    if (!ok) {
      // The client is gone: nothing more can be delivered.
      unsent_.clear();
      cancelled_ = true;
    } else {
      next = NextWrite();
    }
    cv_.notify_all();
  }
  if (next != nullptr) StartWrite(next);
}

void TrainStream::OnCancel() {
  std::lock_guard<std::mutex> lock(mu_);
  cancelled_ = true;
  cv_.notify_all();
}

void TrainStream::Work() {
  absl::Status status;
  int64_t steps = 0;
  const auto idle_limit =
      std::chrono::duration_cast<std::chrono::steady_clock::duration>(
          std::chrono::duration<double>(options_.idle_timeout_seconds));
  bool idle = false;  // the client stalled past the idle timeout
  while (true) {
    Item item;
    bool resume_read = false;
    {
      std::unique_lock<std::mutex> lock(mu_);
      // Everything the worker waits for here comes from the client: a
      // batch, or the room that its reading of results makes.
      auto ready = [&] {
        if (cancelled_) return true;
        if (queue_.empty()) return input_done_;
        return static_cast<int>(unsent_.size()) < options_.max_unsent_results;
      };
      // Time spent training is not the client's: idleness counts from the
      // later of its last action and the start of this wait.
      const auto waiting_since = std::chrono::steady_clock::now();
      while (!ready()) {
        if (options_.idle_timeout_seconds <= 0) {
          cv_.wait(lock);
          continue;
        }
        const auto deadline =
            std::max(last_activity_, waiting_since) + idle_limit;
        if (std::chrono::steady_clock::now() >= deadline) {
          idle = true;
          break;
        }
        cv_.wait_until(lock, deadline);
      }
      if (idle) {
        status = absl::DeadlineExceededError(absl::StrCat(
            "the Train stream was idle for ", options_.idle_timeout_seconds,
            " s (no batch arrived and no result was read; "
            "--train-idle-timeout-s), so it was closed to free training"));
        break;
      }
      if (cancelled_ || queue_.empty()) break;
      item = std::move(queue_.front());
      queue_.pop_front();
      metrics_->SetTrainQueueDepth(static_cast<int64_t>(queue_.size()));
      if (read_paused_ && !input_done_) {
        read_paused_ = false;
        ++starting_reads_;
        resume_read = true;
      }
    }
    if (resume_read) {
      StartRead(&request_);
      std::lock_guard<std::mutex> lock(mu_);
      --starting_reads_;
      cv_.notify_all();
    }
    if (!item.error.ok()) {
      status = item.error;
      break;
    }
    // The batch queued behind this one (if any) is trained next: its rows
    // on RocksDB load during this step. Only this thread pops the queue, and
    // pushing to a deque moves no element, so the pointer stays good.
    const data::Batch* next = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!queue_.empty() && queue_.front().error.ok()) {
        next = &queue_.front().batch;
      }
    }
    absl::StatusOr<TrainStepOutcome> step =
        host_->TrainStep(*lease_, item.batch, nullptr, next);
    if (!step.ok()) {
      status = step.status();
      break;
    }
    ++steps;
    metrics_->RecordTrainStep(*step);
    TrainResponse response;
    StepResult* r = response.mutable_result();
    r->set_step(step->step);
    r->set_loss(step->loss);
    r->set_samples(step->samples);
    r->set_samples_per_second(
        step->seconds > 0 ? static_cast<double>(step->samples) / step->seconds
                          : 0);
    grpc::ByteBuffer bytes;
    status = SerializeRaw(response, &bytes);
    if (!status.ok()) break;
    const grpc::ByteBuffer* write = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu_);
      unsent_.push_back(std::move(bytes));
      write = NextWrite();
    }
    if (write != nullptr) StartWrite(write);
  }
  if (steps > 0) {
    // Training stopped between two periodic checkpoints: its last steps
    // are saved for a replica to follow (none after the server's
    // StopTraining).
    bool failed = false;
    const std::string saved =
        host_->CheckpointStoppedTraining(*lease_, &failed);
    metrics_->RecordCheckpoint(saved, host_->steps(), failed);
  }
  // Give training back first, so a client that sees this stream end can
  // start the next trainer at once.
  lease_.reset();
  if (idle) {
    bool stuck_write;
    {
      std::lock_guard<std::mutex> lock(mu_);
      stuck_write = writing_;
    }
    // A result the client never reads would hold the write (and so Finish)
    // forever: cancelling the call completes it. The client then sees
    // CANCELLED, which matters little to one that stopped reading.
    if (stuck_write) context_->TryCancel();
  }
  {
    std::unique_lock<std::mutex> lock(mu_);
    // Results before the end go out first (unless the client is gone), and
    // no StartRead may follow Finish.
    cv_.wait(lock, [&] { return !writing_ && starting_reads_ == 0; });
    // A read that failed because the call broke (a message over the size
    // limit, a client that went away) looks like the end of input; the
    // context tells the two apart.
    if ((cancelled_ || context_->IsCancelled()) && status.ok()) {
      status = absl::CancelledError("the Train stream was cancelled");
    }
    queue_.clear();
    input_done_ = true;
    metrics_->SetTrainQueueDepth(0);
  }
  metrics_->RecordRpc(kMethod, status.code());
  spdlog::info("Train stream ended after {} steps: {}", steps,
               EscapeForMessage(status.ToString()));
  Finish(ToGrpcStatus(status));
}

void TrainStream::OnDone() {
  if (worker_.joinable()) worker_.join();
  delete this;
}

}  // namespace dlrm::server
