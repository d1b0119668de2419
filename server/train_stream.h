// TrainStream: the reactor of one Trainer.Train call. Batches flow from the
// reactor through a bounded queue to the stream's training thread; the
// reactor issues the next read only when the queue has room, so a client
// that sends faster than the model trains is held back by gRPC flow control
// and the server keeps at most `queue_depth` batches waiting.
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>

#include "absl/status/status.h"
#include "data/batch.h"
#include "dlrm/service.grpc.pb.h"
#include "server/metrics.h"
#include "server/model_host.h"

namespace dlrm::server {

struct TrainStreamOptions {
  // Batches read from the client and waiting for the trainer. Default: 4.
  int queue_depth = 4;
  // Largest batch accepted, in samples. Default: 65536.
  int64_t max_batch_samples = 65536;
  // Step results waiting to be sent before training pauses (a client that
  // does not read its results stops being read from). Default: 64.
  int max_unsent_results = 64;
  // Seconds the stream may wait on its client (for a batch, or for room to
  // send results; time spent training does not count) before it ends with
  // DeadlineExceeded, so a client that stalls cannot hold the one training
  // slot forever; 0 = no limit. Default: 300.
  double idle_timeout_seconds = 300;

  absl::Status Validate() const;
};

// The reactor of the raw Train method (server/raw_message.h): it reads
// TrainRequest bytes and writes TrainResponse bytes, so that a message
// that does not parse is told apart from the end of the stream.
using RawBidiReactor =
    grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>;

// One StepResult per batch, in order. A bad batch, or a message that is not
// a TrainRequest, ends the stream with InvalidArgument (naming the field,
// sample and stream message, or "stream message N could not be parsed as
// TrainRequest"; messages count from 0) after the results of the batches
// before it; the bad message changes nothing. When training is busy the
// stream ends at once with FailedPrecondition; a client idle past
// options.idle_timeout_seconds ends it with DeadlineExceeded.
// Deletes itself when gRPC is done with it.
class TrainStream final : public RawBidiReactor {
 public:
  // `host` and `metrics` are borrowed and must outlive the call.
  TrainStream(grpc::CallbackServerContext* context, ModelHost* host,
              ServerMetrics* metrics, const TrainStreamOptions& options);

  void OnReadDone(bool ok) override;
  void OnWriteDone(bool ok) override;
  void OnCancel() override;
  void OnDone() override;

 private:
  // A batch read from the client, or why it was refused.
  struct Item {
    data::Batch batch;
    absl::Status error;
  };

  // The training thread: pops batches, trains, queues results, finishes.
  void Work();
  // Sends the next result if none is in flight. Needs mu_; returns the
  // message to pass to StartWrite outside the lock, or null.
  const grpc::ByteBuffer* NextWrite();

  grpc::CallbackServerContext* const context_;
  ModelHost* const host_;
  ServerMetrics* const metrics_;
  const TrainStreamOptions options_;
  std::optional<ModelHost::TrainingLease> lease_;
  grpc::ByteBuffer request_;  // the read buffer: a TrainRequest's bytes
  std::thread worker_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Item> queue_;
  // Serialized TrainResponses; the front is in flight when writing_.
  std::deque<grpc::ByteBuffer> unsent_;
  int64_t messages_read_ = 0;
  int starting_reads_ = 0;    // StartRead calls decided and not yet returned
  bool read_paused_ = false;  // the queue was full; the worker resumes
  bool input_done_ = false;   // no more reads (end of input or bad batch)
  bool writing_ = false;
  bool cancelled_ = false;
  // The last time the client did something: the stream began, a read or a
  // write completed. The idle timeout counts from here.
  std::chrono::steady_clock::time_point last_activity_;
};

}  // namespace dlrm::server
