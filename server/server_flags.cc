// dlrm_server's flags (server_flags.h): their definitions, what a parse
// leaves to finish, and the checks of the flags together.
#include "server/server_flags.h"

#include <unistd.h>

#include <charconv>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "comm/factory.h"
#include "comm/grpc_auth.h"
#include "core/cli_parse.h"
#include "core/config.h"
#include "core/path_checks.h"
#include "core/secrets.h"
#include "core/status.h"
#include "server/auth.h"
#include "server/startup_checks.h"

namespace dlrm::server {
namespace {

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

// The control-plane flags of a job of several ranks, named in errors; reads
// the PEM files, so that a dry run catches a missing one.
absl::Status ValidateControlPlane(const ServerFlags& f) {
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

// Reads the tokens of --auth-token-file and --join-token-file, where given,
// into f->server.auth.token and f->join_token; ReadSecretFile's errors,
// naming the flag.
absl::Status ReadSecrets(ServerFlags* f) {
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

}  // namespace

absl::Status ApplyLauncher(const comm::EnvLookup& env,
                           const ExplicitRankFlags& given, ServerFlags* f) {
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

// Rank 0's coordinator: TLS from the --coordinator-tls-* flags (mutual with
// --coordinator-tls-mutual) and the join token.
comm::CoordinatorServerOptions CoordinatorServerFrom(const ServerFlags& f) {
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
comm::CoordinatorClientOptions CoordinatorClientFrom(const ServerFlags& f) {
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

// The control plane in words, for logs and --dry-run.
std::string ControlPlaneSummary(const ServerFlags& f) {
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
absl::Status ValidateServerFlags(const ServerFlags& f) {
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
  RETURN_IF_ERROR(comm::ParseCommBackend("--device-comm", f.device_comm,
                                         comm::MemorySpace::kDevice)
                      .status());
  if (!(f.comm_timeout_s > 0) || !(f.comm_connect_timeout_s > 0) ||
      f.memory_budget_mb < 0) {
    return absl::InvalidArgumentError(
        "--comm-timeout-s and --comm-connect-timeout-s must be positive and "
        "--memory-budget-mb >= 0");
  }
  return ValidateControlPlane(f);
}

// True when the run resumes from a checkpoint under --checkpoint-dir.
bool Resumes(const ServerFlags& f) {
  return f.resume && f.restore.empty() && !f.server.inference_only &&
         !f.server.checkpoint_dir.empty();
}

void AddServerFlags(CLI::App& app, ServerFlags* flags) {
  ServerFlags& f = *flags;
  ServerOptions& o = f.server;
  AddDefaulted(app, "--listen", o.listen,
               "gRPC address HOST:PORT (port 0 picks a free port)");
  AddDefaulted(app, "--metrics-listen", o.metrics_listen,
               "Prometheus /metrics address HOST:PORT (empty disables)");
  AddConfigFlag(app, &f.config, PresetNames(),
                "ignored with --restore; on a resume, what it changes that a "
                "trained model may change is applied, the rest refused")
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
  AddDefaulted(app, "--checkpoint-every-steps", o.checkpoint_every_steps,
               "Save <checkpoint-dir>/ckpt-<step> after every step whose "
               "number is a multiple of N (0 = off)")
      ->check(CLI::NonNegativeNumber);
  AddDefaulted(app, "--checkpoint-every-seconds", o.checkpoint_every_seconds,
               "Save <checkpoint-dir>/ckpt-<step> after the first step "
               "ending S seconds after the last checkpoint (0 = off)")
      ->check(CLI::NonNegativeNumber);
  AddDefaulted(app, "--keep-checkpoints", o.keep_checkpoints,
               "Periodic checkpoints kept, the newest (0 = all)")
      ->check(CLI::NonNegativeNumber);
  app.add_flag("--resume,!--no-resume", f.resume,
               "Start from the newest valid checkpoint in --checkpoint-dir "
               "if it holds one (default; --restore overrides)")
      ->capture_default_str();
  AddDefaulted(app, "--log-level", f.log_level,
               "trace, debug, info, warn, error")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error"}));
  AddDefaulted(app, "--threads", f.threads,
               "Compute (OpenMP) threads for the model (0 = all cores)");
  AddDefaulted(app, "--train-queue", o.train_queue_depth,
               "Batches a Train stream holds waiting for the trainer");
  AddDefaulted(app, "--train-idle-timeout-s", o.train_idle_timeout_seconds,
               "Seconds a Train stream may wait on a stalled client (no "
               "batch sent, no result read) before it ends with "
               "DEADLINE_EXCEEDED and frees training (0 = no limit)");
  AddDefaulted(app, "--predict-max-batch", o.predict_max_batch,
               "Most samples per micro-batched Predict model call");
  AddDefaulted(app, "--predict-max-wait-us", o.predict_max_wait_us,
               "Longest a Predict waits for others to join it (us)");
  AddDefaulted(app, "--max-message-mb", f.max_message_mb,
               "Largest gRPC message received or sent (MiB); larger ones "
               "get RESOURCE_EXHAUSTED");
  AddDefaulted(app, "--max-batch-samples", o.max_batch_samples,
               "Largest batch accepted, in samples");
  AddDefaulted(app, "--world-size", f.world_size,
               "Ranks (processes) of the job; each runs this binary "
               "(default: the launcher's, e.g. SLURM_NTASKS, "
               "OMPI_COMM_WORLD_SIZE or WORLD_SIZE, else 1)")
      ->check(CLI::PositiveNumber);
  AddDefaulted(app, "--rank", f.rank,
               "This process's rank; rank 0 serves, the others follow "
               "(default: the launcher's, e.g. SLURM_PROCID, "
               "OMPI_COMM_WORLD_RANK or RANK, else 0)");
  app.add_option("--coordinator", f.coordinator,
                 "With --world-size > 1: HOST:PORT rank 0 hosts the "
                 "rendezvous on and every rank dials (default: "
                 "MASTER_ADDR:MASTER_PORT, or Slurm's first node)");
  AddDefaulted(app, "--memory-budget-mb", f.memory_budget_mb,
               "With --world-size > 1: embedding bytes (weights + optimizer "
               "state, RocksDB rows too) one rank may hold, for the "
               "sharding planner that spreads tables over the ranks, in "
               "MiB (0 = unlimited); it moves nothing to disk: that is "
               "--host-budget-mb");
  f.storage.AddTo(app);
  AddDefaulted(app, "--device-memory-budget-mb", f.device_memory_budget_mb,
               "Device memory one rank may give STORAGE_DEVICE tables "
               "(weights + optimizer state; a cached table its cache), in "
               "MiB: the planner spreads device tables within it and moves "
               "the largest to host memory until every rank fits "
               "(default 0: the model config's device_budget_bytes, else "
               "on a GPU its free memory less a reserve for the dense "
               "part)");
  app.add_flag("--overlap-allreduce", f.overlap_allreduce,
               "With several ranks: all-reduce dense gradients on a second "
               "communicator, overlapped with the backward pass (pays when "
               "ranks have idle cores; see bench/RESULTS.md)");
  AddDefaulted(app, "--device-comm", f.device_comm,
               "With --world-size > 1, device cuda and STORAGE_DEVICE "
               "tables: the communicator of the pooled vectors' exchanges, " +
                   comm::CommBackendNames(comm::MemorySpace::kDevice) +
                   " (nccl: one process per GPU; host-staged: Gloo on host "
                   "copies, for ranks sharing a GPU)");
  AddDefaulted(app, "--comm-timeout-s", f.comm_timeout_s,
               "Longest a collective between ranks waits for a peer "
               "before the job is declared broken, in seconds");
  AddDefaulted(app, "--comm-connect-timeout-s", f.comm_connect_timeout_s,
               "Longest a rank waits at start for every rank to join the "
               "job (pods or tasks that start minutes apart need more), in "
               "seconds");
  // Any flag may also come from a TOML or INI file (key = the flag's long
  // name); the command line wins over the file, an unknown key is an error.
  app.set_config("--server-config", "",
                 "Read flags from this TOML or INI file (e.g. "
                 "listen = \"127.0.0.1:0\"); the command line overrides it");
  AddDefaulted(app, "--comm-bind-address", f.comm_bind_address,
               "With --world-size > 1: address or hostname this rank's "
               "collectives (Gloo) bind to; every other rank must reach it "
               "(a container's hostname, a host's IP)");
  app.add_flag("--dry-run", f.dry_run,
               "Check the flags, load the model config and plan the sharding "
               "for --world-size, print what would run, and exit (0 if all "
               "is valid) without binding, connecting or allocating");
  app.add_option("--health-check", f.health.target,
                 "Probe mode: ask the server at HOST:PORT for its gRPC health "
                 "(grpc.health.v1) and exit 0 if SERVING, else 1; other "
                 "flags are ignored");
  app.add_flag("--health-check-tls", f.health.tls,
               "With --health-check: over TLS, trusting the system's CA "
               "certificates (implied by the other --health-check-* flags)");
  app.add_option("--health-check-ca", f.health.ca_file,
                 "With --health-check: PEM CA certificates that sign the "
                 "server's certificate (TLS)");
  app.add_option("--health-check-cert", f.health.cert_file,
                 "With --health-check: PEM client certificate for a server "
                 "with --tls-client-ca (with --health-check-key)");
  app.add_option("--health-check-key", f.health.key_file,
                 "PEM private key of --health-check-cert");
  app.add_option("--health-check-server-name", f.health.server_name,
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
  AddDefaulted(app, "--max-concurrent-streams", o.max_concurrent_streams,
               "Most concurrent RPCs one client connection may have open "
               "(0 = gRPC's default, no limit)");
  app.allow_config_extras(CLI::config_extras_mode::error);
}

absl::Status FinishServerFlags(const CLI::App& app, const comm::EnvLookup& env,
                               ServerFlags* f) {
  const ExplicitRankFlags given{
      app.count("--rank") > 0, app.count("--world-size") > 0,
      app.count("--coordinator") > 0, app.count("--comm-bind-address") > 0};
  RETURN_IF_ERROR(ApplyLauncher(env, given, f));
  f->server.max_message_bytes = f->max_message_mb << 20;
  f->config_given = app.count("--config") > 0;
  return ReadSecrets(f);
}

}  // namespace dlrm::server
