// The Communicator interface's host defaults, and the single-rank host
// Communicator: with one rank every collective is a copy (or nothing), so
// the hybrid-parallel step runs unchanged on one process.
#include "comm/communicator.h"

#include <cstring>

#include "comm/collective_args.h"
#include "core/status.h"

namespace dlrm::comm {

absl::Status Communicator::SetStream(void* stream) {
  if (stream != nullptr) {
    return absl::InvalidArgumentError(
        "SetStream: a host communicator takes no stream (its calls are done "
        "on return)");
  }
  return absl::OkStatus();
}

absl::Status Communicator::Synchronize() { return absl::OkStatus(); }

namespace {

class SingleRankCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  MemorySpace memory_space() const override { return MemorySpace::kHost; }

  absl::Status AllReduceSum(void* data, int64_t count, DataType type) override {
    RETURN_IF_ERROR(internal::CheckSummable(type));
    ASSIGN_OR_RETURN(size_t bytes,
                     internal::BytesOf(count, type, "AllReduceSum"));
    return internal::CheckBuffer(data, bytes, "AllReduceSum: data");
  }

  absl::Status AllToAllV(const void* send, std::span<const int64_t> send_counts,
                         void* recv, std::span<const int64_t> recv_counts,
                         DataType type) override {
    ASSIGN_OR_RETURN(
        const internal::AllToAllVBytes bytes,
        internal::CheckAllToAllVCounts(send_counts, recv_counts, 1, 0, type));
    const size_t send_bytes = bytes.send, recv_bytes = bytes.recv;
    RETURN_IF_ERROR(internal::CheckBuffer(send, send_bytes, "AllToAllV: send"));
    RETURN_IF_ERROR(internal::CheckBuffer(recv, recv_bytes, "AllToAllV: recv"));
    // memmove: a caller may pass the same buffer for both.
    if (send_bytes > 0) std::memmove(recv, send, send_bytes);
    return absl::OkStatus();
  }

  absl::Status AllGather(const void* send, int64_t count, void* recv,
                         DataType type) override {
    ASSIGN_OR_RETURN(size_t bytes, internal::BytesOf(count, type, "AllGather"));
    RETURN_IF_ERROR(internal::CheckBuffer(send, bytes, "AllGather: send"));
    RETURN_IF_ERROR(internal::CheckBuffer(recv, bytes, "AllGather: recv"));
    if (bytes > 0) std::memmove(recv, send, bytes);
    return absl::OkStatus();
  }

  absl::Status Broadcast(void* data, int64_t count, DataType type,
                         int root) override {
    RETURN_IF_ERROR(internal::CheckRoot(root, 1));
    ASSIGN_OR_RETURN(size_t bytes, internal::BytesOf(count, type, "Broadcast"));
    return internal::CheckBuffer(data, bytes, "Broadcast: data");
  }

  absl::Status Barrier() override { return absl::OkStatus(); }
};

}  // namespace

std::unique_ptr<Communicator> MakeSingleRankCommunicator() {
  return std::make_unique<SingleRankCommunicator>();
}

}  // namespace dlrm::comm
