// Throwaway certificates for the TLS tests, made at test time by the
// openssl command-line tool (no keys are checked in).
#pragma once

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

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

}  // namespace dlrm::test
