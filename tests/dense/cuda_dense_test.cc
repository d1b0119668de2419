// Tests for dense/cuda/: Linear forward/backward through cuBLASLt and
// cuBLAS (and its plan cache), in fp32 and bf16, the bf16 rounding kernel,
// the dot interaction, DCN's cross network, BCE-with-logits and the dense
// optimizers against the CPU on random inputs; the CUDA dense backend
// against the CPU one at both precisions. Skipped without a
// CUDA device, except the argument and plan-key checks.
#include "dense/cuda/cuda_dense.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <memory>
#include <optional>
#include <ostream>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/cuda/cuda_raii.h"
#include "core/random.h"
#include "core/status.h"
#include "dense/backend.h"
#include "dense/bf16.h"
#include "dense/cross_net.h"
#include "dense/interaction.h"
#include "dense/linear.h"
#include "dense/loss.h"
#include "dense/optimizer.h"
#include "optim/optimizer.h"
#include "tests/dense/dense_backend_test_util.h"
#include "tests/support/cuda_test_util.h"

namespace dlrm::dense::cuda {
namespace {

// The CUDA tests' helpers (tests/support/cuda_test_util.h).
using namespace ::dlrm::testing;  // NOLINT(build/namespaces)

// The parameterised tests' fixture: skipped without a CUDA device (in
// SetUp, before the body), every failure traced with the seed.
template <typename Case>
class CudaCaseTest : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override { DLRM_SKIP_WITHOUT_CUDA(); }

 private:
  ::testing::ScopedTrace seed_trace_{
      __FILE__, __LINE__, ::testing::Message() << "seed " << kCudaTestSeed};
};

struct LinearCase {
  int64_t batch;
  int in, out;
  bool relu;
  GemmOptions options;
};

std::string Name(const LinearCase& c) {
  return absl::StrCat("b", c.batch, "_", c.in, "x", c.out,
                      c.relu ? "_relu" : "",
                      c.options.allow_tf32 ? "_tf32" : "",
                      c.options.use_lt_epilogue ? "_lt" : "_cublas");
}

void PrintTo(const LinearCase& c, std::ostream* os) { *os << Name(c); }

// A parameterised test's name: its case's Name.
template <typename Case>
std::string CaseName(const ::testing::TestParamInfo<Case>& info) {
  return Name(info.param);
}

GemmOptions Options(bool tf32, bool lt) {
  GemmOptions o;
  o.allow_tf32 = tf32;
  o.use_lt_epilogue = lt;
  return o;
}

// A stream and a cuBLAS context on it (the stream outlives the context).
struct StreamAndBlas {
  dlrm::cuda::CudaStream stream;
  std::unique_ptr<BlasContext> ctx;

