// Tests for dense/: Linear and Mlp (naive loops and finite differences), the
// dot interaction (against its reference), DCN's cross network (against its
// double reference and its finite differences), BCE loss, the optimizers,
// the CPU dense backend (against the layers composed by hand), and the
// bf16 GEMMs, layers and step (against double loops and the fp32 ones).
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <limits>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/aligned.h"
#include "core/config.h"
#include "core/device.h"
#include "core/random.h"
#include "dense/backend.h"
#include "dense/bf16.h"
#include "dense/cpu_isa.h"
#include "dense/cross_net.h"
#include "dense/interaction.h"
#include "dense/interaction_layer.h"
#include "dense/linear.h"
#include "dense/loss.h"
#include "dense/optimizer.h"
#include "optim/optimizer.h"
#include "tests/dense/dense_backend_test_util.h"
#include "tests/support/expect.h"

namespace dlrm::dense {
namespace {

// Prints the seed (so a failure can be replayed) and returns its generator.
Rng SeededRng(uint64_t seed) {
  std::printf("[   seed   ] %llu\n", static_cast<unsigned long long>(seed));
  return Rng(seed);
}

std::vector<float> RandomVector(Rng* rng, size_t n, double scale = 1.0) {
  std::vector<float> v(n);
  for (float& x : v) x = static_cast<float>(rng->Normal() * scale);
  return v;
}

bool BitwiseEqual(const float* a, const float* b, size_t n) {
  return std::memcmp(a, b, n * sizeof(float)) == 0;
}

// Central difference of `loss` wrt *x. The denominator is the step actually
// taken after rounding to float, so float rounding of x does not bias it.
double NumericalGradient(float* x, float h,
                         const std::function<double()>& loss) {
  const float saved = *x;
  *x = saved + h;
  const float hi = *x;
  const double lp = loss();
  *x = saved - h;
  const float lo = *x;
  const double lm = loss();
  *x = saved;
  return (lp - lm) / (static_cast<double>(hi) - static_cast<double>(lo));
}

double Dot(const float* a, const std::vector<float>& c) {
  double s = 0;
  for (size_t i = 0; i < c.size(); ++i) s += static_cast<double>(a[i]) * c[i];
  return s;
}

// Gradient-check tolerance: finite differences of a float forward pass are
// good to ~1e-3 relative at these step sizes.
void ExpectGradNear(double analytic, double numeric, const std::string& what) {
  EXPECT_NEAR(analytic, numeric, 2e-3 * (1.0 + std::fabs(numeric))) << what;
}

// Smallest |pre-activation| of any ReLU layer of `mlp` on x: finite
// differences are only valid when no step crosses the ReLU kink.
float ReluMargin(const Mlp& mlp, const std::vector<float>& x, int64_t batch) {
  float margin = std::numeric_limits<float>::infinity();
  std::vector<float> in = x;
  for (const Linear& layer : mlp.layers()) {
    Linear plain(layer.in(), layer.out(), /*relu=*/false);
    std::copy(layer.weight(), layer.weight() + layer.in() * layer.out(),
              plain.weight());
    std::copy(layer.bias(), layer.bias() + layer.out(), plain.bias());
    std::vector<float> pre(batch * layer.out());
    plain.Forward(in.data(), batch, pre.data());
    if (layer.relu()) {
      for (float v : pre) margin = std::min(margin, std::fabs(v));
      for (float& v : pre) v = std::max(v, 0.0f);
    }
    in = pre;
  }
  return margin;
}

// Naive y = act(x W^T + b) in double.
std::vector<double> NaiveLinear(const Linear& l, const float* x,
                                int64_t batch) {
  std::vector<double> y(batch * l.out());
  for (int64_t r = 0; r < batch; ++r) {
    for (int o = 0; o < l.out(); ++o) {
      double s = l.bias()[o];
      for (int i = 0; i < l.in(); ++i) {
        s +=
            static_cast<double>(x[r * l.in() + i]) * l.weight()[o * l.in() + i];
      }
      y[r * l.out() + o] = l.relu() ? std::max(s, 0.0) : s;
    }
  }
  return y;
}

// ---------------------------------------------------------------- Linear

TEST(LinearTest, InitMatchesReferenceScale) {
  Rng rng = SeededRng(11);
  Linear l(300, 200, true);
  l.Init(&rng);
  double sw = 0, sb = 0;
  for (int i = 0; i < 300 * 200; ++i) sw += l.weight()[i] * l.weight()[i];
  for (int i = 0; i < 200; ++i) sb += l.bias()[i] * l.bias()[i];
  EXPECT_NEAR(std::sqrt(sw / (300 * 200)), std::sqrt(2.0 / 500), 0.01);
  EXPECT_NEAR(std::sqrt(sb / 200), std::sqrt(1.0 / 200), 0.015);

  Rng again(11);
  Linear l2(300, 200, true);
  l2.Init(&again);
  EXPECT_TRUE(BitwiseEqual(l.weight(), l2.weight(), 300 * 200));
}

TEST(LinearTest, ForwardMatchesNaiveLoops) {
  Rng rng = SeededRng(12);
  for (bool relu : {false, true}) {
    // 300 x 300 also takes the OpenMP path of the bias pass.
    for (auto [in, out, batch] :
         {std::tuple{37, 19, 11}, std::tuple{13, 512, 300},
          std::tuple{300, 1, 7}}) {
      Linear l(in, out, relu);
      l.Init(&rng);
      std::vector<float> x = RandomVector(&rng, batch * in);
      std::vector<float> y(batch * out);
      l.Forward(x.data(), batch, y.data());
      std::vector<double> want = NaiveLinear(l, x.data(), batch);
      for (size_t i = 0; i < y.size(); ++i) {
        ASSERT_NEAR(y[i], want[i], 1e-5 * (1 + std::fabs(want[i])))
            << "relu " << relu << " in " << in << " out " << out << " at " << i;
      }
    }
  }
}

TEST(LinearTest, BackwardMatchesNaiveLoops) {
  Rng rng = SeededRng(13);
  const int in = 70, out = 300, batch = 301;  // batch x out > OpenMP cut-off
  Linear l(in, out, true);
  l.Init(&rng);
  std::vector<float> x = RandomVector(&rng, batch * in);
  std::vector<float> y(batch * out), dx(batch * in);
  l.Forward(x.data(), batch, y.data());
  std::vector<float> dy = RandomVector(&rng, batch * out);
  std::vector<float> g = dy;
  l.Backward(x.data(), y.data(), g.data(), batch, dx.data());
  std::vector<double> gm(batch * out);
  for (size_t i = 0; i < gm.size(); ++i) gm[i] = y[i] > 0 ? dy[i] : 0.0;
  for (size_t i = 0; i < gm.size(); ++i) ASSERT_EQ(g[i], gm[i]) << i;
  for (int o = 0; o < out; ++o) {
    double db = 0;
    for (int r = 0; r < batch; ++r) db += gm[r * out + o];
    ASSERT_NEAR(l.bias_grad()[o], db, 1e-4 * (1 + std::fabs(db))) << o;
    for (int i = 0; i < in; ++i) {
      double dw = 0;
      for (int r = 0; r < batch; ++r) dw += gm[r * out + o] * x[r * in + i];
      ASSERT_NEAR(l.weight_grad()[o * in + i], dw, 1e-4 * (1 + std::fabs(dw)));
    }
  }
  for (int r = 0; r < batch; ++r) {
    for (int i = 0; i < in; ++i) {
      double s = 0;
      for (int o = 0; o < out; ++o)
        s += gm[r * out + o] * l.weight()[o * in + i];
      ASSERT_NEAR(dx[r * in + i], s, 1e-4 * (1 + std::fabs(s)));
    }
  }
}

// Finite-difference check of one layer (as a one-layer Mlp, whose margin
// helper finds a point away from the ReLU kink).
void CheckLinearGradients(bool relu, uint64_t seed) {
  const int in = 5, out = 4, batch = 3;
  const std::vector<int> widths = {out};
  Mlp net(in, widths, relu);
  std::vector<float> x;
  Rng rng = SeededRng(seed);
  // Redraw until every pre-activation is clear of the kink by far more than
  // a step can move it (|dW| h |x| < 0.01).
  for (int attempt = 0;; ++attempt) {
    ASSERT_LT(attempt, 1000);
    net.Init(&rng);
    x = RandomVector(&rng, batch * in);
    if (!relu || ReluMargin(net, x, batch) > 0.1f) break;
  }
  Linear& l = net.layers()[0];
  std::vector<float> c = RandomVector(&rng, batch * out);
  auto loss = [&] {
    std::vector<float> y(batch * out);
    l.Forward(x.data(), batch, y.data());
    return Dot(y.data(), c);
  };
  std::vector<float> y(batch * out), dx(batch * in);
  l.Forward(x.data(), batch, y.data());
  std::vector<float> dy = c;
  l.Backward(x.data(), y.data(), dy.data(), batch, dx.data());
  const float h = 1e-3f;
  for (int i = 0; i < in * out; ++i) {
    ExpectGradNear(l.weight_grad()[i],
                   NumericalGradient(&l.weight()[i], h, loss),
                   "weight " + std::to_string(i));
  }
  for (int i = 0; i < out; ++i) {
    ExpectGradNear(l.bias_grad()[i], NumericalGradient(&l.bias()[i], h, loss),
                   "bias " + std::to_string(i));
  }
  for (int i = 0; i < batch * in; ++i) {
    ExpectGradNear(dx[i], NumericalGradient(&x[i], h, loss),
                   "x " + std::to_string(i));
  }
}

TEST(LinearTest, GradientsMatchFiniteDifferencesIdentity) {
  CheckLinearGradients(false, 21);
}

TEST(LinearTest, GradientsMatchFiniteDifferencesRelu) {
  CheckLinearGradients(true, 22);
}

TEST(LinearTest, ZeroBatch) {
  Linear l(4, 3, true);
  Rng rng = SeededRng(23);
  l.Init(&rng);
  std::fill(l.weight_grad(), l.weight_grad() + 12, 1.0f);
  l.Forward(nullptr, 0, nullptr);
  l.Backward(nullptr, nullptr, nullptr, 0, nullptr);
  for (int i = 0; i < 12; ++i) EXPECT_EQ(l.weight_grad()[i], 0.0f);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(l.bias_grad()[i], 0.0f);
}

// ---------------------------------------------------------------- Mlp

void CheckMlpGradients(bool relu_last, uint64_t seed) {
  const int in = 5, batch = 3;
  const std::vector<int> widths = {6, 4, 3};
  Mlp net(in, widths, relu_last);
  Rng rng = SeededRng(seed);
  std::vector<float> x;
  for (int attempt = 0;; ++attempt) {
    ASSERT_LT(attempt, 10000);
    net.Init(&rng);
    x = RandomVector(&rng, batch * in);
    if (ReluMargin(net, x, batch) > 0.05f) break;
  }
  std::vector<float> c = RandomVector(&rng, batch * net.out());
  auto loss = [&] { return Dot(net.Forward(x.data(), batch), c); };
  net.Forward(x.data(), batch);
  std::vector<float> dy = c, dx(batch * in);
  net.Backward(x.data(), dy.data(), batch, dx.data());
  const float h = 1e-3f;
  for (const ParamRef& p : net.Parameters("mlp")) {
    for (int64_t i = 0; i < p.size; ++i) {
      ExpectGradNear(p.grad[i], NumericalGradient(&p.value[i], h, loss),
                     p.name + "[" + std::to_string(i) + "]");
    }
  }
  for (int i = 0; i < batch * in; ++i) {
    ExpectGradNear(dx[i], NumericalGradient(&x[i], h, loss),
                   "x " + std::to_string(i));
  }
}

TEST(MlpTest, GradientsMatchFiniteDifferences) { CheckMlpGradients(false, 31); }

TEST(MlpTest, GradientsMatchFiniteDifferencesReluLast) {
  CheckMlpGradients(true, 32);
}

TEST(MlpTest, ParametersAreNamedAndSized) {
  const std::vector<int> widths = {8, 1};
  Mlp net(3, widths, false);
  std::vector<ParamRef> p = net.Parameters("top");
  ASSERT_EQ(p.size(), 4u);
  EXPECT_EQ(p[0].name, "top.0.weight");
  EXPECT_EQ(p[0].size, 24);
  EXPECT_EQ(p[1].name, "top.0.bias");
  EXPECT_EQ(p[1].size, 8);
  EXPECT_EQ(p[2].name, "top.1.weight");
  EXPECT_EQ(p[2].size, 8);
  EXPECT_EQ(p[3].name, "top.1.bias");
  EXPECT_EQ(p[3].size, 1);
  EXPECT_EQ(p[2].value, net.layers()[1].weight());
  EXPECT_EQ(p[2].grad, net.layers()[1].weight_grad());
  EXPECT_EQ(net.out(), 1);
  EXPECT_TRUE(net.layers()[0].relu());
  EXPECT_FALSE(net.layers()[1].relu());
}

TEST(MlpTest, InferEqualsForwardAndLeavesTrainingStateAlone) {
  Rng rng = SeededRng(33);
  const std::vector<int> widths = {512, 256, 64, 16};
  Mlp net(13, widths, true);
  net.Init(&rng);
  const int64_t batch = 200, small = 17;
  std::vector<float> x = RandomVector(&rng, batch * 13);
  std::vector<float> x2 = RandomVector(&rng, small * 13);
  const float* y = net.Forward(x.data(), batch);
  std::vector<float> fwd(y, y + batch * 16);

  std::vector<float> out(batch * 16), out2(small * 16);
  AlignedVector<float> scratch;
  net.Infer(x.data(), batch, out.data(), &scratch);
  EXPECT_TRUE(BitwiseEqual(out.data(), fwd.data(), fwd.size()));
  // Inference on other inputs between Forward and Backward must not change
  // the activations Backward uses.
  net.Infer(x2.data(), small, out2.data(), &scratch);
  EXPECT_TRUE(BitwiseEqual(y, fwd.data(), fwd.size()));

  std::vector<float> dy = RandomVector(&rng, batch * 16), dy2 = dy;
  net.Backward(x.data(), dy.data(), batch, nullptr);
  std::vector<float> g(net.layers()[1].weight_grad(),
                       net.layers()[1].weight_grad() + 512 * 256);
  net.Forward(x.data(), batch);
  net.Backward(x.data(), dy2.data(), batch, nullptr);
  EXPECT_TRUE(BitwiseEqual(g.data(), net.layers()[1].weight_grad(), g.size()));
}

// Forward + backward of the default bottom and top MLPs twice from the same
// seed: bitwise equal (batch large enough for the OpenMP paths).
TEST(MlpTest, Deterministic) {
  struct Result {
    std::vector<float> out, dx, grads;
  };
  auto run = [](int in, std::vector<int> widths, bool relu_last) {
    Rng rng = SeededRng(34);
    Mlp net(in, widths, relu_last);
    net.Init(&rng);
    const int64_t batch = 1000;
    std::vector<float> x = RandomVector(&rng, batch * in);
    const float* y = net.Forward(x.data(), batch);
    Result r;
    r.out.assign(y, y + batch * net.out());
    std::vector<float> dy = RandomVector(&rng, batch * net.out());
    r.dx.resize(batch * in);
    net.Backward(x.data(), dy.data(), batch, r.dx.data());
    for (const ParamRef& p : net.Parameters("m")) {
      r.grads.insert(r.grads.end(), p.grad, p.grad + p.size);
    }
    return r;
  };
  for (bool top : {false, true}) {
    const int in = top ? 367 : 13;
    const std::vector<int> widths = top ? std::vector<int>{512, 256, 1}
                                        : std::vector<int>{512, 256, 64, 16};
    Result a = run(in, widths, !top), b = run(in, widths, !top);
    EXPECT_TRUE(BitwiseEqual(a.out.data(), b.out.data(), a.out.size()));
    EXPECT_TRUE(BitwiseEqual(a.dx.data(), b.dx.data(), a.dx.size()));
    EXPECT_TRUE(BitwiseEqual(a.grads.data(), b.grads.data(), a.grads.size()));
  }
}

// ---------------------------------------------------------------- Interaction

TEST(InteractionTest, DimAndLayout) {
  EXPECT_EQ(DotInteractionDim(27, 16), 367);
  EXPECT_EQ(DotInteractionDim(1, 4), 4);
  // Two samples, n = 3, d = 2: z = [t0, <t1,t0>, <t2,t0>, <t2,t1>].
  const std::vector<float> t = {1, 2, 3, 4, 5, 6, /*sample 2*/ 0,
                                1, 1, 0, 2, 2};
  std::vector<float> z(2 * 5);
  DotInteractionForward(t.data(), 2, 3, 2, z.data());
  EXPECT_EQ(z, (std::vector<float>{1, 2, 11, 17, 39, 0, 1, 0, 2, 2}));
  std::vector<float> zr(2 * 5);
  reference::DotInteractionForward(t.data(), 2, 3, 2, zr.data());
  EXPECT_EQ(zr, z);
}

// Optimized vs reference. Tolerance: 1e-5 relative (|a - b| <= 1e-5 (1 +
// |b|)); the two sum in different orders and may contract into FMAs
// differently.
TEST(InteractionTest, MatchesReference) {
  Rng rng = SeededRng(41);
  struct Shape {
    int n, d;
    int64_t batch;
  };
  for (Shape s :
       {Shape{27, 16, 256}, Shape{27, 16, 1}, Shape{27, 16, 0}, Shape{1, 4, 3},
        Shape{2, 3, 5}, Shape{5, 8, 40}, Shape{9, 32, 33}, Shape{4, 64, 7},
        Shape{13, 7, 50}, Shape{17, 128, 3}}) {
    SCOPED_TRACE(::testing::Message()
                 << "n " << s.n << " d " << s.d << " batch " << s.batch);
    const int dim = DotInteractionDim(s.n, s.d);
    std::vector<float> t = RandomVector(&rng, s.batch * s.n * s.d);
    std::vector<float> dz = RandomVector(&rng, s.batch * dim);
    // Guard values after the outputs catch writes past the end.
    std::vector<float> z(s.batch * dim + 1, 7.0f), zr(s.batch * dim, 0.0f);
    DotInteractionForward(t.data(), s.batch, s.n, s.d, z.data());
    reference::DotInteractionForward(t.data(), s.batch, s.n, s.d, zr.data());
    EXPECT_EQ(z.back(), 7.0f);
    for (size_t i = 0; i < zr.size(); ++i) {
      ASSERT_NEAR(z[i], zr[i], 1e-5 * (1 + std::fabs(zr[i]))) << "z " << i;
    }
    std::vector<float> dt(s.batch * s.n * s.d + 1, 7.0f),
        dtr(s.batch * s.n * s.d, 0.0f);
    DotInteractionBackward(t.data(), dz.data(), s.batch, s.n, s.d, dt.data());
    reference::DotInteractionBackward(t.data(), dz.data(), s.batch, s.n, s.d,
                                      dtr.data());
    EXPECT_EQ(dt.back(), 7.0f);
    for (size_t i = 0; i < dtr.size(); ++i) {
      ASSERT_NEAR(dt[i], dtr[i], 1e-5 * (1 + std::fabs(dtr[i]))) << "dt " << i;
    }
  }
}

TEST(InteractionTest, GradientMatchesFiniteDifferences) {
  Rng rng = SeededRng(42);
  for (auto [n, d] : {std::pair{4, 3}, std::pair{27, 16}}) {
    const int64_t batch = 2;
    const int dim = DotInteractionDim(n, d);
    std::vector<float> t = RandomVector(&rng, batch * n * d);
    std::vector<float> c = RandomVector(&rng, batch * dim);
    std::vector<float> z(batch * dim), dt(batch * n * d);
    auto loss = [&] {
      DotInteractionForward(t.data(), batch, n, d, z.data());
      return Dot(z.data(), c);
    };
    DotInteractionBackward(t.data(), c.data(), batch, n, d, dt.data());
    for (size_t i = 0; i < t.size(); ++i) {
      ExpectGradNear(dt[i], NumericalGradient(&t[i], 1e-2f, loss),
                     "t " + std::to_string(i));
    }
    std::vector<float> dtr(dt.size());
    reference::DotInteractionBackward(t.data(), c.data(), batch, n, d,
                                      dtr.data());
    for (size_t i = 0; i < t.size(); ++i) {
      ExpectGradNear(dtr[i], NumericalGradient(&t[i], 1e-2f, loss),
                     "reference t " + std::to_string(i));
    }
  }
}

TEST(InteractionTest, Deterministic) {
  Rng rng = SeededRng(43);
  const int n = 27, d = 16, dim = DotInteractionDim(n, d);
  const int64_t batch = 2048;
  std::vector<float> t = RandomVector(&rng, batch * n * d);
  std::vector<float> dz = RandomVector(&rng, batch * dim);
  std::vector<float> z1(batch * dim), z2(batch * dim);
  std::vector<float> dt1(batch * n * d), dt2(batch * n * d);
  DotInteractionForward(t.data(), batch, n, d, z1.data());
  DotInteractionForward(t.data(), batch, n, d, z2.data());
  DotInteractionBackward(t.data(), dz.data(), batch, n, d, dt1.data());
  DotInteractionBackward(t.data(), dz.data(), batch, n, d, dt2.data());
  EXPECT_TRUE(BitwiseEqual(z1.data(), z2.data(), z1.size()));
  EXPECT_TRUE(BitwiseEqual(dt1.data(), dt2.data(), dt1.size()));
}

// Each implementation of the dot interaction against the reference, on
// random shapes: n 2..27, d 1..128, batches 0, 1, and sizes that end in a
// partial GEMM chunk. Tolerance: the float error bound of the two summation
// orders, |a - b| <= 2 m eps sum|terms| + 1e-30 for a sum of m products (m =
// d for a dot, n for a gradient element); sum|terms| is the reference run
// on |t| and |dz|.
class DotImplTest : public ::testing::TestWithParam<DotImpl> {};

TEST_P(DotImplTest, MatchesReferenceOnRandomShapes) {
  Rng rng = SeededRng(44);
  struct Shape {
    int n, d;
    int64_t batch;
  };
  std::vector<Shape> shapes = {{27, 16, 0},   {27, 16, 1},   {27, 128, 1},
                               {27, 16, 257}, {27, 128, 45}, {27, 64, 130},
                               {2, 1, 3},     {3, 127, 2},   {26, 33, 9}};
  for (int r = 0; r < 30; ++r) {
    const int64_t batches[] = {0, 1, 2 + static_cast<int64_t>(rng.Below(300))};
    shapes.push_back({2 + static_cast<int>(rng.Below(26)),
                      1 + static_cast<int>(rng.Below(128)), batches[r % 3]});
  }
  const float eps = std::numeric_limits<float>::epsilon();
  for (const Shape& s : shapes) {
    SCOPED_TRACE(::testing::Message()
                 << "n " << s.n << " d " << s.d << " batch " << s.batch);
    const int dim = DotInteractionDim(s.n, s.d);
    const int64_t nd = s.batch * s.n * s.d;
    std::vector<float> t = RandomVector(&rng, nd);
    std::vector<float> dz = RandomVector(&rng, s.batch * dim);
    std::vector<float> abs_t(t.size()), abs_dz(dz.size());
    std::transform(t.begin(), t.end(), abs_t.begin(),
                   [](float x) { return std::fabs(x); });
    std::transform(dz.begin(), dz.end(), abs_dz.begin(),
                   [](float x) { return std::fabs(x); });
    // Guard values after the outputs catch writes past the end.
    std::vector<float> z(s.batch * dim + 1, 7.0f), zr(s.batch * dim),
        zmag(s.batch * dim);
    DotInteractionForward(GetParam(), t.data(), s.batch, s.n, s.d, z.data());
    reference::DotInteractionForward(t.data(), s.batch, s.n, s.d, zr.data());
    reference::DotInteractionForward(abs_t.data(), s.batch, s.n, s.d,
                                     zmag.data());
    EXPECT_EQ(z.back(), 7.0f);
    for (size_t i = 0; i < zr.size(); ++i) {
      ASSERT_NEAR(z[i], zr[i], 2 * s.d * eps * zmag[i] + 1e-30) << "z " << i;
    }
    std::vector<float> dt(nd + 1, 7.0f), dtr(nd), dtmag(nd);
    DotInteractionBackward(GetParam(), t.data(), dz.data(), s.batch, s.n, s.d,
                           dt.data());
    reference::DotInteractionBackward(t.data(), dz.data(), s.batch, s.n, s.d,
                                      dtr.data());
    reference::DotInteractionBackward(abs_t.data(), abs_dz.data(), s.batch, s.n,
                                      s.d, dtmag.data());
    EXPECT_EQ(dt.back(), 7.0f);
    for (size_t i = 0; i < dtr.size(); ++i) {
      ASSERT_NEAR(dt[i], dtr[i], 2 * s.n * eps * dtmag[i] + 1e-30)
          << "dt " << i;
    }
  }
}

// The GEMM path splits a batch into chunks run on several threads; each
// sample's arithmetic does not depend on the split, so the thread count
// does not change a bit.
TEST_P(DotImplTest, SameBitsForAnyThreadCount) {
  Rng rng = SeededRng(45);
  const int n = 27;
  const int64_t batch = 301;
  for (int d : {16, 128}) {
    SCOPED_TRACE(::testing::Message() << "d " << d);
    const int dim = DotInteractionDim(n, d);
    std::vector<float> t = RandomVector(&rng, batch * n * d);
    std::vector<float> dz = RandomVector(&rng, batch * dim);
    std::vector<float> z[2], dt[2];
    const int threads[2] = {1, 2};
    const int saved = omp_get_max_threads();
    for (int k = 0; k < 2; ++k) {
      omp_set_num_threads(threads[k]);
      z[k].resize(batch * dim);
      dt[k].resize(batch * n * d);
      DotInteractionForward(GetParam(), t.data(), batch, n, d, z[k].data());
      DotInteractionBackward(GetParam(), t.data(), dz.data(), batch, n, d,
                             dt[k].data());
    }
    omp_set_num_threads(saved);
    EXPECT_TRUE(BitwiseEqual(z[0].data(), z[1].data(), z[0].size()));
    EXPECT_TRUE(BitwiseEqual(dt[0].data(), dt[1].data(), dt[0].size()));
  }
}

INSTANTIATE_TEST_SUITE_P(Impls, DotImplTest,
                         ::testing::Values(DotImpl::kLoops, DotImpl::kGemm),
                         [](const ::testing::TestParamInfo<DotImpl>& info) {
                           return info.param == DotImpl::kGemm ? "Gemm"
                                                               : "Loops";
                         });

// The rule of ChooseDotImpl on the shapes the presets use.
TEST(InteractionTest, ChoosesGemmWhereItMeasuredFaster) {
  // Kaggle: n 27, d 16; the GEMMs from 32 samples on.
  EXPECT_EQ(ChooseDotImpl(DotPass::kForward, 2048, 27, 16), DotImpl::kGemm);
  EXPECT_EQ(ChooseDotImpl(DotPass::kForward, 32, 27, 16), DotImpl::kGemm);
  EXPECT_EQ(ChooseDotImpl(DotPass::kForward, 31, 27, 16), DotImpl::kLoops);
  EXPECT_EQ(ChooseDotImpl(DotPass::kBackward, 2048, 27, 16), DotImpl::kLoops);
  // MLPerf DLRM v1: n 27, d 128.
  EXPECT_EQ(ChooseDotImpl(DotPass::kForward, 2048, 27, 128), DotImpl::kGemm);
  EXPECT_EQ(ChooseDotImpl(DotPass::kBackward, 2048, 27, 128), DotImpl::kGemm);
  EXPECT_EQ(ChooseDotImpl(DotPass::kForward, 4, 27, 128), DotImpl::kGemm);
  EXPECT_EQ(ChooseDotImpl(DotPass::kForward, 3, 27, 128), DotImpl::kLoops);
  EXPECT_EQ(ChooseDotImpl(DotPass::kForward, 0, 27, 128), DotImpl::kLoops);
  // tiny: n 4, d 4.
  EXPECT_EQ(ChooseDotImpl(DotPass::kForward, 2048, 4, 4), DotImpl::kLoops);
  EXPECT_EQ(ChooseDotImpl(DotPass::kBackward, 2048, 4, 4), DotImpl::kLoops);
}

// ---------------------------------------------------------------- CrossNet

// A cross network's width, layers and rank, and a batch: the cases of the
// CrossNet tests.
struct CrossShape {
  int n, layers, r;
  int64_t batch;
};

// `s` in a failure's trace.
std::string Describe(const CrossShape& s) {
  return absl::StrCat("n ", s.n, " layers ", s.layers, " r ", s.r, " batch ",
                      s.batch);
}

// A cross network with random parameters, biases included (Init leaves
// them zero, which would hide a bias bug).
CrossNet RandomCrossNet(int n, int layers, int r, Rng* rng) {
  CrossNet net(n, layers, r);
  net.Init(rng);
  for (int l = 0; l < layers; ++l) {
    for (int c = 0; c < n; ++c) {
      net.bias(l)[c] = static_cast<float>(rng->Normal() * 0.5);
    }
  }
  return net;
}

// `net`'s training forward and its inference forward on `x0`, each into a
// buffer with a guard value after the output (a write past the end fails
// the test); the two outputs, guards removed.
struct CrossOutputs {
  std::vector<float> out, infer;
};
CrossOutputs ForwardAndInfer(CrossNet& net, const std::vector<float>& x0,
                             int64_t batch, int n) {
  CrossOutputs o{std::vector<float>(batch * n + 1, 7.0f),
                 std::vector<float>(batch * n + 1, 7.0f)};
  net.Forward(x0.data(), batch, o.out.data());
  AlignedVector<float> scratch;
  net.Infer(x0.data(), batch, o.infer.data(), &scratch);
  EXPECT_EQ(o.out.back(), 7.0f);
  EXPECT_EQ(o.infer.back(), 7.0f);
  o.out.pop_back();
  o.infer.pop_back();
  return o;
}

// The gradients of every parameter of `net`, in Parameters' order.
std::vector<float> CrossGrads(CrossNet& net) {
  std::vector<float> g;
  for (const ParamRef& p : net.Parameters()) {
    g.insert(g.end(), p.grad, p.grad + p.size);
  }
  return g;
}

TEST(CrossNetTest, InitIsXavierNormalAndParametersAreInSpecOrder) {
  Rng rng = SeededRng(44);
  const int n = 96, r = 32;
  CrossNet net(n, 3, r);
  net.Init(&rng);
  const double want = std::sqrt(2.0 / (n + r));
  for (int l = 0; l < 3; ++l) {
    for (const float* m : {net.v(l), net.w(l)}) {
      double sum = 0, sq = 0;
      for (int i = 0; i < n * r; ++i) {
        sum += m[i];
        sq += static_cast<double>(m[i]) * m[i];
      }
      // 3072 draws: the sample std is within ~1.3% of the true one (1
      // sigma), the mean within ~0.0023 (1 sigma); 4 sigma bounds.
      EXPECT_NEAR(std::sqrt(sq / (n * r)), want, 0.052 * want);
      EXPECT_NEAR(sum / (n * r), 0.0, 4 * want / std::sqrt(n * r));
    }
    for (int c = 0; c < n; ++c) ASSERT_EQ(net.bias(l)[c], 0.0f);
  }
  // The same seed draws the same values.
  Rng again = SeededRng(44);
  CrossNet twin(n, 3, r);
  twin.Init(&again);
  EXPECT_TRUE(BitwiseEqual(net.v(2), twin.v(2), n * r));
  EXPECT_TRUE(BitwiseEqual(net.w(2), twin.w(2), n * r));

  // V, W, bias per layer (InteractionParamSpecs' order), unnamed:
  // HostDenseParams names them.
  std::vector<int64_t> sizes;
  std::vector<const float*> values;
  for (const ParamRef& p : net.Parameters()) {
    EXPECT_EQ(p.name, "");
    sizes.push_back(p.size);
    values.push_back(p.value);
  }
  EXPECT_EQ(sizes, (std::vector<int64_t>{n * r, n * r, n, n * r, n * r, n,
                                         n * r, n * r, n}));
  EXPECT_EQ(values[3], net.v(1));
  EXPECT_EQ(values[4], net.w(1));
  EXPECT_EQ(values[5], net.bias(1));
  EXPECT_TRUE(CrossNet(16, 0, 0).Parameters().empty());
}

// Forward and Infer against the double reference on random inputs, for
// shapes with one and several row blocks, a rank above the width, one
// layer and one sample. Tolerance 1e-4 (1 + |ref|): each map sums at most
// 64 float products and the layers compound that to ~1e-6 relative; a
// wrong index or a missing term is off by O(1).
TEST(CrossNetTest, ForwardAndInferMatchReference) {
  Rng rng = SeededRng(45);
  for (CrossShape s : {CrossShape{16, 3, 4, 37}, CrossShape{7, 1, 3, 1},
                       CrossShape{40, 2, 64, 130}, CrossShape{64, 3, 16, 200},
                       CrossShape{5, 4, 2, 0}}) {
    SCOPED_TRACE(Describe(s));
    CrossNet net = RandomCrossNet(s.n, s.layers, s.r, &rng);
    const std::vector<float> x0 = RandomVector(&rng, s.batch * s.n);
    const auto [out, infer] = ForwardAndInfer(net, x0, s.batch, s.n);
    const std::vector<double> want =
        reference::CrossNetForward(net, x0.data(), s.batch);
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_NEAR(out[i], want[i], 1e-4 * (1 + std::fabs(want[i])))
          << "x_L " << i;
    }
    // Infer runs the training forward's arithmetic.
    EXPECT_TRUE(BitwiseEqual(out.data(), infer.data(), want.size()));
  }
}

// Backward against central differences of the double reference: the loss
// is sum(c * x_L). x_L is linear in each single parameter (every layer is
// linear in its x_l and in its own V, W, b), so the parameters' differences
// are exact up to double rounding; in x_0 it is a polynomial of degree L +
// 1, whose differences with a step of 1e-3 are off by ~1e-7 relative. The
// float backward's rounding (~1e-6) dominates: tolerance 1e-4 (1 + |g|).
TEST(CrossNetTest, GradientsMatchFiniteDifferencesOfTheReference) {
  Rng rng = SeededRng(46);
  for (CrossShape s : {CrossShape{6, 3, 2, 3}, CrossShape{4, 2, 5, 2},
                       CrossShape{5, 1, 3, 4}}) {
    SCOPED_TRACE(Describe(s));
    CrossNet net = RandomCrossNet(s.n, s.layers, s.r, &rng);
    std::vector<float> x0 = RandomVector(&rng, s.batch * s.n);
    const std::vector<float> c = RandomVector(&rng, s.batch * s.n);
    std::vector<float> out(s.batch * s.n), dx0(s.batch * s.n, 9.0f);
    net.Forward(x0.data(), s.batch, out.data());
    net.Backward(x0.data(), c.data(), s.batch, dx0.data());
    auto loss = [&] {
      const std::vector<double> y =
          reference::CrossNetForward(net, x0.data(), s.batch);
      double sum = 0;
      for (size_t i = 0; i < y.size(); ++i) sum += c[i] * y[i];
      return sum;
    };
    auto expect = [](double analytic, double numeric, const std::string& what) {
      EXPECT_NEAR(analytic, numeric, 1e-4 * (1 + std::fabs(numeric))) << what;
    };
    for (size_t i = 0; i < x0.size(); ++i) {
      expect(dx0[i], NumericalGradient(&x0[i], 1e-3f, loss),
             "x0 " + std::to_string(i));
    }
    for (const ParamRef& p : net.Parameters()) {
      for (int64_t i = 0; i < p.size; ++i) {
        expect(p.grad[i], NumericalGradient(&p.value[i], 1e-3f, loss),
               p.name + "[" + std::to_string(i) + "]");
      }
    }
  }
}

// Same inputs, same bits (the bias gradient's block sums, the GEMMs); an
// Infer between Forward and Backward changes nothing; a batch of 0 zeroes
// the gradients.
TEST(CrossNetTest, DeterministicAndInferLeavesTrainingStateAlone) {
  Rng rng = SeededRng(47);
  const int n = 48, layers = 3, r = 16;
  const int64_t batch = 300;
  CrossNet net = RandomCrossNet(n, layers, r, &rng);
  const std::vector<float> x0 = RandomVector(&rng, batch * n);
  const std::vector<float> other = RandomVector(&rng, 50 * n);
  const std::vector<float> dout = RandomVector(&rng, batch * n);
  std::vector<float> out1(batch * n), out2(batch * n), dx1(batch * n),
      dx2(batch * n), infer(50 * n);
  net.Forward(x0.data(), batch, out1.data());
  net.Backward(x0.data(), dout.data(), batch, dx1.data());
  const std::vector<float> g1 = CrossGrads(net);
  net.Forward(x0.data(), batch, out2.data());
  AlignedVector<float> scratch;
  net.Infer(other.data(), 50, infer.data(), &scratch);
  net.Backward(x0.data(), dout.data(), batch, dx2.data());
  const std::vector<float> g2 = CrossGrads(net);
  EXPECT_TRUE(BitwiseEqual(out1.data(), out2.data(), out1.size()));
  EXPECT_TRUE(BitwiseEqual(dx1.data(), dx2.data(), dx1.size()));
  ASSERT_EQ(g1.size(), g2.size());
  EXPECT_TRUE(BitwiseEqual(g1.data(), g2.data(), g1.size()));

  net.Forward(x0.data(), 0, out1.data());
  net.Backward(x0.data(), dout.data(), 0, dx1.data());
  for (float g : CrossGrads(net)) ASSERT_EQ(g, 0.0f);
}

// ---------------------------------------------------------------- Loss

TEST(LossTest, HandComputedValues) {
  const float z[] = {0, 0, 2, -3};
  const float y[] = {1, 0, 1, 1};
  const double want[] = {std::log(2.0), std::log(2.0),
                         std::log1p(std::exp(-2.0)),
                         3.0 + std::log1p(std::exp(-3.0))};
  for (int i = 0; i < 4; ++i) {
    float g = 0;
    EXPECT_NEAR(BceWithLogits(&z[i], &y[i], 1, 1.0f, &g), want[i], 1e-12) << i;
    const double sig = 1.0 / (1.0 + std::exp(-static_cast<double>(z[i])));
    EXPECT_NEAR(g, sig - y[i], 1e-7) << i;
  }
  std::vector<float> g(4);
  const double mean = (want[0] + want[1] + want[2] + want[3]) / 4;
  EXPECT_NEAR(BceWithLogits(z, y, 4, 0.25f, g.data()), mean, 1e-12);
  EXPECT_NEAR(g[0], -0.125f, 1e-7);  // (0.5 - 1) / 4
  EXPECT_NEAR(g[1], 0.125f, 1e-7);
  EXPECT_NEAR(BceWithLogits(z, y, 4, 0.25f, nullptr), mean, 1e-12);
  EXPECT_EQ(BceWithLogits(z, y, 0, 1.0f, nullptr), 0.0);
}

TEST(LossTest, ExtremeLogitsAreFinite) {
  const float z[] = {100, -100, 100, -100, 80, -80};
  const float y[] = {0, 1, 1, 0, 0, 1};
  const double want[] = {100, 100, 0, 0, 80, 80};
  for (int i = 0; i < 6; ++i) {
    float g = 0;
    const double l = BceWithLogits(&z[i], &y[i], 1, 1.0f, &g);
    EXPECT_TRUE(std::isfinite(l));
    EXPECT_NEAR(l, want[i], 1e-9) << i;
    EXPECT_TRUE(std::isfinite(g));
    EXPECT_NEAR(g, (z[i] > 0 ? 1.0f : 0.0f) - y[i], 1e-7) << i;
  }
  EXPECT_EQ(Sigmoid(100), 1.0f);
  EXPECT_EQ(Sigmoid(-100), std::exp(-100.0f) / (1 + std::exp(-100.0f)));
}

TEST(LossTest, GradientMatchesFiniteDifferences) {
  Rng rng = SeededRng(51);
  const int64_t batch = 7;
  std::vector<float> z = RandomVector(&rng, batch, 3.0), y(batch), g(batch);
  for (float& v : y) v = rng.Uniform() < 0.5 ? 0.0f : 1.0f;
  BceWithLogits(z.data(), y.data(), batch, 1.0f / batch, g.data());
  auto loss = [&] {
    return BceWithLogits(z.data(), y.data(), batch, 1.0f, nullptr);
  };
  for (int64_t i = 0; i < batch; ++i) {
    EXPECT_NEAR(g[i], NumericalGradient(&z[i], 1e-3f, loss), 1e-5) << i;
  }
}

// ---------------------------------------------------------------- Optimizers

OptimizerConfig MakeConfig(OptimizerConfig::Type type, float lr) {
  OptimizerConfig c;
  c.set_type(type);
  c.set_learning_rate(lr);
  c.set_eps(1e-8f);
  c.set_beta1(0.9f);
  c.set_beta2(0.999f);
  return c;
}

// One parameter of 3 elements; grads set per step.
struct OneParam {
  std::vector<float> value = {1.0f, -2.0f, 0.5f};
  std::vector<float> grad = {0.0f, 0.0f, 0.0f};
  std::vector<ParamRef> refs() { return {{"w", value.data(), grad.data(), 3}}; }
};

TEST(OptimizerTest, Sgd) {
  OneParam p;
  auto opt =
      DenseOptimizer::Create(MakeConfig(OptimizerConfig::SGD, 0.1f), p.refs());
  ASSERT_TRUE(opt.ok()) << opt.status();
  p.grad = {0.5f, -1.0f, 0.0f};
  (*opt)->Step();
  EXPECT_FLOAT_EQ(p.value[0], 0.95f);
  EXPECT_FLOAT_EQ(p.value[1], -1.9f);
  EXPECT_FLOAT_EQ(p.value[2], 0.5f);
  (*opt)->Step();
  EXPECT_FLOAT_EQ(p.value[0], 0.9f);
  EXPECT_FLOAT_EQ(p.value[1], -1.8f);
  EXPECT_EQ((*opt)->step(), 2);
  EXPECT_TRUE((*opt)->State().empty());
}

void CheckAdagrad(OptimizerConfig::Type type) {
  OneParam p;
  OptimizerConfig c = MakeConfig(type, 0.1f);
  c.set_initial_accumulator(0.1f);
  auto opt = DenseOptimizer::Create(c, p.refs());
  ASSERT_TRUE(opt.ok()) << opt.status();
  p.grad = {0.5f, 0.0f, 0.0f};
  (*opt)->Step();
  // s = 0.1 + 0.25; p = 1 - 0.1 * 0.5 / sqrt(0.35).
  EXPECT_NEAR(p.value[0], 0.9154845759557197, 1e-6);
  EXPECT_EQ(p.value[1], -2.0f);  // zero gradient: no change
  (*opt)->Step();
  // s = 0.6; p -= 0.05 / sqrt(0.6).
  EXPECT_NEAR(p.value[0], 0.8509348543522628, 1e-6);
  std::vector<ParamRef> state = (*opt)->State();
  ASSERT_EQ(state.size(), 1u);
  EXPECT_EQ(state[0].name, "w.sum");
  EXPECT_EQ(state[0].size, 3);
  EXPECT_NEAR(state[0].value[0], 0.6f, 1e-6);
  EXPECT_NEAR(state[0].value[1], 0.1f, 1e-7);
}

TEST(OptimizerTest, Adagrad) { CheckAdagrad(OptimizerConfig::ADAGRAD); }

TEST(OptimizerTest, RowwiseAdagradIsPlainAdagradForDense) {
  CheckAdagrad(OptimizerConfig::ROWWISE_ADAGRAD);
}

TEST(OptimizerTest, AdamWithBiasCorrection) {
  OneParam p;
  auto opt =
      DenseOptimizer::Create(MakeConfig(OptimizerConfig::ADAM, 0.1f), p.refs());
  ASSERT_TRUE(opt.ok()) << opt.status();
  p.grad = {0.5f, 0.0f, -3.0f};
  (*opt)->Step();
  // Step 1: m_hat = g, v_hat = g^2, so p -= lr * sign(g) (up to eps).
  EXPECT_NEAR(p.value[0], 0.9, 1e-6);
  EXPECT_EQ(p.value[1], -2.0f);
  EXPECT_NEAR(p.value[2], 0.6, 1e-6);
  p.grad = {-0.25f, 0.0f, 0.0f};
  (*opt)->Step();
  // m = 0.02, v = 0.00031225, bc1 = 0.19, bc2 = 0.001999.
  EXPECT_NEAR(p.value[0], 0.8733662987078463, 1e-6);
  EXPECT_EQ((*opt)->step(), 2);
  std::vector<ParamRef> state = (*opt)->State();
  ASSERT_EQ(state.size(), 2u);
  EXPECT_EQ(state[0].name, "w.exp_avg");
  EXPECT_EQ(state[1].name, "w.exp_avg_sq");
  EXPECT_NEAR(state[0].value[0], 0.02f, 1e-7);
  // 1 - 0.999f is 0.0010000467: float betas move v by ~1e-5 relative.
  EXPECT_NEAR(state[1].value[0], 0.00031225f, 1e-8);
}

TEST(OptimizerTest, CreateRejectsBadConfigs) {
  OneParam p;
  OptimizerConfig bad_type = MakeConfig(OptimizerConfig::SGD, 0.1f);
  bad_type.set_type(static_cast<OptimizerConfig::Type>(42));
  EXPECT_EQ(DenseOptimizer::Create(bad_type, p.refs()).status().code(),
            absl::StatusCode::kInvalidArgument);
  for (float lr : {0.0f, -0.1f, std::numeric_limits<float>::quiet_NaN()}) {
    EXPECT_EQ(
        DenseOptimizer::Create(MakeConfig(OptimizerConfig::ADAM, lr), p.refs())
            .status()
            .code(),
        absl::StatusCode::kInvalidArgument)
        << lr;
  }
  OptimizerConfig no_eps = MakeConfig(OptimizerConfig::ADAGRAD, 0.1f);
  no_eps.set_eps(0);
  EXPECT_EQ(DenseOptimizer::Create(no_eps, p.refs()).status().code(),
            absl::StatusCode::kInvalidArgument);

  const OptimizerConfig ok = MakeConfig(OptimizerConfig::SGD, 0.1f);
  std::vector<ParamRef> null_value = {{"w", nullptr, p.grad.data(), 3}};
  std::vector<ParamRef> null_grad = {{"w", p.value.data(), nullptr, 3}};
  std::vector<ParamRef> negative = {{"w", p.value.data(), p.grad.data(), -1}};
  for (const auto& refs : {null_value, null_grad, negative}) {
    EXPECT_EQ(DenseOptimizer::Create(ok, refs).status().code(),
              absl::StatusCode::kInvalidArgument);
  }
  EXPECT_TRUE(DenseOptimizer::Create(ok, {}).ok());
}

// DenseOptimizer gives the bits of the rule's DenseElement run here, on the
// OpenMP path and off it, with its state named and sized as optim says.
TEST(OptimizerTest, StepIsTheSharedRuleBitwise) {
  for (auto type : {OptimizerConfig::SGD, OptimizerConfig::ADAGRAD,
                    OptimizerConfig::ROWWISE_ADAGRAD, OptimizerConfig::ADAM}) {
    Rng rng = SeededRng(67);
    OptimizerConfig config = MakeConfig(type, 0.01f);
    config.set_initial_accumulator(0.1f);
    const int64_t sizes[2] = {1000, 1 << 16};
    std::vector<float> w[2], g[2];
    std::vector<ParamRef> refs;
    for (int i = 0; i < 2; ++i) {
      w[i] = RandomVector(&rng, sizes[i]);
      g[i].resize(sizes[i]);
      refs.push_back(
          {i == 0 ? "small" : "large", w[i].data(), g[i].data(), sizes[i]});
    }
    std::vector<float> want[2] = {w[0], w[1]};
    std::vector<float> s1[2], s2[2];
    for (int i = 0; i < 2; ++i) {
      s1[i].assign(sizes[i], config.initial_accumulator());
      s2[i].assign(sizes[i], 0.0f);
      if (type == OptimizerConfig::ADAM) s1[i].assign(sizes[i], 0.0f);
    }
    auto opt = DenseOptimizer::Create(config, refs);
    ASSERT_TRUE(opt.ok()) << opt.status();
    for (int64_t step = 1; step <= 3; ++step) {
      // In place: the optimizer holds pointers into g.
      for (int i = 0; i < 2; ++i) {
        const std::vector<float> fresh = RandomVector(&rng, sizes[i]);
        std::copy(fresh.begin(), fresh.end(), g[i].begin());
      }
      (*opt)->Step();
      optim::VisitElementWise(type, [&](auto rule) {
        using Rule = decltype(rule);
        const auto constants = Rule::MakeStep(config, step);
        for (int i = 0; i < 2; ++i) {
          for (int64_t k = 0; k < sizes[i]; ++k) {
            Rule::DenseElement(constants, g[i][k], want[i].data(), s1[i].data(),
                               s2[i].data(), k);
          }
        }
      });
    }
    const std::vector<ParamRef> state = (*opt)->State();
    ASSERT_EQ(state.size(), 2 * optim::DenseState(config).size());
    for (int i = 0; i < 2; ++i) {
      EXPECT_TRUE(BitwiseEqual(w[i].data(), want[i].data(), sizes[i]))
          << OptimizerConfig::Type_Name(type) << " param " << i;
      if (state.empty()) continue;
      const size_t per_param = state.size() / 2;
      EXPECT_EQ(state[i * per_param].size, sizes[i]);
      EXPECT_TRUE(
          BitwiseEqual(state[i * per_param].value, s1[i].data(), sizes[i]))
          << OptimizerConfig::Type_Name(type) << " state1 " << i;
      if (per_param > 1) {
        EXPECT_TRUE(BitwiseEqual(state[i * per_param + 1].value, s2[i].data(),
                                 sizes[i]))
            << OptimizerConfig::Type_Name(type) << " state2 " << i;
      }
    }
  }
}

// With bf16 copies handed over, every step writes each copy as the bf16
// rounding of the updated weights, in the same pass (the element-wise and
// the layer-wise rules, small and OpenMP-sized parameters), and leaves a
// parameter without a copy alone; the fp32 weights are those of a run
// without copies, bit for bit. A count other than the parameters' is
// refused.
TEST(OptimizerTest, StepsWriteTheBf16CopiesOfTheWeights) {
  Rng rng = SeededRng(97);
  for (auto type :
       {OptimizerConfig::SGD, OptimizerConfig::ADAM, OptimizerConfig::LAMB}) {
    SCOPED_TRACE(OptimizerConfig::Type_Name(type));
    const int64_t big = 100000, small = 37;
    std::vector<float> w[2] = {RandomVector(&rng, big),
                               RandomVector(&rng, small)};
    std::vector<float> g[2] = {RandomVector(&rng, big),
                               RandomVector(&rng, small)};
    std::vector<float> twin[2] = {w[0], w[1]};
    std::vector<Bf16> copy(big, 0x7777);
    auto refs = [&](std::vector<float>* v) {
      return std::vector<ParamRef>{{"a.weight", v[0].data(), g[0].data(), big},
                                   {"a.bias", v[1].data(), g[1].data(), small}};
    };
    auto opt = DenseOptimizer::Create(MakeConfig(type, 0.01f), refs(w));
    auto plain = DenseOptimizer::Create(MakeConfig(type, 0.01f), refs(twin));
    ASSERT_TRUE(opt.ok() && plain.ok());
    EXPECT_EQ((*opt)->SetBf16Copies({copy.data()}).code(),
              absl::StatusCode::kInvalidArgument);
    ASSERT_TRUE((*opt)->SetBf16Copies({copy.data(), nullptr}).ok());
    for (int step = 0; step < 3; ++step) {
      (*opt)->Step();
      (*plain)->Step();
      for (int64_t k = 0; k < big; ++k) {
        ASSERT_EQ(copy[k], ToBf16(w[0][k])) << "step " << step << " " << k;
      }
      ASSERT_TRUE(BitwiseEqual(w[0].data(), twin[0].data(), big));
      ASSERT_TRUE(BitwiseEqual(w[1].data(), twin[1].data(), small));
    }
  }
}

// Large parameters take the OpenMP path; two runs must agree bitwise.
TEST(OptimizerTest, DeterministicOnLargeParameters) {
  for (auto type : {OptimizerConfig::SGD, OptimizerConfig::ADAGRAD,
                    OptimizerConfig::ADAM}) {
    std::vector<float> results[2];
    for (auto& result : results) {
      Rng rng = SeededRng(61);
      std::vector<float> w = RandomVector(&rng, 100000);
      std::vector<float> g = RandomVector(&rng, 100000);
      auto opt = DenseOptimizer::Create(MakeConfig(type, 0.01f),
                                        {{"w", w.data(), g.data(), 100000}});
      ASSERT_TRUE(opt.ok());
      for (int s = 0; s < 3; ++s) (*opt)->Step();
      result = w;
    }
    EXPECT_TRUE(BitwiseEqual(results[0].data(), results[1].data(), 100000));
  }
}

// ------------------------------------------------- layer-wise optimizers

// A weight of 3 elements and a bias of 2, as one Linear's parameters.
struct WeightAndBias {
  std::vector<float> w = {1.0f, -2.0f, 0.5f}, gw = {0.5f, 0.0f, -3.0f};
  std::vector<float> b = {0.25f, -0.5f}, gb = {2.0f, -1.0f};
  std::vector<ParamRef> refs() {
    return {{"l.weight", w.data(), gw.data(), 3},
            {"l.bias", b.data(), gb.data(), 2}};
  }
};

// The layer-wise tests' config: `type` at rate 0.1 with weight decay 0.1.
OptimizerConfig LayerWiseConfig(OptimizerConfig::Type type) {
  OptimizerConfig c = MakeConfig(type, 0.1f);
  c.set_weight_decay(0.1f);
  return c;
}

// Each of `got` within `tol` of `want` (as many of them), naming `what`[i].
void ExpectNearAll(const std::vector<float>& got,
                   const std::vector<double>& want, double tol,
                   const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_NEAR(got[i], want[i], tol) << what << "[" << i << "]";
  }
}

