// Criteo click logs: the TSV format of the Kaggle display-advertising
// challenge (train.txt) and of the Terabyte days (day_N), the binary
// pre-processed format this project converts them to, and the NumPy days
// TorchRec and MLPerf DLRM-DCNv2 pre-process them into.
//
// A TSV line is: label, 13 integer features, 26 categorical features as
// 8-digit hex, tab-separated; any feature may be empty. Dense values become
// log(1 + max(x, 0)); a categorical value v becomes row v % rows (or
// Mix64(v) % rows with hash_ids) of a static table, and for a dynamic table
// (TableConfig.dynamic) the raw id v itself (or Mix64(v) in 63 bits with
// hash_ids: DynamicId), never reduced; an empty one is 0. A TSV line and a
// version-1 binary record hold one value per categorical column: a table
// whose multi-hot size k is 1 gets that id as its bag, a larger k the
// bag of k ids data/multi_hot.h derives from it (for a dynamic table from
// the raw id, without a modulo). A version-2 binary file holds the derived
// bags themselves.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "core/random.h"
#include "data/batch.h"
#include "data/row_reducer.h"
#include "data/source.h"
#include "dlrm/config.pb.h"

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
  // Ids per bag of each table, one per categorical column, each in
  // [1, kMaxMultiHotSize]: a table of size k > 1 gets, for one-hot row v,
  // the bag of k ids data/multi_hot.h derives (v first).
  // Default: empty (1 for every table: one id per bag).
  std::vector<int> multi_hot_sizes;
  // Per table, one per categorical column: true for a dynamic table
  // (TableConfig.dynamic), whose ids are raw ids, never reduced % rows.
  // Default: empty (every table static).
  std::vector<bool> dynamic;

  // Whether table `table` is dynamic: dynamic[table], or false when empty.
  bool Dynamic(int table) const { return !dynamic.empty() && dynamic[table]; }

  // Ids per bag of table `table`: multi_hot_sizes[table], or 1 when empty.
  int MultiHotSize(int table) const {
    return multi_hot_sizes.empty() ? 1 : multi_hot_sizes[table];
  }

  // True when some table's bags hold more than one id.
  bool AnyMultiHot() const {
    for (int k : multi_hot_sizes) {
      if (k > 1) return true;
    }
    return false;
  }

  absl::Status Validate() const;
};

// Options for reading Criteo data into `config`'s model: its
// num_dense_features, and per table its rows, multi_hot_size (0 counts as
// 1; multi_hot_distribution shapes synthetic data only, Criteo bags always
// hold exactly multi_hot_size ids) and whether it is dynamic.
CriteoOptions CriteoOptionsForModel(const ModelConfig& config, bool hash_ids);

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

// Row of a static table for a raw categorical value: value % rows, or
// Mix64(value) % rows with hash_ids.
int64_t CriteoRow(uint32_t value, int64_t rows, bool hash_ids);

// Raw id of a dynamic table for a raw categorical value: DynamicId(value)
// (the value itself below 2^63 - 1), or DynamicId(Mix64(value)) with
// hash_ids. Never reduced % rows.
inline int64_t CriteoRawId(uint64_t value, bool hash_ids) {
  return DynamicId(hash_ids ? Mix64(value) : value);
}

// A raw categorical value's id in one table, as every reader gives it: a
// static table's CriteoRow (by RowReducer, no hardware divide), a dynamic
// table's CriteoRawId. Bag derives the multi-hot bag of such an id
// (data/multi_hot.h). Requires rows > 0.
class CriteoIdMap {
 public:
  CriteoIdMap(int64_t rows, bool hash_ids, bool dynamic)
      : rows_(static_cast<uint64_t>(rows)),
        reducer_(rows),
        hash_(hash_ids),
        dynamic_(dynamic) {}
  CriteoIdMap(const CriteoOptions& options, int table)
      : CriteoIdMap(options.table_rows[table], options.hash_ids,
                    options.Dynamic(table)) {}

  int64_t operator()(uint64_t value) const {
    if (dynamic_) return CriteoRawId(value, hash_);
    if (hash_) return static_cast<int64_t>(Mix64(value) % rows_);
    return reducer_(value);
  }

