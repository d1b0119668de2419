// Reading and writing the safetensors format (an 8-byte little-endian
// header length, a JSON header of name -> dtype/shape/offsets, then raw
// little-endian data), so weights load directly in PyTorch.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/file_system.h"

namespace dlrm::model {

// The element types this reader and writer know, little-endian: float32,
// IEEE half, bfloat16 (the high half of a float32) and int64.
enum class Dtype { kF32, kF16, kBF16, kI64 };
// Bytes of one element: 4, 2, 2, 8.
int DtypeBytes(Dtype dtype);
// The header's name of `dtype`: "F32", "F16", "BF16", "I64".
const char* DtypeName(Dtype dtype);

// A tensor to write; `data` is borrowed for the duration of the write and
// holds product(shape) elements of `dtype`.
struct TensorToWrite {
  std::string name;
  std::vector<int64_t> shape;
  const void* data;
  Dtype dtype = Dtype::kF32;
};

// The name, shape and element type of a tensor of a file.
struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;
  Dtype dtype = Dtype::kF32;
};

// Writes a safetensors file one tensor at a time, in the order of the specs
// given, so that the tensors need not be in memory together. The data
// section starts 8-byte aligned and each tensor follows the one before it:
// list the 8- and 4-byte tensors before the 2-byte ones to keep every
// tensor aligned to its element. Not thread-safe.
class SafetensorsWriter {
 public:
  // Creates `path` (replacing it) through `file_system` (borrowed, must outlive
  // the writer) and writes the header for `specs` and `metadata`.
  // InvalidArgument for a duplicate name; the file system's errors (they
  // name the path: ResourceExhausted for a full disk, else Internal).
  static absl::StatusOr<std::unique_ptr<SafetensorsWriter>> Create(
      const std::string& path, std::vector<TensorSpec> specs,
      const std::map<std::string, std::string>& metadata,
      FileSystem* file_system = DefaultFileSystem());

  // Appends the data of the next tensor: product(shape) elements of its
  // spec's dtype. After an error, and once every tensor is written,
  // FailedPrecondition.
  absl::Status Append(const void* data);
  // Syncs and closes the file. FailedPrecondition unless every tensor was
  // appended; the file system's errors.
  absl::Status Finish();
  // Bytes of the complete file.
  int64_t bytes() const { return bytes_; }
  // Tensors of the file.
  const std::vector<TensorSpec>& specs() const { return specs_; }

 private:
  SafetensorsWriter() = default;

  std::string path_;
  std::vector<TensorSpec> specs_;
  std::unique_ptr<WritableFile> file_;
  size_t next_ = 0;
  int64_t bytes_ = 0;
  bool failed_ = false;
};

// Writes `tensors` (unique names) and string `metadata` to `path`,
// replacing it, through `file_system`. Errors as SafetensorsWriter's.
absl::Status WriteSafetensors(
    const std::string& path, const std::vector<TensorToWrite>& tensors,
    const std::map<std::string, std::string>& metadata,
    FileSystem* file_system = DefaultFileSystem());

// A memory-mapped safetensors file. Thread-safe for reads.
class SafetensorsFile {
 public:
  // NotFound for a missing file; InvalidArgument (naming the path) for a
  // malformed header, offsets outside the file, or a dtype not in Dtype.
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(
      const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  // The data of F32 tensor `name`, valid while this object lives. NotFound
  // if absent; InvalidArgument if its dtype is not F32 or its shape differs
  // from `shape`.
  absl::StatusOr<std::span<const float>> Get(
      const std::string& name, const std::vector<int64_t>& shape) const;
  // The same for a tensor of `count` elements in any shape (a flat
  // parameter saved as [out, in] or [out * in]).
  absl::StatusOr<std::span<const float>> GetFlat(const std::string& name,
                                                 int64_t count) const;
  // The raw little-endian bytes of tensor `name` of `dtype` and `shape`,
  // valid while this object lives; not necessarily aligned to the element
  // (copy them out with memcpy). NotFound if absent; InvalidArgument if
  // its dtype or shape differs.
  absl::StatusOr<std::span<const char>> GetBytes(
      const std::string& name, Dtype dtype,
      const std::vector<int64_t>& shape) const;
  // A copy of I64 tensor `name` of `shape`. Errors as GetBytes.
  absl::StatusOr<std::vector<int64_t>> GetInt64(
      const std::string& name, const std::vector<int64_t>& shape) const;
  // The dtype of tensor `name`; NotFound if absent.
  absl::StatusOr<Dtype> DtypeOf(const std::string& name) const;
  bool Has(const std::string& name) const { return tensors_.count(name) > 0; }
  // The shape of tensor `name`; NotFound if absent.
  absl::StatusOr<std::vector<int64_t>> Shape(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const {
    return metadata_;
  }
  std::vector<std::string> Names() const;

 private:
  struct Entry {
    std::vector<int64_t> shape;
    int64_t elements;  // product(shape)
    Dtype dtype;
    uint64_t begin, end;  // byte offsets into the data section
  };
  SafetensorsFile() = default;
  // The entry of `name` if its dtype and element count match; the errors
  // of Get.
  absl::StatusOr<const Entry*> Find(const std::string& name, Dtype dtype,
                                    int64_t count) const;

  std::string path_;
  const char* map_ = nullptr;
  size_t size_ = 0;
  const char* data_ = nullptr;  // start of the data section
  std::map<std::string, Entry> tensors_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace dlrm::model
