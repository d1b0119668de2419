// The AMX bf16 GEMM: tile configuration, the packing of B, and the 32 x 32
// block kernel with its epilogue (dense/amx_gemm.h).
#include "dense/amx_gemm.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include "dense/cpu_isa.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define DLRM_AMX_TARGET \
  __attribute__((       \
      target("avx512f,avx512bw,avx512vl,avx512bf16,amx-tile,amx-bf16")))
#endif

namespace dlrm::dense {
namespace {

constexpr int64_t kBlockK = 32;  // bf16 values in a tile row (64 bytes)
constexpr int64_t kBlockN = 16;  // fp32 columns in an accumulator tile
constexpr int64_t kBlockM = 32;  // two tiles of 16 rows
constexpr int64_t kBlockValues = kBlockK * kBlockN;

// The bytes of B's column panels a thread reads again for every block of
// rows: about half of a 2 MiB L2.
constexpr int64_t kPanelBytes = 1 << 20;

// Outputs of at least this many bytes (as fp32) are written with
// non-temporal stores: the cross network's [batch x 3456] outputs (28 MiB
// at a batch of 2048), not the MLPs' activations, which the next layer
// reads from cache.
constexpr int64_t kStreamBytes = 8 << 20;

// Packing below this many blocks stays on the calling thread.
constexpr int64_t kParallelBlocks = 64;

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

bool AmxGemmUsable() {
  static const bool usable = [] {
    const char* env = std::getenv("DLRM_AMX_GEMM");
    if (env != nullptr && std::string_view(env) == "0") return false;
#if defined(__x86_64__)
    __builtin_cpu_init();
    return AmxUsable(DetectAmx()) && MatmulUsesAmx() &&
           __builtin_cpu_supports("avx512bf16");
#else
    return false;
#endif
  }();
  return usable;
}

void AmxPackedB::Resize(int64_t k, int64_t n) {
  k_ = k;
  n_ = n;
  k_blocks_ = CeilDiv(k, kBlockK);
  n_blocks_ = CeilDiv(n, kBlockN);
  const size_t need = static_cast<size_t>(k_blocks_ * n_blocks_ * kBlockValues);
  if (data_.size() < need) data_.resize(need);
}

namespace {

#if defined(__x86_64__)
bool HasAvx512Bw() {
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512bw") != 0;
  }();
  return has;
}

// A 16 x 16 transpose of 32-bit units: unit c of r[p] to unit p of row c
// of dst (16 units, 64 bytes, at dst + c * ld_dst). r is clobbered.
__attribute__((target("avx512f"))) void TransposeUnits16x16(__m512i* r,
                                                            Bf16* dst,
                                                            int64_t ld_dst) {
  __m512i t[16];
  // Within each 128-bit lane L: after these two steps r[4i + j] holds
  // unit 4L + j of rows 4i .. 4i + 3.
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {
    r[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
    r[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
    r[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
    r[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
  }
  // Then a 4 x 4 transpose of the lanes for each j: output row 4L + j
  // gathers lane L of r[j], r[4 + j], r[8 + j], r[12 + j].
  for (int j = 0; j < 4; ++j) {
    const __m512i u0 = _mm512_shuffle_i32x4(r[j], r[4 + j], 0x44);
    const __m512i u1 = _mm512_shuffle_i32x4(r[j], r[4 + j], 0xee);
    const __m512i u2 = _mm512_shuffle_i32x4(r[8 + j], r[12 + j], 0x44);
    const __m512i u3 = _mm512_shuffle_i32x4(r[8 + j], r[12 + j], 0xee);
    _mm512_storeu_si512(dst + (0 + j) * ld_dst,
                        _mm512_shuffle_i32x4(u0, u2, 0x88));
    _mm512_storeu_si512(dst + (4 + j) * ld_dst,
                        _mm512_shuffle_i32x4(u0, u2, 0xdd));
    _mm512_storeu_si512(dst + (8 + j) * ld_dst,
                        _mm512_shuffle_i32x4(u1, u3, 0x88));
    _mm512_storeu_si512(dst + (12 + j) * ld_dst,
                        _mm512_shuffle_i32x4(u1, u3, 0xdd));
  }
}

// A full block of B [k x n] row-major: row pair p's 16 columns interleaved,
// element (2p + e, c) at (p * 16 + c) * 2 + e.
__attribute__((target("avx512f,avx512bw"))) void PackFullBlock(const Bf16* b,
                                                               int64_t ldb,
                                                               Bf16* out) {
  alignas(64) static constexpr uint16_t kInterleave[32] = {
      0, 32, 1, 33, 2,  34, 3,  35, 4,  36, 5,  37, 6,  38, 7,  39,
      8, 40, 9, 41, 10, 42, 11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
  const __m512i idx = _mm512_load_si512(kInterleave);
  for (int64_t p = 0; p < kBlockK / 2; ++p) {
    const Bf16* r0 = b + 2 * p * ldb;
    const __m512i x0 = _mm512_castsi256_si512(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r0)));
    const __m512i x1 = _mm512_castsi256_si512(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r0 + ldb)));
    _mm512_storeu_si512(out + p * 32, _mm512_permutex2var_epi16(x0, idx, x1));
  }
}

// A full block of B = W^T from W [n x k] row-major: element (2p + e, c) of
// B is W's (c, 2p + e), and a pair of W's row is one 32-bit unit, so the
// block is the 16 x 16 transpose of the units of W's 16 rows.
__attribute__((target("avx512f"))) void PackTransposedFullBlock(const Bf16* w,
                                                                int64_t ldw,
                                                                Bf16* out) {
  __m512i r[16];
  for (int c = 0; c < 16; ++c) r[c] = _mm512_loadu_si512(w + c * ldw);
  TransposeUnits16x16(r, out, 2 * kBlockN);
}
#endif

// A block at the edge of B (past k or n in part), element by element:
// element (2p + e, c) of the block is at(row, col) of B, zero past k or n.
template <typename At>
void PackEdgeBlock(int64_t k0, int64_t n0, int64_t k, int64_t n, At at,
                   Bf16* out) {
  for (int64_t p = 0; p < kBlockK / 2; ++p) {
    for (int64_t c = 0; c < kBlockN; ++c) {
      for (int64_t e = 0; e < 2; ++e) {
        const int64_t r = k0 + 2 * p + e, col = n0 + c;
        out[(p * kBlockN + c) * 2 + e] = r < k && col < n ? at(r, col) : 0;
      }
    }
  }
}

}  // namespace

template <typename Fill>
void AmxPackedB::FillBlocks(int64_t k, int64_t n, Fill fill) {
  Resize(k, n);
  const int64_t blocks = k_blocks_ * n_blocks_;
  // Column blocks innermost: the two halves of a 64-byte line of a
  // row-major B are packed one after the other, so each line is read once.
#pragma omp parallel for schedule(static) if (blocks >= kParallelBlocks)
  for (int64_t i = 0; i < blocks; ++i) {
    const int64_t kb = i / n_blocks_, nb = i % n_blocks_;
    fill(kb * kBlockK, nb * kBlockN, mutable_block(kb, nb));
  }
}

void AmxPackedB::Pack(const Bf16* b, int64_t k, int64_t n, int64_t ldb) {
  FillBlocks(k, n, [&](int64_t k0, int64_t n0, Bf16* out) {
#if defined(__x86_64__)
    if (k0 + kBlockK <= k && n0 + kBlockN <= n && HasAvx512Bw()) {
      PackFullBlock(b + k0 * ldb + n0, ldb, out);
      return;
    }
#endif
    PackEdgeBlock(
        k0, n0, k, n, [&](int64_t r, int64_t c) { return b[r * ldb + c]; },
        out);
  });
}

void AmxPackedB::PackTransposed(const Bf16* w, int64_t k, int64_t n,
                                int64_t ldw) {
  FillBlocks(k, n, [&](int64_t k0, int64_t n0, Bf16* out) {
    if (k0 + kBlockK <= k && n0 + kBlockN <= n) {
#if defined(__x86_64__)
      if (HasAvx512Bw()) {  // AVX-512F with it
        PackTransposedFullBlock(w + n0 * ldw + k0, ldw, out);
        return;
      }
#endif
      // Element (2p + e, c) of B is W's (n0 + c, k0 + 2p + e): a pair of
      // W's row is one 32-bit unit, so the block is a 16 x 16 transpose of
      // them.
      for (int64_t c = 0; c < kBlockN; ++c) {
        const Bf16* row = w + (n0 + c) * ldw + k0;
        for (int64_t p = 0; p < kBlockK / 2; ++p) {
          uint32_t pair;
          std::memcpy(&pair, row + 2 * p, sizeof(pair));
          std::memcpy(out + (p * kBlockN + c) * 2, &pair, sizeof(pair));
        }
      }
      return;
    }
    PackEdgeBlock(
        k0, n0, k, n, [&](int64_t r, int64_t c) { return w[c * ldw + r]; },
        out);
  });
}

namespace {

#if defined(__x86_64__)
// Rows [0, 32) x columns [0, 16) of src into dst: row pairs interleaved
// into 32-bit units (the pair of column c in unit c), then a 16 x 16
// transpose of the units, so unit p of output row c holds src's rows 2p
// and 2p + 1 of column c: 32 consecutive rows, one 64-byte store.
__attribute__((target("avx512f,avx512bw"))) void TransposeBlock32x16(
    const Bf16* src, int64_t ld_src, Bf16* dst, int64_t ld_dst) {
  alignas(64) static constexpr uint16_t kInterleave[32] = {
      0, 32, 1, 33, 2,  34, 3,  35, 4,  36, 5,  37, 6,  38, 7,  39,
      8, 40, 9, 41, 10, 42, 11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
  const __m512i idx = _mm512_load_si512(kInterleave);
  __m512i r[16];
  for (int p = 0; p < 16; ++p) {
    const Bf16* row = src + 2 * p * ld_src;
    const __m512i x0 = _mm512_castsi256_si512(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row)));
    const __m512i x1 = _mm512_castsi256_si512(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + ld_src)));
    r[p] = _mm512_permutex2var_epi16(x0, idx, x1);
  }
  TransposeUnits16x16(r, dst, ld_dst);
}

