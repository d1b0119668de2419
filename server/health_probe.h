// dlrm_server --health-check HOST:PORT: a container health probe that asks
// a server for its gRPC health (grpc.health.v1), over TLS too. Debian's
// gRPC has no generated health client and Debian ships no
// grpc_health_probe, so the call is sent as raw bytes.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

namespace dlrm::server {

struct HealthProbeOptions {
  // The server to ask, HOST:PORT; empty: no probe. Default: empty.
  std::string target;
  // Over TLS, trusting the system's CA certificates; implied by any of the
  // fields below. Default: false.
  bool tls = false;
  // PEM CA certificates that sign the server's certificate. Default: empty.
  std::string ca_file;
  // PEM client certificate and its key, for a server that asks for one;
  // both or neither. Default: empty.
  std::string cert_file, key_file;
  // The name the server's certificate must carry, when not the host in
  // `target`. Default: empty.
  std::string server_name;
  // How long the call may take, in seconds. Default: 5.
  double timeout_seconds = 5;
};

// One grpc.health.v1.Health/Check call of the whole server (service "")
// over `channel`, within `timeout_seconds`: the call's status, and the
// raw HealthCheckResponse bytes into *response when not null.
grpc::Status CallHealthCheck(const std::shared_ptr<grpc::Channel>& channel,
                             double timeout_seconds,
                             grpc::ByteBuffer* response = nullptr);

// grpc.health.v1.Health/Check of the whole server (service "") at
// options.target: prints "HOST:PORT: STATE" and returns 0 when SERVING;
// else 1, the reason on stderr (a bad option, an unreachable server, a
// status other than SERVING).
int HealthCheck(const HealthProbeOptions& options);

}  // namespace dlrm::server
