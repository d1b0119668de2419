// The bfloat16 bits and the fp32 -> bf16 rounding, in one function the CPU
// (dense/bf16.h) and the CUDA kernels (dense/cuda/) both run, so the bits
// the device rounds to are the ones the CPU tests check.
#pragma once

#include <cstdint>
#include <cstring>

#include "core/host_device.h"

namespace dlrm::dense {

// The bits of a bfloat16: the upper half of an fp32 (8 exponent bits, 7
// stored mantissa bits, unit roundoff 2^-8).
using Bf16 = uint16_t;

DLRM_HOST_DEVICE inline uint32_t FloatBits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  return u;
#endif
}

DLRM_HOST_DEVICE inline float BitsFloat(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float x;
  std::memcpy(&x, &u, sizeof(x));
  return x;
#endif
}

// x rounded to the nearest bf16, ties to even (a magnitude past the largest
// bf16 by half an ulp or more becomes infinity; fp32 denormals round like
// any other value); NaN stays NaN, made quiet, with its sign.
DLRM_HOST_DEVICE inline Bf16 ToBf16(float x) {
  const uint32_t u = FloatBits(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<Bf16>(u >> 16 | 64);
  return static_cast<Bf16>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

DLRM_HOST_DEVICE inline float FromBf16(Bf16 x) {
  return BitsFloat(static_cast<uint32_t>(x) << 16);
}

}  // namespace dlrm::dense
