// WorkQueue: a few threads for RPC work that blocks (evaluation, checkpoint
// I/O, waiting for a job to stop), so gRPC's callback threads never wait on
// the model or the disk.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace dlrm::server {

// Thread-safe. Tasks run in submission order on `num_threads` threads.
class WorkQueue {
 public:
  // Starts max(num_threads, 1) threads.
  explicit WorkQueue(int num_threads);
  // Stop().
  ~WorkQueue();

  // Queues `task`. Returns false (and drops it) after Stop().
  bool Submit(std::function<void()> task);

  // Runs every queued task, then joins the threads. Idempotent.
  void Stop();

 private:
  void Run();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace dlrm::server
