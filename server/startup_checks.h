// dlrm_server's checks and warnings around start and stop that are not
// about one option alone: the path flags (checked before anything starts,
// by --dry-run too), and the warnings of a training server whose trained
// steps would be lost.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "server/dlrm_server.h"

namespace dlrm::server {

// Checks the path flags of `options` (core/path_checks.h), each error
// naming its flag: --checkpoint-dir a writable directory (or one that can
// be made), --data-dir and every --allow-data-path an existing directory,
// --follow a directory when it exists (a replica may start before its
// trainer makes it).
absl::Status CheckServerPaths(const ServerOptions& options);

// The warning a training server without --checkpoint-dir logs at start
// (its trained steps are lost when it stops); empty for one with a
// checkpoint directory or an inference-only one.
std::string NoCheckpointDirWarning(const ServerOptions& options);

// The warning of a training server that stops with steps no checkpoint
// holds: the model is at `steps`, it started at `start_steps` (a restored
// or resumed step, held by a checkpoint), and `saves_on_exit` says whether
// --checkpoint-on-exit is about to save. Steps are counted as saved up to
// the newest checkpoint under options.checkpoint_dir. Empty when nothing
// is lost.
std::string UnsavedStepsWarning(const ServerOptions& options,
                                bool saves_on_exit, int64_t steps,
                                int64_t start_steps);

}  // namespace dlrm::server
