// The memory the hybrid step's pooled-vector and gradient exchanges
// (model/exchange.h) keep their buffers in, and the column copies they do
// there: host memory (the CPU reference) or the CUDA dense backend's device
// memory (kernels on its stream, model/exchange_memory.cu). The exchanges'
// layout code is the same for both; only these primitives differ.
#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/device.h"

namespace dlrm::model {

// `rows` rows of `cols` columns: dst[r * dst_stride + c] (r < rows, c <
// cols) is set to src[r * src_stride + c], times row_scale[r] when given,
// or has it added (accumulate). src and dst are memory of the
// ExchangeMemory that applies it; src may be dst (element by element, in
// place) but must not otherwise overlap it.
struct ColumnBlock {
  // Null: zeros.
  const float* src = nullptr;
  int64_t src_stride = 0;
  float* dst = nullptr;
  int64_t dst_stride = 0;
  int64_t rows = 0;
  int64_t cols = 0;
  // `rows` factors in the ExchangeMemory's memory, or null for none. Not
  // with accumulate.
  const float* row_scale = nullptr;
  // dst += src instead of dst = src.
  bool accumulate = false;
};

// One rank's exchange memory. Every call is ordered after the calls before
// it (on CUDA: queued on one stream, in call order). Not thread-safe.
class ExchangeMemory {
 public:
  // The buffers the exchanges own, one per purpose.
  enum Slot { kSend, kRecv, kRegrouped, kScale, kScratch, kNumSlots };

  virtual ~ExchangeMemory() = default;

  // kHost for host memory, kDevice for CUDA device memory.
  virtual MemorySpace memory_space() const = 0;

  // Room for `count` floats in buffer `slot`, grown on demand (its contents
  // are lost when it grows; on CUDA after the work queued so far is done);
  // valid until the next Buffer call for that slot. ResourceExhausted when
  // the memory cannot be had.
  virtual absl::StatusOr<float*> Buffer(Slot slot, int64_t count) = 0;

  // Applies `blocks` one after the other (a block sees the writes of those
  // before it). InvalidArgument for a negative size or a stride smaller
  // than cols; Internal for a CUDA error.
  virtual absl::Status Columns(std::span<const ColumnBlock> blocks) = 0;

  // Copies `rows` x `cols` floats from host memory `host_src` (row stride
  // `src_stride`) to `dst` (row stride `dst_stride`). `host_src` may be
  // reused once the call returns. Errors as Columns.
  virtual absl::Status Upload(const float* host_src, int64_t src_stride,
                              float* dst, int64_t dst_stride, int64_t rows,
                              int64_t cols) = 0;

  // Copies `count` floats from `src` to host memory `host_dst`; returns once
  // they are there (on CUDA after the work queued so far). Internal for a
  // CUDA error.
  virtual absl::Status Download(float* host_dst, const float* src,
                                int64_t count) = 0;
};

// Host memory: every call is done on return.
std::unique_ptr<ExchangeMemory> MakeHostExchangeMemory();

// Memory of the current CUDA device, every call's work queued on `stream`
// (a cudaStream_t, borrowed; it must outlive the memory). FailedPrecondition
// in a build without CUDA; Internal for a CUDA error.
absl::StatusOr<std::unique_ptr<ExchangeMemory>> MakeCudaExchangeMemory(
    void* stream);

// OK when `b`'s sizes and strides are ones Columns takes (InvalidArgument
// naming the field otherwise): shared by both implementations.
absl::Status CheckColumnBlock(const ColumnBlock& b);

// CheckColumnBlock of the block an Upload with these arguments copies.
absl::Status CheckUpload(const float* host_src, int64_t src_stride, float* dst,
                         int64_t dst_stride, int64_t rows, int64_t cols);

// InvalidArgument unless a Download's `count` is >= 0.
absl::Status CheckDownload(int64_t count);

}  // namespace dlrm::model
