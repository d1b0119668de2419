// Row and record copies on CUDA: GatherRows / ScatterRows between a table
// and a packed array, LoadRecords / StoreRecords of weights with their
// optimizer state between two tables' arrays. Grid-stride loops with
// 64-bit indices.
#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "embedding/cuda/kernel_units.cuh"

namespace dlrm::embedding::cuda {
namespace {

// Row copies between a table and a packed array (GatherRows, ScatterRows):
// element e of the packed array is column e % width of packed row
// e / width; `src_index` / `dst_index` (null: the packed side) map packed
// row i to a table row. A grid-stride loop over n * width elements with
// 64-bit indices; table rows outside [0, table_rows) are skipped.
__global__ void CopyRowsKernel(const float* __restrict__ src,
                               const int64_t* __restrict__ src_index,
                               float* __restrict__ dst,
                               const int64_t* __restrict__ dst_index, int64_t n,
                               int64_t width, int64_t table_rows) {
  const int64_t total = n * width;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       e < total; e += stride) {
    const int64_t i = e / width;
    const int64_t c = e - i * width;
    const int64_t s = src_index != nullptr ? src_index[i] : i;
    const int64_t d = dst_index != nullptr ? dst_index[i] : i;
    const int64_t table_row = src_index != nullptr ? s : d;
    if (table_row < 0 || table_row >= table_rows) continue;
    dst[d * width + c] = src[s * width + c];
  }
}

// Record copies between two tables' arrays (LoadRecords, StoreRecords):
// element e is column e % floats of pair e / floats, where a record is dim
// weights, then state1_floats and state2_floats of state; pair i copies
// row src_index[i] of `src` to row dst_index[i] of `dst`. A grid-stride
// loop with 64-bit indices; pairs with a row out of range are skipped.
__global__ void CopyRecordsKernel(RecordArrays src,
                                  const int64_t* __restrict__ src_index,
                                  RecordArrays dst,
                                  const int64_t* __restrict__ dst_index,
                                  int64_t n) {
  const int64_t dim = src.dim;
  const int64_t n1 = src.state1_floats;
  const int64_t floats = dim + n1 + src.state2_floats;
  const int64_t total = n * floats;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       e < total; e += stride) {
    const int64_t i = e / floats;
    const int64_t s = src_index[i];
    const int64_t d = dst_index[i];
    if (s < 0 || s >= src.rows || d < 0 || d >= dst.rows) continue;
    int64_t c = e - i * floats;
    if (c < dim) {
      dst.weights[d * dim + c] = src.weights[s * dim + c];
      continue;
    }
    c -= dim;
    if (c < n1) {
      dst.state1[d * n1 + c] = src.state1[s * n1 + c];
      continue;
    }
    c -= n1;
    const int64_t n2 = src.state2_floats;
    dst.state2[d * n2 + c] = src.state2[s * n2 + c];
  }
}

// Blocks of the row and record copies, whose threads loop over the rest.
constexpr int64_t kMaxCopyBlocks = int64_t{1} << 16;

// Launches CopyRowsKernel over n rows of `width` floats: at most
// kMaxCopyBlocks blocks, each thread looping over the rest.
absl::Status LaunchCopyRows(const char* name, const float* src,
                            const int64_t* src_index, float* dst,
                            const int64_t* dst_index, int64_t n, int64_t width,
                            int64_t table_rows, cudaStream_t stream) {
  if (n < 0 || width < 0 || table_rows < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": negative size (n ", n, ", width ", width,
                     ", table rows ", table_rows, ")"));
  }
  if (n == 0 || width == 0) return absl::OkStatus();
  const int64_t grid = GridBlocks(n, width, kThreads, kMaxCopyBlocks);
  return LaunchKernel(name, CopyRowsKernel, dim3(static_cast<unsigned>(grid)),
                      dim3(kThreads), 0, stream, src, src_index, dst, dst_index,
                      n, width, table_rows);
}

// Launches CopyRecordsKernel over n pairs, as LaunchCopyRows.
absl::Status LaunchCopyRecords(const char* name, const RecordArrays& src,
                               const int64_t* src_index,
                               const RecordArrays& dst,
                               const int64_t* dst_index, int64_t n,
                               cudaStream_t stream) {
  if (n < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": negative number of records ", n));
  }
  if (src.dim != dst.dim || src.state1_floats != dst.state1_floats ||
      src.state2_floats != dst.state2_floats || src.dim <= 0 ||
      src.state1_floats < 0 || src.state2_floats < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": records of ", src.dim, " + ", src.state1_floats,
                     " + ", src.state2_floats, " floats copied to ", dst.dim,
                     " + ", dst.state1_floats, " + ", dst.state2_floats));
  }
  for (const RecordArrays* a : {&src, &dst}) {
    if (a->rows < 0 || a->weights == nullptr ||
        (a->state1_floats > 0 && a->state1 == nullptr) ||
        (a->state2_floats > 0 && a->state2 == nullptr)) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": a table of ", a->rows, " rows lacks an array"));
    }
  }
  if (n == 0) return absl::OkStatus();
  if (src_index == nullptr || dst_index == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": null index"));
  }
  const int64_t floats = src.dim + src.state1_floats + src.state2_floats;
  const int64_t grid = GridBlocks(n, floats, kThreads, kMaxCopyBlocks);
  return LaunchKernel(name, CopyRecordsKernel,
                      dim3(static_cast<unsigned>(grid)), dim3(kThreads), 0,
                      stream, src, src_index, dst, dst_index, n);
}

}  // namespace

absl::Status LoadRecords(const RecordArrays& table, const int64_t* rows,
                         const RecordArrays& slots, const int64_t* slot_ids,
                         int64_t n, cudaStream_t stream) {
  return LaunchCopyRecords("LoadRecords", table, rows, slots, slot_ids, n,
                           stream);
}

absl::Status StoreRecords(const RecordArrays& slots, const int64_t* slot_ids,
                          const RecordArrays& table, const int64_t* rows,
                          int64_t n, cudaStream_t stream) {
  return LaunchCopyRecords("StoreRecords", slots, slot_ids, table, rows, n,
                           stream);
}

absl::Status GatherRows(const float* table, int64_t table_rows, int64_t width,
                        const int64_t* index, int64_t n, float* packed,
                        cudaStream_t stream) {
  return LaunchCopyRows("GatherRows", table, index, packed, nullptr, n, width,
                        table_rows, stream);
}

absl::Status ScatterRows(const float* packed, const int64_t* index, int64_t n,
                         int64_t width, float* table, int64_t table_rows,
                         cudaStream_t stream) {
  return LaunchCopyRows("ScatterRows", packed, nullptr, table, index, n, width,
                        table_rows, stream);
}

}  // namespace dlrm::embedding::cuda
