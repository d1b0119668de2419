// Small helpers of the step (model/model.cc):
// per-stage wall clocks, grow-only buffers, MLP widths from the config.
#pragma once

#include <google/protobuf/repeated_field.h>

#include <chrono>
#include <cstdint>
#include <vector>

namespace dlrm::model::internal {

// Charges wall time to the stages of a `Times` (a struct with an array
// `seconds` indexed by stage). Not thread-safe.
template <typename Times>
class StageClock {
 public:
  explicit StageClock(Times* times) : times_(times) { Restart(); }
  Times* times() const { return times_; }
  void Restart() { start_ = std::chrono::steady_clock::now(); }
  // Charges the time since the last mark (or start) to `stage`.
  void Mark(int stage) {
    const auto now = std::chrono::steady_clock::now();
    times_->seconds[stage] +=
        std::chrono::duration<double>(now - start_).count();
    start_ = now;
  }

 private:
  Times* times_;
  std::chrono::steady_clock::time_point start_;
};

// Grows `v` to at least `n` elements (never shrinks, so a step's buffers are
// reused) and returns its data.
template <typename Vec>
auto* Sized(Vec& v, int64_t n) {
  if (static_cast<int64_t>(v.size()) < n) v.resize(n);
  return v.data();
}

inline std::vector<int> Widths(
    const google::protobuf::RepeatedField<int32_t>& w) {
  return {w.begin(), w.end()};
}

}  // namespace dlrm::model::internal
