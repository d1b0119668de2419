// The CUDA Device and the device probes of builds with CUDA.
#include <cuda_runtime_api.h>

#include "absl/strings/str_cat.h"
#include "core/cuda_status.h"
#include "core/device.h"
#include "core/status.h"

namespace dlrm {
namespace {

class CudaDevice final : public Device {
 public:
  CudaDevice(int ordinal, std::string product)
      : ordinal_(ordinal), product_(std::move(product)) {}

  DeviceKind kind() const override { return DeviceKind::kCuda; }
  std::string name() const override {
    return absl::StrCat("cuda:", ordinal_, " (", product_, ")");
  }
  absl::StatusOr<size_t> FreeMemory() const override {
    RETURN_IF_ERROR(MakeCurrent());
    size_t free_bytes = 0, total_bytes = 0;
    CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free_bytes, &total_bytes));
    return free_bytes;
  }

  absl::StatusOr<void*> Allocate(size_t bytes) override {
    if (bytes == 0) return nullptr;
    RETURN_IF_ERROR(MakeCurrent());
    void* p = nullptr;
    const cudaError_t err = cudaMalloc(&p, bytes);
    if (err == cudaErrorMemoryAllocation) {
      cudaGetLastError();  // Not a kernel error: keep it out of later checks.
      return absl::ResourceExhaustedError(absl::StrCat(
          name(), ": cannot allocate ", bytes, " bytes of device memory"));
    }
    CUDA_RETURN_IF_ERROR(err);
    return p;
  }
  void Free(void* ptr) override {
    if (ptr != nullptr && MakeCurrent().ok()) cudaFree(ptr);
  }

  absl::Status CopyToDevice(void* dst, const void* src, size_t bytes) override {
    return Copy(dst, src, bytes, cudaMemcpyHostToDevice);
  }
  absl::Status CopyToHost(void* dst, const void* src, size_t bytes) override {
    return Copy(dst, src, bytes, cudaMemcpyDeviceToHost);
  }
  absl::Status CopyOnDevice(void* dst, const void* src, size_t bytes) override {
    return Copy(dst, src, bytes, cudaMemcpyDeviceToDevice);
  }
  absl::Status Synchronize() override {
    RETURN_IF_ERROR(MakeCurrent());
    CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
    return absl::OkStatus();
  }

 private:
  // The current device is per thread: a pool thread calling in must not use
  // whatever device it last touched.
  absl::Status MakeCurrent() const {
    CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal_));
    return absl::OkStatus();
  }
  absl::Status Copy(void* dst, const void* src, size_t bytes,
                    cudaMemcpyKind kind) const {
    if (bytes == 0) return absl::OkStatus();
    RETURN_IF_ERROR(MakeCurrent());
    CUDA_RETURN_IF_ERROR(cudaMemcpy(dst, src, bytes, kind));
    return absl::OkStatus();
  }

  int ordinal_;
  std::string product_;
};

}  // namespace

int CudaDeviceCount() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    // No driver or no device: the runtime's answer is an error. Reading it
    // clears it where it can be cleared (without a driver it stays, but
    // then no CUDA code runs).
    cudaGetLastError();
    return 0;
  }
  return count;
}

std::string CudaUnavailableReason() {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    cudaGetLastError();
    // The two a user meets most, in words first; the runtime's own after.
    const char* why = err == cudaErrorInsufficientDriver
                          ? "no CUDA driver, or one older than this CUDA "
                            "runtime: "
                      : err == cudaErrorNoDevice ? "no CUDA device: "
                                                 : "";
    return absl::StrCat(why, "cudaGetDeviceCount: ", cudaGetErrorString(err));
  }
  return count > 0 ? "" : "no CUDA device";
}

absl::StatusOr<std::unique_ptr<Device>> CreateCudaDevice(int ordinal) {
  const int count = CudaDeviceCount();
  if (ordinal < 0 || ordinal >= count) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cuda:", ordinal, ": not available (",
        count == 0 ? CudaUnavailableReason() : absl::StrCat(count, " devices"),
        ")"));
  }
  CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal));
  cudaDeviceProp prop;
  CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, ordinal));
  return std::make_unique<CudaDevice>(ordinal, prop.name);
}

}  // namespace dlrm
