// The fused sparse backward + optimizer on CUDA (SparseBackwardUpdate):
// the occurrences sorted by row, then one group of lanes per unique row or
// per chunk of a hot row (kernel_units.cuh). Each output element is summed by
// one thread in bag/id order with round-to-nearest adds and multiplies that the
// compiler may not fuse (__fadd_rn, __fmul_rn), in the CPU kernels' order,
// and the optimizers are the CPU's own functions (optim/rules.h), so
// results match the CPU bitwise except where row-wise Adagrad sums a row's
// squares in another order and where a row with more than kSparseChunk
// occurrences sums them in chunks (sparse_chunks.h; bitwise the host
// stand-in's sums, sparse_backward_host.h).
#include <algorithm>
#include <bit>
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_run_length_encode.cuh>
#include <cub/device/device_scan.cuh>
#include <limits>
#include <type_traits>
#include <variant>

#include "absl/strings/str_cat.h"
#include "core/cuda_status.h"
#include "core/status.h"
#include "embedding/cuda/kernel_units.cuh"
#include "embedding/sparse_chunks.h"
#include "optim/rules.h"

namespace dlrm::embedding::cuda {
namespace {

// Backward step 1: the sort keys (row id, or `rows` for an id out of range,
// so it sorts last and is skipped) and the bag of every id occurrence.
__global__ void ExpandKernel(const int64_t* __restrict__ offsets,
                             const int64_t* __restrict__ ids, int64_t num_bags,
                             int64_t num_ids, int64_t rows,
                             uint64_t* __restrict__ keys,
                             int32_t* __restrict__ bags) {
  const int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (p >= num_ids) return;
  const int64_t id = ids[p];
  keys[p] = id >= 0 && id < rows ? static_cast<uint64_t>(id)
                                 : static_cast<uint64_t>(rows);
  // The bag holding position p: the last s with offsets[s] <= p (empty bags
  // share their offset with the next bag, so this skips them).
  bags[p] = static_cast<int32_t>(LastAtMost(offsets, num_bags, p));
}

// g[v * kW + j] (lane `lane`'s units u = lane + v * group of a row, kW
// columns each) += the gradient terms of sorted pairs [first, last) in
// order: grad row s times 1 / bag size when `mean`, one rounded multiply
// and one rounded add per column (the CPU table's order within a run).
template <bool kVec4, int kPerLane>
__device__ __forceinline__ void AddOccurrences(
    float* g, int64_t first, int64_t last, int lane, int group, int units,
    bool mean, const int64_t* __restrict__ offsets,
    const float* __restrict__ grad, int64_t grad_stride,
    const int32_t* __restrict__ sorted_bags) {
  using U = typename Unit<kVec4>::Type;
  for (int64_t e = first; e < last; ++e) {
    const int32_t s = sorted_bags[e];
    const float scale =
        mean ? __fdiv_rn(1.0f, static_cast<float>(offsets[s + 1] - offsets[s]))
             : 1.0f;
    const float* gs = grad + static_cast<int64_t>(s) * grad_stride;
#pragma unroll
    for (int v = 0; v < kPerLane; ++v) {
      const int u = lane + v * group;
      if (u < units) {
        const U x = LoadUnit<kVec4>(gs, u);
        if constexpr (kVec4) {
          g[v * 4 + 0] = __fadd_rn(g[v * 4 + 0], __fmul_rn(x.x, scale));
          g[v * 4 + 1] = __fadd_rn(g[v * 4 + 1], __fmul_rn(x.y, scale));
          g[v * 4 + 2] = __fadd_rn(g[v * 4 + 2], __fmul_rn(x.z, scale));
          g[v * 4 + 3] = __fadd_rn(g[v * 4 + 3], __fmul_rn(x.w, scale));
        } else {
          g[v] = __fadd_rn(g[v], __fmul_rn(x, scale));
        }
      }
    }
  }
}

// Backward step 4: the chunks of every run (sparse_chunks.h; the run of the
// out-of-range marker has none). Thread p of [0, n] writes run p's chunk
// count (0 past the runs, so that the exclusive sum over n + 1 entries ends
// with the chunks' total).
__global__ void ChunkCountKernel(const uint64_t* __restrict__ unique_keys,
                                 const int32_t* __restrict__ counts,
                                 const int32_t* __restrict__ num_unique_ptr,
                                 int64_t n, int64_t rows,
                                 int32_t* __restrict__ chunk_counts) {
  const int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (p > n) return;
  chunk_counts[p] = p < *num_unique_ptr && unique_keys[p] < uint64_t(rows)
                        ? SplitChunks(counts[p])
                        : 0;
}

// Backward step 5: one group of `group` lanes per chunk of a split run
// (grid-stride over the chunks' total, chunk_starts[n]); lane l sums units
// l, l + group, ... of the chunk's occurrences from 0 in order into row j
// of `partials` (dim floats per chunk).
template <bool kVec4, int kPerLane>
__global__ void ChunkPartialKernel(
    int dim, bool mean, const int64_t* __restrict__ offsets,
    const float* __restrict__ grad, int64_t grad_stride,
    const int32_t* __restrict__ counts, const int32_t* __restrict__ starts,
    const int32_t* __restrict__ sorted_bags,
    const int32_t* __restrict__ num_unique_ptr,
    const int32_t* __restrict__ chunk_starts, int64_t n, int group,
    float* __restrict__ partials) {
  constexpr int kW = Unit<kVec4>::kWidth;
  const int64_t total = chunk_starts[n];
  const int64_t num_unique = *num_unique_ptr;
  const int units = dim / kW;
  const int lane = threadIdx.x % group;
  const int64_t groups_per_grid =
      static_cast<int64_t>(gridDim.x) * (blockDim.x / group);
  for (int64_t j =
           (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) /
           group;
       j < total; j += groups_per_grid) {
    const int64_t k = RunOfChunk(chunk_starts, num_unique, j);
    const ChunkRange r =
        ChunkOccurrences(starts[k], counts[k], j - chunk_starts[k]);
    float g[kPerLane * kW];
#pragma unroll
    for (int i = 0; i < kPerLane * kW; ++i) g[i] = 0.0f;
    AddOccurrences<kVec4, kPerLane>(g, r.begin, r.end, lane, group, units, mean,
                                    offsets, grad, grad_stride, sorted_bags);
    float* out = partials + j * dim;
#pragma unroll
    for (int v = 0; v < kPerLane; ++v) {
      const int u = lane + v * group;
      if (u < units) {
        if constexpr (kVec4) {
          StoreUnit<true>(out, u,
                          make_float4(g[v * 4 + 0], g[v * 4 + 1], g[v * 4 + 2],
                                      g[v * 4 + 3]));
        } else {
          StoreUnit<false>(out, u, g[v]);
        }
      }
    }
  }
}

// Backward step 6: one group of `group` lanes per unique row; lane l holds
// units l, l + group, ... (kPerLane of them) of the row's gradient in
// registers: the sum of the run's occurrences in order when the run is not
// split, otherwise its chunks' partials added in chunk order. Then it
// applies the optimizer's rule (optim/rules.h) to its columns. All lanes of
// a warp run the same number of loop rounds so the group shuffles see every
// lane. state1 / state2 hold floats1 / floats2 floats per row (0 where the
// rule has no such array). `partials` may be null when no run is longer
// than kSparseChunk.
template <typename Rule, bool kVec4, int kPerLane>
__global__ void SparseUpdateKernel(
    float* __restrict__ weights, float* __restrict__ state1,
    float* __restrict__ state2, int floats1, int floats2, int64_t rows, int dim,
    bool mean, typename Rule::Step step, const int64_t* __restrict__ offsets,
    const float* __restrict__ grad, int64_t grad_stride,
    const uint64_t* __restrict__ unique_keys,
    const int32_t* __restrict__ counts, const int32_t* __restrict__ starts,
    const int32_t* __restrict__ sorted_bags,
    const int32_t* __restrict__ num_unique_ptr,
    const int32_t* __restrict__ chunk_starts,
    const float* __restrict__ partials, int group) {
  using U = typename Unit<kVec4>::Type;
  constexpr int kW = Unit<kVec4>::kWidth;
  const int num_unique = *num_unique_ptr;
  const int units = dim / kW;
  const int lane = threadIdx.x % group;
  const int64_t groups_per_grid =
      static_cast<int64_t>(gridDim.x) * (blockDim.x / group);
  const int64_t first_group =
      (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / group;
  // Rounds are counted from the warp's first group, so every lane of a warp
  // agrees on the loop bound.
  const int64_t warp_first_group =
      (static_cast<int64_t>(blockIdx.x) * blockDim.x +
       (threadIdx.x / kWarp) * kWarp) /
      group;
  for (int64_t round = 0;
       warp_first_group + round * groups_per_grid < num_unique; ++round) {
    const int64_t k = first_group + round * groups_per_grid;
    const bool active = k < num_unique && unique_keys[k] < uint64_t(rows);
    float g[kPerLane * kW];
#pragma unroll
    for (int i = 0; i < kPerLane * kW; ++i) g[i] = 0.0f;
    int64_t row = 0;
    if (active) {
      row = static_cast<int64_t>(unique_keys[k]);
      const int32_t count = counts[k];
      const int32_t chunks = SplitChunks(count);
      if (chunks == 0) {
        AddOccurrences<kVec4, kPerLane>(
            g, starts[k], int64_t{starts[k]} + count, lane, group, units, mean,
            offsets, grad, grad_stride, sorted_bags);
      } else {
        const float* p = partials + static_cast<int64_t>(chunk_starts[k]) * dim;
        // Unrolled so that about four units' loads per lane are in flight
        // (several chunks' when a lane holds fewer units; more would cost
        // registers that wide rows need); the adds stay in chunk order.
        constexpr int kCombineUnroll = kPerLane >= 4 ? 1 : 4 / kPerLane;
#pragma unroll(kCombineUnroll)
        for (int32_t c = 0; c < chunks; ++c) {
#pragma unroll
          for (int v = 0; v < kPerLane; ++v) {
            const int u = lane + v * group;
            if (u < units) {
              const U x = LoadUnit<kVec4>(p + static_cast<int64_t>(c) * dim, u);
              if constexpr (kVec4) {
                g[v * 4 + 0] = __fadd_rn(g[v * 4 + 0], x.x);
                g[v * 4 + 1] = __fadd_rn(g[v * 4 + 1], x.y);
                g[v * 4 + 2] = __fadd_rn(g[v * 4 + 2], x.z);
                g[v * 4 + 3] = __fadd_rn(g[v * 4 + 3], x.w);
              } else {
                g[v] = __fadd_rn(g[v], x);
              }
            }
          }
        }
      }
    }

    float* w = weights + row * dim;
    float* s1 = state1 + row * floats1;
    float* s2 = state2 + row * floats2;
    float row_scale = 0.0f;
    if constexpr (Rule::kRowReduction) {
      // The rule's sum over the row's columns: lane partials, then a
      // butterfly inside the group (a fixed order, so deterministic; not
      // the CPU's column order).
      float sum = 0.0f;
#pragma unroll
      for (int v = 0; v < kPerLane; ++v) {
        if (lane + v * group < units) {
#pragma unroll
          for (int j = 0; j < kW; ++j) {
            sum = RnAdd(sum, Rule::RowTerm(g[v * kW + j]));
          }
        }
      }
      for (int offset = group / 2; offset > 0; offset /= 2) {
        sum = RnAdd(sum, __shfl_xor_sync(kFullMask, sum, offset, group));
      }
      // Lane 0 reads the row's state float and hands it to the group, so no
      // lane can read it after lane 0 has written the new value.
      float row_state = lane == 0 && active ? *s1 : 0.0f;
      row_state = __shfl_sync(kFullMask, row_state, 0, group);
      if (active) {
        row_scale = Rule::RowScale(step, row_state, sum, dim);
        if (lane == 0) *s1 = row_state;
      }
    }
    if (active) {
#pragma unroll
      for (int v = 0; v < kPerLane; ++v) {
        const int u = lane + v * group;
        if (u < units) {
#pragma unroll
          for (int j = 0; j < kW; ++j) {
            Rule::SparseElement(step, row_scale, g[v * kW + j], w, s1, s2,
                                u * kW + j);
          }
        }
      }
    }
  }
}

// The state arrays' floats per row and the rule's step constants.
template <typename Rule>
struct UpdateArgs {
  int floats1 = 0, floats2 = 0;
  typename Rule::Step step;
};

template <typename Rule, bool kVec4, int kPerLane>
absl::Status LaunchUpdate(int64_t grid, float* weights, float* state1,
                          float* state2, int64_t rows, int dim, bool mean,
                          const UpdateArgs<Rule>& args, const DeviceBags& bags,
                          const float* grad, int64_t grad_stride,
                          BackwardWorkspace* ws, const float* partials,
                          int group, cudaStream_t stream) {
  return LaunchKernel(
      "SparseUpdateKernel", SparseUpdateKernel<Rule, kVec4, kPerLane>,
      dim3(static_cast<unsigned>(grid)), dim3(kThreads), 0, stream, weights,
      state1, state2, args.floats1, args.floats2, rows, dim, mean, args.step,
      bags.offsets, grad, grad_stride,
      static_cast<const uint64_t*>(ws->unique_keys.data()),
      static_cast<const int32_t*>(ws->counts.data()),
      static_cast<const int32_t*>(ws->starts.data()),
      static_cast<const int32_t*>(ws->sorted_bags.data()),
      static_cast<const int32_t*>(ws->num_unique.data()),
      static_cast<const int32_t*>(ws->chunk_starts.data()),
      static_cast<const float*>(partials), group);
}

// The kernel instance for `shape`.
template <typename Rule>
absl::Status LaunchUpdateForShape(const RowShape& shape, int64_t grid,
                                  float* weights, float* state1, float* state2,
                                  int64_t rows, int dim, bool mean,
                                  const UpdateArgs<Rule>& args,
                                  const DeviceBags& bags, const float* grad,
                                  int64_t grad_stride, BackwardWorkspace* ws,
                                  const float* partials, cudaStream_t stream) {
#define DLRM_LAUNCH_UPDATE(vec, per_lane)                               \
  return LaunchUpdate<Rule, vec, per_lane>(                             \
      grid, weights, state1, state2, rows, dim, mean, args, bags, grad, \
      grad_stride, ws, partials, shape.group, stream)
  if (shape.vec4) {
    switch (shape.per_lane) {
      case 1:
        DLRM_LAUNCH_UPDATE(true, 1);
      case 2:
        DLRM_LAUNCH_UPDATE(true, 2);
      case 3:
      case 4:
        DLRM_LAUNCH_UPDATE(true, 4);
      default:
        DLRM_LAUNCH_UPDATE(true, 8);
    }
  }
  switch (shape.per_lane) {
    case 1:
      DLRM_LAUNCH_UPDATE(false, 1);
    case 2:
      DLRM_LAUNCH_UPDATE(false, 2);
    case 3:
    case 4:
      DLRM_LAUNCH_UPDATE(false, 4);
    default:
      DLRM_LAUNCH_UPDATE(false, 8);
  }
#undef DLRM_LAUNCH_UPDATE
}

template <bool kVec4, int kPerLane>
absl::Status LaunchPartials(int64_t grid, int dim, bool mean,
                            const DeviceBags& bags, const float* grad,
                            int64_t grad_stride, BackwardWorkspace* ws,
                            int64_t n, int group, cudaStream_t stream) {
  return LaunchKernel("ChunkPartialKernel", ChunkPartialKernel<kVec4, kPerLane>,
                      dim3(static_cast<unsigned>(grid)), dim3(kThreads), 0,
                      stream, dim, mean, bags.offsets, grad, grad_stride,
                      static_cast<const int32_t*>(ws->counts.data()),
                      static_cast<const int32_t*>(ws->starts.data()),
                      static_cast<const int32_t*>(ws->sorted_bags.data()),
                      static_cast<const int32_t*>(ws->num_unique.data()),
                      static_cast<const int32_t*>(ws->chunk_starts.data()), n,
                      group, ws->partials.data());
}

// The chunk kernel instance for `shape` (the update kernel's unit layout).
absl::Status LaunchPartialsForShape(const RowShape& shape, int64_t grid,
                                    int dim, bool mean, const DeviceBags& bags,
                                    const float* grad, int64_t grad_stride,
                                    BackwardWorkspace* ws, int64_t n,
                                    cudaStream_t stream) {
#define DLRM_LAUNCH_PARTIALS(vec, per_lane) \
  return LaunchPartials<vec, per_lane>(     \
      grid, dim, mean, bags, grad, grad_stride, ws, n, shape.group, stream)
  if (shape.vec4) {
    switch (shape.per_lane) {
      case 1:
        DLRM_LAUNCH_PARTIALS(true, 1);
      case 2:
        DLRM_LAUNCH_PARTIALS(true, 2);
      case 3:
      case 4:
        DLRM_LAUNCH_PARTIALS(true, 4);
      default:
        DLRM_LAUNCH_PARTIALS(true, 8);
    }
  }
  switch (shape.per_lane) {
    case 1:
      DLRM_LAUNCH_PARTIALS(false, 1);
    case 2:
      DLRM_LAUNCH_PARTIALS(false, 2);
    case 3:
    case 4:
      DLRM_LAUNCH_PARTIALS(false, 4);
    default:
      DLRM_LAUNCH_PARTIALS(false, 8);
  }
#undef DLRM_LAUNCH_PARTIALS
}

}  // namespace

absl::Status SparseBackwardUpdate(float* weights, float* state1, float* state2,
                                  int64_t rows, int dim, bool mean,
                                  const optim::AnyStep& step,
                                  const DeviceBags& bags, const float* grad,
                                  int64_t grad_stride, BackwardWorkspace* ws,
                                  cudaStream_t stream) {
  RETURN_IF_ERROR(CheckShape("SparseBackwardUpdate", dim, grad_stride));
  // Floats per row of state1 / state2, and whether the arrays with one per
  // element are aligned like the weights (the float4 path needs that).
  int floats[2] = {0, 0};
  bool state_aligned = true;
  std::visit(
      [&](const auto& constants) {
        using Rule = typename std::decay_t<decltype(constants)>::Rule;
        int k = 0;
        for (const optim::StateArray& array : Rule::kSparseState) {
          floats[k] = optim::FloatsPerRow(array, dim);
          if (array.extent == optim::Extent::kElement) {
            state_aligned =
                state_aligned && Aligned16(k == 0 ? state1 : state2);
          }
          ++k;
        }
      },
      step);
  const int64_t n = bags.num_ids;
  if (bags.num_bags == 0 || n == 0) return absl::OkStatus();
  if (n > std::numeric_limits<int32_t>::max() ||
      bags.num_bags > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat("SparseBackwardUpdate: ", n, " ids in ", bags.num_bags,
                     " bags; at most 2^31 - 1 of each per call"));
  }
  const RowShape s = ShapeOf(dim, Aligned16(weights) && Aligned16(grad) &&
                                      grad_stride % 4 == 0 && state_aligned);
  if (s.per_lane > 8) {
    // Only the float4 path holds rows over 256 columns in registers.
    return absl::InvalidArgumentError(absl::StrCat(
        "SparseBackwardUpdate: dim ", dim,
        " over 256 needs 16-byte aligned weights, state and gradient rows "
        "(grad_stride ",
        grad_stride, " must be a multiple of 4)"));
  }
  const int num = static_cast<int>(n);
  // No run can be split (sparse_chunks.h) when the batch has no more ids
  // than a chunk holds; then the chunk steps are left out.
  const bool may_split = n > kSparseChunk;
  const int64_t max_chunks = MaxSplitChunks(n);
  // The chunk scan's n + 1 entries (2^31 at most: unsigned, so CUB still
  // picks 32-bit offsets).
  const uint32_t scan_items = static_cast<uint32_t>(n) + 1u;
  RETURN_IF_ERROR(ws->keys.Resize(n));
  RETURN_IF_ERROR(ws->sorted_keys.Resize(n));
  RETURN_IF_ERROR(ws->unique_keys.Resize(n));
  RETURN_IF_ERROR(ws->bags.Resize(n));
  RETURN_IF_ERROR(ws->sorted_bags.Resize(n));
  RETURN_IF_ERROR(ws->counts.Resize(n));
  RETURN_IF_ERROR(ws->starts.Resize(n));
  RETURN_IF_ERROR(ws->num_unique.Resize(1));
  if (may_split) {
    RETURN_IF_ERROR(ws->chunk_counts.Resize(n + 1));
    RETURN_IF_ERROR(ws->chunk_starts.Resize(n + 1));
    RETURN_IF_ERROR(ws->partials.Resize(max_chunks * dim));
  }