  static absl::StatusOr<StreamAndBlas> Create(const GemmOptions& options = {}) {
    ASSIGN_OR_RETURN(dlrm::cuda::CudaStream stream,
                     dlrm::cuda::CudaStream::Create());
    ASSIGN_OR_RETURN(std::unique_ptr<BlasContext> ctx,
                     BlasContext::Create(stream.get(), options));
    return StreamAndBlas{std::move(stream), std::move(ctx)};
  }
};

// A Linear of `c`'s shape with random weights.
Linear RandomLinear(const LinearCase& c, Rng& rng) {
  Linear cpu(c.in, c.out, c.relu);
  cpu.Init(&rng);
  return cpu;
}

class CudaLinearTest : public CudaCaseTest<LinearCase> {};

// The shapes of both Linear tests (fp32 and bf16): the Kaggle bottom MLP's
// first layer and top MLP's last, through cuBLASLt and cuBLAS, and a small
// one; then `more`.
std::vector<LinearCase> LinearCases(std::initializer_list<LinearCase> more) {
  std::vector<LinearCase> cases = {
      LinearCase{256, 13, 512, true, Options(false, true)},
      LinearCase{256, 13, 512, true, Options(false, false)},
      LinearCase{300, 256, 1, false, Options(false, true)},
      LinearCase{300, 256, 1, false, Options(false, false)},
      LinearCase{7, 3, 5, true, Options(false, true)}};
  cases.insert(cases.end(), more.begin(), more.end());
  return cases;
}

TEST_P(CudaLinearTest, ForwardAndBackwardMatchCpuLinear) {
  const LinearCase c = GetParam();
  Rng rng(kCudaTestSeed + c.in * 31 + c.out);
  Linear cpu = RandomLinear(c, rng);
  const std::vector<float> x = RandomFloats(rng, c.batch * c.in);
  std::vector<float> y(c.batch * c.out);
  cpu.Forward(x.data(), c.batch, y.data());

  auto blas = StreamAndBlas::Create(c.options);
  ASSERT_TRUE(blas.ok()) << blas.status();
  const std::vector<float> w(cpu.weight(), cpu.weight() + c.in * c.out);
  const std::vector<float> b(cpu.bias(), cpu.bias() + c.out);
  auto w_d = ToDevice(w);
  auto b_d = ToDevice(b);
  auto x_d = ToDevice(x);
  auto y_d = Poisoned(c.batch * c.out);
  ASSERT_TRUE(LinearForward(blas->ctx.get(), x_d.data(), c.batch, c.in, c.out,
                            w_d.data(), b_d.data(), c.relu, y_d.data())
                  .ok());
  const std::vector<float> y_gpu = ToHost(y_d, y.size());
  // float GEMMs differ from oneDNN's only in summation order: ~1e-6 of the
  // output scale; TF32 rounds products to 10 mantissa bits: ~1e-3.
  const double rel = c.options.allow_tf32 ? 1e-2 : 2e-5;
  ExpectCloseToScale(y_gpu, y, rel, "y");

  // Backward from the CPU's y, so both apply the same ReLU mask.
  const std::vector<float> dy = RandomFloats(rng, c.batch * c.out);
  std::vector<float> dy_cpu = dy;
  std::vector<float> dx(c.batch * c.in);
  cpu.Backward(x.data(), y.data(), dy_cpu.data(), c.batch, dx.data());
  auto y_cpu_d = ToDevice(y);
  auto dy_d = ToDevice(dy);
  auto dw_d = Poisoned(c.in * c.out);
  auto db_d = Poisoned(c.out);
  auto dx_d = Poisoned(c.batch * c.in);
  ASSERT_TRUE(LinearBackward(blas->ctx.get(), x_d.data(), y_cpu_d.data(),
                             dy_d.data(), c.batch, c.in, c.out, w_d.data(),
                             c.relu, dw_d.data(), db_d.data(), dx_d.data())
                  .ok());
  ExpectBitwiseEqual(ToHost(dy_d, dy.size()), dy_cpu, "masked dy");
  // The bias gradient is summed in the CPU's block order: bitwise.
  ExpectBitwiseEqual(ToHost(db_d, c.out),
                     std::span<const float>(cpu.bias_grad(), c.out), "db");
  ExpectCloseToScale(ToHost(dw_d, w.size()),
                     std::span<const float>(cpu.weight_grad(), w.size()), rel,
                     "dw");
  ExpectCloseToScale(ToHost(dx_d, dx.size()), dx, rel, "dx");
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, CudaLinearTest,
    ::testing::ValuesIn(LinearCases({
        LinearCase{1, 367, 64, false, Options(false, true)},
        LinearCase{1000, 367, 512, true, Options(true, true)},
        LinearCase{1000, 367, 512, true, Options(true, false)},
    })),
    CaseName<LinearCase>);

// A 3 -> 4 ReLU layer's fp32 (or bf16) passes on a batch of 0 queue no
// GEMM and zero the gradients, as dense::Linear.
void ExpectEmptyBatchZeroesGradients(bool bf16) {
  auto ctx = BlasContext::Create(nullptr);
  ASSERT_TRUE(ctx.ok()) << ctx.status();
  auto w = ToDevice(std::vector<float>(12, 1.0f));
  auto wb = ToDevice(std::vector<Bf16>(12, ToBf16(1.0f)));
  auto b = ToDevice(std::vector<float>(4, 1.0f));
  auto dw = Poisoned(12);
  auto db = Poisoned(4);
  if (bf16) {
    ASSERT_TRUE(LinearForwardBf16(ctx->get(), nullptr, 0, 3, 4, wb.data(),
                                  b.data(), true, nullptr, nullptr)
                    .ok());
    ASSERT_TRUE(LinearBackwardBf16(ctx->get(), nullptr, nullptr, nullptr, 0, 3,
                                   4, wb.data(), true, dw.data(), db.data(),
                                   nullptr, nullptr)
                    .ok());
  } else {
    ASSERT_TRUE(LinearForward(ctx->get(), nullptr, 0, 3, 4, w.data(), b.data(),
                              true, nullptr)
                    .ok());
    ASSERT_TRUE(LinearBackward(ctx->get(), nullptr, nullptr, nullptr, 0, 3, 4,
                               w.data(), true, dw.data(), db.data(), nullptr)
                    .ok());
  }
  EXPECT_EQ(ToHost(dw, 12), std::vector<float>(12, 0.0f));
  EXPECT_EQ(ToHost(db, 4), std::vector<float>(4, 0.0f));
}

TEST(CudaLinearEdgeTest, EmptyBatchZeroesGradients) {
  DLRM_SKIP_WITHOUT_CUDA();
  ExpectEmptyBatchZeroesGradients(/*bf16=*/false);
}

// One Linear shape called again and again with its pointers offset by
// 0 to 8 floats into larger buffers (alignments 256 down to 4 bytes): each
// new alignment makes one plan, a repeat makes none, and every result
// matches dense::Linear.
TEST(CudaLinearPlanTest, OffsetPointersMatchCpuLinearAndReusePlans) {
  DLRM_SKIP_WITHOUT_CUDA();
  SCOPED_TRACE(::testing::Message() << "seed " << kCudaTestSeed);
  constexpr int64_t kBatch = 37;
  constexpr int kIn = 24, kOut = 40;
  constexpr int kPad = 8;
  Rng rng(kCudaTestSeed + 17);
  Linear cpu(kIn, kOut, /*relu=*/true);
  cpu.Init(&rng);
  const std::vector<float> x = RandomFloats(rng, kBatch * kIn);
  std::vector<float> y(kBatch * kOut);
  cpu.Forward(x.data(), kBatch, y.data());

  auto ctx = BlasContext::Create(nullptr, Options(false, true));
  ASSERT_TRUE(ctx.ok()) << ctx.status();
  // One buffer per operand with kPad floats of room before it.
  auto padded = [&](std::span<const float> v) {
    std::vector<float> host(kPad + v.size() + kPad, 0.0f);
    std::copy(v.begin(), v.end(), host.begin());
    return host;
  };
  auto x_d = ToDevice(padded(x));
  auto w_d = ToDevice(padded(std::span<const float>(cpu.weight(), kIn * kOut)));
  auto b_d = ToDevice(padded(std::span<const float>(cpu.bias(), kOut)));
  auto y_d = Poisoned(kPad + y.size());
  const std::vector<int> offsets = {0, 1, 2, 4, 8, 3};
  std::set<internal::LtPlanKey> keys;
  for (int pass = 0; pass < 2; ++pass) {
    for (int o : offsets) {
      // Each operand at its own offset, so they are aligned differently.
      const int ox = o, ow = offsets[(o + 1) % offsets.size()],
                ob = offsets[(o + 2) % offsets.size()], oy = (o + 3) % kPad;
      SCOPED_TRACE(::testing::Message()
                   << "pass " << pass << " offsets x " << ox << " w " << ow
                   << " b " << ob << " y " << oy);
      // Moves x, w and b to their offsets in place.
      ASSERT_EQ(cudaMemcpy(x_d.data() + ox, x.data(), sizeof(float) * x.size(),
                           cudaMemcpyHostToDevice),
                cudaSuccess);
      ASSERT_EQ(cudaMemcpy(w_d.data() + ow, cpu.weight(),
                           sizeof(float) * kIn * kOut, cudaMemcpyHostToDevice),
                cudaSuccess);
      ASSERT_EQ(cudaMemcpy(b_d.data() + ob, cpu.bias(), sizeof(float) * kOut,
                           cudaMemcpyHostToDevice),
                cudaSuccess);
      ASSERT_TRUE(LinearForward(ctx->get(), x_d.data() + ox, kBatch, kIn, kOut,
                                w_d.data() + ow, b_d.data() + ob, true,
                                y_d.data() + oy)
                      .ok());
      std::vector<float> got(y.size());
      ASSERT_EQ(cudaMemcpy(got.data(), y_d.data() + oy,
                           sizeof(float) * y.size(), cudaMemcpyDeviceToHost),
                cudaSuccess);
      ExpectCloseToScale(got, y, 2e-5, "y");
      keys.insert(internal::LinearForwardKey(x_d.data() + ox, kBatch, kIn, kOut,
                                             w_d.data() + ow, b_d.data() + ob,
                                             true, false, y_d.data() + oy));
      EXPECT_EQ((*ctx)->lt_plan_count(), keys.size());
    }
  }
}

// More batch sizes than the context keeps plans for: the count stops at
// kMaxLtPlans, and a batch size whose plan was dropped (the least recently
// used) is planned again and still matches dense::Linear.
TEST(CudaLinearPlanTest, PlansPastTheCapDropTheLeastRecentlyUsed) {
  DLRM_SKIP_WITHOUT_CUDA();
  SCOPED_TRACE(::testing::Message() << "seed " << kCudaTestSeed);
  constexpr int kIn = 8, kOut = 16;
  constexpr int64_t kBatches = internal::kMaxLtPlans + 8;
  Rng rng(kCudaTestSeed + 19);
  Linear cpu(kIn, kOut, /*relu=*/false);
  cpu.Init(&rng);
  const std::vector<float> x = RandomFloats(rng, kBatches * kIn);
  auto ctx = BlasContext::Create(nullptr, Options(false, true));
  ASSERT_TRUE(ctx.ok()) << ctx.status();
  auto x_d = ToDevice(x);
  auto w_d =
      ToDevice(std::vector<float>(cpu.weight(), cpu.weight() + kIn * kOut));
  auto b_d = ToDevice(std::vector<float>(cpu.bias(), cpu.bias() + kOut));
  auto y_d = Poisoned(kBatches * kOut);
  auto check = [&](int64_t batch) {
    SCOPED_TRACE(::testing::Message() << "batch " << batch);
    ASSERT_TRUE(LinearForward(ctx->get(), x_d.data(), batch, kIn, kOut,
                              w_d.data(), b_d.data(), false, y_d.data())
                    .ok());
    std::vector<float> want(batch * kOut);
    cpu.Forward(x.data(), batch, want.data());
    ExpectCloseToScale(ToHost(y_d, batch * kOut), want, 2e-5, "y");
  };
  for (int64_t batch = 1; batch <= kBatches; ++batch) {
    check(batch);
    if (HasFatalFailure()) return;
    EXPECT_EQ((*ctx)->lt_plan_count(),
              std::min<size_t>(batch, internal::kMaxLtPlans));
  }
  // Batches 1..8 were the least recently used: dropped, planned again.
  check(1);
  EXPECT_EQ((*ctx)->lt_plan_count(), internal::kMaxLtPlans);
}

// cuBLASLt's heuristic: its algorithm only on a success with one; "not
// supported", none found, and every other error fall back to cublasGemmEx
// (errors logged) rather than failing the layer. Runs everywhere.
TEST(CudaLinearPlanTest, HeuristicErrorsFallBackToCublas) {
  using internal::ClassifyHeuristic;
  using internal::HeuristicAnswer;
  EXPECT_EQ(ClassifyHeuristic(CUBLAS_STATUS_SUCCESS, 1), HeuristicAnswer::kUse);
  EXPECT_EQ(ClassifyHeuristic(CUBLAS_STATUS_SUCCESS, 0),
            HeuristicAnswer::kNone);
  EXPECT_EQ(ClassifyHeuristic(CUBLAS_STATUS_NOT_SUPPORTED, 0),
            HeuristicAnswer::kNone);
  for (const cublasStatus_t error :
       {CUBLAS_STATUS_INVALID_VALUE, CUBLAS_STATUS_INTERNAL_ERROR,
        CUBLAS_STATUS_ARCH_MISMATCH, CUBLAS_STATUS_EXECUTION_FAILED,
        CUBLAS_STATUS_ALLOC_FAILED}) {
    EXPECT_EQ(ClassifyHeuristic(error, 0), HeuristicAnswer::kError) << error;
    // A count left over from a failed call does not make it a success.
    EXPECT_EQ(ClassifyHeuristic(error, 1), HeuristicAnswer::kError) << error;
  }
}

// The plan key's alignments come from the real pointers: the largest power
// of two up to 256 that divides the address. Runs everywhere.
TEST(CudaLinearPlanTest, KeyTakesShapeAndPointerAlignments) {
  using internal::PointerAlignment;
  auto at = [](uintptr_t address) {
    return reinterpret_cast<const void*>(address);
  };
  EXPECT_EQ(PointerAlignment(nullptr), 256);
  EXPECT_EQ(PointerAlignment(at(0x1000)), 256);
  EXPECT_EQ(PointerAlignment(at(0x1100)), 256);
  EXPECT_EQ(PointerAlignment(at(0x1080)), 128);
  EXPECT_EQ(PointerAlignment(at(0x1010)), 16);
  EXPECT_EQ(PointerAlignment(at(0x1008)), 8);
  EXPECT_EQ(PointerAlignment(at(0x1004)), 4);
  EXPECT_EQ(PointerAlignment(at(0x1002)), 2);
  EXPECT_EQ(PointerAlignment(at(0x1001)), 1);

  auto f = [](uintptr_t address) { return reinterpret_cast<float*>(address); };
  const internal::LtPlanKey key = internal::LinearForwardKey(
      f(0x10000), 64, 13, 512, f(0x20010), f(0x30008), true, false, f(0x40004));
  // Column-major D [out x batch] = W^T x^T.
  EXPECT_EQ(key.m, 512);
  EXPECT_EQ(key.n, 64);
  EXPECT_EQ(key.k, 13);
  EXPECT_EQ(key.lda, 13);
  EXPECT_EQ(key.ldb, 13);
  EXPECT_EQ(key.ldd, 512);
  EXPECT_TRUE(key.trans_a);
  EXPECT_FALSE(key.trans_b);
  EXPECT_FALSE(key.tf32);
  EXPECT_EQ(key.align_b, 256);  // x
  EXPECT_EQ(key.align_a, 16);   // W
  EXPECT_EQ(key.align_bias, 8);
  EXPECT_EQ(key.align_d, 4);  // y
  auto same = [&](const internal::LtPlanKey& other) { return other == key; };
  EXPECT_TRUE(
      same(internal::LinearForwardKey(f(0x50000), 64, 13, 512, f(0x60010),
                                      f(0x70008), true, false, f(0x80004))));
  // Anything that changes the plan changes the key: the batch, the ReLU,
  // the bias (0: none), TF32, x's alignment, the bias's alignment.
  struct KeyArgs {
    uintptr_t x;
    int64_t batch;
    uintptr_t bias;
    bool relu, tf32;
  };
  const KeyArgs changed[] = {
      {0x10000, 65, 0x30008, true, false}, {0x10000, 64, 0x30008, false, false},
      {0x10000, 64, 0, true, false},       {0x10000, 64, 0x30008, true, true},
      {0x10004, 64, 0x30008, true, false}, {0x10000, 64, 0x30010, true, false}};
  for (size_t i = 0; i < std::size(changed); ++i) {
    const KeyArgs& a = changed[i];
    EXPECT_FALSE(same(internal::LinearForwardKey(
        f(a.x), a.batch, 13, 512, f(0x20010), a.bias == 0 ? nullptr : f(a.bias),
        a.relu, a.tf32, f(0x40004))))
        << "change " << i;
  }
  EXPECT_EQ(internal::LinearForwardKey(f(0x10000), 64, 13, 512, f(0x20010),
                                       nullptr, false, false, f(0x40004))
                .align_bias,
            0);
  // The bf16 layers' key: another data type, never TF32.
  const internal::LtPlanKey bf16 = internal::LinearForwardKey(
      f(0x10000), 64, 13, 512, f(0x20010), f(0x30008), true, true, f(0x40004),
      CUDA_R_16BF);
  EXPECT_EQ(key.data_type, CUDA_R_32F);
  EXPECT_EQ(bf16.data_type, CUDA_R_16BF);
  EXPECT_FALSE(bf16.tf32);
  EXPECT_FALSE(same(bf16));
}

// ---------------------------------------------------------------- bf16

// The bound on the difference between two fp32 sums of the same k exact
// products (bf16 x bf16 is exact in fp32: 8 x 8 significant bits) in
// different orders: each is within (k - 1) ulp-sized errors of the exact
// sum, relative to sum |a b| = abs_sum; oneDNN rounds to nearest (2^-24),
// tensor cores may truncate in their fp32 accumulation (up to 2^-23).
double Bf16SumBound(int64_t k, double abs_sum) {
  return (0x1p-24 + 0x1p-23) * static_cast<double>(k) * abs_sum;
}

// `got` and `want`: the product C = A B of a `rows` x `k` and a `k` x
// `cols` matrix of bf16 values (elements a(m, j) and b(j, n)), each summed
// in fp32 in its own order. Each got[m * cols + n] must be within
// Bf16SumBound(k, sum_j |a b|) plus `want_rel` |want| of want[m * cols +
// n]; `failures` counts the misses (over several calls), the first 5 named
// `what` and their place.
template <typename A, typename B>
void ExpectWithinBf16SumBound(int64_t rows, int64_t cols, int64_t k, const A& a,
                              const B& b, std::span<const float> got,
                              std::span<const float> want, double want_rel,
                              const std::string& what, int* failures) {
  for (int64_t m = 0; m < rows; ++m) {
    for (int64_t n = 0; n < cols; ++n) {
      double abs = 0;
      for (int64_t j = 0; j < k; ++j) {
        abs += std::fabs(static_cast<double>(a(m, j)) * b(j, n));
      }
      const size_t at = m * cols + n;
      const double bound =
          Bf16SumBound(k, abs) + want_rel * std::fabs(want[at]);
      if (!(std::fabs(double{got[at]} - want[at]) <= bound) &&
          (*failures)++ < 5) {
        ADD_FAILURE() << what << " " << m << "," << n << ": " << got[at]
                      << " vs " << want[at] << ", bound " << bound;
      }
    }
  }
}

std::vector<Bf16> ToHostBf16(const dlrm::cuda::DeviceBuffer<Bf16>& buf,
                             size_t n) {
  return ToHost(buf, n);
}

std::vector<Bf16> RoundedOnHost(std::span<const float> v) {
  std::vector<Bf16> out(v.size());
  ToBf16(v.data(), static_cast<int64_t>(v.size()), out.data());
  return out;
}

// RoundToBf16Kernel runs dense/bf16_round.h's ToBf16, the CPU's function
// (dense_test's SharedRoundingMatchesTheDefinitionBitwise checks it against
// the definition): the same bits on the inputs that probe every case
// (ties, NaN, infinities, denormals, overflow), an odd count.
TEST(CudaBf16Test, RoundingKernelMatchesTheHostBitwise) {
  DLRM_SKIP_WITHOUT_CUDA();
  SCOPED_TRACE(::testing::Message() << "seed " << kCudaTestSeed);
  Rng rng(kCudaTestSeed + 5);
  const std::vector<float> v = dlrm::testing::Bf16RoundingInputs(rng, 100001);
  auto in = ToDevice(v);
  auto out = ToDevice(std::vector<Bf16>(v.size(), 0x7777));
  ASSERT_TRUE(RoundToBf16(in.data(), static_cast<int64_t>(v.size()), out.data(),
                          nullptr)
                  .ok());
  const std::vector<Bf16> got = ToHostBf16(out, v.size());
  int failures = 0;
  for (size_t i = 0; i < v.size(); ++i) {
    if (got[i] != ToBf16(v[i]) && failures++ < 5) {
      ADD_FAILURE() << "element " << i << ": device " << got[i] << ", host "
                    << ToBf16(v[i]);
    }
  }
  EXPECT_EQ(failures, 0);
}

class CudaBf16LinearTest : public CudaCaseTest<LinearCase> {};

// LinearForwardBf16 / LinearBackwardBf16 against dense::Linear's bf16
// passes on the same inputs. The bf16 operands are the same bits (the
// rounding kernel is the CPU's function: checked here too), so y, dW and
// dx differ only in the fp32 summation order: each element within
// Bf16SumBound of its own products' magnitudes, plus one fp32 rounding of
// y for the bias add. What is not a sum is bitwise: the bf16 copy of y is
// y_gpu rounded, the masked dy, its bf16 copy and the bias gradient (the
// CPU's block order) equal the CPU's.
TEST_P(CudaBf16LinearTest, ForwardAndBackwardMatchCpuBf16Linear) {
  const LinearCase c = GetParam();
  Rng rng(kCudaTestSeed + c.in * 37 + c.out);
  Linear cpu = RandomLinear(c, rng);
  cpu.SyncBf16Weights();
  const std::vector<float> x = RandomFloats(rng, c.batch * c.in);
  const std::vector<Bf16> xb = RoundedOnHost(x);
  const std::vector<float> w(cpu.weight(), cpu.weight() + c.in * c.out);
  const std::vector<Bf16> wb = RoundedOnHost(w);
  std::vector<float> y(c.batch * c.out);
  std::vector<Bf16> yb(c.batch * c.out);
  cpu.ForwardBf16(xb.data(), c.batch, y.data(), yb.data());

  auto blas = StreamAndBlas::Create(c.options);
  ASSERT_TRUE(blas.ok()) << blas.status();
  // The operands rounded on the device, as the backend does.
  auto w_d = ToDevice(w);
  auto x_d = ToDevice(x);
  auto wb_d = ToDevice(std::vector<Bf16>(wb.size() + 1, 0x7777));
  auto xb_d = ToDevice(std::vector<Bf16>(xb.size() + 1, 0x7777));
  ASSERT_TRUE(RoundToBf16(w_d.data(), static_cast<int64_t>(w.size()),
                          wb_d.data(), blas->stream.get())
                  .ok());
  ASSERT_TRUE(RoundToBf16(x_d.data(), static_cast<int64_t>(x.size()),
                          xb_d.data(), blas->stream.get())
                  .ok());
  ASSERT_TRUE(blas->stream.Synchronize().ok());
  ASSERT_EQ(ToHostBf16(wb_d, wb.size()), wb);
  ASSERT_EQ(ToHostBf16(xb_d, xb.size()), xb);
  const std::vector<float> b(cpu.bias(), cpu.bias() + c.out);
  auto b_d = ToDevice(b);
  auto y_d = Poisoned(y.size());
  auto yb_d = ToDevice(std::vector<Bf16>(yb.size() + 1, 0x7777));
  ASSERT_TRUE(LinearForwardBf16(blas->ctx.get(), xb_d.data(), c.batch, c.in,
                                c.out, wb_d.data(), b_d.data(), c.relu,
                                y_d.data(), yb_d.data())
                  .ok());
  ASSERT_TRUE(blas->stream.Synchronize().ok());
  const std::vector<float> y_gpu = ToHost(y_d, y.size());
  EXPECT_EQ(ToHostBf16(yb_d, yb.size()), RoundedOnHost(y_gpu));
  // The bf16 operands as matrices: x [batch x in], W^T [in x out], dy
  // [batch x out] and its transpose, W [out x in].
  const auto x_at = [&](int64_t r, int64_t i) {
    return FromBf16(xb[r * c.in + i]);
  };
  const auto wt_at = [&](int64_t i, int64_t o) {
    return FromBf16(wb[o * c.in + i]);
  };
  int failures = 0;
  ExpectWithinBf16SumBound(c.batch, c.out, c.in, x_at, wt_at, y_gpu, y,
                           /*want_rel=*/0x1p-23, "y", &failures);

  // Backward from the CPU's y, so both apply the same ReLU mask.
  const std::vector<float> dy = RandomFloats(rng, c.batch * c.out);
  std::vector<float> dy_cpu = dy;
  std::vector<float> dx(c.batch * c.in);
  std::vector<Bf16> dyb(c.batch * c.out);
  cpu.BackwardBf16(xb.data(), y.data(), dy_cpu.data(), c.batch, dx.data(),
                   dyb.data());
  auto y_cpu_d = ToDevice(y);
  auto dy_d = ToDevice(dy);
  auto dyb_d = ToDevice(std::vector<Bf16>(dyb.size() + 1, 0x7777));
  auto dw_d = Poisoned(w.size());
  auto db_d = Poisoned(c.out);
  auto dx_d = Poisoned(dx.size());
  ASSERT_TRUE(LinearBackwardBf16(blas->ctx.get(), xb_d.data(), y_cpu_d.data(),
                                 dy_d.data(), c.batch, c.in, c.out, wb_d.data(),
                                 c.relu, dw_d.data(), db_d.data(), dx_d.data(),
                                 dyb_d.data())
                  .ok());
  ASSERT_TRUE(blas->stream.Synchronize().ok());
  ExpectBitwiseEqual(ToHost(dy_d, dy.size()), dy_cpu, "masked dy");
  EXPECT_EQ(ToHostBf16(dyb_d, dyb.size()), dyb);
  ExpectBitwiseEqual(ToHost(db_d, c.out),
                     std::span<const float>(cpu.bias_grad(), c.out), "db");
  const std::vector<float> dw_gpu = ToHost(dw_d, w.size());
  const std::vector<float> dx_gpu = ToHost(dx_d, dx.size());
  const auto dyt_at = [&](int64_t o, int64_t r) {
    return FromBf16(dyb[r * c.out + o]);
  };
  const auto dy_at = [&](int64_t r, int64_t o) {
    return FromBf16(dyb[r * c.out + o]);
  };
  const auto w_at = [&](int64_t o, int64_t i) {
    return FromBf16(wb[o * c.in + i]);
  };
  // dW = dy^T x, dx = dy W.
  ExpectWithinBf16SumBound(c.out, c.in, c.batch, dyt_at, x_at, dw_gpu,
                           std::span<const float>(cpu.weight_grad(), w.size()),
                           /*want_rel=*/0, "dW", &failures);
  ExpectWithinBf16SumBound(c.batch, c.in, c.out, dy_at, w_at, dx_gpu, dx,
                           /*want_rel=*/0, "dx", &failures);
  EXPECT_EQ(failures, 0);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, CudaBf16LinearTest,
    ::testing::ValuesIn(LinearCases({
        LinearCase{131, 70, 300, false, Options(false, false)},
        // TF32 asked for: the bf16 layers ignore it.
        LinearCase{1000, 367, 512, true, Options(true, true)},
    })),
    CaseName<LinearCase>);

TEST(CudaBf16LinearTest, EmptyBatchZeroesGradients) {
  DLRM_SKIP_WITHOUT_CUDA();
  ExpectEmptyBatchZeroesGradients(/*bf16=*/true);
}

struct InteractionCase {
  int64_t batch;
  int n, d;
};

std::string Name(const InteractionCase& c) {
  return absl::StrCat("b", c.batch, "_n", c.n, "_d", c.d);
}
void PrintTo(const InteractionCase& c, std::ostream* os) { *os << Name(c); }

class CudaInteractionTest : public CudaCaseTest<InteractionCase> {};

TEST_P(CudaInteractionTest, ForwardAndBackwardMatchReference) {
  const InteractionCase c = GetParam();
  Rng rng(kCudaTestSeed + c.n * 100 + c.d);
  const int zdim = DotInteractionDim(c.n, c.d);
  const std::vector<float> t = RandomFloats(rng, c.batch * c.n * c.d);
  std::vector<float> z(c.batch * zdim);
  reference::DotInteractionForward(t.data(), c.batch, c.n, c.d, z.data());
  auto t_d = ToDevice(t);
  auto z_d = Poisoned(z.size());
  ASSERT_TRUE(
      DotInteractionForward(t_d.data(), c.batch, c.n, c.d, z_d.data(), nullptr)
          .ok());
  // Same order of products and sums; the host compiler may fuse them.
  ExpectCloseToScale(ToHost(z_d, z.size()), z, 1e-5, "z");

  const std::vector<float> dz = RandomFloats(rng, z.size());
  std::vector<float> dt(t.size());
  reference::DotInteractionBackward(t.data(), dz.data(), c.batch, c.n, c.d,
                                    dt.data());
  auto dz_d = ToDevice(dz);
  auto dt_d = Poisoned(t.size());
  ASSERT_TRUE(DotInteractionBackward(t_d.data(), dz_d.data(), c.batch, c.n, c.d,
                                     dt_d.data(), nullptr)
                  .ok());
  ExpectCloseToScale(ToHost(dt_d, dt.size()), dt, 1e-5, "dt");
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, CudaInteractionTest,
    ::testing::Values(InteractionCase{512, 27, 16},  // Criteo Kaggle
                      InteractionCase{33, 27, 128},  // MLPerf DLRM v1
                      InteractionCase{5, 1, 8}, InteractionCase{3, 2, 3},
                      InteractionCase{17, 9, 7}, InteractionCase{0, 27, 16}),
    CaseName<InteractionCase>);

struct CrossCase {
  int64_t batch;
  int n, layers, r;
};

std::string Name(const CrossCase& c) {
  return absl::StrCat("b", c.batch, "_n", c.n, "_l", c.layers, "_r", c.r);
}
void PrintTo(const CrossCase& c, std::ostream* os) { *os << Name(c); }

class CudaCrossNetTest : public CudaCaseTest<CrossCase> {};

// A CPU cross network of `c`'s shape with random parameters, biases
// included (Init leaves them zero, which would hide a bias bug).
CrossNet RandomCrossNet(const CrossCase& c, Rng& rng) {
  CrossNet cpu(c.n, c.layers, c.r);
  cpu.Init(&rng);
  for (int l = 0; l < c.layers; ++l) {
    const std::vector<float> b = RandomFloats(rng, c.n);
    std::copy(b.begin(), b.end(), cpu.bias(l));
  }
  return cpu;
}

// A cross network's passes on one batch: the training forward's x_L, the
// inference forward's (the device's only) and the backward's dx0.
struct CrossPasses {
  std::vector<float> out, infer, dx0;
};

// `cpu`'s training forward and backward on `x0` and `dout`.
CrossPasses RunOnCpu(CrossNet& cpu, const std::vector<float>& x0,
                     const std::vector<float>& dout, int64_t batch) {
  CrossPasses p;
  p.out.resize(x0.size());
  p.dx0.resize(x0.size());
  cpu.Forward(x0.data(), batch, p.out.data());
  cpu.Backward(x0.data(), dout.data(), batch, p.dx0.data());
  return p;
}

// Copies `cpu`'s parameters into `gpu`, of the same shape `c`.
void CopyParameters(const CrossNet& cpu, const CrossCase& c,
                    DeviceCrossNet& gpu) {
  const size_t matrix = static_cast<size_t>(c.n) * c.r;
  for (int l = 0; l < c.layers; ++l) {
    ASSERT_TRUE(gpu.v(l) != nullptr);
    ASSERT_EQ(cudaMemcpy(gpu.v(l), cpu.v(l), sizeof(float) * matrix,
                         cudaMemcpyHostToDevice),
              cudaSuccess);
    ASSERT_EQ(cudaMemcpy(gpu.w(l), cpu.w(l), sizeof(float) * matrix,
                         cudaMemcpyHostToDevice),
              cudaSuccess);
    ASSERT_EQ(cudaMemcpy(gpu.bias(l), cpu.bias(l), sizeof(float) * c.n,
                         cudaMemcpyHostToDevice),
              cudaSuccess);
  }
}

// `gpu`'s training forward, inference forward and backward on `x0` and
// `dout`, on `blas`'s stream, waited for; the outputs into `passes`.
void RunOnDevice(const StreamAndBlas& blas, DeviceCrossNet& gpu,
                 const std::vector<float>& x0, const std::vector<float>& dout,
                 int64_t batch, CrossPasses* passes) {
  auto x0_d = ToDevice(x0);
  auto dout_d = ToDevice(dout);
  auto out_d = Poisoned(x0.size());
  auto infer_d = Poisoned(x0.size());
  auto dx0_d = Poisoned(x0.size());
  dlrm::cuda::DeviceBuffer<float> scratch;
  BlasContext* ctx = blas.ctx.get();
  ASSERT_TRUE(gpu.Forward(ctx, x0_d.data(), batch, out_d.data()).ok());
  ASSERT_TRUE(
      gpu.Infer(ctx, x0_d.data(), batch, infer_d.data(), &scratch).ok());
  ASSERT_TRUE(
      gpu.Backward(ctx, x0_d.data(), dout_d.data(), batch, dx0_d.data()).ok());
  ASSERT_TRUE(blas.stream.Synchronize().ok());
  passes->out = ToHost(out_d, x0.size());
  passes->infer = ToHost(infer_d, x0.size());
  passes->dx0 = ToHost(dx0_d, x0.size());
}

// `n` floats of device memory at `device`, copied to the host.
std::vector<float> DeviceFloats(const float* device, size_t n) {
  std::vector<float> host(n);
  EXPECT_EQ(cudaMemcpy(host.data(), device, sizeof(float) * n,
                       cudaMemcpyDeviceToHost),
            cudaSuccess);
  return host;
}

// Every layer's dV, dW and db of `gpu` against `cpu`'s through `expect`
// (got, want, what).
void ExpectLayerGradients(
    const CrossNet& cpu, const DeviceCrossNet& gpu, const CrossCase& c,
    const std::function<void(std::span<const float>, std::span<const float>,
                             const std::string&)>& expect) {
  const size_t matrix = static_cast<size_t>(c.n) * c.r;
  for (int l = 0; l < c.layers; ++l) {
    SCOPED_TRACE(::testing::Message() << "layer " << l);
    expect(DeviceFloats(gpu.v_grad(l), matrix),
           std::span<const float>(cpu.v_grad(l), matrix), "dV");
    expect(DeviceFloats(gpu.w_grad(l), matrix),
           std::span<const float>(cpu.w_grad(l), matrix), "dW");
    expect(DeviceFloats(gpu.bias_grad(l), c.n),
           std::span<const float>(cpu.bias_grad(l), c.n), "db");
  }
}

// DeviceCrossNet against dense::CrossNet (the CPU reference) with the same
// parameters: the training forward, the inference forward, the backward's
// input gradient and every parameter gradient. GEMMs sum in another order:
// 1e-4 of the scale (the bias gradient is summed in the CPU's order, but
// from inputs that already differ in the last bits).
TEST_P(CudaCrossNetTest, MatchesCpuCrossNet) {
  const CrossCase c = GetParam();
  Rng rng(kCudaTestSeed + c.n * 7 + c.r);
  CrossNet cpu = RandomCrossNet(c, rng);
  const std::vector<float> x0 = RandomFloats(rng, c.batch * c.n);
  const std::vector<float> dout = RandomFloats(rng, c.batch * c.n);
  const CrossPasses want = RunOnCpu(cpu, x0, dout, c.batch);

  auto blas = StreamAndBlas::Create();
  ASSERT_TRUE(blas.ok()) << blas.status();
  auto gpu = DeviceCrossNet::Create(c.n, c.layers, c.r);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  ASSERT_NO_FATAL_FAILURE(CopyParameters(cpu, c, **gpu));
  CrossPasses got;
  ASSERT_NO_FATAL_FAILURE(RunOnDevice(*blas, **gpu, x0, dout, c.batch, &got));
  ExpectCloseToScale(got.out, want.out, 1e-4, "x_L");
  // The same kernels and GEMM shapes as the training forward.
  ExpectCloseToScale(got.infer, got.out, 1e-6, "inference x_L");
  ExpectCloseToScale(got.dx0, want.dx0, 1e-4, "dx0");
  ExpectLayerGradients(
      cpu, **gpu, c,
      [](std::span<const float> g, std::span<const float> w,
         const std::string& what) { ExpectCloseToScale(g, w, 1e-4, what); });
}

// ||a - b|| / ||b|| (0 for empty vectors).
double NormError(std::span<const float> a, std::span<const float> b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    const double d = static_cast<double>(a[i]) - b[i];
    num += d * d;
    den += static_cast<double>(b[i]) * b[i];
  }
  return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}

