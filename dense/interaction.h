// Feature interaction of DLRM. The input holds, per sample, n vectors of
// width d back to back ([batch x n x d]): the bottom-MLP output first, then
// each table's pooled embedding. Dot output per sample: the first vector
// (d values), then the dots <v_i, v_j> for i > j in the order (1,0), (2,0),
// (2,1), (3,0), ... (the reference's strict lower triangle). Cat output is
// the input itself, so it needs no kernel.
#pragma once

#include <cstdint>

namespace dlrm::dense {

// Output width of the dot interaction.
inline int DotInteractionDim(int n, int d) { return d + n * (n - 1) / 2; }

// t: [batch x n x d]; z: [batch x DotInteractionDim(n, d)].
void DotInteractionForward(const float* t, int64_t batch, int n, int d,
                           float* z);
// dz: [batch x DotInteractionDim]; writes dt [batch x n x d] (overwrites).
void DotInteractionBackward(const float* t, const float* dz, int64_t batch,
                            int n, int d, float* dt);

// Plain loops: the reference the optimized kernels are tested against.
namespace reference {
void DotInteractionForward(const float* t, int64_t batch, int n, int d,
                           float* z);
void DotInteractionBackward(const float* t, const float* dz, int64_t batch,
                            int n, int d, float* dt);
}  // namespace reference

}  // namespace dlrm::dense
