// The dlrm-server C++ client: unary calls map their grpc::Status to
// absl::Status; Train runs a sender thread beside the reading caller.
#include "clients/client.h"

#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/channel_arguments.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "clients/grpc_status.h"
#include "core/status.h"
#include "data/wire.h"

namespace dlrm::clients {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

std::chrono::system_clock::time_point DeadlineAfter(double seconds) {
  return std::chrono::system_clock::now() +
         std::chrono::duration_cast<std::chrono::system_clock::duration>(
             std::chrono::duration<double>(seconds));
}

absl::StatusOr<std::string> ReadPemFile(const std::string& path,
                                        const char* what) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream contents;
  contents << in.rdbuf();
  if (!in || in.bad()) {
    return absl::NotFoundError(absl::StrCat("cannot read ", what, " ", path));
  }
  return contents.str();
}

// The channel credentials `options` ask for: insecure, or TLS from the
// PEM files.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeCredentials(
    const ClientOptions& options) {
  if (!options.tls) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions ssl;
  if (!options.tls_ca_file.empty()) {
    ASSIGN_OR_RETURN(ssl.pem_root_certs,
                     ReadPemFile(options.tls_ca_file, "TLS CA file"));
  }
  if (!options.tls_cert_file.empty()) {
    ASSIGN_OR_RETURN(ssl.pem_cert_chain, ReadPemFile(options.tls_cert_file,
                                                     "TLS certificate file"));
    ASSIGN_OR_RETURN(ssl.pem_private_key,
                     ReadPemFile(options.tls_key_file, "TLS key file"));
  }
  return grpc::SslCredentials(ssl);
}

// InvalidArgument "`name` must be positive, got `value`" unless value > 0
// (NaN is not).
template <typename T>
absl::Status MustBePositive(const char* name, T value) {
  if (value > 0) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(name, " must be positive, got ", value));
}

// InvalidArgument "`name` must be >= 0, got `value`" unless value >= 0
// (NaN is not).
template <typename T>
absl::Status MustBeNonNegative(const char* name, T value) {
  if (value >= 0) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(name, " must be >= 0, got ", value));
}

// The request naming job `id` (GetJob, CancelJob).
JobId JobIdRequest(const std::string& id) {
  JobId request;
  request.set_id(id);
  return request;
}

// A `Request` (CheckpointRequest, ExportRequest) for `path`.
template <typename Request>
Request PathRequest(const std::string& path) {
  Request request;
  request.set_path(path);
  return request;
}

}  // namespace

absl::Status ClientOptions::Validate() const {
  RETURN_IF_ERROR(MustBePositive("max_message_bytes", max_message_bytes));
  RETURN_IF_ERROR(
      MustBeNonNegative("connect_timeout_seconds", connect_timeout_seconds));
  RETURN_IF_ERROR(
      MustBeNonNegative("call_timeout_seconds", call_timeout_seconds));
  if (!tls && !(tls_ca_file.empty() && tls_cert_file.empty() &&
                tls_key_file.empty() && tls_server_name.empty())) {
    return absl::InvalidArgumentError(
        "tls_ca_file, tls_cert_file, tls_key_file and tls_server_name need "
        "tls = true");
  }
  if (tls_cert_file.empty() != tls_key_file.empty()) {
    return absl::InvalidArgumentError(
        "a client certificate needs its key: set both tls_cert_file and "
        "tls_key_file, or neither");
  }
  for (const char c : auth_token) {
    if (c < 0x21 || c > 0x7e) {
      return absl::InvalidArgumentError(
          "auth_token may hold printable ASCII only, without spaces");
    }
  }
  return absl::OkStatus();
}

absl::Status TrainOptions::Validate() const {
  RETURN_IF_ERROR(MustBePositive("batch_size", batch_size));
  RETURN_IF_ERROR(MustBePositive("max_in_flight", max_in_flight));
  RETURN_IF_ERROR(MustBePositive("epochs", epochs));
  return MustBeNonNegative("max_steps", max_steps);
}

absl::Status WaitOptions::Validate() const {
  RETURN_IF_ERROR(
      MustBePositive("poll_interval_seconds", poll_interval_seconds));
  return MustBeNonNegative("timeout_seconds", timeout_seconds);
}

