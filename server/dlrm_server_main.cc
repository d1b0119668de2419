// dlrm_server: serves a DLRM over gRPC (Trainer, Predictor, Admin, health,
// reflection) with Prometheus metrics over HTTP. Prints one line,
// "dlrm_server: listening on HOST:PORT metrics HOST:PORT", when it is ready;
// logs go to stderr. SIGINT/SIGTERM stop it after the current step.
// Two more modes for deployments (docs/deployment.md): --dry-run checks the
// flags, the model config and the sharding plan and prints them;
// --health-check HOST:PORT is a container health probe (TLS too).
// With --checkpoint-dir it resumes from the newest valid checkpoint there
// unless --no-resume or --restore (docs/checkpoints.md). With
// --inference-only --follow DIR it is a replica that serves the newest
// checkpoint a training server wrote into DIR (docs/server.md "Replicas
// that follow training").
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <omp.h>
#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <charconv>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "comm/coordinator.h"
#include "comm/factory.h"
#include "comm/grpc_auth.h"
#include "comm/launcher_env.h"
#include "core/cli_parse.h"
#include "core/config.h"
#include "core/config_change.h"
#include "core/dense_flags.h"
#include "core/device.h"
#include "core/path_checks.h"
#include "core/secrets.h"
#include "core/status.h"
#include "core/storage_flags.h"
#include "dense/cpu_isa.h"
#include "embedding/sharding.h"
#include "model/checkpoint.h"
#include "model/memory_plan.h"
#include "model/model.h"
#include "server/auth.h"
#include "server/dlrm_server.h"
#include "server/rank_group.h"
#include "server/startup_checks.h"
#include "spdlog/sinks/stdout_color_sinks.h"
#include "spdlog/spdlog.h"

namespace dlrm::server {
namespace {

struct Flags {
  ServerOptions server;
  // Where the rank flags came from when a launcher set them (ApplyLauncher),
  // logged once logging is set up; else empty.
  std::string launcher_note;
  std::string config = "kaggle";
  // --config was given: on a resume it is compared with the checkpoint's
  // config and its changes applied (ResumedConfig); otherwise the
  // checkpoint's config is used as it is.
  bool config_given = false;
  // --device, --precision, --tf32: each empty keeps the model config's
  // (or the checkpoint's) setting.
  DenseFlags dense;
  // --rocksdb-dir, --host-budget-mb, --tables-on-rocksdb, --cache-rows,
  // --cache-fraction, --eviction: applied to the model config, a
  // checkpoint's too.
  StorageFlags storage;
  std::string restore;
  std::string log_level = "info";
  int threads = 0;
  int64_t max_message_mb = 64;
  bool checkpoint_on_exit = false;
  // Multi-rank jobs (docs/server.md "Multiple ranks").
  int world_size = 1;
  int rank = 0;
  std::string coordinator;
  int64_t memory_budget_mb = 0;
  // Device memory one rank may give STORAGE_DEVICE tables, in MiB
  // (ModelConfig.device_budget_bytes); 0 keeps the config's, and with
  // neither a CUDA run takes it from the GPU's free memory
  // (ApplyDeviceBudget).
  int64_t device_memory_budget_mb = 0;
  double comm_timeout_s = 120;
  // How long a rank waits for every rank to join the job.
  double comm_connect_timeout_s = 120;
  bool overlap_allreduce = false;
  // The device communicator of a CUDA job with STORAGE_DEVICE tables (the
  // pooled vectors' exchanges): "auto" (NCCL, one process per GPU),
  // "nccl" or "host-staged" (Gloo on host copies; ranks may share a GPU).
  std::string device_comm = "auto";
  // Address or hostname this rank's Gloo transport binds to; every other
  // rank dials it, so across containers or hosts it must be reachable.
  std::string comm_bind_address = "127.0.0.1";
  // Deployment modes (docs/deployment.md).
  bool dry_run = false;
  std::string health_check;
  // Security (docs/server.md "Security"): the token is read from this file
  // into server.auth.token, so it never shows in a process listing.
  std::string auth_token_file;
  // The control plane of a multi-rank job (docs/server.md "Security"):
  // TLS of the coordinator (rank 0 serves with the certificate; every rank
  // verifies it with the CA and, with `coordinator_tls_mutual`, presents
  // the certificate as its own) and the join token every rank sends it,
  // read from `join_token_file` into `join_token`.
  std::string coordinator_tls_cert, coordinator_tls_key, coordinator_tls_ca,
      coordinator_tls_server_name;
  bool coordinator_tls_mutual = false;
  std::string join_token_file;
  std::string join_token;
  // Resume from the newest valid checkpoint under --checkpoint-dir when
  // there is one and --restore is not given (docs/checkpoints.md).
  bool resume = true;
  // --health-check over TLS: trust `health_ca` (else the system's roots),
  // present `health_cert`/`health_key` to a server that asks for a client
  // certificate, expect `health_server_name` in the server's certificate.
  bool health_tls = false;
  std::string health_ca, health_cert, health_key, health_server_name;
};

// Which of the rank flags the command line (or --server-config) set: those
// win over the launcher's variables.
struct ExplicitRankFlags {
  bool rank = false, world_size = false, coordinator = false, bind = false;
};

// Makes CUDA device `local_rank` of those the process may use the one it
// sees as device 0, before any CUDA call: the GPU of this rank on its host.
// A CUDA_VISIBLE_DEVICES list the launcher set is indexed by the local
// rank; a single entry (one GPU per task, as deploy/launch_local.sh --gpus
// gives each rank) is kept.
void SelectLocalGpu(int local_rank) {
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  if (visible == nullptr) {
    setenv("CUDA_VISIBLE_DEVICES", std::to_string(local_rank).c_str(), 1);
    return;
  }
  const std::vector<std::string> devices = absl::StrSplit(visible, ',');
  if (devices.size() <= 1) return;
  if (local_rank < static_cast<int>(devices.size())) {
    setenv("CUDA_VISIBLE_DEVICES", devices[local_rank].c_str(), 1);
  }
}

// Fills the rank flags the command line left unset from the launcher that
// started the process (comm/launcher_env.h), and picks the local rank's
// GPU. Across hosts, a rank whose --comm-bind-address was not given binds
// its collectives to this host's name. InvalidArgument when the launchers'
// variables are bad or contradict each other.
absl::Status ApplyLauncher(const comm::EnvLookup& env,
                           const ExplicitRankFlags& given, Flags* f) {
  ASSIGN_OR_RETURN(const comm::LauncherRank launcher,
                   comm::DetectLauncher(env));
  if (launcher.source.empty()) return absl::OkStatus();
  if (!given.rank && launcher.rank) f->rank = *launcher.rank;
  if (!given.world_size && launcher.world_size) {
    f->world_size = *launcher.world_size;
  }
  if (!given.coordinator && launcher.coordinator && f->world_size > 1) {
    f->coordinator = *launcher.coordinator;
  }
  if (!given.bind && f->world_size > 1 &&
      !launcher.single_host.value_or(false)) {
    char host[256] = {};
    if (gethostname(host, sizeof(host) - 1) == 0 && host[0] != '\0') {
      f->comm_bind_address = host;
    }
  }
  if (launcher.local_rank && f->world_size > 1) {
    SelectLocalGpu(*launcher.local_rank);
  }
  f->launcher_note = absl::StrCat(
      "rank ", f->rank, " of ", f->world_size, " from the ", launcher.source,
      " launcher's environment",
      f->coordinator.empty() ? ""
                             : absl::StrCat(", coordinator ", f->coordinator));
  return absl::OkStatus();
}

// How long a follower that got SIGINT/SIGTERM waits for rank 0's Shutdown.
constexpr int kFollowerGraceSeconds = 10;

// Where --checkpoint-on-exit writes, under --checkpoint-dir.
constexpr char kExitCheckpoint[] = "final";

// OK when `address` is HOST:PORT ([V6]:PORT too) with a port in [0, 65535],
// or a gRPC "unix:" address; `flag` names it in the error.
absl::Status CheckAddress(const std::string& flag, const std::string& address) {
  if (address.starts_with("unix:")) return absl::OkStatus();
  const size_t colon = address.rfind(':');
  int port = -1;
  if (colon != std::string::npos && colon > 0) {
    const char* end = address.data() + address.size();
    auto [p, ec] = std::from_chars(address.data() + colon + 1, end, port);
    if (ec != std::errc() || p != end) port = -1;
  }
  if (port < 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        flag, " \"", address, "\" is not HOST:PORT with a port in [0, 65535]"));
  }
  return absl::OkStatus();
}

