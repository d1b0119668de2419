// The binary Criteo format (version 1: raw one-hot values; version 2:
// materialised multi-hot bags): conversion from TSV and NumPy days, and a
// memory-mapped reader. Fixed-width records make reading a copy loop, so data
// loading is never the bottleneck of a training step.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "absl/functional/function_ref.h"
#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "data/criteo.h"
#include "data/fixed_width_source.h"
#include "data/multi_hot.h"
#include "data/npy.h"
#include "data/row_reducer.h"

namespace dlrm::data {
namespace {

static_assert(std::endian::native == std::endian::little,
              "the binary Criteo format is little-endian");

constexpr char kMagic[8] = {'D', 'L', 'R', 'M', 'B', 'I', 'N', '1'};
// Raw one-hot values, reduced (and expanded to bags) when read.
constexpr uint32_t kVersionOneHot = 1;
// Materialised bags, a table list after the header.
constexpr uint32_t kVersionMultiHot = 2;
// Header flags (version 2): the first id of each bag is Mix64(v) % rows
// (a dynamic table's: DynamicId(Mix64(v))).
constexpr uint32_t kFlagHashIds = 1;

struct Header {
  char magic[8];
  uint32_t version;
  uint32_t num_dense;
  uint32_t num_sparse;
  uint32_t flags;
  uint64_t count;
};
static_assert(sizeof(Header) == 32);

// One per table after a version-2 header.
struct TableEntry {
  uint64_t rows;  // kRawIds: a dynamic table's raw ids, not reduced
  uint32_t multi_hot_size;
  uint32_t reserved;  // 0
};
static_assert(sizeof(TableEntry) == 16);

// TableEntry.rows of a dynamic table: its ids are raw (no table has 0
// rows), stored as uint64.
constexpr uint64_t kRawIds = 0;

// Bytes of one stored id of table t in a version-2 file: uint64 for a
// dynamic table's raw ids, uint32 for rows.
size_t IdBytes(const CriteoOptions& options, int t) {
  return options.Dynamic(t) ? sizeof(uint64_t) : sizeof(uint32_t);
}

// A record: float label, float dense[num_dense], then the ids: version 1
// one uint32 raw value per table, version 2 each table's bag (IdBytes per
// id).
size_t RecordBytes(const CriteoOptions& options, bool materialised) {
  const int num_sparse = static_cast<int>(options.table_rows.size());
  size_t bytes = sizeof(float) * (1 + static_cast<size_t>(options.num_dense));
  for (int t = 0; t < num_sparse; ++t) {
    bytes += materialised ? IdBytes(options, t) * options.MultiHotSize(t)
                          : sizeof(uint32_t);
  }
  return bytes;
}

std::string ErrnoText() { return std::strerror(errno); }

// Reads records of either version; `records` is where the first record
// starts (after the header, and in version 2 the table list).
class CriteoBinarySource final : public FixedWidthSource {
 public:
  CriteoBinarySource(std::string path, const char* base, size_t bytes,
                     size_t records, int64_t count, uint32_t version,
                     CriteoOptions options)
      : path_(std::move(path)),
        base_(base),
        bytes_(bytes),
        records_(records),
        materialised_(version == kVersionMultiHot),
        options_(std::move(options)),
        record_bytes_(RecordBytes(options_, materialised_)) {
    count_ = count;
    for (size_t t = 0; t < options_.table_rows.size(); ++t) {
      maps_.emplace_back(options_, static_cast<int>(t));
    }
  }
  ~CriteoBinarySource() override { munmap(const_cast<char*>(base_), bytes_); }