bool IsTerminal(JobStatus::State state) {
  return state == JobStatus::SUCCEEDED || state == JobStatus::FAILED ||
         state == JobStatus::CANCELLED;
}

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(
    const std::string& address, const ClientOptions& options) {
  RETURN_IF_ERROR(options.Validate());
  if (address.empty()) {
    return absl::InvalidArgumentError("server address is empty");
  }
  ASSIGN_OR_RETURN(std::shared_ptr<grpc::ChannelCredentials> credentials,
                   MakeCredentials(options));
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(options.max_message_bytes);
  args.SetMaxSendMessageSize(options.max_message_bytes);
  if (!options.tls_server_name.empty()) {
    args.SetSslTargetNameOverride(options.tls_server_name);
  }
  std::shared_ptr<grpc::Channel> channel =
      grpc::CreateCustomChannel(address, credentials, args);
  if (options.connect_timeout_seconds > 0) {
    // Waits while the channel connects; a failed attempt (refused, an
    // unknown host, a TLS handshake that fails) ends the wait at once
    // instead of retrying until the timeout.
    const auto deadline = DeadlineAfter(options.connect_timeout_seconds);
    grpc_connectivity_state state = channel->GetState(/*try_to_connect=*/true);
    while (state != GRPC_CHANNEL_READY) {
      if (state == GRPC_CHANNEL_TRANSIENT_FAILURE ||
          state == GRPC_CHANNEL_SHUTDOWN) {
        return absl::UnavailableError(absl::StrCat(
            "cannot connect to dlrm-server at ", address,
            ": the connection failed (refused: is a dlrm_server listening "
            "there? An unknown host, or a TLS handshake that failed, ends "
            "the same way)"));
      }
      if (!channel->WaitForStateChange(state, deadline)) {
        return absl::UnavailableError(
            absl::StrCat("could not connect to dlrm-server at ", address,
                         " within ", options.connect_timeout_seconds, " s"));
      }
      state = channel->GetState(/*try_to_connect=*/true);
    }
  }
  return std::unique_ptr<Client>(
      new Client(address, options, std::move(channel)));
}

Client::Client(std::string address, ClientOptions options,
               std::shared_ptr<grpc::Channel> channel)
    : address_(std::move(address)),
      options_(options),
      channel_(std::move(channel)),
      trainer_(Trainer::NewStub(channel_)),
      predictor_(Predictor::NewStub(channel_)),
      admin_(Admin::NewStub(channel_)) {}

void Client::SetDeadline(grpc::ClientContext* context) const {
  if (options_.call_timeout_seconds > 0) {
    context->set_deadline(DeadlineAfter(options_.call_timeout_seconds));
  }
}

void Client::Authorize(grpc::ClientContext* context) const {
  // Metadata rather than call credentials: gRPC refuses call credentials on
  // a plaintext channel, and a token over loopback plaintext is allowed.
  if (!options_.auth_token.empty()) {
    context->AddMetadata("authorization",
                         absl::StrCat("Bearer ", options_.auth_token));
  }
}

template <typename Stub, typename Request, typename Response>
absl::StatusOr<Response> Client::Call(
    Stub* stub,
    grpc::Status (Stub::*rpc)(grpc::ClientContext*, const Request&, Response*),
    const Request& request, bool deadline) const {
  grpc::ClientContext context;
  Authorize(&context);
  if (deadline) SetDeadline(&context);
  Response response;
  RETURN_IF_ERROR(FromGrpcStatus((stub->*rpc)(&context, request, &response)));
  return response;
}

