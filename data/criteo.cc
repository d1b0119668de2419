// Criteo TSV parsing and the streaming TSV BatchSource. The parser is on the
// hot path of every TSV epoch, so it never allocates: fields are views into
// the read buffer and numbers go through std::from_chars.
#include "data/criteo.h"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/escape.h"
#include "core/random.h"
#include "core/status.h"
#include "data/multi_hot.h"
#include "data/source_checks.h"

namespace dlrm::data {
namespace {

// Longest field text quoted back in an error message, in bytes. The
// server opens only files in the directories its operator allowed
// (server/datasets.h); even so a message quotes no more of a file than
// this, escaped, so it can neither carry a line of a file out whole nor
// put control bytes into a client's terminal or a log.
constexpr size_t kMaxQuoted = 32;

std::string Quote(std::string_view field) {
  if (field.size() <= kMaxQuoted) {
    return absl::StrCat("'", EscapeForMessage(field), "'");
  }
  return absl::StrCat("'", EscapeForMessage(field.substr(0, kMaxQuoted)),
                      "...'");
}

std::string ColumnName(int column, int num_dense) {
  if (column == 0) return "column 0 (label)";
  if (column <= num_dense) {
    return absl::StrCat("column ", column, " (dense ", column - 1, ")");
  }
  return absl::StrCat("column ", column, " (categorical ",
                      column - 1 - num_dense, ")");
}

absl::Status FieldError(std::string_view where, int column, int num_dense,
                        std::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(std::string(where), ": ",
                                                 ColumnName(column, num_dense),
                                                 ": ", std::string(what)));
}

// Reads a file in large chunks and hands out lines as views into its buffer.
// A view stays valid until the next call.
class LineReader {
 public:
  LineReader() = default;
  LineReader(const LineReader&) = delete;
  LineReader& operator=(const LineReader&) = delete;
  ~LineReader() { Close(); }

  absl::Status Open(const std::string& path) {
    Close();
    file_ = std::fopen(path.c_str(), "rb");
    if (file_ == nullptr) {
      return absl::NotFoundError(absl::StrCat(
          "cannot open Criteo TSV file ", path, ": ", std::strerror(errno)));
    }
    path_ = path;
    if (buffer_.size() < kChunk) buffer_.resize(kChunk);
    begin_ = end_ = 0;
    eof_ = false;
    return absl::OkStatus();
  }

  void Close() {
    if (file_ != nullptr) std::fclose(file_);
    file_ = nullptr;
  }

  // Sets *line to the next line without its '\n'; false at end of file.
  absl::StatusOr<bool> NextLine(std::string_view* line) {
    while (true) {
      const char* start = buffer_.data() + begin_;
      const void* newline = std::memchr(start, '\n', end_ - begin_);
      if (newline != nullptr) {
        const size_t len = static_cast<const char*>(newline) - start;
        *line = std::string_view(start, len);
        begin_ += len + 1;
        return true;
      }
      if (eof_) {
        if (begin_ == end_) return false;
        *line = std::string_view(start, end_ - begin_);
        begin_ = end_;
        return true;
      }
      RETURN_IF_ERROR(Fill());
    }
  }

 private:
  static constexpr size_t kChunk = size_t{1} << 22;

  // Moves the partial line to the front and reads more after it.
  absl::Status Fill() {
    std::memmove(buffer_.data(), buffer_.data() + begin_, end_ - begin_);
    end_ -= begin_;
    begin_ = 0;
    if (end_ == buffer_.size()) buffer_.resize(buffer_.size() * 2);
    const size_t got =
        std::fread(buffer_.data() + end_, 1, buffer_.size() - end_, file_);
    if (got == 0) {
      if (std::ferror(file_)) {
        return absl::DataLossError(
            absl::StrCat("error reading ", path_, ": ", std::strerror(errno)));
      }
      eof_ = true;
    }
    end_ += got;
    return absl::OkStatus();
  }

  std::FILE* file_ = nullptr;
  std::string path_;
  std::vector<char> buffer_;
  size_t begin_ = 0;
  size_t end_ = 0;
  bool eof_ = false;
};

class CriteoTsvSource final : public BatchSource {
 public:
  CriteoTsvSource(std::vector<std::string> files, CriteoOptions options)
      : files_(std::move(files)), options_(std::move(options)) {
    record_.dense.reserve(options_.num_dense);
    record_.cats.reserve(options_.table_rows.size());
  }

  absl::Status Rewind() override {
    file_index_ = 0;
    line_number_ = 0;
    return reader_.Open(files_[0]);
  }

