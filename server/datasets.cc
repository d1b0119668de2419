// Path resolution, the dataset directories and DatasetSpec -> BatchSource.
#include "server/datasets.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/escape.h"
#include "core/status.h"
#include "data/criteo.h"
#include "data/synthetic.h"

namespace dlrm::server {
namespace {

namespace fs = std::filesystem;

// True when `path` equals `root` or lies below it (both normalised).
bool Within(const fs::path& root, const fs::path& path) {
  auto r = root.begin(), p = path.begin();
  for (; r != root.end(); ++r, ++p) {
    if (r->empty()) continue;  // a trailing separator
    if (p == path.end() || *r != *p) return false;
  }
  return true;
}

// `field = "path"` for a message, the path escaped.
std::string Named(absl::string_view field, const std::string& path) {
  return absl::StrCat(field, " = \"", EscapeForMessage(path), "\"");
}

// InvalidArgument for an empty path or one holding a NUL byte (the OS would
// see only the part before it, which is not the path that was checked).
absl::Status CheckPathText(const std::string& path, absl::string_view field) {
  if (path.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(field, " is empty"));
  }
  if (path.find('\0') != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat(Named(field, path), " contains a NUL byte"));
  }
  return absl::OkStatus();
}

// `dir` absolute with `..` and the symbolic links that exist resolved.
absl::StatusOr<fs::path> ResolveDir(const std::string& dir) {
  std::error_code ec;
  fs::path resolved = fs::absolute(dir, ec);
  if (!ec) resolved = fs::weakly_canonical(resolved, ec);
  if (ec) {
    return absl::InternalError(absl::StrCat(
        "cannot resolve ", EscapeForMessage(dir), ": ", ec.message()));
  }
  return resolved;
}

// The first three of `paths` (escaped) and a count of the others.
std::string FilesName(
    const google::protobuf::RepeatedPtrField<std::string>& paths) {
  std::string name;
  for (int i = 0; i < paths.size() && i < 3; ++i) {
    absl::StrAppend(&name, i > 0 ? ", " : "", EscapeForMessage(paths[i]));
  }
  if (paths.size() > 3) {
    absl::StrAppend(&name, " and ", paths.size() - 3, " more files");
  }
  return name;
}

// InvalidArgument: the spec `field` names has no source set.
absl::Status NoSource(absl::string_view field) {
  return absl::InvalidArgumentError(
      absl::StrCat(field,
                   " has no source: set criteo_tsv, criteo_binary, criteo_npy "
                   "or synthetic"));
}

}  // namespace

absl::StatusOr<std::string> ResolveUnder(const std::string& root,
                                         const std::string& path,
                                         absl::string_view field) {
  RETURN_IF_ERROR(CheckPathText(path, field));
  if (root.empty()) return path;
  ASSIGN_OR_RETURN(const fs::path base, ResolveDir(root));
  fs::path candidate = fs::path(path);
  if (candidate.is_relative()) candidate = base / candidate;
  // weakly_canonical resolves `..` and the symbolic links that exist, so
  // neither can lead out of the root unnoticed.
  std::error_code ec;
  const fs::path resolved = fs::weakly_canonical(candidate, ec);
  if (ec) {
    return absl::InvalidArgumentError(absl::StrCat(
        Named(field, path), " cannot be resolved: ", ec.message()));
  }
  if (!Within(base, resolved)) {
    return absl::InvalidArgumentError(
        absl::StrCat(Named(field, path), " is outside the directory ",
                     EscapeForMessage(base.string())));
  }
  return resolved.string();
}

