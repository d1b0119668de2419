// Server-side data: resolving client-given paths against the server's
// directories, and opening a DatasetSpec (Criteo TSV, binary, synthetic) as
// a BatchSource for jobs and evaluation.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "data/source.h"
#include "dlrm/config.pb.h"
#include "dlrm/service.pb.h"
#include "model/trainer.h"

namespace dlrm::server {

// Resolves `path` from a client. With an empty `root`, returns it as given.
// Otherwise a relative path is taken under `root`, and the result must stay
// inside `root` (after resolving `..` and symbolic links): InvalidArgument
// naming `field` for an empty path or one that escapes.
absl::StatusOr<std::string> ResolveUnder(const std::string& root,
                                         const std::string& path,
                                         absl::string_view field);

// Which stream a synthetic spec with sample_seed 0 draws.
enum class DatasetRole {
  kTrain,  // sample_seed = teacher_seed + 1
  kEval,   // sample_seed = teacher_seed + 2 (disjoint from training)
};

struct OpenedDataset {
  std::unique_ptr<data::BatchSource> source;
  // The planted teacher's scorer for synthetic data; null otherwise.
  model::ReferenceScorer reference;
  // True for endless synthetic data (a sample or step cap is needed).
  bool endless = false;
};

// Opens `spec` for a model of `config`. Relative file paths resolve under
// `data_dir` (when set). InvalidArgument naming `field` for an unset source
// or bad options, NotFound for a missing file, InvalidArgument for a binary
// file whose columns do not match the model.
absl::StatusOr<OpenedDataset> OpenDataset(const DatasetSpec& spec,
                                          const ModelConfig& config,
                                          const std::string& data_dir,
                                          DatasetRole role,
                                          absl::string_view field);

}  // namespace dlrm::server