#endif

}  // namespace

void TransposeBf16(const Bf16* src, int64_t rows, int64_t cols, int64_t ld_src,
                   Bf16* dst, int64_t ld_dst) {
  int64_t rows_done = 0, cols_done = 0;
#if defined(__x86_64__)
  if (HasAvx512Bw()) {
    rows_done = rows / 32 * 32;
    cols_done = cols / 16 * 16;
    for (int64_t r = 0; r < rows_done; r += 32) {
      for (int64_t c = 0; c < cols_done; c += 16) {
        TransposeBlock32x16(src + r * ld_src + c, ld_src, dst + c * ld_dst + r,
                            ld_dst);
      }
    }
  }
#endif
  // The columns past the blocks for the blocks' rows, then the rows past
  // them for every column.
  for (int64_t r = 0; r < rows_done; ++r) {
    for (int64_t c = cols_done; c < cols; ++c) {
      dst[c * ld_dst + r] = src[r * ld_src + c];
    }
  }
  for (int64_t c = 0; c < cols; ++c) {
    for (int64_t r = rows_done; r < rows; ++r) {
      dst[c * ld_dst + r] = src[r * ld_src + c];
    }
  }
}

#if defined(__x86_64__)
namespace {

// The LDTILECFG operand: palette 1, every tile 16 rows of 64 bytes (the
// accumulators 0-3 hold 16 x 16 fp32, the A tiles 4-5 16 x 32 bf16, the B
// tiles 6-7 16 pairs x 16 columns).
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

constexpr TileConfig MakeTileConfig() {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.colsb[t] = 64;
    cfg.rows[t] = 16;
  }
  return cfg;
}