  // Writes the `size` ids of id `id`'s bag to out[0 .. size) (`size` >= 1).
  void Bag(int64_t id, int size, uint64_t seed, int64_t* out) const;

 private:
  uint64_t rows_;
  RowReducer reducer_;
  bool hash_;
  bool dynamic_;
};

// Appends `record` (as ParseCriteoLine fills it, with options.num_dense dense
// values and one raw value per table) to `batch` as one sample: its label,
// dense values and per table the bag of options.MultiHotSize(t) ids derived
// from its id (CriteoIdMap). `batch` is shaped for `options` (Reset) and
// `options` valid.
void AppendCriteoRecord(const CriteoRecord& record,
                        const CriteoOptions& options, Batch* batch);

// Reads TSV files in order, one pass per epoch; blank lines are skipped.
// NotFound for a missing file (checked up front), InvalidArgument from Next
// for a malformed line, naming file and line; a later Next goes on after it.
absl::StatusOr<std::unique_ptr<BatchSource>> OpenCriteoTsv(
    std::vector<std::string> files, CriteoOptions options);

// Binary format, little-endian: a 32-byte header (magic "DLRMBIN1",
// uint32 version, num_dense, num_sparse, flags, uint64 record count), then
// - version 1: fixed-width records of float label, float dense[num_dense]
//   (transformed), uint32 cats[num_sparse] (raw values; rows, hashing and
//   multi-hot bags are applied when reading, so one file serves any config);
// - version 2 (materialised multi-hot bags): after the header one 16-byte
//   entry per table (uint64 rows, uint32 multi-hot size k, uint32 0), then
//   fixed-width records of float label, float dense[num_dense], and per
//   table its k uint32 ids (rows of that table, the bag as the readers
//   derive it). A dynamic table's entry records rows 0 ("raw": its ids are
//   not reduced) and its k ids are uint64 raw ids. Flags bit 0: the first
//   ids were reduced (or, raw, hashed) with hash_ids. Version 1 has flags 0
//   and serves static and dynamic tables alike.
//
// Converts TSV files to one version-1 binary file (written to a temporary
// file, then renamed, so `out_path` never holds a partial file); returns the
// record count. Errors as OpenCriteoTsv's, or naming `out_path` when writing
// fails.
absl::StatusOr<int64_t> ConvertCriteoTsvToBinary(
    const std::vector<std::string>& tsv_files, const std::string& out_path,
    int num_dense = 13, int num_sparse = 26);

// Converts TSV files to one version-2 binary file holding the bags that
// OpenCriteoTsv(tsv_files, options) yields, written as above (a dynamic
// table's raw ids as uint64); returns the record count. InvalidArgument for
// invalid options or a static table of more than 2^32 rows (its ids do not
// fit the format), naming the table; other errors as
// ConvertCriteoTsvToBinary's.
absl::StatusOr<int64_t> ConvertCriteoTsvToMultiHotBinary(
    const std::vector<std::string>& tsv_files, const std::string& out_path,
    const CriteoOptions& options);

// Memory-maps a binary file of either version. InvalidArgument for a bad
// header, a size that does not match the record count, or a column count
// unlike `options`; for version 2 also for a table whose rows, multi-hot
// size or hashing differ from `options`, or whose ids are raw where the
// options' table is static or reduced where it is dynamic (naming the
// table). From Next, InvalidArgument naming the file and record for a label
// other than 0 or 1, a non-finite dense value or (version 2) an id outside
// its table (a raw id not below 2^63 - 1) (a later Next goes on after it).
absl::StatusOr<std::unique_ptr<BatchSource>> OpenCriteoBinary(
    const std::string& path, CriteoOptions options);

