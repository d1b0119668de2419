// DlrmServer: wiring, start-up and orderly shutdown.
#include "server/dlrm_server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/support/server_interceptor.h>
#include <httplib.h>

#include <chrono>
#include <limits>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "comm/listen_address.h"
#include "core/status.h"
#include "spdlog/spdlog.h"

namespace dlrm::server {
namespace {

constexpr const char* kServices[] = {"dlrm.Trainer", "dlrm.Predictor",
                                     "dlrm.Admin"};

std::string JoinHostPort(const std::string& host, int port) {
  if (host.find(':') != std::string::npos) {
    return absl::StrCat("[", host, "]:", port);
  }
  return absl::StrCat(host, ":", port);
}

// Counts the calls in progress: gRPC makes one interceptor per call and
// deletes it when the call is over.
class CallCounter : public grpc::experimental::Interceptor {
 public:
  explicit CallCounter(std::shared_ptr<std::atomic<int64_t>> count)
      : count_(std::move(count)) {
    count_->fetch_add(1);
  }
  ~CallCounter() override { count_->fetch_sub(1); }
  void Intercept(
      grpc::experimental::InterceptorBatchMethods* methods) override {
    methods->Proceed();
  }

 private:
  std::shared_ptr<std::atomic<int64_t>> count_;
};

class CallCounterFactory
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit CallCounterFactory(std::shared_ptr<std::atomic<int64_t>> count)
      : count_(std::move(count)) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo*) override {
    return new CallCounter(count_);
  }

 private:
  std::shared_ptr<std::atomic<int64_t>> count_;
};

}  // namespace

absl::Status SplitHostPort(const std::string& address, const std::string& flag,
                           std::string* host, int* port) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        flag, " = \"", address, "\" must be HOST:PORT (e.g. 127.0.0.1:0)"));
  }
  std::string h = address.substr(0, colon);
  if (h.size() >= 2 && h.front() == '[' && h.back() == ']') {
    h = h.substr(1, h.size() - 2);
  }
  int p = 0;
  if (!absl::SimpleAtoi(address.substr(colon + 1), &p) || p < 0 || p > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, " = \"", address, "\": port must be in [0, 65535]"));
  }
  *host = std::move(h);
  *port = p;
  return absl::OkStatus();
}

absl::Status ServerOptions::Validate() const {
  std::string host;
  int port = 0;
  RETURN_IF_ERROR(SplitHostPort(listen, "listen", &host, &port));
  if (!metrics_listen.empty()) {
    RETURN_IF_ERROR(
        SplitHostPort(metrics_listen, "metrics_listen", &host, &port));
  }
  if (train_queue_depth < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "train_queue_depth = ", train_queue_depth, " must be >= 1"));
  }
  if (!(train_idle_timeout_seconds >= 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "train_idle_timeout_seconds = ", train_idle_timeout_seconds,
        " must be >= 0"));
  }
  PredictBatcherOptions batcher;
  batcher.max_batch_samples = predict_max_batch;
  batcher.max_wait_us = predict_max_wait_us;
  RETURN_IF_ERROR(batcher.Validate());
  if (max_message_bytes < 1024 ||
      max_message_bytes > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_message_bytes = ", max_message_bytes,
                     " must be in [1 KiB, 2 GiB)"));
  }
  if (max_batch_samples < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_batch_samples = ", max_batch_samples, " must be >= 1"));
  }
  if (work_threads < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("work_threads = ", work_threads, " must be >= 1"));
  }
  if (max_concurrent_streams < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_concurrent_streams = ", max_concurrent_streams, " must be >= 0"));
  }
  if (const absl::Status bad = tls.Validate(); !bad.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        bad.message(), " (--tls-cert, --tls-key, --tls-client-ca)"));
  }
  RETURN_IF_ERROR(auth.Validate());
  if (!follow_dir.empty()) {
    if (!inference_only) {
      return absl::InvalidArgumentError(
          "following checkpoints (--follow) needs an inference-only server "
          "(--inference-only): a training server writes its own");
    }
    RETURN_IF_ERROR(FollowerOptionsFrom(*this).Validate());
  }
  RETURN_IF_ERROR(HostOptionsFrom(*this).Validate());
  RETURN_IF_ERROR(DataPathsFrom(*this).Validate());
  return absl::OkStatus();
}