// The bound of the bf16 comparisons below between the CUDA and the CPU
// bf16 passes. Both round the same values with the same function and sum
// the same exact products in fp32, in different orders (Bf16SumBound); the
// first layer's bf16 operands are the same bits. Further in, an fp32 value
// the two compute ulps apart can straddle a bf16 rounding boundary, and
// the two bf16 copies then differ by one bf16 ulp (2^-7 relative at most)
// in that one operand of the next sums; such flips hit a fraction of about
// k 2^-24 / 2^-8 = k 2^-16 of the rounded values (k the sums' lengths),
// each moving the outputs it feeds by at most 2^-7 of one term. Measured
// on the CPU for CudaCrossNetTest's shapes, with the same roundings and
// every GEMM summed in double instead (the other order as far as it can
// go; tensor cores that truncate may double the sums' differences): at
// most 5.3e-3 of the scale per element and 2.5e-4 in norm (x_L, dx0 and
// the gradients at N = 432, r = 128, 3 layers; below 1e-6 at the other
// shapes). Hence 2e-2 of the scale per element (ExpectCloseToScale) and
// 2e-3 in norm: a pass that skipped a rounding or read an fp32 operand
// differs by bf16's own error instead, ~1e-2 in norm (dense_test's
// CrossNetTracksTheReferenceAndItsFp32Twin against fp32).
constexpr double kBf16ScaleTolerance = 2e-2;
constexpr double kBf16NormTolerance = 2e-3;