// `p`'s weight within `tol_w` of `want_w` and its bias within `tol_b` of
// `want_b`.
void ExpectWeightAndBias(const WeightAndBias& p,
                         const std::vector<double>& want_w, double tol_w,
                         const std::vector<double>& want_b, double tol_b) {
  ExpectNearAll(p.w, want_w, tol_w, "w");
  ExpectNearAll(p.b, want_b, tol_b, "b");
}

// The names of `params`, in order.
std::vector<std::string> ParamNames(const std::vector<ParamRef>& params) {
  std::vector<std::string> names;
  for (const ParamRef& p : params) names.push_back(p.name);
  return names;
}

TEST(LayerWiseOptimizerTest, LambByHand) {
  WeightAndBias p;
  auto opt =
      DenseOptimizer::Create(LayerWiseConfig(OptimizerConfig::LAMB), p.refs());
  ASSERT_TRUE(opt.ok()) << opt.status();
  (*opt)->Step();
  // Step 1: the bias-corrected Adam step is g / |g| (0 where g is 0):
  // u = (1, 0, -1) + 0.1 w = (1.1, -0.2, -0.95); ||w|| = sqrt(5.25),
  // ||u|| = sqrt(2.1525): w -= 0.1 * 1.5617376 * u. The bias: plain Adam,
  // no decay, no trust ratio: b -= 0.1 * sign(g).
  ExpectWeightAndBias(
      p, {0.8282088630374556, -1.9687652472570873, 0.6483650750082559}, 1e-6,
      {0.15, -0.4}, 1e-6);
  const std::vector<ParamRef> state = (*opt)->State();
  ASSERT_EQ(ParamNames(state),
            (std::vector<std::string>{"l.weight.exp_avg", "l.weight.exp_avg_sq",
                                      "l.bias.exp_avg", "l.bias.exp_avg_sq"}));
  EXPECT_NEAR(state[0].value[2], -0.3, 1e-6);
  // 1 - 0.999f is 0.0010000467: v is off by ~1e-5 relative.
  EXPECT_NEAR(state[1].value[2], 0.009, 2e-7);
}

