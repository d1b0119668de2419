// Argument checks shared by the Communicator implementations, so that every
// backend refuses the same bad calls with the same InvalidArgument message.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "comm/communicator.h"

namespace dlrm::comm::internal {

// Bytes of `count` elements of `type`. InvalidArgument (naming `what`) when
// count < 0 or the byte count overflows int64.
absl::StatusOr<size_t> BytesOf(int64_t count, DataType type,
                               absl::string_view what);

// Total bytes of the per-rank `counts`. InvalidArgument when counts does not
// have world_size entries, an entry is negative, or the total overflows.
absl::StatusOr<size_t> BytesOfCounts(std::span<const int64_t> counts,
                                     int world_size, DataType type,
                                     absl::string_view what);

// InvalidArgument when `ptr` is null but `bytes` > 0.
absl::Status CheckBuffer(const void* ptr, size_t bytes, absl::string_view what);

// InvalidArgument unless elements of `type` can be summed (kFloat32, kInt64).
absl::Status CheckSummable(DataType type);

// InvalidArgument unless 0 <= root < world_size.
absl::Status CheckRoot(int root, int world_size);

// OK when this process can use CUDA device `device`; otherwise
// FailedPrecondition, prefixed with `who`, naming why: built without CUDA,
// no driver (the runtime's message), no device, or fewer devices.
absl::Status CheckCudaDevice(int device, absl::string_view who);

// InvalidArgument unless this rank sends itself as many elements as it
// receives from itself (the one pairing a rank can check alone).
absl::Status CheckSelfCounts(std::span<const int64_t> send_counts,
                             std::span<const int64_t> recv_counts, int rank);

// AllToAllV's send and recv bytes from its counts: BytesOfCounts of each
// (naming "AllToAllV: send_counts" / "recv_counts") and CheckSelfCounts.
struct AllToAllVBytes {
  size_t send = 0;
  size_t recv = 0;
};
absl::StatusOr<AllToAllVBytes> CheckAllToAllVCounts(
    std::span<const int64_t> send_counts, std::span<const int64_t> recv_counts,
    int world_size, int rank, DataType type);

// The `device` of host memory in the checks below.
inline constexpr int kHost = -1;

// A buffer argument named `what`: CheckBuffer for host memory (`device`
// -1), else CheckDeviceBuffer (cuda_args.h) for memory of CUDA device
// `device`.
absl::Status CheckMemory(const void* ptr, size_t bytes, int device,
                         absl::string_view what);

// Each collective's argument checks, its buffers in the memory of `device`
// as CheckMemory says, so that every communicator refuses the same calls
// alike. They return the bytes the call moves: of `data`; AllToAllV's send
// and recv; AllGather's of one rank (recv holds world_size times as many).
absl::StatusOr<size_t> CheckAllReduceSumArgs(const void* data, int64_t count,
                                             DataType type, int device);
absl::StatusOr<AllToAllVBytes> CheckAllToAllVArgs(
    const void* send, std::span<const int64_t> send_counts, const void* recv,
    std::span<const int64_t> recv_counts, int world_size, int rank,
    DataType type, int device);
absl::StatusOr<size_t> CheckAllGatherArgs(const void* send, int64_t count,
                                          const void* recv, int world_size,
                                          DataType type, int device);
absl::StatusOr<size_t> CheckBroadcastArgs(const void* data, int64_t count,
                                          DataType type, int root,
                                          int world_size, int device);

}  // namespace dlrm::comm::internal