  absl::StatusOr<bool> Next(int64_t max_samples, Batch* batch) override {
    const int num_dense = options_.num_dense;
    const int num_sparse = static_cast<int>(options_.table_rows.size());
    ASSIGN_OR_RETURN(const int64_t n,
                     StartFixedBatch(options_, max_samples, batch));
    if (n <= 0) return false;
    ids_.resize(num_sparse);
    for (int t = 0; t < num_sparse; ++t) ids_[t] = batch->sparse[t].ids.data();
    const char* record = base_ + records_ + next_ * record_bytes_;
    float* labels = batch->labels.data();
    float* dense = batch->dense.data();
    for (int64_t s = 0; s < n; ++s, record += record_bytes_) {
      std::memcpy(&labels[s], record, sizeof(float));
      // With no dense features `dense` may be null, and memcpy from or to
      // null is undefined even for 0 bytes.
      if (num_dense > 0) {
        std::memcpy(dense + s * num_dense, record + sizeof(float),
                    sizeof(float) * num_dense);
      }
      const char* cats = record + sizeof(float) * (1 + num_dense);
      for (int t = 0; t < num_sparse; ++t) {
        const int k = options_.MultiHotSize(t);
        int64_t* bag = ids_[t] + s * k;
        if (materialised_ && options_.Dynamic(t)) {
          // Raw ids past int64's range read as negative: refused below.
          for (int j = 0; j < k; ++j, cats += sizeof(uint64_t)) {
            std::memcpy(&bag[j], cats, sizeof(uint64_t));
          }
          continue;
        }
        if (materialised_) {
          for (int j = 0; j < k; ++j, cats += sizeof(uint32_t)) {
            uint32_t id;
            std::memcpy(&id, cats, sizeof(id));
            bag[j] = id;
          }
          continue;
        }
        uint32_t value;
        std::memcpy(&value, cats, sizeof(value));
        cats += sizeof(uint32_t);
        const int64_t id = maps_[t](value);
        if (k == 1) {
          bag[0] = id;
        } else {
          maps_[t].Bag(id, k, MultiHotTableSeed(t), bag);
        }
      }
    }
    // The converter writes labels 0/1, finite log(1+x) values and ids
    // within their tables; anything else is a corrupt or foreign file,
    // named here by record rather than left for the model to reject
    // without a place.
    for (int64_t s = 0; s < n; ++s) {
      const float* x = dense + s * num_dense;
      const bool label_ok = labels[s] == 0.0f || labels[s] == 1.0f;
      bool dense_ok = true;
      for (int i = 0; i < num_dense; ++i) dense_ok &= std::isfinite(x[i]);
      const int bad_table = materialised_ ? TableWithBadId(s) : -1;
      if (label_ok && dense_ok && bad_table < 0) continue;
      const int64_t record_index = next_ + s;
      next_ = record_index + 1;  // a later Next goes on after it
      const std::string where =
          absl::StrCat(path_, ": record ", record_index, ": ");
      if (!label_ok) {
        const float label = labels[s];
        batch->Reset(num_dense, num_sparse);
        return absl::InvalidArgumentError(
            absl::StrCat(where, "label ", label, " must be 0 or 1"));
      }
      if (!dense_ok) {
        int bad = 0;
        while (std::isfinite(x[bad])) ++bad;
        const bool nan = std::isnan(x[bad]);
        batch->Reset(num_dense, num_sparse);
        return absl::InvalidArgumentError(absl::StrCat(
            where, "dense ", bad, " is ", nan ? "NaN" : "infinite"));
      }
      const int k = options_.MultiHotSize(bad_table);
      const int64_t limit = IdLimit(bad_table);
      const int64_t* bag = ids_[bad_table] + s * k;
      const int64_t id = *std::find_if(
          bag, bag + k, [limit](int64_t i) { return i < 0 || i >= limit; });
      batch->Reset(num_dense, num_sparse);
      if (options_.Dynamic(bad_table)) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, "table ", bad_table, ": raw id ",
                         static_cast<uint64_t>(id), " is not below 2^63 - 1"));
      }
      return absl::InvalidArgumentError(
          absl::StrCat(where, "table ", bad_table, ": id ", id,
                       " is not below the table's ", limit, " rows"));
    }
    next_ += n;
    return true;
  }

 private:
  // What table t's stored ids stay below: its rows, or for a dynamic
  // table kDynamicIdLimit.
  int64_t IdLimit(int t) const {
    return options_.Dynamic(t) ? kDynamicIdLimit : options_.table_rows[t];
  }

  // The first table whose bag in sample `s` of the batch being read holds
  // an id outside the table (or, dynamic, outside [0, 2^63 - 1)), or -1.
  int TableWithBadId(int64_t s) const {
    for (size_t t = 0; t < ids_.size(); ++t) {
      const int k = options_.MultiHotSize(static_cast<int>(t));
      const uint64_t limit =
          static_cast<uint64_t>(IdLimit(static_cast<int>(t)));
      const int64_t* bag = ids_[t] + s * k;
      for (int j = 0; j < k; ++j) {
        if (static_cast<uint64_t>(bag[j]) >= limit) return static_cast<int>(t);
      }
    }
    return -1;
  }

  const std::string path_;
  const char* const base_;
  const size_t bytes_;
  const size_t records_;
  const bool materialised_;
  const CriteoOptions options_;
  const size_t record_bytes_;
  std::vector<CriteoIdMap> maps_;  // per table: version 1's value -> id
  std::vector<int64_t*> ids_;
};

