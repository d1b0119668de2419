// dlrm_convert: converts Criteo TSV files or NumPy days (TorchRec's .npy,
// MLPerf's multi-hot .npz) into the binary format that the trainer
// memory-maps (see data/criteo.h): version 1 (raw one-hot values), or with
// --config version 2, the multi-hot bags of that config's tables
// materialised (a dynamic table's as raw uint64 ids, never reduced).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <string>
#include <vector>

#include "core/cli_parse.h"
#include "core/config.h"
#include "data/criteo.h"

int main(int argc, char** argv) {
  CLI::App app{
      "Converts Criteo TSV files (label, integer and hex categorical columns)\n"
      "or NumPy days (DIR/day_N for day_N_{dense,sparse,labels}.npy or\n"
      "day_N_sparse_multi_hot.npz, or those files) into one binary file of\n"
      "fixed-width records."};
  std::string out;
  int num_dense = 13;
  int num_sparse = 26;
  std::string config_spec;
  std::vector<std::string> inputs;
  app.add_option("--out", out, "Binary file to write")->required();
  CLI::Option* dense_flag =
      app.add_option("--num-dense", num_dense, "Integer columns per line")
          ->capture_default_str()
          ->check(CLI::NonNegativeNumber);
  CLI::Option* sparse_flag =
      app.add_option("--num-sparse", num_sparse, "Categorical columns per line")
          ->capture_default_str()
          ->check(CLI::PositiveNumber);
  dlrm::AddConfigFlag(app, &config_spec, dlrm::PresetNames(),
                      "write version 2, each table's bags of multi_hot_size "
                      "ids derived from its rows (data/multi_hot.h; a "
                      "dynamic table's from its raw ids, stored as raw) and "
                      "stored; the columns follow the config")
      ->excludes(dense_flag)
      ->excludes(sparse_flag);
  app.add_option("inputs", inputs,
                 "TSV files, or NumPy day prefixes or files, read in order")
      ->required()
      ->expected(1, -1);
  CLI11_PARSE(app, argc, argv);

  const bool npy = dlrm::data::IsCriteoNpy(inputs);
  absl::StatusOr<int64_t> count;
  if (config_spec.empty()) {
    if (npy) {
      const auto days = dlrm::data::FindCriteoNpyDays(inputs, false);
      count = days.ok() ? dlrm::data::ConvertCriteoNpyToBinary(
                              *days, out, num_dense, num_sparse)
                        : absl::StatusOr<int64_t>(days.status());
    } else {
      count = dlrm::data::ConvertCriteoTsvToBinary(inputs, out, num_dense,
                                                   num_sparse);
    }
  } else {
    const absl::StatusOr<dlrm::ModelConfig> config =
        dlrm::LoadModelConfig(config_spec);
    if (!config.ok()) {
      std::fprintf(stderr, "dlrm_convert: --config %s: %s\n",
                   config_spec.c_str(),
                   std::string(config.status().message()).c_str());
      return 1;
    }
    const dlrm::data::CriteoOptions options =
        dlrm::data::CriteoOptionsForModel(*config, /*hash_ids=*/false);
    if (npy) {
      const auto days =
          dlrm::data::FindCriteoNpyDays(inputs, options.AnyMultiHot());
      count = days.ok() ? dlrm::data::ConvertCriteoNpyToMultiHotBinary(
                              *days, out, options)
                        : absl::StatusOr<int64_t>(days.status());
    } else {
      count =
          dlrm::data::ConvertCriteoTsvToMultiHotBinary(inputs, out, options);
    }
  }
  if (!count.ok()) {
    std::fprintf(stderr, "dlrm_convert: %s\n",
                 std::string(count.status().message()).c_str());
    return 1;
  }
  std::printf("wrote %lld records to %s\n", static_cast<long long>(*count),
              out.c_str());
  return 0;
}
