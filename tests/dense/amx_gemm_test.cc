// Tests for dense/amx_gemm.h, the hand-written AMX GEMM (part of
// dense_test): its packing against B element by element, its products
// against double loops on random shapes (tails in every dimension), its
// epilogue's rounding against ToBf16 on ties and special values, its
// steps after the bias (the cross network's product and residual) and its
// non-temporal stores against scalar bits, and its bits independent of the
// thread count and of the rows around a row.
#include "dense/amx_gemm.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <tuple>
#include <vector>

#include "core/aligned.h"
#include "core/random.h"
#include "dense/bf16.h"

namespace dlrm::dense {
namespace {

#define SKIP_WITHOUT_AMX()                                                   \
  if (!AmxGemmUsable()) {                                                    \
    GTEST_SKIP() << "AMX tiles are not usable here (no AMX, no tile "        \
                    "permission, oneDNN held below AMX or DLRM_AMX_GEMM=0)"; \
  }

std::vector<Bf16> RandomBf16(Rng* rng, size_t n) {
  std::vector<Bf16> v(n);
  for (Bf16& x : v) x = ToBf16(static_cast<float>(rng->Normal()));
  return v;
}

// A and B [k x n] row-major with spare columns, and B's transpose W [n x
// k]: the two packings must lay out the same matrix.
struct Operands {
  int64_t m, n, k, lda, ldb, ldw;
  std::vector<Bf16> a, b, w;
  std::vector<float> bias;
};

Operands MakeOperands(Rng* rng, int64_t m, int64_t n, int64_t k) {
  Operands o{m, n, k, k + 3, n + 5, k + 1, {}, {}, {}, {}};
  o.a = RandomBf16(rng, m * o.lda);
  o.b = RandomBf16(rng, std::max<int64_t>(k, 1) * o.ldb);
  o.w.assign(std::max<int64_t>(n, 1) * o.ldw, Bf16{0});
  for (int64_t r = 0; r < k; ++r) {
    for (int64_t c = 0; c < n; ++c) o.w[c * o.ldw + r] = o.b[r * o.ldb + c];
  }
  o.bias.resize(n);
  for (float& x : o.bias) x = static_cast<float>(rng->Normal());
  return o;
}

TEST(AmxGemmTest, PackingPlacesEveryElementOfB) {
  Rng rng(501);
  for (auto [k, n] :
       {std::tuple{64, 32}, std::tuple{13, 7}, std::tuple{367, 50},
        std::tuple{1, 1}, std::tuple{32, 16}}) {
    SCOPED_TRACE(::testing::Message() << k << "x" << n);
    const Operands o = MakeOperands(&rng, 1, n, k);
    AmxPackedB p, t;
    p.Pack(o.b.data(), k, n, o.ldb);
    t.PackTransposed(o.w.data(), k, n, o.ldw);
    ASSERT_EQ(p.k_blocks(), (k + 31) / 32);
    ASSERT_EQ(p.n_blocks(), (n + 15) / 16);
    for (int64_t kb = 0; kb < p.k_blocks(); ++kb) {
      for (int64_t nb = 0; nb < p.n_blocks(); ++nb) {
        for (int64_t i = 0; i < 512; ++i) {
          const int64_t pair = i / 32, c = (i / 2) % 16, e = i % 2;
          const int64_t r = kb * 32 + 2 * pair + e, col = nb * 16 + c;
          const Bf16 want = r < k && col < n ? o.b[r * o.ldb + col] : 0;
          ASSERT_EQ(p.block(kb, nb)[i], want) << kb << "," << nb << "," << i;
          ASSERT_EQ(t.block(kb, nb)[i], want) << kb << "," << nb << "," << i;
        }
      }
    }
  }
}

// Products of bf16 values are exact in fp32, so only the fp32 sums differ
// from double loops: by at most (k + 1) * 2^-24 * sum |terms| with the bias.
// The bf16 output is the fp32 output rounded once by ToBf16; columns past
// n in C are left alone.
TEST(AmxGemmTest, MatchesDoubleLoopsOnEveryTail) {
  SKIP_WITHOUT_AMX();
  Rng rng(502);
  for (auto [m, n, k] : {std::tuple{37, 19, 11}, std::tuple{130, 70, 300},
                         std::tuple{2048, 64, 256}, std::tuple{1, 1, 1},
                         std::tuple{5, 3, 0}, std::tuple{64, 32, 64},
                         std::tuple{17, 48, 33}, std::tuple{33, 512, 367},
                         std::tuple{16, 64, 2048}, std::tuple{96, 13, 512}}) {
    for (bool relu : {false, true}) {
      for (bool bias : {false, true}) {
        SCOPED_TRACE(::testing::Message()
                     << m << "x" << n << "x" << k << " relu " << relu
                     << " bias " << bias);
        const Operands o = MakeOperands(&rng, m, n, k);
        AmxPackedB packed;
        packed.Pack(o.b.data(), k, n, o.ldb);
        const int64_t ldc = n + 2;
        std::vector<float> c(m * ldc, 7.0f);
        std::vector<Bf16> cb(m * ldc, 0x7777);
        AmxGemm(
            m, o.a.data(), o.lda, packed,
            {bias ? o.bias.data() : nullptr, relu, c.data(), cb.data(), ldc});
        for (int64_t i = 0; i < m; ++i) {
          for (int64_t j = 0; j < n; ++j) {
            double sum = bias ? o.bias[j] : 0.0;
            double abs = std::fabs(sum);
            for (int64_t p = 0; p < k; ++p) {
              const double t =
                  static_cast<double>(FromBf16(o.a[i * o.lda + p])) *
                  FromBf16(o.b[p * o.ldb + j]);
              sum += t;
              abs += std::fabs(t);
            }
            const double want = relu ? std::max(sum, 0.0) : sum;
            ASSERT_NEAR(c[i * ldc + j], want, (k + 1) * 0x1p-24 * abs + 1e-30)
                << i << "," << j;
            ASSERT_EQ(cb[i * ldc + j], ToBf16(c[i * ldc + j])) << i << "," << j;
          }
          for (int64_t j = n; j < ldc; ++j) {
            ASSERT_EQ(c[i * ldc + j], 7.0f);
            ASSERT_EQ(cb[i * ldc + j], 0x7777);
          }
        }
      }
    }
  }
}

// The epilogue's rounding is ToBf16's on every lane: ties both ways, the
// largest values, infinities, NaNs (made quiet), denormals, signed zeros.
// With A all zeros each output is 0 + bias.
TEST(AmxGemmTest, EpilogueRoundsAsToBf16) {
  SKIP_WITHOUT_AMX();
  const std::vector<uint32_t> bits = {
      0x3f818000u, 0x3f808000u, 0xbf818000u, 0x7f7fffffu, 0x7f7f8000u,
      0x7f800000u, 0xff800000u, 0x7f800001u, 0xffc00001u, 0x7fbfffffu,
      0x00000001u, 0x00400000u, 0x807fffffu, 0x80000000u, 0x00000000u,
      0x3f800001u, 0x3f80ffffu, 0x40490fdbu, 0xc2f6e979u, 0x0080ffffu};
  const int64_t n = static_cast<int64_t>(bits.size()), m = 3, k = 40;
  std::vector<float> bias(n);
  for (int64_t j = 0; j < n; ++j) bias[j] = std::bit_cast<float>(bits[j]);
  const std::vector<Bf16> a(m * k, 0), b(k * n, 0);
  AmxPackedB packed;
  packed.Pack(b.data(), k, n, n);
  std::vector<float> c(m * n);
  std::vector<Bf16> cb(m * n);
  AmxGemm(m, a.data(), k, packed, {bias.data(), false, c.data(), cb.data(), n});
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      SCOPED_TRACE(::testing::Message() << std::hex << bits[j]);
      const float want = 0.0f + bias[j];
      if (std::isnan(want)) {
        EXPECT_TRUE(std::isnan(c[i * n + j]));
      } else {
        EXPECT_EQ(std::bit_cast<uint32_t>(c[i * n + j]),
                  std::bit_cast<uint32_t>(want));
      }
      EXPECT_EQ(cb[i * n + j], ToBf16(c[i * n + j]));
    }
  }
}

