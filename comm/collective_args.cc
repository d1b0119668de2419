// Argument checks shared by the Communicator implementations.
#include "comm/collective_args.h"

#include <limits>

#include "absl/strings/str_cat.h"
#if defined(DLRM_WITH_CUDA)
#include "comm/cuda_args.h"
#endif
#include "core/device.h"
#include "core/status.h"

namespace dlrm::comm::internal {

absl::StatusOr<size_t> BytesOf(int64_t count, DataType type,
                               absl::string_view what) {
  if (count < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": element count ", count, " is negative"));
  }
  const int64_t element = static_cast<int64_t>(ElementSize(type));
  if (count > std::numeric_limits<int64_t>::max() / element) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": ", count, " elements of ", element, " bytes overflow int64"));
  }
  return static_cast<size_t>(count * element);
}

absl::StatusOr<size_t> BytesOfCounts(std::span<const int64_t> counts,
                                     int world_size, DataType type,
                                     absl::string_view what) {
  if (counts.size() != static_cast<size_t>(world_size)) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", counts.size(),
                                                   " counts for a world of ",
                                                   world_size, " ranks"));
  }
  size_t total = 0;
  for (size_t r = 0; r < counts.size(); ++r) {
    auto bytes = BytesOf(counts[r], type, absl::StrCat(what, "[", r, "]"));
    if (!bytes.ok()) return bytes.status();
    if (*bytes >
        static_cast<size_t>(std::numeric_limits<int64_t>::max()) - total) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": the total byte count overflows int64"));
    }
    total += *bytes;
  }
  return total;
}

absl::Status CheckBuffer(const void* ptr, size_t bytes,
                         absl::string_view what) {
  if (ptr == nullptr && bytes > 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " is null but ", bytes, " bytes were asked for"));
  }
  return absl::OkStatus();
}

absl::Status CheckSummable(DataType type) {
  if (type != DataType::kFloat32 && type != DataType::kInt64) {
    return absl::InvalidArgumentError(
        "AllReduceSum: only kFloat32 and kInt64 can be summed");
  }
  return absl::OkStatus();
}

absl::Status CheckRoot(int root, int world_size) {
  if (root < 0 || root >= world_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Broadcast: root ", root, " is not a rank of a world of ", world_size));
  }
  return absl::OkStatus();
}

absl::Status CheckSelfCounts(std::span<const int64_t> send_counts,
                             std::span<const int64_t> recv_counts, int rank) {
  if (send_counts[rank] != recv_counts[rank]) {
    return absl::InvalidArgumentError(absl::StrCat(
        "AllToAllV: rank ", rank, " sends itself ", send_counts[rank],
        " elements but expects ", recv_counts[rank], " from itself"));
  }
  return absl::OkStatus();
}

absl::Status CheckCudaDevice(int device, absl::string_view who) {
  const int count = CudaDeviceCount();
  if (count == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        who, ": no CUDA device can be used (", CudaUnavailableReason(), ")"));
  }
  if (device < 0 || device >= count) {
    return absl::FailedPreconditionError(
        absl::StrCat(who, ": CUDA device ", device, " is not present (", count,
                     count == 1 ? " device" : " devices", ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<AllToAllVBytes> CheckAllToAllVCounts(
    std::span<const int64_t> send_counts, std::span<const int64_t> recv_counts,
    int world_size, int rank, DataType type) {
  AllToAllVBytes bytes;
  ASSIGN_OR_RETURN(bytes.send, BytesOfCounts(send_counts, world_size, type,
                                             "AllToAllV: send_counts"));
  ASSIGN_OR_RETURN(bytes.recv, BytesOfCounts(recv_counts, world_size, type,
                                             "AllToAllV: recv_counts"));
  RETURN_IF_ERROR(CheckSelfCounts(send_counts, recv_counts, rank));
  return bytes;
}

absl::Status CheckMemory(const void* ptr, size_t bytes, int device,
                         absl::string_view what) {
#if defined(DLRM_WITH_CUDA)
  if (device >= 0) return CheckDeviceBuffer(ptr, bytes, device, what);
#endif
  return CheckBuffer(ptr, bytes, what);
}

absl::StatusOr<size_t> CheckAllReduceSumArgs(const void* data, int64_t count,
                                             DataType type, int device) {
  RETURN_IF_ERROR(CheckSummable(type));
  ASSIGN_OR_RETURN(const size_t bytes, BytesOf(count, type, "AllReduceSum"));
  RETURN_IF_ERROR(CheckMemory(data, bytes, device, "AllReduceSum: data"));
  return bytes;
}

absl::StatusOr<AllToAllVBytes> CheckAllToAllVArgs(
    const void* send, std::span<const int64_t> send_counts, const void* recv,
    std::span<const int64_t> recv_counts, int world_size, int rank,
    DataType type, int device) {
  ASSIGN_OR_RETURN(
      const AllToAllVBytes bytes,
      CheckAllToAllVCounts(send_counts, recv_counts, world_size, rank, type));
  RETURN_IF_ERROR(CheckMemory(send, bytes.send, device, "AllToAllV: send"));
  RETURN_IF_ERROR(CheckMemory(recv, bytes.recv, device, "AllToAllV: recv"));
  return bytes;
}

absl::StatusOr<size_t> CheckAllGatherArgs(const void* send, int64_t count,
                                          const void* recv, int world_size,
                                          DataType type, int device) {
  ASSIGN_OR_RETURN(const size_t bytes, BytesOf(count, type, "AllGather"));
  const size_t world = static_cast<size_t>(world_size);
  if (bytes >
      static_cast<size_t>(std::numeric_limits<int64_t>::max()) / world) {
    return absl::InvalidArgumentError(absl::StrCat(
        "AllGather: ", world, " x ", count, " elements overflow int64 bytes"));
  }
  RETURN_IF_ERROR(CheckMemory(send, bytes, device, "AllGather: send"));
  RETURN_IF_ERROR(CheckMemory(recv, bytes * world, device, "AllGather: recv"));
  return bytes;
}

absl::StatusOr<size_t> CheckBroadcastArgs(const void* data, int64_t count,
                                          DataType type, int root,
                                          int world_size, int device) {
  RETURN_IF_ERROR(CheckRoot(root, world_size));
  ASSIGN_OR_RETURN(const size_t bytes, BytesOf(count, type, "Broadcast"));
  RETURN_IF_ERROR(CheckMemory(data, bytes, device, "Broadcast: data"));
  return bytes;
}

}  // namespace dlrm::comm::internal