// Rank 0's coordinator: TLS from the --coordinator-tls-* flags (mutual with
// --coordinator-tls-mutual) and the join token.
comm::CoordinatorServerOptions CoordinatorServerFrom(const Flags& f) {
  comm::CoordinatorServerOptions o;
  o.listen_address = f.coordinator;
  o.tls.cert_file = f.coordinator_tls_cert;
  o.tls.key_file = f.coordinator_tls_key;
  if (f.coordinator_tls_mutual) o.tls.client_ca_file = f.coordinator_tls_ca;
  o.coordinator.join_token = f.join_token;
  // A rank's rendezvous call may wait as long as it waits to connect.
  o.coordinator.max_wait_seconds =
      std::max(o.coordinator.max_wait_seconds, f.comm_connect_timeout_s);
  return o;
}

// How every rank, rank 0 included, dials the coordinator: TLS when
// --coordinator-tls-ca is given, presenting the certificate (when given)
// to a coordinator that asks for one.
comm::CoordinatorClientOptions CoordinatorClientFrom(const Flags& f) {
  comm::CoordinatorClientOptions o;
  o.tls.enabled = !f.coordinator_tls_ca.empty();
  if (o.tls.enabled) {
    o.tls.ca_file = f.coordinator_tls_ca;
    o.tls.cert_file = f.coordinator_tls_cert;
    o.tls.key_file = f.coordinator_tls_key;
    o.tls.server_name = f.coordinator_tls_server_name;
  }
  o.join_token = f.join_token;
  return o;
}

// The control-plane flags of a job of several ranks, named in errors; reads
// the PEM files, so that a dry run catches a missing one.
absl::Status ValidateControlPlane(const Flags& f) {
  const bool cert = !f.coordinator_tls_cert.empty();
  const bool key = !f.coordinator_tls_key.empty();
  if (f.coordinator_tls_ca.empty() &&
      (cert || key || f.coordinator_tls_mutual ||
       !f.coordinator_tls_server_name.empty())) {
    return absl::InvalidArgumentError(
        "--coordinator-tls-cert, --coordinator-tls-key, "
        "--coordinator-tls-mutual and --coordinator-tls-server-name need "
        "--coordinator-tls-ca: the CA every rank (rank 0 too) verifies the "
        "coordinator's certificate with");
  }
  if (cert != key) {
    return absl::InvalidArgumentError(
        "--coordinator-tls-cert and --coordinator-tls-key go together");
  }
  if (!f.coordinator_tls_ca.empty() && f.rank == 0 && !cert) {
    return absl::InvalidArgumentError(
        "rank 0 hosts the coordinator: with --coordinator-tls-ca it needs "
        "--coordinator-tls-cert and --coordinator-tls-key");
  }
  if (f.coordinator_tls_mutual && !cert) {
    return absl::InvalidArgumentError(
        "--coordinator-tls-mutual: every rank presents its "
        "--coordinator-tls-cert and --coordinator-tls-key to the "
        "coordinator");
  }
  const auto named = [](const absl::Status& status) {
    return status.ok() ? status
                       : absl::Status(status.code(),
                                      absl::StrCat("--coordinator-tls-*: ",
                                                   status.message()));
  };
  if (f.rank == 0) {
    RETURN_IF_ERROR(named(
        comm::MakeServerCredentials(CoordinatorServerFrom(f).tls).status()));
  }
  RETURN_IF_ERROR(named(
      comm::MakeChannelCredentials(CoordinatorClientFrom(f).tls).status()));
  if (!f.join_token.empty()) {
    RETURN_IF_ERROR(ValidateSecretToken(
        f.join_token, absl::StrCat("the join token in --join-token-file ",
                                   f.join_token_file)));
  }
  return absl::OkStatus();
}

// The control plane in words, for logs and --dry-run.
std::string ControlPlaneSummary(const Flags& f) {
  return absl::StrCat(f.coordinator_tls_ca.empty()
                          ? "plaintext"
                          : (f.coordinator_tls_mutual ? "mutual TLS" : "TLS"),
                      ", ",
                      f.join_token.empty()
                          ? "no join token (any process that reaches it "
                            "can join)"
                          : "join token required");
}

// The checks of the flags together (CLI11 checked each alone): the ones a
// run makes before it starts anything, shared with --dry-run so that a dry
// run fails where a run would.
absl::Status ValidateFlags(const Flags& f) {
  RETURN_IF_ERROR(CheckServerPaths(f.server));
  if (!f.storage.rocksdb_dir.empty()) {
    RETURN_IF_ERROR(CheckWritableDir("--rocksdb-dir", f.storage.rocksdb_dir));
  }
  if ((f.server.checkpoint_every_steps != 0 ||
       f.server.checkpoint_every_seconds != 0) &&
      (f.server.checkpoint_dir.empty() || f.server.inference_only)) {
    return absl::InvalidArgumentError(
        "--checkpoint-every-steps and --checkpoint-every-seconds need "
        "--checkpoint-dir and a training server");
  }
  if (f.checkpoint_on_exit &&
      (f.server.checkpoint_dir.empty() || f.server.inference_only)) {
    return absl::InvalidArgumentError(
        "--checkpoint-on-exit needs --checkpoint-dir and a training server");
  }
  if (!f.server.follow_dir.empty() && !f.server.inference_only) {
    return absl::InvalidArgumentError(
        "--follow needs --inference-only: a replica that follows training "
        "serves predictions only");
  }
  if (!f.server.follow_dir.empty() && !f.restore.empty()) {
    return absl::InvalidArgumentError(
        "--follow and --restore exclude each other: a replica starts from "
        "the newest checkpoint in the --follow directory");
  }
  if (f.rank < 0 || f.rank >= f.world_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--rank ", f.rank, " is not in [0, --world-size ", f.world_size, ")"));
  }
  if (f.rank == 0) {
    RETURN_IF_ERROR(f.server.Validate());
    // Reads the PEM files, so that a dry run catches a missing one.
    RETURN_IF_ERROR(comm::MakeServerCredentials(f.server.tls).status());
    RETURN_IF_ERROR(CheckAddress("--listen", f.server.listen));
    if (!f.server.metrics_listen.empty()) {
      RETURN_IF_ERROR(
          CheckAddress("--metrics-listen", f.server.metrics_listen));
    }
  }
  if (f.device_memory_budget_mb < 0 ||
      f.device_memory_budget_mb > (int64_t{1} << 43)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--device-memory-budget-mb must be in [0, 2^43], got ",
                     f.device_memory_budget_mb));
  }
  if (f.world_size == 1) return absl::OkStatus();
  if (f.coordinator.empty()) {
    return absl::InvalidArgumentError(
        "--world-size > 1 needs --coordinator HOST:PORT (rank 0 listens "
        "there, the others dial it)");
  }
  RETURN_IF_ERROR(CheckAddress("--coordinator", f.coordinator));
  if (f.comm_bind_address.empty()) {
    return absl::InvalidArgumentError("--comm-bind-address is empty");
  }
  if (f.server.inference_only) {
    return absl::InvalidArgumentError(
        "--inference-only serves on one rank only");
  }
  if (f.device_comm != "auto" && f.device_comm != "nccl" &&
      f.device_comm != "host-staged") {
    return absl::InvalidArgumentError(
        absl::StrCat("--device-comm ", f.device_comm,
                     ": expected auto, nccl or host-staged"));
  }
  if (!(f.comm_timeout_s > 0) || !(f.comm_connect_timeout_s > 0) ||
      f.memory_budget_mb < 0) {
    return absl::InvalidArgumentError(
        "--comm-timeout-s and --comm-connect-timeout-s must be positive and "
        "--memory-budget-mb >= 0");
  }
  return ValidateControlPlane(f);
}

