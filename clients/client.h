// The C++ client of dlrm-server: typed calls on the Trainer, Predictor and
// Admin services over one channel, with absl::Status results.
#pragma once

#include <grpcpp/channel.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "data/batch.h"
#include "data/source.h"
#include "dlrm/service.grpc.pb.h"

namespace dlrm::clients {

struct ClientOptions {
  // Largest message sent or received, in bytes (a kaggle-shaped batch of
  // 2048 samples is about 0.4 MB). Default: 256 MiB.
  int max_message_bytes = 256 << 20;
  // How long Connect waits for the server to accept the connection (a
  // refused or failed attempt ends the wait at once); 0 does not wait (the
  // first call then fails with Unavailable if the server is down).
  // Default: 10.
  double connect_timeout_seconds = 10;
  // Deadline of each quick unary call (GetJob, StartJob, CancelJob,
  // Predict, GetModelInfo, GetMetrics); Train, Evaluate, WaitJob and the
  // checkpoint calls take as long as their data needs. 0 = none.
  // Default: 60.
  double call_timeout_seconds = 60;
  // Connect over TLS (grpc::SslCredentials). Default: false.
  bool tls = false;
  // With tls: PEM CA certificates that sign the server's certificate; empty
  // trusts gRPC's default roots. Default: empty.
  std::string tls_ca_file;
  // With tls: PEM client certificate chain and its key, for servers that
  // require client certificates; set both or neither. Default: empty.
  std::string tls_cert_file;
  std::string tls_key_file;
  // With tls: the name the server's certificate must carry, when it is not
  // the host part of the address. Default: empty.
  std::string tls_server_name;
  // Sent with every call as "authorization: Bearer <token>"; empty sends
  // none. Default: empty.
  std::string auth_token;

  absl::Status Validate() const;
};

struct TrainOptions {
  // Samples per batch read from the source and sent as one step.
  // Default: 2048.
  int64_t batch_size = 2048;
  // Batches sent but not yet answered; the sender waits at this bound, so
  // the client holds at most this many batches. Default: 4.
  int max_in_flight = 4;
  // Passes over the source (Rewind between them). Default: 1.
  int epochs = 1;
  // Stop after this many steps of this call; 0 = no cap. Default: 0.
  int64_t max_steps = 0;

  absl::Status Validate() const;
};

// What one Train call did.
struct TrainSummary {
  // Batches sent and answered.
  int64_t steps = 0;
  int64_t samples = 0;
  // The server's step count after the last answered batch (0 if none).
  int64_t last_step = 0;
  // Loss of the last step, and the sample-weighted mean over all steps.
  double final_loss = 0;
  double mean_loss = 0;
  // Wall time of the call and samples per wall second (network included).
  double seconds = 0;
  double samples_per_second = 0;
};

struct WaitOptions {
  // Seconds between GetJob polls. Default: 0.5.
  double poll_interval_seconds = 0.5;
  // Give up after this long; 0 = wait for as long as the job runs.
  // Default: 0.
  double timeout_seconds = 0;

  absl::Status Validate() const;
};

// Called once per answered batch, in order, on the thread that called Train.
using StepCallback = std::function<void(const StepResult& result)>;
// Called after every poll of WaitJob (the last call sees the final state).
using JobCallback = std::function<void(const JobStatus& status)>;

// True for SUCCEEDED, FAILED and CANCELLED.
bool IsTerminal(JobStatus::State state);

// A connection to one dlrm-server. Thread-safe: calls may run concurrently
// from several threads (each is its own RPC). Every method returns the
// server's status code and message unchanged when the RPC fails
// (Unavailable when the server cannot be reached, DeadlineExceeded past
// call_timeout_seconds).
class Client {
 public:
  // Opens a channel to `address` ("host:port"), over TLS when options.tls.
  // InvalidArgument for bad options or an empty address; NotFound when a
  // TLS file cannot be read; Unavailable, naming the address, as soon as a
  // connection attempt fails (refused, TLS handshake included) or when none
  // succeeds within connect_timeout_seconds.
  static absl::StatusOr<std::unique_ptr<Client>> Connect(
      const std::string& address, const ClientOptions& options = {});

  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  const std::string& address() const { return address_; }

