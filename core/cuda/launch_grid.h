// Launch-grid arithmetic of the CUDA kernels: plain 64-bit C++ with no CUDA
// header, so CPU tests check it (core_test's LaunchGridTest); the .cu files
// get it through core/cuda/launch.cuh.
#pragma once

#include <algorithm>
#include <cstdint>

namespace dlrm::cuda {

// Ceiling of a / b for a >= 0 and b > 0, without the overflow of
// (a + b - 1) / b when a is near the type's maximum.
template <typename T>
constexpr T CeilDiv(T a, T b) {
  return a / b + (a % b > 0 ? 1 : 0);
}

// The largest grid.x a launch may have (2^31 - 1).
constexpr int64_t kMaxGridX = 2147483647;

// Blocks of `threads` threads (> 0) giving each of `count` x `per` items a
// thread, at most `max_blocks` (kernels with a grid-stride loop cover the
// rest); 0 when there is no item. The product is never formed when it
// would exceed max_blocks x threads, so it cannot overflow.
constexpr int64_t GridBlocks(int64_t count, int64_t per, int64_t threads,
                             int64_t max_blocks = kMaxGridX) {
  if (count <= 0 || per <= 0) return 0;
  const int64_t most = max_blocks * threads;
  if (count > most / per) return max_blocks;
  return std::min(CeilDiv(count * per, threads), max_blocks);
}

}  // namespace dlrm::cuda
