// The pooled lookup's versions: bags pooled column tile by column tile with
// the tile's sums in registers, rows prefetched a few ids ahead; fp32 rows
// and 16-bit ones (IEEE half, bfloat16) widened to floats as they load. The
// sparse update's gradient sums (SumRows) the same way, over gradient rows.
#include "embedding/embedding_kernels.h"

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "embedding/row_precision.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define DLRM_HAVE_AVX512_KERNELS 1
#else
#define DLRM_HAVE_AVX512_KERNELS 0
#endif

namespace dlrm::embedding::kernels {
namespace {

// How many ids ahead the kernels prefetch rows: random rows of big tables
// miss cache, and a long multi-hot bag is a chain of dependent adds.
// (Measured on DCNv2's shapes: 8 beat 4 and 16, into L1 beat into L2.)
constexpr int64_t kPrefetchDistance = 8;

// Prefetches the cache lines of row[0, cols) (elements of type T).
template <typename T>
inline void PrefetchSpan(const T* row, int cols) {
  constexpr int kPerLine = 64 / sizeof(T);
  for (int c = 0; c < cols; c += kPerLine) __builtin_prefetch(row + c, 0, 3);
  // A span not aligned to a cache line may spill into one more line.
  if (cols % kPerLine != 0) __builtin_prefetch(row + cols - 1, 0, 3);
}

// Eight floats in one AVX register (two SSE/NEON registers elsewhere); GCC
// and Clang vector extensions keep the accumulators out of memory, which
// autovectorisation of a `float acc[N]` does not guarantee.
typedef float Vec8 __attribute__((vector_size(32)));

inline Vec8 LoadU(const float* p) {
  Vec8 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
inline void StoreU(float* p, Vec8 v) { std::memcpy(p, &v, sizeof(v)); }

// How the kernels read a weight array's elements as floats: Load1 one,
// Load8 eight (exact conversions, so every element type pools the bits of
// the reference on the converted rows).
struct F32Words {
  using T = float;
  static float Load1(const float* p) { return *p; }
  static Vec8 Load8(const float* p) { return LoadU(p); }
};
struct F16Words {
  using T = uint16_t;
  static float Load1(const uint16_t* p) { return HalfToFloat(*p); }
  static Vec8 Load8(const uint16_t* p) {
#if defined(__F16C__)
    const __m256 v =
        _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    Vec8 r;
    std::memcpy(&r, &v, sizeof(r));
    return r;
#else
    Vec8 r;
    for (int i = 0; i < 8; ++i) r[i] = HalfToFloat(p[i]);
    return r;
#endif
  }
};
struct Bf16Words {
  using T = uint16_t;
  static float Load1(const uint16_t* p) { return Bf16ToFloat(*p); }
  static Vec8 Load8(const uint16_t* p) {
#if defined(__AVX2__)
    const __m256i v = _mm256_slli_epi32(
        _mm256_cvtepu16_epi32(
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(p))),
        16);
    Vec8 r;
    std::memcpy(&r, &v, sizeof(r));
    return r;
#else
    Vec8 r;
    for (int i = 0; i < 8; ++i) r[i] = Bf16ToFloat(p[i]);
    return r;
#endif
  }
};

// Columns [col0, col0 + 8 * kVecs + rem) of bags [bag_begin, bag_end), rem
// < 8: kVecs vector sums and rem scalar ones, each from 0 in id order.
template <typename Words, int kVecs>
void PoolTilePortable(const typename Words::T* __restrict weights, int64_t dim,
                      int col0, int rem, const int64_t* __restrict offsets,
                      const int64_t* __restrict ids, int64_t bag_begin,
                      int64_t bag_end, int64_t total, bool mean,
                      float* __restrict out, int64_t out_stride) {
  const int cols = 8 * kVecs + rem;
  for (int64_t s = bag_begin; s < bag_end; ++s) {
    const int64_t begin = offsets[s], end = offsets[s + 1];
    Vec8 acc[kVecs > 0 ? kVecs : 1];
    float tail[8];
    for (int v = 0; v < kVecs; ++v) acc[v] = Vec8{};
    for (int t = 0; t < rem; ++t) tail[t] = 0.0f;
    for (int64_t p = begin; p < end; ++p) {
      if (p + kPrefetchDistance < total) {
        PrefetchSpan(weights + ids[p + kPrefetchDistance] * dim + col0, cols);
      }
      const typename Words::T* row = weights + ids[p] * dim + col0;
      for (int v = 0; v < kVecs; ++v) acc[v] += Words::Load8(row + 8 * v);
      for (int t = 0; t < rem; ++t)
        tail[t] += Words::Load1(row + 8 * kVecs + t);
    }
    float* o = out + s * out_stride + col0;
    if (mean && end > begin) {
      const float scale = 1.0f / static_cast<float>(end - begin);
      for (int v = 0; v < kVecs; ++v) StoreU(o + 8 * v, acc[v] * scale);
      for (int t = 0; t < rem; ++t) o[8 * kVecs + t] = tail[t] * scale;
    } else {
      for (int v = 0; v < kVecs; ++v) StoreU(o + 8 * v, acc[v]);
      for (int t = 0; t < rem; ++t) o[8 * kVecs + t] = tail[t];
    }
  }
}

// Whole rows of a narrow table (dim = 8 * kVecs, known at compile time):
// the row stride is a constant and a one-id bag costs a few instructions,
// which the tiles' run-time dim and column offset do not (measured on
// kaggle's dim 16, one id per bag: half the lookup time of either tile
// kernel). Sums from 0 in id order, as the tiles.
template <typename Words, int kVecs>
void PoolFixedDim(const typename Words::T* __restrict weights,
                  const int64_t* __restrict offsets,
                  const int64_t* __restrict ids, int64_t bag_begin,
                  int64_t bag_end, int64_t total, bool mean,
                  float* __restrict out, int64_t out_stride) {
  constexpr int kDim = 8 * kVecs;
  for (int64_t s = bag_begin; s < bag_end; ++s) {
    const int64_t begin = offsets[s], end = offsets[s + 1];
    Vec8 acc[kVecs];
    for (int v = 0; v < kVecs; ++v) acc[v] = Vec8{};
    for (int64_t p = begin; p < end; ++p) {
      if (p + kPrefetchDistance < total) {
        PrefetchSpan(weights + ids[p + kPrefetchDistance] * kDim, kDim);
      }
      const typename Words::T* row = weights + ids[p] * kDim;
      for (int v = 0; v < kVecs; ++v) acc[v] += Words::Load8(row + 8 * v);
    }
    float* o = out + s * out_stride;
    if (mean && end > begin) {
      const float scale = 1.0f / static_cast<float>(end - begin);
      for (int v = 0; v < kVecs; ++v) StoreU(o + 8 * v, acc[v] * scale);
    } else {
      for (int v = 0; v < kVecs; ++v) StoreU(o + 8 * v, acc[v]);
    }
  }
}

// PoolFixedDim for dims 8, 16, 24 and 32; false for any other dim.
template <typename Words>
bool PoolNarrow(const typename Words::T* weights, int dim, bool mean,
                const int64_t* offsets, const int64_t* ids, int64_t bag_begin,
                int64_t bag_end, int64_t total, float* out,
                int64_t out_stride) {
  switch (dim) {
#define DLRM_POOL_FIXED(k)                                                   \
  case 8 * k:                                                                \
    PoolFixedDim<Words, k>(weights, offsets, ids, bag_begin, bag_end, total, \
                           mean, out, out_stride);                           \
    return true;
    DLRM_POOL_FIXED(1)
    DLRM_POOL_FIXED(2)
    DLRM_POOL_FIXED(3)
    DLRM_POOL_FIXED(4)
#undef DLRM_POOL_FIXED
    default:
      return false;
  }
}

// Up to 64 columns per tile: eight 8-float accumulators.
template <typename Words>
void PoolPortable(const typename Words::T* weights, int dim, bool mean,
                  const int64_t* offsets, const int64_t* ids, int64_t bag_begin,
                  int64_t bag_end, int64_t total, float* out,
                  int64_t out_stride) {
  for (int col0 = 0; col0 < dim; col0 += 64) {
    const int cols = std::min(64, dim - col0);
    const int rem = cols % 8;
    switch (cols / 8) {
#define DLRM_POOL_TILE(k)                                             \
  case k:                                                             \
    PoolTilePortable<Words, k>(weights, dim, col0, rem, offsets, ids, \
                               bag_begin, bag_end, total, mean, out,  \
                               out_stride);                           \
    break;
      DLRM_POOL_TILE(0)
      DLRM_POOL_TILE(1)
      DLRM_POOL_TILE(2)
      DLRM_POOL_TILE(3)
      DLRM_POOL_TILE(4)
      DLRM_POOL_TILE(5)
      DLRM_POOL_TILE(6)
      DLRM_POOL_TILE(7)
      DLRM_POOL_TILE(8)
#undef DLRM_POOL_TILE
    }
  }
}

// SumRows' columns [col0, col0 + 8 * kVecs + rem), rem < 8: kVecs vector
// sums and rem scalar ones, each from 0 in order.
template <int kVecs>
void SumTilePortable(const float* __restrict rows, int64_t row_stride, int col0,
                     int rem, const int64_t* __restrict order, int64_t begin,
                     int64_t end, int64_t prefetch_end, float* __restrict out) {
  const int cols = 8 * kVecs + rem;
  Vec8 acc[kVecs > 0 ? kVecs : 1];
  float tail[8];
  for (int v = 0; v < kVecs; ++v) acc[v] = Vec8{};
  for (int t = 0; t < rem; ++t) tail[t] = 0.0f;
  for (int64_t e = begin; e < end; ++e) {
    if (e + kPrefetchDistance < prefetch_end) {
      PrefetchSpan(rows + order[e + kPrefetchDistance] * row_stride + col0,
                   cols);
    }
    const float* row = rows + order[e] * row_stride + col0;
    for (int v = 0; v < kVecs; ++v) acc[v] += LoadU(row + 8 * v);
    for (int t = 0; t < rem; ++t) tail[t] += row[8 * kVecs + t];
  }
  for (int v = 0; v < kVecs; ++v) StoreU(out + col0 + 8 * v, acc[v]);
  for (int t = 0; t < rem; ++t) out[col0 + 8 * kVecs + t] = tail[t];
}

// SumRows in tiles of up to 64 columns (eight 8-float sums).
void SumRowsPortable(const float* rows, int64_t row_stride, int dim,
                     const int64_t* order, int64_t begin, int64_t end,
                     int64_t prefetch_end, float* out) {
  for (int col0 = 0; col0 < dim; col0 += 64) {
    const int cols = std::min(64, dim - col0);
    const int rem = cols % 8;
    switch (cols / 8) {
#define DLRM_SUM_TILE(k)                                               \
  case k:                                                              \
    SumTilePortable<k>(rows, row_stride, col0, rem, order, begin, end, \
                       prefetch_end, out);                             \
    break;
      DLRM_SUM_TILE(0)
      DLRM_SUM_TILE(1)
      DLRM_SUM_TILE(2)
      DLRM_SUM_TILE(3)
      DLRM_SUM_TILE(4)
      DLRM_SUM_TILE(5)
      DLRM_SUM_TILE(6)
      DLRM_SUM_TILE(7)
      DLRM_SUM_TILE(8)
#undef DLRM_SUM_TILE
    }
  }
}

#if DLRM_HAVE_AVX512_KERNELS

// SumRows' columns [col0, col0 + 16 * (kVecs - 1) + popcount(last)): kVecs
// 16-float sums from 0 in order, the last one's lanes masked by `last`.
template <int kVecs>
__attribute__((target("avx512f"))) void SumTileAvx512(
    const float* __restrict rows, int64_t row_stride, int col0, int cols,
    __mmask16 last, const int64_t* __restrict order, int64_t begin, int64_t end,
    int64_t prefetch_end, float* __restrict out) {
  __m512 acc[kVecs];
  for (int v = 0; v < kVecs; ++v) acc[v] = _mm512_setzero_ps();
  for (int64_t e = begin; e < end; ++e) {
    if (e + kPrefetchDistance < prefetch_end) {
      PrefetchSpan(rows + order[e + kPrefetchDistance] * row_stride + col0,
                   cols);
    }
    const float* row = rows + order[e] * row_stride + col0;
    for (int v = 0; v + 1 < kVecs; ++v) {
      acc[v] = _mm512_add_ps(acc[v], _mm512_loadu_ps(row + 16 * v));
    }
    acc[kVecs - 1] = _mm512_add_ps(
        acc[kVecs - 1], _mm512_maskz_loadu_ps(last, row + 16 * (kVecs - 1)));
  }
  float* o = out + col0;
  for (int v = 0; v + 1 < kVecs; ++v) _mm512_storeu_ps(o + 16 * v, acc[v]);
  _mm512_mask_storeu_ps(o + 16 * (kVecs - 1), last, acc[kVecs - 1]);
}

// Columns [col0, col0 + 16 * (kVecs - 1) + popcount(last)) of bags
// [bag_begin, bag_end): kVecs 16-float sums from 0 in id order, the last
// one's lanes masked by `last` (masked loads read nothing past the row).
template <int kVecs>
__attribute__((target("avx512f"))) void PoolTileAvx512(
    const float* __restrict weights, int64_t dim, int col0, int cols,
    __mmask16 last, const int64_t* __restrict offsets,
    const int64_t* __restrict ids, int64_t bag_begin, int64_t bag_end,
    int64_t total, bool mean, float* __restrict out, int64_t out_stride) {
  for (int64_t s = bag_begin; s < bag_end; ++s) {
    const int64_t begin = offsets[s], end = offsets[s + 1];
    __m512 acc[kVecs];
    for (int v = 0; v < kVecs; ++v) acc[v] = _mm512_setzero_ps();
    for (int64_t p = begin; p < end; ++p) {
      if (p + kPrefetchDistance < total) {
        PrefetchSpan(weights + ids[p + kPrefetchDistance] * dim + col0, cols);
      }
      const float* row = weights + ids[p] * dim + col0;
      for (int v = 0; v + 1 < kVecs; ++v) {
        acc[v] = _mm512_add_ps(acc[v], _mm512_loadu_ps(row + 16 * v));
      }
      acc[kVecs - 1] = _mm512_add_ps(
          acc[kVecs - 1], _mm512_maskz_loadu_ps(last, row + 16 * (kVecs - 1)));
    }
    float* o = out + s * out_stride + col0;
    if (mean && end > begin) {
      const __m512 scale =
          _mm512_set1_ps(1.0f / static_cast<float>(end - begin));
      for (int v = 0; v < kVecs; ++v) acc[v] = _mm512_mul_ps(acc[v], scale);
    }
    for (int v = 0; v + 1 < kVecs; ++v) _mm512_storeu_ps(o + 16 * v, acc[v]);
    _mm512_mask_storeu_ps(o + 16 * (kVecs - 1), last, acc[kVecs - 1]);
  }
}

// Calls tile(std::integral_constant<int, kVecs>, col0, cols, last) for
// each tile of up to 128 columns of a `dim`-wide row: kVecs (1-8) 16-lane
// vectors, the last one's lanes masked by `last`.
template <typename Tile>
void ForEachTile(int dim, Tile tile) {
  for (int col0 = 0; col0 < dim; col0 += 128) {
    const int cols = std::min(128, dim - col0);
    const __mmask16 last =
        cols % 16 == 0 ? __mmask16{0xffff}
                       : static_cast<__mmask16>((1u << (cols % 16)) - 1);
    switch ((cols + 15) / 16) {
#define DLRM_POOL_TILE(k)                                     \
  case k:                                                     \
    tile(std::integral_constant<int, k>{}, col0, cols, last); \
    break;
      DLRM_POOL_TILE(1)
      DLRM_POOL_TILE(2)
      DLRM_POOL_TILE(3)
      DLRM_POOL_TILE(4)
      DLRM_POOL_TILE(5)
      DLRM_POOL_TILE(6)
      DLRM_POOL_TILE(7)
      DLRM_POOL_TILE(8)
#undef DLRM_POOL_TILE
    }
  }
}

// Up to 128 columns per tile: eight 16-float accumulators.
void PoolAvx512(const float* weights, int dim, bool mean,
                const int64_t* offsets, const int64_t* ids, int64_t bag_begin,
                int64_t bag_end, int64_t total, float* out,
                int64_t out_stride) {
  ForEachTile(dim, [&](auto vecs, int col0, int cols, __mmask16 last) {
    PoolTileAvx512<decltype(vecs)::value>(weights, dim, col0, cols, last,
                                          offsets, ids, bag_begin, bag_end,
                                          total, mean, out, out_stride);
  });
}

// PoolTileAvx512 over 16-bit words (IEEE half when !kBf16): 16 words a
// load (masked by `last` in the row's last vector, AVX-512BW), widened to
// floats exactly (vcvtph2ps; a 16-bit shift for bfloat16), then the same
// additions in the same order.
// 16 words widened to floats: IEEE half (vcvtph2ps) or bfloat16 (a shift).
template <bool kBf16>
__attribute__((target("avx512f,avx512bw,avx512vl"),
               always_inline)) inline __m512
Widen16(__m256i words) {
  if constexpr (kBf16) {
    return _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(words), 16));
  } else {
    return _mm512_cvtph_ps(words);
  }
}