// The same bits on 1 and 2 threads, and for a row computed among 2048 rows
// or among 3: what the ranks of a data-parallel step rely on.
TEST(AmxGemmTest, BitsDependOnNeitherThreadsNorOtherRows) {
  SKIP_WITHOUT_AMX();
  Rng rng(503);
  const int64_t m = 2048, n = 70, k = 367;
  const Operands o = MakeOperands(&rng, m, n, k);
  AmxPackedB packed;
  packed.PackTransposed(o.w.data(), k, n, o.ldw);
  auto run = [&](int threads, int64_t first, int64_t rows) {
    std::vector<float> c(rows * n);
    const int before = omp_get_max_threads();
    omp_set_num_threads(threads);
    AmxGemm(rows, o.a.data() + first * o.lda, o.lda, packed,
            {o.bias.data(), true, c.data(), nullptr, n});
    omp_set_num_threads(before);
    return c;
  };
  const std::vector<float> two = run(2, 0, m), one = run(1, 0, m);
  ASSERT_EQ(0, std::memcmp(two.data(), one.data(), two.size() * 4));
  for (int64_t first : {int64_t{0}, int64_t{31}, int64_t{1000}, m - 3}) {
    const std::vector<float> few = run(2, first, 3);
    ASSERT_EQ(0, std::memcmp(few.data(), two.data() + first * n, 3 * n * 4))
        << first;
  }
}