// TorchRec's pre-processed Criteo days (torchrec/datasets/criteo.py,
// BinaryCriteoUtils): per day PREFIX_dense.npy (float32, N x num_dense,
// already transformed: TorchRec writes log(x + 3)), PREFIX_labels.npy (N x 1
// or N, any integer, bool or float type holding 0 or 1) and either
// PREFIX_sparse.npy (N x num_sparse integers, one value per table) or, as
// MLPerf DLRM-DCNv2's materialised multi-hot data,
// PREFIX_sparse_multi_hot.npz (member "t" or "arr_t" per table t, each
// N x k_t integers: the bags). A value becomes a row as in the TSV reader:
// its bits as an unsigned integer of its width (an int32 -1 is 0xffffffff,
// the hex value TorchRec's int32 wrapped) reduced v % rows, or
// Mix64(v) % rows with hash_ids; a one-hot table of multi-hot size k > 1
// gets the bag data/multi_hot.h derives from that row. An .npz bag's ids
// are each reduced the same way (a no-op for MLPerf's, already in range).
// A dynamic table takes each value as its raw id instead (CriteoRawId: the
// value, or with hash_ids Mix64(v), in 63 bits), never reduced % rows.
struct CriteoNpyDay {
  std::string dense;
  std::string sparse;  // .npy (one-hot) or .npz (multi-hot bags)
  std::string labels;
};

// True when `paths` name NumPy days rather than TSV or binary files: every
// path ends in .npy or .npz, or is no file itself while PATH_dense.npy is.
bool IsCriteoNpy(const std::vector<std::string>& paths);

// The days that `paths` name, in order of first mention. A path ending in
// _dense.npy, _labels.npy, _sparse.npy or _sparse_multi_hot.npz names that
// file of its day: it joins the latest day of the same file-name prefix
// (day_0) that lacks that file, in any directory, else starts a day. Any
// other path is a day prefix (DIR/day_0), a day of its own. A day's files
// not named take the prefix's directory (or its first file's); a sparse
// file not named is PREFIX_sparse_multi_hot.npz when `prefer_multi_hot`
// and that exists, else PREFIX_sparse.npy when that exists, else the .npz.
// InvalidArgument for an empty list or another .npy/.npz name, naming it;
// NotFound naming the first file of a day that is missing.
absl::StatusOr<std::vector<CriteoNpyDay>> FindCriteoNpyDays(
    const std::vector<std::string>& paths, bool prefer_multi_hot);

// Memory-maps the days' files and reads them in order, one pass per epoch
// (a batch may span two days). Errors from opening, naming the file: those
// of OpenNpy / OpenNpz, and InvalidArgument for invalid options, a dense
// file not float32/float64 of num_dense columns, labels not one column,
// sparse values not integers or not num_sparse columns (members), an .npz
// bag width unlike options.MultiHotSize(t) (naming the member and the
// table), or files of one day with different row counts. From Next,
// InvalidArgument naming the file and row for a label other than 0 or 1 or
// a non-finite dense value (a later Next goes on after it).
absl::StatusOr<std::unique_ptr<BatchSource>> OpenCriteoNpy(
    std::vector<CriteoNpyDay> days, CriteoOptions options);

// Converts NumPy days to one version-1 binary file (raw values, as
// ConvertCriteoTsvToBinary writes them); returns the record count. The
// sparse files must be one-hot .npy of at most 32-bit integers
// (InvalidArgument naming the file otherwise: convert wider ids or .npz
// bags with ConvertCriteoNpyToMultiHotBinary). Errors as OpenCriteoNpy's
// and as the TSV conversion's for writing.
absl::StatusOr<int64_t> ConvertCriteoNpyToBinary(
    const std::vector<CriteoNpyDay>& days, const std::string& out_path,
    int num_dense = 13, int num_sparse = 26);

// Converts NumPy days to one version-2 binary file holding the bags that
// OpenCriteoNpy(days, options) yields; errors as
// ConvertCriteoTsvToMultiHotBinary's and OpenCriteoNpy's.
absl::StatusOr<int64_t> ConvertCriteoNpyToMultiHotBinary(
    const std::vector<CriteoNpyDay>& days, const std::string& out_path,
    const CriteoOptions& options);

// The record count in a binary file's header (either version). NotFound for
// a missing file, PermissionDenied for one that cannot be opened otherwise,
// InvalidArgument for one shorter than the header or with a bad magic.
absl::StatusOr<int64_t> ReadCriteoBinaryCount(const std::string& path);

}  // namespace dlrm::data
