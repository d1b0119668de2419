// DlrmServer: the whole serving process minus main(): the ModelHost, the
// Trainer/Predictor/Admin services, grpc.health.v1, server reflection, and
// the Prometheus /metrics endpoint over HTTP.
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "comm/grpc_auth.h"
#include "model/model.h"
#include "server/admin_service.h"
#include "server/auth.h"
#include "server/checkpoint_follower.h"
#include "server/datasets.h"
#include "server/job_manager.h"
#include "server/metrics.h"
#include "server/model_host.h"
#include "server/predict_batcher.h"
#include "server/predictor_service.h"
#include "server/trainer_service.h"
#include "server/work_queue.h"

namespace httplib {
class Server;
}

namespace dlrm::server {

struct ServerOptions {
  // gRPC address, HOST:PORT; port 0 picks a free port. Default:
  // "127.0.0.1:50051".
  std::string listen = "127.0.0.1:50051";
  // Prometheus /metrics address, HOST:PORT (port 0 picks one); empty
  // disables the endpoint. Default: "127.0.0.1:9464".
  std::string metrics_listen = "127.0.0.1:9464";
  // When set, checkpoint paths resolve under it and may not leave it.
  // Default: empty (any path the server can write).
  std::string checkpoint_dir;
  // Dataset files of jobs and Evaluate are read only inside this directory
  // or one of allowed_data_dirs (after resolving `..` and symbolic links;
  // PermissionDenied otherwise), and relative paths resolve here. Default:
  // empty (relative paths resolve against the working directory; with no
  // allowed_data_dirs either, no dataset file is read at all).
  std::string data_dir;
  // More directories dataset files may be read from (--allow-data-path).
  // Default: empty.
  std::vector<std::string> allowed_data_dirs;
  // Serve predictions only (see ModelHostOptions). Default: false.
  bool inference_only = false;
  // With inference_only: follow the checkpoints a training server writes
  // into this directory, swapping each newer complete one in
  // (CheckpointFollower, --follow). Default: empty (off).
  std::string follow_dir;
  // Seconds between two looks into follow_dir. Default: 5.
  double follow_poll_seconds = 5;
  // The checkpoint directory the model was loaded from (--restore, or the
  // one --follow started from), reported as the served checkpoint (see
  // ModelHostOptions::loaded_from). Default: empty.
  std::string loaded_from;
  // Applied to each checkpoint an inference-only server loads by restore or
  // by following (ModelHostOptions::adjust_loaded_config). Default: null.
  std::function<absl::Status(ModelConfig*)> adjust_loaded_config;
  // Periodic checkpoints under checkpoint_dir (see ModelHostOptions):
  // every N steps, every S seconds (0 = off), keeping the K newest.
  // Defaults: 0, 0, 3.
  int64_t checkpoint_every_steps = 0;
  double checkpoint_every_seconds = 0;
  int keep_checkpoints = 3;
  // OpenMP threads of model work (see ModelHostOptions); 0 = the OpenMP
  // default. Default: 0.
  int compute_threads = 0;
  // The job record of the checkpoint the model was resumed from
  // (model::Manifest::job): that job restarts at its position before the
  // services start (JobManager::Resume). Default: empty (none).
  std::string resume_job;
  // Batches a Train stream holds waiting for the trainer. Default: 4.
  int train_queue_depth = 4;
  // Seconds a Train stream may wait on a stalled client before it ends
  // with DEADLINE_EXCEEDED and frees training; 0 = no limit. Default: 300.
  double train_idle_timeout_seconds = 300;
  // Most samples per micro-batched model call. Default: 1024.
  int64_t predict_max_batch = 1024;
  // Longest a Predict waits for others to join it, in us. Default: 1000.
  int64_t predict_max_wait_us = 1000;
  // Largest gRPC message received or sent, in bytes; a larger one gets
  // RESOURCE_EXHAUSTED from gRPC. Default: 64 MiB.
  int64_t max_message_bytes = int64_t{64} << 20;
  // Largest batch accepted (Train, Predict, Evaluate, a job's batch_size),
  // in samples. Default: 65536.
  int64_t max_batch_samples = 65536;
  // Threads for blocking RPC work (evaluation, checkpoints, CancelJob).
  // Default: 2.
  int work_threads = 2;
  // Most concurrent RPCs (HTTP/2 streams) one client connection may have
  // open (GRPC_ARG_MAX_CONCURRENT_STREAMS); further calls wait for a free
  // one. 0 keeps gRPC's default (no limit). Default: 0.
  int max_concurrent_streams = 0;
  // TLS of the gRPC port (the /metrics endpoint stays plain HTTP):
  // --tls-cert, --tls-key, --tls-client-ca. Default: off.
  comm::TlsServerOptions tls;
  // The bearer token Trainer and Admin (and optionally Predictor) calls
  // need. Default: none (every call is open).
  AuthOptions auth;