TEST(LayerWiseOptimizerTest, LarsByHand) {
  WeightAndBias p;
  OptimizerConfig c = LayerWiseConfig(OptimizerConfig::LARS);
  c.set_momentum(0.9f);
  c.set_trust_coefficient(0.01f);
  auto opt = DenseOptimizer::Create(c, p.refs());
  ASSERT_TRUE(opt.ok()) << opt.status();
  // local = 0.01 ||w|| / (||g|| + 0.1 ||w||); v = 0.9 v + 0.1 local (g +
  // 0.1 w); w -= v. The bias: v = 0.9 v + 0.1 g, b -= v.
  (*opt)->Step();
  ExpectWeightAndBias(
      p, {0.999579645777719, -1.9998598819259064, 0.5020667415928818}, 1e-7,
      {0.05, -0.4}, 1e-7);
  (*opt)->Step();  // the same gradients again
  ExpectWeightAndBias(
      p, {0.99878097726315, -1.9995936590877166, 0.5059935284561794}, 1e-7,
      {-0.33, -0.21}, 1e-6);
  const std::vector<ParamRef> state = (*opt)->State();
  ASSERT_EQ(ParamNames(state),
            (std::vector<std::string>{"l.weight.momentum_buffer",
                                      "l.bias.momentum_buffer"}));
  EXPECT_NEAR(state[0].value[2], -0.003926786863297595, 1e-8);
  EXPECT_EQ((*opt)->step(), 2);
}