// Device memory the automatic device budget leaves to the dense part of
// a model with `dense_parameters` on a GPU with `free_bytes` free: 1 GiB
// for workspaces and activations, a tenth of the free memory, and 16 bytes
// a dense parameter (weights, gradients, two optimizer state floats).
int64_t DenseDeviceReserve(int64_t dense_parameters, int64_t free_bytes) {
  return (int64_t{1} << 30) + free_bytes / 10 + 16 * dense_parameters;
}

// Sets config->device_budget_bytes: from --device-memory-budget-mb when
// given; else the config's own; else, when the model runs STORAGE_DEVICE
// tables on CUDA and a GPU is present (not on a dry run, which allocates
// nothing), the free memory of this rank's GPU (device 0 of the process)
// less DenseDeviceReserve. ResourceExhausted, naming the bytes, when the
// reserve takes every free byte; the device's error when it cannot be
// queried.
absl::Status ApplyDeviceBudget(const Flags& f, ModelConfig* config) {
  if (f.device_memory_budget_mb > 0) {
    config->set_device_budget_bytes(f.device_memory_budget_mb << 20);
    return absl::OkStatus();
  }
  const bool device_tables = std::any_of(
      config->tables().begin(), config->tables().end(),
      [](const TableConfig& t) { return t.storage() == STORAGE_DEVICE; });
  if (config->device_budget_bytes() > 0 || f.dry_run ||
      config->device() != DEVICE_CUDA || !device_tables ||
      CudaDeviceCount() == 0) {
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(std::unique_ptr<Device> device, CreateCudaDevice(0));
  ASSIGN_OR_RETURN(const size_t free_bytes, device->FreeMemory());
  const int64_t free = static_cast<int64_t>(free_bytes);
  const int64_t reserve =
      DenseDeviceReserve(DenseParameterCount(*config), free);
  if (free <= reserve) {
    return absl::ResourceExhaustedError(absl::StrCat(
        device->name(), " has ", free, " bytes free, not more than the ",
        reserve,
        " bytes kept for the dense part and workspaces: no room for "
        "STORAGE_DEVICE tables; give --device-memory-budget-mb or put the "
        "tables in host memory (STORAGE_HOST)"));
  }
  config->set_device_budget_bytes(free - reserve);
  spdlog::info(
      "device memory budget {} MiB per rank: {} free less {} MiB "
      "kept for the dense part",
      (free - reserve) >> 20, device->name(), reserve >> 20);
  return absl::OkStatus();
}

// The flags that change a model config, given or not: the dense flags
// (--device, --precision, --tf32), the storage flags and the device budget.
absl::Status AdjustConfig(const Flags& f, ModelConfig* config) {
  RETURN_IF_ERROR(f.dense.Apply(config));
  RETURN_IF_ERROR(f.storage.Apply(config));
  return ApplyDeviceBudget(f, config);
}

// The memory plan of this rank of `config` under `plan` (null: one process)
// at a job's default batch of 2048 samples, logged unless on a dry run, and
// checked against the machine's memory (model::CheckMemory) before the
// model is allocated: the plan, or ResourceExhausted naming the fix.
absl::StatusOr<model::MemoryPlan> CheckMemoryOf(
    const Flags& f, const ModelConfig& config,
    const embedding::ShardingPlan* plan) {
  ASSIGN_OR_RETURN(const ModelConfig tiers,
                   embedding::ApplyMemoryBudgets(config, plan));
  model::MemoryPlanOptions o;
  o.rank = f.rank;
  ASSIGN_OR_RETURN(model::MemoryPlan memory, model::PlanMemory(tiers, plan, o));
  if (!f.dry_run) {
    std::string text = memory.ToString();
    if (!text.empty() && text.back() == '\n') text.pop_back();
    spdlog::info("{}", text);
  }
  ASSIGN_OR_RETURN(const model::MachineMemory machine,
                   model::AvailableMemory());
  RETURN_IF_ERROR(model::CheckMemory(tiers, memory, machine, plan));
  return memory;
}

// AdjustConfig, then for one process CheckMemoryOf: what a config loaded
// for a model of one process goes through.
absl::Status AdjustAndCheck(const Flags& f, ModelConfig* config) {
  RETURN_IF_ERROR(AdjustConfig(f, config));
  if (f.world_size != 1) return absl::OkStatus();
  return CheckMemoryOf(f, *config, nullptr).status();
}

// The model config at `spec` (a preset, a file, a checkpoint's
// config.textproto) adjusted by the flags (AdjustConfig).
absl::StatusOr<ModelConfig> ConfigOnDevice(const Flags& f,
                                           const std::string& spec) {
  ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(spec));
  RETURN_IF_ERROR(AdjustConfig(f, &config));
  return config;
}

// The sharding plan of a run of `config`: --world-size, --memory-budget-mb
// and the config's device budget; a table that fits nowhere says what
// --memory-budget-mb is (model::ExplainShardingBudget).
absl::StatusOr<embedding::ShardingPlan> PlanShardingOf(
    const Flags& f, const ModelConfig& config) {
  embedding::PlannerOptions po;
  po.world_size = f.world_size;
  po.memory_budget_bytes = f.memory_budget_mb << 20;
  po.device_budget_bytes = config.device_budget_bytes();
  return model::ExplainShardingBudget(embedding::PlanSharding(config, po),
                                      "--memory-budget-mb");
}

// The model config a run uses: with --restore the checkpoint's, so that
// every rank plans from it (the restore itself checks the plan).
absl::StatusOr<ModelConfig> RunConfig(const Flags& f) {
  return ConfigOnDevice(
      f,
      f.restore.empty()
          ? f.config
          : (std::filesystem::path(f.restore) / "config.textproto").string());
}

// A model from the checkpoint in `dir`, its config adjusted by the flags
// (AdjustConfig: a checkpoint restores on either device, in either
// precision).
absl::StatusOr<std::unique_ptr<model::Model>> LoadModel(const Flags& f,
                                                        const std::string& dir,
                                                        bool weights_only) {
  return model::LoadCheckpointWith(
      dir, weights_only,
      [&f](ModelConfig* config) { return AdjustAndCheck(f, config); });
}

// The config a resume from the checkpoint in `dir` runs with: the
// checkpoint's, adjusted by the flags; with --config given, that config
// where it differs only in what a trained model may change
// (core/config_change.h), each change put in *changes.
// FailedPrecondition naming an immutable field that differs; the
// checkpoint config's own errors otherwise.
absl::StatusOr<ModelConfig> ResumedConfig(
    const Flags& f, const std::string& dir,
    std::vector<ConfigDifference>* changes) {
  ASSIGN_OR_RETURN(
      ModelConfig saved,
      ConfigOnDevice(
          f, (std::filesystem::path(dir) / "config.textproto").string()));
  changes->clear();
  if (!f.config_given) return saved;
  ASSIGN_OR_RETURN(ModelConfig next, ConfigOnDevice(f, f.config));
  return ResumeConfig(saved, next, changes);
}

void LogResumeChanges(const std::vector<ConfigDifference>& changes) {
  for (const ConfigDifference& c : changes) spdlog::info("{}", c.ToString());
}

bool Resumes(const Flags& f);

