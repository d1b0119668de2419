// The pooled lookup's versions: bags pooled column tile by column tile with
// the tile's sums in registers, rows prefetched a few ids ahead; fp32 rows
// and 16-bit ones (IEEE half, bfloat16) widened to floats as they load. The
// sparse update's gradient sums (SumRows) the same way, over gradient rows.
#include "embedding/embedding_kernels.h"

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <utility>

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

// The 32 bytes of a vector register of eight floats (an __m256, say) as a
// Vec8.
template <typename V>
inline Vec8 AsVec8(const V& v) {
  static_assert(sizeof(V) == sizeof(Vec8));
  Vec8 r;
  std::memcpy(&r, &v, sizeof(r));
  return r;
}

// Eight 16-bit words widened one at a time by `to_float` (builds without
// the vector conversion).
inline Vec8 Widen8(const uint16_t* p, float (*to_float)(uint16_t)) {
  Vec8 r;
  for (int i = 0; i < 8; ++i) r[i] = to_float(p[i]);
  return r;
}

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
    return AsVec8(
        _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
#else
    return Widen8(p, HalfToFloat);
#endif
  }
};
struct Bf16Words {
  using T = uint16_t;
  static float Load1(const uint16_t* p) { return Bf16ToFloat(*p); }
  static Vec8 Load8(const uint16_t* p) {
#if defined(__AVX2__)
    return AsVec8(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(
                                        reinterpret_cast<const __m128i*>(p))),
                                    16));
#else
    return Widen8(p, Bf16ToFloat);
#endif
  }
};

// Zeroes a portable tile's sums: kVecs vectors and rem (< 8) scalars.
template <int kVecs>
inline void ZeroTile(Vec8* acc, float* tail, int rem) {
  for (int v = 0; v < kVecs; ++v) acc[v] = Vec8{};
  for (int t = 0; t < rem; ++t) tail[t] = 0.0f;
}

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
    ZeroTile<kVecs>(acc, tail, rem);
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

// Calls fn(std::integral_constant<int, k>{}) for the k in [kMin, kMax]
// equal to n (for none when n is outside): a tile's run-time vector count
// as the compile-time one its kernel is instantiated for.
template <int kMin, int kMax, typename Fn>
void WithVecs(int n, Fn fn) {
  [&]<int... k>(std::integer_sequence<int, k...>) {
    (void)((n == kMin + k &&
            (fn(std::integral_constant<int, kMin + k>{}), true)) ||
           ...);
  }
  (std::make_integer_sequence<int, kMax - kMin + 1>{});
}

// PoolFixedDim for dims 8, 16, 24 and 32; false for any other dim.
template <typename Words>
bool PoolNarrow(const typename Words::T* weights, int dim, bool mean,
                const int64_t* offsets, const int64_t* ids, int64_t bag_begin,
                int64_t bag_end, int64_t total, float* out,
                int64_t out_stride) {
  if (dim < 8 || dim > 32 || dim % 8 != 0) return false;
  WithVecs<1, 4>(dim / 8, [&](auto vecs) {
    PoolFixedDim<Words, vecs.value>(weights, offsets, ids, bag_begin, bag_end,
                                    total, mean, out, out_stride);
  });
  return true;
}

// Calls tile(std::integral_constant<int, kVecs>, col0, rem) for each tile
// of up to 64 columns of a `dim`-wide row: kVecs (0-8) 8-float vectors,
// then rem (< 8) scalar columns.
template <typename Tile>
void ForEachPortableTile(int dim, Tile tile) {
  for (int col0 = 0; col0 < dim; col0 += 64) {
    const int cols = std::min(64, dim - col0);
    WithVecs<0, 8>(cols / 8, [&](auto vecs) { tile(vecs, col0, cols % 8); });
  }
}

// Up to 64 columns per tile: eight 8-float accumulators.
template <typename Words>
void PoolPortable(const typename Words::T* weights, int dim, bool mean,
                  const int64_t* offsets, const int64_t* ids, int64_t bag_begin,
                  int64_t bag_end, int64_t total, float* out,
                  int64_t out_stride) {
  ForEachPortableTile(dim, [&](auto vecs, int col0, int rem) {
    PoolTilePortable<Words, vecs.value>(weights, dim, col0, rem, offsets, ids,
                                        bag_begin, bag_end, total, mean, out,
                                        out_stride);
  });
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
  ZeroTile<kVecs>(acc, tail, rem);
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
  ForEachPortableTile(dim, [&](auto vecs, int col0, int rem) {
    SumTilePortable<vecs.value>(rows, row_stride, col0, rem, order, begin, end,
                                prefetch_end, out);
  });
}

