// The monotonic clock in seconds, for durations and periods.
#pragma once

#include <chrono>

namespace dlrm {

// Seconds on std::chrono::steady_clock since its arbitrary epoch: only the
// difference of two readings means anything.
inline double MonotonicSeconds() {
  return std::chrono::duration<double>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace dlrm
