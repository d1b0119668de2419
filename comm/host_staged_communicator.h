// The host-staged device Communicator: device buffers copied to and from
// host staging buffers around a host communicator's collective (Gloo), so
// that rank processes sharing one GPU, or a build without usable NCCL, still
// run the device step across ranks.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "comm/communicator.h"
#include "core/device.h"

namespace dlrm::comm {

// Wraps `host` (a host communicator: ConnectGloo, or the single-rank one;
// owned) into a communicator with memory_space() kDevice and host's rank
// and world size, whose buffers are memory of CUDA device `device` (kind
// kCuda) or, with kind kCpu (`device` ignored), host memory: the same
// staging through the CPU Device, which is how it is tested without a GPU.
//
// Each collective checks its arguments as the other communicators do
// (InvalidArgument naming the argument, the communicator stays usable),
// copies its device input into a host staging buffer through the Device
// (Device::CopyToHost), runs host's collective there and copies the result
// back (Device::CopyToDevice); it returns when the result is in device
// memory. There are two staging buffers (input and output), reused and
// grown to the largest call; on CUDA they are page-locked (cudaMallocHost),
// so both copies are synchronous with the host. Send and recv may overlap:
// the whole input is staged before any output is written.
//
// Streams (kCuda only; with kCpu SetStream takes only nullptr): with a
// stream set, each collective first waits for it on the host
// (cudaStreamSynchronize), so it reads what was queued before the call;
// as the result is in place when the call returns, the stream's later work
// sees it. Unlike NCCL's, every call blocks the host until its collective
// is done, with or without a stream. Synchronize() is OK, or
// FailedPrecondition after an error.
//
// After a collective fails past its argument checks (host's Unavailable or
// DeadlineExceeded, a copy's Internal, ResourceExhausted for staging
// memory) the communicator is unusable: later calls give
// FailedPrecondition. Not thread-safe (Communicator).
//
// Errors: InvalidArgument when `host` is null or not a host communicator,
// or `device` < 0 with kCuda; FailedPrecondition naming why when kind is
// kCuda and that device cannot be used (built without CUDA, no driver, no
// such device); Internal for other CUDA errors.
absl::StatusOr<std::unique_ptr<Communicator>> MakeHostStagedCommunicator(
    std::unique_ptr<Communicator> host, DeviceKind kind, int device = 0);

}  // namespace dlrm::comm
