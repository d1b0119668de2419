// MANIFEST.json: writing, reading and checking a checkpoint's files
// against it (model/checkpoint_manifest.h).
#include "model/checkpoint_manifest.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/crc32c.h"
#include "core/status.h"

namespace dlrm::model {

namespace {

namespace fs = std::filesystem;

// Version 1 listed the RocksDB tier's checkpoint directory as one entry.
constexpr char kRocksDb[] = "rocksdb";
constexpr char kManifestCrcKey[] = "manifest_crc32c";
constexpr int kManifestVersion = 2;

std::string Hex32(uint32_t v) { return absl::StrFormat("%08x", v); }

// The manifest's own checksum: the CRC-32C of its JSON (2-space indent,
// keys sorted, as nlohmann prints it) without the checksum field.
uint32_t ManifestCrc(nlohmann::json json) {
  json.erase(kManifestCrcKey);
  const std::string text = json.dump(2);
  return Crc32c(text.data(), text.size());
}

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

absl::StatusOr<Manifest> ParseManifest(
    const nlohmann::json& json, const fs::path& path,
    const std::function<absl::Status(const std::string&)>& damaged);

}  // namespace

absl::StatusOr<std::pair<uint32_t, int64_t>> FileCrc32c(
    const std::string& path, FileSystem* file_system) {
  ASSIGN_OR_RETURN(std::unique_ptr<SequentialFile> file,
                   file_system->NewSequentialFile(path));
  std::vector<char> buffer(size_t{4} << 20);
  uint32_t crc = 0;
  int64_t bytes = 0;
  for (;;) {
    ASSIGN_OR_RETURN(const size_t n, file->Read(buffer.data(), buffer.size()));
    if (n == 0) break;
    crc = Crc32cExtend(crc, buffer.data(), n);
    bytes += static_cast<int64_t>(n);
  }
  return std::make_pair(crc, bytes);
}

absl::StatusOr<Manifest> WriteManifest(const std::string& dir_name,
                                       const Manifest& fields,
                                       FileSystem* file_system) {
  const fs::path dir(dir_name);
  Manifest m = fields;
  m.version = kManifestVersion;
  m.created_ms = NowMs();
  m.files.clear();
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (!it->is_regular_file()) continue;
    const std::string rel = it->path().lexically_relative(dir).generic_string();
    if (rel == kManifestFile) continue;
    ASSIGN_OR_RETURN(auto crc, FileCrc32c(it->path().string(), file_system));
    m.files.push_back({rel, crc.second, crc.first, true});
  }
  if (ec) {
    return absl::InternalError(
        absl::StrCat("cannot list ", dir.string(), ": ", ec.message()));
  }
  std::sort(m.files.begin(), m.files.end(),
            [](const ManifestFile& a, const ManifestFile& b) {
              return a.path < b.path;
            });
  nlohmann::json json = {{"format", m.format},
                         {"version", m.version},
                         {"step", m.step},
                         {"world_size", m.world_size},
                         {"created_ms", m.created_ms},
                         {"config", m.config_text},
                         {"sharding_plan", m.sharding_plan},
                         {"files", nlohmann::json::object()}};
  for (const ManifestFile& f : m.files) {
    json["files"][f.path] = {{"bytes", f.bytes}, {"crc32c", Hex32(f.crc32c)}};
  }
  if (!m.job.empty()) {
    // Embedded as an object so the manifest stays readable; text that is
    // not JSON is kept as a string rather than lost.
    nlohmann::json job =
        nlohmann::json::parse(m.job, nullptr, /*allow_exceptions=*/false);
    json["job"] = job.is_discarded() ? nlohmann::json(m.job) : job;
  }
  json[kManifestCrcKey] = Hex32(ManifestCrc(json));
  RETURN_IF_ERROR(WriteFile(*file_system, (dir / kManifestFile).string(),
                            json.dump(2) + "\n"));
  RETURN_IF_ERROR(file_system->SyncDirectory(dir.string()));
  return m;
}

