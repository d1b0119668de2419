// Tests for embedding/cuda/cuda_store.h: the device tier against HostStore
// (the CPU reference) through the EmbeddingStore interface on random
// batches (every optimizer, sum and mean, multi-hot bags with repeats and
// empty bags, several steps), record round trips, the step counter, a
// caller's stream, and the argument checks; the device tier's cache
// (device_slots.h) against the same table whole on the device and in host
// memory, with its host tier pinned and read directly and with staged
// copies; the record kernels against their CPU reference. Skipped without
// a CUDA device.
// Stores are made with CudaStore::Create, not CreateEmbeddingStore, so the
// binary does not link RocksDB (scripts/gpu_lease.sh carries it to GPU
// machines under a size limit); tests/embedding/embedding_store_test.cc covers
// the factory's kDevice case.
#include "embedding/cuda/cuda_store.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/cuda/cuda_raii.h"
#include "core/random.h"
#include "embedding/cached_store.h"
#include "embedding/cuda/device_slots.h"
#include "embedding/cuda/embedding_kernels.h"
#include "embedding/embedding_store.h"
#include "tests/support/cuda_test_util.h"
#include "tests/support/expect.h"
#include "tests/support/table_spec.h"

namespace dlrm::embedding::cuda {
namespace {

// The CUDA tests' helpers (tests/support/cuda_test_util.h).
using namespace ::dlrm::testing;  // NOLINT(build/namespaces)
using test::AllRecords;
using test::SkewedIds;

// The tolerance, relative to the compared values' scale
// (ExpectCloseToScale), of pooled outputs and records once a table has been
// updated. The kernels add and multiply in the CPU's order with unfused
// round-to-nearest operations, and the first pooling of the initial rows is
// required to be bitwise equal. Updates are not bitwise for row-wise
// Adagrad, whose row sum of squared gradients the GPU reduces in a
// butterfly instead of in column order: the accumulator moves by an ulp or
// two (~1e-7 relative), that carries into the weights, and from them into
// every later pooled sum and update. Over a few steps that stays two
// orders of magnitude under 1e-5, while a wrong row, gradient scale (mean
// pooling), step count or state array moves values by far more than 1e-3.
constexpr double kTolerance = 1e-5;

TableSpec MakeSpec(int64_t rows, int dim, Pooling pooling,
                   OptimizerConfig::Type type) {
  return test::MakeTableSpec(3, rows, dim, pooling, type, kCudaTestSeed);
}

std::unique_ptr<EmbeddingStore> DeviceStore(const TableSpec& spec,
                                            void* stream = nullptr) {
  auto store = CudaStore::Create(spec, stream);
  EXPECT_TRUE(store.ok()) << store.status();
  if (!store.ok()) return nullptr;
  EXPECT_EQ((*store)->memory_space(), MemorySpace::kDevice);
  return std::move(store).value();
}

using Shape = BagShape;

// The store's pooled rows of `prepared` (a device Forward, waited for),
// rows `stride` apart; padding columns keep the NaN poison.
std::vector<float> DeviceForward(EmbeddingStore& store,
                                 const data::SparseFeature& prepared,
                                 int64_t stride) {
  const size_t n = static_cast<size_t>(prepared.num_bags()) * stride;
  auto out = Poisoned(n);
  const absl::Status st = store.Forward(prepared, out.data(), stride);
  EXPECT_TRUE(st.ok()) << st;
  const absl::Status synced = store.Synchronize();
  EXPECT_TRUE(synced.ok()) << synced;
  return ToHost(out, n);
}

std::vector<float> HostForward(EmbeddingStore& store,
                               const data::SparseFeature& prepared,
                               int64_t stride) {
  std::vector<float> out(static_cast<size_t>(prepared.num_bags()) * stride,
                         std::nanf(""));
  const absl::Status st = store.Forward(prepared, out.data(), stride);
  EXPECT_TRUE(st.ok()) << st;
  return out;
}

// Compares two stores' records: rows in `touched` within kTolerance of
// scale, weights and state apart; the other rows bitwise.
void ExpectRecordsMatch(EmbeddingStore& device, EmbeddingStore& host,
                        const std::vector<bool>& touched) {
  const TableSpec& spec = host.spec();
  const int dim = spec.dim;
  const int state = StateFloatsPerRow(spec.optimizer, dim);
  const std::vector<float> got = AllRecords(device);
  const std::vector<float> want = AllRecords(host);
  ASSERT_EQ(got.size(), want.size());
  std::vector<float> got_w, want_w, got_s, want_s;
  for (int64_t r = 0; r < spec.rows; ++r) {
    const float* g = got.data() + r * (dim + state);
    const float* w = want.data() + r * (dim + state);
    if (!touched[r]) {
      ASSERT_EQ(std::memcmp(g, w, sizeof(float) * (dim + state)), 0)
          << "untouched row " << r << " differs";
      continue;
    }
    got_w.insert(got_w.end(), g, g + dim);
    want_w.insert(want_w.end(), w, w + dim);
    got_s.insert(got_s.end(), g + dim, g + dim + state);
    want_s.insert(want_s.end(), w + dim, w + dim + state);
  }
  ExpectCloseToScale(got_w, want_w, kTolerance, "touched weights");
  ExpectCloseToScale(got_s, want_s, kTolerance, "touched state");
}

class CudaStoreTest : public ::testing::TestWithParam<Shape> {};

TEST_P(CudaStoreTest, TrainsLikeHostStore) {
  DLRM_SKIP_WITHOUT_CUDA();
  const Shape s = GetParam();
  for (auto type : {OptimizerConfig::SGD, OptimizerConfig::ROWWISE_ADAGRAD,
                    OptimizerConfig::ADAM}) {
    SCOPED_TRACE(OptimizerTrace(type));
    Rng rng(kCudaTestSeed + 11 * s.dim + type);
    const TableSpec spec = MakeSpec(s.rows, s.dim, s.pooling, type);
    HostStore host(spec);
    std::unique_ptr<EmbeddingStore> device = DeviceStore(spec);
    ASSERT_NE(device, nullptr);
    // The same initial rows and state, bit for bit.
    ExpectRecordsMatch(*device, host, std::vector<bool>(s.rows, false));

    const int64_t stride = s.dim + s.pad;
    std::vector<bool> touched(s.rows, false);
    for (int step = 0; step < 4; ++step) {
      SCOPED_TRACE(::testing::Message() << "step " << step);
      const data::SparseFeature ids = RandomIds(rng, s);
      auto on_host = host.Prepare(ids);
      auto on_device = device->Prepare(ids);
      ASSERT_TRUE(on_host.ok()) << on_host.status();
      ASSERT_TRUE(on_device.ok()) << on_device.status();
      EXPECT_EQ(*on_device, &ids);

      const std::vector<float> want = HostForward(host, **on_host, stride);
      const std::vector<float> got =
          DeviceForward(*device, **on_device, stride);
      if (step == 0) {
        // Initial rows, sums in id order, the mean one multiply: bitwise,
        // padding unwritten (NaN on both sides), empty bags zero.
        ExpectBitwiseEqual(got, want, "pooled");
      } else {
        // Compare the written columns only (the padding is NaN).
        std::vector<float> got_c, want_c;
        for (int64_t b = 0; b < ids.num_bags(); ++b) {
          got_c.insert(got_c.end(), got.begin() + b * stride,
                       got.begin() + b * stride + s.dim);
          want_c.insert(want_c.end(), want.begin() + b * stride,
                        want.begin() + b * stride + s.dim);
        }
        ExpectCloseToScale(got_c, want_c, kTolerance, "pooled");
      }

      const std::vector<float> grad =
          RandomFloats(rng, std::max<int64_t>(1, ids.num_bags() * stride));
      auto grad_device = ToDevice(grad);
      ASSERT_TRUE(host.BackwardUpdate(**on_host, grad.data(), stride).ok());
      const absl::Status st =
          device->BackwardUpdate(**on_device, grad_device.data(), stride);
      ASSERT_TRUE(st.ok()) << st;
      // grad_device must outlive the queued update.
      ASSERT_TRUE(device->Synchronize().ok());
      for (int64_t id : ids.ids) touched[id] = true;
      EXPECT_EQ(device->step(), host.step());
    }
    ExpectRecordsMatch(*device, host, touched);
    EXPECT_EQ(device->step(), 4);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, CudaStoreTest,
    ::testing::Values(
        // One-hot, float4 path.
        Shape{16, POOLING_SUM, 1, 500, 2000, 0},
        // Multi-hot with repeats and empty bags, sum and mean.
        Shape{16, POOLING_MEAN, 20, 300, 300, 0},
        Shape{8, POOLING_SUM, 6, 257, 20, 0},
        // Scalar path (dim % 4 != 0, or a stride that breaks alignment).
        Shape{3, POOLING_MEAN, 5, 100, 50, 0},
        Shape{64, POOLING_MEAN, 4, 64, 1000, 3},
        // Wide rows over several staging chunks of ReadRows (Adam: 3072
        // floats a record, 1365 rows a chunk).
        Shape{1024, POOLING_SUM, 3, 20, 3000, 0},
        // No bags at all; a one-row table.
        Shape{16, POOLING_SUM, 1, 0, 10, 0},
        Shape{8, POOLING_MEAN, 1, 1, 1, 0}),
    BagShapeName);

TEST(CudaStoreEdgeTest, EmptyBagsGiveZerosAndCountAStep) {
  DLRM_SKIP_WITHOUT_CUDA();
  const int dim = 8;
  const TableSpec spec = MakeSpec(20, dim, POOLING_MEAN, OptimizerConfig::ADAM);
  HostStore host(spec);
  std::unique_ptr<EmbeddingStore> device = DeviceStore(spec);
  ASSERT_NE(device, nullptr);
  data::SparseFeature empty;
  empty.offsets = {0, 0, 0, 0};
  ASSERT_TRUE(device->Prepare(empty).ok());
  EXPECT_EQ(DeviceForward(*device, empty, dim),
            std::vector<float>(3 * dim, 0.0f));
  auto grad = ToDevice(std::vector<float>(3 * dim, 1.0f));
  ASSERT_TRUE(device->BackwardUpdate(empty, grad.data(), dim).ok());
  ASSERT_TRUE(device->Synchronize().ok());
  const std::vector<float> ones(3 * dim, 1.0f);
  ASSERT_TRUE(host.BackwardUpdate(empty, ones.data(), dim).ok());
  // The step still counts (Adam's bias correction), nothing else moves.
  EXPECT_EQ(device->step(), 1);
  EXPECT_EQ(host.step(), 1);
  ExpectRecordsMatch(*device, host, std::vector<bool>(20, false));

  // A batch of no bags at all (empty offsets too).
  data::SparseFeature none;
  ASSERT_TRUE(device->Prepare(none).ok());
  ASSERT_TRUE(device->Forward(none, nullptr, dim).ok());
  ASSERT_TRUE(device->BackwardUpdate(none, nullptr, dim).ok());
  ASSERT_TRUE(device->Synchronize().ok());
  EXPECT_EQ(device->step(), 2);
}

TEST(CudaStoreEdgeTest, ShardStartsLikeTheHostShard) {
  DLRM_SKIP_WITHOUT_CUDA();
  TableSpec spec = MakeSpec(40, 12, POOLING_SUM, OptimizerConfig::ADAGRAD);
  spec.slice = TableSlice{1000, 300, 4};
  HostStore host(spec);
  std::unique_ptr<EmbeddingStore> device = DeviceStore(spec);
  ASSERT_NE(device, nullptr);
  ExpectBitwiseEqual(AllRecords(*device), AllRecords(host), "records");
}

TEST(CudaStoreEdgeTest, RecordsRoundTripAndStepDrivesAdam) {
  DLRM_SKIP_WITHOUT_CUDA();
  SCOPED_TRACE(::testing::Message() << "seed " << kCudaTestSeed);
  const int dim = 8, rows = 30;
  const TableSpec spec =
      MakeSpec(rows, dim, POOLING_SUM, OptimizerConfig::ADAM);
  const int floats = dim + StateFloatsPerRow(spec.optimizer, dim);
  HostStore host(spec);
  std::unique_ptr<EmbeddingStore> device = DeviceStore(spec);
  ASSERT_NE(device, nullptr);
  Rng rng(kCudaTestSeed);
  // Adam's second moment must not be negative.
  std::vector<float> records = RandomFloats(rng, 7 * floats);
  for (int r = 0; r < 7; ++r) {
    for (int c = 2 * dim; c < floats; ++c) {
      records[r * floats + c] = std::fabs(records[r * floats + c]);
    }
  }
  ASSERT_TRUE(device->WriteRows(5, 7, records.data()).ok());
  ASSERT_TRUE(host.WriteRows(5, 7, records.data()).ok());
  std::vector<float> back(7 * floats);
  ASSERT_TRUE(device->ReadRows(5, 7, back.data()).ok());
  ExpectBitwiseEqual(back, records, "round trip");
  ASSERT_TRUE(device->ReadRow(11, back.data()).ok());
  ExpectBitwiseEqual(
      std::span<const float>(back.data(), floats),
      std::span<const float>(records.data() + 6 * floats, floats), "row 11");
  ExpectRecordsMatch(*device, host, std::vector<bool>(rows, false));

  // A restored step: the next update is step 42 on both, with its bias
  // corrections.
  device->set_step(41);
  host.set_step(41);
  EXPECT_EQ(device->step(), 41);
  data::SparseFeature ids;
  ids.offsets = {0, 2, 3};
  ids.ids = {5, 11, 5};
  const std::vector<float> grad = RandomFloats(rng, 2 * dim);
  auto grad_device = ToDevice(grad);
  ASSERT_TRUE(device->Prepare(ids).ok());
  ASSERT_TRUE(host.Prepare(ids).ok());
  ASSERT_TRUE(device->BackwardUpdate(ids, grad_device.data(), dim).ok());
  ASSERT_TRUE(host.BackwardUpdate(ids, grad.data(), dim).ok());
  // ReadRows waits for the queued update by itself.
  std::vector<bool> touched(rows, false);
  touched[5] = touched[11] = true;
  ExpectRecordsMatch(*device, host, touched);
  EXPECT_EQ(device->step(), 42);
  EXPECT_TRUE(device->Flush().ok());
  EXPECT_TRUE(device->Prefetch(ids).ok());
  const StoreMetrics m = device->metrics();
  EXPECT_EQ(m.hits + m.misses + m.rows_read + m.rows_written, 0);
}

TEST(CudaStoreEdgeTest, WorkRunsInOrderOnTheCallersStream) {
  DLRM_SKIP_WITHOUT_CUDA();
  auto stream = dlrm::cuda::CudaStream::Create();
  ASSERT_TRUE(stream.ok()) << stream.status();
  const int dim = 16;
  const TableSpec spec = MakeSpec(100, dim, POOLING_SUM, OptimizerConfig::SGD);
  HostStore host(spec);
  std::unique_ptr<EmbeddingStore> device = DeviceStore(spec, stream->get());
  ASSERT_NE(device, nullptr);
  data::SparseFeature ids;
  ids.offsets = {0, 1, 3};
  ids.ids = {7, 99, 7};
  ASSERT_TRUE(device->Prepare(ids).ok());
  ASSERT_TRUE(host.Prepare(ids).ok());
  auto out = Poisoned(2 * dim);
  ASSERT_TRUE(device->Forward(ids, out.data(), dim).ok());
  // A copy queued behind the Forward on the same stream sees its result
  // without the store being asked to wait.
  std::vector<float> got(2 * dim);
  ASSERT_EQ(cudaMemcpyAsync(got.data(), out.data(), sizeof(float) * 2 * dim,
                            cudaMemcpyDeviceToHost, stream->get()),
            cudaSuccess);
  ASSERT_TRUE(stream->Synchronize().ok());
  ExpectBitwiseEqual(got, HostForward(host, ids, dim), "pooled");
}

TEST(CudaStoreEdgeTest, BadIdsRangesAndBatchesAreRefused) {
  DLRM_SKIP_WITHOUT_CUDA();
  const int dim = 4, rows = 10;
  const TableSpec spec = MakeSpec(rows, dim, POOLING_SUM, OptimizerConfig::SGD);
  std::unique_ptr<EmbeddingStore> device = DeviceStore(spec);
  ASSERT_NE(device, nullptr);
  const std::vector<float> before = AllRecords(*device);
  auto out = Poisoned(2 * dim);

  data::SparseFeature good;
  good.offsets = {0, 1, 2};
  good.ids = {1, 2};
  ASSERT_TRUE(device->Prepare(good).ok());

  for (const std::vector<int64_t>& bad_ids :
       {std::vector<int64_t>{1, rows}, std::vector<int64_t>{-1, 2},
        std::vector<int64_t>{int64_t{1} << 31, 0}}) {
    data::SparseFeature bad;
    bad.offsets = {0, 1, 2};
    bad.ids = bad_ids;
    const auto st = device->Prepare(bad).status();
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    EXPECT_HAS_SUBSTR(st.message(), "table 3") << st;
    EXPECT_HAS_SUBSTR(st.message(), "outside [0, 10)") << st;
  }
  // A failed Prepare leaves no prepared batch.
  EXPECT_EQ(device->Forward(good, out.data(), dim).code(),
            absl::StatusCode::kFailedPrecondition);

  for (const std::vector<int64_t>& offsets :
       {std::vector<int64_t>{1, 2}, std::vector<int64_t>{0, 2, 1},
        std::vector<int64_t>{0, 1}, std::vector<int64_t>{}}) {
    data::SparseFeature bad;
    bad.offsets = offsets;
    bad.ids = {1, 2};
    const auto st = device->Prepare(bad).status();
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    EXPECT_HAS_SUBSTR(st.message(), "table 3") << st;
  }

  // Kernels only on the last Prepare's batch.
  ASSERT_TRUE(device->Prepare(good).ok());
  const data::SparseFeature copy = good;
  EXPECT_EQ(device->Forward(copy, out.data(), dim).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(device->BackwardUpdate(copy, out.data(), dim).code(),
            absl::StatusCode::kFailedPrecondition);
  // Host memory where device memory is due.
  std::vector<float> host_out(2 * dim);
  EXPECT_EQ(device->Forward(good, host_out.data(), dim).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(device->BackwardUpdate(good, host_out.data(), dim).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(device->Forward(good, out.data(), dim - 1).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(device->step(), 0);

  std::vector<float> records((rows + 1) * dim);
  for (const auto& [begin, count] : {std::pair<int64_t, int64_t>{-1, 1},
                                     {rows, 1},
                                     {0, rows + 1},
                                     {3, -1}}) {
    EXPECT_EQ(device->ReadRows(begin, count, records.data()).code(),
              absl::StatusCode::kInvalidArgument)
        << begin << "+" << count;
    EXPECT_EQ(device->WriteRows(begin, count, records.data()).code(),
              absl::StatusCode::kInvalidArgument)
        << begin << "+" << count;
  }
  EXPECT_TRUE(device->ReadRows(rows, 0, records.data()).ok());
  // Nothing above changed a row.
  ExpectBitwiseEqual(AllRecords(*device), before, "records");
}

TEST(CudaStoreEdgeTest, WideRowsOverTheKernelLimitAreRefused) {
  DLRM_SKIP_WITHOUT_CUDA();
  const TableSpec spec = MakeSpec(2, 1028, POOLING_SUM, OptimizerConfig::SGD);
  EXPECT_EQ(CudaStore::Create(spec).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// ------------------------------------------------- the device tier's cache

// Records moved into and out of device slots (DeviceSlots: GatherRows and
// ScatterRows through pinned staging) against host slots (HostSlots, the
// CPU reference): random records written to every slot in a random order,
// read back for a random subset of slots, bitwise on both sides; with wide
// Adam records the copies span several 16 MiB staging chunks.
TEST(DeviceSlotsTest, ReadAndWriteSlotsMatchHostSlots) {
  DLRM_SKIP_WITHOUT_CUDA();
  SCOPED_TRACE(::testing::Message() << "seed " << kCudaTestSeed);
  struct Case {
    int dim;
    OptimizerConfig::Type type;
    int64_t slots;
  };
  for (const Case c : {Case{16, OptimizerConfig::SGD, 300},
                       Case{3, OptimizerConfig::ROWWISE_ADAGRAD, 257},
                       Case{8, OptimizerConfig::ADAGRAD, 64},
                       Case{1024, OptimizerConfig::ADAM, 3000}}) {
    SCOPED_TRACE(::testing::Message() << "dim " << c.dim << " "
                                      << OptimizerConfig::Type_Name(c.type));
    const TableSpec spec = MakeSpec(10 * c.slots, c.dim, POOLING_SUM, c.type);
    const int64_t floats = c.dim + StateFloatsPerRow(spec.optimizer, c.dim);
    auto device = DeviceSlots::Create(spec, c.slots);
    ASSERT_TRUE(device.ok()) << device.status();
    EXPECT_EQ((*device)->slots(), c.slots);
    HostSlots host(spec, c.slots);
    Rng rng(kCudaTestSeed + c.dim);
    std::vector<int64_t> order(c.slots);
    for (int64_t i = 0; i < c.slots; ++i) order[i] = i;
    for (int64_t i = c.slots - 1; i > 0; --i) {
      std::swap(order[i], order[rng.Below(i + 1)]);
    }
    const std::vector<float> records = RandomFloats(rng, c.slots * floats);
    ASSERT_TRUE(
        (*device)->WriteSlots(order.data(), c.slots, records.data()).ok());
    ASSERT_TRUE(host.WriteSlots(order.data(), c.slots, records.data()).ok());
    std::vector<int64_t> some;
    for (int64_t i = 0; i < c.slots; ++i) {
      if (rng.Below(3) == 0) some.push_back(rng.Below(c.slots));
    }
    const int64_t n = static_cast<int64_t>(some.size());
    std::vector<float> got(n * floats, std::nanf("")), want(n * floats);
    ASSERT_TRUE((*device)->ReadSlots(some.data(), n, got.data()).ok());
    ASSERT_TRUE(host.ReadSlots(some.data(), n, want.data()).ok());
    ExpectBitwiseEqual(got, want, "slots read back");
    // And each is the record written to that slot.
    for (int64_t i = 0; i < n; ++i) {
      const int64_t k =
          std::find(order.begin(), order.end(), some[i]) - order.begin();
      ASSERT_EQ(
          std::memcmp(got.data() + i * floats, records.data() + k * floats,
                      sizeof(float) * floats),
          0)
          << "slot " << some[i];
    }
  }
}

// A host table of `spec` with random records in every row.
std::unique_ptr<HostStore> RandomHostTable(const TableSpec& spec, Rng& rng) {
  auto store = std::make_unique<HostStore>(spec);
  const int64_t floats = spec.dim + StateFloatsPerRow(spec.optimizer, spec.dim);
  const std::vector<float> records = RandomFloats(rng, spec.rows * floats);
  EXPECT_TRUE(store->WriteRows(0, spec.rows, records.data()).ok());
  return store;
}

// `n` distinct numbers in [0, limit) in random order, and `n` numbers in
// [0, limit) with repeats.
std::vector<int64_t> DistinctBelow(Rng& rng, int64_t limit, int64_t n) {
  std::vector<int64_t> all(limit);
  for (int64_t i = 0; i < limit; ++i) all[i] = i;
  for (int64_t i = limit - 1; i > 0; --i) {
    std::swap(all[i], all[rng.Below(i + 1)]);
  }
  all.resize(n);
  return all;
}
std::vector<int64_t> AnyBelow(Rng& rng, int64_t limit, int64_t n) {
  std::vector<int64_t> v(n);
  for (int64_t& x : v) x = rng.Below(limit);
  return v;
}

// A table's arrays as the record kernels take them, at `weights`, `s1`,
// `s2`.
RecordArrays ArraysAt(const EmbeddingTable& t, float* weights, float* s1,
                      float* s2) {
  RecordArrays a;
  a.weights = weights;
  a.state1 = t.state_floats(0) > 0 ? s1 : nullptr;
  a.state2 = t.state_floats(1) > 0 ? s2 : nullptr;
  a.rows = t.rows();
  a.dim = t.dim();
  a.state1_floats = t.state_floats(0);
  a.state2_floats = t.state_floats(1);
  return a;
}

// The record kernels against CopyRecords (their CPU reference), through
// the path the device cache uses: a host table's arrays pinned and mapped
// (HostRegistration), slots in device memory. LoadRecords copies random
// rows (repeats allowed) into distinct random slots, StoreRecords random
// slots into distinct random rows; every array of both sides is then
// bitwise the reference's, for SGD (no state), row-wise Adagrad (one float
// per row, odd dim), Adam (two dim-wide arrays) and a wide Adam row.
TEST(RecordKernelsTest, LoadAndStoreMatchTheCpuReference) {
  DLRM_SKIP_WITHOUT_CUDA();
  SCOPED_TRACE(::testing::Message() << "seed " << kCudaTestSeed);
  struct Case {
    int dim;
    OptimizerConfig::Type type;
    int64_t rows, slots, n;
  };
  for (const Case c : {Case{16, OptimizerConfig::SGD, 1000, 300, 200},
                       Case{3, OptimizerConfig::ROWWISE_ADAGRAD, 777, 257, 257},
                       Case{8, OptimizerConfig::ADAM, 500, 64, 37},
                       Case{1024, OptimizerConfig::ADAM, 300, 100, 90}}) {
    SCOPED_TRACE(::testing::Message() << "dim " << c.dim << " "
                                      << OptimizerConfig::Type_Name(c.type));
    Rng rng(kCudaTestSeed + c.dim);
    const TableSpec spec = MakeSpec(c.rows, c.dim, POOLING_SUM, c.type);
    TableSpec slot_spec = spec;
    slot_spec.rows = c.slots;
    // The host table (mapped for the kernels) and its reference copy; the
    // device slots and theirs, from the same random records.
    std::unique_ptr<HostStore> host = RandomHostTable(spec, rng);
    std::unique_ptr<HostStore> host_ref = std::make_unique<HostStore>(spec);
    {
      const std::vector<float> all = AllRecords(*host);
      ASSERT_TRUE(host_ref->WriteRows(0, c.rows, all.data()).ok());
    }
    std::unique_ptr<HostStore> slots_ref = RandomHostTable(slot_spec, rng);
    EmbeddingTable& ht = host->table();
    EmbeddingTable& st = slots_ref->table();
    std::vector<dlrm::cuda::HostRegistration> pinned;
    float* mapped[3] = {nullptr, nullptr, nullptr};
    float* arrays[3] = {ht.weights(), ht.state1().data(), ht.state2().data()};
    const size_t sizes[3] = {static_cast<size_t>(c.rows) * c.dim,
                             ht.state1().size(), ht.state2().size()};
    for (int k = 0; k < 3; ++k) {
      if (sizes[k] == 0) continue;
      auto r = dlrm::cuda::HostRegistration::Register(arrays[k],
                                                      sizes[k] * sizeof(float));
      ASSERT_TRUE(r.ok()) << r.status();
      mapped[k] = static_cast<float*>(r->device_pointer());
      pinned.push_back(std::move(r).value());
    }
    auto dw = ToDevice(std::span<const float>(
        st.weights(), static_cast<size_t>(c.slots) * c.dim));
    auto d1 =
        ToDevice(std::vector<float>(st.state1().begin(), st.state1().end()));
    auto d2 =
        ToDevice(std::vector<float>(st.state2().begin(), st.state2().end()));
    const RecordArrays table_arrays =
        ArraysAt(ht, mapped[0], mapped[1], mapped[2]);
    const RecordArrays slot_arrays =
        ArraysAt(st, dw.data(), d1.data(), d2.data());

    const std::vector<int64_t> load_rows = AnyBelow(rng, c.rows, c.n);
    const std::vector<int64_t> load_slots = DistinctBelow(rng, c.slots, c.n);
    const std::vector<int64_t> store_slots = AnyBelow(rng, c.slots, c.n);
    const std::vector<int64_t> store_rows = DistinctBelow(rng, c.rows, c.n);
    auto d_load_rows = ToDevice(load_rows);
    auto d_load_slots = ToDevice(load_slots);
    auto d_store_slots = ToDevice(store_slots);
    auto d_store_rows = ToDevice(store_rows);
    ASSERT_TRUE(LoadRecords(table_arrays, d_load_rows.data(), slot_arrays,
                            d_load_slots.data(), c.n, nullptr)
                    .ok());
    ASSERT_TRUE(StoreRecords(slot_arrays, d_store_slots.data(), table_arrays,
                             d_store_rows.data(), c.n, nullptr)
                    .ok());
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    CopyRecords(host_ref->table(), load_rows.data(), st, load_slots.data(),
                c.n);
    CopyRecords(st, store_slots.data(), host_ref->table(), store_rows.data(),
                c.n);
    // The slots: their device arrays against the reference's.
    ExpectBitwiseEqual(ToHost(dw, dw.size()),
                       std::span<const float>(st.weights(), dw.size()),
                       "slot weights");
    if (d1.size() > 0) {
      ExpectBitwiseEqual(ToHost(d1, d1.size()), st.state1(), "slot state1");
    }
    if (d2.size() > 0) {
      ExpectBitwiseEqual(ToHost(d2, d2.size()), st.state2(), "slot state2");
    }
    // The mapped host table, written by StoreRecords.
    ExpectBitwiseEqual(AllRecords(*host), AllRecords(*host_ref),
                       "host table records");
  }
}

// The device tier's cache (a tenth of the table in device slots in front
// of the table in host memory) against the whole table in device memory
// (CudaStore) and in host memory (HostStore, the CPU reference): the same
// kernels on the same rows in the same order, so pooled outputs and
// records equal CudaStore's bitwise, and HostStore's within kTolerance (as
// CudaStore's do), over every embedding optimizer and both policies, with
// the next batch prefetched as the model does, records read and written
// midway, and flushes to the host tier; with the host tier pinned and read
// directly by the record kernels, and through staged copies. (Both bitwise
// like CudaStore, so like each other: the copies are exact.)
TEST(CudaCachedStoreTest, TrainsLikeTheWholeTableOnTheDevice) {
  DLRM_SKIP_WITHOUT_CUDA();
  for (const bool direct : {true, false}) {
    for (const EvictionPolicy eviction :
         {EvictionPolicy::kLru, EvictionPolicy::kLfu}) {
      for (auto type :
           {OptimizerConfig::SGD, OptimizerConfig::ADAGRAD,
            OptimizerConfig::ROWWISE_ADAGRAD, OptimizerConfig::ADAM}) {
        SCOPED_TRACE(::testing::Message()
                     << (direct ? "direct" : "staged") << " optimizer "
                     << OptimizerConfig::Type_Name(type)
                     << (eviction == EvictionPolicy::kLru ? " LRU" : " LFU")
                     << " seed " << kCudaTestSeed);
        const int dim = 16;
        const int64_t rows = 3000, bags = 24;
        const TableSpec spec = MakeSpec(rows, dim, POOLING_MEAN, type);
        CacheOptions cache;
        cache.cache_rows = rows / 10;
        cache.eviction = eviction;
        cache.direct_host_access = direct;
        auto cached = CreateDeviceCachedStore(spec, cache);
        ASSERT_TRUE(cached.ok()) << cached.status();
        CachedStore& store = **cached;
        EXPECT_EQ(store.memory_space(), MemorySpace::kDevice);
        // Pinning a table this small should not fail (DeviceSlots::MapHostTable
        // logs why if it does).
        ASSERT_EQ(store.direct(), direct);
        std::unique_ptr<EmbeddingStore> whole = DeviceStore(spec);
        ASSERT_NE(whole, nullptr);
        HostStore host(spec);
        Rng rng(kCudaTestSeed + 7 * type);
        std::vector<data::SparseFeature> batches;
        for (int i = 0; i <= 20; ++i) {
          batches.push_back(SkewedIds(rng, rows, bags, 4, /*repeats=*/false));
        }
        std::vector<bool> touched(rows, false);
        for (int step = 0; step < 20; ++step) {
          SCOPED_TRACE(::testing::Message() << "step " << step);
          const data::SparseFeature& ids = batches[step];
          auto p_cached = store.Prepare(ids);
          auto p_whole = whole->Prepare(ids);
          auto p_host = host.Prepare(ids);
          ASSERT_TRUE(p_cached.ok()) << p_cached.status();
          ASSERT_TRUE(p_whole.ok()) << p_whole.status();
          ASSERT_TRUE(p_host.ok()) << p_host.status();
          ASSERT_TRUE(store.Prefetch(batches[step + 1]).ok());
          const std::vector<float> got = DeviceForward(store, **p_cached, dim);
          ExpectBitwiseEqual(got, DeviceForward(*whole, **p_whole, dim),
                             "pooled vs CudaStore");
          ExpectCloseToScale(got, HostForward(host, **p_host, dim), kTolerance,
                             "pooled vs HostStore");
          const std::vector<float> grad =
              RandomFloats(rng, std::max<int64_t>(1, ids.num_bags() * dim));
          auto grad_device = ToDevice(grad);
          ASSERT_TRUE(
              store.BackwardUpdate(**p_cached, grad_device.data(), dim).ok());
          ASSERT_TRUE(
              whole->BackwardUpdate(**p_whole, grad_device.data(), dim).ok());
          ASSERT_TRUE(host.BackwardUpdate(**p_host, grad.data(), dim).ok());
          ASSERT_TRUE(store.Synchronize().ok());
          ASSERT_TRUE(whole->Synchronize().ok());
          for (const int64_t id : ids.ids) touched[id] = true;
          if (step == 10) {
            ExpectBitwiseEqual(AllRecords(store), AllRecords(*whole),
                               "records midway");
            ASSERT_TRUE(store.Flush().ok());
            ExpectBitwiseEqual(AllRecords(store.backing()), AllRecords(*whole),
                               "host tier after Flush");
            // Hot rows (resident) and the last rows (likely not) rewritten.
            const int64_t floats = dim + StateFloatsPerRow(spec.optimizer, dim);
            std::vector<float> records(6 * floats);
            for (float& x : records) {
              x = static_cast<float>(rng.Uniform(0.1, 0.2));
            }
            for (const int64_t begin : {int64_t{0}, rows - 6}) {
              ASSERT_TRUE(store.WriteRows(begin, 6, records.data()).ok());
              ASSERT_TRUE(whole->WriteRows(begin, 6, records.data()).ok());
              ASSERT_TRUE(host.WriteRows(begin, 6, records.data()).ok());
              for (int64_t r = begin; r < begin + 6; ++r) touched[r] = true;
            }
          }
        }
        EXPECT_EQ(store.step(), whole->step());
        ExpectBitwiseEqual(AllRecords(store), AllRecords(*whole), "records");
        ExpectRecordsMatch(store, host, touched);
        ASSERT_TRUE(store.Flush().ok());
        ExpectBitwiseEqual(AllRecords(store.backing()), AllRecords(*whole),
                           "host tier after the last Flush");
        EXPECT_EQ(store.backing().step(), whole->step());
        const StoreMetrics m = store.metrics();
        EXPECT_GT(m.evictions, 0);
        EXPECT_GT(m.rows_written, 0);
        if (direct) {
          EXPECT_EQ(m.prefetch_hits, 0);
          EXPECT_EQ(m.rows_read, m.misses);
        } else {
          EXPECT_GT(m.prefetch_hits, 0);
        }
      }
    }
  }
}

// The cache's work on the caller's stream, and its refusals: host memory
// for `out`, too many unique ids, a stale batch.
TEST(CudaCachedStoreTest, CallersStreamAndRefusals) {
  DLRM_SKIP_WITHOUT_CUDA();
  auto stream = dlrm::cuda::CudaStream::Create();
  ASSERT_TRUE(stream.ok()) << stream.status();
  const int dim = 8;
  const TableSpec spec = MakeSpec(100, dim, POOLING_SUM, OptimizerConfig::SGD);
  CacheOptions cache;
  cache.cache_rows = 4;
  auto cached = CreateDeviceCachedStore(spec, cache, stream->get());
  ASSERT_TRUE(cached.ok()) << cached.status();
  CachedStore& store = **cached;
  HostStore host(spec);
  Rng rng(kCudaTestSeed);
  // Ids in [0, 4): never more unique ids than the 4 slots.
  const data::SparseFeature ids =
      RandomIds(rng, Shape{dim, POOLING_SUM, 1, 3, 4, 0});
  auto p = store.Prepare(ids);
  ASSERT_TRUE(p.ok()) << p.status();
  auto out = Poisoned(3 * dim);
  ASSERT_TRUE(store.Forward(**p, out.data(), dim).ok());
  std::vector<float> got(3 * dim);
  ASSERT_EQ(cudaMemcpyAsync(got.data(), out.data(), got.size() * sizeof(float),
                            cudaMemcpyDeviceToHost, stream->get()),
            cudaSuccess);
  ASSERT_TRUE(stream->Synchronize().ok());
  ExpectBitwiseEqual(got, HostForward(host, ids, dim), "pooled");

  std::vector<float> host_out(3 * dim);
  EXPECT_EQ(store.Forward(**p, host_out.data(), dim).code(),
            absl::StatusCode::kInvalidArgument);
  data::SparseFeature wide;
  wide.offsets = {0, 5};
  wide.ids = {1, 2, 3, 4, 5};
  EXPECT_EQ(store.Prepare(wide).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(store.Forward(**p, out.data(), dim).code(),
            absl::StatusCode::kFailedPrecondition);
  data::SparseFeature bad;
  bad.offsets = {0, 1};
  bad.ids = {100};
  EXPECT_EQ(store.Prepare(bad).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace dlrm::embedding::cuda
