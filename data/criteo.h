// Criteo click logs: the TSV format of the Kaggle display-advertising
// challenge (train.txt) and of the Terabyte days (day_N), and the binary
// pre-processed format this project converts them to.
//
// A TSV line is: label, 13 integer features, 26 categorical features as
// 8-digit hex, tab-separated; any feature may be empty. Dense values become
// log(1 + max(x, 0)); a categorical value v becomes row v % rows (or
// Mix64(v) % rows with hash_ids); an empty one is 0. Both formats hold one
// value per categorical column, so every bag the readers yield holds one id
// (TableConfig.multi_hot_size shapes synthetic data only).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "data/source.h"

namespace dlrm::data {

struct CriteoOptions {
  // Rows of each table, one per categorical column (26 for Criteo).
  // Default: empty (invalid; callers take it from the ModelConfig).
  std::vector<int64_t> table_rows;
  // Integer columns. Default: 13.
  int num_dense = 13;
  // Reduce categorical values by Mix64(v) % rows instead of v % rows.
  // Default: false (the DLRM reference's modulo).
  bool hash_ids = false;

  absl::Status Validate() const;
};

// One parsed sample with raw (unreduced) categorical values.
struct CriteoRecord {
  float label = 0;
  std::vector<float> dense;    // num_dense, transformed
  std::vector<uint32_t> cats;  // num_sparse raw 32-bit values
};

// Parses one TSV line (a trailing '\r' is allowed). InvalidArgument with
// `where` (e.g. "train.txt:17") and the column on a malformed line.
absl::Status ParseCriteoLine(std::string_view line, int num_dense,
                             int num_sparse, std::string_view where,
                             CriteoRecord* record);

// Row for a raw categorical value under `options`.
int64_t CriteoRow(uint32_t value, int64_t rows, bool hash_ids);

// Reads TSV files in order, one pass per epoch; blank lines are skipped.
// NotFound for a missing file (checked up front), InvalidArgument from Next
// for a malformed line, naming file and line; a later Next goes on after it.
absl::StatusOr<std::unique_ptr<BatchSource>> OpenCriteoTsv(
    std::vector<std::string> files, CriteoOptions options);

// Binary format: a 32-byte header (magic "DLRMBIN1", version, num_dense,
// num_sparse, record count) then fixed-width records of float label,
// float dense[num_dense] (transformed), uint32 cats[num_sparse] (raw).
// Converts TSV files to one binary file (written to a temporary file, then
// renamed, so `out_path` never holds a partial file); returns the record
// count. Errors as OpenCriteoTsv's, or naming `out_path` when writing fails.
absl::StatusOr<int64_t> ConvertCriteoTsvToBinary(
    const std::vector<std::string>& tsv_files, const std::string& out_path,
    int num_dense = 13, int num_sparse = 26);

// Memory-maps a binary file. InvalidArgument for a bad header, a size that
// does not match the record count, or a column count unlike `options`; from
// Next, InvalidArgument naming the file and record for a label other than
// 0 or 1 or a non-finite dense value (a later Next goes on after it).
absl::StatusOr<std::unique_ptr<BatchSource>> OpenCriteoBinary(
    const std::string& path, CriteoOptions options);

}  // namespace dlrm::data
