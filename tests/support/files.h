// Files for the tests: fresh temporary directories, whole-file reads and
// writes, a value from Prometheus text, a tiny Criteo TSV file.
#ifndef DLRM_TESTS_SUPPORT_FILES_H_
#define DLRM_TESTS_SUPPORT_FILES_H_

#include <filesystem>
#include <string>

namespace dlrm::test {

// A new empty directory under the system's temporary directory, named by
// this binary, its process id, `tag` and a count (so the tests of one
// process, and several processes at once, never share one). The caller
// removes it.
std::filesystem::path MakeTempDir(const std::string& tag);

// MakeTempDir named by the running test (its gtest name).
std::filesystem::path MakeTestDir();

// The bytes of `path` ("" when it cannot be read).
std::string ReadFile(const std::filesystem::path& path);

// Replaces `path` with `bytes`; a gtest failure when it cannot.
void WriteFile(const std::filesystem::path& path, const std::string& bytes);

// The value of the sample line `series` (name plus labels) in Prometheus
// text, or NaN when absent.
double MetricValue(const std::string& text, const std::string& series);

// A Criteo TSV file of the tiny model's shape (label, 4 integer features, 3
// hex categoricals) with `samples` good lines.
void WriteTinyTsv(const std::filesystem::path& path, int samples);

}  // namespace dlrm::test

#endif  // DLRM_TESTS_SUPPORT_FILES_H_