// --dry-run: validates what a run would (flags, the model config, the
// sharding plan for --world-size and --memory-budget-mb) and prints what it
// would do; binds, dials and allocates nothing. Errors as a run's.
absl::Status DryRun(const Flags& f) {
  RETURN_IF_ERROR(ValidateFlags(f));
  // A replica's model is the newest checkpoint in --follow's directory;
  // there may be none yet.
  std::string model_spec = f.restore.empty() ? f.config : f.restore;
  std::optional<ModelConfig> config;
  // A resume's model is the newest checkpoint's, with --config's changes
  // (ResumedConfig; an immutable one is this run's error too).
  std::vector<ConfigDifference> changes;
  std::string resume_from;
  if (Resumes(f)) {
    for (const model::CheckpointEntry& e :
         model::ListCheckpoints(f.server.checkpoint_dir)) {
      if (!e.manifest.ok()) continue;
      ASSIGN_OR_RETURN(config, ResumedConfig(f, e.dir, &changes));
      resume_from = absl::StrCat(e.dir, " at step ", e.manifest->step);
      model_spec = e.dir;
      break;
    }
  }
  if (resume_from.empty() && f.server.follow_dir.empty()) {
    ASSIGN_OR_RETURN(config, RunConfig(f));
  } else if (resume_from.empty()) {
    model_spec.clear();
    for (const model::CheckpointEntry& e :
         model::ListCheckpoints(f.server.follow_dir)) {
      if (!e.manifest.ok()) continue;
      model_spec = e.dir;
      ASSIGN_OR_RETURN(
          config,
          ConfigOnDevice(
              f, (std::filesystem::path(e.dir) / "config.textproto").string()));
      break;
    }
  }
  embedding::ShardingPlan plan;
  std::optional<model::MemoryPlan> memory;
  if (config.has_value()) {
    ASSIGN_OR_RETURN(plan, PlanShardingOf(f, *config));
    // The memory the model would take, refused as a run would.
    ASSIGN_OR_RETURN(memory, CheckMemoryOf(f, *config, &plan));
    // The tiers the model would choose (embedding::ApplyMemoryBudgets).
    ASSIGN_OR_RETURN(config, embedding::ApplyMemoryBudgets(*config, &plan));
  }
  const auto or_none = [](const std::string& s) {
    return s.empty() ? std::string("(none)") : s;
  };
  std::printf("dlrm_server --dry-run: the flags are valid; nothing started\n");
  std::printf("rank %d of %d\n", f.rank, f.world_size);
  if (!f.launcher_note.empty()) std::printf("%s\n", f.launcher_note.c_str());
  if (f.world_size > 1) {
    std::printf(
        "coordinator %s (%s; %s)\ncollectives bind %s (Gloo: plaintext, "
        "unauthenticated)\n",
        f.coordinator.c_str(), f.rank == 0 ? "rank 0 hosts it" : "dialled",
        ControlPlaneSummary(f).c_str(), f.comm_bind_address.c_str());
  }
  if (f.rank == 0) {
    std::printf("gRPC listen %s\nmetrics listen %s\n", f.server.listen.c_str(),
                f.server.metrics_listen.empty()
                    ? "off"
                    : f.server.metrics_listen.c_str());
  } else {
    std::printf("serves nothing (follows rank 0)\n");
  }
  if (!f.server.follow_dir.empty()) {
    std::printf(
        "follow %s every %g s (serves its newest complete checkpoint; "
        "listens once there is one)\n",
        f.server.follow_dir.c_str(), f.server.follow_poll_seconds);
  }
  if (config.has_value()) {
    std::printf(
        "model %s: %d tables, %lld embedding and %lld dense parameters\n",
        model_spec.c_str(), config->tables_size(),
        static_cast<long long>(EmbeddingParameterCount(*config)),
        static_cast<long long>(DenseParameterCount(*config)));
    std::printf(
        "device %s (the dense part), dense precision %s%s\n",
        DeviceName(config->device()),
        dense::DescribePrecision(config->device(), config->dense_precision())
            .c_str(),
        config->device() == DEVICE_CUDA
            ? (config->gpu_disable_tf32() ? ", tf32 GEMMs off"
                                          : ", tf32 GEMMs on")
            : "");
    const bool device_tables = std::any_of(
        config->tables().begin(), config->tables().end(),
        [](const TableConfig& t) { return t.storage() == STORAGE_DEVICE; });
    if (config->device_budget_bytes() > 0) {
      std::printf("device memory budget %lld MiB per rank\n",
                  static_cast<long long>(config->device_budget_bytes() >> 20));
    } else if (config->device() == DEVICE_CUDA && device_tables) {
      std::printf(
          "device memory budget: the GPU's free memory at start less the "
          "dense part's reserve\n");
    }
  } else {
    std::printf("model: none yet (no complete checkpoint in %s)\n",
                f.server.follow_dir.c_str());
  }
  std::printf("gRPC %s, auth token %s\n",
              f.server.tls.enabled() ? (f.server.tls.client_ca_file.empty()
                                            ? "TLS"
                                            : "TLS with client certificates")
                                     : "plaintext",
              f.server.auth.token.empty()
                  ? "off"
                  : (f.server.auth.predict_requires_token
                         ? "required by every service"
                         : "required by Trainer and Admin"));
  std::printf("restore %s%s\ncheckpoint-dir %s%s\ndata-dir %s\n",
              or_none(f.restore).c_str(),
              f.server.inference_only ? " (inference only)" : "",
              or_none(f.server.checkpoint_dir).c_str(),
              f.checkpoint_on_exit ? " (saves final/ on exit)" : "",
              or_none(f.server.data_dir).c_str());
  if (const std::string lost = NoCheckpointDirWarning(f.server);
      !lost.empty() && f.rank == 0) {
    std::printf("warning: %s\n", lost.c_str());
  }
  for (const std::string& dir : f.server.allowed_data_dirs) {
    std::printf("allow-data-path %s\n", dir.c_str());
  }
  if (f.server.data_dir.empty() && f.server.allowed_data_dirs.empty()) {
    std::printf(
        "dataset files off (no data-dir or allow-data-path): "
        "synthetic data only\n");
  }
  if (!f.server.checkpoint_dir.empty()) {
    std::printf(
        "resume %s\nperiodic checkpoints every %lld steps, %g s (0 = off), "
        "keeping %d\n",
        f.resume && f.restore.empty() && !f.server.inference_only
            ? "from the newest valid checkpoint in checkpoint-dir, if any"
            : "off",
        static_cast<long long>(f.server.checkpoint_every_steps),
        f.server.checkpoint_every_seconds, f.server.keep_checkpoints);
    if (!resume_from.empty()) {
      std::printf("resumes from %s%s\n", resume_from.c_str(),
                  f.config_given && changes.empty()
                      ? " (--config changes nothing)"
                      : "");
      for (const ConfigDifference& c : changes) {
        std::printf("%s\n", c.ToString().c_str());
      }
    }
  }
  if (config.has_value()) {
    std::printf("sharding plan (%d ranks):\n%s\n", f.world_size,
                plan.ToString(*config).c_str());
    std::printf("%s", memory->ToString().c_str());
  }
  return absl::OkStatus();
}

// --health-check HOST:PORT: grpc.health.v1.Health/Check of the whole server
// (service ""); 0 when SERVING, else 1 with the reason on stderr. Sent as
// raw bytes through a generic stub: Debian's gRPC has no generated health
// client and Debian ships no grpc_health_probe.
absl::StatusOr<std::shared_ptr<grpc::Channel>> HealthChannel(
    const std::string& target, const Flags& f) {
  comm::TlsClientOptions tls;
  tls.enabled = f.health_tls || !f.health_ca.empty() ||
                !f.health_cert.empty() || !f.health_server_name.empty();
  if (f.health_cert.empty() != f.health_key.empty()) {
    return absl::InvalidArgumentError(
        "--health-check-cert and --health-check-key go together");
  }
  tls.ca_file = f.health_ca;
  tls.cert_file = f.health_cert;
  tls.key_file = f.health_key;
  tls.server_name = f.health_server_name;
  return comm::MakeChannel(target, tls);
}

int HealthCheck(const std::string& target, const Flags& f, double timeout_s) {
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
      HealthChannel(target, f);
  if (!channel.ok()) {
    std::fprintf(stderr, "dlrm_server: health of %s: %s\n", target.c_str(),
                 channel.status().ToString().c_str());
    return 1;
  }
  grpc::GenericStub stub(*channel);
  grpc::ClientContext context;
  context.set_deadline(
      std::chrono::system_clock::now() +
      std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000)));
  grpc::Slice empty("");  // HealthCheckRequest{service: ""}
  const grpc::ByteBuffer request(&empty, 1);
  grpc::CompletionQueue cq;
  grpc::ByteBuffer response;
  grpc::Status status;
  auto call = stub.PrepareUnaryCall(&context, "/grpc.health.v1.Health/Check",
                                    request, &cq);
  call->StartCall();
  call->Finish(&response, &status, reinterpret_cast<void*>(1));
  void* tag = nullptr;
  bool ok = false;
  cq.Next(&tag, &ok);
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  if (!status.ok()) {
    std::fprintf(stderr, "dlrm_server: health of %s: %s\n", target.c_str(),
                 status.error_message().c_str());
    return 1;
  }
  std::vector<grpc::Slice> slices;
  std::string bytes;
  if (response.Dump(&slices).ok()) {
    for (const grpc::Slice& s : slices) {
      bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
    }
  }
  // HealthCheckResponse is one enum field, status = 1 (key byte 0x08); its
  // values fit one varint byte; absent means UNKNOWN (0). SERVING is 1.
  const int serving = bytes.size() >= 2 && bytes[0] == 0x08 ? bytes[1] : 0;
  static constexpr const char* kNames[] = {"UNKNOWN", "SERVING", "NOT_SERVING",
                                           "SERVICE_UNKNOWN"};
  std::printf("%s: %s\n", target.c_str(),
              serving >= 0 && serving < 4 ? kNames[serving] : "UNKNOWN");
  return serving == 1 ? 0 : 1;
}