// The paper's formulas written out in double, one tensor at a time:
// LAMB (You et al. 2019) with bias correction, LARS (You et al. 2017) with
// the rate inside the momentum; biases without decay or trust ratio; ratio
// 1 where a norm is 0.
struct PlainTensor {
  std::string name;
  std::vector<double> w, m, v;
};

void PlainLayerWiseStep(const OptimizerConfig& c, double lr, int64_t t,
                        const std::vector<std::vector<float>>& grads,
                        std::vector<PlainTensor>* tensors) {
  const double b1 = c.beta1(), b2 = c.beta2(), eps = c.eps();
  for (size_t k = 0; k < tensors->size(); ++k) {
    PlainTensor& p = (*tensors)[k];
    const std::vector<float>& g = grads[k];
    const size_t n = p.w.size();
    const bool bias =
        p.name.size() >= 5 && p.name.substr(p.name.size() - 5) == ".bias";
    const double wd = bias ? 0.0 : c.weight_decay();
    double w_norm = 0, other_norm = 0;
    for (size_t i = 0; i < n; ++i) w_norm += p.w[i] * p.w[i];
    w_norm = std::sqrt(w_norm);
    if (c.type() == OptimizerConfig::LAMB) {
      std::vector<double> u(n);
      for (size_t i = 0; i < n; ++i) {
        p.m[i] = b1 * p.m[i] + (1 - b1) * g[i];
        p.v[i] = b2 * p.v[i] + (1 - b2) * double{g[i]} * g[i];
        const double m_hat = p.m[i] / (1 - std::pow(b1, double(t)));
        const double v_hat = p.v[i] / (1 - std::pow(b2, double(t)));
        u[i] = m_hat / (std::sqrt(v_hat) + eps) + wd * p.w[i];
        other_norm += u[i] * u[i];
      }
      other_norm = std::sqrt(other_norm);
      const double ratio =
          !bias && w_norm > 0 && other_norm > 0 ? w_norm / other_norm : 1.0;
      for (size_t i = 0; i < n; ++i) p.w[i] -= lr * ratio * u[i];
    } else {
      for (size_t i = 0; i < n; ++i) other_norm += double{g[i]} * g[i];
      other_norm = std::sqrt(other_norm);
      const double local =
          !bias && w_norm > 0 && other_norm > 0
              ? c.trust_coefficient() * w_norm / (other_norm + wd * w_norm)
              : 1.0;
      for (size_t i = 0; i < n; ++i) {
        p.m[i] = c.momentum() * p.m[i] + lr * local * (g[i] + wd * p.w[i]);
        p.w[i] -= p.m[i];
      }
    }
  }
}

// DenseOptimizer against the plain formulas on random inputs for 6 steps,
// with a warm-up and a decay: a weight, a bias, a zero-initialised weight
// (ratio 1 on step 1), one whose gradient stays 0, and one large enough
// for the OpenMP path and several norm blocks.
TEST(LayerWiseOptimizerTest, MatchesThePlainFormulasInDouble) {
  for (auto type : {OptimizerConfig::LAMB, OptimizerConfig::LARS}) {
    SCOPED_TRACE(OptimizerConfig::Type_Name(type));
    Rng rng = SeededRng(71);
    OptimizerConfig c =
        MakeConfig(type, type == OptimizerConfig::LAMB ? 0.01f : 0.5f);
    c.set_weight_decay(0.01f);
    if (type == OptimizerConfig::LARS) {
      c.set_momentum(0.9f);
      c.set_trust_coefficient(0.02f);
    }
    LearningRateSchedule* schedule = c.mutable_schedule();
    schedule->set_warmup_steps(3);
    schedule->set_warmup_start_factor(0.1f);
    schedule->mutable_polynomial_decay()->set_decay_start_step(3);
    schedule->mutable_polynomial_decay()->set_decay_steps(4);
    schedule->mutable_polynomial_decay()->set_power(2);
    schedule->mutable_polynomial_decay()->set_end_factor(0.2f);
    const std::vector<std::string> names = {"a.weight", "a.bias", "zero.weight",
                                            "still.weight", "big.weight"};
    const std::vector<int64_t> sizes = {1000, 37, 64, 50, 70000};
    std::vector<std::vector<float>> w(names.size()), g(names.size());
    std::vector<ParamRef> refs;
    std::vector<PlainTensor> want;
    for (size_t k = 0; k < names.size(); ++k) {
      w[k] = RandomVector(&rng, sizes[k], 0.5);
      if (names[k] == "zero.weight") std::fill(w[k].begin(), w[k].end(), 0.0f);
      g[k].assign(sizes[k], 0.0f);
      refs.push_back({names[k], w[k].data(), g[k].data(), sizes[k]});
      want.push_back({names[k], std::vector<double>(w[k].begin(), w[k].end()),
                      std::vector<double>(sizes[k], 0.0),
                      std::vector<double>(sizes[k], 0.0)});
    }
    auto opt = DenseOptimizer::Create(c, refs);
    ASSERT_TRUE(opt.ok()) << opt.status();
    for (int64_t t = 1; t <= 6; ++t) {
      for (size_t k = 0; k < names.size(); ++k) {
        if (names[k] == "still.weight") continue;
        const std::vector<float> fresh = RandomVector(&rng, sizes[k], 0.1);
        std::copy(fresh.begin(), fresh.end(), g[k].begin());
      }
      (*opt)->Step();
      // The schedule by hand: warm-up 0.1 + 0.9 t / 3, then 0.2 + 0.8 (1 -
      // (t - 3) / 4)^2.
      const double multiplier =
          t < 3 ? 0.1 + 0.9 * t / 3.0
                : 0.2 + 0.8 * std::pow(1.0 - std::min<int64_t>(t - 3, 4) / 4.0,
                                       2.0);
      PlainLayerWiseStep(c, c.learning_rate() * multiplier, t, g, &want);
    }
    for (size_t k = 0; k < names.size(); ++k) {
      double scale = 0;
      for (double x : want[k].w) scale = std::max(scale, std::fabs(x));
      int bad = 0;
      for (int64_t i = 0; i < sizes[k]; ++i) {
        if (!(std::fabs(w[k][i] - want[k].w[i]) <= 2e-6 * scale) &&
            ++bad <= 3) {
          ADD_FAILURE() << names[k] << "[" << i << "]: " << w[k][i] << " vs "
                        << want[k].w[i];
        }
      }
      EXPECT_EQ(bad, 0) << names[k];
    }
  }
}

// The norms are reduced in a fixed order: the same bits with 1 thread and
// with several.
TEST(LayerWiseOptimizerTest, DeterministicAcrossThreadCounts) {
  const int max_threads = omp_get_max_threads();
  for (auto type : {OptimizerConfig::LAMB, OptimizerConfig::LARS}) {
    std::vector<float> results[2];
    for (int run = 0; run < 2; ++run) {
      omp_set_num_threads(run == 0 ? 1 : std::max(2, max_threads));
      Rng rng = SeededRng(73);
      std::vector<float> w = RandomVector(&rng, 100000);
      std::vector<float> g = RandomVector(&rng, 100000);
      OptimizerConfig c = MakeConfig(type, 0.01f);
      c.set_weight_decay(0.01f);
      if (type == OptimizerConfig::LARS) c.set_trust_coefficient(0.001f);
      auto opt = DenseOptimizer::Create(c, {{"w", w.data(), g.data(), 100000}});
      ASSERT_TRUE(opt.ok()) << opt.status();
      for (int s = 0; s < 3; ++s) (*opt)->Step();
      results[run] = w;
    }
    omp_set_num_threads(max_threads);
    EXPECT_TRUE(BitwiseEqual(results[0].data(), results[1].data(), 100000))
        << OptimizerConfig::Type_Name(type);
  }
}