// A constant in memory: GCC's _tile_loadconfig tells the compiler it reads
// 8 bytes, so the stores filling a local configuration can be dropped as
// dead (the tiles then stay unconfigured and the first tile instruction
// faults).
constexpr TileConfig kTileConfig = MakeTileConfig();

DLRM_AMX_TARGET void ConfigureTiles() { _tile_loadconfig(&kTileConfig); }

// Where one block of 32 rows of A is read from: the first `full_kb`
// reduction blocks at `full` (leading dimension `ld`), the rest (one
// zero-padded tail block of 32 x 32) at `tail`. Rows past m and columns
// past k read zeros from the thread's copy.
struct ABlock {
  const Bf16* full = nullptr;
  int64_t ld = 0;
  int64_t full_kb = 0;
  const Bf16* tail = nullptr;
  int rows = 0;
};

struct Scratch {
  AlignedVector<Bf16> rows;  // a short last block of rows, zero-padded
  AlignedVector<Bf16> tail;  // the reduction's last partial block
  alignas(64) float c[kBlockM * 2 * kBlockN];
};

ABlock PrepareA(const Bf16* a, int64_t lda, int64_t m, int64_t k,
                int64_t k_blocks, int64_t mb, Scratch* s) {
  ABlock v;
  const int64_t m0 = mb * kBlockM;
  v.rows = static_cast<int>(std::min(kBlockM, m - m0));
  // Tile loads whose rows are not whole 64-byte lines (A not 64-byte
  // aligned, or its rows not a multiple of 64 bytes apart, as at K = 367)
  // ran at half the speed, so such a block is copied to aligned rows as a
  // short one is, unless it has one reduction block (K <= 32: the copy
  // cost more than it saved).
  const bool aligned = (lda * sizeof(Bf16)) % 64 == 0 &&
                       reinterpret_cast<uintptr_t>(a) % 64 == 0;
  if (v.rows < kBlockM || (!aligned && k_blocks >= 2)) {
    const int64_t ld = k_blocks * kBlockK;
    if (static_cast<int64_t>(s->rows.size()) < kBlockM * ld) {
      s->rows.resize(kBlockM * ld);
    }
    for (int r = 0; r < kBlockM; ++r) {
      Bf16* row = s->rows.data() + r * ld;
      const int64_t copied = r < v.rows ? k : 0;
      if (copied > 0) {
        std::memcpy(row, a + (m0 + r) * lda, sizeof(Bf16) * copied);
      }
      std::fill(row + copied, row + ld, Bf16{0});
    }
    v.full = s->rows.data();
    v.ld = ld;
    v.full_kb = k_blocks;
    return v;
  }
  v.full = a + m0 * lda;
  v.ld = lda;
  v.full_kb = k / kBlockK;
  if (v.full_kb < k_blocks) {
    const int64_t k0 = v.full_kb * kBlockK;
    s->tail.assign(static_cast<size_t>(kBlockM * kBlockK), Bf16{0});
    for (int r = 0; r < kBlockM; ++r) {
      std::memcpy(s->tail.data() + r * kBlockK, v.full + r * lda + k0,
                  sizeof(Bf16) * (k - k0));
    }
    v.tail = s->tail.data();
  }
  return v;
}