DataPathOptions DataPathsFrom(const ServerOptions& options) {
  return {.data_dir = options.data_dir,
          .allowed_dirs = options.allowed_data_dirs};
}

ModelHostOptions HostOptionsFrom(const ServerOptions& options) {
  ModelHostOptions o;
  o.inference_only = options.inference_only;
  o.checkpoint_dir = options.checkpoint_dir;
  o.checkpoint_every_steps = options.checkpoint_every_steps;
  o.checkpoint_every_seconds = options.checkpoint_every_seconds;
  o.keep_checkpoints = options.keep_checkpoints;
  o.compute_threads = options.compute_threads;
  o.loaded_from = options.loaded_from;
  o.adjust_loaded_config = options.adjust_loaded_config;
  return o;
}

CheckpointFollowerOptions FollowerOptionsFrom(const ServerOptions& options) {
  return {.dir = options.follow_dir,
          .poll_seconds = options.follow_poll_seconds};
}

DlrmServer::DlrmServer(ServerOptions options) : options_(std::move(options)) {}

DlrmServer::~DlrmServer() { Shutdown(); }

absl::StatusOr<std::unique_ptr<DlrmServer>> DlrmServer::Start(
    std::unique_ptr<model::Model> model, ServerOptions options) {
  RETURN_IF_ERROR(options.Validate());
  ASSIGN_OR_RETURN(
      std::unique_ptr<ModelHost> host,
      ModelHost::Create(std::move(model), HostOptionsFrom(options)));
  return Start(std::move(host), std::move(options));
}