absl::StatusOr<Manifest> ReadManifest(const std::string& dir_name,
                                      FileSystem* file_system) {
  const fs::path path = fs::path(dir_name) / kManifestFile;
  if (!fs::exists(path)) {
    return absl::NotFoundError(absl::StrCat("no checkpoint in ", dir_name,
                                            " (no ", kManifestFile, ")"));
  }
  absl::StatusOr<std::string> text = ReadFile(*file_system, path.string());
  if (!text.ok()) {
    return absl::DataLossError(absl::StrCat("cannot read ", path.string(), ": ",
                                            text.status().message()));
  }
  const nlohmann::json json =
      nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  auto damaged = [&](const std::string& why) -> absl::Status {
    return absl::DataLossError(absl::StrCat(
        "checkpoint manifest ", path.string(), " is damaged: ", why));
  };
  if (!json.is_object()) return damaged("not a JSON object");
  // nlohmann throws on a field of the wrong type; nothing escapes.
  try {
    return ParseManifest(json, path, damaged);
  } catch (const nlohmann::json::exception& e) {
    return damaged(e.what());
  }
}

namespace {

absl::StatusOr<Manifest> ParseManifest(
    const nlohmann::json& json, const fs::path& path,
    const std::function<absl::Status(const std::string&)>& damaged) {
  Manifest m;
  m.version = json.value("version", 0);
  if (json.contains(kManifestCrcKey)) {
    const std::string want = json.value(kManifestCrcKey, "");
    if (want != Hex32(ManifestCrc(json))) {
      return damaged("its own checksum does not match");
    }
  } else if (m.version >= kManifestVersion) {
    return damaged(absl::StrCat("no ", kManifestCrcKey));
  }
  m.format = json.value("format", "");
  m.step = json.value("step", int64_t{0});
  m.world_size = json.value("world_size", 1);
  m.created_ms = json.value("created_ms", int64_t{0});
  m.config_text = json.value("config", "");
  m.sharding_plan = json.value("sharding_plan", "");
  if (const auto job = json.find("job"); job != json.end()) {
    m.job = job->is_string() ? job->get<std::string>() : job->dump();
  }
  if (m.format != kCheckpointFormat && m.format != kLegacyMultiRankFormat) {
    return damaged(absl::StrCat("unknown format \"", m.format, "\""));
  }
  const auto files = json.find("files");
  if (files == json.end() || !files->is_object()) return damaged("no files");
  for (const auto& [name, entry] : files->items()) {
    if (!entry.is_object()) return damaged(absl::StrCat("files.", name));
    ManifestFile f;
    f.path = name;
    f.bytes = entry.value("bytes", int64_t{-1});
    uint32_t crc = 0;
    const std::string hex = entry.value("crc32c", "");
    if (!hex.empty()) {
      if (!absl::SimpleHexAtoi(hex, &crc)) {
        return damaged(absl::StrCat("files.", name, ".crc32c"));
      }
      f.has_crc32c = true;
      f.crc32c = crc;
    }
    // Version 1 listed the RocksDB directory as one entry with its total
    // size; only regular files are checked.
    if (m.version < kManifestVersion && name == kRocksDb) continue;
    m.files.push_back(std::move(f));
  }
  if (m.created_ms == 0) {
    std::error_code ec;
    const auto mtime = fs::last_write_time(path, ec);
    if (!ec) {
      m.created_ms =
          std::chrono::duration_cast<std::chrono::milliseconds>(
              std::chrono::file_clock::to_sys(mtime).time_since_epoch())
              .count();
    }
  }
  return m;
}

}  // namespace

absl::Status VerifyCheckpointFiles(
    const std::string& dir_name, const Manifest& manifest,
    const std::function<bool(const std::string&)>& want,
    FileSystem* file_system) {
  const fs::path dir(dir_name);
  for (const ManifestFile& f : manifest.files) {
    if (want && !want(f.path)) continue;
    const fs::path path = dir / f.path;
    std::error_code ec;
    const auto size = fs::file_size(path, ec);
    if (ec) {
      return absl::DataLossError(absl::StrCat("checkpoint file ", path.string(),
                                              " is missing: ", ec.message()));
    }
    if (static_cast<int64_t>(size) != f.bytes) {
      return absl::DataLossError(
          absl::StrCat("checkpoint file ", path.string(), " has ", size,
                       " bytes, the manifest says ", f.bytes));
    }
    if (!f.has_crc32c) continue;
    absl::StatusOr<std::pair<uint32_t, int64_t>> crc =
        FileCrc32c(path.string(), file_system);
    if (!crc.ok()) return absl::DataLossError(crc.status().message());
    if (crc->first != f.crc32c || crc->second != f.bytes) {
      return absl::DataLossError(absl::StrCat(
          "checkpoint file ", path.string(), " is corrupt: CRC-32C ",
          Hex32(crc->first), ", the manifest says ", Hex32(f.crc32c)));
    }
  }
  return absl::OkStatus();
}

}  // namespace dlrm::model
