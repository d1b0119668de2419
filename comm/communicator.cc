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
    return internal::CheckAllReduceSumArgs(data, count, type, internal::kHost)
        .status();
  }

  absl::Status AllToAllV(const void* send, std::span<const int64_t> send_counts,
                         void* recv, std::span<const int64_t> recv_counts,
                         DataType type) override {
    ASSIGN_OR_RETURN(
        const internal::AllToAllVBytes bytes,
        internal::CheckAllToAllVArgs(send, send_counts, recv, recv_counts, 1, 0,
                                     type, internal::kHost));
    const size_t send_bytes = bytes.send;
    // memmove: a caller may pass the same buffer for both.
    if (send_bytes > 0) std::memmove(recv, send, send_bytes);
    return absl::OkStatus();
  }

  absl::Status AllGather(const void* send, int64_t count, void* recv,
                         DataType type) override {
    ASSIGN_OR_RETURN(const size_t bytes,
                     internal::CheckAllGatherArgs(send, count, recv, 1, type,
                                                  internal::kHost));
    if (bytes > 0) std::memmove(recv, send, bytes);
    return absl::OkStatus();
  }

  absl::Status Broadcast(void* data, int64_t count, DataType type,
                         int root) override {
    return internal::CheckBroadcastArgs(data, count, type, root, 1,
                                        internal::kHost)
        .status();
  }

  absl::Status Barrier() override { return absl::OkStatus(); }
};

}  // namespace

std::unique_ptr<Communicator> MakeSingleRankCommunicator() {
  return std::make_unique<SingleRankCommunicator>();
}

}  // namespace dlrm::comm
