// WorkQueue: a fixed pool draining one FIFO.
#include "server/work_queue.h"

#include <algorithm>
#include <utility>

namespace dlrm::server {

WorkQueue::WorkQueue(int num_threads) {
  for (int i = 0; i < std::max(num_threads, 1); ++i) {
    threads_.emplace_back([this] { Run(); });
  }
}

WorkQueue::~WorkQueue() { Stop(); }

bool WorkQueue::Submit(std::function<void()> task) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopping_) return false;
  tasks_.push_back(std::move(task));
  cv_.notify_one();
  return true;
}

void WorkQueue::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    cv_.notify_all();
  }
  for (std::thread& t : threads_) {
    if (t.joinable()) t.join();
  }
}

void WorkQueue::Run() {
  while (true) {
    std::function<void()> task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !tasks_.empty(); });
      if (tasks_.empty()) return;
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    task();
  }
}

}  // namespace dlrm::server