// The epilogue's steps after the bias and ReLU (u kept in pre_f32, then
// u * mul + add) on an output large enough for non-temporal stores, from A
// with aligned rows (read in place): bitwise the plain epilogue's u from
// 32-row calls on a copy of A whose rows are not aligned (copied by the
// kernel), and the scalar float arithmetic after it; columns past n are
// left alone. Then the residual form (add only) accumulated into C.
TEST(AmxGemmTest, EpilogueStepsMatchScalarBitsStreamedOrNot) {
  SKIP_WITHOUT_AMX();
  Rng rng(506);
  const int64_t m = 2048, n = 1030, k = 96, ldc = 1040;  // 8.1 MiB as fp32
  const int64_t lda_odd = k + 1;
  AlignedVector<Bf16> a(m * k);
  std::vector<Bf16> a_odd(m * lda_odd, 0);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t p = 0; p < k; ++p) {
      a[i * k + p] = a_odd[i * lda_odd + p] =
          ToBf16(static_cast<float>(rng.Normal()));
    }
  }
  const std::vector<Bf16> b = RandomBf16(&rng, k * n);
  std::vector<float> bias(n);
  for (float& x : bias) x = static_cast<float>(rng.Normal());
  AlignedVector<float> mul(m * ldc), add(m * ldc);
  for (float& x : mul) x = static_cast<float>(rng.Normal());
  for (float& x : add) x = static_cast<float>(rng.Normal());
  AmxPackedB packed;
  packed.Pack(b.data(), k, n, n);

  AlignedVector<float> pre(m * ldc, 7.0f), c(m * ldc, 7.0f);
  AlignedVector<Bf16> cb(m * ldc, 0x7777);
  AmxEpilogue out{bias.data(), true, c.data(), cb.data(), ldc};
  out.pre_f32 = pre.data();
  out.mul = mul.data();
  out.add = add.data();
  AmxGemm(m, a.data(), k, packed, out);

  std::vector<float> u(m * ldc);
  for (int64_t r0 = 0; r0 < m; r0 += 32) {
    AmxGemm(32, a_odd.data() + r0 * lda_odd, lda_odd, packed,
            {bias.data(), true, u.data() + r0 * ldc, nullptr, ldc});
  }
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < ldc; ++j) {
      const int64_t at = i * ldc + j;
      if (j >= n) {
        ASSERT_EQ(pre[at], 7.0f);
        ASSERT_EQ(c[at], 7.0f);
        ASSERT_EQ(cb[at], 0x7777);
        continue;
      }
      const float product = u[at] * mul[at];
      const float want = product + add[at];
      ASSERT_EQ(std::bit_cast<uint32_t>(pre[at]),
                std::bit_cast<uint32_t>(u[at]))
          << i << "," << j;
      ASSERT_EQ(std::bit_cast<uint32_t>(c[at]), std::bit_cast<uint32_t>(want))
          << i << "," << j;
      ASSERT_EQ(cb[at], ToBf16(want)) << i << "," << j;
    }
  }

  // dx = g + dp V's form: c += u + add, without a bias or ReLU.
  const int64_t rows = 70;
  std::vector<float> acc(rows * ldc), plain(rows * ldc);
  for (float& x : acc) x = static_cast<float>(rng.Normal());
  const std::vector<float> before = acc;
  AmxEpilogue residual{nullptr, false, acc.data(), nullptr, ldc, true};
  residual.add = add.data();
  AmxGemm(rows, a.data(), k, packed, residual);
  AmxGemm(rows, a.data(), k, packed,
          {nullptr, false, plain.data(), nullptr, ldc});
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      const int64_t at = i * ldc + j;
      const float v = plain[at] + add[at];
      ASSERT_EQ(std::bit_cast<uint32_t>(acc[at]),
                std::bit_cast<uint32_t>(v + before[at]))
          << i << "," << j;
    }
  }
}

