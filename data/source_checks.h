// What the BatchSource implementations share (data/source.h): the checks
// of Next's and Skip's arguments, and Skip by sample number.
#pragma once

#include <algorithm>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "data/batch.h"

namespace dlrm::data {

// For implementations of Next: `batch` reset to no samples of
// `num_dense` dense and `num_sparse` sparse features. InvalidArgument
// unless max_samples > 0.
inline absl::Status StartBatch(int num_dense, int num_sparse,
                               int64_t max_samples, Batch* batch) {
  batch->Reset(num_dense, num_sparse);
  if (max_samples <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_samples = ", max_samples, " must be positive"));
  }
  return absl::OkStatus();
}

// For implementations of Skip: InvalidArgument for n < 0.
inline absl::Status CheckSkip(int64_t n) {
  if (n < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot skip ", n, " samples"));
  }
  return absl::OkStatus();
}

// Skip of a source whose samples are numbered (a record index, a sample
// counter): moves *next on by up to n, to `count` at most; returns how
// far. InvalidArgument for n < 0.
inline absl::StatusOr<int64_t> SkipNumbered(int64_t n, int64_t count,
                                            int64_t* next) {
  if (absl::Status s = CheckSkip(n); !s.ok()) return s;
  n = std::min(n, count - *next);
  *next += n;
  return n;
}

}  // namespace dlrm::data
