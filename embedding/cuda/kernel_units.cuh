// The pieces the embedding kernels' files share (pool_forward.cu,
// sparse_backward.cu, row_copies.cu): block and warp sizes, the float4 or
// float units lanes own, rounded adds and multiplies the compiler may not
// fuse, and the row shape a launch picks its kernel instance by. Included
// only by those .cu files: the names are theirs, not the kernels' API
// (embedding_kernels.h).
//
// Layout: a group of G lanes (a power of two up to a warp) owns one bag
// (forward), one chunk of a hot row's occurrences or one unique row
// (backward); lane l of the group owns columns l, l + G, ... in units of
// float4 when dim % 4 == 0 (16-byte loads) or of single floats otherwise.
// Small dims (d = 16: four float4 units) thus pack eight bags into a warp
// instead of idling 28 lanes.
#pragma once

#include <algorithm>
#include <bit>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/cuda/launch.cuh"
#include "embedding/cuda/embedding_kernels.h"

namespace dlrm::embedding::cuda {

using dlrm::cuda::CeilDiv;
using dlrm::cuda::GridBlocks;
using dlrm::cuda::LaunchKernel;

constexpr int kThreads = 256;
constexpr int kWarp = 32;
constexpr unsigned kFullMask = 0xffffffffu;

// Columns per unit: 4 on the float4 path.
template <bool kVec4>
struct Unit;
template <>
struct Unit<true> {
  using Type = float4;
  static constexpr int kWidth = 4;
};
template <>
struct Unit<false> {
  using Type = float;
  static constexpr int kWidth = 1;
};

__device__ __forceinline__ float4 Zero4() {
  return make_float4(0.f, 0.f, 0.f, 0.f);
}
__device__ __forceinline__ float4 Add(float4 a, float4 b) {
  return make_float4(__fadd_rn(a.x, b.x), __fadd_rn(a.y, b.y),
                     __fadd_rn(a.z, b.z), __fadd_rn(a.w, b.w));
}
__device__ __forceinline__ float Add(float a, float b) {
  return __fadd_rn(a, b);
}
__device__ __forceinline__ float4 Scale(float4 a, float s) {
  return make_float4(__fmul_rn(a.x, s), __fmul_rn(a.y, s), __fmul_rn(a.z, s),
                     __fmul_rn(a.w, s));
}
__device__ __forceinline__ float Scale(float a, float s) {
  return __fmul_rn(a, s);
}

template <bool kVec4>
__device__ __forceinline__ typename Unit<kVec4>::Type LoadUnit(const float* p,
                                                               int unit) {
  return __ldg(reinterpret_cast<const typename Unit<kVec4>::Type*>(p) + unit);
}
template <bool kVec4>
__device__ __forceinline__ void StoreUnit(float* p, int unit,
                                          typename Unit<kVec4>::Type v) {
  reinterpret_cast<typename Unit<kVec4>::Type*>(p)[unit] = v;
}

// Units (float4 or float) per row and the group size for them.
struct RowShape {
  bool vec4;
  int units;
  int group;
  int per_lane;
};

inline RowShape ShapeOf(int dim, bool aligned) {
  RowShape s;
  s.vec4 = dim % 4 == 0 && aligned;
  s.units = s.vec4 ? dim / 4 : dim;
  s.group = static_cast<int>(
      std::min<unsigned>(kWarp, std::bit_ceil(static_cast<unsigned>(s.units))));
  s.per_lane = CeilDiv(s.units, s.group);
  return s;
}

inline bool Aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

inline absl::Status CheckShape(const char* what, int dim, int64_t stride) {
  if (dim <= 0 || dim > MaxDim(dim)) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": dim ", dim, " is outside [1, ", MaxDim(dim), "]"));
  }
  if (stride < dim) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": stride ", stride, " is below dim ", dim));
  }
  return absl::OkStatus();
}

}  // namespace dlrm::embedding::cuda
