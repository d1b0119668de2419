// Tests for the Device abstraction (CPU always; CUDA when a device is
// present) and the CUDA RAII owners of core/cuda/.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <span>
#include <vector>

#include "core/aligned.h"
#include "core/cuda/cuda_raii.h"
#include "core/device.h"
#include "tests/support/cuda_test_util.h"

namespace dlrm {
namespace {

TEST(DeviceTest, CudaProbeNeverFails) {
  // Without a driver the runtime answers with an error: the probe must turn
  // that into 0 and a reason. With a device it must leave no error behind
  // for the next launch check.
  const int count = CudaDeviceCount();
  EXPECT_GE(count, 0);
  EXPECT_EQ(CudaDeviceCount(), count);
  if (count == 0) {
    EXPECT_FALSE(CudaUnavailableReason().empty());
  } else {
    EXPECT_EQ(CudaUnavailableReason(), "");
    EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  }
}

TEST(DeviceTest, CudaDeviceRefusedWhenAbsent) {
  EXPECT_EQ(CreateCudaDevice(-1).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(CreateCudaDevice(CudaDeviceCount()).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

// Allocate, copy in, copy within, copy out: the same bytes come back.
void RoundTrip(Device& device) {
  std::vector<int32_t> host(1000);
  std::iota(host.begin(), host.end(), -17);
  const size_t bytes = host.size() * sizeof(int32_t);
  auto a = device.Allocate(bytes);
  auto b = device.Allocate(bytes);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_TRUE(device.CopyToDevice(*a, host.data(), bytes).ok());
  ASSERT_TRUE(device.CopyOnDevice(*b, *a, bytes).ok());
  std::vector<int32_t> back(host.size(), 0);
  ASSERT_TRUE(device.CopyToHost(back.data(), *b, bytes).ok());
  ASSERT_TRUE(device.Synchronize().ok());
  EXPECT_EQ(back, host);
  auto empty = device.Allocate(0);
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(*empty, nullptr);
  device.Free(*a);
  device.Free(*b);
  device.Free(nullptr);
}

TEST(DeviceTest, CpuRoundTrip) {
  auto cpu = CreateCpuDevice();
  EXPECT_EQ(cpu->kind(), DeviceKind::kCpu);
  EXPECT_EQ(cpu->name(), "cpu");
  RoundTrip(*cpu);
}

TEST(DeviceTest, CudaRoundTrip) {
  DLRM_SKIP_WITHOUT_CUDA();
  auto device = CreateCudaDevice(0);
  ASSERT_TRUE(device.ok()) << device.status();
  EXPECT_EQ((*device)->kind(), DeviceKind::kCuda);
  EXPECT_EQ((*device)->name().rfind("cuda:0 (", 0), 0u) << (*device)->name();
  auto free_bytes = (*device)->FreeMemory();
  ASSERT_TRUE(free_bytes.ok()) << free_bytes.status();
  EXPECT_GT(*free_bytes, 0u);
  RoundTrip(**device);
}

TEST(DeviceTest, CudaOutOfMemoryIsResourceExhausted) {
  DLRM_SKIP_WITHOUT_CUDA();
  auto device = CreateCudaDevice(0);
  ASSERT_TRUE(device.ok()) << device.status();
  EXPECT_EQ((*device)->Allocate(size_t{1} << 60).status().code(),
            absl::StatusCode::kResourceExhausted);
  auto buffer = cuda::DeviceBuffer<float>::Allocate(size_t{1} << 58);
  EXPECT_EQ(buffer.status().code(), absl::StatusCode::kResourceExhausted);
  // The failed allocation leaves no error for the next launch check.
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

TEST(CudaRaiiTest, DeviceBufferCopiesAndBounds) {
  DLRM_SKIP_WITHOUT_CUDA();
  auto buffer = cuda::DeviceBuffer<float>::Allocate(8);
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  const std::vector<float> host = {1, 2, 3, 4};
  ASSERT_TRUE(buffer->CopyFromHost(std::span<const float>(host), 4).ok());
  std::vector<float> back(4);
  ASSERT_TRUE(buffer->CopyToHost(std::span<float>(back), 4).ok());
  EXPECT_EQ(back, host);
  EXPECT_EQ(buffer->CopyFromHost(std::span<const float>(host), 5).code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_EQ(buffer->CopyToHost(std::span<float>(back), 6).code(),
            absl::StatusCode::kOutOfRange);
  // Growing moves to new memory of the new size; shrinking keeps it.
  ASSERT_TRUE(buffer->Resize(1 << 20).ok());
  EXPECT_EQ(buffer->size(), size_t{1} << 20);
  float* big = buffer->data();
  ASSERT_TRUE(buffer->Resize(16).ok());
  EXPECT_EQ(buffer->data(), big);
  EXPECT_EQ(buffer->size(), 16u);
  // Moving hands the memory over.
  cuda::DeviceBuffer<float> moved = std::move(*buffer);
  EXPECT_EQ(moved.data(), big);
}

// Checked before any CUDA call, so it runs without a device too.
TEST(CudaRaiiTest, HostRegistrationRefusesNothingToRegister) {
  float x = 0;
  EXPECT_EQ(cuda::HostRegistration::Register(nullptr, 64).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cuda::HostRegistration::Register(&x, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Host memory registered and mapped: the device reads it and writes it
// through device_pointer() (a device-to-device copy through the mapping);
// a page cannot be registered twice while registered (the case the device
// cache merges its arrays' page ranges for), and can again once the
// registration (moved, then destroyed) has gone.
TEST(CudaRaiiTest, HostRegistrationMapsHostMemory) {
  DLRM_SKIP_WITHOUT_CUDA();
  const size_t n = 3000;  // Not a whole number of pages.
  AlignedVector<float> host(n);
  std::iota(host.begin(), host.end(), 1.0f);
  {
    auto r = cuda::HostRegistration::Register(host.data(), n * sizeof(float));
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_NE(r->device_pointer(), nullptr);
    EXPECT_EQ(r->bytes(), n * sizeof(float));
    auto again =
        cuda::HostRegistration::Register(host.data() + 16, 64 * sizeof(float));
    EXPECT_FALSE(again.ok());
    cuda::HostRegistration moved = std::move(*r);
    EXPECT_EQ(r->host_pointer(), nullptr);
    auto device = cuda::DeviceBuffer<float>::Allocate(n);
    ASSERT_TRUE(device.ok()) << device.status();
    ASSERT_EQ(cudaMemcpy(device->data(), moved.device_pointer(),
                         n * sizeof(float), cudaMemcpyDeviceToDevice),
              cudaSuccess);
    std::vector<float> back(n);
    ASSERT_TRUE(device->CopyToHost(std::span<float>(back)).ok());
    EXPECT_TRUE(std::equal(back.begin(), back.end(), host.begin()));
    // And the device writes the host memory through the mapping.
    const std::vector<float> twos(n, 2.0f);
    ASSERT_TRUE(device->CopyFromHost(std::span<const float>(twos)).ok());
    ASSERT_EQ(cudaMemcpy(moved.device_pointer(), device->data(),
                         n * sizeof(float), cudaMemcpyDeviceToDevice),
              cudaSuccess);
    EXPECT_TRUE(std::equal(twos.begin(), twos.end(), host.begin()));
  }
  auto later = cuda::HostRegistration::Register(host.data(), n * sizeof(float));
  EXPECT_TRUE(later.ok()) << later.status();
}

TEST(CudaRaiiTest, StreamsEventsAndHandles) {
  DLRM_SKIP_WITHOUT_CUDA();
  auto stream = cuda::CudaStream::Create();
  ASSERT_TRUE(stream.ok()) << stream.status();
  auto start = cuda::CudaEvent::Create(/*timing=*/true);
  auto stop = cuda::CudaEvent::Create(/*timing=*/true);
  ASSERT_TRUE(start.ok() && stop.ok());
  auto buffer = cuda::DeviceBuffer<char>::Allocate(1 << 24);
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  ASSERT_TRUE(start->Record(stream->get()).ok());
  ASSERT_EQ(cudaMemsetAsync(buffer->data(), 7, buffer->size(), stream->get()),
            cudaSuccess);
  ASSERT_TRUE(stop->Record(stream->get()).ok());
  ASSERT_TRUE(stop->Synchronize().ok());
  auto ms = stop->ElapsedMsSince(*start);
  ASSERT_TRUE(ms.ok()) << ms.status();
  EXPECT_GE(*ms, 0.0f);
  ASSERT_TRUE(stream->Synchronize().ok());
  std::vector<char> back(16);
  ASSERT_TRUE(buffer->CopyToHost(std::span<char>(back)).ok());
  EXPECT_EQ(back, std::vector<char>(16, 7));

  auto blas = cuda::CublasHandle::Create(stream->get());
  ASSERT_TRUE(blas.ok()) << blas.status();
  EXPECT_NE(blas->get(), nullptr);
  auto lt = cuda::CublasLtHandle::Create();
  ASSERT_TRUE(lt.ok()) << lt.status();
  EXPECT_NE(lt->get(), nullptr);
}

// A captured graph replays its work (a memset and a device-to-device copy,
// on buffers the host rewrites between launches: the graph reads them when
// it runs); a capture invalidated by a synchronisation inside it is
// Internal from EndCapture and leaves the stream usable.
TEST(CudaRaiiTest, CapturedGraphReplaysAndBadCaptureFails) {
  DLRM_SKIP_WITHOUT_CUDA();
  auto stream = cuda::CudaStream::Create();
  ASSERT_TRUE(stream.ok()) << stream.status();
  auto src = cuda::DeviceBuffer<int>::Allocate(64);
  auto dst = cuda::DeviceBuffer<int>::Allocate(64);
  auto zeroed = cuda::DeviceBuffer<int>::Allocate(64);
  ASSERT_TRUE(src.ok() && dst.ok() && zeroed.ok());
  ASSERT_TRUE(cuda::BeginCapture(stream->get()).ok());
  ASSERT_EQ(cudaMemsetAsync(zeroed->data(), 0, 64 * sizeof(int), stream->get()),
            cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(dst->data(), src->data(), 64 * sizeof(int),
                            cudaMemcpyDeviceToDevice, stream->get()),
            cudaSuccess);
  auto graph = cuda::CudaGraphExec::EndCapture(stream->get());
  ASSERT_TRUE(graph.ok()) << graph.status();
  for (int round = 0; round < 3; ++round) {
    std::vector<int> in(64);
    std::iota(in.begin(), in.end(), 100 * round);
    ASSERT_TRUE(src->CopyFromHost(std::span<const int>(in)).ok());
    ASSERT_TRUE(zeroed->CopyFromHost(std::span<const int>(in)).ok());
    ASSERT_TRUE(graph->Launch(stream->get()).ok());
    ASSERT_TRUE(stream->Synchronize().ok());
    std::vector<int> out(64), zeros(64, 1);
    ASSERT_TRUE(dst->CopyToHost(std::span<int>(out)).ok());
    ASSERT_TRUE(zeroed->CopyToHost(std::span<int>(zeros)).ok());
    EXPECT_EQ(out, in) << "round " << round;
    EXPECT_EQ(zeros, std::vector<int>(64, 0)) << "round " << round;
  }

  ASSERT_TRUE(cuda::BeginCapture(stream->get()).ok());
  EXPECT_NE(cudaStreamSynchronize(stream->get()), cudaSuccess);
  auto bad = cuda::CudaGraphExec::EndCapture(stream->get());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInternal);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(dst->data(), 0, 64 * sizeof(int), stream->get()),
            cudaSuccess);
  EXPECT_TRUE(stream->Synchronize().ok());
}

}  // namespace
}  // namespace dlrm
