// Where tensors live and kernels run: the host CPU or one CUDA device.
// The model picks one at start-up (a process with no GPU runs the CPU
// backend); buffers and copies go through it so the same step code can
// drive either. CUDA-specific RAII (streams, events, cuBLAS handles) lives
// in core/cuda/.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace dlrm {

enum class DeviceKind { kCpu, kCuda };

// Where the buffers a component takes or hands out live: host memory, or
// the memory of its CUDA device (communicators, embedding stores).
enum class MemorySpace { kHost, kDevice };

// "host" or "device".
const char* MemorySpaceName(MemorySpace space);

// Number of CUDA devices this process can use: 0 when the binary was built
// without CUDA, when no driver is loaded or when the runtime reports any
// error (a binary without a GPU never aborts for lack of one).
int CudaDeviceCount();

// Why CudaDeviceCount() is 0, for skip and error messages ("built without
// CUDA", "no CUDA driver, ..." or "no CUDA device" followed by the
// runtime's error string, or that string alone); empty when a device is
// present.
std::string CudaUnavailableReason();

// One memory space with its copy engine. Allocate/Free/Copy may be called
// from several threads at once; an implementation says otherwise.
class Device {
 public:
  virtual ~Device() = default;

  virtual DeviceKind kind() const = 0;
  // "cpu" or "cuda:<ordinal> (<product name>)".
  virtual std::string name() const = 0;
  // Bytes the device could still allocate, as far as it knows.
  virtual absl::StatusOr<size_t> FreeMemory() const = 0;

  // `bytes` of device memory (64-byte aligned on the CPU, 256 on CUDA);
  // a 0-byte request gives nullptr. ResourceExhausted when out of memory.
  virtual absl::StatusOr<void*> Allocate(size_t bytes) = 0;
  // Releases memory from Allocate; nullptr is ignored.
  virtual void Free(void* ptr) = 0;

  // Copies between host memory and this device's memory (or within the
  // device); returns when the data has arrived. Internal on a runtime
  // error.
  virtual absl::Status CopyToDevice(void* device_dst, const void* host_src,
                                    size_t bytes) = 0;
  virtual absl::Status CopyToHost(void* host_dst, const void* device_src,
                                  size_t bytes) = 0;
  virtual absl::Status CopyOnDevice(void* dst, const void* src,
                                    size_t bytes) = 0;

  // Waits until all work queued on the device is done.
  virtual absl::Status Synchronize() = 0;
};

// The host CPU.
std::unique_ptr<Device> CreateCpuDevice();

// CUDA device `ordinal` (made current for the calling thread).
// FailedPrecondition when the binary has no CUDA code or no such device is
// present (the message says which); Internal for other runtime errors.
absl::StatusOr<std::unique_ptr<Device>> CreateCudaDevice(int ordinal);

}  // namespace dlrm