// Reads the tokens of --auth-token-file and --join-token-file, where given,
// into f->server.auth.token and f->join_token; ReadSecretFile's errors,
// naming the flag.
absl::Status ReadSecrets(Flags* f) {
  if (!f->auth_token_file.empty()) {
    ASSIGN_OR_RETURN(f->server.auth.token,
                     ReadSecretFile(f->auth_token_file, "--auth-token-file"));
  }
  if (!f->join_token_file.empty()) {
    ASSIGN_OR_RETURN(f->join_token,
                     ReadSecretFile(f->join_token_file, "--join-token-file"));
  }
  return absl::OkStatus();
}

// True when the run resumes from a checkpoint under --checkpoint-dir.
bool Resumes(const Flags& f) {
  return f.resume && f.restore.empty() && !f.server.inference_only &&
         !f.server.checkpoint_dir.empty();
}

// The job id of the ranks' heartbeats (Coordinator.Heartbeat).
constexpr char kRanksJob[] = "dlrm-server";

absl::Status NothingToResume(const std::string& root) {
  return absl::FailedPreconditionError(absl::StrCat(
      "no checkpoint in ", root,
      " could be loaded (each is named in a warning above); move the "
      "damaged ones away, or start afresh with --no-resume"));
}

// Single rank: the model of the newest checkpoint under --checkpoint-dir
// that loads (checksums included), skipping the others with a warning;
// null when there is none at all. Sets f.server.resume_job to the job that
// checkpoint recorded.
absl::StatusOr<std::unique_ptr<model::Model>> ResumeModel(Flags& f) {
  const std::string& root = f.server.checkpoint_dir;
  model::CleanPartialCheckpoints(root);
  const std::vector<model::CheckpointEntry> entries =
      model::ListCheckpoints(root);
  if (entries.empty()) {
    spdlog::info("no checkpoint in {}: starting afresh", root);
    return nullptr;
  }
  for (const model::CheckpointEntry& e : entries) {
    std::vector<ConfigDifference> changes;
    absl::StatusOr<ModelConfig> config = e.manifest.ok()
                                             ? ResumedConfig(f, e.dir, &changes)
                                             : e.manifest.status();
    // A config that changes what the checkpoint fixes is refused, not
    // skipped over for an older checkpoint.
    if (absl::IsFailedPrecondition(config.status())) return config.status();
    absl::StatusOr<std::unique_ptr<model::Model>> model =
        config.ok() ? model::LoadCheckpointWith(
                          e.dir, /*weights_only=*/false,
                          [&](ModelConfig* c) {
                            *c = *config;
                            if (f.world_size != 1) return absl::OkStatus();
                            return CheckMemoryOf(f, *c, nullptr).status();
                          })
                    : config.status();
    // Nor is a model too big for this machine (model::CheckMemory).
    if (absl::IsResourceExhausted(model.status())) return model.status();
    if (!model.ok()) {
      spdlog::warn("skipping checkpoint {}: {}", e.dir,
                   model.status().ToString());
      continue;
    }
    spdlog::info("resuming from {} at step {}", e.dir, (*model)->steps());
    LogResumeChanges(changes);
    f.server.resume_job = e.manifest->job;
    f.server.loaded_from = e.dir;
    return model;
  }
  return NothingToResume(root);
}

// --follow: the model of the newest checkpoint under --follow's directory
// that loads (checksums verified), the others skipped with a warning;
// waits, looking every --follow-poll-seconds, until one does. Sets
// f.server.loaded_from. Cancelled when one of `signals` (blocked) arrives
// meanwhile.
absl::StatusOr<std::unique_ptr<model::Model>> FirstFollowedModel(
    Flags& f, const sigset_t& signals) {
  CheckpointPicker picker(f.server.follow_dir);
  bool told = false;
  while (true) {
    int skipped = 0;
    for (const model::CheckpointEntry& e :
         picker.Candidates(ServedCheckpoint(), &skipped)) {
      absl::StatusOr<std::unique_ptr<model::Model>> model =
          LoadModel(f, e.dir, /*weights_only=*/true);
      if (!model.ok()) {
        picker.Failed(e, model.status());
        continue;
      }
      spdlog::info("serving checkpoint {} (step {})", e.dir, (*model)->steps());
      f.server.loaded_from = e.dir;
      return model;
    }
    if (!told) {
      spdlog::info(
          "waiting for a complete checkpoint in {} (looking every {} s); "
          "the server listens once it has one",
          f.server.follow_dir, f.server.follow_poll_seconds);
      told = true;
    }
    const double s = f.server.follow_poll_seconds;
    timespec wait;
    wait.tv_sec = static_cast<time_t>(s);
    wait.tv_nsec = static_cast<long>((s - wait.tv_sec) * 1e9);
    const int received = sigtimedwait(&signals, nullptr, &wait);
    if (received > 0) {
      return absl::CancelledError(absl::StrCat(
          "signal ", received, " while waiting for a checkpoint in ",
          f.server.follow_dir));
    }
  }
}

absl::StatusOr<std::unique_ptr<model::Model>> MakeModel(
    Flags& f, const sigset_t& signals) {
  if (!f.server.follow_dir.empty()) return FirstFollowedModel(f, signals);
  if (Resumes(f)) {
    ASSIGN_OR_RETURN(std::unique_ptr<model::Model> resumed, ResumeModel(f));
    if (resumed != nullptr) return resumed;
  }
  if (!f.restore.empty()) {
    spdlog::info("loading {} from {}",
                 f.server.inference_only ? "weights" : "the checkpoint",
                 f.restore);
    f.server.loaded_from = f.restore;
    return LoadModel(f, f.restore, /*weights_only=*/f.server.inference_only);
  }
  if (f.server.inference_only) {
    return absl::InvalidArgumentError(
        "--inference-only needs --restore or --follow (the weights to "
        "serve)");
  }
  ASSIGN_OR_RETURN(ModelConfig config, ConfigOnDevice(f, f.config));
  RETURN_IF_ERROR(CheckMemoryOf(f, config, nullptr).status());
  return model::Model::Create(config);
}

// Serves until a signal: prints the "listening" line the launchers wait
// for, waits for `wait_for_signal` to return the signal, then stops the
// services after the current step and, with --checkpoint-on-exit, saves
// <checkpoint-dir>/final with the interrupted job. Warns at start of a
// training server without --checkpoint-dir, and at the stop of trained
// steps no checkpoint holds (server/startup_checks.h). The save's errors.
absl::Status ServeUntilSignal(const Flags& f, DlrmServer& server,
                              const std::function<int()>& wait_for_signal) {
  const int64_t start_steps = server.host()->steps();
  if (const std::string lost = NoCheckpointDirWarning(f.server);
      !lost.empty()) {
    spdlog::warn("{}", lost);
  }
  std::printf(
      "dlrm_server: listening on %s metrics %s\n", server.address().c_str(),
      server.metrics_address().empty() ? "off"
                                       : server.metrics_address().c_str());
  std::fflush(stdout);
  const int signal = wait_for_signal();
  spdlog::info("{}: finishing the current step and shutting down",
               signal == SIGINT ? "SIGINT" : "SIGTERM");
  server.Shutdown();
  if (const std::string lost = UnsavedStepsWarning(
          f.server, f.checkpoint_on_exit, server.host()->steps(), start_steps);
      !lost.empty()) {
    spdlog::warn("{}", lost);
  }
  if (f.checkpoint_on_exit) {
    const std::string dir =
        (std::filesystem::path(f.server.checkpoint_dir) / kExitCheckpoint)
            .string();
    ASSIGN_OR_RETURN(
        model::CheckpointInfo info,
        server.host()->SaveCheckpoint(dir, server.InterruptedJob()));
    spdlog::info("saved checkpoint to {} at step {} ({} bytes)", dir, info.step,
                 info.bytes);
  }
  return absl::OkStatus();
}