// Closes (and on failure removes) a temporary output file.
class TempFile {
 public:
  explicit TempFile(std::string path) : path_(std::move(path)) {}
  ~TempFile() {
    if (file_ != nullptr) std::fclose(file_);
    if (!committed_) std::remove(path_.c_str());
  }

  absl::Status Open() {
    file_ = std::fopen(path_.c_str(), "wb");
    if (file_ == nullptr) {
      const std::string message =
          absl::StrCat("cannot create ", path_, ": ", ErrnoText());
      if (errno == ENOENT) return absl::NotFoundError(message);
      return absl::PermissionDeniedError(message);
    }
    return absl::OkStatus();
  }

  absl::Status Write(const void* data, size_t bytes) {
    if (std::fwrite(data, 1, bytes, file_) != bytes) {
      return absl::DataLossError(
          absl::StrCat("error writing ", path_, ": ", ErrnoText()));
    }
    return absl::OkStatus();
  }

  absl::Status Seek(long offset) {
    if (std::fseek(file_, offset, SEEK_SET) != 0) {
      return absl::DataLossError(
          absl::StrCat("error seeking in ", path_, ": ", ErrnoText()));
    }
    return absl::OkStatus();
  }

  // Flushes, syncs and renames to `final_path`.
  absl::Status CommitAs(const std::string& final_path) {
    const bool flushed = std::fflush(file_) == 0 && fsync(fileno(file_)) == 0;
    const bool closed = std::fclose(file_) == 0;
    file_ = nullptr;
    if (!flushed || !closed) {
      return absl::DataLossError(
          absl::StrCat("error writing ", path_, ": ", ErrnoText()));
    }
    if (std::rename(path_.c_str(), final_path.c_str()) != 0) {
      return absl::PermissionDeniedError(absl::StrCat(
          "cannot rename ", path_, " to ", final_path, ": ", ErrnoText()));
    }
    committed_ = true;
    return absl::OkStatus();
  }

 private:
  std::string path_;
  std::FILE* file_ = nullptr;
  bool committed_ = false;
};

// Writes the samples of `source` (shaped by `options`, every bag of table t
// holding options.MultiHotSize(t) ids, below 2^32 unless the table is
// dynamic) after `header` and `tables` to `out_path`, each bag's ids as
// uint32 (uint64 for a dynamic table's raw ids, in version 2 only);
// returns the count.
absl::StatusOr<int64_t> WriteBinary(BatchSource* source,
                                    const std::string& out_path, Header header,
                                    const std::vector<TableEntry>& tables,
                                    const CriteoOptions& options) {
  TempFile out(absl::StrCat(out_path, ".tmp.", getpid()));
  RETURN_IF_ERROR(out.Open());
  RETURN_IF_ERROR(out.Write(&header, sizeof(header)));
  if (!tables.empty()) {
    RETURN_IF_ERROR(
        out.Write(tables.data(), sizeof(TableEntry) * tables.size()));
  }
  const int num_dense = options.num_dense;
  const int num_sparse = static_cast<int>(options.table_rows.size());
  const size_t record_bytes = RecordBytes(options, /*materialised=*/true);
  std::vector<char> buffer;
  Batch batch;
  int64_t count = 0;
  while (true) {
    ASSIGN_OR_RETURN(bool more, source->Next(1 << 16, &batch));
    if (!more) break;
    buffer.resize(batch.size * record_bytes);
    char* record = buffer.data();
    for (int64_t s = 0; s < batch.size; ++s, record += record_bytes) {
      std::memcpy(record, &batch.labels[s], sizeof(float));
      if (num_dense > 0) {
        std::memcpy(record + sizeof(float), &batch.dense[s * num_dense],
                    sizeof(float) * num_dense);
      }
      char* ids = record + sizeof(float) * (1 + num_dense);
      for (int t = 0; t < num_sparse; ++t) {
        const SparseFeature& f = batch.sparse[t];
        const int k = options.MultiHotSize(t);
        if (options.Dynamic(t)) {
          std::memcpy(ids, &f.ids[f.offsets[s]], sizeof(uint64_t) * k);
          ids += sizeof(uint64_t) * k;
          continue;
        }
        for (int j = 0; j < k; ++j, ids += sizeof(uint32_t)) {
          const uint32_t id = static_cast<uint32_t>(f.ids[f.offsets[s] + j]);
          std::memcpy(ids, &id, sizeof(id));
        }
      }
    }
    RETURN_IF_ERROR(out.Write(buffer.data(), buffer.size()));
    count += batch.size;
  }
  header.count = static_cast<uint64_t>(count);
  RETURN_IF_ERROR(out.Seek(0));
  RETURN_IF_ERROR(out.Write(&header, sizeof(header)));
  RETURN_IF_ERROR(out.CommitAs(out_path));
  return count;
}

