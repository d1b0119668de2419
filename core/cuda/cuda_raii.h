// RAII owners for CUDA resources (STYLE.md habit 7): streams, events,
// device buffers and cuBLAS / cuBLASLt handles. Each is created by a
// factory that returns a Status, cannot be copied, may be moved, and
// releases its resource in the destructor. Include only from code built
// when CUDA is enabled (DLRM_WITH_CUDA).
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "core/cuda_status.h"
#include "core/status.h"

// Returns Internal from the enclosing function when `expr` (a
// cublasStatus_t, from cuBLAS or cuBLASLt) is not CUBLAS_STATUS_SUCCESS.
#define CUBLAS_RETURN_IF_ERROR(expr)                                      \
  do {                                                                    \
    const cublasStatus_t _dlrm_cublas_st = (expr);                        \
    if (_dlrm_cublas_st != CUBLAS_STATUS_SUCCESS) {                       \
      return ::absl::InternalError(::absl::StrCat(                        \
          #expr, " failed: ", cublasGetStatusName(_dlrm_cublas_st), " (", \
          cublasGetStatusString(_dlrm_cublas_st), ") at ", __FILE__, ":", \
          __LINE__));                                                     \
    }                                                                     \
  } while (0)

namespace dlrm::cuda {

// A non-blocking stream (does not synchronise with the legacy default
// stream). Thread-compatible.
class CudaStream {
 public:
  static absl::StatusOr<CudaStream> Create();
  CudaStream() = default;
  CudaStream(CudaStream&& other) noexcept
      : stream_(std::exchange(other.stream_, nullptr)) {}
  CudaStream& operator=(CudaStream&& other) noexcept;
  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;
  ~CudaStream();

  cudaStream_t get() const { return stream_; }
  // Waits for all work queued so far. Internal on a runtime error (also
  // the error of an earlier asynchronous kernel fault).
  absl::Status Synchronize() const;

 private:
  explicit CudaStream(cudaStream_t s) : stream_(s) {}
  cudaStream_t stream_ = nullptr;
};

// An event for ordering streams or timing (timing only when created with
// `timing`). Thread-compatible.
class CudaEvent {
 public:
  static absl::StatusOr<CudaEvent> Create(bool timing = false);
  CudaEvent() = default;
  CudaEvent(CudaEvent&& other) noexcept
      : event_(std::exchange(other.event_, nullptr)) {}
  CudaEvent& operator=(CudaEvent&& other) noexcept;
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;
  ~CudaEvent();

  cudaEvent_t get() const { return event_; }
  absl::Status Record(cudaStream_t stream) const;
  absl::Status Synchronize() const;
  // Milliseconds between `start` and this event (both recorded, timing).
  absl::StatusOr<float> ElapsedMsSince(const CudaEvent& start) const;

 private:
  explicit CudaEvent(cudaEvent_t e) : event_(e) {}
  cudaEvent_t event_ = nullptr;
};

// Untyped device memory from cudaMalloc (256-byte aligned).
class RawDeviceBuffer {
 public:
  // ResourceExhausted when the device is out of memory; 0 bytes gives an
  // empty buffer.
  static absl::StatusOr<RawDeviceBuffer> Allocate(size_t bytes);
  RawDeviceBuffer() = default;
  RawDeviceBuffer(RawDeviceBuffer&& other) noexcept
      : ptr_(std::exchange(other.ptr_, nullptr)),
        bytes_(std::exchange(other.bytes_, 0)) {}
  RawDeviceBuffer& operator=(RawDeviceBuffer&& other) noexcept;
  RawDeviceBuffer(const RawDeviceBuffer&) = delete;
  RawDeviceBuffer& operator=(const RawDeviceBuffer&) = delete;
  ~RawDeviceBuffer();

  void* data() const { return ptr_; }
  size_t bytes() const { return bytes_; }
  // Makes room for at least `bytes`, reallocating (contents lost) only when
  // it must grow; so a workspace reused across steps settles at its peak.
  absl::Status Reserve(size_t bytes);

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// `size` elements of T in device memory. Contents start uninitialised.
template <typename T>
class DeviceBuffer {
 public:
  static absl::StatusOr<DeviceBuffer<T>> Allocate(size_t size) {
    ASSIGN_OR_RETURN(RawDeviceBuffer raw,
                     RawDeviceBuffer::Allocate(size * sizeof(T)));
    return DeviceBuffer<T>(std::move(raw), size);
  }
  DeviceBuffer() = default;