void ExpectBf16Close(std::span<const float> got, std::span<const float> want,
                     const std::string& what) {
  ExpectCloseToScale(got, want, kBf16ScaleTolerance, what);
  EXPECT_LT(NormError(got, want), kBf16NormTolerance) << what;
}

// DeviceCrossNet at PRECISION_BF16 against dense::CrossNet at
// PRECISION_BF16 with the same parameters: the training and the inference
// forward, the backward's input gradient and every parameter gradient,
// within kBf16ScaleTolerance / kBf16NormTolerance. Inference runs the
// training forward's arithmetic: the same bits.
TEST_P(CudaCrossNetTest, Bf16MatchesCpuBf16CrossNet) {
  const CrossCase c = GetParam();
  Rng rng(kCudaTestSeed + c.n * 11 + c.r);
  CrossNet cpu = RandomCrossNet(c, rng);
  cpu.SetPrecision(PRECISION_BF16);
  const std::vector<float> x0 = RandomFloats(rng, c.batch * c.n);
  const std::vector<float> dout = RandomFloats(rng, c.batch * c.n);
  const CrossPasses want = RunOnCpu(cpu, x0, dout, c.batch);

  auto blas = StreamAndBlas::Create();
  ASSERT_TRUE(blas.ok()) << blas.status();
  auto gpu = DeviceCrossNet::Create(c.n, c.layers, c.r, PRECISION_BF16);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  EXPECT_EQ((*gpu)->precision(), PRECISION_BF16);
  ASSERT_NO_FATAL_FAILURE(CopyParameters(cpu, c, **gpu));
  ASSERT_TRUE((*gpu)->SyncBf16Weights(blas->stream.get()).ok());
  CrossPasses got;
  ASSERT_NO_FATAL_FAILURE(RunOnDevice(*blas, **gpu, x0, dout, c.batch, &got));
  ExpectBf16Close(got.out, want.out, "x_L");
  ExpectBitwiseEqual(got.infer, got.out, "inference x_L");
  ExpectBf16Close(got.dx0, want.dx0, "dx0");
  ExpectLayerGradients(cpu, **gpu, c, ExpectBf16Close);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, CudaCrossNetTest,
    ::testing::Values(CrossCase{256, 432, 3, 128},  // 27 vectors of 16
                      CrossCase{130, 40, 2, 64},    // rank above the width
                      CrossCase{7, 16, 1, 4}, CrossCase{65, 12, 4, 3},
                      CrossCase{0, 16, 3, 4}),
    CaseName<CrossCase>);

