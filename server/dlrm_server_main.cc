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
// The pieces are in the server library: the flags (server/server_flags.h),
// the run (server/server_start.h), the dry run (server/dry_run.h) and the
// health probe (server/health_probe.h).
#include <CLI/CLI.hpp>
#include <cstdio>

#include "absl/status/status.h"
#include "comm/launcher_env.h"
#include "core/cli_parse.h"
#include "server/dry_run.h"
#include "server/health_probe.h"
#include "server/server_flags.h"
#include "server/server_start.h"

int main(int argc, char** argv) {
  dlrm::server::ServerFlags f;
  CLI::App app{"Train and serve a DLRM over gRPC."};
  dlrm::AddVersionFlag(app, "dlrm_server");
  dlrm::server::AddServerFlags(app, &f);
  if (const int code = dlrm::ParseCommandLine(app, argc, argv, "dlrm_server");
      code >= 0) {
    return code;
  }
  if (!f.health.target.empty()) return dlrm::server::HealthCheck(f.health);
  absl::Status s =
      dlrm::server::FinishServerFlags(app, dlrm::comm::ProcessEnv(), &f);
  if (s.ok())
    s = f.dry_run ? dlrm::server::DryRun(f) : dlrm::server::RunServer(f);
  if (!s.ok()) {
    std::fprintf(stderr, "dlrm_server: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
