// safetensors I/O with nlohmann::json for the header and mmap for reads.
#include "model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <nlohmann/json.hpp>

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

}  // namespace

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
    const uint64_t bytes = Elements(t.shape) * sizeof(float);
    header[t.name] = {{"dtype", "F32"},
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

absl::Status SafetensorsWriter::Append(const float* data) {
  if (failed_ || next_ >= specs_.size()) {
    return absl::FailedPreconditionError(absl::StrCat(
        path_, ": ", failed_ ? "an earlier write failed" : "no tensor left"));
  }
  const size_t n = static_cast<size_t>(Elements(specs_[next_].shape));
  ++next_;
  const absl::Status s = file_->Append(
      std::string_view(reinterpret_cast<const char*>(data), n * sizeof(float)));
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
  for (const TensorToWrite& t : tensors) specs.push_back({t.name, t.shape});
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
    if (v["dtype"].get<std::string>() != "F32") {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": tensor ", it.key(), " has dtype ",
          v["dtype"].get<std::string>(), "; only F32 is supported"));
    }
    Entry e;
    for (const auto& d : v["shape"]) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(path, ": tensor ", it.key(), " has a bad shape"));
      }
      e.shape.push_back(d.get<int64_t>());
    }
    const auto& off = v["data_offsets"];
    if (!off[0].is_number_unsigned() || !off[1].is_number_unsigned()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": tensor ", it.key(), " has bad offsets"));
    }
    e.begin = off[0].get<uint64_t>();
    e.end = off[1].get<uint64_t>();
    if (e.begin > e.end || e.end > data_size ||
        e.end - e.begin != Elements(e.shape) * sizeof(float) ||
        e.begin % sizeof(float) != 0) {
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

absl::StatusOr<std::span<const float>> SafetensorsFile::Get(
    const std::string& name, const std::vector<int64_t>& shape) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) {
    return absl::NotFoundError(absl::StrCat(path_, ": no tensor named ", name));
  }
  if (it->second.shape != shape) {
    return absl::InvalidArgumentError(absl::StrCat(
        path_, ": tensor ", name, " has shape ", ShapeString(it->second.shape),
        ", expected ", ShapeString(shape)));
  }
  // WriteSafetensors aligns the data section; files from other writers may
  // not be, which x86 float loads tolerate.
  return std::span<const float>(
      reinterpret_cast<const float*>(data_ + it->second.begin),
      Elements(shape));
}

absl::StatusOr<std::span<const float>> SafetensorsFile::GetFlat(
    const std::string& name, int64_t count) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) {
    return absl::NotFoundError(absl::StrCat(path_, ": no tensor named ", name));
  }
  if (Elements(it->second.shape) != count) {
    return absl::InvalidArgumentError(absl::StrCat(
        path_, ": tensor ", name, " has shape ", ShapeString(it->second.shape),
        ", expected ", count, " elements"));
  }
  return std::span<const float>(
      reinterpret_cast<const float*>(data_ + it->second.begin), count);
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