// ToBf16 (dense/bf16_round.h) on 16 lanes, element by element on the bits:
// round to nearest even, NaN made quiet.
DLRM_AMX_TARGET inline __m256i RoundBitsToBf16(__m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i lsb =
      _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_srli_epi32(
      _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb),
      16);
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(
      _mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
      _mm512_set1_epi32(0x7f800000));
  r = _mm512_mask_or_epi32(r, nan, _mm512_srli_epi32(u, 16),
                           _mm512_set1_epi32(64));
  return _mm512_cvtepi32_epi16(r);
}

// The same in one instruction: VCVTNEPS2BF16 rounds to nearest even and
// quiets NaNs as ToBf16 does, but takes fp32 denormals as zero; lanes
// holding one (rare: activations are seldom below 2^-126) take the bits'
// path.
DLRM_AMX_TARGET inline __m256i RoundToBf16(__m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __mmask16 denormal =
      _mm512_testn_epi32_mask(u, _mm512_set1_epi32(0x7f800000)) &
      _mm512_test_epi32_mask(u, _mm512_set1_epi32(0x007fffff));
  const __m256i fast = reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(v));
  if (denormal == 0) return fast;
  return _mm256_mask_mov_epi16(fast, denormal, RoundBitsToBf16(v));
}

inline __mmask16 ColumnMask(int64_t cols) {
  if (cols >= 16) return 0xffff;
  if (cols <= 0) return 0;
  return static_cast<__mmask16>((1u << cols) - 1);
}

