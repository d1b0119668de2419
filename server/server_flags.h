// dlrm_server's flags: what they hold (ServerFlags), their definitions on
// a CLI11 app (AddServerFlags), what a parse leaves to finish (the
// launcher's rank variables, the token files: FinishServerFlags) and the
// checks of the flags together (ValidateServerFlags), which a run and
// --dry-run share so that a dry run fails where a run would.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "comm/coordinator.h"
#include "comm/launcher_env.h"
#include "core/dense_flags.h"
#include "core/storage_flags.h"
#include "server/dlrm_server.h"
#include "server/health_probe.h"

namespace dlrm::server {

struct ServerFlags {
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
  // Deployment modes (docs/deployment.md): --dry-run, and --health-check
  // (the probe's target and TLS; a target set means probe mode).
  bool dry_run = false;
  HealthProbeOptions health;
  // Security (docs/security.md "Security"): the token is read from this file
  // into server.auth.token, so it never shows in a process listing.
  std::string auth_token_file;
  // The control plane of a multi-rank job (docs/security.md "Security"):
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
};

// Which of the rank flags the command line (or --server-config) set: those
// win over the launcher's variables.
struct ExplicitRankFlags {
  bool rank = false, world_size = false, coordinator = false, bind = false;
};

// Defines every flag of dlrm_server on `app` (and --server-config, a TOML
// or INI file of them), bound to `f`, which must outlive the parse.
void AddServerFlags(CLI::App& app, ServerFlags* f);

// After a parse of `app` (AddServerFlags): the rank flags the command line
// left unset from the launcher's variables in `env` (ApplyLauncher), the
// derived fields (server.max_message_bytes, config_given) and the tokens
// of --auth-token-file and --join-token-file. The launcher's and
// ReadSecretFile's errors, naming the flag.
absl::Status FinishServerFlags(const CLI::App& app, const comm::EnvLookup& env,
                               ServerFlags* f);

// Fills the rank flags not in `given` from the launcher that started the
// process (comm/launcher_env.h), and picks the local rank's GPU. Across
// hosts, a rank whose --comm-bind-address was not given binds its
// collectives to this host's name. InvalidArgument when the launchers'
// variables are bad or contradict each other.
absl::Status ApplyLauncher(const comm::EnvLookup& env,
                           const ExplicitRankFlags& given, ServerFlags* f);

// The checks of the flags together (CLI11 checked each alone), made before
// anything starts; reads the PEM files, so that a dry run catches a
// missing one. InvalidArgument naming the flag.
absl::Status ValidateServerFlags(const ServerFlags& f);

// Rank 0's coordinator: TLS from the --coordinator-tls-* flags (mutual with
// --coordinator-tls-mutual) and the join token.
comm::CoordinatorServerOptions CoordinatorServerFrom(const ServerFlags& f);

// How every rank, rank 0 included, dials the coordinator: TLS when
// --coordinator-tls-ca is given, presenting the certificate (when given)
// to a coordinator that asks for one.
comm::CoordinatorClientOptions CoordinatorClientFrom(const ServerFlags& f);

// The control plane in words, for logs and --dry-run.
std::string ControlPlaneSummary(const ServerFlags& f);

// True when the run resumes from a checkpoint under --checkpoint-dir.
bool Resumes(const ServerFlags& f);

}  // namespace dlrm::server
