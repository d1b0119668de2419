// dlrm_server's run: one start path for any number of ranks. Each rank
// connects (several ranks: the coordinator on rank 0, the communicators
// from one set of options), takes the start rank 0 chose (start_plan.h:
// resume, restore, follow or fresh), builds its part of the model; rank 0
// (or the only rank) serves until SIGINT/SIGTERM, the others follow it.
#pragma once

#include "absl/status/status.h"
#include "server/server_flags.h"

namespace dlrm::server {

// Runs the server of `f` (parsed and finished: FinishServerFlags) until a
// signal stops it, or rank 0 ends a follower. Sets up logging (stderr,
// --log-level). Prints "dlrm_server: listening on HOST:PORT metrics
// HOST:PORT" on stdout once it serves. The flags' errors
// (ValidateServerFlags), the start's, the communicators', the model's and
// the servers'; OK on an orderly stop.
absl::Status RunServer(ServerFlags& f);

}  // namespace dlrm::server
