// NCCL collectives on device buffers. Every call is enqueued on the
// communicator's stream and then waited for by polling, so that a peer that
// died (NCCL would wait forever) turns into an aborted communicator and a
// DeadlineExceeded after the op timeout instead of a hang.
#include "comm/nccl_communicator.h"

#include <nccl.h>

#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "comm/collective_args.h"
#include "comm/coordinator.h"
#include "core/cuda_status.h"
#include "core/status.h"

// Returns Internal from the enclosing function when `expr` (an
// ncclResult_t) is not ncclSuccess, naming the call and NCCL's message.
#define NCCL_RETURN_IF_ERROR(expr)                                        \
  do {                                                                    \
    const ncclResult_t _dlrm_nccl_res = (expr);                           \
    if (_dlrm_nccl_res != ncclSuccess) {                                  \
      return ::absl::InternalError(::absl::StrCat(                        \
          #expr, " failed: ", ncclGetErrorString(_dlrm_nccl_res), " at ", \
          __FILE__, ":", __LINE__));                                      \
    }                                                                     \
  } while (0)

namespace dlrm::comm {
namespace {

using Clock = std::chrono::steady_clock;

ncclDataType_t NcclType(DataType t) {
  switch (t) {
    case DataType::kUint8:
      return ncclUint8;
    case DataType::kFloat32:
      return ncclFloat32;
    case DataType::kInt64:
      return ncclInt64;
  }
  return ncclUint8;
}

// Owns the communicator and its stream; not copyable.
class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(ncclComm_t comm, cudaStream_t stream, int rank, int world,
                   int device, double op_timeout_seconds)
      : comm_(comm),
        stream_(stream),
        rank_(rank),
        world_(world),
        device_(device),
        op_timeout_(op_timeout_seconds) {}
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;
  ~NcclCommunicator() override {
    if (broken_) {
      ncclCommAbort(comm_);
    } else {
      ncclCommDestroy(comm_);
    }
    if (scratch_ != nullptr) cudaFree(scratch_);
    cudaStreamDestroy(stream_);
  }

  int rank() const override { return rank_; }
  int world_size() const override { return world_; }

  absl::Status AllReduceSum(void* data, int64_t count, DataType type) override {
    RETURN_IF_ERROR(internal::CheckSummable(type));
    ASSIGN_OR_RETURN(size_t bytes,
                     internal::BytesOf(count, type, "AllReduceSum: count"));
    RETURN_IF_ERROR(internal::CheckBuffer(data, bytes, "AllReduceSum: data"));
    RETURN_IF_ERROR(Usable());
    NCCL_RETURN_IF_ERROR(ncclAllReduce(data, data, count, NcclType(type),
                                       ncclSum, comm_, stream_));
    return Wait("AllReduceSum");
  }

  absl::Status AllToAllV(const void* send, std::span<const int64_t> send_counts,
                         void* recv, std::span<const int64_t> recv_counts,
                         DataType type) override {
    ASSIGN_OR_RETURN(size_t send_bytes,
                     internal::BytesOfCounts(send_counts, world_, type,
                                             "AllToAllV: send_counts"));
    ASSIGN_OR_RETURN(size_t recv_bytes,
                     internal::BytesOfCounts(recv_counts, world_, type,
                                             "AllToAllV: recv_counts"));
    RETURN_IF_ERROR(internal::CheckSelfCounts(send_counts, recv_counts, rank_));
    RETURN_IF_ERROR(internal::CheckBuffer(send, send_bytes, "AllToAllV: send"));
    RETURN_IF_ERROR(internal::CheckBuffer(recv, recv_bytes, "AllToAllV: recv"));
    RETURN_IF_ERROR(Usable());
    // All-to-all as grouped point-to-point sends and receives (NCCL has no
    // all-to-all-v); a pair with nothing to move posts nothing.
    const size_t element = ElementSize(type);
    const char* s = static_cast<const char*>(send);
    char* r = static_cast<char*>(recv);
    NCCL_RETURN_IF_ERROR(ncclGroupStart());
    for (int peer = 0; peer < world_; ++peer) {
      if (send_counts[peer] > 0) {
        NCCL_RETURN_IF_ERROR(ncclSend(s, send_counts[peer], NcclType(type),
                                      peer, comm_, stream_));
      }
      if (recv_counts[peer] > 0) {
        NCCL_RETURN_IF_ERROR(ncclRecv(r, recv_counts[peer], NcclType(type),
                                      peer, comm_, stream_));
      }
      s += send_counts[peer] * element;
      r += recv_counts[peer] * element;
    }
    NCCL_RETURN_IF_ERROR(ncclGroupEnd());
    return Wait("AllToAllV");
  }

