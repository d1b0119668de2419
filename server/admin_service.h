// dlrm.Admin: model info, checkpoints, metrics.
#pragma once

#include <grpcpp/grpcpp.h>

#include <string>
#include <utility>

#include "dlrm/service.grpc.pb.h"
#include "server/auth.h"
#include "server/grpc_status.h"
#include "server/metrics.h"
#include "server/model_host.h"
#include "server/work_queue.h"

namespace dlrm::server {

// Checkpoint and export paths resolve under `checkpoint_dir` when it is set
// (a path leaving it gets InvalidArgument); their I/O runs on `work`. Every
// call needs the auth token when `auth` has one (Unauthenticated otherwise).
// Pointers are borrowed and must outlive the service.
class AdminService final : public Admin::CallbackService {
 public:
  AdminService(ModelHost* host, ServerMetrics* metrics, WorkQueue* work,
               const TokenAuth* auth, std::string checkpoint_dir);

  grpc::ServerUnaryReactor* GetModelInfo(grpc::CallbackServerContext* context,
                                         const ModelInfoRequest* request,
                                         ModelInfo* response) override;
  grpc::ServerUnaryReactor* SaveCheckpoint(
      grpc::CallbackServerContext* context, const CheckpointRequest* request,
      CheckpointResponse* response) override;
  grpc::ServerUnaryReactor* RestoreCheckpoint(
      grpc::CallbackServerContext* context, const CheckpointRequest* request,
      CheckpointResponse* response) override;
  grpc::ServerUnaryReactor* ExportWeights(grpc::CallbackServerContext* context,
                                          const ExportRequest* request,
                                          ExportResponse* response) override;
  grpc::ServerUnaryReactor* GetMetrics(grpc::CallbackServerContext* context,
                                       const MetricsRequest* request,
                                       MetricsResponse* response) override;
  // Runs ModelHost::SetLearningRates on the work queue (it waits for the
  // step in progress).
  grpc::ServerUnaryReactor* SetLearningRate(
      grpc::CallbackServerContext* context,
      const SetLearningRateRequest* request,
      SetLearningRateResponse* response) override;

 private:
  // Runs the save (or restore) of `request` on the work queue.
  grpc::ServerUnaryReactor* Checkpoint(grpc::CallbackServerContext* context,
                                       const CheckpointRequest* request,
                                       CheckpointResponse* response, bool save);

  ModelHost* const host_;
  ServerMetrics* const metrics_;
  WorkQueue* const work_;
  const std::string checkpoint_dir_;
  // The token check (kAdmin) and metrics of every unary call.
  const UnaryFrame unary_;
};

}  // namespace dlrm::server
