// The NCCL Communicator: collectives between GPU ranks on device buffers,
// its unique id exchanged through the coordinator rank 0 hosts. The NCCL
// code is built when the CUDA toolkit is found (DLRM_WITH_NCCL); without it
// ConnectNccl says so.
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

// The rank, job and timeouts (JobOptions) of the NCCL communicator: one GPU
// per rank; the coordinator is required for world_size > 1; job_id
// defaults to "dlrm-nccl" (a Gloo communicator of the same job needs a
// different id); connecting (and, at destruction, the orderly shutdown) is
// aborted after connect_timeout_seconds; a collective fails with
// DeadlineExceeded, the communicator aborted, op_timeout_seconds after it
// is the oldest unfinished one (so that includes the caller's work queued
// before it on the stream).
struct NcclOptions : JobOptions {
  NcclOptions() { job_id = "dlrm-nccl"; }

  // CUDA device this rank uses. Default: 0.
  int device = 0;

  absl::Status Validate() const;
};

// Creates the NCCL communicator: rank 0 makes the unique id and publishes it
// through the coordinator, the others read it, all initialise together
// (non-blocking, polled, aborted after connect_timeout_seconds).
//
// Its collectives take device buffers on `device` (AllToAllV's send and
// recv must not overlap: InvalidArgument) and follow
// Communicator::SetStream: with a stream they are queued on the
// communicator's own stream after an event recorded on the caller's, and
// the caller's stream waits for their completion event; without one each
// call returns when its collective is done. A watchdog thread aborts the
// communicator (ncclCommAbort, which ends its kernels, so later CUDA calls
// such as cudaFree do not hang) when the oldest unfinished collective runs
// past op_timeout_seconds or NCCL reports an asynchronous error; the next
// call, or Synchronize, returns that error. The destructor waits for the
// collectives issued (bounded by the op timeout), then finalises the
// communicator (bounded by the connect timeout) or aborts it.
//
// InvalidArgument for bad options; FailedPrecondition naming why when no
// CUDA device can be used (built without CUDA, no driver, no device);
// DeadlineExceeded when ranks do not arrive in time; Internal for CUDA or
// NCCL errors (the message names the call and the error string).
absl::StatusOr<std::unique_ptr<Communicator>> ConnectNccl(
    const NcclOptions& options);

}  // namespace dlrm::comm
