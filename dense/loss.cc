// Binary cross-entropy with logits: the mean loss in double and the logit
// gradients, stable for any finite logit.
#include "dense/loss.h"

#include <algorithm>
#include <cmath>

namespace dlrm::dense {

double BceWithLogits(const float* logits, const float* labels, int64_t batch,
                     float grad_scale, float* dlogits) {
  if (batch <= 0) return 0.0;
  // A serial loop: the batch is one logit per sample, far too little work to
  // split, and a fixed summation order keeps the loss bitwise repeatable.
  double total = 0.0;
  for (int64_t i = 0; i < batch; ++i) {
    const double z = logits[i];
    const double y = labels[i];
    // exp(-|z|) never overflows; the same value gives the sigmoid.
    const double e = std::exp(-std::fabs(z));
    total += std::max(z, 0.0) - z * y + std::log1p(e);
    if (dlogits != nullptr) {
      const double sigmoid = z >= 0 ? 1.0 / (1.0 + e) : e / (1.0 + e);
      dlogits[i] = static_cast<float>((sigmoid - y) * grad_scale);
    }
  }
  return total / static_cast<double>(batch);
}

}  // namespace dlrm::dense