  absl::StatusOr<bool> Next(int64_t max_samples, Batch* batch) override {
    const int num_sparse = static_cast<int>(options_.table_rows.size());
    RETURN_IF_ERROR(
        StartBatch(options_.num_dense, num_sparse, max_samples, batch));
    std::string_view line;
    while (batch->size < max_samples) {
      ASSIGN_OR_RETURN(bool more, NextLine(&line));
      if (!more) break;
      ++line_number_;
      // Blank lines (e.g. a stray one at the end of a file) carry no sample.
      if (line.empty() || line == "\r") continue;
      RETURN_IF_ERROR(ParseCriteoLine(line, options_.num_dense, num_sparse,
                                      Where(), &record_));
      AppendCriteoRecord(record_, options_, batch);
    }
    return batch->size > 0;
  }

  // Lines hold samples of any length, so skipping reads them: a memchr per
  // line for its end and no parsing. Blank lines count as Next counts them
  // (not at all).
  absl::StatusOr<int64_t> Skip(int64_t n) override {
    RETURN_IF_ERROR(CheckSkip(n));
    std::string_view line;
    int64_t skipped = 0;
    while (skipped < n) {
      ASSIGN_OR_RETURN(bool more, NextLine(&line));
      if (!more) break;
      ++line_number_;
      if (line.empty() || line == "\r") continue;
      ++skipped;
    }
    return skipped;
  }

 private:
  // The next line of the current file, moving on to later files at the end
  // of each; false after the last line of the last file.
  absl::StatusOr<bool> NextLine(std::string_view* line) {
    while (true) {
      ASSIGN_OR_RETURN(bool more, reader_.NextLine(line));
      if (more) return true;
      if (file_index_ + 1 >= files_.size()) return false;
      ++file_index_;
      line_number_ = 0;
      RETURN_IF_ERROR(reader_.Open(files_[file_index_]));
    }
  }

  // "file:line" of the current line, built in a reused buffer so a line
  // costs no allocation.
  std::string_view Where() {
    where_.assign(files_[file_index_]);
    where_.push_back(':');
    char digits[24];
    const auto r = std::to_chars(digits, digits + sizeof(digits), line_number_);
    where_.append(digits, r.ptr);
    return where_;
  }

  const std::vector<std::string> files_;
  const CriteoOptions options_;
  std::string where_;
  LineReader reader_;
  size_t file_index_ = 0;
  int64_t line_number_ = 0;
  CriteoRecord record_;
};

}  // namespace

absl::Status CriteoOptions::Validate() const {
  if (table_rows.empty()) {
    return absl::InvalidArgumentError(
        "CriteoOptions.table_rows is empty; take it from the ModelConfig");
  }
  for (size_t t = 0; t < table_rows.size(); ++t) {
    if (table_rows[t] <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("CriteoOptions.table_rows[", t, "] = ", table_rows[t],
                       " must be positive"));
    }
  }
  if (num_dense < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CriteoOptions.num_dense = ", num_dense, " must not be negative"));
  }
  if (!dynamic.empty() && dynamic.size() != table_rows.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CriteoOptions.dynamic has ", dynamic.size(), " entries, table_rows ",
        table_rows.size(), " (one per table)"));
  }
  if (!multi_hot_sizes.empty() && multi_hot_sizes.size() != table_rows.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CriteoOptions.multi_hot_sizes has ", multi_hot_sizes.size(),
        " entries, table_rows ", table_rows.size(), " (one per table)"));
  }
  for (size_t t = 0; t < multi_hot_sizes.size(); ++t) {
    if (multi_hot_sizes[t] < 1 || multi_hot_sizes[t] > kMaxMultiHotSize) {
      return absl::InvalidArgumentError(absl::StrCat(
          "CriteoOptions.multi_hot_sizes[", t, "] = ", multi_hot_sizes[t],
          " must be in [1, ", kMaxMultiHotSize, "]"));
    }
  }
  return absl::OkStatus();
}

CriteoOptions CriteoOptionsForModel(const ModelConfig& config, bool hash_ids) {
  CriteoOptions options;
  options.num_dense = config.num_dense_features();
  options.hash_ids = hash_ids;
  for (const TableConfig& t : config.tables()) {
    options.table_rows.push_back(t.rows());
    options.multi_hot_sizes.push_back(std::max(t.multi_hot_size(), 1));
    options.dynamic.push_back(t.dynamic());
  }
  return options;
}

