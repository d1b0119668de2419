// Checks and helpers shared by the device communicators.
#include "comm/cuda_args.h"

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "core/cuda_status.h"
#include "core/status.h"

namespace dlrm::comm::internal {

absl::Status CheckDeviceBuffer(const void* ptr, size_t bytes, int device,
                               absl::string_view what) {
  if (bytes == 0) return absl::OkStatus();
  if (ptr == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " is null but ", bytes, " bytes were asked for"));
  }
  cudaPointerAttributes attributes = {};
  const cudaError_t err = cudaPointerGetAttributes(&attributes, ptr);
  if (err != cudaSuccess) {
    cudaGetLastError();  // An argument error, not a kernel fault: clear it.
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": cudaPointerGetAttributes failed (",
                     cudaGetErrorString(err), "): not CUDA memory"));
  }
  if (attributes.type == cudaMemoryTypeManaged) return absl::OkStatus();
  if (attributes.type != cudaMemoryTypeDevice) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " is host memory; this communicator takes device buffers"));
  }
  if (attributes.device != device) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " is memory of CUDA device ", attributes.device,
                     "; this communicator uses device ", device));
  }
  return absl::OkStatus();
}

absl::Status CheckStreamDevice(cudaStream_t stream, int device,
                               absl::string_view what) {
  if (stream == cudaStreamLegacy || stream == cudaStreamPerThread) {
    return absl::OkStatus();
  }
  int stream_device = -1;
  const cudaError_t err = cudaStreamGetDevice(stream, &stream_device);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": cudaStreamGetDevice failed (",
                     cudaGetErrorString(err), "): not a usable stream"));
  }
  if (stream_device != device) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": the stream belongs to CUDA device ", stream_device,
        "; this communicator uses device ", device));
  }
  return absl::OkStatus();
}

absl::Status CheckSameOrDisjoint(const void* a, const void* b, size_t bytes,
                                 absl::string_view what) {
  const auto x = reinterpret_cast<uintptr_t>(a);
  const auto y = reinterpret_cast<uintptr_t>(b);
  if (bytes == 0 || x == y || x + bytes <= y || y + bytes <= x) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat(what,
                   ": send and recv overlap without being the same "
                   "buffer"));
}

absl::Status CheckDisjoint(const void* a, size_t a_bytes, const void* b,
                           size_t b_bytes, absl::string_view what) {
  const auto x = reinterpret_cast<uintptr_t>(a);
  const auto y = reinterpret_cast<uintptr_t>(b);
  if (a_bytes == 0 || b_bytes == 0 || x + a_bytes <= y || y + b_bytes <= x) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat(what, ": send and recv overlap"));
}

ScopedDevice::~ScopedDevice() {
  if (previous_ >= 0 && previous_ != current_) cudaSetDevice(previous_);
}

absl::Status ScopedDevice::Set(int device) {
  if (previous_ < 0) CUDA_RETURN_IF_ERROR(cudaGetDevice(&previous_));
  if (device != current_) {
    CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
    current_ = device;
  }
  return absl::OkStatus();
}

absl::StatusOr<cudaStream_t> ScopedDevice::SetForStream(int device,
                                                        void* stream) {
  RETURN_IF_ERROR(Set(device));
  cudaStream_t next = static_cast<cudaStream_t>(stream);
  if (next != nullptr) {
    RETURN_IF_ERROR(CheckStreamDevice(next, device, "SetStream"));
  }
  return next;
}

}  // namespace dlrm::comm::internal