Header MakeHeader(uint32_t version, const CriteoOptions& options) {
  Header header{};
  std::memcpy(header.magic, kMagic, sizeof(kMagic));
  header.version = version;
  header.num_dense = static_cast<uint32_t>(options.num_dense);
  header.num_sparse = static_cast<uint32_t>(options.table_rows.size());
  return header;
}

// The table list of a version-2 file for `options` (validated here): a
// dynamic table's entry records kRawIds. InvalidArgument for a static
// table of more than 2^32 rows, naming it.
absl::StatusOr<std::vector<TableEntry>> MultiHotTables(
    const CriteoOptions& options, const std::string& out_path) {
  RETURN_IF_ERROR(options.Validate());
  std::vector<TableEntry> tables;
  for (size_t t = 0; t < options.table_rows.size(); ++t) {
    const int64_t rows = options.table_rows[t];
    if (options.Dynamic(static_cast<int>(t))) {
      tables.push_back(TableEntry{
          kRawIds, static_cast<uint32_t>(options.MultiHotSize(t)), 0});
      continue;
    }
    if (rows > int64_t{1} << 32) {
      return absl::InvalidArgumentError(absl::StrCat(
          "converting to ", out_path, ": table ", t, " has ", rows,
          " rows (CriteoOptions.table_rows[", t,
          "]); the binary format's uint32 ids index at most 2^32"));
    }
    tables.push_back(TableEntry{static_cast<uint64_t>(rows),
                                static_cast<uint32_t>(options.MultiHotSize(t)),
                                0});
  }
  return tables;
}

// The reader's options of a conversion to version 1 (raw values): tables
// of 2^32 rows make the row reduction the identity on 32-bit values, so the
// batches carry the raw values the format stores. InvalidArgument for
// num_dense < 0 or num_sparse <= 0.
absl::StatusOr<CriteoOptions> RawOptions(const std::string& out_path,
                                         int num_dense, int num_sparse) {
  if (num_dense < 0 || num_sparse <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("converting to ", out_path, ": num_dense = ", num_dense,
                     " and num_sparse = ", num_sparse,
                     " must be non-negative and positive"));
  }
  CriteoOptions raw;
  raw.num_dense = num_dense;
  raw.table_rows.assign(num_sparse, int64_t{1} << 32);
  return raw;
}

// A conversion to version 2 (bags materialised) of `options`' tables: the
// tables are checked first, then the samples of the source `open` opens
// are written to `out_path`.
absl::StatusOr<int64_t> ConvertToMultiHot(
    const std::string& out_path, const CriteoOptions& options,
    absl::FunctionRef<absl::StatusOr<std::unique_ptr<BatchSource>>()> open) {
  ASSIGN_OR_RETURN(const std::vector<TableEntry> tables,
                   MultiHotTables(options, out_path));
  ASSIGN_OR_RETURN(std::unique_ptr<BatchSource> source, open());
  Header header = MakeHeader(kVersionMultiHot, options);
  if (options.hash_ids) header.flags |= kFlagHashIds;
  return WriteBinary(source.get(), out_path, header, tables, options);
}

}  // namespace

absl::StatusOr<int64_t> ConvertCriteoTsvToBinary(
    const std::vector<std::string>& tsv_files, const std::string& out_path,
    int num_dense, int num_sparse) {
  ASSIGN_OR_RETURN(const CriteoOptions raw,
                   RawOptions(out_path, num_dense, num_sparse));
  ASSIGN_OR_RETURN(std::unique_ptr<BatchSource> source,
                   OpenCriteoTsv(tsv_files, raw));
  return WriteBinary(source.get(), out_path, MakeHeader(kVersionOneHot, raw),
                     {}, raw);
}

