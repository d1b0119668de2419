// Raw gRPC byte buffers <-> protobuf messages.
#include "server/raw_message.h"

#include <grpcpp/impl/codegen/proto_utils.h>
#include <grpcpp/support/proto_buffer_reader.h>
#include <grpcpp/support/proto_buffer_writer.h>

#include "absl/strings/str_cat.h"

namespace dlrm::server {

absl::Status ParseRaw(grpc::ByteBuffer* bytes,
                      google::protobuf::Message* message,
                      absl::string_view what) {
  const grpc::Status parsed =
      grpc::GenericDeserialize<grpc::ProtoBufferReader,
                               google::protobuf::Message>(bytes, message);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " could not be parsed as ", message->GetDescriptor()->name()));
  }
  return absl::OkStatus();
}

absl::Status SerializeRaw(const google::protobuf::Message& message,
                          grpc::ByteBuffer* bytes) {
  bool own_buffer = false;
  const grpc::Status serialized =
      grpc::GenericSerialize<grpc::ProtoBufferWriter,
                             google::protobuf::Message>(message, bytes,
                                                        &own_buffer);
  if (!serialized.ok()) {
    return absl::InternalError(absl::StrCat("cannot serialize a ",
                                            message.GetDescriptor()->name(),
                                            ": ", serialized.error_message()));
  }
  return absl::OkStatus();
}

}  // namespace dlrm::server
