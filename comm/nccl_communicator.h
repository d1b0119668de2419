// The NCCL Communicator: collectives between GPU ranks on device buffers,
// its unique id exchanged through the coordinator rank 0 hosts. Built when
// the CUDA toolkit is found (DLRM_WITH_NCCL).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "comm/communicator.h"

namespace dlrm::comm {

struct NcclOptions {
  // This process's rank, in [0, world_size). Default: 0.
  int rank = 0;
  // Number of ranks (one GPU each). Default: 1.
  int world_size = 1;
  // host:port of the coordinator (comm/coordinator.h). Required for
  // world_size > 1. Default: "".
  std::string coordinator_address;
  // Names the job at the coordinator (a Gloo communicator of the same job
  // needs a different id). Default: "dlrm-nccl".
  std::string job_id = "dlrm-nccl";
  // See GlooOptions::generation. Default: 0.
  int64_t generation = 0;
  // CUDA device this rank uses. Default: 0.
  int device = 0;
  // How long connecting may take, in seconds. Default: 120.
  double connect_timeout_seconds = 120;
  // How long one collective may take before the communicator is aborted
  // and the call fails with DeadlineExceeded, in seconds. Default: 120.
  double op_timeout_seconds = 120;

  absl::Status Validate() const;
};

// Whether this process sees at least one CUDA device; any CUDA error
// (no driver, no device) counts as none.
bool CudaDeviceAvailable();

// Creates the NCCL communicator: rank 0 makes the unique id and publishes it
// through the coordinator, the others read it, all initialise together.
// Buffers passed to its collectives are device pointers on `device`; every
// call runs on the communicator's own stream and returns when it is done.
// FailedPrecondition when no CUDA device is available; DeadlineExceeded
// when ranks do not arrive in time; Internal for CUDA or NCCL errors (the
// message names the call and the error string).
absl::StatusOr<std::unique_ptr<Communicator>> ConnectNccl(
    const NcclOptions& options);

}  // namespace dlrm::comm