// ------------------------------------------------------------ Dense backend

// The host columns of the interaction input and the host staging they
// need: 3 dense columns, then tables of 4, 2 and 5 columns (width 14).
TEST(HostColumnsTest, StagingEndsAtTheLastHostColumn) {
  InteractionShape shape;
  shape.dim = 3;
  shape.input_width = 14;
  // No table on the device: every embedding column on the host, whole rows.
  const std::vector<ColumnRange> all = HostColumns(shape, {});
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(all[0].begin, 3);
  EXPECT_EQ(all[0].end, 14);
  EXPECT_EQ(HostRowsFloats(shape, all, 10), 140);
  // The last table on the device: the last row ends at column 9.
  const std::vector<ColumnRange> last = {{9, 14}};
  const std::vector<ColumnRange> front = HostColumns(shape, last);
  ASSERT_EQ(front.size(), 1u);
  EXPECT_EQ(front[0].end, 9);
  EXPECT_EQ(HostRowsFloats(shape, front, 10), 9 * 14 + 9);
  // The middle table on the device: two host ranges, rows still whole.
  const std::vector<ColumnRange> middle = {{7, 9}};
  const std::vector<ColumnRange> split = HostColumns(shape, middle);
  ASSERT_EQ(split.size(), 2u);
  EXPECT_EQ(split[0].begin, 3);
  EXPECT_EQ(split[0].end, 7);
  EXPECT_EQ(split[1].begin, 9);
  EXPECT_EQ(HostRowsFloats(shape, split, 10), 140);
  // Every table on the device: nothing staged on the host, whatever the
  // batch (the CUDA backend then pins nothing for the interaction input).
  const std::vector<ColumnRange> every = {{3, 7}, {7, 9}, {9, 14}};
  EXPECT_TRUE(HostColumns(shape, every).empty());
  EXPECT_EQ(HostRowsFloats(shape, HostColumns(shape, every), 65536), 0);
  EXPECT_EQ(HostRowsFloats(shape, all, 0), 0);
}

using dlrm::testing::DenseBackendConfig;
using dlrm::testing::DenseStepInputs;
using dlrm::testing::DenseStepResult;
using dlrm::testing::ExpectCopyParamsToSnapshots;
using dlrm::testing::FillInteractionInput;
using dlrm::testing::ParamValues;
using dlrm::testing::RandomDenseStep;
using dlrm::testing::RunDenseStep;

TEST(DenseBackendTest, InteractionShapes) {
  const InteractionShape dot = MakeInteractionShape(
      DenseBackendConfig(INTERACTION_DOT, OptimizerConfig::SGD));
  EXPECT_EQ(dot.kind, INTERACTION_DOT);
  EXPECT_EQ(dot.num_vectors, 4);
  EXPECT_EQ(dot.dim, 4);
  EXPECT_EQ(dot.input_width, 16);
  EXPECT_EQ(dot.output_width, DotInteractionDim(4, 4));
  EXPECT_FALSE(InteractionIsIdentity(INTERACTION_DOT));
  const InteractionShape cat = MakeInteractionShape(
      DenseBackendConfig(INTERACTION_CAT, OptimizerConfig::SGD));
  EXPECT_EQ(cat.input_width, 16);
  EXPECT_EQ(cat.output_width, 16);
  EXPECT_TRUE(InteractionIsIdentity(INTERACTION_CAT));
  const InteractionShape dcn = MakeInteractionShape(
      DenseBackendConfig(INTERACTION_DCN, OptimizerConfig::SGD));
  EXPECT_EQ(dcn.input_width, 16);
  EXPECT_EQ(dcn.output_width, 16);
  EXPECT_FALSE(InteractionIsIdentity(INTERACTION_DCN));
}

// The CPU backend's step is the layers composed by hand, bit for bit: the
// numbers model::Model's step had before the backend existed.
TEST(DenseBackendTest, CpuStepIsTheLayersComposed) {
  for (Interaction kind : {INTERACTION_DOT, INTERACTION_CAT, INTERACTION_DCN}) {
    for (auto type :
         {OptimizerConfig::SGD, OptimizerConfig::ADAGRAD, OptimizerConfig::ADAM,
          OptimizerConfig::LAMB, OptimizerConfig::LARS}) {
      SCOPED_TRACE(Interaction_Name(kind) + " " +
                   OptimizerConfig::Type_Name(type));
      const ModelConfig config = DenseBackendConfig(kind, type);
      auto backend = CreateDenseBackend(config);
      ASSERT_TRUE(backend.ok()) << backend.status();
      EXPECT_EQ((*backend)->device(), DEVICE_CPU);
      auto ref = HostDenseParams::Create(config);
      ASSERT_TRUE(ref.ok()) << ref.status();
      HostDenseParams& p = **ref;
      const InteractionShape s = MakeInteractionShape(config);
      Rng rng = SeededRng(83);
      for (int step = 0; step < 3; ++step) {
        const DenseStepInputs in = RandomDenseStep(config, 19 + step, rng);
        auto got = RunDenseStep(**backend, in);
        ASSERT_TRUE(got.ok()) << got.status();

        const int64_t n = in.batch;
        std::vector<float> t(n * s.input_width);
        const float* bottom = p.bottom.Forward(in.x.data(), n);
        for (int64_t l = 0; l < n; ++l) {
          std::copy(bottom + l * s.dim, bottom + (l + 1) * s.dim,
                    t.begin() + l * s.input_width);
          std::copy(in.pooled.begin() + l * (s.input_width - s.dim),
                    in.pooled.begin() + (l + 1) * (s.input_width - s.dim),
                    t.begin() + l * s.input_width + s.dim);
        }
        std::vector<float> z = t;
        if (kind == INTERACTION_DOT) {
          z.resize(n * s.output_width);
          DotInteractionForward(t.data(), n, s.num_vectors, s.dim, z.data());
        }
        if (kind == INTERACTION_DCN) {
          p.interaction->Forward(t.data(), n, z.data());
        }
        const float* logits = p.top.Forward(z.data(), n);
        std::vector<float> dlogits(n);
        const double loss = BceWithLogits(logits, in.labels.data(), n, 1.0f / n,
                                          dlogits.data());
        std::vector<float> dz(n * s.output_width);
        p.top.Backward(z.data(), dlogits.data(), n, dz.data());
        std::vector<float> dt = dz;
        if (kind == INTERACTION_DOT) {
          dt.resize(n * s.input_width);
          DotInteractionBackward(t.data(), dz.data(), n, s.num_vectors, s.dim,
                                 dt.data());
        }
        if (kind == INTERACTION_DCN) {
          p.interaction->Backward(t.data(), dz.data(), n, dt.data());
        }
        std::vector<float> dbottom(n * s.dim);
        for (int64_t l = 0; l < n; ++l) {
          std::copy(dt.begin() + l * s.input_width,
                    dt.begin() + l * s.input_width + s.dim,
                    dbottom.begin() + l * s.dim);
        }
        p.bottom.Backward(in.x.data(), dbottom.data(), n, nullptr);
        std::vector<float> grads, params, state;
        for (const ParamRef& r : p.params) {
          grads.insert(grads.end(), r.grad, r.grad + r.size);
        }
        p.optimizer->Step();
        for (const ParamRef& r : p.params) {
          params.insert(params.end(), r.value, r.value + r.size);
        }
        for (const ParamRef& r : p.optimizer->State()) {
          state.insert(state.end(), r.value, r.value + r.size);
        }

        EXPECT_EQ(got->loss, loss);
        ASSERT_EQ(got->dt.size(), dt.size());
        EXPECT_TRUE(BitwiseEqual(got->dt.data(), dt.data(), dt.size()));
        ASSERT_EQ(got->grads.size(), grads.size());
        EXPECT_TRUE(
            BitwiseEqual(got->grads.data(), grads.data(), grads.size()));
        ASSERT_EQ(got->params.size(), params.size());
        EXPECT_TRUE(
            BitwiseEqual(got->params.data(), params.data(), params.size()));
        ASSERT_EQ(got->state.size(), state.size());
        EXPECT_TRUE(
            BitwiseEqual(got->state.data(), state.data(), state.size()));
        // Predict: the inference path on the updated weights.
        const float* after = p.bottom.Forward(in.x.data(), n);
        for (int64_t l = 0; l < n; ++l) {
          std::copy(after + l * s.dim, after + (l + 1) * s.dim,
                    t.begin() + l * s.input_width);
        }
        z = t;
        if (kind == INTERACTION_DOT) {
          z.resize(n * s.output_width);
          DotInteractionForward(t.data(), n, s.num_vectors, s.dim, z.data());
        }
        if (kind == INTERACTION_DCN) {
          p.interaction->Forward(t.data(), n, z.data());
        }
        const float* out = p.top.Forward(z.data(), n);
        for (int64_t l = 0; l < n; ++l) {
          EXPECT_EQ(got->probs[l], Sigmoid(out[l])) << "sample " << l;
        }
      }
    }
  }
}

// The gradients of params[begin, end), one after another.
std::vector<float> ConcatGradients(const std::vector<ParamRef>& params,
                                   size_t begin, size_t end) {
  std::vector<float> grads;
  for (size_t i = begin; i < end; ++i) {
    grads.insert(grads.end(), params[i].grad, params[i].grad + params[i].size);
  }
  return grads;
}

// A bucket's parameter range [first, second) in params().
using BucketRange = std::pair<GradBucket, std::pair<size_t, size_t>>;

// Packs `range`'s bucket of `b` with `extra` floats after its gradients and
// expects the buffer to hold the range's gradients in parameter order, then
// the extra floats. `flat` gets the buffer (valid until UnpackGradients),
// `expected` the gradients it holds.
void ExpectPackedInOrder(DenseBackend& b, const BucketRange& range, int extra,
                         std::span<float>* flat, std::vector<float>* expected) {
  auto packed = b.PackGradients(range.first, extra);
  ASSERT_TRUE(packed.ok()) << packed.status();
  *expected =
      ConcatGradients(b.params(), range.second.first, range.second.second);
  ASSERT_EQ(packed->size(), expected->size() + static_cast<size_t>(extra));
  EXPECT_TRUE(BitwiseEqual(packed->data(), expected->data(), expected->size()));
  *flat = *packed;
}

// Parameter names and order (checkpoints use them), the two buckets, and
// packing: the flat buffer holds the bucket's gradients in parameter order
// and then the extra floats; unpacking writes the buffer back.
TEST(DenseBackendTest, ParametersAndGradientBuckets) {
  const ModelConfig config =
      DenseBackendConfig(INTERACTION_DOT, OptimizerConfig::ADAM);
  auto backend = CreateDenseBackend(config);
  ASSERT_TRUE(backend.ok()) << backend.status();
  DenseBackend& b = **backend;
  const std::vector<ParamRef>& params = b.params();
  EXPECT_EQ(ParamNames(params),
            (std::vector<std::string>{
                "bottom_mlp.0.weight", "bottom_mlp.0.bias",
                "bottom_mlp.1.weight", "bottom_mlp.1.bias", "top_mlp.0.weight",
                "top_mlp.0.bias", "top_mlp.1.weight", "top_mlp.1.bias",
                "top_mlp.2.weight", "top_mlp.2.bias"}));
  EXPECT_EQ(params[0].value, b.bottom().layers()[0].weight());
  EXPECT_EQ(params[4].value, b.top().layers()[0].weight());
  EXPECT_EQ(b.optimizer().State().size(), 2 * params.size());

  Rng rng = SeededRng(89);
  ASSERT_TRUE(RunDenseStep(b, RandomDenseStep(config, 9, rng)).ok());
  for (const ParamRef& p : params) {
    for (int64_t i = 0; i < p.size; ++i) p.grad[i] = static_cast<float>(i);
  }
  const BucketRange buckets[] = {{GradBucket::kBottom, {0, 4}},
                                 {GradBucket::kTop, {4, 10}},
                                 {GradBucket::kAll, {0, 10}}};
  for (const BucketRange& entry : buckets) {
    const auto& [bucket, range] = entry;
    std::span<float> flat;
    std::vector<float> expected;
    ASSERT_NO_FATAL_FAILURE(
        ExpectPackedInOrder(b, entry, /*extra=*/1, &flat, &expected));
    for (float& v : flat) v *= 2;
    ASSERT_TRUE(b.UnpackGradients(bucket).ok());
    int64_t at = 0;
    for (size_t i = range.first; i < range.second; ++i) {
      for (int64_t k = 0; k < params[i].size; ++k) {
        ASSERT_EQ(params[i].grad[k], 2 * expected[at + k]) << params[i].name;
      }
      at += params[i].size;
      for (int64_t k = 0; k < params[i].size; ++k) {
        params[i].grad[k] = static_cast<float>(k);
      }
    }
  }
}

// CopyParamsTo on the CPU: the plain copy the predictors made through
// params() before it, bitwise (weights and predictions), for every
// interaction, for an optimizer with state and without, and at bf16 (the
// destination's bf16 copies are rewritten from the copied weights; fp32
// where the CPU has no bf16 instructions).
TEST(DenseBackendTest, CopyParamsToIsThePlainCopy) {
  for (Interaction kind : {INTERACTION_DOT, INTERACTION_CAT, INTERACTION_DCN}) {
    for (auto type : {OptimizerConfig::SGD, OptimizerConfig::ADAM}) {
      for (DensePrecision precision : {PRECISION_FP32, PRECISION_BF16}) {
        SCOPED_TRACE(Interaction_Name(kind) + " " +
                     OptimizerConfig::Type_Name(type) + " " +
                     DensePrecision_Name(precision));
        ModelConfig config = DenseBackendConfig(kind, type);
        config.set_dense_precision(precision);
        ExpectCopyParamsToSnapshots(config, /*steps=*/3, /*tolerance=*/0,
                                    /*seed=*/91, /*old_way=*/true);
      }
    }
  }
}

// A destination of another architecture is refused naming the parameter,
// and nothing is copied.
TEST(DenseBackendTest, CopyParamsToRefusesOtherShapes) {
  const ModelConfig config =
      DenseBackendConfig(INTERACTION_DOT, OptimizerConfig::SGD);
  ModelConfig wider = config;
  wider.set_bottom_mlp(0, 9);
  ModelConfig deeper = config;
  deeper.add_top_mlp(1);
  deeper.set_top_mlp(2, 2);
  auto src = CreateDenseBackend(config);
  ASSERT_TRUE(src.ok()) << src.status();
  for (const ModelConfig& other : {wider, deeper}) {
    auto dst = CreateDenseBackend(other);
    ASSERT_TRUE(dst.ok()) << dst.status();
    const std::vector<float> before = ParamValues(**dst);
    const absl::Status st = (*src)->CopyParamsTo(**dst);
    EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
    EXPECT_HAS_SUBSTR(st.message(), "dense parameter") << st;
    EXPECT_EQ(ParamValues(**dst), before);
  }
}

