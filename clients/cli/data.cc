// dlrm_client's data: the local samples a subcommand reads and sends, and
// the datasets it names for the server to read.
#include <algorithm>
#include <iostream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "clients/cli/cli.h"
#include "clients/tsv_input.h"
#include "core/config.h"
#include "core/status.h"
#include "data/criteo.h"
#include "data/synthetic.h"

namespace dlrm::clients::cli {

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The config that shapes local data: `spec` when given, else the server's.
absl::StatusOr<ModelConfig> ResolveConfig(Client& client,
                                          const std::string& spec) {
  if (!spec.empty()) return LoadModelConfig(spec);
  ASSIGN_OR_RETURN(ModelInfo info, client.GetModelInfo());
  return NormalizeModelConfig(info.config());
}

absl::StatusOr<LocalData> OpenLocalData(const DataFlags& flags,
                                        const ModelConfig& config,
                                        uint64_t sample_seed_offset) {
  LocalData local;
  if (flags.synthetic >= 0) {
    if (!flags.files.empty()) {
      return absl::InvalidArgumentError(
          "give either --data or --synthetic, not both");
    }
    data::SyntheticOptions options;
    options.zipf_alpha = flags.zipf_alpha;
    options.teacher_seed =
        flags.data_seed != 0 ? flags.data_seed : config.seed();
    options.sample_seed = options.teacher_seed + sample_seed_offset;
    options.num_samples = flags.synthetic;
    ASSIGN_OR_RETURN(local.source, data::MakeSyntheticSource(config, options));
    local.total = flags.synthetic;
    return local;
  }
  if (flags.files.empty()) {
    return absl::InvalidArgumentError(
        "no data: give --data FILE... or --synthetic N");
  }
  const data::CriteoOptions options =
      data::CriteoOptionsForModel(config, flags.hash_ids);
  if (flags.files.size() == 1 && flags.files[0] == "-") {
    ASSIGN_OR_RETURN(local.source,
                     OpenCriteoStream(&std::cin, "stdin", options));
    return local;
  }
  if (flags.files.size() == 1 && EndsWith(flags.files[0], ".bin")) {
    ASSIGN_OR_RETURN(local.source,
                     data::OpenCriteoBinary(flags.files[0], options));
    // The opened file's header holds the count (0: unknown).
    local.total = data::ReadCriteoBinaryCount(flags.files[0]).value_or(0);
    return local;
  }
  if (data::IsCriteoNpy(flags.files)) {
    ASSIGN_OR_RETURN(
        std::vector<data::CriteoNpyDay> days,
        data::FindCriteoNpyDays(flags.files, options.AnyMultiHot()));
    ASSIGN_OR_RETURN(local.source,
                     data::OpenCriteoNpy(std::move(days), options));
    return local;
  }
  ASSIGN_OR_RETURN(local.source, data::OpenCriteoTsv(flags.files, options));
  return local;
}
// `sample_seed_offset` is added to the teacher seed for the sample stream.
absl::StatusOr<DatasetSpec> ServerDataset(const DataFlags& flags,
                                          const std::string& what,
                                          uint64_t model_seed,
                                          uint64_t sample_seed_offset) {
  DatasetSpec spec;
  if (flags.synthetic >= 0) {
    if (!flags.files.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "give either files or synthetic samples for ", what, ", not both"));
    }
    SyntheticData* synthetic = spec.mutable_synthetic();
    synthetic->set_num_samples(flags.synthetic);
    synthetic->set_zipf_alpha(flags.zipf_alpha);
    const uint64_t teacher =
        flags.data_seed != 0 ? flags.data_seed : model_seed;
    synthetic->set_teacher_seed(teacher);
    synthetic->set_sample_seed(teacher + sample_seed_offset);
    return spec;
  }
  if (flags.files.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("no ", what, " data: give files or synthetic samples"));
  }
  if (flags.files.size() == 1 && EndsWith(flags.files[0], ".bin")) {
    spec.set_criteo_binary(flags.files[0]);
    return spec;
  }
  const bool npy =
      flags.npy || std::all_of(flags.files.begin(), flags.files.end(),
                               [](const std::string& f) {
                                 return EndsWith(f, ".npy") ||
                                        EndsWith(f, ".npz");
                               });
  if (npy) {
    CriteoNpyDays* days = spec.mutable_criteo_npy();
    for (const std::string& f : flags.files) days->add_paths(f);
    days->set_hash_ids(flags.hash_ids);
    return spec;
  }
  CriteoFiles* tsv = spec.mutable_criteo_tsv();
  for (const std::string& f : flags.files) tsv->add_paths(f);
  tsv->set_hash_ids(flags.hash_ids);
  return spec;
}

}  // namespace dlrm::clients::cli
