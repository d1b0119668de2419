// RangeReader: reads given sample ranges of a BatchSource, in any order,
// moving between them with Skip and Rewind. Each rank of a dataset job reads
// its own share of every global batch through one (docs/server.md "Dataset
// jobs on several ranks").
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "data/source.h"

namespace dlrm::data {

// Not thread-safe.
class RangeReader {
 public:
  // Takes ownership of `source`, which must stand at its first sample (just
  // opened or rewound). Empty reads give batches of `num_dense` dense and
  // `num_sparse` sparse features. `name` (its file, say) starts the
  // messages of errors that the source's own do not cover.
  RangeReader(std::unique_ptr<BatchSource> source, int num_dense,
              int num_sparse, std::string name);

  // Replaces `batch` with samples [begin, begin + count) of the data. A
  // range at or after the end of the last one read is reached with Skip
  // (see BatchSource::Skip for its cost); one before it rewinds the source
  // first. InvalidArgument for a negative begin or count; OutOfRange when
  // the data ends before begin + count; the source's reading errors, which
  // name the file and place (then the next Read starts from the first
  // sample again).
  absl::Status Read(int64_t begin, int64_t count, Batch* batch);

 private:
  std::unique_ptr<BatchSource> source_;
  const int num_dense_;
  const int num_sparse_;
  const std::string name_;
  // The sample the source's Next returns next; -1 after an error.
  int64_t position_ = 0;
  Batch more_;  // the rest of a range that one Next did not fill
};

}  // namespace dlrm::data
