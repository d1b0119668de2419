// Server-side data: resolving client-given paths against the server's
// directories (dataset files only inside the allowed ones), and opening a
// DatasetSpec (Criteo TSV, binary, NumPy days, synthetic) as a BatchSource for
// jobs and evaluation.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

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
// naming `field` and the path (escaped) for an empty path, one with a NUL
// byte, or one that escapes.
absl::StatusOr<std::string> ResolveUnder(const std::string& root,
                                         const std::string& path,
                                         absl::string_view field);

// Where the dataset files a client names may be read from: inside
// `data_dir` or one of `allowed_dirs`, after resolving `..` and symbolic
// links. With neither set the server reads no dataset files (synthetic
// data needs none).
struct DataPathOptions {
  // Relative dataset paths resolve here, and files below it may be read
  // (--data-dir). Default: empty (relative paths resolve against the
  // working directory, and must still lead into an allowed directory).
  std::string data_dir;
  // More directories whose files may be read (--allow-data-path).
  // Default: empty.
  std::vector<std::string> allowed_dirs;

  // InvalidArgument for an empty entry of allowed_dirs.
  absl::Status Validate() const;
};

// Resolves the dataset path `path` (named `field` in errors) under
// `options` and returns the file to open: absolute, `..` and symbolic links
// resolved. InvalidArgument for an empty path or one with a NUL byte;
// PermissionDenied naming the path (escaped, never the file's content) when
// it leads outside every allowed directory, or when none is set.
absl::StatusOr<std::string> ResolveDataPath(const DataPathOptions& options,
                                            const std::string& path,
                                            absl::string_view field);

// Which stream a synthetic spec with sample_seed 0 draws.
enum class DatasetRole {
  kTrain,  // sample_seed = teacher_seed + 1
  kEval,   // sample_seed = teacher_seed + 2 (disjoint from training)
};

struct OpenedDataset {
  std::unique_ptr<data::BatchSource> source;
  // The planted teacher's scorer for synthetic data whose ids are the
  // teacher's (data::SyntheticIdsAreTeacherIds); null otherwise.
  model::ReferenceScorer reference;
  // True for endless synthetic data (a sample or step cap is needed).
  bool endless = false;
};

// Checks `spec` and makes it self-contained, so that another rank opens the
// same data from it: file paths resolved through ResolveDataPath with
// `paths` (its errors), synthetic seeds and zipf_alpha set (0 = default
// replaced by the value `role` and `config` give). InvalidArgument naming
// `field` for an unset source or bad options.
absl::StatusOr<DatasetSpec> ResolveDataset(const DatasetSpec& spec,
                                           const ModelConfig& config,
                                           const DataPathOptions& paths,
                                           DatasetRole role,
                                           absl::string_view field);

// Opens a spec that ResolveDataset returned, on this rank, for a model of
// `config`, without checking its paths again (the leader did). NotFound for
// a missing file, InvalidArgument for a binary file whose columns do not
// match the model or bad synthetic options (naming `field`).
absl::StatusOr<OpenedDataset> OpenResolvedDataset(const DatasetSpec& spec,
                                                  const ModelConfig& config,
                                                  absl::string_view field);

// What the data of `spec` is, for messages: its file, its files (the
// first three and a count), or "synthetic data".
std::string DatasetName(const DatasetSpec& spec);

// ResolveDataset, then OpenResolvedDataset: opens `spec` for a model of
// `config`; file paths go through
// ResolveDataPath with `paths` (its errors, PermissionDenied for a file
// outside the allowed directories). InvalidArgument naming `field` for an
// unset source or bad options, NotFound for a missing file, InvalidArgument
// for a binary file whose columns do not match the model.
absl::StatusOr<OpenedDataset> OpenDataset(const DatasetSpec& spec,
                                          const ModelConfig& config,
                                          const DataPathOptions& paths,
                                          DatasetRole role,
                                          absl::string_view field);

}  // namespace dlrm::server
