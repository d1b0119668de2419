// The one kernel-launch helper (STYLE.md habit 2, FBGEMM's habit): checks
// the launch shape against the device limits that do not depend on the
// kernel, launches, and turns the launch error into a Status naming the
// kernel. Include only from .cu files.
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/cuda/launch_grid.h"

namespace dlrm::cuda {

// Launches kernel<<<grid, block, shared_bytes, stream>>>(args...). An empty
// grid (any dimension 0) launches nothing and is OK, so callers need not
// special-case empty batches. InvalidArgument for a block over 1024
// threads or a grid over CUDA's limits; Internal with `name` and CUDA's
// error string when the launch fails. Asynchronous faults surface at the
// next synchronising call.
template <typename... KernelArgs, typename... Args>
absl::Status LaunchKernel(const char* name, void (*kernel)(KernelArgs...),
                          dim3 grid, dim3 block, size_t shared_bytes,
                          cudaStream_t stream, Args&&... args) {
  if (grid.x == 0 || grid.y == 0 || grid.z == 0) return absl::OkStatus();
  const unsigned long long threads =
      static_cast<unsigned long long>(block.x) * block.y * block.z;
  if (threads == 0 || threads > 1024 || grid.y > 65535 || grid.z > 65535 ||
      grid.x > 2147483647u) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": launch shape grid (", grid.x, ",", grid.y, ",",
                     grid.z, ") block (", block.x, ",", block.y, ",", block.z,
                     ") is outside CUDA's limits"));
  }
  kernel<<<grid, block, shared_bytes, stream>>>(std::forward<Args>(args)...);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) {
    return absl::InternalError(
        absl::StrCat("launch of ", name, " failed: ", cudaGetErrorString(err)));
  }
  return absl::OkStatus();
}

}  // namespace dlrm::cuda
