// The host-staged device Communicator: each collective copies its device
// input into host staging memory, runs a host communicator's collective on
// it and copies the result back (comm/host_staged_communicator.h).
#include "comm/host_staged_communicator.h"

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <utility>

#if defined(DLRM_WITH_CUDA)
#include <cuda_runtime_api.h>

#include "comm/cuda_args.h"
#include "core/cuda_status.h"
#endif
#include "absl/strings/str_cat.h"
#include "comm/collective_args.h"
#include "core/status.h"

namespace dlrm::comm {
namespace {

#if defined(DLRM_WITH_CUDA)
constexpr bool kCanPin = true;
#else
constexpr bool kCanPin = false;  // no page-locked memory without CUDA
#endif

// Host memory a collective is staged in: page-locked when `pinned` (CUDA
// copies to and from it are synchronous and run at full speed), else 64-byte
// aligned. Grows to the largest Reserve and never shrinks; its contents are
// lost when it grows. Not copyable.
class StagingBuffer {
 public:
  explicit StagingBuffer(bool pinned) : pinned_(pinned && kCanPin) {}
  StagingBuffer(const StagingBuffer&) = delete;
  StagingBuffer& operator=(const StagingBuffer&) = delete;
  ~StagingBuffer() { Release(); }

  // nullptr until a Reserve of more than 0 bytes.
  void* data() const { return data_; }

  // Makes room for `bytes`. ResourceExhausted when no (page-locked) host
  // memory of that size can be had.
  absl::Status Reserve(size_t bytes) {
    if (bytes <= bytes_) return absl::OkStatus();
    Release();
    void* p = nullptr;
#if defined(DLRM_WITH_CUDA)
    if (pinned_) {
      const cudaError_t err = cudaMallocHost(&p, bytes);
      if (err != cudaSuccess) {
        cudaGetLastError();  // Not a kernel error: keep it out of later checks.
        return absl::ResourceExhaustedError(
            absl::StrCat("host-staged communicator: cannot allocate ", bytes,
                         " bytes of page-locked staging memory (",
                         cudaGetErrorString(err), ")"));
      }
    }
#endif
    if (!pinned_) {
      constexpr size_t kAlign = 64;
      p = std::aligned_alloc(kAlign, (bytes + kAlign - 1) / kAlign * kAlign);
      if (p == nullptr) {
        return absl::ResourceExhaustedError(
            absl::StrCat("host-staged communicator: cannot allocate ", bytes,
                         " bytes of staging memory"));
      }
    }
    data_ = p;
    bytes_ = bytes;
    return absl::OkStatus();
  }

 private:
  void Release() {
    if (data_ != nullptr) {
#if defined(DLRM_WITH_CUDA)
      if (pinned_) cudaFreeHost(data_);
#endif
      if (!pinned_) std::free(data_);
    }
    data_ = nullptr;
    bytes_ = 0;
  }

  const bool pinned_;
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

class HostStagedCommunicator final : public Communicator {
 public:
  // `cuda_device` is the ordinal of `device` when it is a CUDA device, -1
  // for the CPU device.
  HostStagedCommunicator(std::unique_ptr<Communicator> host,
                         std::unique_ptr<Device> device, int cuda_device)
      : host_(std::move(host)),
        device_(std::move(device)),
        cuda_device_(cuda_device),
        in_(cuda_device >= 0),
        out_(cuda_device >= 0) {}

  int rank() const override { return host_->rank(); }
  int world_size() const override { return host_->world_size(); }
  MemorySpace memory_space() const override { return MemorySpace::kDevice; }

  absl::Status SetStream(void* stream) override {
    if (stream == nullptr) {
      caller_ = nullptr;
      return absl::OkStatus();
    }
    if (cuda_device_ < 0) {
      return absl::InvalidArgumentError(
          "SetStream: the host-staged communicator over the CPU device takes "
          "no stream (its calls are done on return)");
    }
#if defined(DLRM_WITH_CUDA)
    internal::ScopedDevice scoped;
    RETURN_IF_ERROR(scoped.SetForStream(cuda_device_, stream).status());
#endif
    caller_ = stream;
    return absl::OkStatus();
  }

  // Every collective is done when its call returns.
  absl::Status Synchronize() override { return CheckUsable(); }

  absl::Status AllReduceSum(void* data, int64_t count, DataType type) override {
    ASSIGN_OR_RETURN(const size_t bytes, internal::CheckAllReduceSumArgs(
                                             data, count, type, cuda_device_));
    RETURN_IF_ERROR(CheckUsable());
    return Staged([&]() -> absl::Status {
      RETURN_IF_ERROR(in_.Reserve(bytes));
      RETURN_IF_ERROR(device_->CopyToHost(in_.data(), data, bytes));
      RETURN_IF_ERROR(host_->AllReduceSum(in_.data(), count, type));
      return device_->CopyToDevice(data, in_.data(), bytes);
    });
  }

  absl::Status AllToAllV(const void* send, std::span<const int64_t> send_counts,
                         void* recv, std::span<const int64_t> recv_counts,
                         DataType type) override {
    ASSIGN_OR_RETURN(
        const internal::AllToAllVBytes bytes,
        internal::CheckAllToAllVArgs(send, send_counts, recv, recv_counts,
                                     world_size(), rank(), type, cuda_device_));
    const size_t send_bytes = bytes.send, recv_bytes = bytes.recv;
    RETURN_IF_ERROR(CheckUsable());
    return Staged([&]() -> absl::Status {
      RETURN_IF_ERROR(in_.Reserve(send_bytes));
      RETURN_IF_ERROR(out_.Reserve(recv_bytes));
      RETURN_IF_ERROR(device_->CopyToHost(in_.data(), send, send_bytes));
      RETURN_IF_ERROR(host_->AllToAllV(in_.data(), send_counts, out_.data(),
                                       recv_counts, type));
      return device_->CopyToDevice(recv, out_.data(), recv_bytes);
    });
  }