// Stores 16 lanes at p: a non-temporal store of the whole line when
// `stream` and every lane is written, else the masked store.
DLRM_AMX_TARGET inline void Store(float* p, __mmask16 lanes, __m512 v,
                                  bool stream) {
  if (stream && lanes == 0xffff) {
    _mm512_stream_ps(p, v);
  } else {
    _mm512_mask_storeu_ps(p, lanes, v);
  }
}
DLRM_AMX_TARGET inline void Store(Bf16* p, __mmask16 lanes, __m256i v,
                                  bool stream) {
  if (stream && lanes == 0xffff) {
    _mm256_stream_si256(reinterpret_cast<__m256i*>(p), v);
  } else {
    _mm256_mask_storeu_epi16(p, lanes, v);
  }
}

// The block's outputs from the accumulators copied to s->c (rows x 32,
// leading dimension 32), columns [n0, n0 + cols), cols <= 32; stream[0],
// [1] and [2] say whether pre_f32, c_f32 and c_bf16 take non-temporal
// stores.
DLRM_AMX_TARGET void Epilogue(const float* c, int rows, int64_t m0, int64_t n0,
                              int64_t cols, const AmxEpilogue& e,
                              const bool* stream) {
  const __mmask16 lo = ColumnMask(cols), hi = ColumnMask(cols - 16);
  const __m512 zero = _mm512_setzero_ps();
  __m512 b_lo = zero, b_hi = zero;
  if (e.bias != nullptr) {
    b_lo = _mm512_maskz_loadu_ps(lo, e.bias + n0);
    b_hi = _mm512_maskz_loadu_ps(hi, e.bias + n0 + 16);
  }
  __m512 sum_lo = zero, sum_hi = zero;
  for (int r = 0; r < rows; ++r) {
    __m512 v_lo = _mm512_add_ps(_mm512_load_ps(c + r * 32), b_lo);
    __m512 v_hi = _mm512_add_ps(_mm512_load_ps(c + r * 32 + 16), b_hi);
    if (e.relu) {
      v_lo = _mm512_max_ps(v_lo, zero);
      v_hi = _mm512_max_ps(v_hi, zero);
    }
    const int64_t at = (m0 + r) * e.ldc + n0;
    if (e.pre_f32 != nullptr) {
      Store(e.pre_f32 + at, lo, v_lo, stream[0]);
      if (hi != 0) Store(e.pre_f32 + at + 16, hi, v_hi, stream[0]);
    }
    // A product, then a sum (not fused: the bits of the plain loop).
    if (e.mul != nullptr) {
      v_lo = _mm512_mul_ps(v_lo, _mm512_maskz_loadu_ps(lo, e.mul + at));
      v_hi = _mm512_mul_ps(v_hi, _mm512_maskz_loadu_ps(hi, e.mul + at + 16));
    }
    if (e.add != nullptr) {
      v_lo = _mm512_add_ps(v_lo, _mm512_maskz_loadu_ps(lo, e.add + at));
      v_hi = _mm512_add_ps(v_hi, _mm512_maskz_loadu_ps(hi, e.add + at + 16));
    }
    if (e.mask != nullptr) {  // y > 0 on the bf16 bits: positive, not zero
      const __m256i zero16 = _mm256_setzero_si256();
      const __mmask16 pos_lo = _mm256_cmpgt_epi16_mask(
          _mm256_maskz_loadu_epi16(lo, e.mask + at), zero16);
      const __mmask16 pos_hi = _mm256_cmpgt_epi16_mask(
          _mm256_maskz_loadu_epi16(hi, e.mask + at + 16), zero16);
      v_lo = _mm512_maskz_mov_ps(pos_lo, v_lo);
      v_hi = _mm512_maskz_mov_ps(pos_hi, v_hi);
    }
    if (e.col_sums != nullptr) {
      sum_lo = _mm512_add_ps(sum_lo, v_lo);
      sum_hi = _mm512_add_ps(sum_hi, v_hi);
    }
    if (e.c_f32 != nullptr) {
      if (e.accumulate) {
        v_lo = _mm512_add_ps(v_lo, _mm512_maskz_loadu_ps(lo, e.c_f32 + at));
        v_hi =
            _mm512_add_ps(v_hi, _mm512_maskz_loadu_ps(hi, e.c_f32 + at + 16));
      }
      Store(e.c_f32 + at, lo, v_lo, stream[1]);
      if (hi != 0) Store(e.c_f32 + at + 16, hi, v_hi, stream[1]);
    }
    if (e.c_bf16 != nullptr) {
      Store(e.c_bf16 + at, lo, RoundToBf16(v_lo), stream[2]);
      if (hi != 0) Store(e.c_bf16 + at + 16, hi, RoundToBf16(v_hi), stream[2]);
    }
  }
  if (e.col_sums != nullptr) {
    float* sums = e.col_sums + m0 / kBlockM * e.ldc + n0;
    _mm512_mask_storeu_ps(sums, lo, sum_lo);
    if (hi != 0) _mm512_mask_storeu_ps(sums + 16, hi, sum_hi);
  }
  if (e.c_bf16_t != nullptr) {  // the block just written, from L1
    const Bf16* src = e.c_bf16 + m0 * e.ldc + n0;
    Bf16* dst = e.c_bf16_t + n0 * e.ldt + m0;
    if (rows == kBlockM && cols == 2 * kBlockN) {
      TransposeBlock32x16(src, e.ldc, dst, e.ldt);
      TransposeBlock32x16(src + 16, e.ldc, dst + 16 * e.ldt, e.ldt);
    } else {
      for (int r = 0; r < rows; ++r) {
        for (int64_t j = 0; j < cols; ++j) {
          dst[j * e.ldt + r] = src[r * e.ldc + j];
        }
      }
    }
  }
}