  absl::Status AllGather(const void* send, int64_t count, void* recv,
                         DataType type) override {
    ASSIGN_OR_RETURN(size_t bytes,
                     internal::BytesOf(count, type, "AllGather: count"));
    RETURN_IF_ERROR(internal::CheckBuffer(send, bytes, "AllGather: send"));
    RETURN_IF_ERROR(
        internal::CheckBuffer(recv, bytes * world_, "AllGather: recv"));
    RETURN_IF_ERROR(Usable());
    NCCL_RETURN_IF_ERROR(
        ncclAllGather(send, recv, count, NcclType(type), comm_, stream_));
    return Wait("AllGather");
  }

  absl::Status Broadcast(void* data, int64_t count, DataType type,
                         int root) override {
    RETURN_IF_ERROR(internal::CheckRoot(root, world_));
    ASSIGN_OR_RETURN(size_t bytes,
                     internal::BytesOf(count, type, "Broadcast: count"));
    RETURN_IF_ERROR(internal::CheckBuffer(data, bytes, "Broadcast: data"));
    RETURN_IF_ERROR(Usable());
    NCCL_RETURN_IF_ERROR(
        ncclBroadcast(data, data, count, NcclType(type), root, comm_, stream_));
    return Wait("Broadcast");
  }

  absl::Status Barrier() override {
    RETURN_IF_ERROR(Usable());
    if (scratch_ == nullptr) {
      CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
      CUDA_RETURN_IF_ERROR(cudaMalloc(&scratch_, sizeof(int64_t)));
    }
    NCCL_RETURN_IF_ERROR(ncclAllReduce(scratch_, scratch_, 1, ncclInt64,
                                       ncclSum, comm_, stream_));
    return Wait("Barrier");
  }

 private:
  absl::Status Usable() const {
    if (broken_) {
      return absl::FailedPreconditionError(
          "NCCL communicator is unusable after an earlier error");
    }
    return absl::OkStatus();
  }

  // Waits for the stream, watching NCCL's asynchronous error; aborts the
  // communicator when a peer failed or the op timeout passed.
  absl::Status Wait(const char* op) {
    const Clock::time_point deadline =
        Clock::now() + std::chrono::duration_cast<Clock::duration>(
                           std::chrono::duration<double>(op_timeout_));
    while (true) {
      const cudaError_t done = cudaStreamQuery(stream_);
      if (done == cudaSuccess) return absl::OkStatus();
      if (done != cudaErrorNotReady) {
        broken_ = true;
        return absl::InternalError(absl::StrCat(
            "NCCL ", op, ": stream failed: ", cudaGetErrorString(done)));
      }
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(comm_, &async);
      if (async != ncclSuccess && async != ncclInProgress) {
        broken_ = true;
        return absl::UnavailableError(absl::StrCat(
            "NCCL ", op, " on rank ", rank_, ": ", ncclGetErrorString(async)));
      }
      if (Clock::now() > deadline) {
        broken_ = true;
        return absl::DeadlineExceededError(
            absl::StrCat("NCCL ", op, " on rank ", rank_, " did not finish in ",
                         op_timeout_, " s (a peer stopped answering)"));
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  ncclComm_t comm_;
  cudaStream_t stream_;
  int rank_;
  int world_;
  int device_;
  double op_timeout_;
  bool broken_ = false;
  void* scratch_ = nullptr;  // one int64 on the device, for Barrier
};

}  // namespace

absl::Status NcclOptions::Validate() const {
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "NcclOptions: rank ", rank, " of world_size ", world_size));
  }
  if (world_size > 1 && coordinator_address.empty()) {
    return absl::InvalidArgumentError(
        "NcclOptions: coordinator_address is required for world_size > 1");
  }
  if (device < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("NcclOptions: device must be >= 0, got ", device));
  }
  if (!(connect_timeout_seconds > 0) || !(op_timeout_seconds > 0)) {
    return absl::InvalidArgumentError("NcclOptions: timeouts must be > 0");
  }
  return absl::OkStatus();
}