template <bool kBf16, int kVecs>
__attribute__((target("avx512f,avx512bw,avx512vl"))) void PoolTile16Avx512(
    const uint16_t* __restrict weights, int64_t dim, int col0, int cols,
    __mmask16 last, const int64_t* __restrict offsets,
    const int64_t* __restrict ids, int64_t bag_begin, int64_t bag_end,
    int64_t total, bool mean, float* __restrict out, int64_t out_stride) {
  for (int64_t s = bag_begin; s < bag_end; ++s) {
    const int64_t begin = offsets[s], end = offsets[s + 1];
    __m512 acc[kVecs];
    for (int v = 0; v < kVecs; ++v) acc[v] = _mm512_setzero_ps();
    for (int64_t p = begin; p < end; ++p) {
      if (p + kPrefetchDistance < total) {
        PrefetchSpan(weights + ids[p + kPrefetchDistance] * dim + col0, cols);
      }
      const uint16_t* row = weights + ids[p] * dim + col0;
      for (int v = 0; v + 1 < kVecs; ++v) {
        acc[v] = _mm512_add_ps(
            acc[v], Widen16<kBf16>(_mm256_loadu_si256(
                        reinterpret_cast<const __m256i*>(row + 16 * v))));
      }
      acc[kVecs - 1] =
          _mm512_add_ps(acc[kVecs - 1], Widen16<kBf16>(_mm256_maskz_loadu_epi16(
                                            last, row + 16 * (kVecs - 1))));
    }
    float* o = out + s * out_stride + col0;
    if (mean && end > begin) {
      const __m512 scale =
          _mm512_set1_ps(1.0f / static_cast<float>(end - begin));
      for (int v = 0; v < kVecs; ++v) acc[v] = _mm512_mul_ps(acc[v], scale);
    }
    for (int v = 0; v + 1 < kVecs; ++v) _mm512_storeu_ps(o + 16 * v, acc[v]);
    _mm512_mask_storeu_ps(o + 16 * (kVecs - 1), last, acc[kVecs - 1]);
  }
}

