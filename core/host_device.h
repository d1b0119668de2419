// Code that compiles for both the CPU and a CUDA device: DLRM_HOST_DEVICE
// marks such functions, and the Rn* float operations round every result to
// nearest and are never fused into a multiply-add, so a formula written with
// them gives the same bits on the host and the device.
#pragma once

#include <cmath>

#if defined(__CUDACC__)
#define DLRM_HOST_DEVICE __host__ __device__
#else
#define DLRM_HOST_DEVICE
#endif

// Before a host loop whose iterations touch disjoint memory: GCC then
// vectorises it without checking its pointers for overlap first (a check
// per call that costs more than the loop for short embedding rows).
#if defined(__GNUC__) && !defined(__clang__) && !defined(__CUDACC__)
#define DLRM_IVDEP _Pragma("GCC ivdep")
#else
#define DLRM_IVDEP
#endif

namespace dlrm {

// On the device these are the _rn intrinsics, which nvcc never contracts
// into FMA. On the host they are plain operators: host code that uses them
// must be compiled with -ffp-contract=off (dlrm_core_base gives that flag
// to every target, core/CMakeLists.txt), or GCC fuses a * b + c.
DLRM_HOST_DEVICE inline float RnAdd(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

DLRM_HOST_DEVICE inline float RnSub(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}

DLRM_HOST_DEVICE inline float RnMul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

DLRM_HOST_DEVICE inline float RnDiv(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

// Correctly rounded on both sides (IEEE sqrt; the device's __fsqrt_rn).
DLRM_HOST_DEVICE inline float RnSqrt(float a) {
#if defined(__CUDA_ARCH__)
  return __fsqrt_rn(a);
#else
  return std::sqrt(a);
#endif
}

// The same in double, for the per-tensor constants the layer-wise
// optimizers compute from their norms (optim/rules.h).
DLRM_HOST_DEVICE inline double RnAdd(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dadd_rn(a, b);
#else
  return a + b;
#endif
}

DLRM_HOST_DEVICE inline double RnMul(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}

DLRM_HOST_DEVICE inline double RnDiv(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __ddiv_rn(a, b);
#else
  return a / b;
#endif
}

DLRM_HOST_DEVICE inline double RnSqrt(double a) {
#if defined(__CUDA_ARCH__)
  return __dsqrt_rn(a);
#else
  return std::sqrt(a);
#endif
}

}  // namespace dlrm