absl::StatusOr<TrainSummary> Client::Train(data::BatchSource& source,
                                           const TrainOptions& options,
                                           const StepCallback& on_step) {
  RETURN_IF_ERROR(options.Validate());
  const Clock::time_point start = Clock::now();
  grpc::ClientContext context;
  Authorize(&context);
  std::unique_ptr<grpc::ClientReaderWriter<TrainRequest, TrainResponse>>
      stream = trainer_->Train(&context);

  // Shared by the sender thread and this (reading) thread.
  std::mutex mu;
  std::condition_variable cv;
  int in_flight = 0;
  bool reader_done = false;
  std::deque<int64_t> unanswered;  // sizes of sent, unanswered batches
  int64_t sent = 0;
  absl::Status send_status;

  // Sends batches while fewer than max_in_flight are unanswered; stops when
  // the data ends, the step cap is reached or the reader has stopped.
  auto send_all = [&]() -> absl::Status {
    data::Batch batch;
    TrainRequest request;
    int64_t steps = 0;
    for (int epoch = 0; epoch < options.epochs; ++epoch) {
      if (epoch > 0) RETURN_IF_ERROR(source.Rewind());
      while (options.max_steps == 0 || steps < options.max_steps) {
        {
          std::unique_lock<std::mutex> lock(mu);
          cv.wait(lock, [&] {
            return in_flight < options.max_in_flight || reader_done;
          });
          if (reader_done) return absl::OkStatus();
        }
        ASSIGN_OR_RETURN(const bool more,
                         source.Next(options.batch_size, &batch));
        if (!more) break;
        if (batch.size == 0) continue;
        data::BatchToProto(batch, /*include_labels=*/true,
                           request.mutable_batch());
        {
          std::lock_guard<std::mutex> lock(mu);
          ++in_flight;
          ++sent;
          unanswered.push_back(batch.size);
        }
        // A failed write means the stream is over; the reader gets the
        // server's status from Finish.
        if (!stream->Write(request)) return absl::OkStatus();
        ++steps;
      }
    }
    stream->WritesDone();
    return absl::OkStatus();
  };
  std::thread sender([&] {
    absl::Status status = send_all();
    if (!status.ok()) {
      {
        std::lock_guard<std::mutex> lock(mu);
        send_status = std::move(status);
      }
      context.TryCancel();
    }
  });

  TrainSummary summary;
  double loss_sum = 0;
  absl::Status protocol_status;
  TrainResponse response;
  while (stream->Read(&response)) {
    int64_t samples = 0;
    {
      std::lock_guard<std::mutex> lock(mu);
      if (unanswered.empty()) {
        protocol_status = absl::InternalError(
            "server answered more Train results than batches were sent");
        break;
      }
      samples = unanswered.front();
      unanswered.pop_front();
      --in_flight;
    }
    cv.notify_all();
    const StepResult& result = response.result();
    ++summary.steps;
    summary.samples += samples;
    summary.last_step = result.step();
    summary.final_loss = result.loss();
    loss_sum += result.loss() * static_cast<double>(samples);
    if (on_step) on_step(result);
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    reader_done = true;
  }
  cv.notify_all();
  if (!protocol_status.ok()) context.TryCancel();
  sender.join();
  const grpc::Status grpc_status = stream->Finish();

  RETURN_IF_ERROR(send_status);
  RETURN_IF_ERROR(protocol_status);
  RETURN_IF_ERROR(FromGrpcStatus(grpc_status));
  if (summary.steps != sent) {
    return absl::InternalError(absl::StrCat("Train stream ended with ",
                                            summary.steps, " of ", sent,
                                            " batches answered"));
  }
  summary.seconds = SecondsSince(start);
  if (summary.samples > 0) {
    summary.mean_loss = loss_sum / static_cast<double>(summary.samples);
  }
  if (summary.seconds > 0) {
    summary.samples_per_second =
        static_cast<double>(summary.samples) / summary.seconds;
  }
  return summary;
}

absl::StatusOr<JobStatus> Client::StartJob(const JobRequest& request) {
  return Call(trainer_.get(), &Trainer::Stub::StartJob, request,
              /*deadline=*/true);
}

absl::StatusOr<JobStatus> Client::GetJob(const std::string& id) {
  return Call(trainer_.get(), &Trainer::Stub::GetJob, JobIdRequest(id),
              /*deadline=*/true);
}

absl::StatusOr<JobStatus> Client::CancelJob(const std::string& id) {
  return Call(trainer_.get(), &Trainer::Stub::CancelJob, JobIdRequest(id),
              /*deadline=*/true);
}

absl::StatusOr<std::vector<JobStatus>> Client::ListJobs() {
  ASSIGN_OR_RETURN(ListJobsResponse response,
                   Call(trainer_.get(), &Trainer::Stub::ListJobs,
                        ListJobsRequest(), /*deadline=*/true));
  return std::vector<JobStatus>(response.jobs().begin(), response.jobs().end());
}

absl::StatusOr<JobStatus> Client::WaitJob(const std::string& id,
                                          const WaitOptions& options,
                                          const JobCallback& on_progress) {
  RETURN_IF_ERROR(options.Validate());
  const Clock::time_point start = Clock::now();
  const auto interval = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(options.poll_interval_seconds));
  Clock::time_point next_poll = start;
  while (true) {
    ASSIGN_OR_RETURN(JobStatus status, GetJob(id));
    if (on_progress) on_progress(status);
    if (IsTerminal(status.state())) return status;
    if (options.timeout_seconds > 0 &&
        SecondsSince(start) >= options.timeout_seconds) {
      return absl::DeadlineExceededError(absl::StrCat(
          "job ", id, " still ", JobStatus::State_Name(status.state()),
          " after ", options.timeout_seconds, " s"));
    }
    next_poll += interval;
    std::this_thread::sleep_until(std::max(next_poll, Clock::now()));
  }
}