// PoolAvx512 over 16-bit words.
template <bool kBf16>
void Pool16Avx512(const uint16_t* weights, int dim, bool mean,
                  const int64_t* offsets, const int64_t* ids, int64_t bag_begin,
                  int64_t bag_end, int64_t total, float* out,
                  int64_t out_stride) {
  ForEachTile(dim, [&](auto vecs, int col0, int cols, __mmask16 last) {
    PoolTile16Avx512<kBf16, decltype(vecs)::value>(
        weights, dim, col0, cols, last, offsets, ids, bag_begin, bag_end, total,
        mean, out, out_stride);
  });
}

// SumRows in tiles of up to 128 columns (ForEachTile).
void SumRowsAvx512(const float* rows, int64_t row_stride, int dim,
                   const int64_t* order, int64_t begin, int64_t end,
                   int64_t prefetch_end, float* out) {
  ForEachTile(dim, [&](auto vecs, int col0, int cols, __mmask16 last) {
    SumTileAvx512<decltype(vecs)::value>(rows, row_stride, col0, cols, last,
                                         order, begin, end, prefetch_end, out);
  });
}

#endif  // DLRM_HAVE_AVX512_KERNELS

// PoolBags16 for one word type: the narrow fixed-dim loop, else the
// AVX-512 tiles where `avx512`, else the portable tiles.
template <typename Words, bool kBf16>
void Pool16(bool avx512, const uint16_t* weights, int dim, bool mean,
            const int64_t* offsets, const int64_t* ids, int64_t bag_begin,
            int64_t bag_end, int64_t total, float* out, int64_t out_stride) {
  if (PoolNarrow<Words>(weights, dim, mean, offsets, ids, bag_begin, bag_end,
                        total, out, out_stride)) {
    return;
  }
#if DLRM_HAVE_AVX512_KERNELS
  if (avx512) {
    Pool16Avx512<kBf16>(weights, dim, mean, offsets, ids, bag_begin, bag_end,
                        total, out, out_stride);
    return;
  }
#endif
  PoolPortable<Words>(weights, dim, mean, offsets, ids, bag_begin, bag_end,
                      total, out, out_stride);
}

}  // namespace

