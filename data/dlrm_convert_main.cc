// dlrm_convert: converts Criteo TSV files into the binary format that the
// trainer memory-maps (see data/criteo.h).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <string>
#include <vector>

#include "data/criteo.h"

int main(int argc, char** argv) {
  CLI::App app{
      "Converts Criteo TSV files (label, integer and hex categorical columns)\n"
      "into one binary file of fixed-width records."};
  std::string out;
  int num_dense = 13;
  int num_sparse = 26;
  std::vector<std::string> inputs;
  app.add_option("--out", out, "Binary file to write")->required();
  app.add_option("--num-dense", num_dense, "Integer columns per line")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--num-sparse", num_sparse, "Categorical columns per line")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("inputs", inputs, "TSV files, read in order")
      ->required()
      ->expected(1, -1);
  CLI11_PARSE(app, argc, argv);

  const absl::StatusOr<int64_t> count =
      dlrm::data::ConvertCriteoTsvToBinary(inputs, out, num_dense, num_sparse);
  if (!count.ok()) {
    std::fprintf(stderr, "dlrm_convert: %s\n",
                 std::string(count.status().message()).c_str());
    return 1;
  }
  std::printf("wrote %lld records to %s\n", static_cast<long long>(*count),
              out.c_str());
  return 0;
}
