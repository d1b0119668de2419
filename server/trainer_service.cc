// dlrm.Trainer handlers.
#include "server/trainer_service.h"

#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "data/wire.h"
#include "server/datasets.h"
#include "server/grpc_status.h"
#include "spdlog/spdlog.h"

namespace dlrm::server {
namespace {

constexpr char kTrain[] = "/dlrm.Trainer/Train";
constexpr char kStartJob[] = "/dlrm.Trainer/StartJob";
constexpr char kGetJob[] = "/dlrm.Trainer/GetJob";
constexpr char kCancelJob[] = "/dlrm.Trainer/CancelJob";
constexpr char kListJobs[] = "/dlrm.Trainer/ListJobs";
constexpr char kEvaluate[] = "/dlrm.Trainer/Evaluate";

// A Train call refused before it starts: finishes with `status` at once and
// deletes itself when gRPC is done with it.
class RejectedTrainStream final : public RawBidiReactor {
 public:
  explicit RejectedTrainStream(const absl::Status& status) {
    Finish(ToGrpcStatus(status));
  }
  void OnDone() override { delete this; }
};

// What an EvaluateRequest asks for, parsed and checked.
struct EvalWork {
  std::vector<data::Batch> batches;  // inline batches, or
  OpenedDataset dataset;             // a dataset (source set)
  int64_t max_samples = 0;
};

absl::StatusOr<std::unique_ptr<EvalWork>> ParseEvaluate(
    const EvaluateRequest& request, const ModelHost& host,
    const TrainerServiceOptions& options) {
  auto work = std::make_unique<EvalWork>();
  const bool has_dataset = request.has_dataset();
  if (has_dataset == (request.batches_size() > 0)) {
    return absl::InvalidArgumentError(
        "set exactly one of batches (inline data) and dataset");
  }
  if (request.max_samples() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_samples = ", request.max_samples(), " must be >= 0"));
  }
  if (!has_dataset) {
    work->batches.resize(request.batches_size());
    for (int i = 0; i < request.batches_size(); ++i) {
      RETURN_IF_ERROR(data::BatchFromProto(
          request.batches(i), host.shape(), data::Labels::kRequired,
          options.max_batch_samples, absl::StrCat("batches[", i, "]"),
          &work->batches[i]));
    }
    return work;
  }
  ASSIGN_OR_RETURN(work->dataset, OpenDataset(request.dataset(), host.config(),
                                              options.data_paths,
                                              DatasetRole::kEval, "dataset"));
  if (work->dataset.endless && request.max_samples() == 0) {
    return absl::InvalidArgumentError(
        "dataset.synthetic.num_samples = 0 makes the data endless: set "
        "max_samples");
  }
  work->max_samples = request.max_samples();
  return work;
}

}  // namespace

absl::Status TrainerServiceOptions::Validate() const {
  RETURN_IF_ERROR(stream.Validate());
  if (max_batch_samples < 1 || eval_batch_size < 1) {
    return absl::InvalidArgumentError(
        "max_batch_samples and eval_batch_size must be >= 1");
  }
  if (cancel_wait_seconds < 0) {
    return absl::InvalidArgumentError("cancel_wait_seconds must be >= 0");
  }
  return data_paths.Validate();
}

TrainerService::TrainerService(ModelHost* host, JobManager* jobs,
                               ServerMetrics* metrics, WorkQueue* work,
                               const TokenAuth* auth,
                               TrainerServiceOptions options)
    : host_(host),
      jobs_(jobs),
      metrics_(metrics),
      work_(work),
      auth_(auth),
      options_(std::move(options)),
      unary_(auth, RpcAccess::kTraining, metrics) {}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>*
TrainerService::Train(grpc::CallbackServerContext* context) {
  if (absl::Status auth = auth_->Check(*context, RpcAccess::kTraining);
      !auth.ok()) {
    metrics_->RecordRpc(kTrain, auth.code());
    spdlog::warn("{}: {}", kTrain, auth.ToString());
    return new RejectedTrainStream(auth);
  }
  return new TrainStream(context, host_, metrics_, options_.stream);
}

grpc::ServerUnaryReactor* TrainerService::StartJob(
    grpc::CallbackServerContext* context, const JobRequest* request,
    JobStatus* response) {
  return unary_(context, kStartJob, [&](grpc::ServerUnaryReactor* reactor) {
    FinishWith(jobs_->Start(*request), response, reactor, metrics_, kStartJob);
  });
}

grpc::ServerUnaryReactor* TrainerService::GetJob(
    grpc::CallbackServerContext* context, const JobId* request,
    JobStatus* response) {
  return unary_(context, kGetJob, [&](grpc::ServerUnaryReactor* reactor) {
    FinishWith(jobs_->Get(request->id()), response, reactor, metrics_, kGetJob);
  });
}

grpc::ServerUnaryReactor* TrainerService::CancelJob(
    grpc::CallbackServerContext* context, const JobId* request,
    JobStatus* response) {
  return unary_(context, kCancelJob, [&](grpc::ServerUnaryReactor* reactor) {
    const std::string id = request->id();
    SubmitUnary(
        *work_,
        [this, reactor, response, id] {
          FinishWith(
              jobs_->Cancel(id, absl::Seconds(options_.cancel_wait_seconds)),
              response, reactor, metrics_, kCancelJob);
        },
        reactor, metrics_, kCancelJob);
  });
}

grpc::ServerUnaryReactor* TrainerService::ListJobs(
    grpc::CallbackServerContext* context, const ListJobsRequest* request,
    ListJobsResponse* response) {
  return unary_(context, kListJobs, [&](grpc::ServerUnaryReactor* reactor) {
    for (JobStatus& job : jobs_->List()) {
      *response->add_jobs() = std::move(job);
    }
    FinishUnary(reactor, metrics_, kListJobs, absl::OkStatus());
  });
}

grpc::ServerUnaryReactor* TrainerService::Evaluate(
    grpc::CallbackServerContext* context, const EvaluateRequest* request,
    EvaluateResponse* response) {
  return unary_(context, kEvaluate, [&](grpc::ServerUnaryReactor* reactor) {
    absl::StatusOr<std::unique_ptr<EvalWork>> parsed =
        ParseEvaluate(*request, *host_, options_);
    if (!parsed.ok()) {
      FinishUnary(reactor, metrics_, kEvaluate, parsed.status());
      return;
    }
    std::shared_ptr<EvalWork> eval(std::move(*parsed));
    SubmitUnary(
        *work_,
        [this, reactor, response, eval] {
          absl::StatusOr<model::EvalResult> result;
          if (eval->dataset.source != nullptr) {
            model::EvalOptions options;
            options.batch_size = options_.eval_batch_size;
            options.max_samples = eval->max_samples;
            result = host_->Evaluate(*eval->dataset.source, options,
                                     eval->dataset.reference);
          } else {
            result = host_->EvaluateBatches(eval->batches);
          }
          if (result.ok()) {
            metrics_->RecordEval(result->model);
            EvalMetricsToProto(result->model, response->mutable_metrics());
            if (result->has_reference) {
              EvalMetricsToProto(result->reference,
                                 response->mutable_reference());
            }
          }
          FinishUnary(reactor, metrics_, kEvaluate, result.status());
        },
        reactor, metrics_, kEvaluate);
  });
}

}  // namespace dlrm::server
