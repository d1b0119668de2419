// Picks and connects a Communicator at start-up from options: single-rank,
// Gloo (host buffers), NCCL or host-staged Gloo (device buffers). A job with
// GPU ranks makes two: a device one for the model's exchanges and a host one
// (Gloo) for control traffic (which checkpoint to resume, shutdown,
// heartbeats).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "comm/communicator.h"
#include "comm/coordinator_client.h"
#include "comm/job_options.h"

namespace dlrm::comm {

enum class CommBackend {
  kAuto,        // single-rank for world_size 1, else Gloo (host) or NCCL
                // (device)
  kSingleRank,  // world_size 1 only: every collective a copy
  kGloo,        // host buffers, any world_size (connects even for 1)
  kNccl,        // device buffers, any world_size; one GPU per rank
  kHostStaged,  // device buffers, any world_size: Gloo on host copies
                // (MakeHostStagedCommunicator); ranks may share a GPU
};

// "auto", "single-rank", "gloo", "nccl" or "host-staged".
const char* CommBackendName(CommBackend backend);

// The backends a communicator of `space`'s buffers may name, for a flag's
// help and error: "auto", then those taking such buffers ("auto, nccl or
// host-staged" for kDevice).
std::string CommBackendNames(MemorySpace space);

// The backend `name` names (CommBackendName's spelling) among those
// CommBackendNames(space) lists; InvalidArgument naming `flag` and the
// choices otherwise.
absl::StatusOr<CommBackend> ParseCommBackend(absl::string_view flag,
                                             absl::string_view name,
                                             MemorySpace space);

// A communicator of the job JobOptions names (the coordinator required
// unless the choice is single-rank), and which kind.
struct CommOptions : JobOptions {
  // Where the buffers of the collectives live: host or one CUDA device.
  // Default: kHost.
  MemorySpace memory_space = MemorySpace::kHost;
  // Which implementation; kAuto chooses from memory_space and world_size
  // (never kHostStaged: name it for ranks that share a GPU). A named one
  // must fit both (InvalidArgument otherwise). Default: kAuto.
  CommBackend backend = CommBackend::kAuto;
  // Address this rank's Gloo TCP device binds to and peers dial (Gloo and
  // host-staged only). Default: "127.0.0.1".
  std::string bind_address = "127.0.0.1";
  // CUDA device of a device communicator (ignored for host ones); ranks of
  // a host-staged one may name the same device. Default: 0.
  int device = 0;

  // InvalidArgument for out-of-range fields, a backend that does not fit
  // memory_space or world_size, or a missing coordinator_address.
  absl::Status Validate() const;
};

// The backend `options` choose (kAuto resolved); InvalidArgument as
// CommOptions::Validate.
absl::StatusOr<CommBackend> ResolveBackend(const CommOptions& options);

// Makes the communicator `options` choose and connects it to the other
// ranks (every rank of the job calls it with its own rank). Errors:
// InvalidArgument for bad options; FailedPrecondition naming why for a
// device communicator without a usable CUDA device (built without CUDA, no
// driver, no device) -- never an abort; then the chosen implementation's
// (ConnectGloo, ConnectNccl, MakeSingleRankDeviceCommunicator,
// MakeHostStagedCommunicator).
absl::StatusOr<std::unique_ptr<Communicator>> CreateCommunicator(
    const CommOptions& options);

}  // namespace dlrm::comm