TEST(CudaLossTest, BceMatchesCpu) {
  DLRM_SKIP_WITHOUT_CUDA();
  SCOPED_TRACE(::testing::Message() << "seed " << kCudaTestSeed);
  Rng rng(kCudaTestSeed + 5);
  for (int64_t batch :
       {int64_t{0}, int64_t{1}, int64_t{1000}, int64_t{65536}}) {
    // Logits up to +-40: exp(-|z|) underflows nowhere it matters, and the
    // large ones test the stable form.
    std::vector<float> logits = RandomFloats(rng, batch, 8.0);
    if (batch > 1) logits[0] = 40.0f, logits[1] = -40.0f;
    std::vector<float> labels(batch);
    for (float& y : labels) y = rng.Below(2) == 0 ? 0.0f : 1.0f;
    const float scale = batch > 0 ? 1.0f / batch : 1.0f;
    std::vector<float> grad(batch);
    const double loss = dense::BceWithLogits(logits.data(), labels.data(),
                                             batch, scale, grad.data());
    auto logits_d = ToDevice(logits);
    auto labels_d = ToDevice(labels);
    auto grad_d = Poisoned(batch);
    auto loss_d = dlrm::cuda::DeviceBuffer<double>::Allocate(1);
    ASSERT_TRUE(loss_d.ok());
    ASSERT_TRUE(dense::cuda::BceWithLogits(logits_d.data(), labels_d.data(),
                                           batch, scale, grad_d.data(),
                                           loss_d->data(), nullptr)
                    .ok());
    const double loss_gpu = ToHost(*loss_d, 1)[0];
    EXPECT_NEAR(loss_gpu, loss, 1e-12 * std::max(1.0, std::fabs(loss)))
        << "batch " << batch;
    ExpectCloseToScale(ToHost(grad_d, batch), grad, 1e-6, "dlogits");
  }
}

// Writes the packed constants of step `step` of `config` into `device`
// (kConstantDoubles doubles of device memory), synchronously: what the
// update kernels read.
constexpr size_t kConstantDoubles =
    optim::PackedStep::kMaxBytes / sizeof(double);
absl::Status WriteConstants(const OptimizerConfig& config, int64_t step,
                            dlrm::cuda::DeviceBuffer<double>& device) {
  ASSIGN_OR_RETURN(const optim::PackedStep packed,
                   optim::MakePackedStep(config, step));
  double host[kConstantDoubles];
  std::memcpy(host, packed.bytes.data(), sizeof(host));
  return device.CopyFromHost(std::span<const double>(host));
}

// `type` at `rate` with `eps`, betas 0.9 and 0.999, and a warm-up of 3
// steps from half the rate: the kernels read each step's rate from the
// constants.
OptimizerConfig WarmUpConfig(OptimizerConfig::Type type, float rate,
                             float eps) {
  OptimizerConfig config;
  config.set_type(type);
  config.set_learning_rate(rate);
  config.set_eps(eps);
  config.set_beta1(0.9f);
  config.set_beta2(0.999f);
  config.mutable_schedule()->set_warmup_steps(3);
  config.mutable_schedule()->set_warmup_start_factor(0.5f);
  return config;
}

