// Why a listening address cannot be bound: the listeners (the public gRPC
// server, /metrics, the coordinator) bind without SO_REUSEPORT, so a port
// another process holds is refused; gRPC and httplib only say "failed",
// and this names the reason.
#pragma once

#include <string>

#include "absl/status/status.h"

namespace dlrm::comm {

// The error of a listener that could not bind `address` (HOST:PORT,
// [V6]:PORT, or a gRPC "unix:" path), named by `flag` (e.g. "--listen"):
// Unavailable with "<flag> <address>: <reason>", the reason found by
// binding a plain socket there as the listener would (SO_REUSEADDR only),
// e.g. "address already in use" or "cannot assign requested address".
// When that bind succeeds (the port came free meanwhile) the reason is
// "the listener could not bind it".
absl::Status ListenFailure(const std::string& flag, const std::string& address);

}  // namespace dlrm::comm