// The layer below's mask pass in the epilogue (Linear's MaskedGrad): v
// zeroed where the bf16 mask is not > 0, rounded into c_bf16, transposed
// into c_bf16_t and summed over each block of 32 rows in order, against
// the plain epilogue's fp32 output and scalar loops; tails in m and n.
TEST(AmxGemmTest, FusedMaskPassMatchesScalarBits) {
  SKIP_WITHOUT_AMX();
  Rng rng(507);
  for (auto [m, n, k] : {std::tuple{70, 50, 96}, std::tuple{2048, 512, 256},
                         std::tuple{33, 16, 40}}) {
    SCOPED_TRACE(::testing::Message() << m << "x" << n << "x" << k);
    const Operands o = MakeOperands(&rng, m, n, k);
    AmxPackedB packed;
    packed.Pack(o.b.data(), k, n, o.ldb);
    std::vector<Bf16> mask = RandomBf16(&rng, m * n);
    mask[0] = 0x8000;  // -0: not > 0
    std::vector<float> plain(m * n);
    AmxGemm(m, o.a.data(), o.lda, packed,
            {nullptr, false, plain.data(), nullptr, n});
    const int64_t ldt = AmxTransposedLd(m), blocks = (m + 31) / 32;
    std::vector<Bf16> cb(m * n), ct(n * ldt, 0x7777);
    std::vector<float> sums(blocks * n);
    AmxEpilogue out{nullptr, false, nullptr, cb.data(), n};
    out.mask = mask.data();
    out.c_bf16_t = ct.data();
    out.ldt = ldt;
    out.col_sums = sums.data();
    AmxGemm(m, o.a.data(), o.lda, packed, out);
    std::vector<float> want_sums(blocks * n, 0.0f);
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        const float v =
            static_cast<int16_t>(mask[i * n + j]) > 0 ? plain[i * n + j] : 0.0f;
        want_sums[i / 32 * n + j] += v;
        ASSERT_EQ(cb[i * n + j], ToBf16(v)) << i << "," << j;
        ASSERT_EQ(ct[j * ldt + i], ToBf16(v)) << i << "," << j;
      }
    }
    for (int64_t j = 0; j < n; ++j) {
      for (int64_t i = m; i < ldt; ++i) ASSERT_EQ(ct[j * ldt + i], 0x7777);
    }
    for (int64_t i = 0; i < blocks * n; ++i) {
      ASSERT_EQ(std::bit_cast<uint32_t>(sums[i]),
                std::bit_cast<uint32_t>(want_sums[i]))
          << i;
    }
  }
}

