// The interaction dispatchers, and the DLRM dot interaction: per-sample
// Gram lower triangle (forward) and its symmetric gradient (backward), plus
// the plain-loop reference.
#include "dense/interaction.h"

#include <algorithm>
#include <cstring>

#include "core/aligned.h"
#include "core/config.h"

namespace dlrm::dense {
namespace {

// Samples below which the OpenMP fork/join costs more than the work.
constexpr int64_t kParallelSamples = 32;

// Eight floats: one register on the x86-64-v3 target. Written with the
// GCC/Clang vector extension because GCC's auto-vectorizer, left to itself,
// vectorized these loop nests along the wrong axis (permutes and gathers,
// 4x slower than the plain reference).
using Vec8 = float __attribute__((vector_size(32)));
constexpr int kLanes = 8;

inline Vec8 Load8(const float* p) {
  Vec8 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
inline void Store8(float* p, Vec8 v) { std::memcpy(p, &v, sizeof(v)); }
// Not `Vec8{} + x`: 0 + x is not x for x = -0, so that costs an add.
inline Vec8 Splat(float x) { return Vec8{x, x, x, x, x, x, x, x}; }

// Offset of pair (i, j), i > j, within the dot part of z.
inline int PairIndex(int i, int j) { return i * (i - 1) / 2 + j; }

// Rows of the Gram computed together, sharing each load of the transposed
// block.
constexpr int kRows = 4;

// Writes lanes [0, m) of `v` to p.
inline void StorePartial(float* p, Vec8 v, int m) {
  if (m == kLanes) return Store8(p, v);
  float tmp[kLanes];
  Store8(tmp, v);
  std::copy(tmp, tmp + m, p);
}

// One sample's forward. `tt` is scratch of d x np floats (np = n rounded up
// to kLanes) that receives t transposed, so the dots of row i with eight
// rows j are one vector: sum_k t_ik * tt[k][j..j+8). No horizontal sums, and
// row i's dots land contiguously in z.
void ForwardSample(const float* t, int n, int d, float* tt, float* z) {
  const int np = (n + kLanes - 1) / kLanes * kLanes;
  for (int k = 0; k < d; ++k) {
    float* col = tt + k * np;
    for (int j = 0; j < n; ++j) col[j] = t[j * d + k];
    for (int j = n; j < np; ++j) col[j] = 0.0f;
  }
  std::copy(t, t + d, z);
  float* dots = z + d;
  for (int jb = 0; jb < n - 1; jb += kLanes) {
    int i = jb + 1;
    for (; i + kRows <= n; i += kRows) {
      Vec8 acc[kRows] = {};
      for (int k = 0; k < d; ++k) {
        const Vec8 col = Load8(tt + k * np + jb);
        for (int r = 0; r < kRows; ++r)
          acc[r] += Splat(t[(i + r) * d + k]) * col;
      }
      for (int r = 0; r < kRows; ++r) {
        StorePartial(dots + PairIndex(i + r, jb), acc[r],
                     std::min(kLanes, i + r - jb));
      }
    }
    for (; i < n; ++i) {
      Vec8 acc = {};
      for (int k = 0; k < d; ++k) {
        acc += Splat(t[i * d + k]) * Load8(tt + k * np + jb);
      }
      StorePartial(dots + PairIndex(i, jb), acc, std::min(kLanes, i - jb));
    }
  }
}

// One sample's backward: dt_i = sum_{j != i} g_ij t_j, with g_ij the
// gradient of the dot (max(i,j), min(i,j)): the j < i coefficients are
// contiguous in dz, the j > i ones a strided column, and both are scalar
// broadcasts, so no symmetric matrix is built. dt_i stays in kV registers
// (d = 8 kV).
template <int kV>
void BackwardSample(const float* t, const float* dz, int n, float* dt) {
  constexpr int d = kV * kLanes;
  const float* ddots = dz + d;
  for (int i = 0; i < n; ++i) {
    Vec8 acc[kV];
    for (int v = 0; v < kV; ++v) {
      acc[v] = i == 0 ? Load8(dz + v * kLanes) : Vec8{};
    }
    const float* row = ddots + PairIndex(i, 0);
    for (int j = 0; j < i; ++j) {
      const Vec8 g = Splat(row[j]);
      for (int v = 0; v < kV; ++v) acc[v] += g * Load8(t + j * d + v * kLanes);
    }
    for (int j = i + 1; j < n; ++j) {
      const Vec8 g = Splat(ddots[PairIndex(j, i)]);
      for (int v = 0; v < kV; ++v) acc[v] += g * Load8(t + j * d + v * kLanes);
    }
    for (int v = 0; v < kV; ++v) Store8(dt + i * d + v * kLanes, acc[v]);
  }
}

// The same for any d, with dt_i accumulated in memory.
void BackwardSampleAnyD(const float* t, const float* dz, int n, int d,
                        float* dt) {
  const float* ddots = dz + d;
  for (int i = 0; i < n; ++i) {
    float* acc = dt + i * d;
    for (int k = 0; k < d; ++k) acc[k] = i == 0 ? dz[k] : 0.0f;
    for (int j = 0; j < n; ++j) {
      if (j == i) continue;
      const float g = ddots[j < i ? PairIndex(i, j) : PairIndex(j, i)];
      const float* tj = t + j * d;
      for (int k = 0; k < d; ++k) acc[k] += g * tj[k];
    }
  }
}

template <int kV>
void Backward(const float* t, const float* dz, int64_t batch, int n, int d,
              float* dt) {
  const int64_t t_stride = static_cast<int64_t>(n) * d;
  const int64_t z_stride = DotInteractionDim(n, d);
#pragma omp parallel for schedule(static) if (batch >= kParallelSamples)
  for (int64_t b = 0; b < batch; ++b) {
    if constexpr (kV > 0) {
      BackwardSample<kV>(t + b * t_stride, dz + b * z_stride, n,
                         dt + b * t_stride);
    } else {
      BackwardSampleAnyD(t + b * t_stride, dz + b * z_stride, n, d,
                         dt + b * t_stride);
    }
  }
}

}  // namespace

InteractionShape MakeInteractionShape(const ModelConfig& config) {
  InteractionShape s;
  s.kind = config.interaction();
  s.num_vectors = config.tables_size() + 1;
  s.dim = config.bottom_mlp(config.bottom_mlp_size() - 1);
  s.input_width = s.dim;
  for (const TableConfig& t : config.tables()) s.input_width += t.dim();
  s.output_width = InteractionOutputDim(config);
  return s;
}

bool InteractionIsIdentity(Interaction kind) { return kind == INTERACTION_CAT; }

void InteractionForward(const InteractionShape& s, const float* t,
                        int64_t batch, float* z, CrossNet* cross) {
  switch (s.kind) {
    case INTERACTION_DOT:
      return DotInteractionForward(t, batch, s.num_vectors, s.dim, z);
    case INTERACTION_DCN:
      return cross->Forward(t, batch, z);
    case INTERACTION_CAT:  // the identity: not called
    default:               // refused by ValidateModelConfig
      return;
  }
}

void InteractionBackward(const InteractionShape& s, const float* t,
                         const float* dz, int64_t batch, float* dt,
                         CrossNet* cross) {
  switch (s.kind) {
    case INTERACTION_DOT:
      return DotInteractionBackward(t, dz, batch, s.num_vectors, s.dim, dt);
    case INTERACTION_DCN:
      return cross->Backward(t, dz, batch, dt);
    case INTERACTION_CAT:  // the identity: not called
    default:               // refused by ValidateModelConfig
      return;
  }
}

void InteractionInfer(const InteractionShape& s, const float* t, int64_t batch,
                      float* z, const CrossNet& cross,
                      AlignedVector<float>* scratch) {
  switch (s.kind) {
    case INTERACTION_DOT:  // keeps nothing either way
      return DotInteractionForward(t, batch, s.num_vectors, s.dim, z);
    case INTERACTION_DCN:
      return cross.Infer(t, batch, z, scratch);
    case INTERACTION_CAT:  // the identity: not called
    default:               // refused by ValidateModelConfig
      return;
  }
}

void DotInteractionForward(const float* t, int64_t batch, int n, int d,
                           float* z) {
  if (batch <= 0) return;
  const int64_t in_stride = static_cast<int64_t>(n) * d;
  const int64_t out_stride = DotInteractionDim(n, d);
  const int np = (n + kLanes - 1) / kLanes * kLanes;
#pragma omp parallel if (batch >= kParallelSamples)
  {
    AlignedVector<float> tt(static_cast<size_t>(d) * np);
#pragma omp for schedule(static)
    for (int64_t b = 0; b < batch; ++b) {
      ForwardSample(t + b * in_stride, n, d, tt.data(), z + b * out_stride);
    }
  }
}

void DotInteractionBackward(const float* t, const float* dz, int64_t batch,
                            int n, int d, float* dt) {
  if (batch <= 0) return;
  switch (d) {
    case 8:
      return Backward<1>(t, dz, batch, n, d, dt);
    case 16:
      return Backward<2>(t, dz, batch, n, d, dt);
    case 32:
      return Backward<4>(t, dz, batch, n, d, dt);
    case 64:
      return Backward<8>(t, dz, batch, n, d, dt);
    default:
      return Backward<0>(t, dz, batch, n, d, dt);
  }
}

namespace reference {

void DotInteractionForward(const float* t, int64_t batch, int n, int d,
                           float* z) {
  const int dim = DotInteractionDim(n, d);
  for (int64_t b = 0; b < batch; ++b) {
    const float* tb = t + b * n * d;
    float* zb = z + b * dim;
    for (int k = 0; k < d; ++k) zb[k] = tb[k];
    int p = d;
    for (int i = 1; i < n; ++i) {
      for (int j = 0; j < i; ++j) {
        float dot = 0.0f;
        for (int k = 0; k < d; ++k) dot += tb[i * d + k] * tb[j * d + k];
        zb[p++] = dot;
      }
    }
  }
}

void DotInteractionBackward(const float* t, const float* dz, int64_t batch,
                            int n, int d, float* dt) {
  const int dim = DotInteractionDim(n, d);
  for (int64_t b = 0; b < batch; ++b) {
    const float* tb = t + b * n * d;
    const float* gb = dz + b * dim;
    float* db = dt + b * n * d;
    for (int x = 0; x < n * d; ++x) db[x] = 0.0f;
    for (int k = 0; k < d; ++k) db[k] = gb[k];
    int p = d;
    for (int i = 1; i < n; ++i) {
      for (int j = 0; j < i; ++j) {
        const float g = gb[p++];
        for (int k = 0; k < d; ++k) {
          db[i * d + k] += g * tb[j * d + k];
          db[j * d + k] += g * tb[i * d + k];
        }
      }
    }
  }
}

}  // namespace reference
}  // namespace dlrm::dense
