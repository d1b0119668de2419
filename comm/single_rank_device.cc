// The single-rank device Communicator: one rank on one GPU, where every
// collective is a device-to-device copy on the caller's stream (or nothing),
// so a one-GPU run drives the same step as R GPU ranks. Without CUDA its
// factory says why it cannot be made.
#include "comm/communicator.h"

#if defined(DLRM_WITH_CUDA)
#include <cuda_runtime_api.h>

#include <utility>

#include "comm/collective_args.h"
#include "comm/cuda_args.h"
#include "core/cuda/cuda_raii.h"
#include "core/cuda_status.h"
#endif
#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace dlrm::comm {

#if defined(DLRM_WITH_CUDA)
namespace {

class SingleRankDeviceCommunicator final : public Communicator {
 public:
  SingleRankDeviceCommunicator(int device, cuda::CudaStream own,
                               cuda::CudaEvent done)
      : device_(device), own_(std::move(own)), done_(std::move(done)) {}

  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  MemorySpace memory_space() const override { return MemorySpace::kDevice; }

  absl::Status SetStream(void* stream) override {
    internal::ScopedDevice scoped;
    ASSIGN_OR_RETURN(cudaStream_t next, scoped.SetForStream(device_, stream));
    // The next stream's copies must also come after those queued so far.
    if (queued_) {
      CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(
          next != nullptr ? next : own_.get(), done_.get()));
    }
    caller_ = next;
    return absl::OkStatus();
  }

  // No peers to wait for: only the copies queued on the caller's stream.
  absl::Status Synchronize() override {
    if (!queued_) return absl::OkStatus();
    CUDA_RETURN_IF_ERROR(cudaEventSynchronize(done_.get()));
    queued_ = false;
    return absl::OkStatus();
  }

  absl::Status AllReduceSum(void* data, int64_t count, DataType type) override {
    return internal::CheckAllReduceSumArgs(data, count, type, device_).status();
  }

  absl::Status AllToAllV(const void* send, std::span<const int64_t> send_counts,
                         void* recv, std::span<const int64_t> recv_counts,
                         DataType type) override {
    ASSIGN_OR_RETURN(
        const internal::AllToAllVBytes bytes,
        internal::CheckAllToAllVArgs(send, send_counts, recv, recv_counts, 1, 0,
                                     type, device_));
    const size_t send_bytes = bytes.send;
    RETURN_IF_ERROR(
        internal::CheckSameOrDisjoint(send, recv, send_bytes, "AllToAllV"));
    return Copy(recv, send, send_bytes);
  }

  absl::Status AllGather(const void* send, int64_t count, void* recv,
                         DataType type) override {
    ASSIGN_OR_RETURN(
        const size_t bytes,
        internal::CheckAllGatherArgs(send, count, recv, 1, type, device_));
    RETURN_IF_ERROR(
        internal::CheckSameOrDisjoint(send, recv, bytes, "AllGather"));
    return Copy(recv, send, bytes);
  }

  absl::Status Broadcast(void* data, int64_t count, DataType type,
                         int root) override {
    return internal::CheckBroadcastArgs(data, count, type, root, 1, device_)
        .status();
  }

  absl::Status Barrier() override { return Synchronize(); }

 private:
  absl::Status Copy(void* dst, const void* src, size_t bytes) {
    if (bytes == 0 || dst == src) return absl::OkStatus();
    internal::ScopedDevice scoped;
    RETURN_IF_ERROR(scoped.Set(device_));
    if (caller_ == nullptr) {
      CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(
          dst, src, bytes, cudaMemcpyDeviceToDevice, own_.get()));
      CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(own_.get()));
      return absl::OkStatus();
    }
    CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, caller_));
    CUDA_RETURN_IF_ERROR(cudaEventRecord(done_.get(), caller_));
    queued_ = true;
    return absl::OkStatus();
  }

  const int device_;
  cuda::CudaStream own_;           // the copies' stream while no stream is set
  cuda::CudaEvent done_;           // recorded after the latest copy on caller_
  cudaStream_t caller_ = nullptr;  // borrowed (SetStream)
  bool queued_ = false;  // done_ was recorded since the last Synchronize
};

}  // namespace

absl::StatusOr<std::unique_ptr<Communicator>> MakeSingleRankDeviceCommunicator(
    int device) {
  RETURN_IF_ERROR(
      internal::CheckCudaDevice(device, "MakeSingleRankDeviceCommunicator"));
  internal::ScopedDevice scoped;
  RETURN_IF_ERROR(scoped.Set(device));
  ASSIGN_OR_RETURN(cuda::CudaStream stream, cuda::CudaStream::Create());
  ASSIGN_OR_RETURN(cuda::CudaEvent done, cuda::CudaEvent::Create());
  return std::unique_ptr<Communicator>(new SingleRankDeviceCommunicator(
      device, std::move(stream), std::move(done)));
}

#else  // !DLRM_WITH_CUDA

absl::StatusOr<std::unique_ptr<Communicator>> MakeSingleRankDeviceCommunicator(
    int device) {
  return absl::FailedPreconditionError(
      absl::StrCat("MakeSingleRankDeviceCommunicator: CUDA device ", device,
                   " cannot be used: this binary was built without CUDA"));
}

#endif  // DLRM_WITH_CUDA

}  // namespace dlrm::comm