  absl::Status AllGather(const void* send, int64_t count, void* recv,
                         DataType type) override {
    ASSIGN_OR_RETURN(const size_t bytes,
                     internal::CheckAllGatherArgs(
                         send, count, recv, world_size(), type, cuda_device_));
    const size_t recv_bytes = bytes * static_cast<size_t>(world_size());
    RETURN_IF_ERROR(CheckUsable());
    return Staged([&]() -> absl::Status {
      RETURN_IF_ERROR(in_.Reserve(bytes));
      RETURN_IF_ERROR(out_.Reserve(recv_bytes));
      RETURN_IF_ERROR(device_->CopyToHost(in_.data(), send, bytes));
      RETURN_IF_ERROR(host_->AllGather(in_.data(), count, out_.data(), type));
      return device_->CopyToDevice(recv, out_.data(), recv_bytes);
    });
  }

  absl::Status Broadcast(void* data, int64_t count, DataType type,
                         int root) override {
    ASSIGN_OR_RETURN(const size_t bytes,
                     internal::CheckBroadcastArgs(data, count, type, root,
                                                  world_size(), cuda_device_));
    RETURN_IF_ERROR(CheckUsable());
    const bool is_root = root == rank();
    return Staged([&]() -> absl::Status {
      RETURN_IF_ERROR(in_.Reserve(bytes));
      // Only the root's data is read, and only the others' is written.
      if (is_root) {
        RETURN_IF_ERROR(device_->CopyToHost(in_.data(), data, bytes));
      }
      RETURN_IF_ERROR(host_->Broadcast(in_.data(), count, type, root));
      if (is_root) return absl::OkStatus();
      return device_->CopyToDevice(data, in_.data(), bytes);
    });
  }

  // Every collective before it is done when its call returned, so only the
  // ranks are waited for.
  absl::Status Barrier() override {
    RETURN_IF_ERROR(CheckUsable());
    return Failed(host_->Barrier());
  }

 private:
  absl::Status CheckUsable() const {
    if (broken_.ok()) return absl::OkStatus();
    return absl::FailedPreconditionError(absl::StrCat(
        "communicator unusable after an earlier error: ", broken_.message()));
  }

  // Records a failure past the argument checks: the ranks may be out of
  // step, so the communicator refuses further work.
  absl::Status Failed(absl::Status status) {
    if (!status.ok()) broken_ = status;
    return status;
  }

  // Runs `stage` (copies out, host collective, copies back) with the CUDA
  // device current and after the caller's stream has drained.
  template <typename F>
  absl::Status Staged(F&& stage) {
#if defined(DLRM_WITH_CUDA)
    internal::ScopedDevice scoped;
    if (cuda_device_ >= 0) {
      RETURN_IF_ERROR(Failed(scoped.Set(cuda_device_)));
      if (caller_ != nullptr) {
        RETURN_IF_ERROR(Failed(WaitForCaller()));
      }
    }
#endif
    return Failed(stage());
  }

#if defined(DLRM_WITH_CUDA)
  absl::Status WaitForCaller() const {
    CUDA_RETURN_IF_ERROR(
        cudaStreamSynchronize(static_cast<cudaStream_t>(caller_)));
    return absl::OkStatus();
  }
#endif

  std::unique_ptr<Communicator> host_;
  std::unique_ptr<Device> device_;
  const int cuda_device_;   // -1: the CPU device
  StagingBuffer in_;        // each collective's input
  StagingBuffer out_;       // AllToAllV's and AllGather's output
  void* caller_ = nullptr;  // a cudaStream_t, borrowed (SetStream)
  absl::Status broken_;     // the first failure past the argument checks
};

}  // namespace

absl::StatusOr<std::unique_ptr<Communicator>> MakeHostStagedCommunicator(
    std::unique_ptr<Communicator> host, DeviceKind kind, int device) {
  if (host == nullptr) {
    return absl::InvalidArgumentError(
        "MakeHostStagedCommunicator: host is null");
  }
  if (host->memory_space() != MemorySpace::kHost) {
    return absl::InvalidArgumentError(
        "MakeHostStagedCommunicator: host takes device buffers; it must be a "
        "host communicator (Gloo or single-rank)");
  }
  if (kind == DeviceKind::kCpu) {
    return std::unique_ptr<Communicator>(
        new HostStagedCommunicator(std::move(host), CreateCpuDevice(), -1));
  }
  if (device < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "MakeHostStagedCommunicator: device must be >= 0, got ", device));
  }
  RETURN_IF_ERROR(
      internal::CheckCudaDevice(device, "MakeHostStagedCommunicator"));
#if defined(DLRM_WITH_CUDA)
  // CreateCudaDevice makes `device` current; the caller's stays current.
  internal::ScopedDevice scoped;
  RETURN_IF_ERROR(scoped.Set(device));
#endif
  ASSIGN_OR_RETURN(std::unique_ptr<Device> cuda, CreateCudaDevice(device));
  return std::unique_ptr<Communicator>(
      new HostStagedCommunicator(std::move(host), std::move(cuda), device));
}

}  // namespace dlrm::comm