TEST(CudaDenseOptimizerTest, MatchesCpuDenseOptimizer) {
  DLRM_SKIP_WITHOUT_CUDA();
  SCOPED_TRACE(::testing::Message() << "seed " << kCudaTestSeed);
  for (auto type : {OptimizerConfig::SGD, OptimizerConfig::ADAGRAD,
                    OptimizerConfig::ADAM}) {
    SCOPED_TRACE(OptimizerConfig::Type_Name(type));
    Rng rng(kCudaTestSeed + type);
    OptimizerConfig config = WarmUpConfig(
        type, type == OptimizerConfig::SGD ? 0.1f : 0.01f, /*eps=*/1e-8f);
    config.set_initial_accumulator(0.1f);
    const int64_t n = 70001;  // Not a multiple of the block.
    std::vector<float> param = RandomFloats(rng, n);
    std::vector<float> grad(n);
    auto opt = DenseOptimizer::Create(
        config, {ParamRef{"p", param.data(), grad.data(), n}});
    ASSERT_TRUE(opt.ok()) << opt.status();
    auto p_d = ToDevice(param);
    auto g_d = Poisoned(n);
    auto s1_d = ToDevice(std::vector<float>(
        n, type == OptimizerConfig::ADAGRAD ? config.initial_accumulator()
                                            : 0.0f));
    auto s2_d = ToDevice(std::vector<float>(n, 0.0f));
    auto constants_d = ToDevice(std::vector<double>(kConstantDoubles, 0.0));
    for (int64_t step = 1; step <= 3; ++step) {
      // In place: the optimizer holds a pointer into `grad`.
      const std::vector<float> fresh = RandomFloats(rng, n);
      std::copy(fresh.begin(), fresh.end(), grad.begin());
      (*opt)->Step();
      ASSERT_TRUE(g_d.CopyFromHost(std::span<const float>(grad)).ok());
      const absl::Status written = WriteConstants(config, step, constants_d);
      ASSERT_TRUE(written.ok()) << written;
      ASSERT_TRUE(DenseOptimizerUpdate(type, constants_d.data(), p_d.data(),
                                       g_d.data(), s1_d.data(), s2_d.data(), n,
                                       nullptr)
                      .ok());
    }
    // Both run the rule's DenseElement unfused, so the bits should agree;
    // a tolerance until that is confirmed on a device.
    ExpectCloseToScale(ToHost(p_d, n), param, 1e-5, "param");
    const std::vector<ParamRef> state = (*opt)->State();
    if (!state.empty()) {
      ExpectCloseToScale(ToHost(s1_d, n),
                         std::span<const float>(state[0].value, n), 1e-5,
                         state[0].name);
    }
    if (state.size() > 1) {
      ExpectCloseToScale(ToHost(s2_d, n),
                         std::span<const float>(state[1].value, n), 1e-5,
                         state[1].name);
    }
  }
}

// LayerOptimizerUpdate (LAMB, LARS) against DenseOptimizer over several
// tensors as one optimizer would see them: a weight over several norm
// chunks and not a multiple of one, exactly two chunks, one element, a
// bias (no decay, ratio 1) and an all-zero weight (ratio 1), four steps of
// a warm-up schedule. The norms are summed in another order than the
// CPU's (equal within double rounding; the tensor's rate is rounded to
// float from them, so it can move by an ulp): 1e-5 of scale. A second run
// on the device gives the same bits.
TEST(CudaDenseOptimizerTest, LayerWiseMatchCpuDenseOptimizer) {
  DLRM_SKIP_WITHOUT_CUDA();
  SCOPED_TRACE(::testing::Message() << "seed " << kCudaTestSeed);
  struct Tensor {
    std::string name;
    int64_t size;
    bool zero;
  };
  const std::vector<Tensor> tensors = {
      {"l0.weight", 70001, false}, {"l0.bias", 513, false},
      {"l1.weight", 8192, false},  {"l1.bias", 1, false},
      {"l2.weight", 1, false},     {"zero.weight", 300, true}};
  for (auto type : {OptimizerConfig::LAMB, OptimizerConfig::LARS}) {
    SCOPED_TRACE(OptimizerConfig::Type_Name(type));
    Rng rng(kCudaTestSeed + type);
    OptimizerConfig config = WarmUpConfig(
        type, type == OptimizerConfig::LAMB ? 0.01f : 0.5f, /*eps=*/1e-6f);
    config.set_weight_decay(0.01f);
    if (type == OptimizerConfig::LARS) {
      config.set_momentum(0.9f);
      config.set_trust_coefficient(0.001f);
    }
    ASSERT_TRUE(optim::Validate(config, "dense_optimizer").ok());

    std::vector<std::vector<float>> params, grads;
    std::vector<ParamRef> refs;
    for (const Tensor& t : tensors) {
      params.push_back(t.zero ? std::vector<float>(t.size, 0.0f)
                              : RandomFloats(rng, t.size));
      grads.emplace_back(t.size);
    }
    for (size_t i = 0; i < tensors.size(); ++i) {
      refs.push_back({tensors[i].name, params[i].data(), grads[i].data(),
                      tensors[i].size});
    }
    const std::vector<std::vector<float>> initial = params;
    auto opt = DenseOptimizer::Create(config, refs);
    ASSERT_TRUE(opt.ok()) << opt.status();
    constexpr int kSteps = 4;
    std::vector<std::vector<std::vector<float>>> step_grads(kSteps);
    for (int step = 0; step < kSteps; ++step) {
      for (size_t i = 0; i < tensors.size(); ++i) {
        step_grads[step].push_back(RandomFloats(rng, tensors[i].size));
        std::copy(step_grads[step][i].begin(), step_grads[step][i].end(),
                  grads[i].begin());
      }
      (*opt)->Step();
    }
    const std::vector<ParamRef> cpu_state = (*opt)->State();
    const size_t arrays = optim::DenseState(config).size();
    ASSERT_EQ(cpu_state.size(), arrays * tensors.size());

    // The device's parameters and state after the same steps, from the
    // same initial values.
    struct DeviceResult {
      std::vector<std::vector<float>> params, state;
    };
    auto run = [&]() {
      DeviceResult r;
      std::vector<dlrm::cuda::DeviceBuffer<float>> p_d, g_d, s1_d, s2_d;
      for (size_t i = 0; i < tensors.size(); ++i) {
        p_d.push_back(ToDevice(initial[i]));
        g_d.push_back(Poisoned(tensors[i].size));
        s1_d.push_back(ToDevice(std::vector<float>(tensors[i].size, 0.0f)));
        s2_d.push_back(ToDevice(std::vector<float>(tensors[i].size, 0.0f)));
      }
      dlrm::cuda::DeviceBuffer<double> scratch;
      auto constants_d = ToDevice(std::vector<double>(kConstantDoubles, 0.0));
      for (int step = 0; step < kSteps; ++step) {
        const absl::Status written =
            WriteConstants(config, step + 1, constants_d);
        EXPECT_TRUE(written.ok()) << written;
        if (!written.ok()) return r;
        for (size_t i = 0; i < tensors.size(); ++i) {
          EXPECT_TRUE(
              g_d[i]
                  .CopyFromHost(std::span<const float>(step_grads[step][i]))
                  .ok());
          const absl::Status st = LayerOptimizerUpdate(
              type, constants_d.data(), AdaptsLayerWise(tensors[i].name),
              p_d[i].data(), g_d[i].data(), s1_d[i].data(),
              arrays > 1 ? s2_d[i].data() : nullptr, tensors[i].size, &scratch,
              nullptr);
          EXPECT_TRUE(st.ok()) << st;
        }
      }
      for (size_t i = 0; i < tensors.size(); ++i) {
        r.params.push_back(ToHost(p_d[i], tensors[i].size));
        r.state.push_back(ToHost(s1_d[i], tensors[i].size));
        if (arrays > 1) r.state.push_back(ToHost(s2_d[i], tensors[i].size));
      }
      return r;
    };
    const DeviceResult got = run();
    ASSERT_EQ(got.params.size(), tensors.size());
    for (size_t i = 0; i < tensors.size(); ++i) {
      SCOPED_TRACE(tensors[i].name);
      ExpectCloseToScale(got.params[i], params[i], 1e-5, "param");
      for (size_t k = 0; k < arrays; ++k) {
        const ParamRef& want = cpu_state[i * arrays + k];
        ExpectCloseToScale(got.state[i * arrays + k],
                           std::span<const float>(want.value, want.size), 1e-5,
                           want.name);
      }
    }
    const DeviceResult again = run();
    for (size_t i = 0; i < tensors.size(); ++i) {
      ExpectBitwiseEqual(again.params[i], got.params[i], "second run");
    }
  }
}