absl::StatusOr<int64_t> ConvertCriteoTsvToMultiHotBinary(
    const std::vector<std::string>& tsv_files, const std::string& out_path,
    const CriteoOptions& options) {
  return ConvertToMultiHot(out_path, options,
                           [&] { return OpenCriteoTsv(tsv_files, options); });
}

absl::StatusOr<int64_t> ConvertCriteoNpyToBinary(
    const std::vector<CriteoNpyDay>& days, const std::string& out_path,
    int num_dense, int num_sparse) {
  ASSIGN_OR_RETURN(const CriteoOptions raw,
                   RawOptions(out_path, num_dense, num_sparse));
  // Version 1 stores each raw value as uint32: wider ids and .npz bags
  // would not survive it.
  for (const CriteoNpyDay& day : days) {
    if (day.sparse.size() >= 4 &&
        day.sparse.compare(day.sparse.size() - 4, 4, ".npz") == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(day.sparse,
                       ": multi-hot bags convert only to version 2 (give "
                       "dlrm_convert --config with the tables' rows and bag "
                       "sizes)"));
    }
    ASSIGN_OR_RETURN(const NpyArray sparse, OpenNpy(day.sparse));
    if (sparse.item_bytes() > 4) {
      return absl::InvalidArgumentError(absl::StrCat(
          day.sparse, ": ", sparse.header().descr,
          " values may not fit version 1's uint32 (give dlrm_convert "
          "--config to store rows reduced to the tables, version 2)"));
    }
  }
  ASSIGN_OR_RETURN(std::unique_ptr<BatchSource> source,
                   OpenCriteoNpy(days, raw));
  return WriteBinary(source.get(), out_path, MakeHeader(kVersionOneHot, raw),
                     {}, raw);
}

absl::StatusOr<int64_t> ConvertCriteoNpyToMultiHotBinary(
    const std::vector<CriteoNpyDay>& days, const std::string& out_path,
    const CriteoOptions& options) {
  return ConvertToMultiHot(out_path, options,
                           [&] { return OpenCriteoNpy(days, options); });
}