#if DLRM_HAVE_AVX512_KERNELS

// The AVX-512 kernels' instruction sets: AVX-512F, with BW and VL for the
// masked 16-bit loads (Supported(Isa::kAvx512) checks all three).
#define DLRM_AVX512_TARGET __attribute__((target("avx512f,avx512bw,avx512vl")))

// How the AVX-512 kernels read 16 elements of a row as floats: Load all
// 16, LoadMasked the lanes of `last` (reading nothing past them). fp32 as
// they are; 16-bit words (IEEE half when !kBf16) widened exactly
// (vcvtph2ps; a 16-bit shift for bfloat16).
struct F32Lanes {
  using T = float;
  DLRM_AVX512_TARGET __attribute__((always_inline)) static __m512 Load(
      const float* p) {
    return _mm512_loadu_ps(p);
  }
  DLRM_AVX512_TARGET __attribute__((always_inline)) static __m512 LoadMasked(
      __mmask16 last, const float* p) {
    return _mm512_maskz_loadu_ps(last, p);
  }
};
template <bool kBf16>
struct Words16Lanes {
  using T = uint16_t;
  DLRM_AVX512_TARGET __attribute__((always_inline)) static __m512 Widen(
      __m256i words) {
    if constexpr (kBf16) {
      return _mm512_castsi512_ps(
          _mm512_slli_epi32(_mm512_cvtepu16_epi32(words), 16));
    } else {
      return _mm512_cvtph_ps(words);
    }
  }
  DLRM_AVX512_TARGET __attribute__((always_inline)) static __m512 Load(
      const uint16_t* p) {
    return Widen(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  DLRM_AVX512_TARGET __attribute__((always_inline)) static __m512 LoadMasked(
      __mmask16 last, const uint16_t* p) {
    return Widen(_mm256_maskz_loadu_epi16(last, p));
  }
};

// acc[v] += the row's 16-lane vector v for v < kVecs, the last one's lanes
// masked by `last`.
template <typename Lanes, int kVecs>
DLRM_AVX512_TARGET __attribute__((always_inline)) inline void AddRow(
    __m512* acc, const typename Lanes::T* row, __mmask16 last) {
  for (int v = 0; v + 1 < kVecs; ++v) {
    acc[v] = _mm512_add_ps(acc[v], Lanes::Load(row + 16 * v));
  }
  acc[kVecs - 1] = _mm512_add_ps(
      acc[kVecs - 1], Lanes::LoadMasked(last, row + 16 * (kVecs - 1)));
}

// Stores acc[0, kVecs) at out, the last one's lanes masked by `last`.
template <int kVecs>
DLRM_AVX512_TARGET __attribute__((always_inline)) inline void StoreTile(
    const __m512* acc, float* out, __mmask16 last) {
  for (int v = 0; v + 1 < kVecs; ++v) _mm512_storeu_ps(out + 16 * v, acc[v]);
  _mm512_mask_storeu_ps(out + 16 * (kVecs - 1), last, acc[kVecs - 1]);
}

// SumRows' columns [col0, col0 + 16 * (kVecs - 1) + popcount(last)): kVecs
// 16-float sums from 0 in order, the last one's lanes masked by `last`.
template <int kVecs>
DLRM_AVX512_TARGET void SumTileAvx512(
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
    AddRow<F32Lanes, kVecs>(acc, rows + order[e] * row_stride + col0, last);
  }
  StoreTile<kVecs>(acc, out + col0, last);
}

// Columns [col0, col0 + 16 * (kVecs - 1) + popcount(last)) of bags
// [bag_begin, bag_end) of a weight array of Lanes::T: kVecs 16-float sums
// from 0 in id order, the last one's lanes masked by `last`.
template <typename Lanes, int kVecs>
DLRM_AVX512_TARGET void PoolTileAvx512(
    const typename Lanes::T* __restrict weights, int64_t dim, int col0,
    int cols, __mmask16 last, const int64_t* __restrict offsets,
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
      AddRow<Lanes, kVecs>(acc, weights + ids[p] * dim + col0, last);
    }
    if (mean && end > begin) {
      const __m512 scale =
          _mm512_set1_ps(1.0f / static_cast<float>(end - begin));
      for (int v = 0; v < kVecs; ++v) acc[v] = _mm512_mul_ps(acc[v], scale);
    }
    StoreTile<kVecs>(acc, out + s * out_stride + col0, last);
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
    WithVecs<1, 8>((cols + 15) / 16,
                   [&](auto vecs) { tile(vecs, col0, cols, last); });
  }
}

