// dlrm_server --dry-run: checks what a run would and prints what it would
// do, binding, dialling and allocating nothing (docs/deployment.md).
#pragma once

#include "absl/status/status.h"
#include "server/server_flags.h"

namespace dlrm::server {

// Validates the flags (ValidateServerFlags), the start (ChooseStart), the
// model config, the sharding plan for --world-size and --memory-budget-mb
// and the memory the model would take, then prints on stdout the plan of
// the run. The errors a run would stop with.
absl::Status DryRun(const ServerFlags& f);

}  // namespace dlrm::server