// Under DCN the cross network's parameters follow the bottom MLP's and
// join its bucket: their gradients are final only after
// InteractionBackward, while the top bucket may be all-reduced from
// TopBackward on. They start as TorchRec's (xavier-normal V and W, zero
// biases), drawn after the MLPs.
TEST(DenseBackendTest, CrossNetParametersJoinTheBottomBucket) {
  const ModelConfig config =
      DenseBackendConfig(INTERACTION_DCN, OptimizerConfig::ADAM);
  auto backend = CreateDenseBackend(config);
  ASSERT_TRUE(backend.ok()) << backend.status();
  const std::vector<ParamRef>& params = (*backend)->params();
  EXPECT_EQ(ParamNames(params),
            (std::vector<std::string>{
                "bottom_mlp.0.weight", "bottom_mlp.0.bias",
                "bottom_mlp.1.weight", "bottom_mlp.1.bias",
                "interaction.crossnet.0.V", "interaction.crossnet.0.W",
                "interaction.crossnet.0.bias", "interaction.crossnet.1.V",
                "interaction.crossnet.1.W", "interaction.crossnet.1.bias",
                "top_mlp.0.weight", "top_mlp.0.bias", "top_mlp.1.weight",
                "top_mlp.1.bias", "top_mlp.2.weight", "top_mlp.2.bias"}));
  EXPECT_EQ(params[4].size, 5 * 16);
  EXPECT_EQ(params[5].size, 16 * 5);
  EXPECT_EQ(params[6].size, 16);
  for (int64_t i = 0; i < params[6].size; ++i) {
    ASSERT_EQ(params[6].value[i], 0.0f);
  }
  EXPECT_EQ((*backend)->optimizer().State().size(), 2 * params.size());
  // The MLPs start as the cat model's of the same seed (the same widths):
  // the cross network draws after them.
  auto cat_backend = CreateDenseBackend(
      DenseBackendConfig(INTERACTION_CAT, OptimizerConfig::ADAM));
  ASSERT_TRUE(cat_backend.ok()) << cat_backend.status();
  const std::vector<ParamRef>& cat = (*cat_backend)->params();
  ASSERT_EQ(cat.size(), params.size() - 6);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_TRUE(BitwiseEqual(params[i].value, cat[i].value, params[i].size))
        << params[i].name;
  }
  for (size_t i = 10; i < params.size(); ++i) {
    EXPECT_TRUE(BitwiseEqual(params[i].value, cat[i - 6].value, params[i].size))
        << params[i].name;
  }

  DenseBackend& b = **backend;
  Rng rng = SeededRng(90);
  ASSERT_TRUE(RunDenseStep(b, RandomDenseStep(config, 9, rng)).ok());
  const BucketRange buckets[] = {{GradBucket::kBottom, {0, 10}},
                                 {GradBucket::kTop, {10, 16}},
                                 {GradBucket::kAll, {0, 16}}};
  for (const BucketRange& range : buckets) {
    std::span<float> flat;
    std::vector<float> expected;
    ASSERT_NO_FATAL_FAILURE(
        ExpectPackedInOrder(b, range, /*extra=*/0, &flat, &expected));
    ASSERT_TRUE(b.UnpackGradients(range.first).ok());
  }
}

// Each interaction's parameters in the host view are its config's
// InteractionParamSpecs, in order, by name and size, and count in
// DenseParameterCount; the registry makes a layer (and gives floats per
// sample) exactly for the interactions with parameters.
TEST(InteractionLayerTest, ParametersAreTheConfigsSpecs) {
  for (Interaction kind : {INTERACTION_DOT, INTERACTION_CAT, INTERACTION_DCN}) {
    SCOPED_TRACE(Interaction_Name(kind));
    const ModelConfig config = DenseBackendConfig(kind, OptimizerConfig::SGD);
    auto p = HostDenseParams::Create(config);
    ASSERT_TRUE(p.ok()) << p.status();
    const std::vector<DenseParamSpec> specs = InteractionParamSpecs(config);
    EXPECT_EQ((*p)->interaction != nullptr, !specs.empty());
    EXPECT_EQ(CreateInteractionLayer(config) != nullptr, !specs.empty());
    const size_t bottom = 2 * config.bottom_mlp_size();
    ASSERT_EQ((*p)->top_begin, bottom + specs.size());
    for (size_t i = 0; i < specs.size(); ++i) {
      EXPECT_EQ((*p)->params[bottom + i].name, specs[i].name);
      EXPECT_EQ((*p)->params[bottom + i].size, specs[i].size());
    }
    int64_t total = 0;
    for (const ParamRef& r : (*p)->params) total += r.size;
    EXPECT_EQ(total, DenseParameterCount(config));
    const InteractionLayerFloats floats =
        InteractionLayerFloatsPerSample(config);
    EXPECT_EQ(floats.train > 0, !specs.empty());
    EXPECT_EQ(floats.predict > 0, !specs.empty());
    if (kind == INTERACTION_DCN) {
      // V [r x N], W [N x r], bias [N] with N 16, r 5.
      ASSERT_EQ(specs.size(), 6u);
      EXPECT_EQ(specs[0].shape, (std::vector<int64_t>{5, 16}));
      EXPECT_EQ(specs[1].shape, (std::vector<int64_t>{16, 5}));
      EXPECT_EQ(specs[2].shape, (std::vector<int64_t>{16}));
    }
  }
}

// The interaction's own config fields: compared as architecture, printed
// after its name, refused under another interaction by name.
TEST(InteractionLayerTest, ConfigFieldsAreComparedPrintedAndOwned) {
  const ModelConfig dcn =
      DenseBackendConfig(INTERACTION_DCN, OptimizerConfig::SGD);
  EXPECT_EQ(InteractionConfigFields(),
            (std::vector<std::string>{"dcn_num_layers", "dcn_low_rank_dim"}));
  EXPECT_EQ(DifferentInteractionField(dcn, dcn), "");
  ModelConfig other = dcn;
  other.set_dcn_low_rank_dim(6);
  EXPECT_EQ(DifferentInteractionField(dcn, other), "dcn_low_rank_dim");
  other.set_dcn_num_layers(3);
  EXPECT_EQ(DifferentInteractionField(dcn, other), "dcn_num_layers");
  EXPECT_EQ(InteractionFieldsText(dcn), " (2 layers, rank 5)");
  const ModelConfig cat =
      DenseBackendConfig(INTERACTION_CAT, OptimizerConfig::SGD);
  EXPECT_EQ(InteractionFieldsText(cat), "");
  ModelConfig stray = cat;
  stray.set_dcn_low_rank_dim(8);
  const absl::Status st = ValidateModelConfig(stray);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(st.message(),
            "dcn_low_rank_dim is set but interaction is INTERACTION_CAT, not "
            "INTERACTION_DCN");
}

// A rank with no local samples still takes part: every call succeeds and
// the gradients are zero.
TEST(DenseBackendTest, EmptyBatch) {
  for (Interaction kind : {INTERACTION_DOT, INTERACTION_DCN}) {
    SCOPED_TRACE(Interaction_Name(kind));
    const ModelConfig config = DenseBackendConfig(kind, OptimizerConfig::SGD);
    auto backend = CreateDenseBackend(config);
    ASSERT_TRUE(backend.ok()) << backend.status();
    Rng rng = SeededRng(97);
    // A step with samples first, so the gradients are not zero by chance.
    ASSERT_TRUE(RunDenseStep(**backend, RandomDenseStep(config, 5, rng)).ok());
    auto r = RunDenseStep(**backend, RandomDenseStep(config, 0, rng));
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_TRUE(r->dt.empty());
    EXPECT_TRUE(r->probs.empty());
    for (float g : r->grads) ASSERT_EQ(g, 0.0f);
  }
}

// Asking for CUDA where there is no GPU is a clear FailedPrecondition that
// says why, never an abort.
TEST(DenseBackendTest, CudaWithoutAGpuIsFailedPrecondition) {
  if (CudaDeviceCount() > 0) {
    GTEST_SKIP() << "this machine has a CUDA device (cuda_dense_test runs "
                    "the CUDA backend)";
  }
  ModelConfig config =
      DenseBackendConfig(INTERACTION_DOT, OptimizerConfig::SGD);
  config.set_device(DEVICE_CUDA);
  auto backend = CreateDenseBackend(config);
  ASSERT_EQ(backend.status().code(), absl::StatusCode::kFailedPrecondition)
      << backend.status();
  const std::string message(backend.status().message());
  EXPECT_HAS_SUBSTR(message, "device cuda") << message;
  EXPECT_HAS_SUBSTR(message, CudaUnavailableReason()) << message;
}

// The CUDA backend runs the layer-wise optimizers too: with a GPU it is
// made, without one the answer is the FailedPrecondition saying why (not a
// refusal of the optimizer).
TEST(DenseBackendTest, CudaTakesTheLayerWiseOptimizers) {
  for (auto type : {OptimizerConfig::LAMB, OptimizerConfig::LARS}) {
    ModelConfig config = DenseBackendConfig(INTERACTION_DOT, type);
    config.set_device(DEVICE_CUDA);
    auto backend = CreateDenseBackend(config);
    if (CudaDeviceCount() > 0) {
      EXPECT_TRUE(backend.ok()) << backend.status();
    } else {
      EXPECT_EQ(backend.status().code(), absl::StatusCode::kFailedPrecondition)
          << backend.status();
      EXPECT_NO_SUBSTR(backend.status().message(), "dense_optimizer")
          << backend.status();
    }
  }
}

// ---------------------------------------------------------------- bf16

// bf16's unit roundoff: 8 significant bits, so rounding moves a value by at
// most 2^-8 of itself (half an ulp of 2^-7).
constexpr double kBf16U = 1.0 / 256;

// The relative bound on one product of two inputs each rounded to bf16
// once: (1 + u)^2 - 1 = 2u + u^2 (the product itself is exact in fp32: 8 x
// 8 significant bits), plus fp32 accumulation over k terms (k * 2^-24).
double Bf16ProductBound(int64_t k) {
  return 2 * kBf16U + kBf16U * kBf16U + static_cast<double>(k) * 0x1p-24;
}

// ||a - b|| / ||b||.
double RelativeError(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    const double d = static_cast<double>(a[i]) - b[i];
    num += d * d;
    den += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

// A Linear with random weights and their bf16 copies synced.
Linear RandomBf16Linear(int in, int out, bool relu, Rng* rng) {
  Linear l(in, out, relu);
  l.Init(rng);
  l.SyncBf16Weights();
  return l;
}

// `x` rounded to bf16 (the shared rounding, as the layers' inputs are).
std::vector<Bf16> RoundedToBf16(const std::vector<float>& x) {
  std::vector<Bf16> xb(x.size());
  ToBf16(x.data(), static_cast<int64_t>(x.size()), xb.data());
  return xb;
}

TEST(Bf16Test, ConversionRoundsToNearestEven) {
  EXPECT_EQ(ToBf16(1.0f), 0x3f80);
  EXPECT_EQ(ToBf16(-2.0f), 0xc000);
  EXPECT_EQ(FromBf16(ToBf16(0.0f)), 0.0f);
  // 1 + 2^-8 lies halfway between 1 and 1 + 2^-7: to the even mantissa, 1.
  EXPECT_EQ(FromBf16(ToBf16(1.0f + 0x1p-8f)), 1.0f);
  // 1 + 3 * 2^-8 lies halfway between 1 + 2^-7 (odd) and 1 + 2^-6 (even).
  EXPECT_EQ(FromBf16(ToBf16(1.0f + 3 * 0x1p-8f)), 1.0f + 0x1p-6f);
  // Just above the halfway point rounds up.
  EXPECT_EQ(FromBf16(ToBf16(1.0f + 0x1p-8f + 0x1p-20f)), 1.0f + 0x1p-7f);
  EXPECT_TRUE(std::isnan(FromBf16(ToBf16(std::nanf("")))));
  EXPECT_EQ(FromBf16(ToBf16(std::numeric_limits<float>::infinity())),
            std::numeric_limits<float>::infinity());
  // Every value moves by at most u of itself, and the array form agrees.
  Rng rng = SeededRng(90);
  const std::vector<float> v = RandomVector(&rng, 100000, 10.0);
  std::vector<Bf16> b(v.size());
  ToBf16(v.data(), static_cast<int64_t>(v.size()), b.data());
  for (size_t i = 0; i < v.size(); ++i) {
    ASSERT_EQ(b[i], ToBf16(v[i])) << i;
    ASSERT_LE(std::fabs(FromBf16(b[i]) - v[i]), kBf16U * std::fabs(v[i])) << i;
  }
}

// ToBf16 (dense/bf16_round.h: the one rounding function of the CPU and of
// the CUDA conversion kernel) against ReferenceBf16, the rounding written
// from its definition, bitwise on Bf16RoundingInputs: the special values,
// random bit patterns, exact ties above odd and even bf16s, one bit either
// side of them, and denormals. The array form gives the same bits.
TEST(Bf16Test, SharedRoundingMatchesTheDefinitionBitwise) {
  Rng rng = SeededRng(98);
  const std::vector<float> v = dlrm::testing::Bf16RoundingInputs(rng, 200000);
  std::vector<Bf16> array(v.size());
  ToBf16(v.data(), static_cast<int64_t>(v.size()), array.data());
  int ties = 0, nans = 0, denormals = 0, infinities = 0;
  for (size_t i = 0; i < v.size(); ++i) {
    uint32_t u;
    std::memcpy(&u, &v[i], sizeof(u));
    const Bf16 want = dlrm::testing::ReferenceBf16(v[i]);
    ASSERT_EQ(ToBf16(v[i]), want) << std::hex << "bits 0x" << u;
    ASSERT_EQ(array[i], want) << std::hex << "bits 0x" << u;
    ties += !std::isnan(v[i]) && (u & 0xffffu) == 0x8000u;
    nans += std::isnan(v[i]);
    denormals += std::fpclassify(v[i]) == FP_SUBNORMAL;
    infinities += std::isinf(FromBf16(want)) && !std::isinf(v[i]);
  }
  // The inputs reached every case.
  EXPECT_GT(ties, 1000);
  EXPECT_GT(nans, 100);
  EXPECT_GT(denormals, 1000);
  EXPECT_GE(infinities, 2);  // 0x7f7f8000 (a tie) and 0x7f7fffff overflow
  // A few by hand: a tie above an odd bf16 goes up, above an even one down;
  // a signalling NaN comes out quiet; the smallest denormal rounds to 0.
  EXPECT_EQ(ToBf16(std::bit_cast<float>(0x3f818000u)), 0x3f82);
  EXPECT_EQ(ToBf16(std::bit_cast<float>(0x3f808000u)), 0x3f80);
  EXPECT_EQ(ToBf16(std::bit_cast<float>(0x7f800001u)), 0x7fc0);
  EXPECT_EQ(ToBf16(std::bit_cast<float>(0x80000001u)), 0x8000);
}

// Bgemm on inputs that are bf16 already, against double loops: products of
// bf16 values are exact in fp32, so only the fp32 accumulation differs, by
// at most k * 2^-24 * sum |a b| (plus one rounding of the output for
// BgemmToBf16). Every transposition, beta 0 and 1, leading dimensions
// wider than the rows, k of 0.
TEST(Bf16Test, BgemmMatchesDoubleLoopsOnEveryTransposition) {
  Rng rng = SeededRng(91);
  for (auto [m, n, k] : {std::tuple{37, 19, 11}, std::tuple{130, 70, 300},
                         std::tuple{1, 1, 1}, std::tuple{5, 3, 0}}) {
    for (char ta : {'N', 'T'}) {
      for (char tb : {'N', 'T'}) {
        for (float beta : {0.0f, 1.0f}) {
          SCOPED_TRACE(::testing::Message() << m << "x" << n << "x" << k << " "
                                            << ta << tb << " beta " << beta);
          // op(A) [m x k] stored [m x k] or [k x m], with 3 spare columns.
          const int64_t a_rows = ta == 'N' ? m : k, a_cols = ta == 'N' ? k : m;
          const int64_t b_rows = tb == 'N' ? k : n, b_cols = tb == 'N' ? n : k;
          const int64_t lda = a_cols + 3, ldb = b_cols + 3, ldc = n + 3;
          std::vector<Bf16> a(a_rows * lda), b(b_rows * ldb);
          for (Bf16& x : a) x = ToBf16(static_cast<float>(rng.Normal()));
          for (Bf16& x : b) x = ToBf16(static_cast<float>(rng.Normal()));
          const std::vector<float> c0 = RandomVector(&rng, m * ldc);
          std::vector<float> c = c0;
          std::vector<Bf16> cb(m * ldc, 0x7777);
          Bgemm(ta, tb, m, n, k, a.data(), lda, b.data(), ldb, beta, c.data(),
                ldc);
          BgemmToBf16(ta, tb, m, n, k, a.data(), lda, b.data(), ldb, cb.data(),
                      ldc);
          for (int64_t i = 0; i < m; ++i) {
            for (int64_t j = 0; j < n; ++j) {
              double sum = 0, abs = 0;
              for (int64_t p = 0; p < k; ++p) {
                const double x =
                    FromBf16(ta == 'N' ? a[i * lda + p] : a[p * lda + i]);
                const double y =
                    FromBf16(tb == 'N' ? b[p * ldb + j] : b[j * ldb + p]);
                sum += x * y;
                abs += std::fabs(x * y);
              }
              const double want = sum + beta * c0[i * ldc + j];
              const double bound = k * 0x1p-24 * abs + 1e-6 * std::fabs(want);
              ASSERT_NEAR(c[i * ldc + j], want, bound) << i << "," << j;
              ASSERT_NEAR(FromBf16(cb[i * ldc + j]), sum,
                          bound + kBf16U * std::fabs(sum))
                  << i << "," << j;
            }
            // The spare columns are left alone.
            for (int64_t j = n; j < ldc; ++j) {
              ASSERT_EQ(c[i * ldc + j], c0[i * ldc + j]);
              ASSERT_EQ(cb[i * ldc + j], 0x7777);
            }
          }
        }
      }
    }
  }
}

// BgemmBiasAct, the bf16 forward's one call, against double loops (the
// bound of the test above, the bias and ReLU exact on the fp32 sum), and
// its bf16 output against its own fp32 output rounded once: the post-ops
// run on the fp32 sums before the single rounding. Leading dimensions
// wider than the rows, k of 0 (act(bias)), ReLU on and off.
TEST(Bf16Test, BgemmBiasActMatchesDoubleLoopsAndRoundsOnce) {
  Rng rng = SeededRng(95);
  for (auto [m, n, k] :
       {std::tuple{37, 19, 11}, std::tuple{130, 70, 300},
        std::tuple{2048, 64, 256}, std::tuple{1, 1, 1}, std::tuple{5, 3, 0}}) {
    for (bool relu : {false, true}) {
      SCOPED_TRACE(::testing::Message()
                   << m << "x" << n << "x" << k << " relu " << relu);
      const int64_t lda = k + 3, ldb = k + 1, ldc = n + 2;
      std::vector<Bf16> a(m * lda), b(n * ldb);
      for (Bf16& x : a) x = ToBf16(static_cast<float>(rng.Normal()));
      for (Bf16& x : b) x = ToBf16(static_cast<float>(rng.Normal()));
      const std::vector<float> bias = RandomVector(&rng, n);
      std::vector<float> c(m * ldc, 7.0f);
      std::vector<Bf16> cb(m * ldc, 0x7777);
      BgemmBiasAct(m, n, k, a.data(), lda, b.data(), ldb, bias.data(), relu,
                   c.data(), nullptr, ldc);
      BgemmBiasAct(m, n, k, a.data(), lda, b.data(), ldb, bias.data(), relu,
                   nullptr, cb.data(), ldc);
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < n; ++j) {
          double sum = bias[j], abs = std::fabs(bias[j]);
          for (int64_t p = 0; p < k; ++p) {
            const double x = FromBf16(a[i * lda + p]);
            const double y = FromBf16(b[j * ldb + p]);
            sum += x * y;
            abs += std::fabs(x * y);
          }
          const double want = relu ? std::max(sum, 0.0) : sum;
          ASSERT_NEAR(c[i * ldc + j], want, (k + 1) * 0x1p-24 * abs + 1e-6)
              << i << "," << j;
          ASSERT_EQ(cb[i * ldc + j], ToBf16(c[i * ldc + j])) << i << "," << j;
          if (relu) ASSERT_GE(c[i * ldc + j], 0.0f);
        }
        for (int64_t j = n; j < ldc; ++j) {
          ASSERT_EQ(c[i * ldc + j], 7.0f);
          ASSERT_EQ(cb[i * ldc + j], 0x7777);
        }
      }
    }
  }
}