// Rank `f.rank` of a job of several: rank 0 hosts the coordinator at
// --coordinator, every rank connects through it and builds its part of the
// model from the same (deterministic) plan; rank 0 serves the public
// services and leads, the others follow until rank 0 says Shutdown.
// `signals` are blocked (Run below).
absl::Status RunRank(Flags& f, const sigset_t& signals) {
  // Signals arrive on this thread. Until rank 0 serves (connecting may
  // wait minutes for the other ranks) and on followers they end the process
  // at once: there is nothing to save. Once rank 0 serves, they start the
  // orderly shutdown below.
  // Static: the detached thread may outlive this function.
  static std::mutex signal_mu;
  static std::condition_variable signal_cv;
  static int signal = 0;  // guarded by signal_mu
  static std::atomic<bool> serving{false};
  static std::atomic<bool> following{false};
  static sigset_t waited;
  waited = signals;
  std::thread([] {
    int received = 0;
    sigwait(&waited, &received);
    if (following.load()) {
      // A terminal's Ctrl-C reaches every rank at once: leave rank 0 the
      // time to finish its step and end the job in order.
      spdlog::info("signal {}: waiting up to {} s for rank 0 to end the job",
                   received, kFollowerGraceSeconds);
      std::this_thread::sleep_for(std::chrono::seconds(kFollowerGraceSeconds));
    }
    if (!serving.load()) {
      spdlog::info("signal {}: exiting", received);
      std::_Exit(128 + received);
    }
    std::lock_guard<std::mutex> lock(signal_mu);
    signal = received;
    signal_cv.notify_all();
  }).detach();

  if (!f.join_token.empty() && f.coordinator_tls_ca.empty()) {
    spdlog::warn(
        "the join token crosses the network in plaintext: give the ranks "
        "--coordinator-tls-ca (and rank 0 a certificate) off loopback");
  }
  std::unique_ptr<comm::CoordinatorServer> coordinator;
  if (f.rank == 0) {
    ASSIGN_OR_RETURN(coordinator,
                     comm::CoordinatorServer::Start(CoordinatorServerFrom(f)));
    spdlog::info("coordinator listening on {} ({})", coordinator->address(),
                 ControlPlaneSummary(f));
  }
  // Host buffers: the CPU model's exchanges and the control traffic below
  // (Gloo for more than one rank).
  comm::CommOptions comm_options;
  comm_options.memory_space = comm::MemorySpace::kHost;
  comm_options.rank = f.rank;
  comm_options.world_size = f.world_size;
  comm_options.coordinator_address = f.coordinator;
  comm_options.coordinator_client = CoordinatorClientFrom(f);
  comm_options.bind_address = f.comm_bind_address;
  comm_options.job_id = "dlrm-server";
  comm_options.op_timeout_seconds = f.comm_timeout_s;
  comm_options.connect_timeout_seconds = f.comm_connect_timeout_s;
  spdlog::info("connecting rank {} of {} through {}", f.rank, f.world_size,
               f.coordinator);
  ASSIGN_OR_RETURN(std::unique_ptr<comm::Communicator> comm,
                   comm::CreateCommunicator(comm_options));
  // Rank 0 picks the checkpoint to resume from and tells the others, so
  // that every rank plans from the same config (followers need not have
  // --checkpoint-dir; they always take part).
  std::vector<model::CheckpointEntry> resume;
  std::string resume_dir;
  if (f.rank == 0 && Resumes(f)) {
    model::CleanPartialCheckpoints(f.server.checkpoint_dir);
    for (model::CheckpointEntry& e :
         model::ListCheckpoints(f.server.checkpoint_dir)) {
      if (!e.manifest.ok()) {
        spdlog::warn("skipping checkpoint {}: {}", e.dir,
                     e.manifest.status().ToString());
      } else {
        if (e.manifest->world_size != f.world_size) {
          spdlog::info(
              "checkpoint {} was written by {} ranks, this job has {}: a "
              "restore reshards it",
              e.dir, e.manifest->world_size, f.world_size);
        }
        resume.push_back(std::move(e));
      }
    }
    if (!resume.empty()) resume_dir = resume.front().dir;
  }
  int64_t size = static_cast<int64_t>(resume_dir.size());
  RETURN_IF_ERROR(comm->Broadcast(&size, 1, comm::DataType::kInt64, 0));
  resume_dir.resize(size);
  RETURN_IF_ERROR(
      comm->Broadcast(resume_dir.data(), size, comm::DataType::kUint8, 0));
  // Every rank compares its own --config (the same on every rank) with the
  // checkpoint's, so that they plan alike; rank 0 logs the changes.
  std::vector<ConfigDifference> changes;
  ASSIGN_OR_RETURN(ModelConfig config,
                   resume_dir.empty() ? RunConfig(f)
                                      : ResumedConfig(f, resume_dir, &changes));
  ASSIGN_OR_RETURN(embedding::ShardingPlan plan, PlanShardingOf(f, config));
  RETURN_IF_ERROR(CheckMemoryOf(f, config, &plan).status());
  // Declared before the model and everything that owns it, so it outlives
  // them: the model borrows it.
  std::unique_ptr<comm::Communicator> dense_comm;
  if (f.overlap_allreduce) {
    comm_options.job_id = "dlrm-server-dense";
    ASSIGN_OR_RETURN(dense_comm, comm::CreateCommunicator(comm_options));
  }
  // Predictions beside training on several ranks (docs/server.md
  // "Predictions beside training") talk on a communicator of their own, so
  // that their collectives never interleave with a step's.
  std::unique_ptr<comm::Communicator> predict_comm;
  if (f.world_size > 1) {
    comm::CommOptions predict_options = comm_options;
    predict_options.job_id = "dlrm-server-predict";
    ASSIGN_OR_RETURN(predict_comm, comm::CreateCommunicator(predict_options));
  }
  // Tables in GPU memory exchange their pooled vectors in device memory.
  std::unique_ptr<comm::Communicator> device_comm;
  if (config.device() == DEVICE_CUDA &&
      std::any_of(
          config.tables().begin(), config.tables().end(),
          [](const TableConfig& t) { return t.storage() == STORAGE_DEVICE; })) {
    comm::CommOptions device_options = comm_options;
    device_options.memory_space = comm::MemorySpace::kDevice;
    device_options.backend = f.device_comm == "nccl" ? comm::CommBackend::kNccl
                             : f.device_comm == "host-staged"
                                 ? comm::CommBackend::kHostStaged
                                 : comm::CommBackend::kAuto;
    device_options.job_id = "dlrm-server-device";
    ASSIGN_OR_RETURN(device_comm, comm::CreateCommunicator(device_options));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<model::Model> model,
                   model::Model::Create(config, plan, comm.get(),
                                        dense_comm.get(), device_comm.get()));
  RankGroupOptions ro;
  ro.heartbeat_seconds = std::min(10.0, f.comm_timeout_s / 4);
  // Followers' heartbeats to the coordinator name a rank that dies or
  // freezes (RankGroup::Health).
  std::unique_ptr<comm::CoordinatorClient> beat_client;
  if (f.rank == 0) {
    ro.heartbeats = [c = coordinator.get()] {
      return c->Heartbeats(kRanksJob);
    };
  } else {
    ASSIGN_OR_RETURN(beat_client, comm::CoordinatorClient::Create(
                                      f.coordinator, CoordinatorClientFrom(f)));
    char host[256] = {};
    gethostname(host, sizeof(host) - 1);
    ro.send_heartbeat = [c = beat_client.get(), rank = f.rank,
                         host = std::string(host)] {
      return c->Heartbeat(kRanksJob, rank, host, 2 * kRankHeartbeatSeconds);
    };
  }
  ASSIGN_OR_RETURN(std::unique_ptr<RankGroup> group,
                   RankGroup::Create(std::move(comm), std::move(model), ro,
                                     std::move(predict_comm)));

  if (f.rank != 0) {
    // A follower stops when rank 0 says so; a signal ends it at once.
    spdlog::info("following rank 0");
    following.store(true);
    RETURN_IF_ERROR(group->Follow());
    spdlog::info("rank 0 shut the job down");
    return absl::OkStatus();
  }
  spdlog::info("sharding plan ({} ranks):\n{}", f.world_size,
               plan.ToString(config));
  ASSIGN_OR_RETURN(
      std::unique_ptr<ModelHost> host,
      ModelHost::Create(std::move(group), HostOptionsFrom(f.server)));
  if (!resume.empty()) {
    // Newest first; a damaged one (checked on every rank) is skipped.
    bool resumed = false;
    for (const model::CheckpointEntry& e : resume) {
      absl::StatusOr<model::CheckpointInfo> info =
          host->RestoreCheckpoint(e.dir);
      if (!info.ok()) {
        spdlog::warn("skipping checkpoint {}: {}", e.dir,
                     info.status().ToString());
        // A broken job cannot try another.
        if (absl::IsUnavailable(info.status())) return info.status();
        continue;
      }
      spdlog::info("resuming from {} at step {}", e.dir, info->step);
      if (e.dir == resume_dir) LogResumeChanges(changes);
      f.server.resume_job = e.manifest->job;
      resumed = true;
      break;
    }
    if (!resumed) return NothingToResume(f.server.checkpoint_dir);
  } else if (Resumes(f)) {
    spdlog::info("no checkpoint in {}: starting afresh",
                 f.server.checkpoint_dir);
  }
  if (!f.restore.empty()) {
    spdlog::info("restoring every rank from {}", f.restore);
    ASSIGN_OR_RETURN(model::CheckpointInfo info,
                     host->RestoreCheckpoint(f.restore));
    spdlog::info("restored step {}", info.step);
  }
  ASSIGN_OR_RETURN(std::unique_ptr<DlrmServer> server,
                   DlrmServer::Start(std::move(host), f.server));
  // From here a signal means the orderly shutdown, also one that arrives
  // as soon as the "listening" line is read.
  serving.store(true);
  RETURN_IF_ERROR(ServeUntilSignal(f, *server, [] {
    std::unique_lock<std::mutex> lock(signal_mu);
    signal_cv.wait(lock, [] { return signal != 0; });
    return signal;
  }));
  const absl::Status stopped = server->host()->ShutdownRanks();
  if (!stopped.ok()) {
    spdlog::warn("could not shut the other ranks down: {}",
                 std::string(stopped.message()));
  }
  return absl::OkStatus();
}