absl::StatusOr<EvaluateResponse> Client::Evaluate(
    const EvaluateRequest& request) {
  return Call(trainer_.get(), &Trainer::Stub::Evaluate, request,
              /*deadline=*/false);
}

absl::StatusOr<EvaluateResponse> Client::EvaluateSource(
    data::BatchSource& source, int64_t batch_size, int64_t max_samples) {
  RETURN_IF_ERROR(MustBePositive("batch_size", batch_size));
  RETURN_IF_ERROR(MustBeNonNegative("max_samples", max_samples));
  EvaluateRequest request;
  data::Batch batch;
  int64_t samples = 0;
  size_t bytes = 0;
  while (max_samples == 0 || samples < max_samples) {
    const int64_t want = max_samples == 0
                             ? batch_size
                             : std::min(batch_size, max_samples - samples);
    ASSIGN_OR_RETURN(const bool more, source.Next(want, &batch));
    if (!more) break;
    dlrm::Batch* wire = request.add_batches();
    data::BatchToProto(batch, /*include_labels=*/true, wire);
    // Field tag and length prefix: at most 11 bytes per batch.
    bytes += wire->ByteSizeLong() + 11;
    if (bytes > static_cast<size_t>(options_.max_message_bytes)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "evaluation data exceeds the ", options_.max_message_bytes,
          "-byte message limit after ", samples + batch.size,
          " samples; evaluate fewer samples or a dataset on the server"));
    }
    samples += batch.size;
  }
  if (samples == 0) {
    return absl::InvalidArgumentError("no evaluation samples in the source");
  }
  return Evaluate(request);
}

absl::StatusOr<std::vector<float>> Client::Predict(const data::Batch& batch) {
  PredictRequest request;
  data::BatchToProto(batch, /*include_labels=*/false, request.mutable_batch());
  grpc::ClientContext context;
  Authorize(&context);
  SetDeadline(&context);
  PredictResponse response;
  RETURN_IF_ERROR(
      FromGrpcStatus(predictor_->Predict(&context, request, &response)));
  if (response.probabilities_size() != batch.size) {
    return absl::InternalError(
        absl::StrCat("server returned ", response.probabilities_size(),
                     " probabilities for ", batch.size, " samples"));
  }
  return std::vector<float>(response.probabilities().begin(),
                            response.probabilities().end());
}

absl::StatusOr<CheckpointResponse> Client::SaveCheckpoint(
    const std::string& path) {
  return Call(admin_.get(), &Admin::Stub::SaveCheckpoint,
              PathRequest<CheckpointRequest>(path), /*deadline=*/false);
}

absl::StatusOr<CheckpointResponse> Client::RestoreCheckpoint(
    const std::string& path) {
  return Call(admin_.get(), &Admin::Stub::RestoreCheckpoint,
              PathRequest<CheckpointRequest>(path), /*deadline=*/false);
}

absl::StatusOr<ExportResponse> Client::ExportWeights(const std::string& path) {
  return Call(admin_.get(), &Admin::Stub::ExportWeights,
              PathRequest<ExportRequest>(path), /*deadline=*/false);
}

absl::StatusOr<SetLearningRateResponse> Client::SetLearningRate(
    std::optional<float> dense, std::optional<float> sparse) {
  SetLearningRateRequest request;
  if (dense.has_value()) request.set_dense(*dense);
  if (sparse.has_value()) request.set_sparse(*sparse);
  return Call(admin_.get(), &Admin::Stub::SetLearningRate, request,
              /*deadline=*/false);
}

absl::StatusOr<ModelInfo> Client::GetModelInfo(bool include_weight_checksum) {
  ModelInfoRequest request;
  request.set_include_weight_checksum(include_weight_checksum);
  return Call(admin_.get(), &Admin::Stub::GetModelInfo, request,
              /*deadline=*/true);
}

absl::StatusOr<std::string> Client::GetMetrics() {
  ASSIGN_OR_RETURN(MetricsResponse response,
                   Call(admin_.get(), &Admin::Stub::GetMetrics,
                        MetricsRequest(), /*deadline=*/true));
  return std::move(*response.mutable_prometheus_text());
}

}  // namespace dlrm::clients
