// safetensors I/O with nlohmann::json for the header and mmap for reads.
#include "model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>
#include <optional>

#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace dlrm::model {
namespace {

int64_t Elements(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    absl::StrAppend(&s, i ? ", " : "", shape[i]);
  }
  return s + "]";
}

// Each Dtype's bytes and header name, in enum order.
struct DtypeInfo {
  int bytes;
  const char* name;
};
constexpr DtypeInfo kDtypes[] = {
    {4, "F32"}, {2, "F16"}, {2, "BF16"}, {8, "I64"}};

// The Dtype named `name` in a header, if it is one.
std::optional<Dtype> ParseDtype(const std::string& name) {
  for (size_t d = 0; d < std::size(kDtypes); ++d) {
    if (name == kDtypes[d].name) return static_cast<Dtype>(d);
  }
  return std::nullopt;
}

}  // namespace

int DtypeBytes(Dtype dtype) { return kDtypes[static_cast<int>(dtype)].bytes; }

const char* DtypeName(Dtype dtype) {
  return kDtypes[static_cast<int>(dtype)].name;
}

absl::StatusOr<std::unique_ptr<SafetensorsWriter>> SafetensorsWriter::Create(
    const std::string& path, std::vector<TensorSpec> specs,
    const std::map<std::string, std::string>& metadata,
    FileSystem* file_system) {
  nlohmann::json header = nlohmann::json::object();
  uint64_t offset = 0;
  for (const TensorSpec& t : specs) {
    if (header.contains(t.name)) {
      return absl::InvalidArgumentError(
          absl::StrCat("duplicate tensor name ", t.name));
    }
    const uint64_t bytes = Elements(t.shape) * DtypeBytes(t.dtype);
    header[t.name] = {{"dtype", DtypeName(t.dtype)},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::string text = header.dump();
  // Pad so the data section starts 8-byte aligned, as the format allows.
  text.append((8 - text.size() % 8) % 8, ' ');
  const uint64_t header_size = text.size();

  std::unique_ptr<SafetensorsWriter> writer(new SafetensorsWriter());
  writer->path_ = path;
  writer->specs_ = std::move(specs);
  writer->bytes_ =
      static_cast<int64_t>(sizeof(header_size) + text.size() + offset);
  ASSIGN_OR_RETURN(writer->file_, file_system->NewWritableFile(path));
  // The length is little-endian, as is every supported host.
  text.insert(0, reinterpret_cast<const char*>(&header_size),
              sizeof(header_size));
  RETURN_IF_ERROR(writer->file_->Append(text));
  return writer;
}

absl::Status SafetensorsWriter::Append(const void* data) {
  if (failed_ || next_ >= specs_.size()) {
    return absl::FailedPreconditionError(absl::StrCat(
        path_, ": ", failed_ ? "an earlier write failed" : "no tensor left"));
  }
  const TensorSpec& spec = specs_[next_];
  const size_t bytes =
      static_cast<size_t>(Elements(spec.shape)) * DtypeBytes(spec.dtype);
  ++next_;
  const absl::Status s =
      file_->Append(std::string_view(static_cast<const char*>(data), bytes));
  failed_ = !s.ok();
  return s;
}

absl::Status SafetensorsWriter::Finish() {
  if (failed_) {
    return absl::FailedPreconditionError(
        absl::StrCat(path_, ": an earlier write failed"));
  }
  if (next_ != specs_.size()) {
    return absl::FailedPreconditionError(absl::StrCat(
        path_, ": ", next_, " of ", specs_.size(), " tensors were written"));
  }
  failed_ = true;  // the file is closed: nothing more may be written
  RETURN_IF_ERROR(file_->Sync());
  return file_->Close();
}

absl::Status WriteSafetensors(
    const std::string& path, const std::vector<TensorToWrite>& tensors,
    const std::map<std::string, std::string>& metadata,
    FileSystem* file_system) {
  std::vector<TensorSpec> specs;
  specs.reserve(tensors.size());
  for (const TensorToWrite& t : tensors) {
    specs.push_back({t.name, t.shape, t.dtype});
  }
  ASSIGN_OR_RETURN(
      std::unique_ptr<SafetensorsWriter> writer,
      SafetensorsWriter::Create(path, std::move(specs), metadata, file_system));
  for (const TensorToWrite& t : tensors)
    RETURN_IF_ERROR(writer->Append(t.data));
  return writer->Finish();
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(
    const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) {
    return absl::NotFoundError(
        absl::StrCat("cannot open ", path, ": ", std::strerror(errno)));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    return absl::InternalError(absl::StrCat("cannot stat ", path));
  }
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = path;
  file->size_ = static_cast<size_t>(st.st_size);
  if (file->size_ < 8) {
    ::close(fd);
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": too short for a safetensors header"));
  }
  void* map = ::mmap(nullptr, file->size_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (map == MAP_FAILED) {
    return absl::InternalError(absl::StrCat("cannot mmap ", path));
  }
  file->map_ = static_cast<const char*>(map);
  uint64_t header_size;
  std::memcpy(&header_size, file->map_, sizeof(header_size));
  if (header_size > file->size_ - 8) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": header length ", header_size,
                     " exceeds the file size ", file->size_));
  }
  file->data_ = file->map_ + 8 + header_size;
  const uint64_t data_size = file->size_ - 8 - header_size;
  nlohmann::json header = nlohmann::json::parse(
      file->map_ + 8, file->map_ + 8 + header_size, nullptr,
      /*allow_exceptions=*/false);
  if (header.is_discarded() || !header.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": the header is not a JSON object"));
  }
  for (auto it = header.begin(); it != header.end(); ++it) {
    const nlohmann::json& v = it.value();
    if (it.key() == "__metadata__") {
      if (!v.is_object()) {
        return absl::InvalidArgumentError(
            absl::StrCat(path, ": __metadata__ is not an object"));
      }
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (m.value().is_string()) {
          file->metadata_[m.key()] = m.value().get<std::string>();
        }
      }
      continue;
    }
    if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") ||
        !v.contains("data_offsets") || !v["dtype"].is_string() ||
        !v["shape"].is_array() || !v["data_offsets"].is_array() ||
        v["data_offsets"].size() != 2) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": tensor ", it.key(), " has a malformed entry"));
    }
    const std::optional<Dtype> dtype =
        ParseDtype(v["dtype"].get<std::string>());
    if (!dtype.has_value()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": tensor ", it.key(), " has dtype ",
                       v["dtype"].get<std::string>(),
                       "; only F32, F16, BF16 and I64 are "
                       "supported"));
    }
    Entry e;
    e.dtype = *dtype;
    for (const auto& d : v["shape"]) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(path, ": tensor ", it.key(), " has a bad shape"));
      }
      e.shape.push_back(d.get<int64_t>());
    }
    // Counted against the data section as it goes, so it cannot overflow.
    e.elements = 1;
    if (std::find(e.shape.begin(), e.shape.end(), 0) != e.shape.end()) {
      e.elements = 0;
    }
    for (int64_t d : e.shape) {
      if (e.elements == 0) break;
      if (static_cast<uint64_t>(e.elements) > data_size / d) {
        return absl::InvalidArgumentError(absl::StrCat(
            path, ": tensor ", it.key(), " has shape ", ShapeString(e.shape),
            ", more elements than the file holds"));
      }
      e.elements *= d;
    }
    const auto& off = v["data_offsets"];
    if (!off[0].is_number_unsigned() || !off[1].is_number_unsigned()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": tensor ", it.key(), " has bad offsets"));
    }
    e.begin = off[0].get<uint64_t>();
    e.end = off[1].get<uint64_t>();
    // Any offset is taken: another writer's tensors need not be aligned,
    // which x86 loads tolerate (GetBytes' callers copy).
    if (e.begin > e.end || e.end > data_size ||
        e.end - e.begin !=
            static_cast<uint64_t>(e.elements) * DtypeBytes(e.dtype)) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": tensor ", it.key(), " offsets do not fit its shape ",
          ShapeString(e.shape), " or the file"));
    }
    file->tensors_[it.key()] = std::move(e);
  }
  return file;
}

