// CUDA RAII owners: creation through checked calls, release in destructors
// (whose errors cannot be returned and are ignored: by then the context may
// already be tearing down).
#include "core/cuda/cuda_raii.h"

#include <string>

namespace dlrm::cuda {

absl::StatusOr<CudaStream> CudaStream::Create() {
  cudaStream_t s = nullptr;
  CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  return CudaStream(s);
}

CudaStream& CudaStream::operator=(CudaStream&& other) noexcept {
  if (this != &other) {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
    stream_ = std::exchange(other.stream_, nullptr);
  }
  return *this;
}

CudaStream::~CudaStream() {
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

absl::Status CudaStream::Synchronize() const {
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  return absl::OkStatus();
}

absl::StatusOr<CudaEvent> CudaEvent::Create(bool timing) {
  cudaEvent_t e = nullptr;
  CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(
      &e, timing ? cudaEventDefault : cudaEventDisableTiming));
  return CudaEvent(e);
}

CudaEvent& CudaEvent::operator=(CudaEvent&& other) noexcept {
  if (this != &other) {
    if (event_ != nullptr) cudaEventDestroy(event_);
    event_ = std::exchange(other.event_, nullptr);
  }
  return *this;
}

CudaEvent::~CudaEvent() {
  if (event_ != nullptr) cudaEventDestroy(event_);
}

absl::Status CudaEvent::Record(cudaStream_t stream) const {
  CUDA_RETURN_IF_ERROR(cudaEventRecord(event_, stream));
  return absl::OkStatus();
}

absl::Status CudaEvent::Synchronize() const {
  CUDA_RETURN_IF_ERROR(cudaEventSynchronize(event_));
  return absl::OkStatus();
}

absl::StatusOr<float> CudaEvent::ElapsedMsSince(const CudaEvent& start) const {
  float ms = 0;
  CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, start.event_, event_));
  return ms;
}

absl::StatusOr<HostRegistration> HostRegistration::Register(void* ptr,
                                                            size_t bytes) {
  if (ptr == nullptr || bytes == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("HostRegistration::Register: a null pointer or 0 bytes (",
                     bytes, " bytes)"));
  }
  const cudaError_t err = cudaHostRegister(
      ptr, bytes, cudaHostRegisterMapped | cudaHostRegisterPortable);
  if (err != cudaSuccess) {
    // Not sticky: cleared, so that the next launch check does not see it.
    cudaGetLastError();
    const std::string call = absl::StrCat(
        "cudaHostRegister(", bytes,
        " bytes, mapped | portable) failed: ", cudaGetErrorString(err));
    if (err == cudaErrorMemoryAllocation) {
      return absl::ResourceExhaustedError(call);
    }
    return absl::InternalError(call);
  }
  void* device = nullptr;
  const cudaError_t mapped = cudaHostGetDevicePointer(&device, ptr, 0);
  if (mapped != cudaSuccess) {
    cudaGetLastError();
    cudaHostUnregister(ptr);
    return absl::InternalError(absl::StrCat("cudaHostGetDevicePointer failed: ",
                                            cudaGetErrorString(mapped)));
  }
  return HostRegistration(ptr, device, bytes);
}

void HostRegistration::Release() {
  if (host_ != nullptr) cudaHostUnregister(host_);
  host_ = nullptr;
  device_ = nullptr;
  bytes_ = 0;
}

