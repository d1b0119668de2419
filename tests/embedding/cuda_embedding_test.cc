// Tests for embedding/cuda/: the CUDA embedding-bag forward and the fused
// sparse backward + optimizers against the CPU table (the reference of the
// CUDA backend) on random batches with empty bags, duplicate ids and the
// largest id. Skipped without a CUDA device, except the argument checks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <ostream>
#include <span>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/random.h"
#include "embedding/cuda/cuda_embedding_table.h"
#include "embedding/cuda/embedding_kernels.h"
#include "embedding/embedding_table.h"
#include "embedding/sparse_backward_host.h"
#include "embedding/sparse_chunks.h"
#include "optim/optimizer.h"
#include "tests/support/cuda_test_util.h"
#include "tests/support/optimizer.h"

namespace dlrm::embedding::cuda {
namespace {

// The CUDA tests' helpers (tests/support/cuda_test_util.h).
using namespace ::dlrm::testing;  // NOLINT(build/namespaces)

using test::MakeOptimizer;

using Shape = BagShape;

// Pools `ids` on the device from `table`'s weights; the returned rows are
// s * stride apart, with the padding columns still holding the poison.
std::vector<float> DeviceForward(const CudaEmbeddingTable& table,
                                 const data::SparseFeature& ids,
                                 int64_t stride) {
  DeviceSparseFeature feature;
  EXPECT_TRUE(feature.Upload(ids).ok());
  const size_t n = static_cast<size_t>(ids.num_bags()) * stride;
  auto out = Poisoned(n);
  const absl::Status st = table.Forward(feature.bags(), out.data(), stride,
                                        /*stream=*/nullptr);
  EXPECT_TRUE(st.ok()) << st;
  return ToHost(out, n);
}

class CudaEmbeddingTest : public ::testing::TestWithParam<Shape> {};

TEST_P(CudaEmbeddingTest, ForwardEqualsCpuReferenceBitwise) {
  DLRM_SKIP_WITHOUT_CUDA();
  const Shape s = GetParam();
  SCOPED_TRACE(::testing::Message() << "seed " << kCudaTestSeed);
  Rng rng(kCudaTestSeed + s.dim);
  EmbeddingTable cpu(/*table_index=*/2, s.rows, s.dim, s.pooling,
                     MakeOptimizer(OptimizerConfig::SGD), kCudaTestSeed);
  auto gpu = CudaEmbeddingTable::FromHost(cpu);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  const int64_t stride = s.dim + s.pad;
  for (int round = 0; round < 3; ++round) {
    const data::SparseFeature ids = RandomIds(rng, s);
    std::vector<float> want(std::max<int64_t>(1, ids.num_bags() * stride),
                            std::nanf(""));
    reference::PoolForward(cpu.weights(), s.dim, s.pooling, ids, want.data(),
                           stride);
    const std::vector<float> got = DeviceForward(**gpu, ids, stride);
    // Sums run in id order with plain adds on both sides, and the mean is
    // one multiply by 1/n: bitwise equal, padding left unwritten (NaN).
    ExpectBitwiseEqual(got, std::span<const float>(want.data(), got.size()),
                       "pooled");
  }
}

TEST_P(CudaEmbeddingTest, BackwardUpdateMatchesCpuTable) {
  DLRM_SKIP_WITHOUT_CUDA();
  const Shape s = GetParam();
  for (auto type : {OptimizerConfig::SGD, OptimizerConfig::ADAGRAD,
                    OptimizerConfig::ADAM}) {
    SCOPED_TRACE(OptimizerTrace(type));
    Rng rng(kCudaTestSeed + 7 * s.dim + type);
    // A warm-up: the kernels read each step's rate from the constants.
    OptimizerConfig optimizer = MakeOptimizer(type);
    optimizer.mutable_schedule()->set_warmup_steps(3);
    optimizer.mutable_schedule()->set_warmup_start_factor(0.5f);
    EmbeddingTable cpu(1, s.rows, s.dim, s.pooling, optimizer, kCudaTestSeed);
    const std::vector<float> initial(cpu.weights(),
                                     cpu.weights() + s.rows * s.dim);
    auto gpu = CudaEmbeddingTable::FromHost(cpu);
    ASSERT_TRUE(gpu.ok()) << gpu.status();
    const int64_t stride = s.dim + s.pad;
    std::vector<bool> touched(s.rows, false);
    for (int step = 0; step < 3; ++step) {
      const data::SparseFeature ids = RandomIds(rng, s);
      for (int64_t id : ids.ids) touched[id] = true;
      const std::vector<float> grad =
          RandomFloats(rng, std::max<int64_t>(1, ids.num_bags() * stride));
      cpu.BackwardUpdate(ids, grad.data(), stride);
      DeviceSparseFeature feature;
      ASSERT_TRUE(feature.Upload(ids).ok());
      auto grad_device = ToDevice(grad);
      const absl::Status st = (*gpu)->BackwardUpdate(
          feature.bags(), grad_device.data(), stride, /*stream=*/nullptr);
      ASSERT_TRUE(st.ok()) << st;
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    }
    EmbeddingTable back(1, s.rows, s.dim, s.pooling, optimizer,
                        kCudaTestSeed + 1);
    ASSERT_TRUE((*gpu)->CopyToHost(&back).ok());
    EXPECT_EQ(back.step(), cpu.step());
    // Touched rows: the same rule functions (optim/rules.h), unfused on
    // both sides, but row-wise Adagrad sums squares in another order, and a
    // row with more than kSparseChunk occurrences sums them in chunks (its
    // runs here stay under about 300; the host stand-in, bitwise the
    // device's sums, stays within 3e-6 of the CPU table's on such runs:
    // tests/embedding/embedding_test.cc SparseBackwardHostTest), so 1e-5 of the
    // touched values' scale. Untouched rows keep their exact values.
    const int per_row2 = static_cast<int>(cpu.state2().size() / s.rows);
    const int per_row1 = static_cast<int>(cpu.state1().size() / s.rows);
    // [0]: weights, [1]: state1, [2]: state2 of the touched rows.
    std::vector<float> got[3], want[3];
    const float* got_base[3] = {back.weights(), back.state1().data(),
                                back.state2().data()};
    const float* want_base[3] = {cpu.weights(), cpu.state1().data(),
                                 cpu.state2().data()};
    const int width[3] = {s.dim, per_row1, per_row2};
    for (int64_t r = 0; r < s.rows; ++r) {
      if (touched[r]) {
        for (int a = 0; a < 3; ++a) {
          got[a].insert(got[a].end(), got_base[a] + r * width[a],
                        got_base[a] + (r + 1) * width[a]);
          want[a].insert(want[a].end(), want_base[a] + r * width[a],
                         want_base[a] + (r + 1) * width[a]);
        }
      } else {
        ASSERT_EQ(
            std::memcmp(back.weights() + r * s.dim, initial.data() + r * s.dim,
                        sizeof(float) * s.dim),
            0)
            << "untouched row " << r << " changed";
        if (per_row1 > 0) {
          ASSERT_EQ(back.state1()[r * per_row1], cpu.state1()[r * per_row1])
              << "state of untouched row " << r << " changed";
        }
      }
    }
    ExpectCloseToScale(got[0], want[0], 1e-5, "touched weights");
    ExpectCloseToScale(got[1], want[1], 1e-5, "touched state1");
    ExpectCloseToScale(got[2], want[2], 1e-5, "touched state2");
  }
}

TEST_P(CudaEmbeddingTest, BackwardUpdateIsDeterministic) {
  DLRM_SKIP_WITHOUT_CUDA();
  const Shape s = GetParam();
  Rng rng(kCudaTestSeed + 3);
  EmbeddingTable cpu(0, s.rows, s.dim, s.pooling,
                     MakeOptimizer(OptimizerConfig::ROWWISE_ADAGRAD),
                     kCudaTestSeed);
  const data::SparseFeature ids = RandomIds(rng, s);
  const int64_t stride = s.dim + s.pad;
  auto grad = ToDevice(
      RandomFloats(rng, std::max<int64_t>(1, ids.num_bags() * stride)));
  DeviceSparseFeature feature;
  ASSERT_TRUE(feature.Upload(ids).ok());
  std::vector<std::vector<float>> results;
  for (int run = 0; run < 2; ++run) {
    auto gpu = CudaEmbeddingTable::FromHost(cpu);
    ASSERT_TRUE(gpu.ok()) << gpu.status();
    ASSERT_TRUE(
        (*gpu)
            ->BackwardUpdate(feature.bags(), grad.data(), stride, nullptr)
            .ok());
    EmbeddingTable back = cpu;
    ASSERT_TRUE((*gpu)->CopyToHost(&back).ok());
    results.emplace_back(back.weights(), back.weights() + s.rows * s.dim);
    results.back().insert(results.back().end(), back.state1().begin(),
                          back.state1().end());
  }
  ExpectBitwiseEqual(results[0], results[1], "two runs");
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, CudaEmbeddingTest,
    ::testing::Values(
        // Kaggle-like one-hot features, float4 path, 8 bags per warp.
        Shape{16, POOLING_SUM, 1, 1000, 5000, 0},
        Shape{16, POOLING_MEAN, 20, 500, 300, 0},
        // Tiny table: nearly every id a duplicate.
        Shape{4, POOLING_SUM, 3, 257, 10, 0},
        // Scalar path (dim % 4 != 0, or an unaligned stride).
        Shape{3, POOLING_MEAN, 5, 100, 50, 0},
        Shape{33, POOLING_SUM, 2, 30, 64, 0},
        Shape{250, POOLING_MEAN, 3, 40, 64, 3},
        Shape{64, POOLING_SUM, 10, 300, 100000, 2},
        // Several units per lane, up to the widest row.
        Shape{128, POOLING_MEAN, 8, 64, 1000, 4},
        Shape{200, POOLING_SUM, 4, 50, 100, 0},
        Shape{1024, POOLING_SUM, 3, 20, 64, 0},
        // Many rows: a 22-bit sort key and a largest id far from the rest.
        Shape{4, POOLING_SUM, 1, 2000, 3000000, 0},
        // No bags at all; a one-row table.
        Shape{16, POOLING_SUM, 1, 0, 10, 0},
        Shape{8, POOLING_MEAN, 1, 1, 1, 0}),
    BagShapeName);

// Criteo's tiny tables (3 to 155 rows, tens of thousands of hits per
// batch): every hot row is summed in chunks (sparse_chunks.h). The device
// against the host stand-in of its pipeline (sparse_backward_host.h), which
// cuts the same chunks and adds in the same order: SGD and Adam bitwise;
// row-wise Adagrad within 1e-5 of scale, since the device sums a row's
// squares over its lanes in another order. Two device runs give the same
// bits.
class CudaTinyTableTest : public ::testing::TestWithParam<Shape> {};

TEST_P(CudaTinyTableTest, ChunkedUpdateMatchesHostStandIn) {
  DLRM_SKIP_WITHOUT_CUDA();
  const Shape s = GetParam();
  const int64_t stride = s.dim + s.pad;
  for (auto type : {OptimizerConfig::SGD, OptimizerConfig::ROWWISE_ADAGRAD,
                    OptimizerConfig::ADAM}) {
    SCOPED_TRACE(OptimizerTrace(type));
    Rng rng(kCudaTestSeed + 11 * s.dim + type);
    const OptimizerConfig optimizer = MakeOptimizer(type);
    EmbeddingTable initial(3, s.rows, s.dim, s.pooling, optimizer,
                           kCudaTestSeed);
    std::vector<float> weights(initial.weights(),
                               initial.weights() + s.rows * s.dim);
    std::vector<float> state1(initial.state1().begin(), initial.state1().end());
    std::vector<float> state2(initial.state2().begin(), initial.state2().end());
    auto gpu = CudaEmbeddingTable::FromHost(initial);
    auto again = CudaEmbeddingTable::FromHost(initial);
    ASSERT_TRUE(gpu.ok()) << gpu.status();
    ASSERT_TRUE(again.ok()) << again.status();
    SparseBackwardProducts products;
    int32_t longest = 0;
    for (int step = 1; step <= 2; ++step) {
      const data::SparseFeature ids = RandomIds(rng, s);
      const std::vector<float> grad =
          RandomFloats(rng, std::max<int64_t>(1, ids.num_bags() * stride));
      auto constants = optim::MakeStep(optimizer, step);
      ASSERT_TRUE(constants.ok()) << constants.status();
      ASSERT_TRUE(SparseBackwardUpdateHost(
                      weights.data(), state1.data(), state2.data(), s.rows,
                      s.dim, s.pooling == POOLING_MEAN, *constants, ids,
                      grad.data(), stride, &products)
                      .ok());
      for (int32_t c : products.counts) longest = std::max(longest, c);
      DeviceSparseFeature feature;
      ASSERT_TRUE(feature.Upload(ids).ok());
      auto grad_device = ToDevice(grad);
      for (auto* table : {&*gpu, &*again}) {
        const absl::Status st = (*table)->BackwardUpdate(
            feature.bags(), grad_device.data(), stride, /*stream=*/nullptr);
        ASSERT_TRUE(st.ok()) << st;
      }
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    }
    ASSERT_GT(longest, 10 * kSparseChunk) << "the case has no hot row";
    EmbeddingTable back = initial, back_again = initial;
    ASSERT_TRUE((*gpu)->CopyToHost(&back).ok());
    ASSERT_TRUE((*again)->CopyToHost(&back_again).ok());
    const std::span<const float> got[3] = {
        {back.weights(), weights.size()},
        {back.state1().data(), state1.size()},
        {back.state2().data(), state2.size()}};
    const std::span<const float> want[3] = {weights, state1, state2};
    const char* what[3] = {"weights", "state1", "state2"};
    for (int a = 0; a < 3; ++a) {
      if (type == OptimizerConfig::ROWWISE_ADAGRAD) {
        ExpectCloseToScale(got[a], want[a], 1e-5, what[a]);
      } else {
        ExpectBitwiseEqual(got[a], want[a], what[a]);
      }
    }
    ExpectBitwiseEqual(
        std::span<const float>(back.weights(), weights.size()),
        std::span<const float>(back_again.weights(), weights.size()),
        "two device runs");
    ExpectBitwiseEqual(back.state1(), back_again.state1(),
                       "two device runs, state1");
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, CudaTinyTableTest,
    ::testing::Values(
        // Three rows, about 35 000 hits: float4 path, 4 lanes per row.
        Shape{16, POOLING_SUM, 3, 20000, 3, 0},
        // Scalar path (dim % 4 != 0), mean pooling.
        Shape{33, POOLING_MEAN, 3, 20000, 3, 0},
        // 155 rows and a padded stride; 26 rows one-hot, a whole warp per
        // row.
        Shape{64, POOLING_MEAN, 4, 16384, 155, 4},
        Shape{128, POOLING_SUM, 1, 30000, 26, 0},
        // Eight units per lane: float (d = 250) and float4 (d = 1024).
        Shape{250, POOLING_MEAN, 2, 8000, 7, 3},
        Shape{1024, POOLING_SUM, 1, 8000, 5, 0}),
    BagShapeName);

// A table of more than 2^31 elements (2^25 + 3 rows of 64 floats, 8 GiB of
// weights; with Adam 24 GiB in all): the rows at and past element 2^31
// pool and train like a CPU table holding only the rows the batches use
// (each device id mapped to its index there), so no row offset wraps in
// 32 bits. Every row the batches touch is written first; one more written
// row, never in a batch, must keep its bits.
TEST(CudaLargeTableTest, RowsPastTwoToThe31ElementsTrainLikeTheCpu) {
  DLRM_SKIP_WITHOUT_CUDA();
  constexpr int kDim = 64;
  constexpr int64_t kRows = (int64_t{1} << 25) + 3;
  static_assert(kRows * kDim > (int64_t{1} << 31));
  const std::vector<int64_t> used = {0,
                                     1,
                                     (int64_t{1} << 25) - 1,
                                     int64_t{1} << 25,
                                     (int64_t{1} << 25) + 1,
                                     (int64_t{1} << 25) + 2};
  const int64_t bystander = (int64_t{1} << 25) - 2;
  for (auto type : {OptimizerConfig::SGD, OptimizerConfig::ADAM}) {
    SCOPED_TRACE(OptimizerConfig::Type_Name(type));
    size_t free_bytes = 0, total_bytes = 0;
    ASSERT_EQ(cudaMemGetInfo(&free_bytes, &total_bytes), cudaSuccess);
    const int arrays = type == OptimizerConfig::ADAM ? 3 : 1;
    const size_t need =
        static_cast<size_t>(arrays) * kRows * kDim * sizeof(float) +
        (size_t{1} << 30);
    if (free_bytes < need) {
      GTEST_SKIP() << "needs " << (need >> 20) << " MiB of device memory, "
                   << (free_bytes >> 20) << " MiB free";
    }
    const OptimizerConfig optimizer = MakeOptimizer(type);
    // The rows the batches use, and the bystander, as a small CPU table.
    const int64_t n = static_cast<int64_t>(used.size());
    EmbeddingTable cpu(0, n + 1, kDim, POOLING_SUM, optimizer, kCudaTestSeed);
    auto gpu =
        CudaEmbeddingTable::Create(0, kRows, kDim, POOLING_SUM, optimizer);
    ASSERT_TRUE(gpu.ok()) << gpu.status();
    const int w1 = (*gpu)->state_floats(0), w2 = (*gpu)->state_floats(1);
    auto write_row = [&](int64_t device_row, int64_t cpu_row) {
      const absl::Status st = (*gpu)->WriteRowRange(
          device_row, 1, cpu.weights() + cpu_row * kDim,
          w1 > 0 ? cpu.state1().data() + cpu_row * w1 : nullptr,
          w2 > 0 ? cpu.state2().data() + cpu_row * w2 : nullptr, nullptr);
      ASSERT_TRUE(st.ok()) << st;
    };
    for (int64_t k = 0; k < n; ++k) write_row(used[k], k);
    write_row(bystander, n);
    Rng rng(kCudaTestSeed + type);
    for (int step = 0; step < 3; ++step) {
      // 40 bags of 0 to 4 ids drawn from `used` (repeats within a bag).
      data::SparseFeature device_ids, cpu_ids;
      device_ids.offsets = {0};
      cpu_ids.offsets = {0};
      for (int b = 0; b < 40; ++b) {
        const int len = static_cast<int>(rng.Below(5));
        for (int i = 0; i < len; ++i) {
          const int64_t k = static_cast<int64_t>(rng.Below(n));
          device_ids.ids.push_back(used[k]);
          cpu_ids.ids.push_back(k);
        }
        device_ids.offsets.push_back(device_ids.ids.size());
        cpu_ids.offsets.push_back(cpu_ids.ids.size());
      }
      std::vector<float> want(40 * kDim);
      reference::PoolForward(cpu.weights(), kDim, POOLING_SUM, cpu_ids,
                             want.data(), kDim);
      ExpectBitwiseEqual(DeviceForward(**gpu, device_ids, kDim), want,
                         "pooled");
      const std::vector<float> grad = RandomFloats(rng, 40 * kDim);
      cpu.BackwardUpdate(cpu_ids, grad.data(), kDim);
      DeviceSparseFeature feature;
      ASSERT_TRUE(feature.Upload(device_ids).ok());
      auto grad_device = ToDevice(grad);
      const absl::Status st = (*gpu)->BackwardUpdate(
          feature.bags(), grad_device.data(), kDim, /*stream=*/nullptr);
      ASSERT_TRUE(st.ok()) << st;
    }
    EXPECT_EQ((*gpu)->step(), cpu.step());
    // Within 1e-5 of scale, as BackwardUpdateMatchesCpuTable; the
    // bystander bitwise.
    for (int64_t k = 0; k <= n; ++k) {
      const int64_t row = k < n ? used[k] : bystander;
      SCOPED_TRACE(::testing::Message() << "device row " << row);
      std::vector<float> w(kDim), s1(std::max(w1, 1)), s2(std::max(w2, 1));
      ASSERT_TRUE((*gpu)
                      ->ReadRowRange(row, 1, w.data(),
                                     w1 > 0 ? s1.data() : nullptr,
                                     w2 > 0 ? s2.data() : nullptr, nullptr)
                      .ok());
      const std::span<const float> want_w(cpu.weights() + k * kDim, kDim);
      if (k == n) {
        ExpectBitwiseEqual(w, want_w, "bystander weights");
        continue;
      }
      ExpectCloseToScale(w, want_w, 1e-5, "weights");
      if (w1 > 0) {
        ExpectCloseToScale(
            std::span<const float>(s1.data(), w1),
            std::span<const float>(cpu.state1().data() + k * w1, w1), 1e-5,
            "state1");
      }
      if (w2 > 0) {
        ExpectCloseToScale(
            std::span<const float>(s2.data(), w2),
            std::span<const float>(cpu.state2().data() + k * w2, w2), 1e-5,
            "state2");
      }
    }
  }
}

TEST(CudaEmbeddingEdgeTest, EmptyBagsGiveZerosAndNoUpdate) {
  DLRM_SKIP_WITHOUT_CUDA();
  const int dim = 8;
  EmbeddingTable cpu(0, 20, dim, POOLING_MEAN,
                     MakeOptimizer(OptimizerConfig::ADAM), kCudaTestSeed);
  auto gpu = CudaEmbeddingTable::FromHost(cpu);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  data::SparseFeature empty;
  empty.offsets = {0, 0, 0, 0};
  const std::vector<float> pooled = DeviceForward(**gpu, empty, dim);
  EXPECT_EQ(pooled, std::vector<float>(3 * dim, 0.0f));
  DeviceSparseFeature feature;
  ASSERT_TRUE(feature.Upload(empty).ok());
  auto grad = ToDevice(std::vector<float>(3 * dim, 1.0f));
  ASSERT_TRUE(
      (*gpu)->BackwardUpdate(feature.bags(), grad.data(), dim, nullptr).ok());
  cpu.BackwardUpdate(empty, std::vector<float>(3 * dim, 1.0f).data(), dim);
  EmbeddingTable back = cpu;
  ASSERT_TRUE((*gpu)->CopyToHost(&back).ok());
  // The step still counts (Adam's bias correction), nothing else moves.
  EXPECT_EQ(back.step(), 1);
  EXPECT_EQ(cpu.step(), 1);
  ExpectBitwiseEqual(std::span<const float>(back.weights(), 20 * dim),
                     std::span<const float>(cpu.weights(), 20 * dim),
                     "weights");
}

TEST(CudaEmbeddingEdgeTest, OutOfRangeIdsAreNeverTouched) {
  // Batches are validated on the host first; the kernels still must not
  // read or write outside the table if one slips through.
  DLRM_SKIP_WITHOUT_CUDA();
  const int dim = 4, rows = 6;
  EmbeddingTable cpu(0, rows, dim, POOLING_SUM,
                     MakeOptimizer(OptimizerConfig::SGD), kCudaTestSeed);
  auto gpu = CudaEmbeddingTable::FromHost(cpu);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  data::SparseFeature bad;
  bad.offsets = {0, 3};
  bad.ids = {rows, 2, -1};
  const std::vector<float> pooled = DeviceForward(**gpu, bad, dim);
  ExpectBitwiseEqual(
      pooled, std::span<const float>(cpu.weights() + 2 * dim, dim), "pooled");
  DeviceSparseFeature feature;
  ASSERT_TRUE(feature.Upload(bad).ok());
  auto grad = ToDevice(std::vector<float>(dim, 1.0f));
  ASSERT_TRUE(
      (*gpu)->BackwardUpdate(feature.bags(), grad.data(), dim, nullptr).ok());
  EmbeddingTable back = cpu;
  ASSERT_TRUE((*gpu)->CopyToHost(&back).ok());
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < dim; ++c) {
      const float want = cpu.weights()[r * dim + c] - (r == 2 ? 0.1f : 0.0f);
      EXPECT_FLOAT_EQ(back.weights()[r * dim + c], want) << r << "," << c;
    }
  }
}

// Argument checks run before any CUDA call, so they hold on every machine.
TEST(CudaEmbeddingArgsTest, BadShapesAreInvalidArgument) {
  DeviceBags bags;
  bags.num_bags = 1;
  EXPECT_EQ(
      PoolForward(nullptr, 10, 0, false, bags, nullptr, 0, nullptr).code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PoolForward(nullptr, 10, 2048, false, bags, nullptr, 2048, nullptr)
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      PoolForward(nullptr, 10, 16, false, bags, nullptr, 8, nullptr).code(),
      absl::StatusCode::kInvalidArgument);
  BackwardWorkspace ws;
  EXPECT_EQ(
      SparseBackwardUpdate(nullptr, nullptr, nullptr, 10, 257, false,
                           optim::Sgd::Step{}, bags, nullptr, 257, &ws, nullptr)
          .code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MaxDim(16), 1024);
  EXPECT_EQ(MaxDim(15), 256);
  EmbeddingTable wide(0, 2, 1028, POOLING_SUM,
                      MakeOptimizer(OptimizerConfig::SGD), kCudaTestSeed);
  EXPECT_EQ(CudaEmbeddingTable::FromHost(wide).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace dlrm::embedding::cuda
