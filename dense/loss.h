// Numerically stable sigmoid and binary cross-entropy with logits.
#pragma once

#include <cmath>
#include <cstdint>

namespace dlrm::dense {

inline float Sigmoid(float z) {
  if (z >= 0) return 1.0f / (1.0f + std::exp(-z));
  const float e = std::exp(z);
  return e / (1.0f + e);
}

// Mean over the batch of max(z,0) - z*y + log(1 + exp(-|z|)). Writes
// dlogits[i] = (sigmoid(z_i) - y_i) * grad_scale unless dlogits is null
// (grad_scale is 1/batch for the plain mean; a data-parallel rank passes
// 1/global_batch). Returns the mean loss as double.
double BceWithLogits(const float* logits, const float* labels, int64_t batch,
                     float grad_scale, float* dlogits);

}  // namespace dlrm::dense
