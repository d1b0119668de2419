// Collectives between the ranks of one job: the interface the hybrid-parallel
// step is written against. Host communicators (Gloo, single-rank) take host
// buffers, device communicators (NCCL, single-rank device, host-staged)
// CUDA device buffers; comm/factory.h picks one. Every rank must call the same
// collectives in the same order with matching sizes.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/device.h"

namespace dlrm::comm {

// Element types the collectives move.
enum class DataType { kUint8, kFloat32, kInt64 };

inline size_t ElementSize(DataType t) {
  switch (t) {
    case DataType::kUint8:
      return 1;
    case DataType::kFloat32:
      return 4;
    case DataType::kInt64:
      return 8;
  }
  return 1;
}

// Where the buffers a communicator takes live (core/device.h).
using ::dlrm::MemorySpace;
using ::dlrm::MemorySpaceName;

// One rank's view of a communicator. Not thread-safe: one thread issues the
// collectives (a rank's step is sequential). Buffers are borrowed for the
// duration of the call, and on a device communicator with a stream (see
// SetStream) until the stream has passed the collective. A peer that died
// or stopped answering gives Unavailable or DeadlineExceeded within the
// communicator's timeout; after such an error the communicator is unusable
// (later calls give FailedPrecondition; the job stops). Refused arguments
// (InvalidArgument) leave it usable.
class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int world_size() const = 0;

  // kHost: every buffer is host memory. kDevice: every buffer is memory of
  // the communicator's CUDA device (InvalidArgument otherwise), or host
  // memory for a host-staged communicator over the CPU Device.
  virtual MemorySpace memory_space() const = 0;

  // Device communicators: every later collective reads its input after the
  // work queued on `stream` (a cudaStream_t, passed as void* so that this
  // header needs no CUDA) before the call, and `stream` waits for the
  // collective before its later work; the call returns once the collective
  // is queued, not done. `stream` is borrowed until replaced or the
  // communicator is destroyed, and must belong to the communicator's device
  // (InvalidArgument otherwise). nullptr, the start: every call returns when
  // its collective is done, and its inputs must be complete (their stream
  // synchronised) before the call.
  // Host communicators: their calls are done on return; only nullptr is
  // accepted (InvalidArgument otherwise).
  virtual absl::Status SetStream(void* stream);

  // Waits until every collective issued so far is done. The error of a
  // collective that failed after its call returned (DeadlineExceeded past
  // the op timeout, Unavailable for a failed peer), or FailedPrecondition
  // after an earlier error. Host communicators: OK at once.
  virtual absl::Status Synchronize();

  // In-place element-wise sum of `count` elements across all ranks
  // (kFloat32 or kInt64; InvalidArgument for kUint8).
  virtual absl::Status AllReduceSum(void* data, int64_t count,
                                    DataType type) = 0;

  // Personalised exchange: this rank sends send_counts[r] elements (laid out
  // rank after rank in `send`) to rank r and receives recv_counts[r]
  // elements from rank r into `recv` (rank after rank). Both spans have
  // world_size() entries; counts may be 0. send_counts[r] on this rank must
  // equal recv_counts[this rank] on rank r.
  virtual absl::Status AllToAllV(const void* send,
                                 std::span<const int64_t> send_counts,
                                 void* recv,
                                 std::span<const int64_t> recv_counts,
                                 DataType type) = 0;

  // Every rank contributes `count` elements; `recv` receives world_size() x
  // count elements, rank after rank.
  virtual absl::Status AllGather(const void* send, int64_t count, void* recv,
                                 DataType type) = 0;

  // Copies `count` elements from `root`'s `data` into every rank's `data`.
  virtual absl::Status Broadcast(void* data, int64_t count, DataType type,
                                 int root) = 0;

  // Returns when every rank has called Barrier (on a device communicator
  // also when every collective issued before it is done, whatever the
  // stream).
  virtual absl::Status Barrier() = 0;
};

// The host communicator of a job with one rank: every collective is a copy
// (memmove, so the buffers may be the same) or nothing.
std::unique_ptr<Communicator> MakeSingleRankCommunicator();

// The device communicator of a job with one rank on CUDA device `device`:
// every collective is a cudaMemcpyAsync device to device (on the stream
// given to SetStream, else on its own stream, waited for) or nothing;
// AllToAllV and AllGather take the same buffer for send and recv (no copy)
// but not partly overlapping ones (InvalidArgument). FailedPrecondition
// naming why when there is no such device (built without CUDA, no driver,
// no device); Internal for other CUDA errors.
absl::StatusOr<std::unique_ptr<Communicator>> MakeSingleRankDeviceCommunicator(
    int device);

}  // namespace dlrm::comm
