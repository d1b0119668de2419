// BatchSource: where training and evaluation batches come from (Criteo TSV,
// the binary format, or the synthetic generator).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "data/batch.h"

namespace dlrm::data {

// A stream of samples. Not thread-safe: one consumer at a time.
class BatchSource {
 public:
  virtual ~BatchSource() = default;

  // Replaces `batch` with the next up to `max_samples` samples. Returns false
  // (and an empty batch) at the end of the data; the last batch may be
  // short. Errors name the file and line or record where reading failed.
  virtual absl::StatusOr<bool> Next(int64_t max_samples, Batch* batch) = 0;

  // Starts again from the first sample (the next epoch).
  virtual absl::Status Rewind() = 0;
};

}  // namespace dlrm::data
