// The interaction dispatchers, and the DLRM dot interaction: per-sample
// Gram lower triangle (forward) and its symmetric gradient (backward), as
// register-blocked loops and as batched GEMMs, plus the plain-loop
// reference.
#include "dense/interaction.h"

#include <omp.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <array>
#include <bit>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <tuple>

#include "core/aligned.h"
#include "core/config.h"
#include "dense/cpu_isa.h"

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

#if defined(__x86_64__)
// acc[v] += g * t_j[v], the product and the sum rounded apart.
template <int kW>
__attribute__((target("avx512f"))) inline void AddScaled(__m512* acc, float g,
                                                         const float* tj) {
  const __m512 gv = _mm512_set1_ps(g);
  for (int v = 0; v < kW; ++v) {
    acc[v] =
        _mm512_add_ps(acc[v], _mm512_mul_ps(gv, _mm512_loadu_ps(tj + v * 16)));
  }
}

// BackwardSample in AVX-512 registers (d = 16 kW), four rows i at a time:
// a row's sum is one chain of dependent adds, so four chains keep the adder
// busy. Each row takes its terms in BackwardSample's order (j ascending,
// j = i left out), lane by lane, so the bits are the same. For j below the
// four rows each row reads its own row of dz's dots; above them the four
// coefficients (j, i0 .. i0 + 3) are consecutive.
template <int kW>
__attribute__((target("avx512f"))) void BackwardSample512(const float* t,
                                                          const float* dz,
                                                          int n, float* dt) {
  constexpr int d = kW * 16;
  const float* ddots = dz + d;
  int i0 = 0;
  for (; i0 + 4 <= n; i0 += 4) {
    __m512 acc[4][kW];
    for (int r = 0; r < 4; ++r) {
      for (int v = 0; v < kW; ++v) {
        acc[r][v] =
            i0 + r == 0 ? _mm512_loadu_ps(dz + v * 16) : _mm512_setzero_ps();
      }
    }
    const float* rows[4];
    for (int r = 0; r < 4; ++r) rows[r] = ddots + PairIndex(i0 + r, 0);
    for (int j = 0; j < i0; ++j) {
      for (int r = 0; r < 4; ++r) AddScaled<kW>(acc[r], rows[r][j], t + j * d);
    }
    for (int j = i0; j < i0 + 4; ++j) {
      for (int r = 0; r < 4; ++r) {
        const int i = i0 + r;
        if (j < i) AddScaled<kW>(acc[r], rows[r][j], t + j * d);
        if (j > i) AddScaled<kW>(acc[r], ddots[PairIndex(j, i)], t + j * d);
      }
    }
    for (int j = i0 + 4; j < n; ++j) {
      const float* g = ddots + PairIndex(j, i0);
      for (int r = 0; r < 4; ++r) AddScaled<kW>(acc[r], g[r], t + j * d);
    }
    for (int r = 0; r < 4; ++r) {
      for (int v = 0; v < kW; ++v) {
        _mm512_storeu_ps(dt + (i0 + r) * d + v * 16, acc[r][v]);
      }
    }
  }
  for (; i0 < n; ++i0) {  // the last rows, one chain each
    __m512 acc[kW];
    for (int v = 0; v < kW; ++v) {
      acc[v] = i0 == 0 ? _mm512_loadu_ps(dz + v * 16) : _mm512_setzero_ps();
    }
    for (int j = 0; j < i0; ++j) {
      AddScaled<kW>(acc, ddots[PairIndex(i0, j)], t + j * d);
    }
    for (int j = i0 + 1; j < n; ++j) {
      AddScaled<kW>(acc, ddots[PairIndex(j, i0)], t + j * d);
    }
    for (int v = 0; v < kW; ++v) _mm512_storeu_ps(dt + i0 * d + v * 16, acc[v]);
  }
}

bool HasAvx512F() {
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") != 0;
  }();
  return has;
}
#endif

