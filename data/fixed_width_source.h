// The base of the readers of fixed-width samples (the binary format's
// records, NumPy days' rows; criteo_binary.cc, criteo_npy.cc): samples are
// numbered 0 to count - 1 and read by number, so Rewind and Skip move the
// number, and every batch has the same bags of each table.
#pragma once

#include <algorithm>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "data/criteo.h"
#include "data/source.h"
#include "data/source_checks.h"

namespace dlrm::data {

class FixedWidthSource : public BatchSource {
 public:
  absl::Status Rewind() override {
    next_ = 0;
    return absl::OkStatus();
  }

  // Fixed-width samples: skipping moves the sample number.
  absl::StatusOr<int64_t> Skip(int64_t n) override {
    return SkipNumbered(n, count_, &next_);
  }

 protected:
  // Next's start: `batch` sized for n = min(max_samples, count_ - next_)
  // samples of `options`' shape (labels, dense features, and every table's
  // n bags of MultiHotSize ids with their offsets filled); returns n, 0 at
  // the end of the data. InvalidArgument unless max_samples > 0.
  absl::StatusOr<int64_t> StartFixedBatch(const CriteoOptions& options,
                                          int64_t max_samples, Batch* batch) {
    const int num_dense = options.num_dense;
    const int num_sparse = static_cast<int>(options.table_rows.size());
    if (absl::Status s = StartBatch(num_dense, num_sparse, max_samples, batch);
        !s.ok()) {
      return s;
    }
    const int64_t n = std::min(max_samples, count_ - next_);
    if (n <= 0) return 0;
    batch->size = n;
    batch->labels.resize(n);
    batch->dense.resize(n * num_dense);
    for (int t = 0; t < num_sparse; ++t) {
      SparseFeature& f = batch->sparse[t];
      const int k = options.MultiHotSize(t);
      f.offsets.resize(n + 1);
      for (int64_t s = 0; s <= n; ++s) f.offsets[s] = s * k;
      f.ids.resize(n * k);
    }
    return n;
  }

  // Samples in the data, and the number of the next one Next returns.
  int64_t count_ = 0;
  int64_t next_ = 0;
};

}  // namespace dlrm::data