  absl::Status Validate() const;
};

// Thread-safe. Shutdown (or destruction) stops everything in order.
class DlrmServer {
 public:
  // Serves `model` (non-null) with `options`: binds both ports, starts the
  // services. InvalidArgument for bad options; Unavailable when a port
  // cannot be bound, naming the flag, address and reason ("--listen
  // 127.0.0.1:50051: address already in use"): neither port is bound with
  // SO_REUSEPORT, so one another process holds is refused.
  static absl::StatusOr<std::unique_ptr<DlrmServer>> Start(
      std::unique_ptr<model::Model> model, ServerOptions options);

  // Serves the model behind `host` (non-null), e.g. the leader of a
  // multi-rank job; options.inference_only must equal the host's
  // (InvalidArgument otherwise). Errors as above.
  static absl::StatusOr<std::unique_ptr<DlrmServer>> Start(
      std::unique_ptr<ModelHost> host, ServerOptions options);

  // Shutdown().
  ~DlrmServer();

  // The gRPC address actually bound (HOST:PORT, the real port).
  const std::string& address() const { return address_; }
  // The /metrics address bound, or empty when disabled.
  const std::string& metrics_address() const { return metrics_address_; }
  int port() const { return port_; }

  ModelHost* host() { return host_.get(); }
  // The checkpoint follower, or null without options.follow_dir.
  CheckpointFollower* follower() { return follower_.get(); }
  ServerMetrics* metrics() { return &metrics_; }
  // The Prometheus text (as /metrics and Admin.GetMetrics serve it).
  std::string MetricsText();

  // Marks health NOT_SERVING, stops jobs and streams at a step boundary,
  // waits up to `grace_seconds` for RPCs in flight (then cancels them),
  // and stops the HTTP endpoint. Idempotent; a second caller waits for the
  // first to finish.
  void Shutdown(double grace_seconds = 5);

  // Blocks until Shutdown() has been called and finished.
  void Wait();

  // After Shutdown(): the record of the job the shutdown stopped mid-way
  // (JobManager::InterruptedJob), for the exit checkpoint; empty if none.
  std::string InterruptedJob();

 private:
  explicit DlrmServer(ServerOptions options);
  absl::Status StartMetricsHttp();

  const ServerOptions options_;
  ServerMetrics metrics_;
  std::unique_ptr<ModelHost> host_;
  std::unique_ptr<TokenAuth> auth_;
  std::unique_ptr<WorkQueue> work_;
  std::unique_ptr<PredictBatcher> batcher_;
  std::unique_ptr<JobManager> jobs_;
  std::unique_ptr<TrainerService> trainer_;
  std::unique_ptr<PredictorService> predictor_;
  std::unique_ptr<AdminService> admin_;
  std::unique_ptr<CheckpointFollower> follower_;
  std::unique_ptr<grpc::Server> server_;
  // gRPC calls in progress (counted by an interceptor per call). gRPC 1.51's
  // Shutdown waits out its whole deadline while any client keeps a channel
  // open, so Shutdown waits on this count instead and then gives gRPC none.
  std::shared_ptr<std::atomic<int64_t>> calls_in_flight_ =
      std::make_shared<std::atomic<int64_t>>(0);
  std::unique_ptr<httplib::Server> http_;
  std::thread http_thread_;
  std::string address_, metrics_address_;
  int port_ = 0;

  std::mutex shutdown_mu_;
  bool shut_down_ = false;  // Shutdown() has begun
  bool stopped_ = false;    // Shutdown() has finished
  std::condition_variable shutdown_cv_;
};

// The ModelHost options that `options` ask for (inference-only, periodic
// checkpoints).
ModelHostOptions HostOptionsFrom(const ServerOptions& options);

// The checkpoint follower options that `options` ask for (follow_dir).
CheckpointFollowerOptions FollowerOptionsFrom(const ServerOptions& options);

// The directories dataset files may be read from, as `options` set them.
DataPathOptions DataPathsFrom(const ServerOptions& options);

// Splits "HOST:PORT" ("[::1]:80" for IPv6). InvalidArgument naming `flag`
// when the port is missing or not in [0, 65535].
absl::Status SplitHostPort(const std::string& address, const std::string& flag,
                           std::string* host, int* port);

}  // namespace dlrm::server
