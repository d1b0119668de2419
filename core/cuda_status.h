// Checking macro for CUDA runtime calls (STYLE.md habit 2): a failed call
// becomes an absl::Status naming the call, CUDA's error string and the
// place. Include only from code built when CUDA is enabled.
#pragma once

#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

// Returns Internal from the enclosing function when `expr` (a cudaError_t)
// is not cudaSuccess.
#define CUDA_RETURN_IF_ERROR(expr)                                        \
  do {                                                                    \
    const cudaError_t _dlrm_cuda_err = (expr);                            \
    if (_dlrm_cuda_err != cudaSuccess) {                                  \
      return ::absl::InternalError(::absl::StrCat(                        \
          #expr, " failed: ", cudaGetErrorString(_dlrm_cuda_err), " at ", \
          __FILE__, ":", __LINE__));                                      \
    }                                                                     \
  } while (0)