// One reduction block of BlockProduct: A's 16 or 32 rows at `ap` (rows
// `ld` values, `stride` bytes apart) against B's block (kb, nb0) and, with
// kTwoN, (kb, nb0 + 1).
template <bool kTwoM, bool kTwoN>
DLRM_AMX_TARGET inline void TileStep(const Bf16* ap, int64_t stride, int64_t ld,
                                     const AmxPackedB& b, int64_t kb,
                                     int64_t nb0) {
  _tile_loadd(4, ap, stride);
  if constexpr (kTwoM) _tile_loadd(5, ap + 16 * ld, stride);
  _tile_loadd(6, b.block(kb, nb0), 64);
  _tile_dpbf16ps(0, 4, 6);
  if constexpr (kTwoM) _tile_dpbf16ps(2, 5, 6);
  if constexpr (kTwoN) {
    _tile_loadd(7, b.block(kb, nb0 + 1), 64);
    _tile_dpbf16ps(1, 4, 7);
    if constexpr (kTwoM) _tile_dpbf16ps(3, 5, 7);
  }
}

// One block of up to 32 rows by one or two column blocks (kTwoN), the
// second 16 rows only when kTwoM. Tiles: C 0 (rows 0-15, first columns),
// 1 (rows 0-15, second), 2 and 3 (rows 16-31); A 4 and 5; B 6 and 7.
template <bool kTwoM, bool kTwoN>
DLRM_AMX_TARGET void BlockProduct(const ABlock& a, const AmxPackedB& b,
                                  int64_t nb0, float* c) {
  _tile_zero(0);
  if constexpr (kTwoN) _tile_zero(1);
  if constexpr (kTwoM) _tile_zero(2);
  if constexpr (kTwoM && kTwoN) _tile_zero(3);
  const int64_t k_blocks = b.k_blocks();
  const int64_t stride = a.ld * static_cast<int64_t>(sizeof(Bf16));
  for (int64_t kb = 0; kb < a.full_kb; ++kb) {
    TileStep<kTwoM, kTwoN>(a.full + kb * kBlockK, stride, a.ld, b, kb, nb0);
  }
  if (a.full_kb < k_blocks) {  // the reduction's zero-padded last block
    TileStep<kTwoM, kTwoN>(a.tail, 64, kBlockK, b, a.full_kb, nb0);
  }
  _tile_stored(0, c, 128);
  if constexpr (kTwoN) _tile_stored(1, c + 16, 128);
  if constexpr (kTwoM) _tile_stored(2, c + 16 * 32, 128);
  if constexpr (kTwoM && kTwoN) _tile_stored(3, c + 16 * 32 + 16, 128);
}