bool Supported(Isa isa) {
  switch (isa) {
    case Isa::kPortable:
      return true;
    case Isa::kAvx512:
#if DLRM_HAVE_AVX512_KERNELS
      // GCC's check includes the OS's (XCR0) saving of the zmm registers.
      return __builtin_cpu_supports("avx512f");
#else
      return false;
#endif
  }
  return false;
}

Isa BestIsa() {
  static const Isa best =
      Supported(Isa::kAvx512) ? Isa::kAvx512 : Isa::kPortable;
  return best;
}

void PoolBags(Isa isa, const float* weights, int dim, bool mean,
              const int64_t* offsets, const int64_t* ids, int64_t bag_begin,
              int64_t bag_end, int64_t total, float* out, int64_t out_stride) {
  // Narrow tables take the fixed-dim loop on every ISA (8-float vectors
  // beat the 16-lane masked tile there too).
  if (PoolNarrow<F32Words>(weights, dim, mean, offsets, ids, bag_begin, bag_end,
                           total, out, out_stride)) {
    return;
  }
#if DLRM_HAVE_AVX512_KERNELS
  if (isa == Isa::kAvx512) {
    PoolAvx512(weights, dim, mean, offsets, ids, bag_begin, bag_end, total, out,
               out_stride);
    return;
  }
#endif
  PoolPortable<F32Words>(weights, dim, mean, offsets, ids, bag_begin, bag_end,
                         total, out, out_stride);
}

