// Protobuf messages to and from the raw byte buffers of the methods the
// server registers raw (Trainer.Train, Predictor.Predict). gRPC 1.51's
// callback API reports a message that fails to parse as the end of a stream
// (so a stream ended with OK) or as UNIMPLEMENTED with no message (a unary
// call); those methods take the bytes instead and parse them here, where a
// failure can be told apart and named.
#pragma once

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/message.h"

namespace dlrm::server {

// Parses `bytes` into `message` and empties `bytes`. InvalidArgument
// "<what> could not be parsed as <message type>" (e.g. "request could not
// be parsed as PredictRequest") when they are not one; `message` is then
// unspecified.
absl::Status ParseRaw(grpc::ByteBuffer* bytes,
                      google::protobuf::Message* message,
                      absl::string_view what);

// Serializes `message` into `bytes` (replacing what they held). Internal
// when protobuf cannot (a message over 2 GiB).
absl::Status SerializeRaw(const google::protobuf::Message& message,
                          grpc::ByteBuffer* bytes);

}  // namespace dlrm::server
