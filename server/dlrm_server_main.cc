// dlrm_server: serves a DLRM over gRPC (Trainer, Predictor, Admin, health,
// reflection) with Prometheus metrics over HTTP. Prints one line,
// "dlrm_server: listening on HOST:PORT metrics HOST:PORT", when it is ready;
// logs go to stderr. SIGINT/SIGTERM stop it after the current step.
#include <omp.h>
#include <signal.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

#include "core/config.h"
#include "core/status.h"
#include "model/checkpoint.h"
#include "model/dlrm_model.h"
#include "server/dlrm_server.h"
#include "spdlog/sinks/stdout_color_sinks.h"
#include "spdlog/spdlog.h"

namespace dlrm::server {
namespace {

struct Flags {
  ServerOptions server;
  std::string config = "kaggle";
  std::string restore;
  std::string log_level = "info";
  int threads = 0;
  int64_t max_message_mb = 64;
  bool checkpoint_on_exit = false;
};

// Where --checkpoint-on-exit writes, under --checkpoint-dir.
constexpr char kExitCheckpoint[] = "final";

absl::StatusOr<std::unique_ptr<model::DlrmModel>> MakeModel(const Flags& f) {
  if (!f.restore.empty()) {
    spdlog::info("loading {} from {}",
                 f.server.inference_only ? "weights" : "the checkpoint",
                 f.restore);
    return model::LoadCheckpoint(f.restore,
                                 /*weights_only=*/f.server.inference_only);
  }
  if (f.server.inference_only) {
    return absl::InvalidArgumentError(
        "--inference-only needs --restore (the weights to serve)");
  }
  ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(f.config));
  return model::DlrmModel::Create(config);
}

absl::Status Run(Flags& f) {
  auto logger = spdlog::stderr_color_mt("dlrm_server");
  logger->set_pattern("[%Y-%m-%d %H:%M:%S.%e] [rank 0] [%^%l%$] %v");
  spdlog::set_default_logger(logger);
  spdlog::set_level(spdlog::level::from_str(f.log_level));

  if (f.checkpoint_on_exit &&
      (f.server.checkpoint_dir.empty() || f.server.inference_only)) {
    return absl::InvalidArgumentError(
        "--checkpoint-on-exit needs --checkpoint-dir and a training server");
  }
  f.server.max_message_bytes = f.max_message_mb << 20;

  // Signals are taken by sigwait below; every thread started from here on
  // inherits the mask, so none of them is interrupted.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  if (f.threads > 0) omp_set_num_threads(f.threads);
  ASSIGN_OR_RETURN(std::unique_ptr<model::DlrmModel> model, MakeModel(f));
  const ModelConfig& config = model->config();
  spdlog::info(
      "model: {} tables, {} embedding and {} dense parameters, step {}, "
      "{} compute threads",
      config.tables_size(), EmbeddingParameterCount(config),
      DenseParameterCount(config), model->steps(), omp_get_max_threads());
  ASSIGN_OR_RETURN(std::unique_ptr<DlrmServer> server,
                   DlrmServer::Start(std::move(model), f.server));

  std::printf(
      "dlrm_server: listening on %s metrics %s\n", server->address().c_str(),
      server->metrics_address().empty() ? "off"
                                        : server->metrics_address().c_str());
  std::fflush(stdout);

  int signal = 0;
  sigwait(&signals, &signal);
  spdlog::info("{}: finishing the current step and shutting down",
               signal == SIGINT ? "SIGINT" : "SIGTERM");
  server->Shutdown();
  if (f.checkpoint_on_exit) {
    const std::string dir =
        (std::filesystem::path(f.server.checkpoint_dir) / kExitCheckpoint)
            .string();
    ASSIGN_OR_RETURN(model::CheckpointInfo info,
                     server->host()->SaveCheckpoint(dir));
    spdlog::info("saved checkpoint to {} at step {} ({} bytes)", dir, info.step,
                 info.bytes);
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace dlrm::server

int main(int argc, char** argv) {
  dlrm::server::Flags f;
  dlrm::server::ServerOptions& o = f.server;
  CLI::App app{"Train and serve a DLRM over gRPC."};
  app.add_option("--listen", o.listen,
                 "gRPC address HOST:PORT (port 0 picks a free port)")
      ->capture_default_str();
  app.add_option("--metrics-listen", o.metrics_listen,
                 "Prometheus /metrics address HOST:PORT (empty disables)")
      ->capture_default_str();
  app.add_option("--config", f.config,
                 "Model config: a preset (tiny, kaggle, kaggle-full) or a "
                 "text-format ModelConfig file (ignored with --restore)")
      ->capture_default_str();
  app.add_option("--checkpoint-dir", o.checkpoint_dir,
                 "Checkpoint paths of Admin RPCs resolve under this "
                 "directory and may not leave it");
  app.add_option("--data-dir", o.data_dir,
                 "Relative dataset paths of jobs and Evaluate resolve here");
  app.add_option("--restore", f.restore,
                 "Start from the checkpoint in this directory (its config)");
  app.add_flag("--inference-only", o.inference_only,
               "With --restore: load weights only and refuse training");
  app.add_flag("--checkpoint-on-exit", f.checkpoint_on_exit,
               "On SIGINT/SIGTERM, save a checkpoint to "
               "<checkpoint-dir>/final");
  app.add_option("--log-level", f.log_level, "trace, debug, info, warn, error")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error"}))
      ->capture_default_str();
  app.add_option("--threads", f.threads,
                 "Compute (OpenMP) threads for the model (0 = all cores)")
      ->capture_default_str();
  app.add_option("--train-queue", o.train_queue_depth,
                 "Batches a Train stream holds waiting for the trainer")
      ->capture_default_str();
  app.add_option("--predict-max-batch", o.predict_max_batch,
                 "Most samples per micro-batched Predict model call")
      ->capture_default_str();
  app.add_option("--predict-max-wait-us", o.predict_max_wait_us,
                 "Longest a Predict waits for others to join it (us)")
      ->capture_default_str();
  app.add_option("--max-message-mb", f.max_message_mb,
                 "Largest gRPC message received or sent (MiB); larger ones "
                 "get RESOURCE_EXHAUSTED")
      ->capture_default_str();
  app.add_option("--max-batch-samples", o.max_batch_samples,
                 "Largest batch accepted, in samples")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  const absl::Status s = dlrm::server::Run(f);
  if (!s.ok()) {
    std::fprintf(stderr, "dlrm_server: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