absl::StatusOr<std::unique_ptr<BatchSource>> OpenCriteoBinary(
    const std::string& path, CriteoOptions options) {
  RETURN_IF_ERROR(options.Validate());
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int error = errno;
    const std::string message = absl::StrCat("cannot open Criteo binary file ",
                                             path, ": ", std::strerror(error));
    if (error == ENOENT) return absl::NotFoundError(message);
    return absl::PermissionDeniedError(message);
  }
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    const std::string message =
        absl::StrCat("cannot stat ", path, ": ", ErrnoText());
    close(fd);
    return absl::InternalError(message);
  }
  const size_t bytes = static_cast<size_t>(st.st_size);
  if (bytes < sizeof(Header)) {
    close(fd);
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": file has ", bytes, " bytes, fewer than the 32-byte header"));
  }
  void* map = mmap(nullptr, bytes, PROT_READ, MAP_PRIVATE, fd, 0);
  const int map_error = errno;
  close(fd);  // the mapping keeps the file open
  if (map == MAP_FAILED) {
    return absl::InternalError(
        absl::StrCat("cannot mmap ", path, ": ", std::strerror(map_error)));
  }
  const char* base = static_cast<const char*>(map);
  auto fail = [&](std::string message) {
    munmap(map, bytes);
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", message));
  };

  Header header;
  std::memcpy(&header, base, sizeof(header));
  if (std::memcmp(header.magic, kMagic, sizeof(kMagic)) != 0) {
    return fail("bad magic: not a DLRMBIN1 Criteo binary file");
  }
  if (header.version != kVersionOneHot && header.version != kVersionMultiHot) {
    return fail(absl::StrCat("unsupported version ", header.version,
                             " (this build reads versions ", kVersionOneHot,
                             " and ", kVersionMultiHot, ")"));
  }
  const int num_sparse = static_cast<int>(options.table_rows.size());
  if (header.num_dense != static_cast<uint32_t>(options.num_dense) ||
      header.num_sparse != static_cast<uint32_t>(num_sparse)) {
    return fail(absl::StrCat("file has ", header.num_dense, " dense and ",
                             header.num_sparse,
                             " sparse features, the options expect ",
                             options.num_dense, " and ", num_sparse));
  }
  size_t records = sizeof(Header);
  if (header.version == kVersionMultiHot) {
    records += sizeof(TableEntry) * num_sparse;
    if (bytes < records) {
      return fail(absl::StrCat("file has ", bytes, " bytes, fewer than the ",
                               records, "-byte header and table list of a ",
                               "version-2 file"));
    }
    if ((header.flags & ~kFlagHashIds) != 0) {
      return fail(
          absl::StrCat("unknown flags ", header.flags, " in the header"));
    }
    const bool hashed = (header.flags & kFlagHashIds) != 0;
    if (hashed != options.hash_ids) {
      return fail(absl::StrCat("file's ids were reduced ",
                               hashed ? "with" : "without",
                               " hash_ids, the options read them ",
                               options.hash_ids ? "with" : "without"));
    }
    for (int t = 0; t < num_sparse; ++t) {
      TableEntry table;
      std::memcpy(&table, base + sizeof(Header) + sizeof(TableEntry) * t,
                  sizeof(table));
      if (table.multi_hot_size !=
          static_cast<uint32_t>(options.MultiHotSize(t))) {
        return fail(absl::StrCat("table ", t, ": file's bags hold ",
                                 table.multi_hot_size,
                                 " ids, the options expect multi_hot_sizes[", t,
                                 "] = ", options.MultiHotSize(t)));
      }
      if (table.rows == kRawIds && !options.Dynamic(t)) {
        return fail(absl::StrCat("table ", t,
                                 ": file holds raw ids, written for a dynamic "
                                 "table; the options read table ",
                                 t, " as a static table of ", "table_rows[", t,
                                 "] = ", options.table_rows[t], " rows"));
      }
      if (table.rows != kRawIds && options.Dynamic(t)) {
        return fail(absl::StrCat(
            "table ", t, ": file's ids were reduced to ", table.rows,
            " rows, written for a static table; the options read table ", t,
            " as a dynamic table (raw ids): convert again with the dynamic ",
            "config"));
      }
      if (table.rows != kRawIds &&
          table.rows != static_cast<uint64_t>(options.table_rows[t])) {
        return fail(absl::StrCat("table ", t, ": file's ids index ", table.rows,
                                 " rows, the options expect ", "table_rows[", t,
                                 "] = ", options.table_rows[t]));
      }
      if (table.reserved != 0) {
        return fail(absl::StrCat("table ", t, ": reserved field is ",
                                 table.reserved, ", not 0"));
      }
    }
  }
  const size_t record_bytes =
      RecordBytes(options, header.version == kVersionMultiHot);
  const size_t payload = bytes - records;
  if (header.count > payload / record_bytes ||
      header.count * record_bytes != payload) {
    return fail(absl::StrCat(
        "file has ", bytes, " bytes, which does not match its header's ",
        header.count, " records of ", record_bytes, " bytes after the ",
        records, "-byte header: the file is truncated or corrupt"));
  }
  madvise(map, bytes, MADV_SEQUENTIAL);
  return std::unique_ptr<BatchSource>(std::make_unique<CriteoBinarySource>(
      path, base, bytes, records, static_cast<int64_t>(header.count),
      header.version, std::move(options)));
}

absl::StatusOr<int64_t> ReadCriteoBinaryCount(const std::string& path) {
  std::FILE* file = std::fopen(path.c_str(), "rb");
  if (file == nullptr) {
    const int error = errno;
    const std::string message = absl::StrCat("cannot open Criteo binary file ",
                                             path, ": ", std::strerror(error));
    if (error == ENOENT) return absl::NotFoundError(message);
    return absl::PermissionDeniedError(message);
  }
  Header header;
  const size_t got = std::fread(&header, 1, sizeof(header), file);
  std::fclose(file);
  if (got != sizeof(header)) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": file has ", got, " bytes, fewer than the 32-byte header"));
  }
  if (std::memcmp(header.magic, kMagic, sizeof(kMagic)) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": bad magic: not a DLRMBIN1 Criteo binary file"));
  }
  return static_cast<int64_t>(header.count);
}

}  // namespace dlrm::data