// A layer whose forward kept only its bf16 output: the backward reading
// the ReLU's mask off that copy gives the weight, bias and input gradients
// and dy's bf16 copy of the backward reading the fp32 output, bit for bit,
// and leaves dy as it was; the forward's single outputs are its two-output
// run's.
TEST(Bf16Test, LinearBackwardFromTheBf16OutputMatchesTheFp32One) {
  Rng rng = SeededRng(96);
  for (bool relu : {false, true}) {
    const int in = 45, out = 200, batch = 150;
    Linear a = RandomBf16Linear(in, out, relu, &rng);
    Linear b = a;
    const std::vector<float> x = RandomVector(&rng, batch * in);
    const std::vector<Bf16> xb = RoundedToBf16(x);
    std::vector<float> y(batch * out), y_only(batch * out);
    std::vector<Bf16> yb(batch * out), yb_only(batch * out);
    a.ForwardBf16(xb.data(), batch, y.data(), yb.data());
    b.ForwardBf16(xb.data(), batch, nullptr, yb_only.data());
    b.ForwardBf16(xb.data(), batch, y_only.data(), nullptr);
    ASSERT_EQ(yb, yb_only);
    ASSERT_TRUE(BitwiseEqual(y.data(), y_only.data(), y.size()));

    const std::vector<float> dy = RandomVector(&rng, batch * out);
    std::vector<float> ga = dy, dxa(batch * in), dxb(batch * in);
    std::vector<Bf16> gba(batch * out), gbb(batch * out);
    a.BackwardBf16(xb.data(), y.data(), ga.data(), batch, dxa.data(),
                   gba.data());
    const std::vector<float> gb_in = dy;
    b.BackwardBf16(xb.data(), yb.data(), gb_in.data(), batch, dxb.data(),
                   gbb.data());
    EXPECT_EQ(gb_in, dy);
    EXPECT_EQ(gba, gbb) << "relu " << relu;
    EXPECT_TRUE(BitwiseEqual(dxa.data(), dxb.data(), dxa.size()));
    EXPECT_TRUE(BitwiseEqual(a.weight_grad(), b.weight_grad(), in * out));
    EXPECT_TRUE(BitwiseEqual(a.bias_grad(), b.bias_grad(), out));
    if (relu) EXPECT_NE(ga, dy);  // the fp32 overload masked dy in place
  }
}

// Where the CPU has bf16 instructions, the products run oneDNN's native
// kernels (brgemm for avx512_core_bf16, or AMX), not its reference
// implementation, for every transposition the layers use, at the MLPs' and
// the cross network's shapes.
TEST(Bf16Test, GemmsRunNativeBf16Kernels) {
  if (!CpuHasBf16()) GTEST_SKIP() << "this CPU has no bf16 instructions";
  for (auto [m, n, k] : {std::tuple{2048, 512, 367}, std::tuple{512, 367, 2048},
                         std::tuple{2048, 512, 3456},
                         std::tuple{3456, 512, 2048}, std::tuple{7, 13, 5}}) {
    for (const char* t : {"NT", "TN", "NN"}) {
      const std::string impl = BgemmImplementation(t[0], t[1], m, n, k);
      SCOPED_TRACE(::testing::Message()
                   << t << " " << m << "x" << n << "x" << k << ": " << impl);
      EXPECT_NO_SUBSTR(impl, "ref");
      EXPECT_TRUE(impl.find("bf16") != std::string::npos ||
                  impl.find("amx") != std::string::npos);
    }
  }
}

// Linear's bf16 passes against double loops on the fp32 inputs: each
// product's error is bounded by Bf16ProductBound(k) * |x w| (the inputs
// rounded once each), so |y - ref| <= Bf16ProductBound(in) * sum |x w|;
// the bias and ReLU add nothing (exact in fp32, ReLU 1-Lipschitz). The
// backward's GEMMs likewise, on the masked output gradient (mask from the
// layer's own y); the bias gradient is summed in fp32 as at fp32.
TEST(Bf16Test, LinearMatchesDoubleLoopsWithinTheBf16Bound) {
  Rng rng = SeededRng(92);
  for (bool relu : {false, true}) {
    const int in = 70, out = 300, batch = 131;
    Linear l = RandomBf16Linear(in, out, relu, &rng);
    const std::vector<float> x = RandomVector(&rng, batch * in);
    const std::vector<Bf16> xb = RoundedToBf16(x);
    std::vector<float> y(batch * out), dx(batch * in);
    std::vector<Bf16> yb(batch * out);
    l.ForwardBf16(xb.data(), batch, y.data(), yb.data());
    const float* w = l.weight();
    for (int64_t r = 0; r < batch; ++r) {
      for (int o = 0; o < out; ++o) {
        double s = l.bias()[o], abs = 0;
        for (int i = 0; i < in; ++i) {
          s += static_cast<double>(x[r * in + i]) * w[o * in + i];
          abs += std::fabs(static_cast<double>(x[r * in + i]) * w[o * in + i]);
        }
        const double want = relu ? std::max(s, 0.0) : s;
        const float got = y[r * out + o];
        ASSERT_NEAR(got, want, Bf16ProductBound(in) * abs + 1e-6)
            << "relu " << relu << " y " << r << "," << o;
        ASSERT_EQ(yb[r * out + o], ToBf16(got));
      }
    }
    const std::vector<float> dy = RandomVector(&rng, batch * out);
    std::vector<float> g = dy;
    std::vector<Bf16> gb(batch * out);
    l.BackwardBf16(xb.data(), y.data(), g.data(), batch, dx.data(), gb.data());
    std::vector<double> gm(batch * out);
    for (size_t i = 0; i < gm.size(); ++i) {
      gm[i] = !relu || y[i] > 0 ? dy[i] : 0.0;
      ASSERT_EQ(g[i], gm[i]) << i;
    }
    for (int o = 0; o < out; ++o) {
      double db = 0;
      for (int r = 0; r < batch; ++r) db += gm[r * out + o];
      ASSERT_NEAR(l.bias_grad()[o], db, 1e-4 * (1 + std::fabs(db))) << o;
      for (int i = 0; i < in; ++i) {
        double dw = 0, abs = 0;
        for (int r = 0; r < batch; ++r) {
          dw += gm[r * out + o] * x[r * in + i];
          abs += std::fabs(gm[r * out + o] * x[r * in + i]);
        }
        ASSERT_NEAR(l.weight_grad()[o * in + i], dw,
                    Bf16ProductBound(batch) * abs + 1e-6)
            << "dW " << o << "," << i;
      }
    }
    for (int r = 0; r < batch; ++r) {
      for (int i = 0; i < in; ++i) {
        double s = 0, abs = 0;
        for (int o = 0; o < out; ++o) {
          s += gm[r * out + o] * w[o * in + i];
          abs += std::fabs(gm[r * out + o] * w[o * in + i]);
        }
        ASSERT_NEAR(dx[r * in + i], s, Bf16ProductBound(out) * abs + 1e-6)
            << "dx " << r << "," << i;
      }
    }
  }
}

// A bf16 MLP against its fp32 twin (the same weights): through three
// layers each output is within a few Bf16ProductBound of the fp32 one
// relative to the magnitudes summed; 2e-2 in norm leaves ~3x headroom over
// what these shapes measure (~6e-3). Infer runs Forward's arithmetic
// bitwise, and SyncBf16Weights is what makes new weights count.
TEST(Bf16Test, MlpTracksItsFp32TwinAndSyncsWeights) {
  Rng rng = SeededRng(93);
  const std::vector<int> widths = {256, 128, 16};
  const int in = 64;
  const int64_t batch = 200;
  Mlp fp32(in, widths, /*relu_last=*/true);
  fp32.Init(&rng);
  Mlp bf16 = fp32;
  bf16.SetPrecision(PRECISION_BF16);
  EXPECT_EQ(bf16.precision(), PRECISION_BF16);
  const std::vector<float> x = RandomVector(&rng, batch * in);
  const float* a = fp32.Forward(x.data(), batch);
  const std::vector<float> want(a, a + batch * 16);
  const float* b = bf16.Forward(x.data(), batch);
  const std::vector<float> got(b, b + batch * 16);
  const double forward_error = RelativeError(got, want);
  EXPECT_LT(forward_error, 2e-2);
  EXPECT_GT(forward_error, 0.0);  // it did run in bf16
  std::vector<float> infer(batch * 16);
  AlignedVector<float> scratch;
  bf16.Infer(x.data(), batch, infer.data(), &scratch);
  EXPECT_TRUE(BitwiseEqual(infer.data(), got.data(), got.size()));

  // Backward is its layers' bf16 backward composed, bit for bit (each
  // layer is held to the bound by LinearMatchesDoubleLoopsWithinTheBf16Bound;
  // against the fp32 MLP the gradients also differ where a ReLU took the
  // other branch, which the dense step's tests below allow for).
  const std::vector<float> dy = RandomVector(&rng, batch * 16);
  std::vector<float> g = dy, dx(batch * in);
  bf16.Backward(x.data(), g.data(), batch, dx.data());
  std::vector<Linear> layers = bf16.layers();
  std::vector<std::vector<float>> ys;
  std::vector<std::vector<Bf16>> ins(1, std::vector<Bf16>(batch * in));
  ToBf16(x.data(), batch * in, ins[0].data());
  for (Linear& l : layers) {
    ys.emplace_back(batch * l.out());
    ins.emplace_back(batch * l.out());
    l.ForwardBf16(ins[ins.size() - 2].data(), batch, ys.back().data(),
                  ins.back().data());
  }
  std::vector<float> grad = dy;
  for (size_t i = layers.size(); i-- > 0;) {
    std::vector<float> layer_dx(batch * layers[i].in());
    std::vector<Bf16> scratch_bf16(batch * layers[i].out());
    layers[i].BackwardBf16(ins[i].data(), ys[i].data(), grad.data(), batch,
                           layer_dx.data(), scratch_bf16.data());
    grad = layer_dx;
  }
  EXPECT_TRUE(BitwiseEqual(dx.data(), grad.data(), dx.size()));
  for (size_t i = 0; i < layers.size(); ++i) {
    Linear& want = layers[i];
    Linear& got = bf16.layers()[i];
    EXPECT_TRUE(BitwiseEqual(got.weight_grad(), want.weight_grad(),
                             want.in() * want.out()))
        << i;
    EXPECT_TRUE(BitwiseEqual(got.bias_grad(), want.bias_grad(), want.out()))
        << i;
  }

  // New fp32 weights reach the bf16 passes only through SyncBf16Weights
  // (the biases are read in fp32 directly, so they are left alone here).
  for (Linear& l : bf16.layers()) {
    for (int64_t i = 0; i < int64_t{l.in()} * l.out(); ++i) {
      l.weight()[i] *= -1.0f;
    }
  }
  std::vector<float> stale(batch * 16), fresh(batch * 16);
  bf16.Infer(x.data(), batch, stale.data(), &scratch);
  EXPECT_TRUE(BitwiseEqual(stale.data(), got.data(), got.size()));
  bf16.SyncBf16Weights();
  bf16.Infer(x.data(), batch, fresh.data(), &scratch);
  EXPECT_FALSE(BitwiseEqual(fresh.data(), got.data(), got.size()));
}

// The cross network in bf16 against the double reference (forward) and
// its fp32 twin (gradients), for one and several layers and row blocks.
// Each layer's two products carry Bf16ProductBound-sized errors relative
// to the magnitudes summed, compounded over the layers: 3e-2 in norm is
// ~3x what these shapes measure. Infer runs Forward's arithmetic bitwise.
TEST(Bf16Test, CrossNetTracksTheReferenceAndItsFp32Twin) {
  Rng rng = SeededRng(94);
  for (CrossShape s : {CrossShape{64, 3, 16, 200}, CrossShape{40, 1, 64, 130},
                       CrossShape{16, 2, 4, 37}, CrossShape{8, 2, 4, 0}}) {
    SCOPED_TRACE(Describe(s));
    CrossNet fp32 = RandomCrossNet(s.n, s.layers, s.r, &rng);
    CrossNet bf16 = fp32;
    bf16.SetPrecision(PRECISION_BF16);
    const std::vector<float> x0 = RandomVector(&rng, s.batch * s.n);
    const auto [out, infer] = ForwardAndInfer(bf16, x0, s.batch, s.n);
    EXPECT_TRUE(BitwiseEqual(out.data(), infer.data(), s.batch * s.n));
    const std::vector<double> ref =
        reference::CrossNetForward(fp32, x0.data(), s.batch);
    const std::vector<float> want(ref.begin(), ref.end());
    EXPECT_LT(RelativeError(out, want), 3e-2);

    std::vector<float> out_fp32(s.batch * s.n);
    fp32.Forward(x0.data(), s.batch, out_fp32.data());
    const std::vector<float> dout = RandomVector(&rng, s.batch * s.n);
    std::vector<float> dx_a(s.batch * s.n), dx_b(s.batch * s.n);
    fp32.Backward(x0.data(), dout.data(), s.batch, dx_a.data());
    bf16.Backward(x0.data(), dout.data(), s.batch, dx_b.data());
    if (s.batch == 0) {
      for (float g : CrossGrads(bf16)) ASSERT_EQ(g, 0.0f);
      continue;
    }
    EXPECT_LT(RelativeError(dx_b, dx_a), 3e-2);
    const std::vector<ParamRef> pa = fp32.Parameters(), pb = bf16.Parameters();
    for (size_t i = 0; i < pa.size(); ++i) {
      const std::vector<float> ga(pa[i].grad, pa[i].grad + pa[i].size);
      const std::vector<float> gb(pb[i].grad, pb[i].grad + pb[i].size);
      EXPECT_LT(RelativeError(gb, ga), 3e-2) << "parameter " << i;
    }
  }
}