// Up to 128 columns per tile: eight 16-float accumulators.
template <typename Lanes>
void PoolAvx512(const typename Lanes::T* weights, int dim, bool mean,
                const int64_t* offsets, const int64_t* ids, int64_t bag_begin,
                int64_t bag_end, int64_t total, float* out,
                int64_t out_stride) {
  ForEachTile(dim, [&](auto vecs, int col0, int cols, __mmask16 last) {
    PoolTileAvx512<Lanes, vecs.value>(weights, dim, col0, cols, last, offsets,
                                      ids, bag_begin, bag_end, total, mean, out,
                                      out_stride);
  });
}

// SumRows in tiles of up to 128 columns (ForEachTile).
void SumRowsAvx512(const float* rows, int64_t row_stride, int dim,
                   const int64_t* order, int64_t begin, int64_t end,
                   int64_t prefetch_end, float* out) {
  ForEachTile(dim, [&](auto vecs, int col0, int cols, __mmask16 last) {
    SumTileAvx512<vecs.value>(rows, row_stride, col0, cols, last, order, begin,
                              end, prefetch_end, out);
  });
}

// The AVX-512 loader of each portable element type.
template <typename Words>
struct LanesOf;
template <>
struct LanesOf<F32Words> {
  using type = F32Lanes;
};
template <>
struct LanesOf<F16Words> {
  using type = Words16Lanes<false>;
};
template <>
struct LanesOf<Bf16Words> {
  using type = Words16Lanes<true>;
};

#undef DLRM_AVX512_TARGET

#endif  // DLRM_HAVE_AVX512_KERNELS

// PoolBags for one element type: the narrow fixed-dim loop on every ISA
// (8-float vectors beat the 16-lane masked tile there too), else the
// AVX-512 tiles where `avx512`, else the portable tiles.
template <typename Words>
void Pool(bool avx512, const typename Words::T* weights, int dim, bool mean,
          const int64_t* offsets, const int64_t* ids, int64_t bag_begin,
          int64_t bag_end, int64_t total, float* out, int64_t out_stride) {
  if (PoolNarrow<Words>(weights, dim, mean, offsets, ids, bag_begin, bag_end,
                        total, out, out_stride)) {
    return;
  }
#if DLRM_HAVE_AVX512_KERNELS
  if (avx512) {
    PoolAvx512<typename LanesOf<Words>::type>(weights, dim, mean, offsets, ids,
                                              bag_begin, bag_end, total, out,
                                              out_stride);
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
      return __builtin_cpu_supports("avx512f") &&
             __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl");
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
  Pool<F32Words>(isa == Isa::kAvx512, weights, dim, mean, offsets, ids,
                 bag_begin, bag_end, total, out, out_stride);
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

void PoolBags16(Isa isa, RowPrecision precision, const uint16_t* weights,
                int dim, bool mean, const int64_t* offsets, const int64_t* ids,
                int64_t bag_begin, int64_t bag_end, int64_t total, float* out,
                int64_t out_stride) {
  const bool avx512 = isa == Isa::kAvx512;
  if (precision == ROW_BF16) {
    Pool<Bf16Words>(avx512, weights, dim, mean, offsets, ids, bag_begin,
                    bag_end, total, out, out_stride);
  } else {
    Pool<F16Words>(avx512, weights, dim, mean, offsets, ids, bag_begin, bag_end,
                   total, out, out_stride);
  }
}

}  // namespace dlrm::embedding::kernels
