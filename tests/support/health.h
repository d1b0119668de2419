// grpc.health.v1's Check as a generic call (Debian's gRPC ships no C++
// stubs for it), for the tests that ask a server for its health.
// Header-only: only binaries that link gRPC include it.
#ifndef DLRM_TESTS_SUPPORT_HEALTH_H_
#define DLRM_TESTS_SUPPORT_HEALTH_H_

#include <google/protobuf/descriptor.h>
#include <google/protobuf/descriptor.pb.h>
#include <google/protobuf/dynamic_message.h>
#include <google/protobuf/text_format.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace dlrm::test {

// grpc.health.v1's two messages, built at run time.
inline constexpr char kHealthProto[] = R"pb(
  name: "test_support_health.proto"
  package: "grpc.health.v1"
  syntax: "proto3"
  message_type {
    name: "HealthCheckRequest"
    field { name: "service" number: 1 type: TYPE_STRING label: LABEL_OPTIONAL }
  }
  message_type {
    name: "HealthCheckResponse"
    field { name: "status" number: 1 type: TYPE_INT32 label: LABEL_OPTIONAL }
  }
)pb";

// HealthCheckResponse.ServingStatus SERVING.
inline constexpr int kHealthServing = 1;

// Calls grpc.health.v1.Health/Check for `service` ("" = the whole server)
// over `channel` (10 s deadline) and returns the serving status; the call's
// error (its code) when it fails, Internal when the reply is unreadable.
inline absl::StatusOr<int> CheckHealth(
    const std::shared_ptr<grpc::Channel>& channel, const std::string& service) {
  google::protobuf::FileDescriptorProto file;
  if (!google::protobuf::TextFormat::ParseFromString(kHealthProto, &file)) {
    return absl::InternalError("bad health proto text");
  }
  google::protobuf::DescriptorPool pool;
  if (pool.BuildFile(file) == nullptr) {
    return absl::InternalError("health proto does not build");
  }
  google::protobuf::DynamicMessageFactory factory;
  const auto make = [&](const char* name) {
    return std::unique_ptr<google::protobuf::Message>(
        factory.GetPrototype(pool.FindMessageTypeByName(name))->New());
  };
  std::unique_ptr<google::protobuf::Message> request =
      make("grpc.health.v1.HealthCheckRequest");
  std::unique_ptr<google::protobuf::Message> response =
      make("grpc.health.v1.HealthCheckResponse");
  request->GetReflection()->SetString(
      request.get(), request->GetDescriptor()->FindFieldByName("service"),
      service);

  grpc::GenericStub stub(channel);
  grpc::CompletionQueue cq;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(10));
  const std::string bytes = request->SerializeAsString();
  grpc::Slice slice(bytes);
  const grpc::ByteBuffer request_buffer(&slice, 1);
  std::unique_ptr<grpc::GenericClientAsyncResponseReader> call =
      stub.PrepareUnaryCall(&context, "/grpc.health.v1.Health/Check",
                            request_buffer, &cq);
  call->StartCall();
  grpc::ByteBuffer reply;
  grpc::Status status;
  call->Finish(&reply, &status, nullptr);
  void* tag = nullptr;
  bool ok = false;
  if (!cq.Next(&tag, &ok) || !ok) {
    return absl::InternalError("the health call did not complete");
  }
  if (!status.ok()) {
    return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                        status.error_message());
  }
  std::vector<grpc::Slice> slices;
  if (!reply.Dump(&slices).ok()) {
    return absl::InternalError("unreadable health reply");
  }
  std::string reply_bytes;
  for (const grpc::Slice& s : slices) {
    reply_bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  if (!response->ParseFromString(reply_bytes)) {
    return absl::InternalError("unparsable health reply");
  }
  return response->GetReflection()->GetInt32(
      *response, response->GetDescriptor()->FindFieldByName("status"));
}

}  // namespace dlrm::test

#endif  // DLRM_TESTS_SUPPORT_HEALTH_H_