// A dense config with widths where bf16 rounding shows: 8 tables of dim
// 16, bottom 13-64-16, top -128-64-1, DCN of 2 layers of rank 32.
ModelConfig Bf16BackendConfig(
    Interaction interaction, DensePrecision p,
    OptimizerConfig::Type optimizer = OptimizerConfig::ADAGRAD) {
  return DenseBackendConfig(
      interaction, optimizer,
      {.num_dense_features = 13,
       .embedding_dim = 16,
       .tables = {"t0", "t1", "t2", "t3", "t4", "t5", "t6", "t7"},
       .bottom_mlp = {64, 16},
       .top_mlp = {128, 64, 1},
       .dcn_low_rank_dim = 32,
       .precision = p});
}

// The mean loss of one forward of `b` on `in` (no backward).
double ForwardLoss(DenseBackend& b, const DenseStepInputs& in) {
  EXPECT_TRUE(FillInteractionInput(b, in).ok());
  EXPECT_TRUE(b.BottomForward(in.x.data(), in.batch).ok());
  EXPECT_TRUE(b.InteractionForward(in.batch).ok());
  EXPECT_TRUE(b.TopForward(in.batch).ok());
  absl::StatusOr<double> loss =
      b.Loss(in.labels.data(), in.batch, 1.0f / in.batch);
  EXPECT_TRUE(loss.ok()) << loss.status();
  return loss.value_or(0.0);
}

// The whole dense step at PRECISION_BF16 against the same step at fp32 from
// the same weights, three SGD steps running (each backend on its own
// weights, so differences compound; SGD, because Adagrad's first steps are
// lr * sign(g) and turn a tiny gradient's rounding into a full step). The
// loss, the probabilities and the updated parameters are continuous in the
// roundings: loss within 1e-3 relative (measured <= 2.5e-4), parameters
// within 1e-3 in norm (measured <= 1.4e-4), probabilities within 1e-2. The
// gradients are not: where a pre-activation lies within bf16's rounding of
// 0 its ReLU takes the other branch and that unit's whole gradient changes,
// so they are held to 0.1 (parameters', measured <= 0.035) and 0.2 (the
// interaction input's, which passes through the top MLP's first mask;
// measured <= 0.082) in norm; the per-layer bounds and
// GradientMatchesFiniteDifferencesOfTheFp32Loss check them closely. The dot
// interaction itself runs fp32 in both.
TEST(Bf16Test, DenseStepTracksTheFp32Step) {
  if (!CpuHasBf16()) GTEST_SKIP() << "this CPU has no bf16 instructions";
  for (Interaction kind : {INTERACTION_DOT, INTERACTION_CAT, INTERACTION_DCN}) {
    SCOPED_TRACE(Interaction_Name(kind));
    auto fp32 = CreateDenseBackend(
        Bf16BackendConfig(kind, PRECISION_FP32, OptimizerConfig::SGD));
    auto bf16 = CreateDenseBackend(
        Bf16BackendConfig(kind, PRECISION_BF16, OptimizerConfig::SGD));
    ASSERT_TRUE(fp32.ok() && bf16.ok());
    EXPECT_EQ((*fp32)->precision(), PRECISION_FP32);
    EXPECT_EQ((*bf16)->precision(), PRECISION_BF16);
    const ModelConfig config =
        Bf16BackendConfig(kind, PRECISION_FP32, OptimizerConfig::SGD);
    Rng rng = SeededRng(95);
    for (int step = 0; step < 3; ++step) {
      const DenseStepInputs in = RandomDenseStep(config, 150 + step, rng);
      auto want = RunDenseStep(**fp32, in);
      auto got = RunDenseStep(**bf16, in);
      ASSERT_TRUE(want.ok() && got.ok());
      std::printf(
          "step %d: loss %.6f (fp32 %.6f), relative error of gradients %.4f, "
          "of dt %.4f, of parameters %.6f\n",
          step, got->loss, want->loss, RelativeError(got->grads, want->grads),
          RelativeError(got->dt, want->dt),
          RelativeError(got->params, want->params));
      EXPECT_NEAR(got->loss, want->loss, 1e-3 * want->loss);
      EXPECT_LT(RelativeError(got->params, want->params), 1e-3);
      EXPECT_LT(RelativeError(got->grads, want->grads), 0.1);
      EXPECT_LT(RelativeError(got->dt, want->dt), 0.2);
      for (int64_t l = 0; l < in.batch; ++l) {
        ASSERT_NEAR(got->probs[l], want->probs[l], 1e-2) << l;
      }
    }
  }
}

// Gradient check of the bf16 step: its gradient along a random direction
// of every dense parameter against the central difference of the fp32
// loss (the true function it approximates). The step h = 1e-2 of a unit
// direction keeps the difference's own truncation error below 1e-4
// relative; bf16's rounding of the gradient is the rest: within 3e-2.
TEST(Bf16Test, GradientMatchesFiniteDifferencesOfTheFp32Loss) {
  if (!CpuHasBf16()) GTEST_SKIP() << "this CPU has no bf16 instructions";
  for (Interaction kind : {INTERACTION_DOT, INTERACTION_DCN}) {
    SCOPED_TRACE(Interaction_Name(kind));
    const ModelConfig config = Bf16BackendConfig(kind, PRECISION_FP32);
    auto fp32 = CreateDenseBackend(config);
    auto bf16 = CreateDenseBackend(Bf16BackendConfig(kind, PRECISION_BF16));
    ASSERT_TRUE(fp32.ok() && bf16.ok());
    Rng rng = SeededRng(96);
    const DenseStepInputs in = RandomDenseStep(config, 256, rng);
    // The bf16 gradient, packed in parameter order.
    DenseBackend& b = **bf16;
    ForwardLoss(b, in);
    ASSERT_TRUE(b.TopBackward(in.batch).ok());
    ASSERT_TRUE(b.InteractionBackward(in.batch).ok());
    ASSERT_TRUE(b.BottomBackward(in.x.data(), in.batch).ok());
    auto flat = b.PackGradients(GradBucket::kAll, 0);
    ASSERT_TRUE(flat.ok());
    const std::vector<float> grad(flat->begin(), flat->end());
    std::vector<float> dir = RandomVector(&rng, grad.size());
    double norm = 0;
    for (float d : dir) norm += static_cast<double>(d) * d;
    for (float& d : dir) d = static_cast<float>(d / std::sqrt(norm));
    double analytic = 0;
    for (size_t i = 0; i < grad.size(); ++i) {
      analytic += static_cast<double>(grad[i]) * dir[i];
    }
    const double h = 1e-2;
    auto shifted_loss = [&](double sign) {
      size_t at = 0;
      std::vector<std::vector<float>> saved;
      for (const ParamRef& p : (*fp32)->params()) {
        saved.emplace_back(p.value, p.value + p.size);
        for (int64_t i = 0; i < p.size; ++i) {
          p.value[i] += static_cast<float>(sign * h * dir[at++]);
        }
      }
      const double loss = ForwardLoss(**fp32, in);
      size_t k = 0;
      for (const ParamRef& p : (*fp32)->params()) {
        std::copy(saved[k].begin(), saved[k].end(), p.value);
        ++k;
      }
      return loss;
    };
    const double numeric = (shifted_loss(1) - shifted_loss(-1)) / (2 * h);
    std::printf("directional derivative: bf16 %.6f, fp32 difference %.6f\n",
                analytic, numeric);
    EXPECT_NEAR(analytic, numeric, 3e-2 * std::fabs(numeric) + 1e-5);
  }
}

// PRECISION_AUTO: bf16 only where the bf16 matmul runs on AMX; an explicit
// precision is kept where the CPU can run it.
TEST(CpuPrecisionTest, AutoIsBf16OnlyWithAmxKernels) {
  EXPECT_EQ(ChooseCpuPrecision(PRECISION_AUTO, true, true), PRECISION_BF16);
  EXPECT_EQ(ChooseCpuPrecision(PRECISION_AUTO, true, false), PRECISION_FP32);
  EXPECT_EQ(ChooseCpuPrecision(PRECISION_AUTO, false, false), PRECISION_FP32);
  EXPECT_EQ(ChooseCpuPrecision(PRECISION_BF16, true, false), PRECISION_BF16);
  EXPECT_EQ(ChooseCpuPrecision(PRECISION_BF16, false, false), PRECISION_FP32);
  EXPECT_EQ(ChooseCpuPrecision(PRECISION_FP32, true, true), PRECISION_FP32);
  EXPECT_EQ(ResolvePrecision(DEVICE_CUDA, PRECISION_AUTO), PRECISION_FP32);
  EXPECT_EQ(ResolvePrecision(DEVICE_CUDA, PRECISION_BF16), PRECISION_BF16);
  EXPECT_EQ(ResolvePrecision(DEVICE_CPU, PRECISION_AUTO),
            ResolveCpuPrecision(PRECISION_AUTO));
}

// AMX counts only with both CPUID bits, a tile palette with 8 tiles of
// 1 KiB and the kernel's permission; each missing piece is named.
TEST(AmxTest, UsableNeedsPaletteTilesAndPermission) {
  AmxSupport good;
  good.cpuid_tile = good.cpuid_bf16 = true;
  good.palettes = 1;
  good.tiles = 8;
  good.tile_bytes = 1024;
  good.permission = true;
  EXPECT_TRUE(AmxUsable(good));
  EXPECT_EQ(AmxUnusableReason(good), "");
  EXPECT_FALSE(AmxUsable(AmxSupport()));
  EXPECT_EQ(AmxUnusableReason(AmxSupport()), "");  // not advertised at all
  AmxSupport no_palette = good;
  no_palette.palettes = 0;
  no_palette.tiles = no_palette.tile_bytes = 0;
  EXPECT_FALSE(AmxUsable(no_palette));
  EXPECT_HAS_SUBSTR(AmxUnusableReason(no_palette), "palette");
  AmxSupport few_tiles = good;
  few_tiles.tiles = 4;
  EXPECT_FALSE(AmxUsable(few_tiles));
  EXPECT_HAS_SUBSTR(AmxUnusableReason(few_tiles), "8 tiles");
  AmxSupport refused = good;
  refused.permission = false;
  EXPECT_FALSE(AmxUsable(refused));
  EXPECT_HAS_SUBSTR(AmxUnusableReason(refused), "permission");
  AmxSupport half = good;
  half.cpuid_bf16 = false;
  EXPECT_FALSE(AmxUsable(half));
  EXPECT_HAS_SUBSTR(AmxUnusableReason(half), "only one");
}

// This host's CPUID agrees with the kernel's flags in /proc/cpuinfo, and
// PRECISION_AUTO follows what oneDNN actually runs. With DLRM_EXPECT_NO_AMX
// (the CTest entry dense_test_without_amx holds oneDNN at
// AVX512_CORE_BF16) AMX must not be used even where the CPU has it.
TEST(AmxTest, DetectionAgreesWithTheKernelAndAutoFollowsOneDnn) {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line, flags;
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("flags", 0) == 0) {
      flags = line + " ";
      break;
    }
  }
  const AmxSupport& amx = DetectAmx();
  std::printf(
      "cpu %s; cpuid amx tile %d bf16 %d, palettes %d, tiles %d x %d "
      "B, permission %d; matmul fp32 %s, bf16 %s\n",
      CpuModel().c_str(), amx.cpuid_tile, amx.cpuid_bf16, amx.palettes,
      amx.tiles, amx.tile_bytes, amx.permission, MatmulIsa(false).c_str(),
      MatmulIsa(true).c_str());
  if (!flags.empty()) {
    EXPECT_EQ(amx.cpuid_tile, flags.find(" amx_tile ") != std::string::npos);
    EXPECT_EQ(amx.cpuid_bf16, flags.find(" amx_bf16 ") != std::string::npos);
  }
  EXPECT_FALSE(CpuModel().empty());
  EXPECT_NE(MatmulIsa(false), "none");
  if (!AmxUsable(amx) || std::getenv("DLRM_EXPECT_NO_AMX") != nullptr) {
    EXPECT_FALSE(MatmulUsesAmx()) << MatmulIsa(true);
  }
  EXPECT_EQ(ResolveCpuPrecision(PRECISION_AUTO),
            CpuHasBf16() && MatmulUsesAmx() ? PRECISION_BF16 : PRECISION_FP32);
  if (std::getenv("DLRM_EXPECT_NO_AMX") != nullptr) {
    EXPECT_EQ(ResolveCpuPrecision(PRECISION_AUTO), PRECISION_FP32);
  }
  // The backend runs what ResolveCpuPrecision says for an unset precision.
  ModelConfig config = Bf16BackendConfig(INTERACTION_DOT, PRECISION_AUTO);
  auto backend = CreateDenseBackend(config);
  ASSERT_TRUE(backend.ok()) << backend.status();
  EXPECT_EQ((*backend)->precision(), ResolveCpuPrecision(PRECISION_AUTO));
}

// Without bf16 instructions (a CPU without avx512_bf16, or
// ONEDNN_MAX_CPU_ISA below AVX512_CORE_BF16: the CTest entry
// dense_test_without_bf16 runs this test so, with DLRM_EXPECT_NO_BF16=1)
// PRECISION_BF16 runs the fp32 step, bit for bit.
TEST(Bf16FallbackTest, WithoutBf16InstructionsTheStepIsFp32) {
  if (std::getenv("DLRM_EXPECT_NO_BF16") != nullptr) {
    ASSERT_FALSE(CpuHasBf16());
  }
  EXPECT_EQ(ResolveCpuPrecision(PRECISION_FP32), PRECISION_FP32);
  EXPECT_EQ(ResolveCpuPrecision(PRECISION_AUTO),
            CpuHasBf16() && MatmulUsesAmx() ? PRECISION_BF16 : PRECISION_FP32);
  if (std::getenv("DLRM_EXPECT_NO_BF16") != nullptr) {
    EXPECT_EQ(ResolveCpuPrecision(PRECISION_AUTO), PRECISION_FP32);
  }
  EXPECT_EQ(ResolveCpuPrecision(PRECISION_BF16),
            CpuHasBf16() ? PRECISION_BF16 : PRECISION_FP32);
  auto bf16 =
      CreateDenseBackend(Bf16BackendConfig(INTERACTION_DCN, PRECISION_BF16));
  ASSERT_TRUE(bf16.ok()) << bf16.status();
  EXPECT_EQ((*bf16)->precision(), ResolveCpuPrecision(PRECISION_BF16));
  if (CpuHasBf16()) return;
  const ModelConfig config = Bf16BackendConfig(INTERACTION_DCN, PRECISION_FP32);
  auto fp32 = CreateDenseBackend(config);
  ASSERT_TRUE(fp32.ok());
  Rng rng = SeededRng(97);
  const DenseStepInputs in = RandomDenseStep(config, 70, rng);
  auto want = RunDenseStep(**fp32, in);
  auto got = RunDenseStep(**bf16, in);
  ASSERT_TRUE(want.ok() && got.ok());
  EXPECT_EQ(got->loss, want->loss);
  EXPECT_EQ(got->grads, want->grads);
  EXPECT_EQ(got->params, want->params);
  EXPECT_EQ(got->probs, want->probs);
}

// DEVICE_CUDA takes PRECISION_BF16: with a device the backend runs it (its
// precision() says so; cuda_dense_test checks its step against the CPU's),
// without one the answer is the missing device's, not the precision's.
TEST(Bf16Test, CudaTakesBf16) {
  ModelConfig config = Bf16BackendConfig(INTERACTION_DOT, PRECISION_BF16);
  config.set_device(DEVICE_CUDA);
  auto backend = CreateDenseBackend(config);
  if (CudaDeviceCount() > 0) {
    ASSERT_TRUE(backend.ok()) << backend.status();
    EXPECT_EQ((*backend)->precision(), PRECISION_BF16);
    return;
  }
  ASSERT_EQ(backend.status().code(), absl::StatusCode::kFailedPrecondition)
      << backend.status();
  const std::string message(backend.status().message());
  EXPECT_NO_SUBSTR(message, "dense_precision") << message;
  EXPECT_HAS_SUBSTR(message, "device cuda") << message;
}

}  // namespace
}  // namespace dlrm::dense
