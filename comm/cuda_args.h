// Checks and helpers shared by the device communicators (built with CUDA
// only): every device collective refuses host memory and memory of another
// device with the same InvalidArgument, and runs with its device current.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dlrm::comm::internal {

// InvalidArgument, naming `what`, unless `ptr` is device memory of CUDA
// device `device` or managed memory; nothing is checked when `bytes` is 0.
absl::Status CheckDeviceBuffer(const void* ptr, size_t bytes, int device,
                               absl::string_view what);

// InvalidArgument, naming `what`, unless `stream` is a stream of CUDA device
// `device` (or one of the special handles cudaStreamLegacy and
// cudaStreamPerThread, which name the current device's).
absl::Status CheckStreamDevice(cudaStream_t stream, int device,
                               absl::string_view what);

// InvalidArgument, naming `what`, when the `bytes`-long ranges at `a` and
// `b` overlap without being the same range (a device copy cannot move
// within overlapping ranges, and the same range needs no copy).
absl::Status CheckSameOrDisjoint(const void* a, const void* b, size_t bytes,
                                 absl::string_view what);

// InvalidArgument, naming `what`, when [a, a + a_bytes) and
// [b, b + b_bytes) overlap: NCCL's point-to-point exchange may overwrite
// input that is still to be sent.
absl::Status CheckDisjoint(const void* a, size_t a_bytes, const void* b,
                           size_t b_bytes, absl::string_view what);

// Makes a device current for the calling thread and restores the previous
// one when destroyed: the current device is per thread, and the caller's
// may differ from the communicator's. Not copyable.
class ScopedDevice {
 public:
  ScopedDevice() = default;
  ScopedDevice(const ScopedDevice&) = delete;
  ScopedDevice& operator=(const ScopedDevice&) = delete;
  ~ScopedDevice();

  // Internal naming the call when CUDA refuses.
  absl::Status Set(int device);
  // The start of a device communicator's SetStream: Set(device), then
  // `stream` as a cudaStream_t (null: the communicator's own), checked to
  // be a stream of `device` (CheckStreamDevice, naming SetStream).
  absl::StatusOr<cudaStream_t> SetForStream(int device, void* stream);

 private:
  int previous_ = -1;
  int current_ = -1;
};

}  // namespace dlrm::comm::internal
