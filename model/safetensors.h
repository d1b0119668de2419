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

namespace dlrm::model {

// A float32 tensor to write; `data` is borrowed for the duration of the
// write and holds product(shape) floats.
struct TensorToWrite {
  std::string name;
  std::vector<int64_t> shape;
  const float* data;
};

// Writes `tensors` (unique names) and string `metadata` to `path`,
// replacing it. Internal on an I/O error, naming the path.
absl::Status WriteSafetensors(
    const std::string& path, const std::vector<TensorToWrite>& tensors,
    const std::map<std::string, std::string>& metadata);

// A memory-mapped safetensors file. Thread-safe for reads.
class SafetensorsFile {
 public:
  // NotFound for a missing file; InvalidArgument (naming the path) for a
  // malformed header, offsets outside the file, or a dtype other than F32.
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(
      const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  // The tensor's data, valid while this object lives. NotFound if absent;
  // InvalidArgument if its shape differs from `shape`.
  absl::StatusOr<std::span<const float>> Get(
      const std::string& name, const std::vector<int64_t>& shape) const;
  bool Has(const std::string& name) const { return tensors_.count(name) > 0; }
  const std::map<std::string, std::string>& metadata() const {
    return metadata_;
  }
  std::vector<std::string> Names() const;

 private:
  struct Entry {
    std::vector<int64_t> shape;
    uint64_t begin, end;  // byte offsets into the data section
  };
  SafetensorsFile() = default;

  std::string path_;
  const char* map_ = nullptr;
  size_t size_ = 0;
  const char* data_ = nullptr;  // start of the data section
  std::map<std::string, Entry> tensors_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace dlrm::model
