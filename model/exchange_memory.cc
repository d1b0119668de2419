// Host exchange memory: the CPU reference of the exchanges' column copies
// (model/exchange_memory.h).
#include "model/exchange_memory.h"

#include <array>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/aligned.h"
#include "core/status.h"
#include "model/step_util.h"

namespace dlrm::model {
namespace {

class HostExchangeMemory final : public ExchangeMemory {
 public:
  MemorySpace memory_space() const override { return MemorySpace::kHost; }

  absl::StatusOr<float*> Buffer(Slot slot, int64_t count) override {
    if (count < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("exchange buffer: count ", count, " < 0"));
    }
    return internal::Sized(buffers_[slot], count);
  }

  absl::Status Columns(std::span<const ColumnBlock> blocks) override {
    for (const ColumnBlock& b : blocks) RETURN_IF_ERROR(CheckColumnBlock(b));
    for (const ColumnBlock& b : blocks) {
      for (int64_t r = 0; r < b.rows; ++r) {
        const float* src =
            b.src == nullptr ? nullptr : b.src + r * b.src_stride;
        float* dst = b.dst + r * b.dst_stride;
        // Three loops, so that no multiply and add fuse into one rounding.
        if (b.accumulate) {
          if (src == nullptr) continue;
          for (int64_t c = 0; c < b.cols; ++c) dst[c] += src[c];
        } else if (b.row_scale != nullptr) {
          const float scale = b.row_scale[r];
          for (int64_t c = 0; c < b.cols; ++c) {
            dst[c] = (src == nullptr ? 0.0f : src[c]) * scale;
          }
        } else {
          for (int64_t c = 0; c < b.cols; ++c) {
            dst[c] = src == nullptr ? 0.0f : src[c];
          }
        }
      }
    }
    return absl::OkStatus();
  }

  absl::Status Upload(const float* host_src, int64_t src_stride, float* dst,
                      int64_t dst_stride, int64_t rows, int64_t cols) override {
    RETURN_IF_ERROR(
        CheckUpload(host_src, src_stride, dst, dst_stride, rows, cols));
    for (int64_t r = 0; r < rows && cols > 0; ++r) {
      std::memmove(dst + r * dst_stride, host_src + r * src_stride,
                   sizeof(float) * cols);
    }
    return absl::OkStatus();
  }

  absl::Status Download(float* host_dst, const float* src,
                        int64_t count) override {
    RETURN_IF_ERROR(CheckDownload(count));
    if (count > 0) std::memmove(host_dst, src, sizeof(float) * count);
    return absl::OkStatus();
  }

 private:
  std::array<AlignedVector<float>, kNumSlots> buffers_;
};

}  // namespace

absl::Status CheckUpload(const float* host_src, int64_t src_stride, float* dst,
                         int64_t dst_stride, int64_t rows, int64_t cols) {
  return CheckColumnBlock({.src = host_src,
                           .src_stride = src_stride,
                           .dst = dst,
                           .dst_stride = dst_stride,
                           .rows = rows,
                           .cols = cols});
}

absl::Status CheckDownload(int64_t count) {
  if (count < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("exchange download: count ", count, " < 0"));
  }
  return absl::OkStatus();
}

absl::Status CheckColumnBlock(const ColumnBlock& b) {
  if (b.rows < 0 || b.cols < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "column block: rows ", b.rows, " and cols ", b.cols, " must be >= 0"));
  }
  if (b.rows == 0 || b.cols == 0) return absl::OkStatus();
  if (b.dst == nullptr) {
    return absl::InvalidArgumentError("column block: dst is null");
  }
  if ((b.rows > 1 && b.dst_stride < b.cols) ||
      (b.src != nullptr && b.rows > 1 && b.src_stride < b.cols)) {
    return absl::InvalidArgumentError(
        absl::StrCat("column block: src_stride ", b.src_stride,
                     " or dst_stride ", b.dst_stride, " below cols ", b.cols));
  }
  if (b.accumulate && b.row_scale != nullptr) {
    return absl::InvalidArgumentError(
        "column block: row_scale with accumulate");
  }
  return absl::OkStatus();
}

std::unique_ptr<ExchangeMemory> MakeHostExchangeMemory() {
  return std::make_unique<HostExchangeMemory>();
}

#if !defined(DLRM_WITH_CUDA)
absl::StatusOr<std::unique_ptr<ExchangeMemory>> MakeCudaExchangeMemory(
    void* /*stream*/) {
  return absl::FailedPreconditionError(
      "CUDA exchange memory: built without CUDA");
}
#endif

}  // namespace dlrm::model