DLRM_AMX_TARGET void ReleaseTiles() { _tile_release(); }

// Columns [c0, c0 + kChunks * 16) (lanes past `cols` masked) of
// AmxMaskRows: the sums in registers over the rows.
template <int kChunks>
DLRM_AMX_TARGET void MaskColumns(const float* dy, const Bf16* y, int64_t begin,
                                 int64_t end, int out, int c0, int64_t cols,
                                 float* sum, Bf16* dyb) {
  __m512 acc[kChunks];
  __mmask16 lanes[kChunks];
  for (int j = 0; j < kChunks; ++j) {
    acc[j] = _mm512_setzero_ps();
    lanes[j] = ColumnMask(cols - 16 * j);
  }
  const __m256i zero = _mm256_setzero_si256();
  for (int64_t r = begin; r < end; ++r) {
    const int64_t at = r * out + c0;
    for (int j = 0; j < kChunks; ++j) {
      const __m256i a = _mm256_maskz_loadu_epi16(lanes[j], y + at + 16 * j);
      // y > 0 on the bf16 bits: positive sign, not zero.
      const __mmask16 pos = _mm256_cmpgt_epi16_mask(a, zero) & lanes[j];
      const __m512 v = _mm512_maskz_loadu_ps(pos, dy + at + 16 * j);
      acc[j] = _mm512_add_ps(acc[j], v);
      _mm256_mask_storeu_epi16(dyb + at + 16 * j, lanes[j], RoundToBf16(v));
    }
  }
  for (int j = 0; j < kChunks; ++j) {
    _mm512_mask_storeu_ps(sum + c0 + 16 * j, lanes[j], acc[j]);
  }
}

}  // namespace

void AmxMaskRows(const float* dy, const Bf16* y, int64_t begin, int64_t end,
                 int out, float* sum, Bf16* dyb) {
  // Four vectors of sums at a time: 64 columns per sweep over the rows.
  int c0 = 0;
  for (; c0 + 64 <= out; c0 += 64) {
    MaskColumns<4>(dy, y, begin, end, out, c0, 64, sum, dyb);
  }
  if (c0 < out) {
    MaskColumns<4>(dy, y, begin, end, out, c0, out - c0, sum, dyb);
  }
}

