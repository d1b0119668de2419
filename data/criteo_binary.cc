// The binary Criteo format: conversion from TSV and a memory-mapped reader.
// Fixed-width records make reading a copy loop, so data loading is never the
// bottleneck of a training step.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "data/criteo.h"

namespace dlrm::data {
namespace {

static_assert(std::endian::native == std::endian::little,
              "the binary Criteo format is little-endian");

constexpr char kMagic[8] = {'D', 'L', 'R', 'M', 'B', 'I', 'N', '1'};
constexpr uint32_t kVersion = 1;

struct Header {
  char magic[8];
  uint32_t version;
  uint32_t num_dense;
  uint32_t num_sparse;
  uint32_t reserved;
  uint64_t count;
};
static_assert(sizeof(Header) == 32);

size_t RecordBytes(int num_dense, int num_sparse) {
  return sizeof(float) * (1 + static_cast<size_t>(num_dense)) +
         sizeof(uint32_t) * static_cast<size_t>(num_sparse);
}

std::string ErrnoText() { return std::strerror(errno); }

// value % rows without a hardware divide (Lemire's fastmod): the reader
// reduces 26 ids per record, and a 64-bit divide would dominate the copy.
// Gives exactly CriteoRow(value, rows, false).
class RowReducer {
 public:
  explicit RowReducer(int64_t rows)
      : rows_(static_cast<uint64_t>(rows)),
        small_(rows_ <= std::numeric_limits<uint32_t>::max()),
        magic_(small_ ? ~uint64_t{0} / rows_ + 1 : 0) {}

  int64_t operator()(uint32_t value) const {
    if (!small_) return value;  // value < 2^32 <= rows
    const uint64_t low = magic_ * value;
    return static_cast<int64_t>((static_cast<unsigned __int128>(low) * rows_) >>
                                64);
  }

 private:
  uint64_t rows_;
  bool small_;
  uint64_t magic_;
};

class CriteoBinarySource final : public BatchSource {
 public:
  CriteoBinarySource(std::string path, const char* base, size_t bytes,
                     int64_t count, CriteoOptions options)
      : path_(std::move(path)),
        base_(base),
        bytes_(bytes),
        count_(count),
        options_(std::move(options)) {
    for (int64_t rows : options_.table_rows) reducers_.emplace_back(rows);
  }
  ~CriteoBinarySource() override { munmap(const_cast<char*>(base_), bytes_); }

  absl::Status Rewind() override {
    next_ = 0;
    return absl::OkStatus();
  }

  // Records have a fixed width: skipping moves the record index.
  absl::StatusOr<int64_t> Skip(int64_t n) override {
    if (n < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("cannot skip ", n, " samples"));
    }
    n = std::min(n, count_ - next_);
    next_ += n;
    return n;
  }

  absl::StatusOr<bool> Next(int64_t max_samples, Batch* batch) override {
    const int num_dense = options_.num_dense;
    const int num_sparse = static_cast<int>(options_.table_rows.size());
    batch->Reset(num_dense, num_sparse);
    if (max_samples <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("max_samples = ", max_samples, " must be positive"));
    }
    const int64_t n = std::min(max_samples, count_ - next_);
    if (n <= 0) return false;
    batch->size = n;
    batch->labels.resize(n);
    batch->dense.resize(n * num_dense);
    ids_.resize(num_sparse);
    for (int t = 0; t < num_sparse; ++t) {
      SparseFeature& f = batch->sparse[t];
      f.offsets.resize(n + 1);
      for (int64_t s = 0; s <= n; ++s) f.offsets[s] = s;
      f.ids.resize(n);
      ids_[t] = f.ids.data();
    }
    const size_t record_bytes = RecordBytes(num_dense, num_sparse);
    const char* record = base_ + sizeof(Header) + next_ * record_bytes;
    float* labels = batch->labels.data();
    float* dense = batch->dense.data();
    const bool hash = options_.hash_ids;
    for (int64_t s = 0; s < n; ++s, record += record_bytes) {
      std::memcpy(&labels[s], record, sizeof(float));
      // With no dense features `dense` may be null, and memcpy from or to
      // null is undefined even for 0 bytes.
      if (num_dense > 0) {
        std::memcpy(dense + s * num_dense, record + sizeof(float),
                    sizeof(float) * num_dense);
      }
      const char* cats = record + sizeof(float) * (1 + num_dense);
      for (int t = 0; t < num_sparse; ++t) {
        uint32_t value;
        std::memcpy(&value, cats + sizeof(uint32_t) * t, sizeof(value));
        ids_[t][s] = hash ? CriteoRow(value, options_.table_rows[t], true)
                          : reducers_[t](value);
      }
    }
    // The converter writes labels 0/1 and finite log(1+x) values; anything
    // else is a corrupt or foreign file, named here by record rather than
    // left for the model to reject without a place.
    for (int64_t s = 0; s < n; ++s) {
      const float* x = dense + s * num_dense;
      const bool label_ok = labels[s] == 0.0f || labels[s] == 1.0f;
      bool dense_ok = true;
      for (int i = 0; i < num_dense; ++i) dense_ok &= std::isfinite(x[i]);
      if (label_ok && dense_ok) continue;
      const int64_t record_index = next_ + s;
      next_ = record_index + 1;  // a later Next goes on after it
      batch->Reset(num_dense, num_sparse);
      if (!label_ok) {
        return absl::InvalidArgumentError(
            absl::StrCat(path_, ": record ", record_index, ": label ",
                         labels[s], " must be 0 or 1"));
      }
      int bad = 0;
      while (std::isfinite(x[bad])) ++bad;
      return absl::InvalidArgumentError(
          absl::StrCat(path_, ": record ", record_index, ": dense ", bad,
                       " is ", std::isnan(x[bad]) ? "NaN" : "infinite"));
    }
    next_ += n;
    return true;
  }

