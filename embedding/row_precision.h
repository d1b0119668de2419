// 16-bit embedding rows (TableConfig.weight_precision): conversions between
// fp32 and IEEE half or bfloat16, and the stochastic rounding an update
// writes them back with, from a counter-based hash so any rank count and
// thread count round the same element the same way.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

#include "core/random.h"
#include "dense/bf16_round.h"
#include "dlrm/config.pb.h"

#if defined(__F16C__)
#include <immintrin.h>
#endif

namespace dlrm::embedding {

// Bytes of one weight in `precision`: 4 for ROW_FP32, 2 otherwise.
inline int WeightBytes(RowPrecision precision) {
  return precision == ROW_FP32 ? 4 : 2;
}

// The float an IEEE half holds (exact).
inline float HalfToFloat(uint16_t h) {
#if defined(__F16C__)
  return _cvtsh_ss(h);
#else
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t exponent = (h >> 10) & 0x1f, mantissa = h & 0x3ff;
  if (exponent == 0) {
    // Zero or a subnormal: mantissa x 2^-24, exact in float.
    const float v = static_cast<float>(mantissa) * 0x1p-24f;
    return std::bit_cast<float>(std::bit_cast<uint32_t>(v) | sign);
  }
  if (exponent == 31) {
    return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));
  }
  return std::bit_cast<float>(sign | ((exponent + 112) << 23) |
                              (mantissa << 13));
#endif
}

// `f` rounded to the nearest IEEE half, ties to even; overflow gives
// infinity, NaN stays NaN.
inline uint16_t FloatToHalf(float f) {
#if defined(__F16C__)
  return static_cast<uint16_t>(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT));
#else
  uint32_t x = std::bit_cast<uint32_t>(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000);
  x &= 0x7fffffffu;
  if (x >= 0x7f800000u) {
    return sign | 0x7c00 | (x > 0x7f800000u ? 0x200 : 0);
  }
  if (x >= 0x477ff000u) return sign | 0x7c00;  // >= 65520 rounds to inf
  if (x < 0x38800000u) {                       // below 2^-14: subnormal
    const float m = std::nearbyint(std::bit_cast<float>(x) * 0x1p24f);
    return sign | static_cast<uint16_t>(m);
  }
  const uint32_t r = x + 0xfffu + ((x >> 13) & 1u);
  return sign | static_cast<uint16_t>((r >> 13) - (112u << 10));
#endif
}

// The float a bfloat16 holds (exact: its top 16 bits); the dense bf16
// path's (dense/bf16_round.h).
inline float Bf16ToFloat(uint16_t b) { return dense::FromBf16(b); }

// `f` rounded to the nearest bfloat16, ties to even; NaN stays (quiet) NaN
// (dense::ToBf16, the dense bf16 path's rounding).
inline uint16_t FloatToBf16(float f) { return dense::ToBf16(f); }

// The float a 16-bit word of `precision` (ROW_FP16 or ROW_BF16) holds.
inline float WordToFloat(RowPrecision precision, uint16_t w) {
  return precision == ROW_FP16 ? HalfToFloat(w) : Bf16ToFloat(w);
}

// `f` rounded to the nearest word of `precision` (ROW_FP16 or ROW_BF16).
inline uint16_t FloatToWord(RowPrecision precision, float f) {
  return precision == ROW_FP16 ? FloatToHalf(f) : FloatToBf16(f);
}

// `f` rounded stochastically to bfloat16 with the 32 random bits `random`:
// to the neighbour away from zero with probability (distance to the one
// toward zero) / (their spacing), exactly (the low 16 bits of f decide
// against 16 random bits). Infinities and NaN round as FloatToBf16; the
// largest finite values may round up to infinity.
inline uint16_t FloatToBf16Stochastic(float f, uint32_t random) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7f800000u) == 0x7f800000u) return FloatToBf16(f);
  return static_cast<uint16_t>((x + (random >> 16)) >> 16);
}

// `f` rounded stochastically to IEEE half with the 32 random bits `random`,
// as FloatToBf16Stochastic: in half's normal range the 13 dropped bits of
// f decide against 13 random bits (exact probabilities); in its subnormal
// range (|f| < 2^-14, a grid of 2^-24) the fraction decides against a
// 32-bit uniform. Beyond 65504 a value may round up to infinity.
inline uint16_t FloatToHalfStochastic(float f, uint32_t random) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7f800000u) == 0x7f800000u) return FloatToHalf(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000);
  x &= 0x7fffffffu;
  if (x < 0x38800000u) {
    // q = |f| x 2^24 and its fraction are exact in double.
    const double q = static_cast<double>(std::bit_cast<float>(x)) * 0x1p24;
    const double k = std::floor(q);
    const double u = static_cast<double>(random) * 0x1p-32;
    return sign | static_cast<uint16_t>(k + (u < q - k ? 1.0 : 0.0));
  }
  x = (x + (random >> 19)) & ~0x1fffu;
  if (x >= 0x47800000u) return sign | 0x7c00;  // 65536 and up: infinity
  return sign | static_cast<uint16_t>((x >> 13) - (112u << 10));
}

// FloatToHalfStochastic or FloatToBf16Stochastic, by `precision`.
inline uint16_t FloatToWordStochastic(RowPrecision precision, float f,
                                      uint32_t random) {
  return precision == ROW_FP16 ? FloatToHalfStochastic(f, random)
                               : FloatToBf16Stochastic(f, random);
}

// The key of row `row` (of the whole table) of table `table` at update
// step `step` under `seed` for RoundingBits: a stream apart from the
// initial values' (InitialValue), one hash per row and step.
inline uint64_t RoundingRowKey(uint64_t seed, int table, int64_t row,
                               int64_t step) {
  return Mix64(HashKey(seed,
                       (uint64_t{1} << 32) |
                           static_cast<uint64_t>(static_cast<uint32_t>(table)),
                       static_cast<uint64_t>(row)) +
               static_cast<uint64_t>(step));
}

// The 32 random bits that round column `col` (of the whole table) of the
// row RoundingRowKey names: a pure function of (seed, table, row, column,
// step), so a shard rounds its elements as the whole table would.
inline uint32_t RoundingBits(uint64_t row_key, int64_t col) {
  return static_cast<uint32_t>(Mix64(row_key + static_cast<uint64_t>(col)) >>
                               32);
}

}  // namespace dlrm::embedding