  // Trains on `source` through one Train stream: reads batches of
  // options.batch_size, keeps at most options.max_in_flight unanswered, and
  // calls `on_step` (may be empty) for every StepResult in order. `source`
  // is borrowed for the call and read from a second thread. A source error
  // cancels the stream and is returned as is; a bad batch is the server's
  // InvalidArgument (after the results of the batches before it); a stream
  // that ends with batches unanswered is Internal.
  absl::StatusOr<TrainSummary> Train(data::BatchSource& source,
                                     const TrainOptions& options,
                                     const StepCallback& on_step);

  // Job control for training jobs that read their data on the server. One
  // job or Train stream runs at a time: another gets FailedPrecondition.
  // GetJob and CancelJob are NotFound for an unknown id; CancelJob answers
  // once the job has stopped.
  absl::StatusOr<JobStatus> StartJob(const JobRequest& request);
  absl::StatusOr<JobStatus> GetJob(const std::string& id);
  absl::StatusOr<JobStatus> CancelJob(const std::string& id);
  // The running job and the most recent finished ones, oldest first.
  absl::StatusOr<std::vector<JobStatus>> ListJobs();
  // Polls GetJob until the job reaches a terminal state and returns that
  // status (a FAILED or CANCELLED job is still an OK result: check
  // state()). `on_progress` (may be empty) sees every poll.
  // DeadlineExceeded after options.timeout_seconds.
  absl::StatusOr<JobStatus> WaitJob(const std::string& id,
                                    const WaitOptions& options,
                                    const JobCallback& on_progress);

  // Evaluates the model on the request's inline batches or server dataset.
  absl::StatusOr<EvaluateResponse> Evaluate(const EvaluateRequest& request);
  // Evaluates on up to `max_samples` (0 = all) samples of `source`, sent
  // inline in one request as batches of `batch_size`. InvalidArgument when
  // the request would exceed max_message_bytes.
  absl::StatusOr<EvaluateResponse> EvaluateSource(data::BatchSource& source,
                                                  int64_t batch_size,
                                                  int64_t max_samples);

  // Click probability of every sample of `batch` (labels are not sent), in
  // order. Internal if the server answers with a different count.
  absl::StatusOr<std::vector<float>> Predict(const data::Batch& batch);

  // Saves to / restores from a checkpoint directory on the server.
  absl::StatusOr<CheckpointResponse> SaveCheckpoint(const std::string& path);
  absl::StatusOr<CheckpointResponse> RestoreCheckpoint(const std::string& path);
  // Writes the model's weights to a safetensors file on the server.
  absl::StatusOr<ExportResponse> ExportWeights(const std::string& path);
  // Admin.SetLearningRate: the dense and the tables' learning rates, each
  // where given; the server's error as is (INVALID_ARGUMENT naming the
  // field for a rate that is not a finite number > 0).
  absl::StatusOr<SetLearningRateResponse> SetLearningRate(
      std::optional<float> dense, std::optional<float> sparse);

  // With `include_weight_checksum`, info.weight_checksum is filled (a pass
  // over every weight on the server).
  absl::StatusOr<ModelInfo> GetModelInfo(bool include_weight_checksum = false);
  // The server's metrics in the Prometheus text format.
  absl::StatusOr<std::string> GetMetrics();

 private:
  Client(std::string address, ClientOptions options,
         std::shared_ptr<grpc::Channel> channel);

  // Sets the unary-call deadline on `context` when one is configured.
  void SetDeadline(grpc::ClientContext* context) const;
  // Adds the bearer token to `context` when one is configured.
  void Authorize(grpc::ClientContext* context) const;
  // One unary call `rpc` of `stub` with `request`, its context authorised
  // and, when `deadline`, given the unary-call deadline: the response, or
  // the call's status.
  template <typename Stub, typename Request, typename Response>
  absl::StatusOr<Response> Call(Stub* stub,
                                grpc::Status (Stub::*rpc)(grpc::ClientContext*,
                                                          const Request&,
                                                          Response*),
                                const Request& request, bool deadline) const;

  std::string address_;
  ClientOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<Trainer::Stub> trainer_;
  std::unique_ptr<Predictor::Stub> predictor_;
  std::unique_ptr<Admin::Stub> admin_;
};

}  // namespace dlrm::clients
