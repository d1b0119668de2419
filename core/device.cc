// The CPU Device, and the CUDA probes for builds without CUDA (the CUDA
// Device itself is core/cuda/cuda_device.cc).
#include "core/device.h"

#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace dlrm {
namespace {

class CpuDevice final : public Device {
 public:
  DeviceKind kind() const override { return DeviceKind::kCpu; }
  std::string name() const override { return "cpu"; }
  absl::StatusOr<size_t> FreeMemory() const override {
    return absl::UnimplementedError(
        "FreeMemory: host memory is not tracked by the CPU device");
  }

  absl::StatusOr<void*> Allocate(size_t bytes) override {
    if (bytes == 0) return nullptr;
    constexpr size_t kAlign = 64;
    void* p =
        std::aligned_alloc(kAlign, (bytes + kAlign - 1) / kAlign * kAlign);
    if (p == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrCat("cpu: cannot allocate ", bytes, " bytes"));
    }
    return p;
  }
  void Free(void* ptr) override { std::free(ptr); }

  absl::Status CopyToDevice(void* dst, const void* src, size_t bytes) override {
    return Copy(dst, src, bytes);
  }
  absl::Status CopyToHost(void* dst, const void* src, size_t bytes) override {
    return Copy(dst, src, bytes);
  }
  absl::Status CopyOnDevice(void* dst, const void* src, size_t bytes) override {
    return Copy(dst, src, bytes);
  }
  absl::Status Synchronize() override { return absl::OkStatus(); }

 private:
  static absl::Status Copy(void* dst, const void* src, size_t bytes) {
    // memmove: the within-device copy may overlap, as cudaMemcpy's may not,
    // but nothing is lost by allowing it here.
    if (bytes > 0) std::memmove(dst, src, bytes);
    return absl::OkStatus();
  }
};

}  // namespace

const char* MemorySpaceName(MemorySpace space) {
  return space == MemorySpace::kHost ? "host" : "device";
}

std::unique_ptr<Device> CreateCpuDevice() {
  return std::make_unique<CpuDevice>();
}

#if !defined(DLRM_WITH_CUDA)
int CudaDeviceCount() { return 0; }

std::string CudaUnavailableReason() { return "built without CUDA"; }

absl::StatusOr<std::unique_ptr<Device>> CreateCudaDevice(int ordinal) {
  return absl::FailedPreconditionError(
      absl::StrCat("cuda:", ordinal, ": this binary was built without CUDA"));
}
#endif

}  // namespace dlrm