template <int kV>
void Backward(const float* t, const float* dz, int64_t batch, int n, int d,
              float* dt) {
  const int64_t t_stride = static_cast<int64_t>(n) * d;
  const int64_t z_stride = DotInteractionDim(n, d);
#if defined(__x86_64__)
  // kV vectors of 8 are kV / 2 of 16. 1.5x faster at the kaggle shape (27
  // vectors of 16, batch 2048: 1.77 against 2.69 CPU ms at one thread).
  if constexpr (kV >= 2) {
    if (HasAvx512F()) {
#pragma omp parallel for schedule(static) if (batch >= kParallelSamples)
      for (int64_t b = 0; b < batch; ++b) {
        BackwardSample512<kV / 2>(t + b * t_stride, dz + b * z_stride, n,
                                  dt + b * t_stride);
      }
      return;
    }
  }
#endif
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

// ------------------------------------------------------- batched GEMMs

// The two batched products of the GEMM path, per sample of a chunk:
// kGram:     Z [n x n] = T [n x d] T^T (both operands the same memory);
// kGradient: dT [n x d] = S [n x n] T [n x d], S = G + G^T.
enum class Product { kGram, kGradient };

// One oneDNN matmul over `rows` samples, built for user scratchpads so
// that several threads may run it at once, each with its own.
struct ChunkMatmul {
  dnnl::matmul primitive;
  dnnl::memory::desc src, weights, dst;
  size_t scratchpad_bytes = 0;
};

ChunkMatmul BuildMatmul(Product product, int64_t rows, int n, int d) {
  using dims = dnnl::memory::dims;
  using dt = dnnl::memory::data_type;
  const int64_t nd = static_cast<int64_t>(n) * d;
  const int64_t nn = static_cast<int64_t>(n) * n;
  ChunkMatmul m;
  if (product == Product::kGram) {
    m.src = dnnl::memory::desc(dims{rows, n, d}, dt::f32, dims{nd, d, 1});
    // T^T: the same floats read with the strides swapped.
    m.weights = dnnl::memory::desc(dims{rows, d, n}, dt::f32, dims{nd, 1, d});
    m.dst = dnnl::memory::desc(dims{rows, n, n}, dt::f32, dims{nn, n, 1});
  } else {
    m.src = dnnl::memory::desc(dims{rows, n, n}, dt::f32, dims{nn, n, 1});
    m.weights = dnnl::memory::desc(dims{rows, n, d}, dt::f32, dims{nd, d, 1});
    m.dst = dnnl::memory::desc(dims{rows, n, d}, dt::f32, dims{nd, d, 1});
  }
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  // Built for one thread (oneDNN fixes a primitive's thread count when it
  // is created, from this thread's OpenMP setting): the callers run it on
  // each thread of their own region, and a small batch outside any region
  // must not fork (measured: 4 us single-threaded, milliseconds when oneDNN
  // forks onto a busy machine).
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  const dnnl::matmul::primitive_desc pd(
      dnnl::matmul::desc(m.src, m.weights, m.dst), attr, CpuEngine());
  m.scratchpad_bytes = pd.scratchpad_desc().get_size();
  m.primitive = dnnl::matmul(pd);
  omp_set_num_threads(threads);
  return m;
}

// The matmul of (product, rows, n, d), built on first use and kept for the
// process (JIT-compiling one costs far more than running it).
// LookUpPieces asks only for powers of two up to kMaxChunk rows, so a shape
// keeps at most 9 per product. The returned reference stays valid:
// std::map nodes do not move.
const ChunkMatmul& GetMatmul(Product product, int64_t rows, int n, int d) {
  static std::mutex* mu = new std::mutex;
  static auto* cache =
      new std::map<std::tuple<Product, int64_t, int, int>, ChunkMatmul>;
  const auto key = std::make_tuple(product, rows, n, d);
  std::lock_guard<std::mutex> lock(*mu);
  auto it = cache->find(key);
  if (it == cache->end()) {
    it = cache->emplace(key, BuildMatmul(product, rows, n, d)).first;
  }
  return it->second;
}

// Runs `m` on borrowed buffers with `scratchpad` (grown as needed) on the
// calling thread alone (BuildMatmul built it for one thread).
void RunMatmul(const ChunkMatmul& m, const float* src, const float* weights,
               float* dst, AlignedVector<char>* scratchpad) {
  if (scratchpad->size() < m.scratchpad_bytes) {
    scratchpad->resize(m.scratchpad_bytes);
  }
  dnnl::engine& engine = CpuEngine();
  dnnl::stream stream(engine);
  // oneDNN takes non-const handles; it only reads src and weights.
  dnnl::memory src_mem(m.src, engine, const_cast<float*>(src));
  dnnl::memory weights_mem(m.weights, engine, const_cast<float*>(weights));
  dnnl::memory dst_mem(m.dst, engine, dst);
  dnnl::memory scratch_mem(
      dnnl::memory::desc({static_cast<int64_t>(scratchpad->size())},
                         dnnl::memory::data_type::u8, {1}),
      engine, scratchpad->data());
  m.primitive.execute(stream, {{DNNL_ARG_SRC, src_mem},
                               {DNNL_ARG_WEIGHTS, weights_mem},
                               {DNNL_ARG_DST, dst_mem},
                               {DNNL_ARG_SCRATCHPAD, scratch_mem}});
  stream.wait();
}

// Samples per chunk: a power of two (so that LookUpPieces' pieces, and the
// primitives kept, are few) with one chunk's T and its n x n products
// within about kChunkBytes (L2-resident on the machines we run on), so the
// GEMM reads what the copy-out or scatter around it just touched; and
// small enough that every thread gets about four chunks.
constexpr int64_t kChunkBytes = 512 << 10;
constexpr int64_t kMaxChunk = 256;
constexpr int64_t kChunksPerThread = 4;

int64_t ChunkRows(int64_t batch, int n, int d) {
  const int64_t per_sample = static_cast<int64_t>(sizeof(float)) * n * (d + n);
  const int64_t share = (batch + kChunksPerThread * omp_get_max_threads() - 1) /
                        (kChunksPerThread * omp_get_max_threads());
  const int64_t rows = std::clamp<int64_t>(
      std::min(kChunkBytes / per_sample, share), 1, kMaxChunk);
  return static_cast<int64_t>(std::bit_floor(static_cast<uint64_t>(rows)));
}

// The primitives one call's chunks use, [k] running 2^k samples, looked up
// before its threads start so that the cache's lock stays out of the
// parallel region.
constexpr int kPieceSizes = std::bit_width(static_cast<uint64_t>(kMaxChunk));
using Pieces = std::array<const ChunkMatmul*, kPieceSizes>;

// Chunks of `chunk` samples (a power of two) over `batch` samples run a
// chunk-sized matmul and, for the tail, one per set bit of its size (a tail
// of 21 samples runs 16 + 4 + 1), so that odd batch sizes (inference
// requests) reuse a few primitives instead of compiling one per size.
Pieces LookUpPieces(Product product, int64_t batch, int64_t chunk, int n,
                    int d) {
  Pieces pieces{};
  const int64_t tail = batch % chunk;
  for (int k = 0; k < kPieceSizes; ++k) {
    const int64_t rows = int64_t{1} << k;
    if ((rows == chunk && batch >= chunk) || (tail & rows) != 0) {
      pieces[k] = &GetMatmul(product, rows, n, d);
    }
  }
  return pieces;
}

// `product` over `rows` samples (a chunk or the tail) with LookUpPieces'
// primitives.
void RunProduct(Product product, const Pieces& pieces, int64_t rows, int n,
                int d, const float* src, const float* weights, float* dst,
                AlignedVector<char>* scratchpad) {
  const int64_t nd = static_cast<int64_t>(n) * d;
  const int64_t nn = static_cast<int64_t>(n) * n;
  const bool gram = product == Product::kGram;
  const int64_t src_step = gram ? nd : nn;
  const int64_t dst_step = gram ? nn : nd;
  while (rows > 0) {
    const int k = std::bit_width(static_cast<uint64_t>(rows)) - 1;
    const int64_t piece = int64_t{1} << k;
    RunMatmul(*pieces[k], src, weights, dst, scratchpad);
    src += piece * src_step;
    weights += piece * nd;
    dst += piece * dst_step;
    rows -= piece;
  }
}

// Calls body(first, rows, scratch, scratchpad) for chunks of `chunk`
// samples covering [0, batch), in parallel, each thread with its own
// scratch floats and oneDNN scratchpad. A oneDNN error aborts, naming
// `what`.
template <typename Body>
void ForEachChunk(const char* what, int64_t batch, int64_t chunk, int n, int d,
                  int64_t scratch_floats_per_sample, Body body) {
  const int64_t chunks = (batch + chunk - 1) / chunk;
#pragma omp parallel if (chunks > 1 && batch >= kParallelSamples)
  {
    AlignedVector<float> scratch;
    AlignedVector<char> scratchpad;
#pragma omp for schedule(static)
    for (int64_t c = 0; c < chunks; ++c) {
      const int64_t first = c * chunk;
      const int64_t rows = std::min(chunk, batch - first);
      const size_t need = static_cast<size_t>(rows * scratch_floats_per_sample);
      if (scratch.size() < need) scratch.resize(need);
      try {
        body(first, rows, scratch.data(), &scratchpad);
      } catch (const dnnl::error& e) {
        std::fprintf(stderr, "%s (n %d, d %d, %lld samples): oneDNN: %s\n",
                     what, n, d, static_cast<long long>(rows), e.what());
        std::abort();
      }
    }
  }
}

void GemmForward(const float* t, int64_t batch, int n, int d, float* z) {
  const int64_t nd = static_cast<int64_t>(n) * d;
  const int64_t nn = static_cast<int64_t>(n) * n;
  const int64_t zdim = DotInteractionDim(n, d);
  const int64_t chunk = ChunkRows(batch, n, d);
  const Pieces pieces = LookUpPieces(Product::kGram, batch, chunk, n, d);
  ForEachChunk("DotInteractionForward(kGemm)", batch, chunk, n, d, nn,
               [&](int64_t first, int64_t rows, float* gram,
                   AlignedVector<char>* scratchpad) {
                 const float* tc = t + first * nd;
                 RunProduct(Product::kGram, pieces, rows, n, d, tc, tc, gram,
                            scratchpad);
                 // Row i of Z holds the pairs (i, 0) .. (i, i - 1)
                 // contiguously, as they sit in z.
                 for (int64_t s = 0; s < rows; ++s) {
                   const float* zs = gram + s * nn;
                   float* out = z + (first + s) * zdim;
                   std::copy(tc + s * nd, tc + s * nd + d, out);
                   float* dots = out + d;
                   for (int i = 1; i < n; ++i) {
                     std::copy(zs + i * n, zs + i * n + i,
                               dots + PairIndex(i, 0));
                   }
                 }
               });
}

void GemmBackward(const float* t, const float* dz, int64_t batch, int n, int d,
                  float* dt) {
  const int64_t nd = static_cast<int64_t>(n) * d;
  const int64_t nn = static_cast<int64_t>(n) * n;
  const int64_t zdim = DotInteractionDim(n, d);
  const int64_t chunk = ChunkRows(batch, n, d);
  const Pieces pieces = LookUpPieces(Product::kGradient, batch, chunk, n, d);
  ForEachChunk("DotInteractionBackward(kGemm)", batch, chunk, n, d, nn,
               [&](int64_t first, int64_t rows, float* sym,
                   AlignedVector<char>* scratchpad) {
                 // S = G + G^T: each pair (i, j < i), read once in dz's order,
                 // goes to row i (contiguous) and to column i of row j.
                 for (int64_t s = 0; s < rows; ++s) {
                   const float* ddots = dz + (first + s) * zdim + d;
                   float* ss = sym + s * nn;
                   for (int i = 0; i < n; ++i) {
                     float* row = ss + i * n;
                     const float* lower = ddots + PairIndex(i, 0);
                     for (int j = 0; j < i; ++j) {
                       row[j] = lower[j];
                       ss[j * n + i] = lower[j];
                     }
                     row[i] = 0.0f;
                   }
                 }
                 RunProduct(Product::kGradient, pieces, rows, n, d, sym,
                            t + first * nd, dt + first * nd, scratchpad);
                 // The dense vector passes its gradient straight through.
                 for (int64_t s = 0; s < rows; ++s) {
                   const float* g = dz + (first + s) * zdim;
                   float* out = dt + (first + s) * nd;
                   for (int k = 0; k < d; ++k) out[k] += g[k];
                 }
               });
}

void LoopsForward(const float* t, int64_t batch, int n, int d, float* z) {
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

void LoopsBackward(const float* t, const float* dz, int64_t batch, int n, int d,
                   float* dt) {
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

// The interactions without parameters are the cases below; one with
// parameters is its InteractionLayer.
void InteractionForward(const InteractionShape& s, const float* t,
                        int64_t batch, float* z, InteractionLayer* layer) {
  if (layer != nullptr) return layer->Forward(t, batch, z);
  switch (s.kind) {
    case INTERACTION_DOT:
      return DotInteractionForward(t, batch, s.num_vectors, s.dim, z);
    case INTERACTION_CAT:  // the identity: not called
    default:               // refused by ValidateModelConfig
      return;
  }
}

void InteractionBackward(const InteractionShape& s, const float* t,
                         const float* dz, int64_t batch, float* dt,
                         InteractionLayer* layer) {
  if (layer != nullptr) return layer->Backward(t, dz, batch, dt);
  switch (s.kind) {
    case INTERACTION_DOT:
      return DotInteractionBackward(t, dz, batch, s.num_vectors, s.dim, dt);
    case INTERACTION_CAT:  // the identity: not called
    default:               // refused by ValidateModelConfig
      return;
  }
}

void InteractionInfer(const InteractionShape& s, const float* t, int64_t batch,
                      float* z, const InteractionLayer* layer,
                      AlignedVector<float>* scratch) {
  if (layer != nullptr) return layer->Infer(t, batch, z, scratch);
  switch (s.kind) {
    case INTERACTION_DOT:  // keeps nothing either way
      return DotInteractionForward(t, batch, s.num_vectors, s.dim, z);
    case INTERACTION_CAT:  // the identity: not called
    default:               // refused by ValidateModelConfig
      return;
  }
}

// Measured on n = 27 (d 4..128) and n = 3, 9 (d 4, 16, 128), batches of
// 8..32768, one and two threads. Forward: the GEMMs 1.2-2x faster from d =
// 8 at n = 27 and n = 9, slower at d = 4 for n <= 9 and everywhere at n =
// 3. Backward: 2x faster where the loops have no register-resident kernel
// (d = 24, 48, 128), 1.1-1.3x at d = 32 and 64, equal or slower at d = 8 and
// 16 (building G + G^T costs as much as the product there) and at n <= 9.
// Small batches: at d = 16 the loops win below 32 samples, at d = 128 the
// GEMMs win from 8.
constexpr int64_t kGemmMinBatchFloats = 512;
constexpr int kGemmForwardMinVectors = 8;
constexpr int kGemmForwardMinDim = 8;
constexpr int kGemmBackwardMinVectors = 16;
constexpr int kGemmBackwardMinDim = 24;

DotImpl ChooseDotImpl(DotPass pass, int64_t batch, int n, int d) {
  const bool shape =
      pass == DotPass::kForward
          ? n >= kGemmForwardMinVectors && d >= kGemmForwardMinDim
          : n >= kGemmBackwardMinVectors && d >= kGemmBackwardMinDim;
  return shape && batch * d >= kGemmMinBatchFloats ? DotImpl::kGemm
                                                   : DotImpl::kLoops;
}

void DotInteractionForward(const float* t, int64_t batch, int n, int d,
                           float* z) {
  DotInteractionForward(ChooseDotImpl(DotPass::kForward, batch, n, d), t, batch,
                        n, d, z);
}

void DotInteractionBackward(const float* t, const float* dz, int64_t batch,
                            int n, int d, float* dt) {
  DotInteractionBackward(ChooseDotImpl(DotPass::kBackward, batch, n, d), t, dz,
                         batch, n, d, dt);
}

void DotInteractionForward(DotImpl impl, const float* t, int64_t batch, int n,
                           int d, float* z) {
  if (batch <= 0) return;
  if (impl == DotImpl::kGemm) return GemmForward(t, batch, n, d, z);
  LoopsForward(t, batch, n, d, z);
}

void DotInteractionBackward(DotImpl impl, const float* t, const float* dz,
                            int64_t batch, int n, int d, float* dt) {
  if (batch <= 0) return;
  if (impl == DotImpl::kGemm) return GemmBackward(t, dz, batch, n, d, dt);
  LoopsBackward(t, dz, batch, n, d, dt);
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