// TransposeBf16 against element-by-element copies: shapes with and without
// full 32 x 16 blocks, leading dimensions wider than the rows; what lies
// past the destination's rows is left alone. Needs no AMX.
TEST(AmxGemmTest, TransposeMatchesElementByElement) {
  Rng rng(504);
  for (auto [rows, cols] :
       {std::tuple{64, 512}, std::tuple{32, 16}, std::tuple{33, 17},
        std::tuple{31, 15}, std::tuple{2048, 1}, std::tuple{96, 48},
        std::tuple{1, 1}, std::tuple{0, 5}, std::tuple{70, 367}}) {
    SCOPED_TRACE(::testing::Message() << rows << "x" << cols);
    const int64_t ld_src = cols + 3, ld_dst = rows + 5;
    const std::vector<Bf16> src = RandomBf16(&rng, rows * ld_src);
    std::vector<Bf16> dst(cols * ld_dst, 0x7777);
    TransposeBf16(src.data(), rows, cols, ld_src, dst.data(), ld_dst);
    for (int64_t c = 0; c < cols; ++c) {
      for (int64_t r = 0; r < ld_dst; ++r) {
        ASSERT_EQ(dst[c * ld_dst + r], r < rows ? src[r * ld_src + c] : 0x7777)
            << r << "," << c;
      }
    }
  }
}

// AmxMaskRows against the plain loop it replaces, bitwise: the mask read
// off the bf16 output's bits (negative zero and NaN outputs masked, as
// the sign test does), the copy rounded by ToBf16 (denormal gradients
// included), the column sums in row order. Widths with and without full
// 64-column sweeps, a sub-range of rows.
TEST(AmxGemmTest, MaskRowsMatchesThePlainLoop) {
  SKIP_WITHOUT_AMX();
  Rng rng(505);
  for (int out : {512, 64, 16, 1, 100, 367}) {
    SCOPED_TRACE(out);
    const int64_t rows = 70, begin = 3, end = 67;
    std::vector<float> dy(rows * out);
    std::vector<Bf16> y(rows * out);
    for (int64_t i = 0; i < rows * out; ++i) {
      dy[i] = static_cast<float>(rng.Normal());
      y[i] = ToBf16(static_cast<float>(rng.Normal()));
      switch (i % 37) {
        case 1:
          y[i] = 0x8000;
          break;  // -0
        case 2:
          y[i] = 0x0000;
          break;
        case 3:
          y[i] = 0x7fc1;
          break;  // NaN with the sign bit clear
        case 4:
          dy[i] = std::bit_cast<float>(0x00400001u);
          break;
        case 5:
          dy[i] = -0.0f;
          break;
        default:
          break;
      }
    }
    std::vector<float> sum(out, 7.0f), want_sum(out, 0.0f);
    std::vector<Bf16> dyb(rows * out, 0x7777), want(rows * out, 0x7777);
    AmxMaskRows(dy.data(), y.data(), begin, end, out, sum.data(), dyb.data());
    for (int64_t r = begin; r < end; ++r) {
      for (int c = 0; c < out; ++c) {
        const int64_t i = r * out + c;
        const float v = static_cast<int16_t>(y[i]) > 0 ? dy[i] : 0.0f;
        want_sum[c] += v;
        want[i] = ToBf16(v);
      }
    }
    ASSERT_EQ(0, std::memcmp(sum.data(), want_sum.data(), out * 4));
    ASSERT_EQ(dyb, want);
  }
}

}  // namespace
}  // namespace dlrm::dense
