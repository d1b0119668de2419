// Fuzzes the Criteo TSV reader: ParseCriteoLine on every line of the input,
// and the streaming reader (OpenCriteoTsv) over the input as a file. Every
// batch it returns must pass Batch::Validate: the reader promises ids in
// range, labels 0/1 and finite dense values.
#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "data/batch.h"
#include "data/criteo.h"
#include "tests/fuzz/fuzz_util.h"
#include "tests/fuzz/source_fuzz_util.h"

namespace {

// The first input byte picks the reader's options (column counts, table
// sizes, hashing, one-hot or multi-hot bags), so one corpus reaches every
// mode.
dlrm::data::CriteoOptions OptionsFrom(uint8_t byte) {
  dlrm::data::CriteoOptions options;
  options.hash_ids = (byte & 1) != 0;
  const bool small = (byte & 2) != 0;
  options.num_dense = small ? 2 : 13;
  const int num_sparse = small ? 3 : 26;
  for (int t = 0; t < num_sparse; ++t) {
    // 1 row, a few rows, and 2^32 rows (the converter's identity reduction).
    const int64_t rows = (byte & 4) != 0 ? (int64_t{1} << 32) : 1 + t * 7;
    options.table_rows.push_back(rows);
    // Multi-hot bags of 1..4 ids derived from each row.
    if ((byte & 8) != 0) options.multi_hot_sizes.push_back(1 + t % 4);
  }
  return options;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const dlrm::data::CriteoOptions options = OptionsFrom(data[0]);
  ++data;
  --size;
  const int num_sparse = static_cast<int>(options.table_rows.size());

  // Line by line, straight from memory.
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  dlrm::data::CriteoRecord record;
  size_t begin = 0;
  while (begin <= text.size()) {
    size_t end = text.find('\n', begin);
    if (end == std::string_view::npos) end = text.size();
    const std::string_view line = text.substr(begin, end - begin);
    if (dlrm::data::ParseCriteoLine(line, options.num_dense, num_sparse,
                                    "fuzz:1", &record)
            .ok()) {
      dlrm::fuzz::Check(record.label == 0.0f || record.label == 1.0f,
                        "parsed label is 0 or 1");
      dlrm::fuzz::Check(
          static_cast<int>(record.dense.size()) == options.num_dense &&
              static_cast<int>(record.cats.size()) == num_sparse,
          "parsed record has the requested column counts");
    }
    begin = end + 1;
  }

  // The streaming reader over the same bytes as a file, in small batches so
  // batch boundaries fall everywhere.
  dlrm::fuzz::MemFile file(data, size);
  auto source = dlrm::data::OpenCriteoTsv({file.path()}, options);
  dlrm::fuzz::CheckOk(source.status(), "OpenCriteoTsv of an existing file");
  dlrm::data::Batch batch;
  dlrm::fuzz::ReadToEnd(**source, 3, options,
                        "a malformed line is InvalidArgument",
                        "a batch from the TSV reader validates", batch);
  return 0;
}