 private:
  const std::string path_;
  const char* const base_;
  const size_t bytes_;
  const int64_t count_;
  const CriteoOptions options_;
  std::vector<RowReducer> reducers_;
  std::vector<int64_t*> ids_;
  int64_t next_ = 0;
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

}  // namespace

absl::StatusOr<int64_t> ConvertCriteoTsvToBinary(
    const std::vector<std::string>& tsv_files, const std::string& out_path,
    int num_dense, int num_sparse) {
  if (num_dense < 0 || num_sparse <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("converting to ", out_path, ": num_dense = ", num_dense,
                     " and num_sparse = ", num_sparse,
                     " must be non-negative and positive"));
  }
  // Tables of 2^32 rows make the TSV reader's row reduction the identity, so
  // its batches carry the raw categorical values the format stores.
  CriteoOptions raw;
  raw.num_dense = num_dense;
  raw.table_rows.assign(num_sparse, int64_t{1} << 32);
  ASSIGN_OR_RETURN(std::unique_ptr<BatchSource> source,
                   OpenCriteoTsv(tsv_files, raw));

  TempFile out(absl::StrCat(out_path, ".tmp.", getpid()));
  RETURN_IF_ERROR(out.Open());
  Header header{};
  std::memcpy(header.magic, kMagic, sizeof(kMagic));
  header.version = kVersion;
  header.num_dense = static_cast<uint32_t>(num_dense);
  header.num_sparse = static_cast<uint32_t>(num_sparse);
  RETURN_IF_ERROR(out.Write(&header, sizeof(header)));

  const size_t record_bytes = RecordBytes(num_dense, num_sparse);
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
      char* cats = record + sizeof(float) * (1 + num_dense);
      for (int t = 0; t < num_sparse; ++t) {
        const uint32_t value = static_cast<uint32_t>(batch.sparse[t].ids[s]);
        std::memcpy(cats + sizeof(uint32_t) * t, &value, sizeof(value));
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
  if (header.version != kVersion) {
    return fail(absl::StrCat("unsupported version ", header.version,
                             " (this build reads version ", kVersion, ")"));
  }
  const int num_sparse = static_cast<int>(options.table_rows.size());
  if (header.num_dense != static_cast<uint32_t>(options.num_dense) ||
      header.num_sparse != static_cast<uint32_t>(num_sparse)) {
    return fail(absl::StrCat("file has ", header.num_dense, " dense and ",
                             header.num_sparse,
                             " sparse features, the options expect ",
                             options.num_dense, " and ", num_sparse));
  }
  const size_t record_bytes = RecordBytes(options.num_dense, num_sparse);
  const size_t payload = bytes - sizeof(Header);
  if (header.count > payload / record_bytes ||
      header.count * record_bytes != payload) {
    return fail(absl::StrCat(
        "file has ", bytes, " bytes, which does not match its header's ",
        header.count, " records of ", record_bytes,
        " bytes after the 32-byte header: the file is truncated or corrupt"));
  }
  madvise(map, bytes, MADV_SEQUENTIAL);
  return std::unique_ptr<BatchSource>(std::make_unique<CriteoBinarySource>(
      path, base, bytes, static_cast<int64_t>(header.count),
      std::move(options)));
}

}  // namespace dlrm::data
