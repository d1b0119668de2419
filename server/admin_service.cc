// dlrm.Admin handlers.
#include "server/admin_service.h"

#include <optional>
#include <utility>

#include "core/escape.h"
#include "server/datasets.h"
#include "server/grpc_status.h"
#include "spdlog/spdlog.h"

namespace dlrm::server {

AdminService::AdminService(ModelHost* host, ServerMetrics* metrics,
                           WorkQueue* work, const TokenAuth* auth,
                           std::string checkpoint_dir)
    : host_(host),
      metrics_(metrics),
      work_(work),
      checkpoint_dir_(std::move(checkpoint_dir)),
      unary_(auth, RpcAccess::kAdmin, metrics) {}

grpc::ServerUnaryReactor* AdminService::GetModelInfo(
    grpc::CallbackServerContext* context, const ModelInfoRequest* request,
    ModelInfo* response) {
  static constexpr char kMethod[] = "/dlrm.Admin/GetModelInfo";
  return unary_(context, kMethod, [&](grpc::ServerUnaryReactor* reactor) {
    ModelSummary s = host_->Summary(request->include_weight_checksum());
    *response->mutable_config() = std::move(s.config);
    response->set_embedding_parameters(s.embedding_parameters);
    response->set_dense_parameters(s.dense_parameters);
    response->set_steps(s.steps);
    response->set_sharding_plan(std::move(s.sharding_plan));
    for (const auto& [tier, bytes] : s.memory_bytes) {
      (*response->mutable_memory_bytes())[tier] = bytes;
    }
    response->set_world_size(s.world_size);
    response->set_inference_only(s.inference_only);
    response->set_dense_precision(s.dense_precision);
    response->set_cpu_model(std::move(s.cpu_model));
    response->set_dense_isa(std::move(s.dense_isa));
    response->set_weight_checksum(s.weight_checksum);
    response->set_served_checkpoint(s.served.dir);
    response->set_served_checkpoint_step(s.served.step);
    for (const TableStoreStats& t : s.dynamic_tables) {
      DynamicTableStats* d = response->add_dynamic_tables();
      d->set_table(t.table);
      d->set_rank(t.rank);
      d->set_capacity(t.rows);
      d->set_occupied_rows(t.metrics.ids_occupied);
      d->set_ids_admitted(t.metrics.ids_admitted);
      d->set_ids_evicted(t.metrics.ids_evicted);
      d->set_ids_refused(t.metrics.ids_refused);
      d->set_unknown_lookups(t.metrics.unknown_lookups);
    }
    FinishUnary(reactor, metrics_, kMethod, absl::OkStatus());
  });
}

grpc::ServerUnaryReactor* AdminService::SaveCheckpoint(
    grpc::CallbackServerContext* context, const CheckpointRequest* request,
    CheckpointResponse* response) {
  return Checkpoint(context, request, response, /*save=*/true);
}

grpc::ServerUnaryReactor* AdminService::RestoreCheckpoint(
    grpc::CallbackServerContext* context, const CheckpointRequest* request,
    CheckpointResponse* response) {
  return Checkpoint(context, request, response, /*save=*/false);
}

grpc::ServerUnaryReactor* AdminService::Checkpoint(
    grpc::CallbackServerContext* context, const CheckpointRequest* request,
    CheckpointResponse* response, bool save) {
  const char* method =
      save ? "/dlrm.Admin/SaveCheckpoint" : "/dlrm.Admin/RestoreCheckpoint";
  return unary_(context, method, [&](grpc::ServerUnaryReactor* reactor) {
    absl::StatusOr<std::string> dir =
        ResolveUnder(checkpoint_dir_, request->path(), "path");
    if (!dir.ok()) {
      FinishUnary(reactor, metrics_, method, dir.status());
      return;
    }
    SubmitUnary(
        *work_,
        [this, reactor, response, save, method, dir = *dir] {
          absl::StatusOr<model::CheckpointInfo> info =
              save ? host_->SaveCheckpoint(dir) : host_->RestoreCheckpoint(dir);
          if (info.ok()) {
            response->set_step(info->step);
            response->set_bytes(info->bytes);
            spdlog::info(
                "{} {} at step {} ({} bytes)",
                save ? "saved checkpoint to" : "restored checkpoint from",
                EscapeForMessage(dir), info->step, info->bytes);
          }
          FinishUnary(reactor, metrics_, method, info.status());
        },
        reactor, metrics_, method);
  });
}

grpc::ServerUnaryReactor* AdminService::ExportWeights(
    grpc::CallbackServerContext* context, const ExportRequest* request,
    ExportResponse* response) {
  static constexpr char kMethod[] = "/dlrm.Admin/ExportWeights";
  return unary_(context, kMethod, [&](grpc::ServerUnaryReactor* reactor) {
    // The same confinement as checkpoints: under --checkpoint-dir when set.
    absl::StatusOr<std::string> path =
        ResolveUnder(checkpoint_dir_, request->path(), "path");
    if (!path.ok()) {
      FinishUnary(reactor, metrics_, kMethod, path.status());
      return;
    }
    SubmitUnary(
        *work_,
        [this, reactor, response, path = *path] {
          absl::StatusOr<model::ExportInfo> info = host_->ExportWeights(path);
          if (info.ok()) {
            response->set_path(path);
            response->set_bytes(info->bytes);
            response->set_tensors(info->tensors);
            response->set_step(info->step);
            spdlog::info(
                "exported the weights at step {} to {} ({} tensors, {} "
                "bytes)",
                info->step, path, info->tensors, info->bytes);
          }
          FinishUnary(reactor, metrics_, kMethod, info.status());
        },
        reactor, metrics_, kMethod);
  });
}

grpc::ServerUnaryReactor* AdminService::SetLearningRate(
    grpc::CallbackServerContext* context, const SetLearningRateRequest* request,
    SetLearningRateResponse* response) {
  static constexpr char kMethod[] = "/dlrm.Admin/SetLearningRate";
  return unary_(context, kMethod, [&](grpc::ServerUnaryReactor* reactor) {
    std::optional<float> dense, sparse;
    if (request->has_dense()) dense = request->dense();
    if (request->has_sparse()) sparse = request->sparse();
    SubmitUnary(
        *work_,
        [this, reactor, response, dense, sparse] {
          absl::StatusOr<std::pair<OptimizerConfig, OptimizerConfig>> set =
              host_->SetLearningRates(dense, sparse);
          if (set.ok()) {
            response->set_dense(set->first.learning_rate());
            response->set_sparse(set->second.learning_rate());
            response->set_step(host_->steps());
            spdlog::info(
                "learning rates set: dense_optimizer.learning_rate {}, "
                "sparse_optimizer.learning_rate {} (from step {} on)",
                set->first.learning_rate(), set->second.learning_rate(),
                host_->steps() + 1);
          }
          FinishUnary(reactor, metrics_, kMethod, set.status());
        },
        reactor, metrics_, kMethod);
  });
}

grpc::ServerUnaryReactor* AdminService::GetMetrics(
    grpc::CallbackServerContext* context, const MetricsRequest* request,
    MetricsResponse* response) {
  static constexpr char kMethod[] = "/dlrm.Admin/GetMetrics";
  return unary_(context, kMethod, [&](grpc::ServerUnaryReactor* reactor) {
    response->set_prometheus_text(
        metrics_->Render(host_->steps(), host_->served_checkpoint()));
    FinishUnary(reactor, metrics_, kMethod, absl::OkStatus());
  });
}

}  // namespace dlrm::server