// Update's launches captured once and replayed, as the CUDA backend runs
// them with graphs on, read each step's constants from device memory: four
// steps of a warm-up schedule (a new rate every step), the first plain, the
// second captured, the last two replayed, give the bits of four plain
// launches, for every dense optimizer. The constants go up with a copy on
// the stream before each step's launches, as the backend queues them.
TEST(CudaDenseOptimizerTest, CapturedUpdateReadsEachStepsConstants) {
  DLRM_SKIP_WITHOUT_CUDA();
  SCOPED_TRACE(::testing::Message() << "seed " << kCudaTestSeed);
  const std::vector<std::string> names = {"l0.weight", "l0.bias"};
  const std::vector<int64_t> sizes = {70001, 513};
  constexpr int kSteps = 4;
  for (auto type :
       {OptimizerConfig::SGD, OptimizerConfig::ADAGRAD, OptimizerConfig::ADAM,
        OptimizerConfig::LAMB, OptimizerConfig::LARS}) {
    SCOPED_TRACE(OptimizerConfig::Type_Name(type));
    Rng rng(kCudaTestSeed + type);
    OptimizerConfig config;
    config.set_type(type);
    config.set_initial_accumulator(0.1f);
    if (type == OptimizerConfig::LAMB || type == OptimizerConfig::LARS) {
      config.set_weight_decay(0.01f);
    }
    if (type == OptimizerConfig::LARS) config.set_momentum(0.9f);
    config.mutable_schedule()->set_warmup_steps(3);
    config.mutable_schedule()->set_warmup_start_factor(0.5f);
    optim::SetDefaults(&config);
    ASSERT_TRUE(optim::Validate(config, "dense_optimizer").ok());
    const bool layer_wise =
        type == OptimizerConfig::LAMB || type == OptimizerConfig::LARS;
    const float s1_initial =
        type == OptimizerConfig::ADAGRAD ? config.initial_accumulator() : 0.0f;
    std::vector<std::vector<float>> initial;
    std::vector<std::vector<std::vector<float>>> step_grads(kSteps);
    for (size_t i = 0; i < sizes.size(); ++i) {
      initial.push_back(RandomFloats(rng, sizes[i]));
      for (int step = 0; step < kSteps; ++step) {
        step_grads[step].push_back(RandomFloats(rng, sizes[i]));
      }
    }

    // Parameters then both state arrays, per tensor, after kSteps steps.
    auto run = [&](bool graphs) {
      std::vector<std::vector<float>> out;
      auto stream = dlrm::cuda::CudaStream::Create();
      EXPECT_TRUE(stream.ok()) << stream.status();
      if (!stream.ok()) return out;
      std::vector<dlrm::cuda::DeviceBuffer<float>> p_d, g_d, s1_d, s2_d;
      for (size_t i = 0; i < sizes.size(); ++i) {
        p_d.push_back(ToDevice(initial[i]));
        g_d.push_back(Poisoned(sizes[i]));
        s1_d.push_back(ToDevice(std::vector<float>(sizes[i], s1_initial)));
        s2_d.push_back(ToDevice(std::vector<float>(sizes[i], 0.0f)));
      }
      auto constants_d = ToDevice(std::vector<double>(kConstantDoubles, 0.0));
      // Sized up front, as the backend does: no growth inside a capture.
      auto scratch = dlrm::cuda::DeviceBuffer<double>::Allocate(
          static_cast<size_t>(LayerScratchDoubles(sizes[0])));
      EXPECT_TRUE(scratch.ok()) << scratch.status();
      if (!scratch.ok()) return out;
      auto launches = [&]() -> absl::Status {
        for (size_t i = 0; i < sizes.size(); ++i) {
          RETURN_IF_ERROR(
              layer_wise
                  ? LayerOptimizerUpdate(
                        type, constants_d.data(), AdaptsLayerWise(names[i]),
                        p_d[i].data(), g_d[i].data(), s1_d[i].data(),
                        s2_d[i].data(), sizes[i], &*scratch, stream->get())
                  : DenseOptimizerUpdate(type, constants_d.data(),
                                         p_d[i].data(), g_d[i].data(),
                                         s1_d[i].data(), s2_d[i].data(),
                                         sizes[i], stream->get()));
        }
        return absl::OkStatus();
      };
      std::optional<dlrm::cuda::CudaGraphExec> graph;
      for (int step = 0; step < kSteps; ++step) {
        for (size_t i = 0; i < sizes.size(); ++i) {
          EXPECT_TRUE(
              g_d[i]
                  .CopyFromHost(std::span<const float>(step_grads[step][i]))
                  .ok());
        }
        auto packed = optim::MakePackedStep(config, step + 1);
        EXPECT_TRUE(packed.ok()) << packed.status();
        if (!packed.ok()) return out;
        EXPECT_EQ(cudaMemcpyAsync(constants_d.data(), packed->bytes.data(),
                                  packed->size, cudaMemcpyHostToDevice,
                                  stream->get()),
                  cudaSuccess);
        absl::Status st;
        if (!graphs || step == 0) {
          st = launches();
        } else if (step == 1) {
          st = dlrm::cuda::BeginCapture(stream->get());
          if (st.ok()) {
            const absl::Status work = launches();
            auto exec = dlrm::cuda::CudaGraphExec::EndCapture(stream->get());
            st = work.ok() ? exec.status() : work;
            if (st.ok()) {
              graph = std::move(*exec);
              st = graph->Launch(stream->get());
            }
          }
        } else {
          st = graph->Launch(stream->get());
        }
        EXPECT_TRUE(st.ok()) << "step " << step + 1 << ": " << st;
        if (!st.ok()) return out;
        EXPECT_TRUE(stream->Synchronize().ok());
      }
      for (size_t i = 0; i < sizes.size(); ++i) {
        out.push_back(ToHost(p_d[i], sizes[i]));
        out.push_back(ToHost(s1_d[i], sizes[i]));
        out.push_back(ToHost(s2_d[i], sizes[i]));
      }
      return out;
    };
    const std::vector<std::vector<float>> plain = run(false);
    const std::vector<std::vector<float>> graphed = run(true);
    ASSERT_EQ(plain.size(), 3 * sizes.size());
    ASSERT_EQ(graphed.size(), plain.size());
    for (size_t k = 0; k < plain.size(); ++k) {
      ExpectBitwiseEqual(graphed[k], plain[k],
                         absl::StrCat(names[k / 3], " array ", k % 3));
    }
    // The parameters moved.
    EXPECT_NE(plain[0], initial[0]);
  }
}