bool CudaDeviceAvailable() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

absl::StatusOr<std::unique_ptr<Communicator>> ConnectNccl(
    const NcclOptions& options) {
  RETURN_IF_ERROR(options.Validate());
  if (!CudaDeviceAvailable()) {
    return absl::FailedPreconditionError(
        "ConnectNccl: no CUDA device is available to this process");
  }
  CUDA_RETURN_IF_ERROR(cudaSetDevice(options.device));

  ncclUniqueId id;
  if (options.world_size == 1) {
    NCCL_RETURN_IF_ERROR(ncclGetUniqueId(&id));
  } else {
    ASSIGN_OR_RETURN(std::unique_ptr<CoordinatorClient> client,
                     CoordinatorClient::Create(options.coordinator_address));
    ASSIGN_OR_RETURN(uint64_t session,
                     client->RegisterRank(options.job_id, options.generation,
                                          options.rank, options.world_size,
                                          options.connect_timeout_seconds));
    constexpr char kKey[] = "nccl-unique-id";
    if (options.rank == 0) {
      NCCL_RETURN_IF_ERROR(ncclGetUniqueId(&id));
      RETURN_IF_ERROR(client->StoreSet(
          session, kKey,
          std::string_view(reinterpret_cast<const char*>(&id), sizeof(id)),
          options.connect_timeout_seconds));
    } else {
      ASSIGN_OR_RETURN(
          std::string value,
          client->StoreGet(session, kKey, options.connect_timeout_seconds));
      if (value.size() != sizeof(id)) {
        return absl::InternalError(
            absl::StrCat("ConnectNccl: the coordinator's unique id has ",
                         value.size(), " bytes, expected ", sizeof(id)));
      }
      std::memcpy(&id, value.data(), sizeof(id));
    }
  }

  // Non-blocking init so a rank that never arrives cannot hang us: poll
  // until done or the connect timeout, then abort.
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  ncclResult_t res = ncclCommInitRankConfig(&comm, options.world_size, id,
                                            options.rank, &config);
  const Clock::time_point deadline =
      Clock::now() +
      std::chrono::duration_cast<Clock::duration>(
          std::chrono::duration<double>(options.connect_timeout_seconds));
  while (res == ncclInProgress) {
    if (Clock::now() > deadline) {
      ncclCommAbort(comm);
      return absl::DeadlineExceededError(absl::StrCat(
          "ConnectNccl: rank ", options.rank, " of ", options.world_size,
          ": the other ranks did not join within ",
          options.connect_timeout_seconds, " s"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    ncclCommGetAsyncError(comm, &res);
  }
  if (res != ncclSuccess) {
    if (comm != nullptr) ncclCommAbort(comm);
    return absl::InternalError(
        absl::StrCat("ConnectNccl: ncclCommInitRankConfig failed: ",
                     ncclGetErrorString(res)));
  }
  cudaStream_t stream = nullptr;
  const cudaError_t st =
      cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  if (st != cudaSuccess) {
    ncclCommDestroy(comm);
    return absl::InternalError(
        absl::StrCat("ConnectNccl: cudaStreamCreateWithFlags failed: ",
                     cudaGetErrorString(st)));
  }
  return std::unique_ptr<Communicator>(
      new NcclCommunicator(comm, stream, options.rank, options.world_size,
                           options.device, options.op_timeout_seconds));
}

}  // namespace dlrm::comm
