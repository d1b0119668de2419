// The micro-batching loop: wait for the first request, give others until
// its deadline (or until the sample budget is full) to join, run once.
#include "server/predict_batcher.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace dlrm::server {

absl::Status PredictBatcherOptions::Validate() const {
  if (max_batch_samples < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "predict max batch must be >= 1 sample, got ", max_batch_samples));
  }
  if (max_wait_us < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("predict max wait must be >= 0 us, got ", max_wait_us));
  }
  return absl::OkStatus();
}

PredictBatcher::PredictBatcher(ModelHost* host, ServerMetrics* metrics,
                               PredictBatcherOptions options)
    : host_(host), metrics_(metrics), options_(options) {
  worker_ = std::thread([this] { Run(); });
}

PredictBatcher::~PredictBatcher() { Stop(); }

void PredictBatcher::Submit(data::Batch batch, Done done) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!stopping_) {
      queued_samples_ += batch.size;
      queue_.push_back(Request{std::move(batch), std::move(done),
                               std::chrono::steady_clock::now()});
      cv_.notify_all();
      return;
    }
  }
  done(absl::UnavailableError("the server is shutting down"), {}, 0);
}

void PredictBatcher::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    cv_.notify_all();
  }
  if (worker_.joinable()) worker_.join();
}

void PredictBatcher::Run() {
  std::vector<Request> group;
  while (true) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, nothing left
      const auto deadline = queue_.front().arrival +
                            std::chrono::microseconds(options_.max_wait_us);
      cv_.wait_until(lock, deadline, [&] {
        return stopping_ || queued_samples_ >= options_.max_batch_samples;
      });
      // Take requests in arrival order while they fit the budget; the first
      // one always goes, however large.
      int64_t samples = 0;
      group.clear();
      while (!queue_.empty() &&
             (group.empty() || samples + queue_.front().batch.size <=
                                   options_.max_batch_samples)) {
        samples += queue_.front().batch.size;
        queued_samples_ -= queue_.front().batch.size;
        group.push_back(std::move(queue_.front()));
        queue_.pop_front();
      }
    }
    RunGroup(group);
  }
}

void PredictBatcher::RunGroup(std::vector<Request>& requests) {
  std::vector<float> probs;
  int64_t step = 0;
  if (requests.size() == 1) {
    const absl::Status status =
        host_->Predict(requests[0].batch, &probs, &step);
    metrics_->RecordPredictBatch(requests[0].batch.size, 1);
    requests[0].done(
        status, status.ok() ? std::move(probs) : std::vector<float>(), step);
    return;
  }
  data::Batch joined;
  for (const Request& r : requests) joined.Append(r.batch);
  const absl::Status status = host_->Predict(joined, &probs, &step);
  metrics_->RecordPredictBatch(joined.size,
                               static_cast<int64_t>(requests.size()));
  int64_t offset = 0;
  for (Request& r : requests) {
    if (status.ok()) {
      r.done(absl::OkStatus(),
             std::vector<float>(probs.begin() + offset,
                                probs.begin() + offset + r.batch.size),
             step);
    } else {
      r.done(status, {}, step);
    }
    offset += r.batch.size;
  }
}

}  // namespace dlrm::server