SafetensorsFile::~SafetensorsFile() {
  if (map_ != nullptr) ::munmap(const_cast<char*>(map_), size_);
}

absl::StatusOr<const SafetensorsFile::Entry*> SafetensorsFile::Find(
    const std::string& name, Dtype dtype, int64_t count) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) {
    return absl::NotFoundError(absl::StrCat(path_, ": no tensor named ", name));
  }
  if (it->second.dtype != dtype) {
    return absl::InvalidArgumentError(absl::StrCat(
        path_, ": tensor ", name, " has dtype ", DtypeName(it->second.dtype),
        ", expected ", DtypeName(dtype)));
  }
  if (it->second.elements != count) {
    return absl::InvalidArgumentError(absl::StrCat(
        path_, ": tensor ", name, " has shape ", ShapeString(it->second.shape),
        ", expected ", count, " elements"));
  }
  return &it->second;
}

absl::StatusOr<std::span<const float>> SafetensorsFile::Get(
    const std::string& name, const std::vector<int64_t>& shape) const {
  auto it = tensors_.find(name);
  if (it != tensors_.end() && it->second.dtype == Dtype::kF32 &&
      it->second.shape != shape) {
    return absl::InvalidArgumentError(absl::StrCat(
        path_, ": tensor ", name, " has shape ", ShapeString(it->second.shape),
        ", expected ", ShapeString(shape)));
  }
  return GetFlat(name, Elements(shape));
}

