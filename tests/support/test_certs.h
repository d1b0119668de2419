// Throwaway certificates for the TLS tests, made at test time by the
// openssl command-line tool (no keys are checked in).
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"

namespace dlrm::test {

// Makes in `dir` (which must exist): ca.pem/ca.key, the test CA;
// other-ca.pem/other-ca.key, a CA nothing trusts; server.pem/server.key,
// signed by the test CA for DNS:localhost and IP:127.0.0.1 (CN localhost),
// without extendedKeyUsage, so it serves as a client certificate too;
// client.pem/client.key, signed by the test CA; stranger.pem, client.key's
// certificate signed by other-ca. True when openssl made them all; its
// output is in dir/openssl.log.
inline bool MakeTestCertificates(const std::filesystem::path& dir) {
  std::ofstream(dir / "san.cnf")
      << "subjectAltName=DNS:localhost,IP:127.0.0.1\n";
  const std::string key =
      " -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
  const std::string script =
      "cd '" + dir.string() + "' && openssl req -x509" + key +
      " -keyout ca.key -out ca.pem -days 2 -subj /CN=dlrm-test-ca" +
      " && openssl req -x509" + key +
      " -keyout other-ca.key -out other-ca.pem -days 2"
      " -subj /CN=dlrm-other-ca" +
      " && openssl req" + key +
      " -keyout server.key -out server.csr -subj /CN=localhost" +
      " && openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key"
      " -CAcreateserial -out server.pem -days 2 -extfile san.cnf" +
      " && openssl req" + key +
      " -keyout client.key -out client.csr -subj /CN=dlrm-test-client" +
      " && openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key"
      " -CAcreateserial -out client.pem -days 2" +
      " && openssl x509 -req -in client.csr -CA other-ca.pem"
      " -CAkey other-ca.key -CAcreateserial -out stranger.pem -days 2";
  const std::string log = (dir / "openssl.log").string();
  return std::system(("(" + script + ") >'" + log + "' 2>&1").c_str()) == 0;
}

// A fixture whose suite shares the certificates of MakeTestCertificates,
// made once per suite in a directory of its own (removed after it); each
// test skips, saying why, when openssl could not make them.
class TestCertificatesTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    certs_dir_ = new std::filesystem::path(
        std::filesystem::temp_directory_path() /
        absl::StrCat(
            "dlrm_test_pki_", getpid(), "_",
            ::testing::UnitTest::GetInstance()->current_test_suite()->name()));
    std::filesystem::remove_all(*certs_dir_);
    std::filesystem::create_directories(*certs_dir_);
    certs_made_ = MakeTestCertificates(*certs_dir_);
  }

  static void TearDownTestSuite() {
    std::filesystem::remove_all(*certs_dir_);
    delete certs_dir_;
    certs_dir_ = nullptr;
  }

  void SetUp() override {
    if (!certs_made_) {
      GTEST_SKIP() << "the openssl tool could not make test certificates "
                      "(see openssl.log; is openssl installed?)";
    }
  }

  // The path of one of MakeTestCertificates' files ("ca.pem", ...).
  static std::string File(const std::string& name) {
    return (*certs_dir_ / name).string();
  }

 private:
  static inline std::filesystem::path* certs_dir_ = nullptr;
  static inline bool certs_made_ = false;
};

}  // namespace dlrm::test