void AmxGemm(int64_t m, const Bf16* a, int64_t lda, const AmxPackedB& b,
             const AmxEpilogue& out) {
  if (m <= 0 || b.n() <= 0) return;
  const int64_t k = b.k(), n = b.n();
  const int64_t m_blocks = CeilDiv(m, kBlockM);
  const int64_t n_pairs = CeilDiv(b.n_blocks(), 2);
  const int64_t items = m_blocks * n_pairs;
  // The column pairs come in chunks whose panels of B (k x 32 values each)
  // fit in kPanelBytes; within a chunk the items are the chunk's pairs for
  // one block of rows, then the next block of rows. A thread takes
  // consecutive items, so one block of A stays in L1 while the chunk's
  // panels are read from L2 again and again. With all of B in one chunk
  // (K x N up to 512 x 512), B at a large reduction (DCNv2: 3456 x 512, 3.4
  // MiB) was streamed from L3 once per block of rows.
  const int64_t panel =
      std::max<int64_t>(b.k_blocks(), 1) * 2 * kBlockValues * sizeof(Bf16);
  const int64_t chunk = std::clamp<int64_t>(kPanelBytes / panel, 1, n_pairs);
  // Outputs of kStreamBytes or more are written around the caches
  // (non-temporal stores of whole 64-byte lines, where the lines are
  // aligned): a store that misses reads its line first, and these are read
  // back from memory anyway. The cross network's forward ran 0.75x as long.
  const bool big =
      m * out.ldc * static_cast<int64_t>(sizeof(float)) >= kStreamBytes &&
      !out.accumulate;
  auto streams = [&](const void* p) {
    return big && reinterpret_cast<uintptr_t>(p) % 64 == 0 && out.ldc % 16 == 0;
  };
  // (Not c_bf16 when the epilogue reads it back for the transpose.)
  const bool stream[3] = {streams(out.pre_f32), streams(out.c_f32),
                          out.c_bf16_t == nullptr && streams(out.c_bf16)};
#pragma omp parallel if (items > 1)
  {
    ConfigureTiles();
    thread_local Scratch s;
    ABlock view;
    int64_t view_mb = -1, view_chunk = -1;
#pragma omp for schedule(static)
    for (int64_t item = 0; item < items; ++item) {
      const int64_t c = item / (m_blocks * chunk);
      const int64_t width = std::min(chunk, n_pairs - c * chunk);
      const int64_t rest = item - c * m_blocks * chunk;
      const int64_t mb = rest / width, np = c * chunk + rest % width;
      if (mb != view_mb || c != view_chunk) {
        view_chunk = c;
        view = PrepareA(a, lda, m, k, b.k_blocks(), mb, &s);
        view_mb = mb;
      }
      const int64_t nb0 = 2 * np;
      const bool two_n = nb0 + 1 < b.n_blocks();
      const bool two_m = view.rows > 16;
      if (two_m) {
        if (two_n) {
          BlockProduct<true, true>(view, b, nb0, s.c);
        } else {
          BlockProduct<true, false>(view, b, nb0, s.c);
        }
      } else if (two_n) {
        BlockProduct<false, true>(view, b, nb0, s.c);
      } else {
        BlockProduct<false, false>(view, b, nb0, s.c);
      }
      const int64_t n0 = nb0 * kBlockN;
      Epilogue(s.c, view.rows, mb * kBlockM, n0,
               std::min<int64_t>(two_n ? 2 * kBlockN : kBlockN, n - n0), out,
               stream);
    }
    if (stream[0] || stream[1] || stream[2]) _mm_sfence();
    ReleaseTiles();
  }
}
#else
void AmxGemm(int64_t, const Bf16*, int64_t, const AmxPackedB&,
             const AmxEpilogue&) {
  std::abort();  // AmxGemmUsable() is false off x86-64
}
void AmxMaskRows(const float*, const Bf16*, int64_t, int64_t, int, float*,
                 Bf16*) {
  std::abort();
}
#endif

}  // namespace dlrm::dense
