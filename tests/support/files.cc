#include "tests/support/files.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <limits>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "tests/support/process.h"

namespace dlrm::test {

std::filesystem::path MakeTempDir(const std::string& tag) {
  static std::atomic<int> counter{0};
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() /
      absl::StrCat("dlrm_",
                   std::filesystem::path(SelfPath()).filename().string(), "_",
                   getpid(), "_", tag, "_", counter++);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

std::filesystem::path MakeTestDir() {
  return MakeTempDir(
      ::testing::UnitTest::GetInstance()->current_test_info()->name());
}

std::string ReadFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void WriteFile(const std::filesystem::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
  EXPECT_TRUE(out.good()) << path;
}

double MetricValue(const std::string& text, const std::string& series) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(series + " ", 0) == 0) {
      return std::stod(line.substr(series.size() + 1));
    }
  }
  return std::numeric_limits<double>::quiet_NaN();
}

void WriteTinyTsv(const std::filesystem::path& path, int samples) {
  std::ofstream out(path);
  for (int i = 0; i < samples; ++i) {
    out << (i % 3 == 0 ? 1 : 0) << "\t" << i % 7 << "\t\t" << i % 11 << "\t"
        << i % 5 << "\t" << std::hex << 0x1000 + i << "\t\t" << 0xabc + 7 * i
        << std::dec << "\n";
  }
}

}  // namespace dlrm::test