absl::Status Run(Flags& f) {
  auto logger = spdlog::stderr_color_mt("dlrm_server");
  logger->set_pattern(
      absl::StrCat("[%Y-%m-%d %H:%M:%S.%e] [rank ", f.rank, "] [%^%l%$] %v"));
  spdlog::set_default_logger(logger);
  spdlog::set_level(spdlog::level::from_str(f.log_level));

  if (!f.launcher_note.empty()) spdlog::info("{}", f.launcher_note);
  RETURN_IF_ERROR(ValidateFlags(f));
  // Model work runs on job, stream and batcher threads too, which
  // omp_set_num_threads below (this thread's) does not reach.
  f.server.compute_threads = f.threads;
  // A replica applies the flags to every checkpoint it swaps in, as to
  // the first one.
  f.server.adjust_loaded_config = [adjust = f](ModelConfig* config) {
    return AdjustAndCheck(adjust, config);
  };

  // Signals are taken by sigwait below; every thread started from here on
  // inherits the mask, so none of them is interrupted.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  if (f.threads > 0) omp_set_num_threads(f.threads);
  if (f.world_size != 1) return RunRank(f, signals);
  absl::StatusOr<std::unique_ptr<model::Model>> made = MakeModel(f, signals);
  if (absl::IsCancelled(made.status())) {
    // A replica stopped before it had anything to serve: an orderly stop.
    spdlog::info("{}", std::string(made.status().message()));
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(std::unique_ptr<model::Model> model, std::move(made));
  const ModelConfig& config = model->config();
  spdlog::info(
      "model: {} tables, {} embedding and {} dense parameters, step {}, "
      "{} compute threads, dense precision {}",
      config.tables_size(), EmbeddingParameterCount(config),
      DenseParameterCount(config), model->steps(), omp_get_max_threads(),
      dense::DescribePrecision(config.device(), config.dense_precision()));
  ASSIGN_OR_RETURN(std::unique_ptr<DlrmServer> server,
                   DlrmServer::Start(std::move(model), f.server));
  return ServeUntilSignal(f, *server, [&signals] {
    int signal = 0;
    sigwait(&signals, &signal);
    return signal;
  });
}

}  // namespace
}  // namespace dlrm::server