// Argument checks run before any CUDA call, so they hold on every machine.
TEST(CudaDenseArgsTest, BadShapesAreInvalidArgument) {
  EXPECT_EQ(
      LinearForward(nullptr, nullptr, 4, 0, 3, nullptr, nullptr, false, nullptr)
          .code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(LinearBackward(nullptr, nullptr, nullptr, nullptr, -1, 2, 3,
                           nullptr, false, nullptr, nullptr, nullptr)
                .code(),
            absl::StatusCode::kInvalidArgument);
  // 200 vectors of 64 floats (rows padded to 65 in the forward): over
  // 50 KiB of shared memory, more than the 48 KiB the kernels ask for.
  EXPECT_EQ(DotInteractionForward(nullptr, 1, 200, 64, nullptr, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DotInteractionBackward(nullptr, nullptr, 1, 0, 16, nullptr, nullptr)
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(dense::cuda::BceWithLogits(nullptr, nullptr, -1, 1.0f, nullptr,
                                       nullptr, nullptr)
                .code(),
            absl::StatusCode::kInvalidArgument);
  // The optimizers: a negative size, a type of the other kind (or none), a
  // null or misaligned constants pointer (never dereferenced here).
  alignas(8) static const double fake_constants[kConstantDoubles] = {};
  const auto* misaligned = reinterpret_cast<const char*>(fake_constants) + 2;
  // Null parameter, gradient and state pointers and no stream throughout.
  const auto update = [](OptimizerConfig::Type type, const void* constants,
                         int64_t n) {
    return DenseOptimizerUpdate(type, constants, nullptr, nullptr, nullptr,
                                nullptr, n, nullptr);
  };
  const auto layer_update = [](OptimizerConfig::Type type,
                               const void* constants, int64_t n,
                               dlrm::cuda::DeviceBuffer<double>* scratch) {
    return LayerOptimizerUpdate(type, constants, true, nullptr, nullptr,
                                nullptr, nullptr, n, scratch, nullptr);
  };
  constexpr absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;
  EXPECT_EQ(update(OptimizerConfig::SGD, fake_constants, -1).code(), kInvalid);
  EXPECT_EQ(update(OptimizerConfig::LAMB, fake_constants, 4).code(), kInvalid);
  EXPECT_EQ(update(OptimizerConfig::ADAM, nullptr, 4).code(), kInvalid);
  EXPECT_EQ(update(OptimizerConfig::ADAGRAD, misaligned, 4).code(), kInvalid);
  EXPECT_TRUE(update(OptimizerConfig::ADAM, nullptr, 0).ok());
  dlrm::cuda::DeviceBuffer<double> scratch;
  const auto lamb = OptimizerConfig::LAMB, lars = OptimizerConfig::LARS;
  EXPECT_EQ(layer_update(lamb, fake_constants, -1, &scratch).code(), kInvalid);
  EXPECT_EQ(layer_update(lars, fake_constants, 10, nullptr).code(), kInvalid);
  EXPECT_EQ(
      layer_update(OptimizerConfig::ADAM, fake_constants, 10, &scratch).code(),
      kInvalid);
  EXPECT_EQ(layer_update(lars, nullptr, 10, &scratch).code(), kInvalid);
  EXPECT_EQ(layer_update(lamb, misaligned, 10, &scratch).code(), kInvalid);
  // A parameter of no elements queues nothing.
  EXPECT_TRUE(layer_update(lars, nullptr, 0, &scratch).ok());
  // Partial sums of w^2 and of the norm term per 4096-element chunk, and
  // the tensor's constants.
  EXPECT_EQ(LayerScratchDoubles(0), 1);
  EXPECT_EQ(LayerScratchDoubles(1), 3);
  EXPECT_EQ(LayerScratchDoubles(4096), 3);
  EXPECT_EQ(LayerScratchDoubles(4097), 5);
  OptimizerConfig bad;
  bad.set_type(static_cast<OptimizerConfig::Type>(99));
  EXPECT_EQ(optim::MakeStep(bad, 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RoundToBf16(nullptr, -1, nullptr, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(RoundToBf16(nullptr, 0, nullptr, nullptr).ok());
  EXPECT_EQ(LinearForwardBf16(nullptr, nullptr, 4, 3, 0, nullptr, nullptr,
                              false, nullptr, nullptr)
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      LinearBackwardBf16(nullptr, nullptr, nullptr, nullptr, -1, 2, 3, nullptr,
                         false, nullptr, nullptr, nullptr, nullptr)
          .code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(GemmBf16(nullptr, 'N', 'N', -1, 2, 3, nullptr, 3, nullptr, 2, 0.0f,
                     nullptr, 2)
                .code(),
            absl::StatusCode::kInvalidArgument);
  GemmOptions o;
  EXPECT_TRUE(o.Validate().ok());
  o.workspace_bytes = 0;
  EXPECT_EQ(o.Validate().code(), absl::StatusCode::kInvalidArgument);
}

struct BackendCase {
  Interaction interaction;
  OptimizerConfig::Type optimizer;
};

std::string Name(const BackendCase& c) {
  return absl::StrCat(Interaction_Name(c.interaction), "_",
                      OptimizerConfig::Type_Name(c.optimizer));
}
void PrintTo(const BackendCase& c, std::ostream* os) { *os << Name(c); }

class CudaBackendTest : public CudaCaseTest<BackendCase> {};

// Steps `cpu` and `gpu` on the same random inputs of 64, 0, 131 and 7
// samples: each loss (with samples) within `loss_rel` of the CPU's, the
// rest of each pair of results through `expect` (got, want).
void ExpectStepsAlike(
    DenseBackend& cpu, DenseBackend& gpu, const ModelConfig& config, Rng& rng,
    double loss_rel,
    const std::function<void(const dlrm::testing::DenseStepResult&,
                             const dlrm::testing::DenseStepResult&)>& expect) {
  for (const int64_t batch : {64, 0, 131, 7}) {
    SCOPED_TRACE(::testing::Message() << "batch " << batch);
    const dlrm::testing::DenseStepInputs in =
        dlrm::testing::RandomDenseStep(config, batch, rng);
    auto want = dlrm::testing::RunDenseStep(cpu, in);
    ASSERT_TRUE(want.ok()) << want.status();
    auto got = dlrm::testing::RunDenseStep(gpu, in);
    ASSERT_TRUE(got.ok()) << got.status();
    if (batch > 0) {
      EXPECT_NEAR(got->loss, want->loss, loss_rel * want->loss);
    }
    expect(*got, *want);
  }
}

// Writes `cpu`'s parameter values into `gpu`'s host view (as a restore
// does), then predicts 50 random samples on both: `want` and `got`.
void PredictAfterHostWrite(DenseBackend& cpu, DenseBackend& gpu,
                           const ModelConfig& config, Rng& rng,
                           std::vector<float>* want, std::vector<float>* got) {
  const std::vector<ParamRef>& from = cpu.params();
  const std::vector<ParamRef>& to = gpu.params();
  for (size_t i = 0; i < from.size(); ++i) {
    std::copy(from[i].value, from[i].value + from[i].size, to[i].value);
  }
  const dlrm::testing::DenseStepInputs in =
      dlrm::testing::RandomDenseStep(config, 50, rng);
  want->resize(50);
  got->resize(50);
  ASSERT_TRUE(dlrm::testing::FillInteractionInput(cpu, in).ok());
  ASSERT_TRUE(cpu.Predict(in.x.data(), 50, want->data()).ok());
  ASSERT_TRUE(dlrm::testing::FillInteractionInput(gpu, in).ok());
  ASSERT_TRUE(gpu.Predict(in.x.data(), 50, got->data()).ok());
}

// The CUDA backend against the CPU one (the reference), from the same
// initial weights on the same random inputs, step after step: forward
// (loss, predictions), backward (the interaction input's gradient, every
// parameter's gradient) and the update (parameters, optimizer state), with
// a batch of 0 in between. Float GEMMs (TF32 off) in another order: a
// tolerance.
TEST_P(CudaBackendTest, MatchesCpuBackend) {
  const BackendCase c = GetParam();
  ModelConfig config =
      dlrm::testing::DenseBackendConfig(c.interaction, c.optimizer);
  auto cpu = CreateDenseBackend(config);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  config.set_device(DEVICE_CUDA);
  // Float GEMMs (TF32 is the GPU default): the tolerances below are float's.
  config.set_gpu_disable_tf32(true);
  auto gpu = CreateDenseBackend(config);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  EXPECT_EQ((*gpu)->device(), DEVICE_CUDA);
  Rng rng(kCudaTestSeed);
  ASSERT_NO_FATAL_FAILURE(ExpectStepsAlike(
      **cpu, **gpu, config, rng, /*loss_rel=*/1e-5,
      [&](const dlrm::testing::DenseStepResult& got,
          const dlrm::testing::DenseStepResult& want) {
        ExpectCloseToScale(got.dt, want.dt, 1e-4, "dt");
        ExpectCloseToScale(got.grads, want.grads, 1e-4, "gradients");
        ExpectCloseToScale(got.params, want.params, 1e-4, "parameters");
        ExpectCloseToScale(got.state, want.state, 1e-4, "optimizer state");
        ExpectCloseToScale(got.probs, want.probs, 1e-4, "predictions");
        EXPECT_EQ((*gpu)->optimizer().step(), (*cpu)->optimizer().step());
      }));
  // A write to the host view (a restore) reaches the device: with the CPU
  // backend's weights and state copied in, the two predict alike again.
  std::vector<float> want, got;
  ASSERT_NO_FATAL_FAILURE(
      PredictAfterHostWrite(**cpu, **gpu, config, rng, &want, &got));
  ExpectCloseToScale(got, want, 1e-5, "predictions after a host write");
}

// CopyParamsTo between two CUDA backends (a SnapshotPredictor's refresh),
// at fp32 (TF32 off) and bf16: the destination holds the source's weights
// bitwise, predicts as it (the same kernels on the same inputs: 1e-6 allows
// only for a GEMM algorithm cuBLASLt might pick for differently aligned
// buffers, summing in another order), keeps them while the source trains on,
// and takes the next copy; a CPU destination is refused.
TEST_P(CudaBackendTest, CopyParamsToSnapshotsOnTheDevice) {
  const BackendCase c = GetParam();
  for (DensePrecision precision : {PRECISION_FP32, PRECISION_BF16}) {
    SCOPED_TRACE(DensePrecision_Name(precision));
    ModelConfig config =
        dlrm::testing::DenseBackendConfig(c.interaction, c.optimizer);
    config.set_device(DEVICE_CUDA);
    config.set_gpu_disable_tf32(true);
    config.set_dense_precision(precision);
    dlrm::testing::ExpectCopyParamsToSnapshots(config, /*steps=*/3,
                                               /*tolerance=*/1e-6,
                                               kCudaTestSeed,
                                               /*old_way=*/false);
  }
  ModelConfig config =
      dlrm::testing::DenseBackendConfig(c.interaction, c.optimizer);
  auto cpu = CreateDenseBackend(config);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  config.set_device(DEVICE_CUDA);
  auto gpu = CreateDenseBackend(config);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  EXPECT_EQ((*gpu)->CopyParamsTo(**cpu).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ((*cpu)->CopyParamsTo(**gpu).code(),
            absl::StatusCode::kFailedPrecondition);
}

class CudaBf16BackendTest : public CudaCaseTest<BackendCase> {};

// The CUDA backend at PRECISION_BF16 against the CPU backend at
// PRECISION_BF16 (the reference) from the same initial weights on the same
// inputs, step after step (a batch of 0 in between), each on its own
// weights: loss within 1e-3 relative, the interaction input's gradient,
// every parameter's gradient, the parameters, the optimizer state and the
// predictions within kBf16ScaleTolerance / kBf16NormTolerance (see there).
// SGD, whose update is linear in the gradient (Adagrad's and Adam's first
// steps are lr * sign(g) and would turn a near-zero gradient's last bits
// into a full step). Skipped where the CPU runs PRECISION_BF16 as fp32
// (no bf16 instructions); the layer tests above compare against
// dense::Linear's bf16 passes on any CPU.
TEST_P(CudaBf16BackendTest, MatchesCpuBf16Backend) {
  if (!CpuHasBf16()) {
    GTEST_SKIP() << "this CPU has no bf16 instructions: its backend runs "
                    "PRECISION_BF16 as fp32";
  }
  const BackendCase c = GetParam();
  ModelConfig config =
      dlrm::testing::DenseBackendConfig(c.interaction, c.optimizer);
  config.set_dense_precision(PRECISION_BF16);
  auto cpu = CreateDenseBackend(config);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  ASSERT_EQ((*cpu)->precision(), PRECISION_BF16);
  config.set_device(DEVICE_CUDA);
  auto gpu = CreateDenseBackend(config);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  EXPECT_EQ((*gpu)->device(), DEVICE_CUDA);
  EXPECT_EQ((*gpu)->precision(), PRECISION_BF16);
  Rng rng(kCudaTestSeed + 1);
  ASSERT_NO_FATAL_FAILURE(ExpectStepsAlike(
      **cpu, **gpu, config, rng, /*loss_rel=*/1e-3,
      [](const dlrm::testing::DenseStepResult& got,
         const dlrm::testing::DenseStepResult& want) {
        ExpectBf16Close(got.dt, want.dt, "dt");
        ExpectBf16Close(got.grads, want.grads, "gradients");
        ExpectBf16Close(got.params, want.params, "parameters");
        ExpectBf16Close(got.state, want.state, "optimizer state");
        ExpectBf16Close(got.probs, want.probs, "predictions");
      }));
  // A write to the host view (a restore) reaches the device's bf16 weights:
  // with the CPU backend's weights copied in, the two predict alike again.
  std::vector<float> want, got;
  ASSERT_NO_FATAL_FAILURE(
      PredictAfterHostWrite(**cpu, **gpu, config, rng, &want, &got));
  ExpectBf16Close(got, want, "predictions after a host write");
}

INSTANTIATE_TEST_SUITE_P(
    Configs, CudaBf16BackendTest,
    ::testing::Values(BackendCase{INTERACTION_DOT, OptimizerConfig::SGD},
                      BackendCase{INTERACTION_CAT, OptimizerConfig::SGD},
                      BackendCase{INTERACTION_DCN, OptimizerConfig::SGD}),
    CaseName<BackendCase>);

INSTANTIATE_TEST_SUITE_P(
    Configs, CudaBackendTest,
    ::testing::Values(BackendCase{INTERACTION_DOT, OptimizerConfig::SGD},
                      BackendCase{INTERACTION_DOT, OptimizerConfig::ADAGRAD},
                      BackendCase{INTERACTION_DOT, OptimizerConfig::ADAM},
                      BackendCase{INTERACTION_CAT, OptimizerConfig::SGD},
                      BackendCase{INTERACTION_CAT, OptimizerConfig::ADAM},
                      BackendCase{INTERACTION_DCN, OptimizerConfig::SGD},
                      BackendCase{INTERACTION_DCN, OptimizerConfig::ADAGRAD},
                      BackendCase{INTERACTION_DCN, OptimizerConfig::ADAM},
                      BackendCase{INTERACTION_DOT, OptimizerConfig::LAMB},
                      BackendCase{INTERACTION_DOT, OptimizerConfig::LARS},
                      BackendCase{INTERACTION_DCN, OptimizerConfig::LAMB},
                      BackendCase{INTERACTION_DCN, OptimizerConfig::LARS}),
    CaseName<BackendCase>);

}  // namespace
}  // namespace dlrm::dense::cuda
