// The Gloo Communicator: collectives between rank processes over Gloo's TCP
// transport, connected through the coordinator that rank 0 hosts.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "comm/communicator.h"
#include "comm/coordinator_client.h"
#include "comm/job_options.h"

namespace dlrm::comm {

// The rank, job and timeouts (JobOptions) of the Gloo communicator: the
// coordinator is required; connect_timeout_seconds bounds ConnectGloo's
// wait for the coordinator and every rank, op_timeout_seconds also how long
// a dead peer can go unnoticed (see ConnectGloo).
struct GlooOptions : JobOptions {
  // Address or hostname this rank's TCP device binds to; peers dial it, so
  // it must be reachable from every rank. Default: "127.0.0.1".
  std::string bind_address = "127.0.0.1";

  absl::Status Validate() const;
};

// Registers with the coordinator and connects to every other rank; every
// rank of the job calls it with its own rank. InvalidArgument for bad
// options, DeadlineExceeded naming the ranks that did not arrive within
// connect_timeout_seconds, FailedPrecondition for a stale generation,
// Unauthenticated when the coordinator refuses the join token. The Gloo
// links themselves are plaintext and unauthenticated (docs/security.md
// "Security"); the TCP device binds bind_address only.
//
// The communicator fails a collective with Unavailable when a peer's
// connection breaks (usually at once) and with DeadlineExceeded after
// op_timeout_seconds; a send already queued to a peer that died is only
// noticed by that timeout (Gloo 0.5's TCP transport does not wake it).
// Refused arguments (InvalidArgument) leave it usable, other errors do not.
// Ignores SIGPIPE process-wide if it has its default action: Gloo's TCP
// writes would otherwise kill this rank when a peer dies.
absl::StatusOr<std::unique_ptr<Communicator>> ConnectGloo(
    const GlooOptions& options);

}  // namespace dlrm::comm