  // Only the bits an id (or the out-of-range marker `rows`) can have take
  // part in the sort: fewer radix passes for smaller tables.
  const int end_bit = std::bit_width(static_cast<uint64_t>(rows));
  size_t sort_bytes = 0, rle_bytes = 0, scan_bytes = 0, chunk_scan_bytes = 0;
  CUDA_RETURN_IF_ERROR(cub::DeviceRadixSort::SortPairs(
      nullptr, sort_bytes, ws->keys.data(), ws->sorted_keys.data(),
      ws->bags.data(), ws->sorted_bags.data(), num, 0, end_bit, stream));
  CUDA_RETURN_IF_ERROR(cub::DeviceRunLengthEncode::Encode(
      nullptr, rle_bytes, ws->sorted_keys.data(), ws->unique_keys.data(),
      ws->counts.data(), ws->num_unique.data(), num, stream));
  CUDA_RETURN_IF_ERROR(cub::DeviceScan::ExclusiveSum(
      nullptr, scan_bytes, ws->counts.data(), ws->starts.data(), num, stream));
  if (may_split) {
    CUDA_RETURN_IF_ERROR(cub::DeviceScan::ExclusiveSum(
        nullptr, chunk_scan_bytes, ws->chunk_counts.data(),
        ws->chunk_starts.data(), scan_items, stream));
  }
  RETURN_IF_ERROR(ws->cub_temp.Reserve(
      std::max({sort_bytes, rle_bytes, scan_bytes, chunk_scan_bytes})));
  void* temp = ws->cub_temp.data();
  size_t temp_bytes = ws->cub_temp.bytes();

