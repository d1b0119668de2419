// EmbeddingBag forward on CUDA (PoolForward): one group of lanes per bag
// (kernel_units.cuh), each output element summed by one thread in id order
// with round-to-nearest adds, in the CPU kernel's order: the CPU's results
// bitwise.
#include "core/status.h"
#include "embedding/cuda/kernel_units.cuh"

namespace dlrm::embedding::cuda {
namespace {

// Ids prefetched per round in the forward loop: independent row loads in
// flight before the first add (adds stay in id order).
constexpr int kForwardUnroll = 4;

// Forward: group of `group` lanes per bag.
template <bool kVec4>
__global__ void PoolForwardKernel(const float* __restrict__ weights,
                                  int64_t rows, int dim, bool mean,
                                  const int64_t* __restrict__ offsets,
                                  const int64_t* __restrict__ ids,
                                  int64_t num_bags, int group,
                                  float* __restrict__ out, int64_t out_stride) {
  using U = typename Unit<kVec4>::Type;
  const int64_t thread =
      static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t bag = thread / group;
  const int lane = static_cast<int>(thread % group);
  if (bag >= num_bags) return;
  const int units = dim / Unit<kVec4>::kWidth;
  const int64_t begin = offsets[bag], end = offsets[bag + 1];
  // x * 1 is exact, so the sum path needs no branch.
  const float scale = mean && end > begin
                          ? __fdiv_rn(1.0f, static_cast<float>(end - begin))
                          : 1.0f;
  float* o = out + bag * out_stride;
  for (int u = lane; u < units; u += group) {
    U acc;
    if constexpr (kVec4) {
      acc = Zero4();
    } else {
      acc = 0.0f;
    }
    int64_t p = begin;
    for (; p + kForwardUnroll <= end; p += kForwardUnroll) {
      U v[kForwardUnroll];
      bool ok[kForwardUnroll];
#pragma unroll
      for (int i = 0; i < kForwardUnroll; ++i) {
        const int64_t id = __ldg(ids + p + i);
        ok[i] = id >= 0 && id < rows;
        if (ok[i]) v[i] = LoadUnit<kVec4>(weights + id * dim, u);
      }
#pragma unroll
      for (int i = 0; i < kForwardUnroll; ++i) {
        if (ok[i]) acc = Add(acc, v[i]);
      }
    }
    for (; p < end; ++p) {
      const int64_t id = __ldg(ids + p);
      if (id >= 0 && id < rows) {
        acc = Add(acc, LoadUnit<kVec4>(weights + id * dim, u));
      }
    }
    StoreUnit<kVec4>(o, u, Scale(acc, scale));
  }
}

}  // namespace

int MaxDim(int dim) { return dim % 4 == 0 ? 4 * kWarp * 8 : kWarp * 8; }

absl::Status PoolForward(const float* weights, int64_t rows, int dim, bool mean,
                         const DeviceBags& bags, float* out, int64_t out_stride,
                         cudaStream_t stream) {
  RETURN_IF_ERROR(CheckShape("PoolForward", dim, out_stride));
  if (bags.num_bags == 0) return absl::OkStatus();
  const RowShape s =
      ShapeOf(dim, Aligned16(weights) && Aligned16(out) && out_stride % 4 == 0);
  const int64_t grid = CeilDiv<int64_t>(bags.num_bags * s.group, kThreads);
  if (s.vec4) {
    return LaunchKernel("PoolForwardKernel<float4>", PoolForwardKernel<true>,
                        dim3(static_cast<unsigned>(grid)), dim3(kThreads), 0,
                        stream, weights, rows, dim, mean, bags.offsets,
                        bags.ids, bags.num_bags, s.group, out, out_stride);
  }
  return LaunchKernel("PoolForwardKernel<float>", PoolForwardKernel<false>,
                      dim3(static_cast<unsigned>(grid)), dim3(kThreads), 0,
                      stream, weights, rows, dim, mean, bags.offsets, bags.ids,
                      bags.num_bags, s.group, out, out_stride);
}

}  // namespace dlrm::embedding::cuda
