// dlrm.Trainer: the Train stream, dataset jobs and evaluation.
#pragma once

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <string>
#include <utility>

#include "dlrm/service.grpc.pb.h"
#include "server/auth.h"
#include "server/datasets.h"
#include "server/grpc_status.h"
#include "server/job_manager.h"
#include "server/metrics.h"
#include "server/model_host.h"
#include "server/train_stream.h"
#include "server/work_queue.h"

namespace dlrm::server {

struct TrainerServiceOptions {
  // The Train stream's queue and limits. Default: TrainStreamOptions().
  TrainStreamOptions stream;
  // Where Evaluate may read dataset files (--data-dir, --allow-data-path).
  // Default: none (only synthetic data).
  DataPathOptions data_paths;
  // Largest inline batch Evaluate accepts, in samples. Default: 65536.
  int64_t max_batch_samples = 65536;
  // Samples per model call when Evaluate reads a dataset. Default: 8192.
  int64_t eval_batch_size = 8192;
  // How long CancelJob waits for the job to stop, in seconds. Default: 30.
  double cancel_wait_seconds = 30;

  absl::Status Validate() const;
};

// The generated callback service with Train registered raw
// (server/raw_message.h), so that a message that does not parse ends the
// stream with InvalidArgument rather than looking like its end.
using TrainerBase = Trainer::WithRawCallbackMethod_Train<
    Trainer::WithCallbackMethod_StartJob<Trainer::WithCallbackMethod_GetJob<
        Trainer::WithCallbackMethod_CancelJob<
            Trainer::WithCallbackMethod_ListJobs<
                Trainer::WithCallbackMethod_Evaluate<Trainer::Service>>>>>>;

// Handlers parse, call the ModelHost / JobManager, map the status and
// finish; blocking work (evaluation, waiting for a job) runs on `work`.
// Every call needs the auth token when `auth` has one (Unauthenticated
// otherwise). All pointers are borrowed and must outlive the service.
class TrainerService final : public TrainerBase {
 public:
  TrainerService(ModelHost* host, JobManager* jobs, ServerMetrics* metrics,
                 WorkQueue* work, const TokenAuth* auth,
                 TrainerServiceOptions options);

  // A TrainStream, reading TrainRequest and writing TrainResponse bytes.
  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* Train(
      grpc::CallbackServerContext* context) override;
  grpc::ServerUnaryReactor* StartJob(grpc::CallbackServerContext* context,
                                     const JobRequest* request,
                                     JobStatus* response) override;
  grpc::ServerUnaryReactor* GetJob(grpc::CallbackServerContext* context,
                                   const JobId* request,
                                   JobStatus* response) override;
  grpc::ServerUnaryReactor* CancelJob(grpc::CallbackServerContext* context,
                                      const JobId* request,
                                      JobStatus* response) override;
  grpc::ServerUnaryReactor* ListJobs(grpc::CallbackServerContext* context,
                                     const ListJobsRequest* request,
                                     ListJobsResponse* response) override;
  grpc::ServerUnaryReactor* Evaluate(grpc::CallbackServerContext* context,
                                     const EvaluateRequest* request,
                                     EvaluateResponse* response) override;

 private:
  ModelHost* const host_;
  JobManager* const jobs_;
  ServerMetrics* const metrics_;
  WorkQueue* const work_;
  const TokenAuth* const auth_;
  const TrainerServiceOptions options_;
  // The token check (kTraining) and metrics of every unary call.
  const UnaryFrame unary_;
};

}  // namespace dlrm::server