  T* data() const { return static_cast<T*>(raw_.data()); }
  size_t size() const { return size_; }
  // Grows (contents lost) when it holds fewer than `size` elements, then
  // has size() == `size`.
  absl::Status Resize(size_t size) {
    RETURN_IF_ERROR(raw_.Reserve(size * sizeof(T)));
    size_ = size;
    return absl::OkStatus();
  }
  // Copies host.size() elements in at element `offset`, synchronously.
  absl::Status CopyFromHost(std::span<const T> host, size_t offset = 0) {
    if (offset + host.size() > size_) {
      return absl::OutOfRangeError(
          absl::StrCat("DeviceBuffer::CopyFromHost: ", host.size(),
                       " elements at ", offset, " exceed size ", size_));
    }
    if (host.empty()) return absl::OkStatus();
    CUDA_RETURN_IF_ERROR(cudaMemcpy(data() + offset, host.data(),
                                    host.size() * sizeof(T),
                                    cudaMemcpyHostToDevice));
    return absl::OkStatus();
  }
  // Copies host.size() elements out from element `offset`, synchronously.
  absl::Status CopyToHost(std::span<T> host, size_t offset = 0) const {
    if (offset + host.size() > size_) {
      return absl::OutOfRangeError(
          absl::StrCat("DeviceBuffer::CopyToHost: ", host.size(),
                       " elements at ", offset, " exceed size ", size_));
    }
    if (host.empty()) return absl::OkStatus();
    CUDA_RETURN_IF_ERROR(cudaMemcpy(host.data(), data() + offset,
                                    host.size() * sizeof(T),
                                    cudaMemcpyDeviceToHost));
    return absl::OkStatus();
  }

 private:
  DeviceBuffer(RawDeviceBuffer raw, size_t size)
      : raw_(std::move(raw)), size_(size) {}
  RawDeviceBuffer raw_;
  size_t size_ = 0;
};

// Page-locked host memory from cudaMallocHost, grown on demand: the
// staging a stream-ordered cudaMemcpyAsync needs to overlap and to be
// asynchronous at all (a copy from pageable memory stages through a driver
// buffer and returns only once the source has been read).
template <typename T>
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  PinnedBuffer(PinnedBuffer&& other) noexcept
      : ptr_(std::exchange(other.ptr_, nullptr)),
        size_(std::exchange(other.size_, 0)) {}
  PinnedBuffer& operator=(PinnedBuffer&& other) noexcept {
    if (this != &other) {
      Release();
      ptr_ = std::exchange(other.ptr_, nullptr);
      size_ = std::exchange(other.size_, 0);
    }
    return *this;
  }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  ~PinnedBuffer() { Release(); }

  T* data() const { return ptr_; }
  size_t size() const { return size_; }
  // Makes room for at least `size` elements, reallocating (contents lost)
  // only when it must grow. The caller makes sure no queued copy still
  // uses the old memory (cudaFreeHost waits for the device only on some
  // platforms). ResourceExhausted when the host cannot pin that much.
  absl::Status Reserve(size_t size) {
    if (size <= size_) return absl::OkStatus();
    Release();
    void* p = nullptr;
    const cudaError_t err = cudaMallocHost(&p, size * sizeof(T));
    if (err == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      return absl::ResourceExhaustedError(absl::StrCat(
          "cudaMallocHost(", size * sizeof(T), " bytes): cannot pin memory"));
    }
    CUDA_RETURN_IF_ERROR(err);
    ptr_ = static_cast<T*>(p);
    size_ = size;
    return absl::OkStatus();
  }

