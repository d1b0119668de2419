// CUDA exchange memory (model/exchange_memory.h): buffers in device memory,
// column blocks as one kernel launch each, copies with cudaMemcpy2DAsync,
// all on the dense backend's stream.
#include <cuda_runtime.h>

#include <algorithm>
#include <array>

#include "absl/strings/str_cat.h"
#include "core/cuda/launch.cuh"
#include "core/cuda_status.h"
#include "core/status.h"
#include "model/exchange_memory.h"

namespace dlrm::model {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 4096;

// One ColumnBlock, a grid-stride loop over its rows x cols elements. The
// rounding intrinsics keep the multiply and the add apart (no FMA), as the
// CPU reference does.
__global__ void ColumnBlockKernel(const float* src, int64_t src_stride,
                                  float* dst, int64_t dst_stride, int64_t rows,
                                  int64_t cols, const float* row_scale,
                                  bool accumulate) {
  const int64_t total = rows * cols;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
       i < total; i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / cols;
    const int64_t c = i - r * cols;
    float v = src == nullptr ? 0.0f : src[r * src_stride + c];
    float* d = dst + r * dst_stride + c;
    if (accumulate) {
      *d = __fadd_rn(*d, v);
    } else {
      *d = row_scale == nullptr ? v : __fmul_rn(v, row_scale[r]);
    }
  }
}

class CudaExchangeMemory final : public ExchangeMemory {
 public:
  CudaExchangeMemory(cudaStream_t stream, int device)
      : stream_(stream), device_(device) {}
  ~CudaExchangeMemory() override {
    // Buffers may still be read by queued work.
    cudaStreamSynchronize(stream_);
    for (float* p : buffers_) cudaFree(p);
  }
  CudaExchangeMemory(const CudaExchangeMemory&) = delete;
  CudaExchangeMemory& operator=(const CudaExchangeMemory&) = delete;

  MemorySpace memory_space() const override { return MemorySpace::kDevice; }

  absl::StatusOr<float*> Buffer(Slot slot, int64_t count) override {
    if (count < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("exchange buffer: count ", count, " < 0"));
    }
    if (count <= sizes_[slot]) return buffers_[slot];
    CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    // The old buffer may still be read or written by queued work.
    CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    CUDA_RETURN_IF_ERROR(cudaFree(buffers_[slot]));
    buffers_[slot] = nullptr;
    sizes_[slot] = 0;
    void* p = nullptr;
    const cudaError_t err =
        cudaMalloc(&p, static_cast<size_t>(count) * sizeof(float));
    if (err != cudaSuccess) {
      cudaGetLastError();  // An allocation failure, not a sticky error.
      return absl::ResourceExhaustedError(absl::StrCat(
          "exchange buffer: cannot allocate ", count,
          " floats of device memory (", cudaGetErrorString(err), ")"));
    }
    buffers_[slot] = static_cast<float*>(p);
    sizes_[slot] = count;
    return buffers_[slot];
  }

  absl::Status Columns(std::span<const ColumnBlock> blocks) override {
    for (const ColumnBlock& b : blocks) RETURN_IF_ERROR(CheckColumnBlock(b));
    for (const ColumnBlock& b : blocks) {
      const int64_t total = b.rows * b.cols;
      const int64_t grid =
          std::min(cuda::CeilDiv<int64_t>(total, kThreads), kMaxBlocks);
      RETURN_IF_ERROR(cuda::LaunchKernel(
          "ColumnBlockKernel", ColumnBlockKernel,
          dim3(static_cast<unsigned>(grid)), dim3(kThreads), 0, stream_, b.src,
          b.src_stride, b.dst, b.dst_stride, b.rows, b.cols, b.row_scale,
          b.accumulate));
    }
    return absl::OkStatus();
  }

  absl::Status Upload(const float* host_src, int64_t src_stride, float* dst,
                      int64_t dst_stride, int64_t rows, int64_t cols) override {
    RETURN_IF_ERROR(
        CheckUpload(host_src, src_stride, dst, dst_stride, rows, cols));
    if (rows == 0 || cols == 0) return absl::OkStatus();
    // One row: its stride may be anything, cudaMemcpy2D wants pitch >= width.
    const size_t width = sizeof(float) * cols;
    const size_t dpitch = rows == 1 ? width : sizeof(float) * dst_stride;
    const size_t spitch = rows == 1 ? width : sizeof(float) * src_stride;
    CUDA_RETURN_IF_ERROR(cudaMemcpy2DAsync(dst, dpitch, host_src, spitch, width,
                                           static_cast<size_t>(rows),
                                           cudaMemcpyHostToDevice, stream_));
    // The caller may reuse `host_src` on return (the model's loss is a
    // stack variable, the pooled columns are refilled next step), and from
    // pageable memory an asynchronous copy may return before it has read
    // the source (or, pinned, before it has even started): wait for it.
    CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    return absl::OkStatus();
  }

  absl::Status Download(float* host_dst, const float* src,
                        int64_t count) override {
    RETURN_IF_ERROR(CheckDownload(count));
    if (count == 0) return absl::OkStatus();
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host_dst, src, sizeof(float) * count,
                                         cudaMemcpyDeviceToHost, stream_));
    CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    return absl::OkStatus();
  }

 private:
  cudaStream_t stream_;
  int device_;
  std::array<float*, kNumSlots> buffers_{};
  std::array<int64_t, kNumSlots> sizes_{};
};

}  // namespace

absl::StatusOr<std::unique_ptr<ExchangeMemory>> MakeCudaExchangeMemory(
    void* stream) {
  int device = 0;
  CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  return std::make_unique<CudaExchangeMemory>(static_cast<cudaStream_t>(stream),
                                              device);
}

}  // namespace dlrm::model
