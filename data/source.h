// BatchSource: where training and evaluation batches come from (Criteo TSV,
// the binary format, NumPy days, or the synthetic generator).
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
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

  // Moves past the next up to `n` samples without returning them; returns
  // how many it passed, fewer than `n` only at the end of the data. The
  // samples after them are those Next would return after reading these.
  // Skipped samples are not checked (a malformed TSV line passed over is
  // no error). The synthetic stream, the binary format and NumPy days skip
  // in O(1), Criteo TSV scans the lines without parsing them; this default
  // reads the samples with Next and drops them. InvalidArgument for n < 0;
  // reading errors as Next's.
  virtual absl::StatusOr<int64_t> Skip(int64_t n);
};

inline absl::StatusOr<int64_t> BatchSource::Skip(int64_t n) {
  if (n < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot skip ", n, " samples"));
  }
  constexpr int64_t kChunk = int64_t{1} << 16;
  Batch scratch;
  int64_t skipped = 0;
  while (skipped < n) {
    absl::StatusOr<bool> more = Next(std::min(n - skipped, kChunk), &scratch);
    if (!more.ok()) return more.status();
    if (!*more || scratch.size == 0) break;
    skipped += scratch.size;
  }
  return skipped;
}

}  // namespace dlrm::data
