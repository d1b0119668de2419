// The health probe of dlrm_server --health-check (health_probe.h).
#include "server/health_probe.h"

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "comm/grpc_auth.h"

namespace dlrm::server {
namespace {

absl::StatusOr<std::shared_ptr<grpc::Channel>> HealthChannel(
    const HealthProbeOptions& o) {
  comm::TlsClientOptions tls;
  tls.enabled = o.tls || !o.ca_file.empty() || !o.cert_file.empty() ||
                !o.server_name.empty();
  if (o.cert_file.empty() != o.key_file.empty()) {
    return absl::InvalidArgumentError(
        "--health-check-cert and --health-check-key go together");
  }
  tls.ca_file = o.ca_file;
  tls.cert_file = o.cert_file;
  tls.key_file = o.key_file;
  tls.server_name = o.server_name;
  return comm::MakeChannel(o.target, tls);
}

}  // namespace

grpc::Status CallHealthCheck(const std::shared_ptr<grpc::Channel>& channel,
                             double timeout_seconds,
                             grpc::ByteBuffer* response) {
  grpc::GenericStub stub(channel);
  grpc::ClientContext context;
  context.set_deadline(
      std::chrono::system_clock::now() +
      std::chrono::milliseconds(static_cast<int64_t>(timeout_seconds * 1000)));
  grpc::Slice empty("");  // HealthCheckRequest{service: ""}
  const grpc::ByteBuffer request(&empty, 1);
  grpc::CompletionQueue cq;
  grpc::ByteBuffer ignored;
  grpc::Status status;
  auto call = stub.PrepareUnaryCall(&context, "/grpc.health.v1.Health/Check",
                                    request, &cq);
  call->StartCall();
  call->Finish(response != nullptr ? response : &ignored, &status,
               reinterpret_cast<void*>(1));
  void* tag = nullptr;
  bool ok = false;
  cq.Next(&tag, &ok);
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  return status;
}

int HealthCheck(const HealthProbeOptions& o) {
  const std::string& target = o.target;
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = HealthChannel(o);
  if (!channel.ok()) {
    std::fprintf(stderr, "dlrm_server: health of %s: %s\n", target.c_str(),
                 channel.status().ToString().c_str());
    return 1;
  }
  grpc::ByteBuffer response;
  const grpc::Status status =
      CallHealthCheck(*channel, o.timeout_seconds, &response);
  if (!status.ok()) {
    std::fprintf(stderr, "dlrm_server: health of %s: %s\n", target.c_str(),
                 status.error_message().c_str());
    return 1;
  }
  std::vector<grpc::Slice> slices;
  std::string bytes;
  if (response.Dump(&slices).ok()) {
    for (const grpc::Slice& s : slices) {
      bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
    }
  }
  // HealthCheckResponse is one enum field, status = 1 (key byte 0x08); its
  // values fit one varint byte; absent means UNKNOWN (0). SERVING is 1.
  const int serving = bytes.size() >= 2 && bytes[0] == 0x08 ? bytes[1] : 0;
  static constexpr const char* kNames[] = {"UNKNOWN", "SERVING", "NOT_SERVING",
                                           "SERVICE_UNKNOWN"};
  std::printf("%s: %s\n", target.c_str(),
              serving >= 0 && serving < 4 ? kNames[serving] : "UNKNOWN");
  return serving == 1 ? 0 : 1;
}

}  // namespace dlrm::server
