// Writes .npy files as np.save does (format 1.0, C order), for tests that
// need NumPy days without a Python: tests/data/npy_test.cc checks the readers
// against numpy's own files, these only feed them.
#pragma once

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

namespace dlrm::testing_npy {

// Writes `values` (rows x values.size() / rows, or a 1-d array of `rows`
// when `cols` is 0) to `path` with dtype `descr` ("<f4", "<u4", ...), which
// must match T. Returns false when writing fails.
template <typename T>
bool WriteNpy(const std::string& path, const std::string& descr,
              const std::vector<T>& values, int64_t rows, int64_t cols) {
  const std::string shape = cols == 0
                                ? absl::StrCat("(", rows, ",)")
                                : absl::StrCat("(", rows, ", ", cols, ")");
  std::string header =
      absl::StrCat("{'descr': '", descr,
                   "', 'fortran_order': False, 'shape': ", shape, ", }");
  // numpy pads the header with spaces and a newline to a multiple of 64.
  header.resize((10 + header.size() + 1 + 63) / 64 * 64 - 10 - 1, ' ');
  header += '\n';
  const uint16_t length = static_cast<uint16_t>(header.size());
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << std::string("\x93NUMPY\x01\x00", 8);
  out.write(reinterpret_cast<const char*>(&length), sizeof(length));
  out << header;
  out.write(reinterpret_cast<const char*>(values.data()),
            static_cast<std::streamsize>(values.size() * sizeof(T)));
  return out.good();
}

}  // namespace dlrm::testing_npy