absl::StatusOr<std::unique_ptr<DlrmServer>> DlrmServer::Start(
    std::unique_ptr<ModelHost> model_host, ServerOptions options) {
  RETURN_IF_ERROR(options.Validate());
  if (model_host == nullptr ||
      model_host->inference_only() != options.inference_only) {
    return absl::InvalidArgumentError(
        "DlrmServer needs a host whose inference_only matches the options");
  }
  std::unique_ptr<DlrmServer> s(new DlrmServer(std::move(options)));
  const ServerOptions& o = s->options_;
  s->host_ = std::move(model_host);
  s->auth_ = std::make_unique<TokenAuth>(o.auth);
  ASSIGN_OR_RETURN(std::shared_ptr<grpc::ServerCredentials> credentials,
                   comm::MakeServerCredentials(o.tls));
  s->work_ = std::make_unique<WorkQueue>(o.work_threads);
  PredictBatcherOptions batcher;
  batcher.max_batch_samples = o.predict_max_batch;
  batcher.max_wait_us = o.predict_max_wait_us;
  s->batcher_ =
      std::make_unique<PredictBatcher>(s->host_.get(), &s->metrics_, batcher);
  JobManagerOptions jobs;
  jobs.data_paths = DataPathsFrom(o);
  jobs.max_batch_samples = o.max_batch_samples;
  // End markers live with the checkpoints that may record the jobs.
  if (!o.inference_only) jobs.state_dir = o.checkpoint_dir;
  RETURN_IF_ERROR(jobs.Validate());
  s->jobs_ = std::make_unique<JobManager>(s->host_.get(), &s->metrics_, jobs);
  if (!o.resume_job.empty()) {
    // Before the services start, so no client job takes training (or the
    // id) first. A job that cannot restart (its data gone) leaves the
    // server serving the resumed model.
    const absl::Status resumed = s->jobs_->Resume(o.resume_job);
    if (!resumed.ok()) {
      spdlog::error("the checkpoint's job is not resumed: {}",
                    resumed.ToString());
    }
  }
  TrainerServiceOptions trainer;
  trainer.stream.queue_depth = o.train_queue_depth;
  trainer.stream.idle_timeout_seconds = o.train_idle_timeout_seconds;
  trainer.stream.max_batch_samples = o.max_batch_samples;
  trainer.data_paths = DataPathsFrom(o);
  trainer.max_batch_samples = o.max_batch_samples;
  RETURN_IF_ERROR(trainer.Validate());
  s->trainer_ = std::make_unique<TrainerService>(s->host_.get(), s->jobs_.get(),
                                                 &s->metrics_, s->work_.get(),
                                                 s->auth_.get(), trainer);
  s->predictor_ = std::make_unique<PredictorService>(
      s->host_.get(), s->batcher_.get(), &s->metrics_, s->auth_.get(),
      o.max_batch_samples);
  s->admin_ = std::make_unique<AdminService>(s->host_.get(), &s->metrics_,
                                             s->work_.get(), s->auth_.get(),
                                             o.checkpoint_dir);
  s->metrics_.SetTrainQueueCapacity(o.train_queue_depth);
  s->metrics_.SetRankHealthSource(
      [host = s->host_.get()] { return host->Health(); });
  {
    ModelSummary summary = s->host_->Summary(/*include_weight_checksum=*/false);
    s->metrics_.SetDenseInfo(summary.dense_precision,
                             std::move(summary.dense_isa),
                             std::move(summary.cpu_model));
  }

  // Both are process-wide settings read when a builder is made.
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  builder.AddListeningPort(o.listen, credentials, &s->port_);
  // The port is this server's alone: with SO_REUSEPORT (gRPC's default) a
  // second server on it would start and take a share of the calls.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.SetMaxReceiveMessageSize(static_cast<int>(o.max_message_bytes));
  builder.SetMaxSendMessageSize(static_cast<int>(o.max_message_bytes));
  if (o.max_concurrent_streams > 0) {
    builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS,
                               o.max_concurrent_streams);
  }
  builder.RegisterService(s->trainer_.get());
  builder.RegisterService(s->predictor_.get());
  builder.RegisterService(s->admin_.get());
  std::vector<
      std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>
      interceptors;
  interceptors.push_back(
      std::make_unique<CallCounterFactory>(s->calls_in_flight_));
  builder.experimental().SetInterceptorCreators(std::move(interceptors));
  s->server_ = builder.BuildAndStart();
  if (s->server_ == nullptr || s->port_ == 0) {
    return comm::ListenFailure("--listen", o.listen);
  }
  std::string host;
  int unused_port = 0;
  RETURN_IF_ERROR(SplitHostPort(o.listen, "listen", &host, &unused_port));
  s->address_ = JoinHostPort(host, s->port_);
  grpc::HealthCheckServiceInterface* health =
      s->server_->GetHealthCheckService();
  if (health != nullptr) {
    health->SetServingStatus(true);
    for (const char* name : kServices) health->SetServingStatus(name, true);
  }
  RETURN_IF_ERROR(s->StartMetricsHttp());
  if (!o.follow_dir.empty()) {
    ASSIGN_OR_RETURN(s->follower_,
                     CheckpointFollower::Start(s->host_.get(), &s->metrics_,
                                               FollowerOptionsFrom(o)));
  }
  spdlog::info("serving on {} (metrics {}), {}", s->address_,
               s->metrics_address_.empty() ? "off" : s->metrics_address_,
               o.inference_only ? "inference only" : "training and inference");
  spdlog::info("gRPC {}; {}",
               !o.tls.enabled()               ? "plaintext"
               : o.tls.client_ca_file.empty() ? "TLS"
                                              : "TLS with client certificates",
               !s->auth_->enabled() ? "no auth token"
               : o.auth.predict_requires_token
                   ? "every call needs the auth token"
                   : "Trainer and Admin need the auth token");
  return s;
}