HostRegistration& HostRegistration::operator=(
    HostRegistration&& other) noexcept {
  if (this != &other) {
    Release();
    host_ = std::exchange(other.host_, nullptr);
    device_ = std::exchange(other.device_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

HostRegistration::~HostRegistration() { Release(); }

absl::StatusOr<RawDeviceBuffer> RawDeviceBuffer::Allocate(size_t bytes) {
  RawDeviceBuffer buffer;
  RETURN_IF_ERROR(buffer.Reserve(bytes));
  return buffer;
}

RawDeviceBuffer& RawDeviceBuffer::operator=(RawDeviceBuffer&& other) noexcept {
  if (this != &other) {
    if (ptr_ != nullptr) cudaFree(ptr_);
    ptr_ = std::exchange(other.ptr_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

RawDeviceBuffer::~RawDeviceBuffer() {
  if (ptr_ != nullptr) cudaFree(ptr_);
}

absl::Status RawDeviceBuffer::Reserve(size_t bytes) {
  if (bytes <= bytes_) return absl::OkStatus();
  if (ptr_ != nullptr) {
    // cudaFree synchronises the device, so no queued kernel still reads the
    // old memory when it goes.
    CUDA_RETURN_IF_ERROR(cudaFree(ptr_));
    ptr_ = nullptr;
    bytes_ = 0;
  }
  void* p = nullptr;
  const cudaError_t err = cudaMalloc(&p, bytes);
  if (err == cudaErrorMemoryAllocation) {
    // Resets the runtime's last error, so a later launch check does not
    // report this allocation as a kernel failure.
    cudaGetLastError();
    return absl::ResourceExhaustedError(
        absl::StrCat("cudaMalloc(", bytes, " bytes): out of device memory"));
  }
  CUDA_RETURN_IF_ERROR(err);
  ptr_ = p;
  bytes_ = bytes;
  return absl::OkStatus();
}

absl::StatusOr<CublasHandle> CublasHandle::Create(cudaStream_t stream) {
  cublasHandle_t h = nullptr;
  CUBLAS_RETURN_IF_ERROR(cublasCreate(&h));
  CublasHandle handle(h);
  CUBLAS_RETURN_IF_ERROR(cublasSetStream(h, stream));
  return handle;
}

CublasHandle& CublasHandle::operator=(CublasHandle&& other) noexcept {
  if (this != &other) {
    if (handle_ != nullptr) cublasDestroy(handle_);
    handle_ = std::exchange(other.handle_, nullptr);
  }
  return *this;
}

CublasHandle::~CublasHandle() {
  if (handle_ != nullptr) cublasDestroy(handle_);
}

absl::StatusOr<CublasLtHandle> CublasLtHandle::Create() {
  cublasLtHandle_t h = nullptr;
  CUBLAS_RETURN_IF_ERROR(cublasLtCreate(&h));
  return CublasLtHandle(h);
}

CublasLtHandle& CublasLtHandle::operator=(CublasLtHandle&& other) noexcept {
  if (this != &other) {
    if (handle_ != nullptr) cublasLtDestroy(handle_);
    handle_ = std::exchange(other.handle_, nullptr);
  }
  return *this;
}

CublasLtHandle::~CublasLtHandle() {
  if (handle_ != nullptr) cublasLtDestroy(handle_);
}

absl::Status BeginCapture(cudaStream_t stream) {
  CUDA_RETURN_IF_ERROR(
      cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  return absl::OkStatus();
}

absl::StatusOr<CudaGraphExec> CudaGraphExec::EndCapture(cudaStream_t stream) {
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(stream, &graph);
  if (ended != cudaSuccess) {
    if (graph != nullptr) cudaGraphDestroy(graph);
    // An invalidated capture's error is not sticky; clear it so that the
    // next checked call does not report it again.
    cudaGetLastError();
    return absl::InternalError(
        absl::StrCat("cudaStreamEndCapture failed: ", cudaGetErrorName(ended),
                     " (", cudaGetErrorString(ended), ")"));
  }
  cudaGraphExec_t exec = nullptr;
  const cudaError_t made = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  if (made != cudaSuccess) {
    cudaGetLastError();
    return absl::InternalError(
        absl::StrCat("cudaGraphInstantiate failed: ", cudaGetErrorName(made),
                     " (", cudaGetErrorString(made), ")"));
  }
  return CudaGraphExec(exec);
}

CudaGraphExec& CudaGraphExec::operator=(CudaGraphExec&& other) noexcept {
  if (this != &other) {
    if (exec_ != nullptr) cudaGraphExecDestroy(exec_);
    exec_ = std::exchange(other.exec_, nullptr);
  }
  return *this;
}

CudaGraphExec::~CudaGraphExec() {
  if (exec_ != nullptr) cudaGraphExecDestroy(exec_);
}

absl::Status CudaGraphExec::Launch(cudaStream_t stream) const {
  CUDA_RETURN_IF_ERROR(cudaGraphLaunch(exec_, stream));
  return absl::OkStatus();
}

}  // namespace dlrm::cuda
