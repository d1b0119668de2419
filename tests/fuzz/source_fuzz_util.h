// Shared by the fuzz targets of the Criteo readers: reading a source to its
// end under the readers' promises.
#pragma once

#include <cstdint>

#include "data/batch.h"
#include "data/criteo.h"
#include "data/source.h"
#include "tests/fuzz/fuzz_util.h"

namespace dlrm::fuzz {

// Reads `source` into `batch` (reused, as a trainer does), `batch_size`
// samples a call, until it ends (at most 10000 calls): a refused batch must
// be InvalidArgument (`bad`), and the reader goes on after it; every batch
// read must validate against `options` (`valid`).
inline void ReadToEnd(data::BatchSource& source, int64_t batch_size,
                      const data::CriteoOptions& options, const char* bad,
                      const char* valid, data::Batch& batch) {
  for (int calls = 0; calls < 10000; ++calls) {
    auto more = source.Next(batch_size, &batch);
    if (!more.ok()) {
      CheckInvalidArgument(more.status(), bad);
      continue;
    }
    if (!*more) break;
    CheckOk(batch.Validate(options.num_dense, options.table_rows), valid);
  }
}

}  // namespace dlrm::fuzz