absl::Status DlrmServer::StartMetricsHttp() {
  if (options_.metrics_listen.empty()) return absl::OkStatus();
  std::string host;
  int port = 0;
  RETURN_IF_ERROR(
      SplitHostPort(options_.metrics_listen, "metrics_listen", &host, &port));
  http_ = std::make_unique<httplib::Server>();
  // httplib's default options add SO_REUSEPORT, which lets a second server
  // bind the same port and take a share of the scrapes: SO_REUSEADDR only.
  http_->set_socket_options([](int socket) {
    const int yes = 1;
    setsockopt(socket, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  http_->Get("/metrics",
             [this](const httplib::Request&, httplib::Response& response) {
               response.set_content(MetricsText(),
                                    "text/plain; version=0.0.4; charset=utf-8");
             });
  if (port == 0) {
    port = http_->bind_to_any_port(host);
  } else if (!http_->bind_to_port(host, port)) {
    port = -1;
  }
  if (port <= 0) {
    http_.reset();
    return comm::ListenFailure("--metrics-listen", options_.metrics_listen);
  }
  metrics_address_ = JoinHostPort(host, port);
  http_thread_ = std::thread([this] { http_->listen_after_bind(); });
  // httplib's stop() does nothing until the listen loop runs: a Shutdown
  // right after Start would otherwise leave the thread in accept() forever.
  // (Bounded: a loop that ends at once would never be seen running.)
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (!http_->is_running() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return absl::OkStatus();
}

std::string DlrmServer::MetricsText() {
  return metrics_.Render(host_->steps(), host_->served_checkpoint());
}

void DlrmServer::Shutdown(double grace_seconds) {
  {
    std::unique_lock<std::mutex> lock(shutdown_mu_);
    if (shut_down_) {
      shutdown_cv_.wait(lock, [&] { return stopped_; });
      return;
    }
    shut_down_ = true;
  }
  // No swap starts once shutting down (one in progress finishes first).
  if (follower_ != nullptr) follower_->Stop();
  if (server_ != nullptr) {
    grpc::HealthCheckServiceInterface* health =
        server_->GetHealthCheckService();
    if (health != nullptr) health->SetServingStatus(false);
  }
  // A job stops at its next step boundary (CANCELLED); then a Train stream
  // does (UNAVAILABLE), since no more steps are taken.
  if (jobs_ != nullptr) jobs_->Shutdown();
  if (host_ != nullptr) host_->StopTraining();
  // Other RPCs in flight get the grace period, then are cancelled. The
  // batcher and the work queue keep running meanwhile, since those RPCs
  // finish through them. A call that arrives after the count reached zero
  // is cancelled as it would be after the grace period.
  if (server_ != nullptr) {
    const auto deadline =
        std::chrono::steady_clock::now() +
        std::chrono::microseconds(static_cast<int64_t>(grace_seconds * 1e6));
    while (calls_in_flight_->load() > 0 &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    server_->Shutdown(std::chrono::system_clock::now());
  }
  if (batcher_ != nullptr) batcher_->Stop();
  if (work_ != nullptr) work_->Stop();
  if (http_ != nullptr) {
    http_->stop();
    if (http_thread_.joinable()) http_thread_.join();
  }
  spdlog::info("server stopped");
  std::lock_guard<std::mutex> lock(shutdown_mu_);
  stopped_ = true;
  shutdown_cv_.notify_all();
}

void DlrmServer::Wait() {
  std::unique_lock<std::mutex> lock(shutdown_mu_);
  shutdown_cv_.wait(lock, [&] { return stopped_; });
}

std::string DlrmServer::InterruptedJob() {
  return jobs_ == nullptr ? "" : jobs_->InterruptedJob();
}

}  // namespace dlrm::server
