// A BatchSource over batches generated beforehand, cycled: benchmarks feed
// the same batches to a server and to an in-process model without paying
// for generation inside the timed loop.
#pragma once

#include <cstdint>
#include <vector>

#include "data/source.h"

namespace dlrm::data {

// Yields `count` batches: batches[0], batches[1], ... in rotation. Not
// thread-safe.
class RotatingSource final : public BatchSource {
 public:
  // `batches` (non-empty) is borrowed and must outlive the source.
  RotatingSource(const std::vector<Batch>* batches, int64_t count)
      : batches_(batches), count_(count) {}

  // InvalidArgument when the next batch holds more than `max_samples`
  // (batches are not split).
  absl::StatusOr<bool> Next(int64_t max_samples, Batch* batch) override;
  absl::Status Rewind() override;

 private:
  const std::vector<Batch>* batches_;
  const int64_t count_;
  int64_t next_ = 0;
};

}  // namespace dlrm::data