absl::Status DataPathOptions::Validate() const {
  for (size_t i = 0; i < allowed_dirs.size(); ++i) {
    if (allowed_dirs[i].empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("allowed_dirs[", i, "] (--allow-data-path) is empty"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ResolveDataPath(const DataPathOptions& options,
                                            const std::string& path,
                                            absl::string_view field) {
  RETURN_IF_ERROR(CheckPathText(path, field));
  if (options.data_dir.empty() && options.allowed_dirs.empty()) {
    return absl::PermissionDeniedError(absl::StrCat(
        Named(field, path),
        ": this server reads no dataset files (it was started without "
        "--data-dir or --allow-data-path); synthetic data needs none"));
  }
  std::vector<fs::path> roots;
  if (!options.data_dir.empty()) {
    ASSIGN_OR_RETURN(fs::path root, ResolveDir(options.data_dir));
    roots.push_back(std::move(root));
  }
  for (const std::string& dir : options.allowed_dirs) {
    ASSIGN_OR_RETURN(fs::path root, ResolveDir(dir));
    roots.push_back(std::move(root));
  }
  fs::path candidate(path);
  if (candidate.is_relative() && !options.data_dir.empty()) {
    candidate = roots.front() / candidate;
  }
  // weakly_canonical resolves `..` and the symbolic links that exist, so
  // neither can lead out of the allowed directories unnoticed. Where the
  // path leads is checked before whether a file is there, so a client
  // cannot probe for files outside them either.
  std::error_code ec;
  fs::path resolved = fs::absolute(candidate, ec);
  if (!ec) resolved = fs::weakly_canonical(resolved, ec);
  const auto inside = [&](const fs::path& root) {
    return Within(root, resolved);
  };
  if (ec || std::none_of(roots.begin(), roots.end(), inside)) {
    return absl::PermissionDeniedError(
        absl::StrCat(Named(field, path),
                     " is outside the directories this server reads data from "
                     "(--data-dir and --allow-data-path)"));
  }
  return resolved.string();
}

absl::StatusOr<DatasetSpec> ResolveDataset(const DatasetSpec& spec,
                                           const ModelConfig& config,
                                           const DataPathOptions& paths,
                                           DatasetRole role,
                                           absl::string_view field) {
  DatasetSpec out = spec;
  switch (spec.source_case()) {
    case DatasetSpec::kCriteoTsv: {
      if (spec.criteo_tsv().paths().empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat(field, ".criteo_tsv.paths is empty"));
      }
      for (int i = 0; i < spec.criteo_tsv().paths_size(); ++i) {
        ASSIGN_OR_RETURN(
            *out.mutable_criteo_tsv()->mutable_paths(i),
            ResolveDataPath(paths, spec.criteo_tsv().paths(i),
                            absl::StrCat(field, ".criteo_tsv.paths[", i, "]")));
      }
      return out;
    }
    case DatasetSpec::kCriteoBinary: {
      if (spec.criteo_binary().empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat(field, ".criteo_binary is empty"));
      }
      ASSIGN_OR_RETURN(*out.mutable_criteo_binary(),
                       ResolveDataPath(paths, spec.criteo_binary(),
                                       absl::StrCat(field, ".criteo_binary")));
      return out;
    }
    case DatasetSpec::kCriteoNpy: {
      const auto& given = spec.criteo_npy().paths();
      if (given.empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat(field, ".criteo_npy.paths is empty"));
      }
      // Each path (a day prefix or a file) is checked before anything is
      // looked up there, then each file of each day again (a symbolic link
      // inside an allowed directory may lead out of it). The resolved spec
      // names every file, so another rank finds the same days.
      std::vector<std::string> resolved;
      for (int i = 0; i < given.size(); ++i) {
        ASSIGN_OR_RETURN(
            resolved.emplace_back(),
            ResolveDataPath(paths, given[i],
                            absl::StrCat(field, ".criteo_npy.paths[", i, "]")));
      }
      absl::StatusOr<std::vector<data::CriteoNpyDay>> days =
          data::FindCriteoNpyDays(
              resolved,
              data::CriteoOptionsForModel(config, false).AnyMultiHot());
      if (!days.ok()) {
        return absl::Status(
            days.status().code(),
            absl::StrCat(field, ".criteo_npy: ", days.status().message()));
      }
      CriteoNpyDays* r = out.mutable_criteo_npy();
      r->clear_paths();
      for (size_t d = 0; d < days->size(); ++d) {
        const data::CriteoNpyDay& day = (*days)[d];
        for (const std::string* file : {&day.dense, &day.sparse, &day.labels}) {
          ASSIGN_OR_RETURN(
              *r->add_paths(),
              ResolveDataPath(paths, *file,
                              absl::StrCat(field, ".criteo_npy day ", d)));
        }
      }
      return out;
    }
    case DatasetSpec::kSynthetic: {
      const SyntheticData& s = spec.synthetic();
      // InvalidArgument "<field>.synthetic.<name> = <value> <why>".
      auto refused = [&](const char* name, auto value, const char* why) {
        return absl::InvalidArgumentError(
            absl::StrCat(field, ".synthetic.", name, " = ", value, " ", why));
      };
      if (s.num_samples() < 0) {
        return refused("num_samples", s.num_samples(), "must be >= 0");
      }
      if (s.zipf_alpha() < 0) {
        return refused("zipf_alpha", s.zipf_alpha(), "must be >= 0");
      }
      if (s.vocabulary() < 0 ||
          s.vocabulary() > data::kMaxSyntheticVocabulary) {
        return refused("vocabulary", s.vocabulary(),
                       "must be in [0, 2^62] (0 = no vocabulary)");
      }
      if (!(s.drift() >= 0 && std::isfinite(s.drift()))) {
        return refused("drift", s.drift(), "must be finite and >= 0");
      }
      if (s.drift() > 0 && s.vocabulary() == 0) {
        return refused("drift", s.drift(),
                       "needs a vocabulary (synthetic.vocabulary > 0)");
      }
      if (s.drift_start() < 0) {
        return refused("drift_start", s.drift_start(), "must be >= 0");
      }
      SyntheticData* r = out.mutable_synthetic();
      r->set_zipf_alpha(s.zipf_alpha() > 0 ? s.zipf_alpha() : 1.05);
      r->set_teacher_seed(s.teacher_seed() != 0 ? s.teacher_seed()
                                                : config.seed());
      // A seed that wraps to 0 stays 0: OpenResolvedDataset leaves seeds as
      // they are.
      r->set_sample_seed(s.sample_seed() != 0
                             ? s.sample_seed()
                             : r->teacher_seed() +
                                   (role == DatasetRole::kTrain ? 1 : 2));
      return out;
    }
    case DatasetSpec::SOURCE_NOT_SET:
      break;
  }
  return NoSource(field);
}

absl::StatusOr<OpenedDataset> OpenResolvedDataset(const DatasetSpec& spec,
                                                  const ModelConfig& config,
                                                  absl::string_view field) {
  OpenedDataset out;
  switch (spec.source_case()) {
    case DatasetSpec::kCriteoTsv: {
      std::vector<std::string> files(spec.criteo_tsv().paths().begin(),
                                     spec.criteo_tsv().paths().end());
      ASSIGN_OR_RETURN(
          out.source,
          data::OpenCriteoTsv(std::move(files),
                              data::CriteoOptionsForModel(
                                  config, spec.criteo_tsv().hash_ids())));
      return out;
    }
    case DatasetSpec::kCriteoBinary: {
      ASSIGN_OR_RETURN(
          out.source,
          data::OpenCriteoBinary(spec.criteo_binary(),
                                 data::CriteoOptionsForModel(config, false)));
      return out;
    }
    case DatasetSpec::kCriteoNpy: {
      const auto& paths = spec.criteo_npy().paths();
      const data::CriteoOptions options =
          data::CriteoOptionsForModel(config, spec.criteo_npy().hash_ids());
      ASSIGN_OR_RETURN(std::vector<data::CriteoNpyDay> days,
                       data::FindCriteoNpyDays({paths.begin(), paths.end()},
                                               options.AnyMultiHot()));
      ASSIGN_OR_RETURN(out.source,
                       data::OpenCriteoNpy(std::move(days), options));
      return out;
    }
    case DatasetSpec::kSynthetic: {
      const SyntheticData& s = spec.synthetic();
      data::SyntheticOptions o;
      o.zipf_alpha = s.zipf_alpha();
      o.teacher_seed = s.teacher_seed();
      o.sample_seed = s.sample_seed();
      o.num_samples = s.num_samples();
      o.vocabulary = s.vocabulary();
      o.drift = s.drift();
      o.drift_start = s.drift_start();
      absl::StatusOr<std::unique_ptr<data::BatchSource>> source =
          data::MakeSyntheticSource(config, o);
      if (!source.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat(field, ".synthetic: ", source.status().message()));
      }
      out.source = *std::move(source);
      // Ids taken modulo a static table's rows are no longer the teacher's:
      // no reference then.
      if (data::SyntheticIdsAreTeacherIds(config, o)) {
        auto teacher = std::make_shared<data::Teacher>(config, o.teacher_seed,
                                                       o.vocabulary);
        out.reference = [teacher](const data::Batch& b, float* probs) {
          teacher->Probabilities(b, probs);
        };
      }
      out.endless = s.num_samples() == 0;
      return out;
    }
    case DatasetSpec::SOURCE_NOT_SET:
      break;
  }
  return NoSource(field);
}

std::string DatasetName(const DatasetSpec& spec) {
  switch (spec.source_case()) {
    case DatasetSpec::kCriteoTsv:
      return FilesName(spec.criteo_tsv().paths());
    case DatasetSpec::kCriteoBinary:
      return EscapeForMessage(spec.criteo_binary());
    case DatasetSpec::kCriteoNpy:
      return FilesName(spec.criteo_npy().paths());
    case DatasetSpec::kSynthetic:
      return "synthetic data";
    case DatasetSpec::SOURCE_NOT_SET:
      break;
  }
  return "no data";
}

absl::StatusOr<OpenedDataset> OpenDataset(const DatasetSpec& spec,
                                          const ModelConfig& config,
                                          const DataPathOptions& paths,
                                          DatasetRole role,
                                          absl::string_view field) {
  ASSIGN_OR_RETURN(const DatasetSpec resolved,
                   ResolveDataset(spec, config, paths, role, field));
  return OpenResolvedDataset(resolved, config, field);
}

}  // namespace dlrm::server