void SumRows(Isa isa, const float* rows, int64_t row_stride, int dim,
             const int64_t* order, int64_t begin, int64_t end,
             int64_t prefetch_end, float* out) {
  // Narrow rows (kaggle's dim 16) in one tile of 8-float sums on every ISA,
  // as the lookup's narrow rows.
#if DLRM_HAVE_AVX512_KERNELS
  if (isa == Isa::kAvx512 && dim > 32) {
    SumRowsAvx512(rows, row_stride, dim, order, begin, end, prefetch_end, out);
    return;
  }
#endif
  SumRowsPortable(rows, row_stride, dim, order, begin, end, prefetch_end, out);
}

bool Supported16(Isa isa) {
  if (isa != Isa::kAvx512) return Supported(isa);
#if DLRM_HAVE_AVX512_KERNELS
  return Supported(isa) && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl");
#else
  return false;
#endif
}

Isa BestIsa16() {
  static const Isa best =
      Supported16(Isa::kAvx512) ? Isa::kAvx512 : Isa::kPortable;
  return best;
}

void PoolBags16(Isa isa, RowPrecision precision, const uint16_t* weights,
                int dim, bool mean, const int64_t* offsets, const int64_t* ids,
                int64_t bag_begin, int64_t bag_end, int64_t total, float* out,
                int64_t out_stride) {
  const bool avx512 = isa == Isa::kAvx512;
  if (precision == ROW_BF16) {
    Pool16<Bf16Words, true>(avx512, weights, dim, mean, offsets, ids, bag_begin,
                            bag_end, total, out, out_stride);
  } else {
    Pool16<F16Words, false>(avx512, weights, dim, mean, offsets, ids, bag_begin,
                            bag_end, total, out, out_stride);
  }
}

}  // namespace dlrm::embedding::kernels
