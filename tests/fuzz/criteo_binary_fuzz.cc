// Fuzzes the binary Criteo reader (OpenCriteoBinary) over the input as a
// file, version 1 (bags derived from raw values) and version 2 (stored
// bags): a bad header, table list, size or column count must be
// InvalidArgument, and every batch it returns must pass Batch::Validate.
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "data/batch.h"
#include "data/criteo.h"
#include "tests/fuzz/fuzz_util.h"
#include "tests/fuzz/source_fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // The column counts the options expect come from the header when they
  // are small (so valid files get past the check and into the records),
  // else the Criteo default, which the header then contradicts.
  uint32_t num_dense = 13, num_sparse = 26;
  if (size >= 20) {
    uint32_t d, s;
    std::memcpy(&d, data + 12, sizeof(d));
    std::memcpy(&s, data + 16, sizeof(s));
    if (d <= 64 && s >= 1 && s <= 64) {
      num_dense = d;
      num_sparse = s;
    }
  }
  dlrm::data::CriteoOptions options;
  options.num_dense = static_cast<int>(num_dense);
  options.hash_ids = size % 2 == 1;
  for (uint32_t t = 0; t < num_sparse; ++t) {
    options.table_rows.push_back(t % 2 == 0 ? 1 + t : (int64_t{1} << 33));
    options.multi_hot_sizes.push_back(1 + static_cast<int>(t % 3));
  }
  // A version-2 file's table list (rows, multi-hot size) and hash flag give
  // the options where they are usable, so valid files reach the records.
  uint32_t version = 0, flags = 0;
  if (size >= 24) {
    std::memcpy(&version, data + 8, sizeof(version));
    std::memcpy(&flags, data + 20, sizeof(flags));
  }
  if (version == 2 && size >= 32 + 16 * size_t{num_sparse}) {
    options.hash_ids = (flags & 1) != 0;
    for (uint32_t t = 0; t < num_sparse; ++t) {
      uint64_t rows;
      uint32_t k;
      std::memcpy(&rows, data + 32 + 16 * t, sizeof(rows));
      std::memcpy(&k, data + 32 + 16 * t + 8, sizeof(k));
      if (rows >= 1 && rows <= (uint64_t{1} << 32) && k >= 1 && k <= 16) {
        options.table_rows[t] = static_cast<int64_t>(rows);
        options.multi_hot_sizes[t] = static_cast<int>(k);
      }
    }
  }

  dlrm::fuzz::MemFile file(data, size);
  auto source = dlrm::data::OpenCriteoBinary(file.path(), options);
  if (!source.ok()) {
    dlrm::fuzz::CheckInvalidArgument(source.status(),
                                     "a bad binary file is InvalidArgument");
    return 0;
  }
  dlrm::data::Batch batch;
  for (int epoch = 0; epoch < 2; ++epoch) {
    dlrm::fuzz::CheckOk((*source)->Rewind(), "Rewind");
    dlrm::fuzz::ReadToEnd(**source, 2, options,
                          "a bad record is InvalidArgument",
                          "a batch from the binary reader validates", batch);
  }
  return 0;
}
