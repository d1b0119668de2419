// Collectives between the ranks of one job: the interface the hybrid-parallel
// step is written against, with a Gloo implementation for CPU ranks (and
// NCCL for GPU ranks with the CUDA backend). Every rank must call the same
// collectives in the same order with matching sizes.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

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

// One rank's view of a communicator. Not thread-safe: one thread issues the
// collectives (a rank's step is sequential). Buffers are borrowed for the
// duration of the call. A peer that died or stopped answering gives
// Unavailable or DeadlineExceeded within the communicator's timeout; after
// an error the communicator is unusable (the job stops).
class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int world_size() const = 0;

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

  virtual absl::Status Barrier() = 0;
};

// The communicator of a job with one rank: every collective is a copy.
std::unique_ptr<Communicator> MakeSingleRankCommunicator();

}  // namespace dlrm::comm
