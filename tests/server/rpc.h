// What the server tests do alike through the generated stubs: expect an
// RPC's error, hold the training slot with an open Train stream.
#pragma once

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "dlrm/service.grpc.pb.h"
#include "tests/support/expect.h"

namespace dlrm::test {

// `status` has `code` and a message that contains `text`.
inline void ExpectRpcError(const grpc::Status& status, grpc::StatusCode code,
                           const std::string& text) {
  EXPECT_EQ(status.error_code(), code) << status.error_message();
  EXPECT_HAS_SUBSTR(status.error_message(), text) << status.error_message();
}

using TrainStream = grpc::ClientReaderWriter<TrainRequest, TrainResponse>;

// A Train stream on `trainer` under `context` that has trained `batch` and
// read its result; still open, it holds the server's one training slot.
// Null, after a test failure, when the write or the read fails.
inline std::unique_ptr<TrainStream> TrainedOneBatch(
    Trainer::Stub& trainer, grpc::ClientContext* context, const Batch& batch) {
  std::unique_ptr<TrainStream> stream = trainer.Train(context);
  TrainRequest request;
  *request.mutable_batch() = batch;
  TrainResponse response;
  if (!stream->Write(request) || !stream->Read(&response)) {
    ADD_FAILURE() << "the first batch of a Train stream was not trained";
    return nullptr;
  }
  return stream;
}

}  // namespace dlrm::test
