// Path resolution and DatasetSpec -> BatchSource.
#include "server/datasets.h"

#include <filesystem>
#include <vector>

#include "absl/strings/str_cat.h"
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

data::CriteoOptions CriteoOptionsFor(const ModelConfig& config, bool hash_ids) {
  data::CriteoOptions options;
  options.num_dense = config.num_dense_features();
  options.hash_ids = hash_ids;
  for (const TableConfig& t : config.tables()) {
    options.table_rows.push_back(t.rows());
  }
  return options;
}

std::string ResolveData(const std::string& data_dir, const std::string& path) {
  if (data_dir.empty() || fs::path(path).is_absolute()) return path;
  return (fs::path(data_dir) / path).string();
}

}  // namespace

absl::StatusOr<std::string> ResolveUnder(const std::string& root,
                                         const std::string& path,
                                         absl::string_view field) {
  if (path.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(field, " is empty"));
  }
  if (root.empty()) return path;
  std::error_code ec;
  const fs::path base = fs::weakly_canonical(fs::absolute(root), ec);
  if (ec) {
    return absl::InternalError(
        absl::StrCat("cannot resolve ", root, ": ", ec.message()));
  }
  fs::path candidate = fs::path(path);
  if (candidate.is_relative()) candidate = base / candidate;
  // weakly_canonical resolves `..` and the symbolic links that exist, so
  // neither can lead out of the root unnoticed.
  const fs::path resolved = fs::weakly_canonical(candidate, ec);
  if (ec) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, " = \"", path, "\" cannot be resolved: ", ec.message()));
  }
  if (!Within(base, resolved)) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, " = \"", path, "\" is outside the directory ", base.string()));
  }
  return resolved.string();
}

absl::StatusOr<OpenedDataset> OpenDataset(const DatasetSpec& spec,
                                          const ModelConfig& config,
                                          const std::string& data_dir,
                                          DatasetRole role,
                                          absl::string_view field) {
  OpenedDataset out;
  switch (spec.source_case()) {
    case DatasetSpec::kCriteoTsv: {
      if (spec.criteo_tsv().paths().empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat(field, ".criteo_tsv.paths is empty"));
      }
      std::vector<std::string> files;
      for (const std::string& p : spec.criteo_tsv().paths()) {
        files.push_back(ResolveData(data_dir, p));
      }
      ASSIGN_OR_RETURN(
          out.source,
          data::OpenCriteoTsv(
              std::move(files),
              CriteoOptionsFor(config, spec.criteo_tsv().hash_ids())));
      return out;
    }
    case DatasetSpec::kCriteoBinary: {
      if (spec.criteo_binary().empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat(field, ".criteo_binary is empty"));
      }
      ASSIGN_OR_RETURN(
          out.source,
          data::OpenCriteoBinary(ResolveData(data_dir, spec.criteo_binary()),
                                 CriteoOptionsFor(config, false)));
      return out;
    }
    case DatasetSpec::kSynthetic: {
      const SyntheticData& s = spec.synthetic();
      if (s.num_samples() < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(field, ".synthetic.num_samples = ", s.num_samples(),
                         " must be >= 0"));
      }
      if (s.zipf_alpha() < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(field, ".synthetic.zipf_alpha = ", s.zipf_alpha(),
                         " must be >= 0"));
      }
      data::SyntheticOptions o;
      o.zipf_alpha = s.zipf_alpha() > 0 ? s.zipf_alpha() : 1.05;
      o.teacher_seed = s.teacher_seed() != 0 ? s.teacher_seed() : config.seed();
      o.sample_seed =
          s.sample_seed() != 0
              ? s.sample_seed()
              : o.teacher_seed + (role == DatasetRole::kTrain ? 1 : 2);
      o.num_samples = s.num_samples();
      absl::StatusOr<std::unique_ptr<data::BatchSource>> source =
          data::MakeSyntheticSource(config, o);
      if (!source.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat(field, ".synthetic: ", source.status().message()));
      }
      out.source = *std::move(source);
      auto teacher = std::make_shared<data::Teacher>(config, o.teacher_seed);
      out.reference = [teacher](const data::Batch& b, float* probs) {
        teacher->Probabilities(b, probs);
      };
      out.endless = s.num_samples() == 0;
      return out;
    }
    case DatasetSpec::SOURCE_NOT_SET:
      break;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      field, " has no source: set criteo_tsv, criteo_binary or synthetic"));
}

}  // namespace dlrm::server