  // In 64 bits: num + kThreads - 1 overflows an int near 2^31.
  RETURN_IF_ERROR(
      LaunchKernel("ExpandKernel", ExpandKernel,
                   dim3(static_cast<unsigned>(GridBlocks(n, 1, kThreads))),
                   dim3(kThreads), 0, stream, bags.offsets, bags.ids,
                   bags.num_bags, n, rows, ws->keys.data(), ws->bags.data()));
  // A stable sort: each row's occurrences stay in position (= bag) order,
  // the CPU kernel's accumulation order.
  CUDA_RETURN_IF_ERROR(cub::DeviceRadixSort::SortPairs(
      temp, temp_bytes, ws->keys.data(), ws->sorted_keys.data(),
      ws->bags.data(), ws->sorted_bags.data(), num, 0, end_bit, stream));
  // The scan runs over all n counts (the host does not know the number of
  // runs without a sync); entries past the last run are zeroed first so it
  // reads no stale memory.
  CUDA_RETURN_IF_ERROR(
      cudaMemsetAsync(ws->counts.data(), 0, sizeof(int32_t) * n, stream));
  temp_bytes = ws->cub_temp.bytes();
  CUDA_RETURN_IF_ERROR(cub::DeviceRunLengthEncode::Encode(
      temp, temp_bytes, ws->sorted_keys.data(), ws->unique_keys.data(),
      ws->counts.data(), ws->num_unique.data(), num, stream));
  temp_bytes = ws->cub_temp.bytes();
  CUDA_RETURN_IF_ERROR(cub::DeviceScan::ExclusiveSum(
      temp, temp_bytes, ws->counts.data(), ws->starts.data(), num, stream));

