// Feature interaction of DLRM. The input holds, per sample, n vectors of
// width d back to back ([batch x n x d]): the bottom-MLP output first, then
// each table's pooled embedding. Dot output per sample: the first vector
// (d values), then the dots <v_i, v_j> for i > j in the order (1,0), (2,0),
// (2,1), (3,0), ... (the reference's strict lower triangle). Cat output is
// the input itself, so it needs no kernel. DCN output is the low-rank cross
// network of dense/cross_net.h over the input (the same width), the one
// interaction with parameters so far.
//
// The dense backends call only the dispatchers below (InteractionForward /
// InteractionBackward / InteractionInfer here for the CPU, their twins in
// dense/cuda/cuda_dense.h). An interaction with parameters is an
// InteractionLayer (dense/interaction_layer.h), which the dispatchers call;
// one without is a case of theirs in interaction.cc and dense_kernels.cu,
// so adding one touches its enum value (proto/dlrm/config.proto), its
// output width and config checks (core/config.cc), and these two files.
#pragma once

#include <cstdint>

#include "core/aligned.h"
#include "dense/interaction_layer.h"
#include "dlrm/config.pb.h"

namespace dlrm::dense {

// The interaction of one model: per sample, the input t holds n vectors
// back to back (the bottom-MLP output of width d first, then each table's
// pooled embedding) and the output z feeds the top MLP.
struct InteractionShape {
  Interaction kind = INTERACTION_DOT;
  int num_vectors = 0;   // n: tables + 1
  int dim = 0;           // d: the bottom MLP's output width
  int input_width = 0;   // floats of t per sample: d + every table's dim
  int output_width = 0;  // floats of z per sample (InteractionOutputDim)
};

// The shape of a normalised config's interaction.
InteractionShape MakeInteractionShape(const ModelConfig& config);

// Whether the interaction's output is its input (z = t, dt = dz): then the
// backends run no kernel and copy nothing.
bool InteractionIsIdentity(Interaction kind);

// z [batch x output_width] from t [batch x input_width], the training
// forward. `layer` is the model's interaction layer
// (HostDenseParams::interaction), null for an interaction without
// parameters; it keeps what InteractionBackward needs (t must then be
// unchanged until it runs). Not called for an identity interaction.
void InteractionForward(const InteractionShape& shape, const float* t,
                        int64_t batch, float* z, InteractionLayer* layer);
// dt [batch x input_width] (overwritten) from dz [batch x output_width] and
// the forward's t; with a `layer`, also writes its gradients. Not called
// for an identity interaction.
void InteractionBackward(const InteractionShape& shape, const float* t,
                         const float* dz, int64_t batch, float* dt,
                         InteractionLayer* layer);
// The inference forward: z as InteractionForward's, keeping nothing for a
// backward (a pending InteractionBackward stays valid); `scratch` is
// resized as needed. Not called for an identity interaction.
void InteractionInfer(const InteractionShape& shape, const float* t,
                      int64_t batch, float* z, const InteractionLayer* layer,
                      AlignedVector<float>* scratch);

// Output width of the dot interaction.
inline int DotInteractionDim(int n, int d) { return d + n * (n - 1) / 2; }

// The two CPU implementations of the dot interaction, equal up to float
// summation order: kLoops, register-blocked loops over one sample at a
// time; kGemm, batched GEMMs (oneDNN matmul over chunks of samples: Z = T
// T^T, then its strict lower triangle; dT = (G + G^T) T with G the output
// gradient scattered into the strict lower triangle).
enum class DotImpl { kLoops, kGemm };

// The pass of the dot interaction an implementation is chosen for.
enum class DotPass { kForward, kBackward };

// The implementation DotInteractionForward / Backward use for `batch`
// samples of n vectors of width d, from interleaved timings of both
// (bench/interaction_bench.cc): kGemm where batch x d >= 512 (below, its
// fixed cost per call, a few microseconds, is more than the loops' whole
// run) and, forward, n >= 8 and d >= 8, backward, n >= 16 and d >= 24;
// kLoops elsewhere. So the Kaggle shape (n 27, d 16) runs the GEMM forward
// and the loops' backward, MLPerf v1 (n 27, d 128) GEMMs both ways.
DotImpl ChooseDotImpl(DotPass pass, int64_t batch, int n, int d);

// t: [batch x n x d]; z: [batch x DotInteractionDim(n, d)]. Runs
// ChooseDotImpl(kForward, batch, n, d)'s implementation. Thread-safe
// (calls may overlap); threaded with OpenMP.
void DotInteractionForward(const float* t, int64_t batch, int n, int d,
                           float* z);
// dz: [batch x DotInteractionDim]; writes dt [batch x n x d] (overwrites).
// Runs ChooseDotImpl(kBackward, batch, n, d)'s implementation;
// thread-safe.
void DotInteractionBackward(const float* t, const float* dz, int64_t batch,
                            int n, int d, float* dt);

// The same with the implementation named. kGemm builds its oneDNN
// primitives on first use of a shape and keeps them for the process; a
// oneDNN error is a programming error (the shapes are checked by the
// caller) and aborts naming the call.
void DotInteractionForward(DotImpl impl, const float* t, int64_t batch, int n,
                           int d, float* z);
void DotInteractionBackward(DotImpl impl, const float* t, const float* dz,
                            int64_t batch, int n, int d, float* dt);

// Plain loops: the reference the optimized kernels are tested against.
namespace reference {
void DotInteractionForward(const float* t, int64_t batch, int n, int d,
                           float* z);
void DotInteractionBackward(const float* t, const float* dz, int64_t batch,
                            int n, int d, float* dt);
}  // namespace reference

}  // namespace dlrm::dense