 private:
  void Release() {
    if (ptr_ != nullptr) cudaFreeHost(ptr_);
    ptr_ = nullptr;
    size_ = 0;
  }
  T* ptr_ = nullptr;
  size_t size_ = 0;
};

// Host memory someone else allocated, registered with CUDA
// (cudaHostRegister, mapped and portable): page-locked, so copies from and
// to it are asynchronous, and addressable by kernels at device_pointer()
// (under unified addressing the same address on every device);
// unregistered on destruction. The memory is borrowed: it
// must outlive the registration and not move. Thread-compatible.
class HostRegistration {
 public:
  // Registers [ptr, ptr + bytes). InvalidArgument for a null `ptr` or 0
  // bytes; ResourceExhausted when the system refuses to pin that much;
  // Internal naming the call otherwise (cudaHostRegister fails for memory
  // that shares a page with a range already registered).
  static absl::StatusOr<HostRegistration> Register(void* ptr, size_t bytes);
  HostRegistration() = default;
  HostRegistration(HostRegistration&& other) noexcept
      : host_(std::exchange(other.host_, nullptr)),
        device_(std::exchange(other.device_, nullptr)),
        bytes_(std::exchange(other.bytes_, 0)) {}
  HostRegistration& operator=(HostRegistration&& other) noexcept;
  HostRegistration(const HostRegistration&) = delete;
  HostRegistration& operator=(const HostRegistration&) = delete;
  ~HostRegistration();

  // The registered memory as the host and as kernels address it.
  void* host_pointer() const { return host_; }
  void* device_pointer() const { return device_; }
  size_t bytes() const { return bytes_; }

 private:
  HostRegistration(void* host, void* device, size_t bytes)
      : host_(host), device_(device), bytes_(bytes) {}
  void Release();
  void* host_ = nullptr;
  void* device_ = nullptr;
  size_t bytes_ = 0;
};

// A cuBLAS handle bound to one stream. Thread-compatible (cuBLAS handles
// must not be shared between threads that call at the same time).
class CublasHandle {
 public:
  static absl::StatusOr<CublasHandle> Create(cudaStream_t stream);
  CublasHandle() = default;
  CublasHandle(CublasHandle&& other) noexcept
      : handle_(std::exchange(other.handle_, nullptr)) {}
  CublasHandle& operator=(CublasHandle&& other) noexcept;
  CublasHandle(const CublasHandle&) = delete;
  CublasHandle& operator=(const CublasHandle&) = delete;
  ~CublasHandle();

  cublasHandle_t get() const { return handle_; }

 private:
  explicit CublasHandle(cublasHandle_t h) : handle_(h) {}
  cublasHandle_t handle_ = nullptr;
};

// A cuBLASLt handle (stream-free: the stream is given per matmul).
class CublasLtHandle {
 public:
  static absl::StatusOr<CublasLtHandle> Create();
  CublasLtHandle() = default;
  CublasLtHandle(CublasLtHandle&& other) noexcept
      : handle_(std::exchange(other.handle_, nullptr)) {}
  CublasLtHandle& operator=(CublasLtHandle&& other) noexcept;
  CublasLtHandle(const CublasLtHandle&) = delete;
  CublasLtHandle& operator=(const CublasLtHandle&) = delete;
  ~CublasLtHandle();

  cublasLtHandle_t get() const { return handle_; }

 private:
  explicit CublasLtHandle(cublasLtHandle_t h) : handle_(h) {}
  cublasLtHandle_t handle_ = nullptr;
};

// Starts capturing the work queued on `stream` into a graph, in
// cudaStreamCaptureModeThreadLocal: this thread may not call what a capture
// forbids (a synchronisation, cudaMalloc, a pageable copy: the capture is
// invalidated and EndCapture fails), other threads may (the all-reduce
// thread's copy stream). Internal on a runtime error.
absl::Status BeginCapture(cudaStream_t stream);

// An instantiated CUDA graph (cudaGraphExec_t). Thread-compatible.
class CudaGraphExec {
 public:
  // Ends the capture BeginCapture started on `stream` and instantiates
  // what was captured. The stream is no longer capturing afterwards either
  // way. Internal when the capture was invalidated (something it forbids
  // was called) or instantiation fails.
  static absl::StatusOr<CudaGraphExec> EndCapture(cudaStream_t stream);
  CudaGraphExec() = default;
  CudaGraphExec(CudaGraphExec&& other) noexcept
      : exec_(std::exchange(other.exec_, nullptr)) {}
  CudaGraphExec& operator=(CudaGraphExec&& other) noexcept;
  CudaGraphExec(const CudaGraphExec&) = delete;
  CudaGraphExec& operator=(const CudaGraphExec&) = delete;
  ~CudaGraphExec();

  // Queues the graph's work on `stream`. Internal on a runtime error.
  absl::Status Launch(cudaStream_t stream) const;

 private:
  explicit CudaGraphExec(cudaGraphExec_t e) : exec_(e) {}
  cudaGraphExec_t exec_ = nullptr;
};

}  // namespace dlrm::cuda