  // Grids sized for the most groups the host cannot rule out (every id
  // unique; MaxSplitChunks chunks), capped at a few waves: groups loop over
  // the rest.
  int device = 0, sms = 0;
  CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  CUDA_RETURN_IF_ERROR(
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const int64_t groups_per_block = kThreads / s.group;
  const int64_t max_blocks = int64_t{sms} * 8;

  // The chunk plan and each chunk's partial sum (sparse_chunks.h).
  const float* partials = nullptr;
  if (may_split) {
    RETURN_IF_ERROR(LaunchKernel(
        "ChunkCountKernel", ChunkCountKernel,
        dim3(static_cast<unsigned>(CeilDiv<int64_t>(n + 1, kThreads))),
        dim3(kThreads), 0, stream,
        static_cast<const uint64_t*>(ws->unique_keys.data()),
        static_cast<const int32_t*>(ws->counts.data()),
        static_cast<const int32_t*>(ws->num_unique.data()), n, rows,
        ws->chunk_counts.data()));
    temp_bytes = ws->cub_temp.bytes();
    CUDA_RETURN_IF_ERROR(cub::DeviceScan::ExclusiveSum(
        temp, temp_bytes, ws->chunk_counts.data(), ws->chunk_starts.data(),
        scan_items, stream));
    const int64_t grid = std::min<int64_t>(
        CeilDiv<int64_t>(max_chunks, groups_per_block), max_blocks);
    RETURN_IF_ERROR(LaunchPartialsForShape(s, grid, dim, mean, bags, grad,
                                           grad_stride, ws, n, stream));
    partials = ws->partials.data();
  }

  const int64_t grid =
      std::min<int64_t>(CeilDiv<int64_t>(n, groups_per_block), max_blocks);
  return std::visit(
      [&](const auto& constants) {
        using Rule = typename std::decay_t<decltype(constants)>::Rule;
        const UpdateArgs<Rule> args{floats[0], floats[1], constants};
        return LaunchUpdateForShape<Rule>(s, grid, weights, state1, state2,
                                          rows, dim, mean, args, bags, grad,
                                          grad_stride, ws, partials, stream);
      },
      step);
}

}  // namespace dlrm::embedding::cuda