int main(int argc, char** argv) {
  dlrm::server::Flags f;
  dlrm::server::ServerOptions& o = f.server;
  CLI::App app{"Train and serve a DLRM over gRPC."};
  dlrm::AddVersionFlag(app, "dlrm_server");
  app.add_option("--listen", o.listen,
                 "gRPC address HOST:PORT (port 0 picks a free port)")
      ->capture_default_str();
  app.add_option("--metrics-listen", o.metrics_listen,
                 "Prometheus /metrics address HOST:PORT (empty disables)")
      ->capture_default_str();
  app.add_option("--config", f.config,
                 "Model config: a preset (tiny, kaggle, kaggle-full, "
                 "mlperf-dlrm-v1, mlperf-dlrm-dcnv2, xl-113b) or a "
                 "text-format ModelConfig file (ignored with --restore; on a "
                 "resume, what it changes that a trained model may change is "
                 "applied, the rest refused)")
      ->capture_default_str();
  // --device, --precision, --tf32 (with --restore or a resume, the default
  // is the checkpoint's setting).
  f.dense.AddTo(app);
  app.add_option("--checkpoint-dir", o.checkpoint_dir,
                 "Checkpoint paths of Admin RPCs resolve under this "
                 "directory and may not leave it");
  app.add_option("--data-dir", o.data_dir,
                 "Dataset files of jobs and Evaluate are read only inside "
                 "this directory (or an --allow-data-path one); relative "
                 "paths resolve here. Without either, only synthetic data");
  app.add_option("--allow-data-path", o.allowed_data_dirs,
                 "Another directory dataset files may be read from (after "
                 "resolving .. and symbolic links); repeat for several");
  app.add_option("--restore", f.restore,
                 "Start from the checkpoint in this directory (its config)");
  app.add_flag("--inference-only", o.inference_only,
               "With --restore or --follow: load weights only and refuse "
               "training");
  app.add_option("--follow", o.follow_dir,
                 "With --inference-only: serve the newest complete "
                 "checkpoint a training server writes into this directory, "
                 "swapping newer ones in as they appear (waits for the "
                 "first before listening)");
  app.add_option("--follow-poll-seconds", o.follow_poll_seconds,
                 "Seconds between two looks into the --follow directory")
      ->check(CLI::PositiveNumber);
  app.add_flag("--checkpoint-on-exit", f.checkpoint_on_exit,
               "On SIGINT/SIGTERM, save a checkpoint to "
               "<checkpoint-dir>/final");
  app.add_option("--checkpoint-every-steps", o.checkpoint_every_steps,
                 "Save <checkpoint-dir>/ckpt-<step> after every step whose "
                 "number is a multiple of N (0 = off)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--checkpoint-every-seconds", o.checkpoint_every_seconds,
                 "Save <checkpoint-dir>/ckpt-<step> after the first step "
                 "ending S seconds after the last checkpoint (0 = off)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--keep-checkpoints", o.keep_checkpoints,
                 "Periodic checkpoints kept, the newest (0 = all)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_flag("--resume,!--no-resume", f.resume,
               "Start from the newest valid checkpoint in --checkpoint-dir "
               "if it holds one (default; --restore overrides)")
      ->capture_default_str();
  app.add_option("--log-level", f.log_level, "trace, debug, info, warn, error")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error"}))
      ->capture_default_str();
  app.add_option("--threads", f.threads,
                 "Compute (OpenMP) threads for the model (0 = all cores)")
      ->capture_default_str();
  app.add_option("--train-queue", o.train_queue_depth,
                 "Batches a Train stream holds waiting for the trainer")
      ->capture_default_str();
  app.add_option("--train-idle-timeout-s", o.train_idle_timeout_seconds,
                 "Seconds a Train stream may wait on a stalled client (no "
                 "batch sent, no result read) before it ends with "
                 "DEADLINE_EXCEEDED and frees training (0 = no limit)")
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
  app.add_option("--world-size", f.world_size,
                 "Ranks (processes) of the job; each runs this binary "
                 "(default: the launcher's, e.g. SLURM_NTASKS, "
                 "OMPI_COMM_WORLD_SIZE or WORLD_SIZE, else 1)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--rank", f.rank,
                 "This process's rank; rank 0 serves, the others follow "
                 "(default: the launcher's, e.g. SLURM_PROCID, "
                 "OMPI_COMM_WORLD_RANK or RANK, else 0)")
      ->capture_default_str();
  app.add_option("--coordinator", f.coordinator,
                 "With --world-size > 1: HOST:PORT rank 0 hosts the "
                 "rendezvous on and every rank dials (default: "
                 "MASTER_ADDR:MASTER_PORT, or Slurm's first node)");
  app.add_option("--memory-budget-mb", f.memory_budget_mb,
                 "With --world-size > 1: embedding bytes (weights + optimizer "
                 "state, RocksDB rows too) one rank may hold, for the "
                 "sharding planner that spreads tables over the ranks, in "
                 "MiB (0 = unlimited); it moves nothing to disk: that is "
                 "--host-budget-mb")
      ->capture_default_str();
  f.storage.AddTo(app);
  app.add_option("--device-memory-budget-mb", f.device_memory_budget_mb,
                 "Device memory one rank may give STORAGE_DEVICE tables "
                 "(weights + optimizer state; a cached table its cache), in "
                 "MiB: the planner spreads device tables within it and moves "
                 "the largest to host memory until every rank fits "
                 "(default 0: the model config's device_budget_bytes, else "
                 "on a GPU its free memory less a reserve for the dense "
                 "part)")
      ->capture_default_str();
  app.add_flag("--overlap-allreduce", f.overlap_allreduce,
               "With several ranks: all-reduce dense gradients on a second "
               "communicator, overlapped with the backward pass (pays when "
               "ranks have idle cores; see bench/RESULTS.md)");
  app.add_option("--device-comm", f.device_comm,
                 "With --world-size > 1, device cuda and STORAGE_DEVICE "
                 "tables: the communicator of the pooled vectors' exchanges: "
                 "auto or nccl (one process per GPU), host-staged (Gloo on "
                 "host copies, for ranks sharing a GPU)")
      ->capture_default_str();
  app.add_option("--comm-timeout-s", f.comm_timeout_s,
                 "Longest a collective between ranks waits for a peer "
                 "before the job is declared broken, in seconds")
      ->capture_default_str();
  app.add_option("--comm-connect-timeout-s", f.comm_connect_timeout_s,
                 "Longest a rank waits at start for every rank to join the "
                 "job (pods or tasks that start minutes apart need more), in "
                 "seconds")
      ->capture_default_str();
  // Any flag may also come from a TOML or INI file (key = the flag's long
  // name); the command line wins over the file, an unknown key is an error.
  app.set_config("--server-config", "",
                 "Read flags from this TOML or INI file (e.g. "
                 "listen = \"127.0.0.1:0\"); the command line overrides it");
  app.add_option("--comm-bind-address", f.comm_bind_address,
                 "With --world-size > 1: address or hostname this rank's "
                 "collectives (Gloo) bind to; every other rank must reach it "
                 "(a container's hostname, a host's IP)")
      ->capture_default_str();
  app.add_flag("--dry-run", f.dry_run,
               "Check the flags, load the model config and plan the sharding "
               "for --world-size, print what would run, and exit (0 if all "
               "is valid) without binding, connecting or allocating");
  app.add_option("--health-check", f.health_check,
                 "Probe mode: ask the server at HOST:PORT for its gRPC health "
                 "(grpc.health.v1) and exit 0 if SERVING, else 1; other "
                 "flags are ignored");
  app.add_flag("--health-check-tls", f.health_tls,
               "With --health-check: over TLS, trusting the system's CA "
               "certificates (implied by the other --health-check-* flags)");
  app.add_option("--health-check-ca", f.health_ca,
                 "With --health-check: PEM CA certificates that sign the "
                 "server's certificate (TLS)");
  app.add_option("--health-check-cert", f.health_cert,
                 "With --health-check: PEM client certificate for a server "
                 "with --tls-client-ca (with --health-check-key)");
  app.add_option("--health-check-key", f.health_key,
                 "PEM private key of --health-check-cert");
  app.add_option("--health-check-server-name", f.health_server_name,
                 "With --health-check: the name the server's certificate "
                 "must carry, when not the host in HOST:PORT");
  app.add_option("--tls-cert", o.tls.cert_file,
                 "PEM certificate chain: serve gRPC over TLS (with --tls-key)");
  app.add_option("--tls-key", o.tls.key_file, "PEM private key of --tls-cert");
  app.add_option("--tls-client-ca", o.tls.client_ca_file,
                 "PEM CA certificates: require and verify a client "
                 "certificate signed by one of them (mutual TLS)");
  app.add_option("--auth-token-file", f.auth_token_file,
                 "File holding a bearer token (>= 16 printable characters) "
                 "that Trainer and Admin calls must send as "
                 "\"authorization: Bearer <token>\"");
  app.add_flag("--predict-requires-token", o.auth.predict_requires_token,
               "With --auth-token-file: Predict needs the token too");
  app.add_option("--coordinator-tls-ca", f.coordinator_tls_ca,
                 "With --world-size > 1: PEM CA certificates every rank "
                 "verifies the coordinator's certificate with; turns TLS on "
                 "for the control plane (same flags on every rank)");
  app.add_option("--coordinator-tls-cert", f.coordinator_tls_cert,
                 "PEM certificate chain rank 0's coordinator serves with "
                 "(with --coordinator-tls-key); other ranks present it as "
                 "their client certificate under --coordinator-tls-mutual");
  app.add_option("--coordinator-tls-key", f.coordinator_tls_key,
                 "PEM private key of --coordinator-tls-cert");
  app.add_flag("--coordinator-tls-mutual", f.coordinator_tls_mutual,
               "The coordinator requires every rank to present a "
               "certificate signed by --coordinator-tls-ca (mutual TLS)");
  app.add_option("--coordinator-tls-server-name", f.coordinator_tls_server_name,
                 "The name the coordinator's certificate must carry, when "
                 "not the host in --coordinator");
  app.add_option("--join-token-file", f.join_token_file,
                 "With --world-size > 1: file holding the job's join token "
                 "(>= 16 printable characters, the same on every rank); the "
                 "coordinator refuses calls without it");
  app.add_option("--max-concurrent-streams", o.max_concurrent_streams,
                 "Most concurrent RPCs one client connection may have open "
                 "(0 = gRPC's default, no limit)")
      ->capture_default_str();
  app.allow_config_extras(CLI::config_extras_mode::error);
  if (const int code = dlrm::ParseCommandLine(app, argc, argv, "dlrm_server");
      code >= 0) {
    return code;
  }
  if (!f.health_check.empty()) {
    return dlrm::server::HealthCheck(f.health_check, f, /*timeout_s=*/5);
  }
  const dlrm::server::ExplicitRankFlags given{
      app.count("--rank") > 0, app.count("--world-size") > 0,
      app.count("--coordinator") > 0, app.count("--comm-bind-address") > 0};
  if (const absl::Status launched =
          dlrm::server::ApplyLauncher(dlrm::comm::ProcessEnv(), given, &f);
      !launched.ok()) {
    std::fprintf(stderr, "dlrm_server: %s\n", launched.ToString().c_str());
    return 1;
  }
  f.server.max_message_bytes = f.max_message_mb << 20;
  f.config_given = app.count("--config") > 0;
  if (const absl::Status read = dlrm::server::ReadSecrets(&f); !read.ok()) {
    std::fprintf(stderr, "dlrm_server: %s\n", read.ToString().c_str());
    return 1;
  }
  const absl::Status s =
      f.dry_run ? dlrm::server::DryRun(f) : dlrm::server::Run(f);
  if (!s.ok()) {
    std::fprintf(stderr, "dlrm_server: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