absl::StatusOr<std::span<const float>> SafetensorsFile::GetFlat(
    const std::string& name, int64_t count) const {
  ASSIGN_OR_RETURN(const Entry* e, Find(name, Dtype::kF32, count));
  // WriteSafetensors aligns the data section; files from other writers may
  // not be, which x86 float loads tolerate.
  return std::span<const float>(
      reinterpret_cast<const float*>(data_ + e->begin), count);
}

absl::StatusOr<std::span<const char>> SafetensorsFile::GetBytes(
    const std::string& name, Dtype dtype,
    const std::vector<int64_t>& shape) const {
  auto it = tensors_.find(name);
  if (it != tensors_.end() && it->second.dtype == dtype &&
      it->second.shape != shape) {
    return absl::InvalidArgumentError(absl::StrCat(
        path_, ": tensor ", name, " has shape ", ShapeString(it->second.shape),
        ", expected ", ShapeString(shape)));
  }
  ASSIGN_OR_RETURN(const Entry* e, Find(name, dtype, Elements(shape)));
  return std::span<const char>(data_ + e->begin, e->end - e->begin);
}

absl::StatusOr<std::vector<int64_t>> SafetensorsFile::GetInt64(
    const std::string& name, const std::vector<int64_t>& shape) const {
  ASSIGN_OR_RETURN(std::span<const char> bytes,
                   GetBytes(name, Dtype::kI64, shape));
  std::vector<int64_t> values(bytes.size() / sizeof(int64_t));
  // A tensor of no elements has no bytes, and memcpy may not be handed the
  // empty vector's null pointer even for none.
  if (!bytes.empty()) std::memcpy(values.data(), bytes.data(), bytes.size());
  return values;
}

absl::StatusOr<Dtype> SafetensorsFile::DtypeOf(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) {
    return absl::NotFoundError(absl::StrCat(path_, ": no tensor named ", name));
  }
  return it->second.dtype;
}

absl::StatusOr<std::vector<int64_t>> SafetensorsFile::Shape(
    const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) {
    return absl::NotFoundError(absl::StrCat(path_, ": no tensor named ", name));
  }
  return it->second.shape;
}

std::vector<std::string> SafetensorsFile::Names() const {
  std::vector<std::string> names;
  for (const auto& [name, e] : tensors_) names.push_back(name);
  return names;
}

}  // namespace dlrm::model
