// Float copies on a stream for the CUDA dense backend: whole arrays, rows
// between buffers of other strides, and column ranges of rows.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <span>

#include "absl/status/status.h"
#include "core/cuda_status.h"
#include "core/status.h"
#include "dense/backend.h"

namespace dlrm::dense::cuda {

// Queues the copy of `floats` floats (none when <= 0), as `kind` says.
inline absl::Status CopyAsync(void* dst, const void* src, int64_t floats,
                              cudaMemcpyKind kind, cudaStream_t stream) {
  if (floats <= 0) return absl::OkStatus();
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(
      dst, src, sizeof(float) * static_cast<size_t>(floats), kind, stream));
  return absl::OkStatus();
}

// Copies `width` floats of each of `rows` rows between buffers of
// different row strides (device to device unless `kind` says otherwise).
inline absl::Status CopyColumns(
    const float* src, int64_t src_stride, float* dst, int64_t dst_stride,
    int64_t rows, int width, cudaStream_t stream,
    cudaMemcpyKind kind = cudaMemcpyDeviceToDevice) {
  if (rows <= 0 || width <= 0) return absl::OkStatus();
  CUDA_RETURN_IF_ERROR(cudaMemcpy2DAsync(
      dst, sizeof(float) * dst_stride, src, sizeof(float) * src_stride,
      sizeof(float) * width, static_cast<size_t>(rows), kind, stream));
  return absl::OkStatus();
}

// Copies columns `columns` of `rows` rows of `width` floats between two
// buffers of that row width (host and device, as `kind` says).
inline absl::Status CopyRanges(const float* src, float* dst, int width,
                               int64_t rows,
                               std::span<const ColumnRange> columns,
                               cudaMemcpyKind kind, cudaStream_t stream) {
  for (const ColumnRange& c : columns) {
    RETURN_IF_ERROR(CopyColumns(src + c.begin, width, dst + c.begin, width,
                                rows, c.end - c.begin, stream, kind));
  }
  return absl::OkStatus();
}

}  // namespace dlrm::dense::cuda