absl::Status ParseCriteoLine(std::string_view line, int num_dense,
                             int num_sparse, std::string_view where,
                             CriteoRecord* record) {
  if (num_dense < 0 || num_sparse < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        std::string(where), ": num_dense = ", num_dense,
        " and num_sparse = ", num_sparse, " must not be negative"));
  }
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  const int num_columns = 1 + num_dense + num_sparse;
  record->dense.resize(num_dense);
  record->cats.resize(num_sparse);
  const char* p = line.data();
  const char* const end = p + line.size();
  for (int column = 0; column < num_columns; ++column) {
    if (column > 0) {
      if (p == end) {
        return absl::InvalidArgumentError(
            absl::StrCat(std::string(where), ": line has ", column,
                         " columns, expected ", num_columns));
      }
      ++p;  // the tab that ended the previous field
    }
    const char* tab = static_cast<const char*>(std::memchr(p, '\t', end - p));
    const char* field_end = tab == nullptr ? end : tab;
    const std::string_view field(p, field_end - p);
    if (column == 0) {
      if (field == "0") {
        record->label = 0.0f;
      } else if (field == "1") {
        record->label = 1.0f;
      } else {
        return FieldError(
            where, column, num_dense,
            absl::StrCat("label ", Quote(field), " must be 0 or 1"));
      }
    } else if (column <= num_dense) {
      int64_t value = 0;
      if (!field.empty()) {
        const auto [ptr, ec] = std::from_chars(p, field_end, value);
        if (ec != std::errc() || ptr != field_end) {
          return FieldError(where, column, num_dense,
                            absl::StrCat("bad integer ", Quote(field)));
        }
      }
      record->dense[column - 1] = static_cast<float>(
          std::log1p(static_cast<double>(std::max<int64_t>(value, 0))));
    } else {
      uint32_t value = 0;
      if (!field.empty()) {
        std::from_chars_result r{};
        if (field.size() <= 8) r = std::from_chars(p, field_end, value, 16);
        if (field.size() > 8 || r.ec != std::errc() || r.ptr != field_end) {
          return FieldError(where, column, num_dense,
                            absl::StrCat("bad categorical ", Quote(field),
                                         " (expected up to 8 hex digits)"));
        }
      }
      record->cats[column - 1 - num_dense] = value;
    }
    p = field_end;
  }
  if (p != end) {
    const int64_t extra = std::count(p, end, '\t');
    return absl::InvalidArgumentError(
        absl::StrCat(std::string(where), ": line has ", num_columns + extra,
                     " columns, expected ", num_columns));
  }
  return absl::OkStatus();
}

void CriteoIdMap::Bag(int64_t id, int size, uint64_t seed, int64_t* out) const {
  if (dynamic_) {
    DeriveDynamicMultiHotBag(id, size, seed, out);
  } else {
    DeriveMultiHotBag(id, static_cast<int64_t>(rows_), size, seed, out);
  }
}

int64_t CriteoRow(uint32_t value, int64_t rows, bool hash_ids) {
  const uint64_t v = hash_ids ? Mix64(value) : value;
  return static_cast<int64_t>(v % static_cast<uint64_t>(rows));
}

void AppendCriteoRecord(const CriteoRecord& record,
                        const CriteoOptions& options, Batch* batch) {
  batch->labels.push_back(record.label);
  batch->dense.insert(batch->dense.end(), record.dense.begin(),
                      record.dense.end());
  const int num_sparse = static_cast<int>(options.table_rows.size());
  for (int t = 0; t < num_sparse; ++t) {
    SparseFeature& f = batch->sparse[t];
    const int64_t rows = options.table_rows[t];
    const bool dynamic = options.Dynamic(t);
    const int64_t id = dynamic
                           ? CriteoRawId(record.cats[t], options.hash_ids)
                           : CriteoRow(record.cats[t], rows, options.hash_ids);
    const int k = options.MultiHotSize(t);
    if (k == 1) {
      f.ids.push_back(id);
    } else {
      const size_t at = f.ids.size();
      f.ids.resize(at + k);
      if (dynamic) {
        DeriveDynamicMultiHotBag(id, k, MultiHotTableSeed(t),
                                 f.ids.data() + at);
      } else {
        DeriveMultiHotBag(id, rows, k, MultiHotTableSeed(t), f.ids.data() + at);
      }
    }
    f.offsets.push_back(static_cast<int64_t>(f.ids.size()));
  }
  ++batch->size;
}

absl::StatusOr<std::unique_ptr<BatchSource>> OpenCriteoTsv(
    std::vector<std::string> files, CriteoOptions options) {
  RETURN_IF_ERROR(options.Validate());
  if (files.empty()) {
    return absl::InvalidArgumentError("no Criteo TSV files given");
  }
  // Fail before the first epoch rather than in the middle of one.
  for (const std::string& file : files) {
    std::FILE* f = std::fopen(file.c_str(), "rb");
    if (f == nullptr) {
      return absl::NotFoundError(absl::StrCat(
          "cannot open Criteo TSV file ", file, ": ", std::strerror(errno)));
    }
    std::fclose(f);
  }
  auto source =
      std::make_unique<CriteoTsvSource>(std::move(files), std::move(options));
  RETURN_IF_ERROR(source->Rewind());
  return std::unique_ptr<BatchSource>(std::move(source));
}

}  // namespace dlrm::data
