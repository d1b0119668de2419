// Raw gRPC calls for tests: bytes that need not be a valid message, sent
// through a generic stub to a named method, so that a test can send what no
// generated client would (bytes that do not parse, a stream that mixes
// them with good messages).
#pragma once

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace dlrm::test {

// Metadata (key, value) a raw call sends, e.g. {"authorization", "Bearer
// ..."}.
using Metadata = std::vector<std::pair<std::string, std::string>>;

struct RawUnaryReply {
  grpc::Status status;
  std::string bytes;  // the reply message, when status is OK
};

struct RawStreamReply {
  grpc::Status status;
  std::vector<std::string> messages;  // the replies, in order
};

// The bytes `buffer` holds.
inline std::string BufferBytes(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  std::string bytes;
  if (buffer.Dump(&slices).ok()) {
    for (const grpc::Slice& s : slices) {
      bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
    }
  }
  return bytes;
}

namespace internal {

// Waits for the one operation in flight on `cq`; returns its ok.
inline bool Await(grpc::CompletionQueue& cq) {
  void* tag = nullptr;
  bool ok = false;
  if (!cq.Next(&tag, &ok)) return false;
  return ok;
}

inline void Drain(grpc::CompletionQueue& cq) {
  cq.Shutdown();
  void* tag = nullptr;
  bool ok = false;
  while (cq.Next(&tag, &ok)) {
  }
}

inline void Prepare(grpc::ClientContext& context, const Metadata& metadata) {
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(60));
  for (const auto& [key, value] : metadata) context.AddMetadata(key, value);
}

}  // namespace internal

// One unary call of `method` (e.g. "/dlrm.Predictor/Predict") carrying
// `request` as its message; a 60 s deadline.
inline RawUnaryReply RawUnaryCall(const std::shared_ptr<grpc::Channel>& channel,
                                  const std::string& method,
                                  const std::string& request,
                                  const Metadata& metadata = {}) {
  grpc::GenericStub stub(channel);
  grpc::ClientContext context;
  internal::Prepare(context, metadata);
  grpc::Slice slice(request);
  const grpc::ByteBuffer bytes(&slice, 1);
  grpc::CompletionQueue cq;
  grpc::ByteBuffer response;
  RawUnaryReply reply;
  auto call = stub.PrepareUnaryCall(&context, method, bytes, &cq);
  call->StartCall();
  call->Finish(&response, &reply.status, nullptr);
  internal::Await(cq);
  internal::Drain(cq);
  if (reply.status.ok()) reply.bytes = BufferBytes(response);
  return reply;
}

// Sends `messages` in order on one streaming call of `method`, half-closes,
// then reads every reply and the final status. One operation at a time: a
// write the server no longer reads (it ended the call) fails and the rest
// are skipped. A 60 s deadline.
inline RawStreamReply RawStreamCall(
    const std::shared_ptr<grpc::Channel>& channel, const std::string& method,
    const std::vector<std::string>& messages, const Metadata& metadata = {}) {
  grpc::GenericStub stub(channel);
  grpc::ClientContext context;
  internal::Prepare(context, metadata);
  grpc::CompletionQueue cq;
  RawStreamReply reply;
  auto call = stub.PrepareCall(&context, method, &cq);
  call->StartCall(nullptr);
  if (internal::Await(cq)) {
    bool open = true;
    for (const std::string& m : messages) {
      grpc::Slice slice(m);
      const grpc::ByteBuffer bytes(&slice, 1);
      call->Write(bytes, nullptr);
      if (!internal::Await(cq)) {
        open = false;
        break;
      }
    }
    if (open) {
      call->WritesDone(nullptr);
      internal::Await(cq);
    }
    while (true) {
      grpc::ByteBuffer bytes;
      call->Read(&bytes, nullptr);
      if (!internal::Await(cq)) break;
      reply.messages.push_back(BufferBytes(bytes));
    }
  }
  call->Finish(&reply.status, nullptr);
  internal::Await(cq);
  internal::Drain(cq);
  return reply;
}

}  // namespace dlrm::test
