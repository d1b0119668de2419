// Tests for the storage tiers of embedding/: a RocksDB-backed row cache
// trains bitwise like an in-memory EmbeddingTable, evicts in LRU/LFU order
// without losing dirty rows, prefetches safely, checkpoints, and under a
// failing disk either carries on with nothing lost or stops with a clear
// error.
#include "embedding/embedding_store.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <shared_mutex>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "core/device.h"
#include "core/random.h"
#include "embedding/embedding_table.h"
#include "embedding/rocksdb_fault_injection.h"
#include "embedding/rocksdb_store.h"
#include "tests/support/expect.h"
#include "tests/support/process.h"
#include "tests/support/table_spec.h"

namespace dlrm::embedding {
namespace {

using test::Bag;
using test::HotHalfIds;
using test::RandomGrad;

constexpr uint64_t kSeed = 20261123;

TableSpec MakeSpec(int table_index, int64_t rows, int dim, Pooling pooling,
                   OptimizerConfig::Type type) {
  return test::MakeTableSpec(table_index, rows, dim, pooling, type, kSeed);
}

// Row `row` of an in-memory table as a store record: weights, then state.
std::vector<float> RecordOf(EmbeddingTable& table, int64_t row) {
  const int dim = table.dim();
  const int state = StateFloatsPerRow(table.optimizer(), dim);
  std::vector<float> r(table.weights() + row * dim,
                       table.weights() + (row + 1) * dim);
  if (state == 1) {
    r.push_back(table.state1()[row]);
  } else if (state > 0) {
    r.insert(r.end(), table.state1().data() + row * dim,
             table.state1().data() + (row + 1) * dim);
    r.insert(r.end(), table.state2().data() + row * dim,
             table.state2().data() + (row + 1) * dim);
  }
  return r;
}

bool BitwiseEqual(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// A fresh RocksDB directory per test, removed afterwards.
class StoreTest : public testing::Test {
 protected:
  void SetUp() override {
    const auto* info = testing::UnitTest::GetInstance()->current_test_info();
    std::string name =
        std::string(info->test_suite_name()) + "_" + info->name();
    for (char& c : name) {
      if (c == '/') c = '_';
    }
    dir_ = testing::TempDir() + "/embedding_store_test_" +
           std::to_string(getpid()) + "_" + name;
    std::filesystem::remove_all(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  RocksDbStoreOptions Options(int64_t cache_rows,
                              EvictionPolicy eviction = EvictionPolicy::kLru,
                              const std::string& sub = "db") const {
    RocksDbStoreOptions o;
    o.path = dir_ + "/" + sub;
    o.cache_rows = cache_rows;
    o.eviction = eviction;
    o.block_cache_bytes = 8 << 20;
    return o;
  }

  std::string dir_;
};

// Runs `steps` forward + backward steps on an in-memory table and a cached
// store of the same spec with the same batches, checking the pooled outputs
// bitwise at every step and every row (weights and optimizer state) at the
// end. `prefetch`: 0 none, 1 prefetch the next batch after Prepare, 2 before
// it (so the prepare in between evicts and loads rows of the staged batch).
void TrainAndCompare(const TableSpec& spec, RocksDbCachedStore& store,
                     int steps, int64_t bags, int max_hot, int prefetch,
                     uint64_t seed) {
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  EmbeddingTable reference(spec.table_index, spec.rows, spec.dim, spec.pooling,
                           spec.optimizer, spec.seed, spec.slice);
  Rng rng(seed);
  std::vector<data::SparseFeature> batches;
  for (int i = 0; i <= steps; ++i) {
    batches.push_back(HotHalfIds(rng, spec.rows, bags, max_hot));
  }
  const int dim = spec.dim;
  std::vector<float> out_ref(bags * dim), out_store(bags * dim);
  for (int i = 0; i < steps; ++i) {
    absl::StatusOr<const data::SparseFeature*> prepared =
        test::PrepareWithPrefetch(store, batches, i, prefetch);
    ASSERT_TRUE(prepared.ok()) << prepared.status();
    reference.Forward(batches[i], out_ref.data(), dim);
    ASSERT_TRUE(store.Forward(**prepared, out_store.data(), dim).ok());
    ASSERT_TRUE(BitwiseEqual(out_ref, out_store)) << "forward, step " << i;
    const std::vector<float> grad = RandomGrad(rng, bags, dim);
    reference.BackwardUpdate(batches[i], grad.data(), dim);
    ASSERT_TRUE(store.BackwardUpdate(**prepared, grad.data(), dim).ok());
  }
  EXPECT_EQ(store.step(), reference.step());
  const int record_floats = dim + StateFloatsPerRow(spec.optimizer, dim);
  std::vector<float> record(record_floats);
  for (int64_t r = 0; r < spec.rows; ++r) {
    ASSERT_TRUE(store.ReadRow(r, record.data()).ok());
    ASSERT_TRUE(BitwiseEqual(record, RecordOf(reference, r)))
        << "row " << r << (store.IsResident(r) ? " (resident)" : " (stored)");
  }
}

// A StoreTest over optimizers, poolings and eviction policies.
class StoreCaseTest : public StoreTest,
                      public testing::WithParamInterface<test::StoreCase> {};

// The core equivalence: a table 10x its cache against the same table in
// memory, over optimizers, poolings and eviction policies.
class EquivalenceTest : public StoreCaseTest {};

TEST_P(EquivalenceTest, TenTimesOverCapacityTrainsBitwiseLikeInMemory) {
  const auto [type, pooling, eviction] = GetParam();
  const TableSpec spec = MakeSpec(3, 2000, 16, pooling, type);
  absl::StatusOr<std::unique_ptr<RowDatabase>> db =
      RowDatabase::Open(Options(200, eviction));
  ASSERT_TRUE(db.ok()) << db.status();
  absl::StatusOr<std::unique_ptr<RocksDbCachedStore>> store =
      RocksDbCachedStore::Create(spec, Options(200, eviction), db->get());
  ASSERT_TRUE(store.ok()) << store.status();
  TrainAndCompare(spec, **store, /*steps=*/30, /*bags=*/24, /*max_hot=*/5,
                  /*prefetch=*/0, kSeed + static_cast<int>(type));
  const StoreMetrics m = (*store)->metrics();
  // The table really spilled: rows were evicted, written and read back.
  EXPECT_GT(m.evictions, 0);
  EXPECT_GT(m.rows_written, 0);
  EXPECT_GT(m.rows_read, 0);
  EXPECT_GT(m.hits, 0);
  EXPECT_EQ(m.bytes_written, m.rows_written *
                                 static_cast<int64_t>(sizeof(float)) *
                                 (16 + StateFloatsPerRow(spec.optimizer, 16)));
}

INSTANTIATE_TEST_SUITE_P(
    All, EquivalenceTest,
    testing::Combine(
        testing::Values(OptimizerConfig::SGD, OptimizerConfig::ADAGRAD,
                        OptimizerConfig::ADAM),
        testing::Values(POOLING_SUM, POOLING_MEAN),
        testing::Values(EvictionPolicy::kLru, EvictionPolicy::kLfu)),
    test::StoreCaseName);

// The cached tier runs EmbeddingTable's kernels on its slots with the
// table's step, so it follows a learning-rate schedule as the in-memory
// table does.
TEST_F(StoreTest, ScheduledOptimizerTrainsBitwiseLikeInMemory) {
  TableSpec spec = MakeSpec(2, 2000, 16, POOLING_SUM, OptimizerConfig::ADAGRAD);
  LearningRateSchedule* schedule = spec.optimizer.mutable_schedule();
  schedule->set_warmup_steps(5);
  schedule->set_warmup_start_factor(0.2f);
  schedule->mutable_polynomial_decay()->set_decay_start_step(5);
  schedule->mutable_polynomial_decay()->set_decay_steps(10);
  schedule->mutable_polynomial_decay()->set_power(2);
  auto db = RowDatabase::Open(Options(200));
  ASSERT_TRUE(db.ok()) << db.status();
  auto store = RocksDbCachedStore::Create(spec, Options(200), db->get());
  ASSERT_TRUE(store.ok()) << store.status();
  TrainAndCompare(spec, **store, /*steps=*/20, /*bags=*/24, /*max_hot=*/5,
                  /*prefetch=*/0, kSeed + 11);
  EXPECT_GT((*store)->metrics().evictions, 0);
}

// A shard (rows and columns of a bigger table) with an odd dim (the
// any-dim kernel path) starts and trains like the same in-memory shard.
TEST_F(StoreTest, ShardWithOddDimTrainsBitwiseLikeInMemory) {
  TableSpec spec = MakeSpec(5, 900, 12, POOLING_MEAN, OptimizerConfig::ADAM);
  spec.slice = TableSlice{5000, 1200, 4};
  auto db = RowDatabase::Open(Options(90));
  ASSERT_TRUE(db.ok()) << db.status();
  auto store = RocksDbCachedStore::Create(spec, Options(90), db->get());
  ASSERT_TRUE(store.ok()) << store.status();
  TrainAndCompare(spec, **store, 20, 16, 4, 0, kSeed + 11);
  EXPECT_GT((*store)->metrics().evictions, 0);
}

// Opens a store of `capacity` slots over a 100-row SGD table.
struct SmallStore {
  std::unique_ptr<RowDatabase> db;
  std::unique_ptr<RocksDbCachedStore> store;
};

SmallStore OpenSmall(const RocksDbStoreOptions& options, int64_t rows = 100,
                     OptimizerConfig::Type type = OptimizerConfig::SGD) {
  SmallStore s;
  auto db = RowDatabase::Open(options);
  EXPECT_TRUE(db.ok()) << db.status();
  s.db = std::move(*db);
  auto store = RocksDbCachedStore::Create(
      MakeSpec(7, rows, 8, POOLING_SUM, type), options, s.db.get());
  EXPECT_TRUE(store.ok()) << store.status();
  s.store = std::move(*store);
  return s;
}

void PrepareAll(RocksDbCachedStore& store,
                const std::vector<std::vector<int64_t>>& batches) {
  for (const auto& b : batches) {
    ASSERT_TRUE(store.Prepare(Bag(b)).ok());
  }
}

TEST_F(StoreTest, LruEvictsLeastRecentlyUsedRow) {
  SmallStore s = OpenSmall(Options(3, EvictionPolicy::kLru));
  PrepareAll(*s.store, {{0}, {1}, {2}, {0}, {3}});
  // 1 was used least recently.
  EXPECT_FALSE(s.store->IsResident(1));
  EXPECT_TRUE(s.store->IsResident(0));
  EXPECT_TRUE(s.store->IsResident(2));
  EXPECT_TRUE(s.store->IsResident(3));
  PrepareAll(*s.store, {{4}});
  EXPECT_FALSE(s.store->IsResident(2));
  PrepareAll(*s.store, {{5, 0}});  // Evicts 3; 0 stays (it is in the batch).
  EXPECT_FALSE(s.store->IsResident(3));
  EXPECT_TRUE(s.store->IsResident(0));
  EXPECT_TRUE(s.store->IsResident(4));
  EXPECT_TRUE(s.store->IsResident(5));
  const StoreMetrics m = s.store->metrics();
  EXPECT_EQ(m.evictions, 3);
  EXPECT_EQ(m.hits, 2);
  EXPECT_EQ(m.misses, 6);
  // Nothing was updated: evictions write nothing, and nothing was ever
  // written, so every miss was initialised.
  EXPECT_EQ(m.rows_written, 0);
  EXPECT_EQ(m.rows_initialized, 6);
}

TEST_F(StoreTest, LfuEvictsLeastFrequentlyUsedRowTiesByRecency) {
  SmallStore s = OpenSmall(Options(3, EvictionPolicy::kLfu));
  PrepareAll(*s.store, {{0}, {0}, {1}, {1}, {2}, {3}});
  // Uses: 0 -> 2, 1 -> 2, 2 -> 1: 2 goes although 0 is older.
  EXPECT_FALSE(s.store->IsResident(2));
  EXPECT_TRUE(s.store->IsResident(0));
  EXPECT_TRUE(s.store->IsResident(1));
  PrepareAll(*s.store, {{4}});
  EXPECT_FALSE(s.store->IsResident(3));  // 1 use, like nothing else.
  PrepareAll(*s.store, {{1}, {5}});
  // Uses: 0 -> 2, 1 -> 3, 4 -> 1: 4 goes.
  EXPECT_FALSE(s.store->IsResident(4));
  PrepareAll(*s.store, {{6}});
  // 5 (1 use) goes before 0 (2 uses), though 0 is older.
  EXPECT_FALSE(s.store->IsResident(5));
  EXPECT_TRUE(s.store->IsResident(0));
  EXPECT_TRUE(s.store->IsResident(1));
  EXPECT_TRUE(s.store->IsResident(6));
  // Equal uses: the least recent goes.
  SmallStore t = OpenSmall(Options(3, EvictionPolicy::kLfu, "db2"));
  PrepareAll(*t.store, {{10}, {11}, {12}, {13}});
  EXPECT_FALSE(t.store->IsResident(10));
}

TEST_F(StoreTest, DirtyRowsSurviveEviction) {
  SmallStore s = OpenSmall(Options(4));
  const TableSpec spec = s.store->spec();
  EmbeddingTable reference(spec.table_index, spec.rows, spec.dim, spec.pooling,
                           spec.optimizer, spec.seed);
  Rng rng(kSeed);
  std::printf("seed %llu\n", static_cast<unsigned long long>(kSeed));
  const data::SparseFeature ids = Bag({0, 1, 2, 3, 1});
  auto prepared = s.store->Prepare(ids);
  ASSERT_TRUE(prepared.ok());
  const std::vector<float> grad = RandomGrad(rng, 1, 8);
  ASSERT_TRUE(s.store->BackwardUpdate(**prepared, grad.data(), 8).ok());
  reference.BackwardUpdate(ids, grad.data(), 8);
  EXPECT_TRUE(s.store->IsDirty(1));

  // Four other rows push all four dirty rows out.
  ASSERT_TRUE(s.store->Prepare(Bag({4, 5, 6, 7})).ok());
  for (int64_t r = 0; r < 4; ++r) EXPECT_FALSE(s.store->IsResident(r));
  EXPECT_EQ(s.store->metrics().rows_written, 4);
  EXPECT_EQ(s.store->metrics().bytes_written, 4 * 8 * 4);

  // Read back from RocksDB, without and then with making them resident.
  std::vector<float> record(8);
  for (int64_t r = 0; r < 4; ++r) {
    ASSERT_TRUE(s.store->ReadRow(r, record.data()).ok());
    EXPECT_TRUE(BitwiseEqual(record, RecordOf(reference, r))) << "row " << r;
  }
  prepared = s.store->Prepare(ids);
  ASSERT_TRUE(prepared.ok());
  EXPECT_EQ(s.store->metrics().rows_read, 4 + 4);
  std::vector<float> out_ref(8), out_store(8);
  reference.Forward(ids, out_ref.data(), 8);
  ASSERT_TRUE(s.store->Forward(**prepared, out_store.data(), 8).ok());
  EXPECT_TRUE(BitwiseEqual(out_ref, out_store));
  // Loaded rows are clean until updated again: evicting them writes nothing.
  ASSERT_TRUE(s.store->Prepare(Bag({4, 5, 6, 7})).ok());
  EXPECT_EQ(s.store->metrics().rows_written, 4);
}

TEST_F(StoreTest, BatchLargerThanCacheIsResourceExhausted) {
  SmallStore s = OpenSmall(Options(4));
  ASSERT_TRUE(s.store->Prepare(Bag({0, 1})).ok());
  const absl::StatusOr<const data::SparseFeature*> r =
      s.store->Prepare(Bag({10, 11, 12, 12, 13, 14}));
  ASSERT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
  const std::string message(r.status().message());
  EXPECT_HAS_SUBSTR(message, "table 7") << message;
  EXPECT_HAS_SUBSTR(message, "5 unique ids") << message;
  EXPECT_HAS_SUBSTR(message, "holds 4 rows") << message;
  // Nothing changed, but nothing is prepared any more either.
  EXPECT_TRUE(s.store->IsResident(0));
  EXPECT_FALSE(s.store->IsResident(10));
  EXPECT_EQ(s.store->metrics().misses, 2);
  std::vector<float> out(8);
  EXPECT_EQ(s.store->Forward(Bag({0}), out.data(), 8).code(),
            absl::StatusCode::kFailedPrecondition);
  // Exactly the capacity fits.
  EXPECT_TRUE(s.store->Prepare(Bag({10, 11, 12, 13})).ok());
}

TEST_F(StoreTest, BadIdsAndUnpreparedBatchesAreRejected) {
  SmallStore s = OpenSmall(Options(4));
  EXPECT_EQ(s.store->Prepare(Bag({3, 100})).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.store->Prepare(Bag({-1})).status().code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<float> record(8);
  EXPECT_EQ(s.store->ReadRow(100, record.data()).code(),
            absl::StatusCode::kInvalidArgument);
  // Raw ids are not slot indices.
  const data::SparseFeature raw = Bag({50});
  ASSERT_TRUE(s.store->Prepare(raw).ok());
  std::vector<float> grad(8, 1.0f);
  EXPECT_EQ(s.store->BackwardUpdate(raw, grad.data(), 8).code(),
            absl::StatusCode::kFailedPrecondition);
  // An empty batch prepares, and its update still counts as a step.
  const data::SparseFeature empty = Bag({});
  auto prepared = s.store->Prepare(empty);
  ASSERT_TRUE(prepared.ok());
  EXPECT_TRUE(s.store->BackwardUpdate(**prepared, grad.data(), 8).ok());
  EXPECT_EQ(s.store->step(), 1);
}

TEST_F(StoreTest, OptionsAndFactory) {
  RocksDbStoreOptions o = Options(10);
  EXPECT_TRUE(o.Validate().ok());
  o.cache_rows = 0;
  EXPECT_EQ(o.Validate().code(), absl::StatusCode::kInvalidArgument);
  o = Options(10);
  o.path.clear();
  EXPECT_EQ(o.Validate().code(), absl::StatusCode::kInvalidArgument);
  o = Options(10);
  o.bloom_bits_per_key = -1;
  EXPECT_EQ(o.Validate().code(), absl::StatusCode::kInvalidArgument);

  const TableSpec spec = MakeSpec(0, 50, 8, POOLING_SUM, OptimizerConfig::SGD);
  TableSpec bad = spec;
  bad.rows = 0;
  EXPECT_EQ(bad.Validate().code(), absl::StatusCode::kInvalidArgument);
  // The layer-wise optimizers have no embedding-row rule.
  for (auto type : {OptimizerConfig::LAMB, OptimizerConfig::LARS}) {
    bad = spec;
    bad.optimizer.set_type(type);
    const absl::Status status = bad.Validate();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_HAS_SUBSTR(status.message(), "optimizer.type") << status;
    EXPECT_EQ(
        CreateEmbeddingStore(bad, StoreOptions{}, nullptr).status().code(),
        absl::StatusCode::kInvalidArgument);
  }

  StoreOptions options;
  auto host = CreateEmbeddingStore(spec, options, nullptr);
  ASSERT_TRUE(host.ok()) << host.status();
  const data::SparseFeature ids = Bag({1, 2});
  auto prepared = (*host)->Prepare(ids);
  ASSERT_TRUE(prepared.ok());
  // The host tier does no remapping at all.
  EXPECT_EQ(*prepared, &ids);
  EXPECT_EQ((*host)->memory_space(), MemorySpace::kHost);
  EXPECT_TRUE((*host)->Synchronize().ok());

  options.kind = StoreKind::kRocksDbCache;
  options.rocksdb = Options(10);
  EXPECT_EQ(CreateEmbeddingStore(spec, options, nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto db = RowDatabase::Open(options.rocksdb);
  ASSERT_TRUE(db.ok()) << db.status();
  auto cached = CreateEmbeddingStore(spec, options, db->get());
  ASSERT_TRUE(cached.ok()) << cached.status();
  EXPECT_EQ((*cached)->memory_space(), MemorySpace::kHost);
  EXPECT_TRUE((*cached)->Synchronize().ok());
  // Both tiers start every row at the same initial record.
  std::vector<float> a(8), b(8);
  for (int64_t r = 0; r < 50; ++r) {
    ASSERT_TRUE((*host)->ReadRow(r, a.data()).ok());
    ASSERT_TRUE((*cached)->ReadRow(r, b.data()).ok());
    ASSERT_TRUE(BitwiseEqual(a, b)) << "row " << r;
  }
}

// Table 4, 10 rows of 8 (the DeviceStoreTest table), and the options
// that ask for the device tier.
TableSpec SmallDeviceSpec() {
  TableSpec spec;
  spec.table_index = 4;
  spec.rows = 10;
  spec.dim = 8;
  return spec;
}
StoreOptions DeviceOptions() {
  StoreOptions options;
  options.kind = StoreKind::kDevice;
  return options;
}

// The device tier on a machine without a GPU (CI): a FailedPrecondition
// that says why, never an abort. tests/embedding/cuda_store_test.cc covers the
// tier where a GPU is present.
TEST(DeviceStoreTest, WithoutAGpuIsFailedPreconditionWithTheReason) {
  if (CudaDeviceCount() > 0) {
    GTEST_SKIP() << "a CUDA device is present: the device tier is tested by "
                    "cuda_store_test";
  }
  TableSpec spec = SmallDeviceSpec();
  const StoreOptions options = DeviceOptions();
  EXPECT_TRUE(options.Validate().ok());
  const absl::Status st = CreateEmbeddingStore(spec, options, nullptr).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
  EXPECT_HAS_SUBSTR(st.message(), "table 4") << st;
  EXPECT_HAS_SUBSTR(st.message(), CudaUnavailableReason()) << st;
  // A bad spec is still InvalidArgument first.
  spec.rows = 0;
  EXPECT_EQ(CreateEmbeddingStore(spec, options, nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// With a GPU the factory makes the device tier
// (tests/embedding/cuda_store_test.cc tests the store itself).
TEST(DeviceStoreTest, WithAGpuIsADeviceStore) {
  if (CudaDeviceCount() == 0) {
    GTEST_SKIP() << "no CUDA device: " << CudaUnavailableReason();
  }
  TableSpec spec = SmallDeviceSpec();
  const StoreOptions options = DeviceOptions();
  auto store = CreateEmbeddingStore(spec, options, nullptr);
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ((*store)->memory_space(), MemorySpace::kDevice);
  EXPECT_EQ((*store)->spec().rows, 10);
}

TEST_F(StoreTest, TablesInOneDatabaseKeepSeparateRows) {
  auto db = RowDatabase::Open(Options(8));
  ASSERT_TRUE(db.ok()) << db.status();
  const TableSpec spec0 = MakeSpec(0, 50, 8, POOLING_SUM, OptimizerConfig::SGD);
  TableSpec spec1 = spec0;
  spec1.table_index = 1;
  auto s0 = RocksDbCachedStore::Create(spec0, Options(2), db->get());
  auto s1 = RocksDbCachedStore::Create(spec1, Options(2), db->get());
  ASSERT_TRUE(s0.ok() && s1.ok());
  const data::SparseFeature ids = Bag({3});
  auto p = (*s0)->Prepare(ids);
  ASSERT_TRUE(p.ok());
  std::vector<float> grad(8, 1.0f);
  ASSERT_TRUE((*s0)->BackwardUpdate(**p, grad.data(), 8).ok());
  ASSERT_TRUE((*s0)->Flush().ok());
  EmbeddingTable fresh1(1, 50, 8, POOLING_SUM, spec1.optimizer, kSeed);
  std::vector<float> record(8);
  ASSERT_TRUE((*s1)->ReadRow(3, record.data()).ok());
  EXPECT_TRUE(BitwiseEqual(record, RecordOf(fresh1, 3)));
  EXPECT_EQ(ColumnFamilyName(spec0), "table_0");
  EXPECT_EQ(ColumnFamilyName(spec1), "table_1");
}

// ReadRows and WriteRows (what a checkpoint's restore moves rows with) on
// both tiers: random records written to random ranges read back bitwise,
// whether the rows are resident, staged by a prefetch or in RocksDB; a
// resident row written becomes dirty and survives its eviction; the step
// set is kept by a flush; ranges outside the table are refused.
TEST_F(StoreTest, ReadRowsAndWriteRowsOnEveryTier) {
  const TableSpec spec =
      MakeSpec(3, 400, 8, POOLING_SUM, OptimizerConfig::ADAM);
  const int floats = 8 + StateFloatsPerRow(spec.optimizer, 8);
  auto db = RowDatabase::Open(Options(40));
  ASSERT_TRUE(db.ok()) << db.status();
  auto cached = RocksDbCachedStore::Create(spec, Options(40), db->get());
  ASSERT_TRUE(cached.ok()) << cached.status();
  HostStore host(spec);
  std::vector<EmbeddingStore*> stores = {&host, cached->get()};
  Rng rng(31);
  // Rows 0-29 resident in the cache, 30-49 staged by a prefetch.
  std::vector<int64_t> first, next;
  for (int64_t r = 0; r < 30; ++r) first.push_back(r);
  for (int64_t r = 30; r < 50; ++r) next.push_back(r);
  ASSERT_TRUE((*cached)->Prepare(Bag(first)).ok());
  ASSERT_TRUE((*cached)->Prefetch(Bag(next)).ok());
  std::vector<float> want(spec.rows * floats);
  for (EmbeddingStore* s : stores) {
    ASSERT_TRUE(s->ReadRows(0, spec.rows, want.data()).ok());
  }
  for (int round = 0; round < 20; ++round) {
    // Round 0 writes rows 0-9 (resident), then random ranges.
    const int64_t begin =
        round == 0 ? 0 : static_cast<int64_t>(rng.Below(spec.rows));
    const int64_t count =
        round == 0 ? 10
                   : 1 + static_cast<int64_t>(rng.Below(spec.rows - begin));
    std::vector<float> records(count * floats);
    for (float& v : records) v = static_cast<float>(rng.Uniform(-1, 1));
    std::copy(records.begin(), records.end(), want.begin() + begin * floats);
    for (EmbeddingStore* s : stores) {
      ASSERT_TRUE(s->WriteRows(begin, count, records.data()).ok());
    }
    if (round == 0) {
      EXPECT_TRUE((*cached)->IsDirty(5));
    }
  }
  for (EmbeddingStore* s : stores) {
    std::vector<float> got(spec.rows * floats);
    ASSERT_TRUE(s->ReadRows(0, spec.rows, got.data()).ok());
    ASSERT_TRUE(BitwiseEqual(got, want));
    EXPECT_EQ(s->ReadRows(390, 11, got.data()).code(),
              absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(s->WriteRows(-1, 2, got.data()).code(),
              absl::StatusCode::kInvalidArgument);
    s->set_step(17);
    ASSERT_TRUE(s->Flush().ok());
  }
  // Evict the resident rows: what was written to their slots reaches
  // RocksDB, and a store reopened on the database reads it all back.
  std::vector<int64_t> other;
  for (int64_t r = 300; r < 340; ++r) other.push_back(r);
  ASSERT_TRUE((*cached)->Prepare(Bag(other)).ok());
  ASSERT_TRUE((*cached)->Flush().ok());
  cached->reset();
  auto reopened = RocksDbCachedStore::Create(spec, Options(40), db->get());
  ASSERT_TRUE(reopened.ok()) << reopened.status();
  EXPECT_EQ((*reopened)->step(), 17);
  std::vector<float> got(spec.rows * floats);
  ASSERT_TRUE((*reopened)->ReadRows(0, spec.rows, got.data()).ok());
  EXPECT_TRUE(BitwiseEqual(got, want));
}

// Prefetch in both orders relative to Prepare gives the same result as no
// prefetch, and does serve misses.
TEST_F(StoreTest, PrefetchTrainsBitwiseLikeInMemory) {
  for (int mode : {1, 2}) {
    SCOPED_TRACE(testing::Message() << "prefetch mode " << mode);
    const TableSpec spec =
        MakeSpec(2, 1500, 16, POOLING_SUM, OptimizerConfig::ADAM);
    const auto options =
        Options(150, EvictionPolicy::kLru, "db" + std::to_string(mode));
    auto db = RowDatabase::Open(options);
    ASSERT_TRUE(db.ok()) << db.status();
    auto store = RocksDbCachedStore::Create(spec, options, db->get());
    ASSERT_TRUE(store.ok()) << store.status();
    TrainAndCompare(spec, **store, 30, 24, 5, mode, kSeed + 100 + mode);
    EXPECT_GT((*store)->metrics().prefetch_hits, 0);
    EXPECT_GT((*store)->metrics().evictions, 0);
  }
}

// A row staged by a prefetch must not shadow a newer value: here row 0 is
// resident and dirty when the next batch is prefetched (so not staged), is
// evicted by a batch prepared in between, and the next batch reads it back.
// Row 9 is staged, loaded by the in-between batch (consuming the staging),
// updated and evicted; the next batch must see the update, not the staged
// copy.
TEST_F(StoreTest, PrefetchedRowsEvictedOrUpdatedInBetween) {
  SmallStore s = OpenSmall(Options(3));
  const TableSpec spec = s.store->spec();
  EmbeddingTable reference(spec.table_index, spec.rows, spec.dim, spec.pooling,
                           spec.optimizer, spec.seed);
  std::vector<float> grad(8, 0.5f);
  auto step = [&](const data::SparseFeature& ids) {
    auto p = s.store->Prepare(ids);
    ASSERT_TRUE(p.ok()) << p.status();
    ASSERT_TRUE(s.store->BackwardUpdate(**p, grad.data(), 8).ok());
    reference.BackwardUpdate(ids, grad.data(), 8);
  };
  step(Bag({0}));
  ASSERT_TRUE(s.store->Prefetch(Bag({0, 9})).ok());
  step(Bag({9, 1, 2}));  // Takes 9 from staging; evicts 0 (dirty).
  EXPECT_EQ(s.store->metrics().prefetch_hits, 1);
  EXPECT_FALSE(s.store->IsResident(0));
  step(Bag({3, 4, 5}));  // Evicts 9 (dirty), 1, 2.
  EXPECT_FALSE(s.store->IsResident(9));
  // The same row in two consecutive batches, prefetched in between.
  step(Bag({0, 9}));
  ASSERT_TRUE(s.store->Prefetch(Bag({0, 9, 6})).ok());
  step(Bag({0, 9, 6}));
  EXPECT_EQ(s.store->metrics().prefetch_hits, 2);
  std::vector<float> record(8);
  for (int64_t r = 0; r < 10; ++r) {
    ASSERT_TRUE(s.store->ReadRow(r, record.data()).ok());
    EXPECT_TRUE(BitwiseEqual(record, RecordOf(reference, r))) << "row " << r;
  }
}

// Flush + Checkpoint, keep training, restore: the restored table has the
// rows, optimizer state and step of the checkpoint, and trains on from
// there like the original did.
// With a learning-rate schedule that changes across the checkpoint (warm-up
// to update 14, then halving every 2): the restored store continues it from
// its saved step.
TEST_F(StoreTest, CheckpointRestoresRowsAndOptimizerState) {
  TableSpec spec = MakeSpec(4, 600, 8, POOLING_MEAN, OptimizerConfig::ADAM);
  LearningRateSchedule* schedule = spec.optimizer.mutable_schedule();
  schedule->set_warmup_steps(14);
  schedule->mutable_step_decay()->set_decay_start_step(14);
  schedule->mutable_step_decay()->set_step_size(2);
  schedule->mutable_step_decay()->set_gamma(0.5f);
  const RocksDbStoreOptions options = Options(60);
  const int record_floats = 8 + StateFloatsPerRow(spec.optimizer, 8);
  std::printf("seed %llu\n", static_cast<unsigned long long>(kSeed));
  Rng rng(kSeed);
  auto train = [&](EmbeddingStore& store, Rng& r, int steps) {
    for (int i = 0; i < steps; ++i) {
      const data::SparseFeature ids = HotHalfIds(r, spec.rows, 16, 3);
      auto p = store.Prepare(ids);
      ASSERT_TRUE(p.ok()) << p.status();
      const std::vector<float> grad = RandomGrad(r, 16, 8);
      ASSERT_TRUE(store.BackwardUpdate(**p, grad.data(), 8).ok());
    }
  };
  auto snapshot = [&](EmbeddingStore& store) {
    std::vector<float> all(spec.rows * record_floats);
    for (int64_t r = 0; r < spec.rows; ++r) {
      EXPECT_TRUE(store.ReadRow(r, all.data() + r * record_floats).ok());
    }
    return all;
  };
  const std::string checkpoint = dir_ + "/checkpoint";
  std::vector<float> at_checkpoint, after_more;
  {
    auto db = RowDatabase::Open(options);
    ASSERT_TRUE(db.ok()) << db.status();
    auto store = RocksDbCachedStore::Create(spec, options, db->get());
    ASSERT_TRUE(store.ok()) << store.status();
    train(**store, rng, 12);
    ASSERT_TRUE((*store)->Flush().ok());
    EXPECT_FALSE((*store)->IsDirty(0));
    ASSERT_TRUE((*db)->Checkpoint(checkpoint).ok());
    EXPECT_EQ((*db)->Checkpoint(checkpoint).code(),
              absl::StatusCode::kAlreadyExists);
    at_checkpoint = snapshot(**store);
    Rng more(kSeed + 1);
    train(**store, more, 5);
    after_more = snapshot(**store);
    EXPECT_EQ((*store)->step(), 17);
  }
  RocksDbStoreOptions restored_options = options;
  restored_options.path = dir_ + "/restored";
  EXPECT_EQ(RowDatabase::RestoreCheckpoint(dir_ + "/missing", restored_options)
                .status()
                .code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(RowDatabase::RestoreCheckpoint(checkpoint, options).status().code(),
            absl::StatusCode::kAlreadyExists);
  auto db = RowDatabase::RestoreCheckpoint(checkpoint, restored_options);
  ASSERT_TRUE(db.ok()) << db.status();
  auto store = RocksDbCachedStore::Create(spec, restored_options, db->get());
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ((*store)->step(), 12);
  EXPECT_TRUE(BitwiseEqual(snapshot(**store), at_checkpoint));
  Rng more(kSeed + 1);
  train(**store, more, 5);
  EXPECT_TRUE(BitwiseEqual(snapshot(**store), after_more));
}

// Rows flushed before the database closes are there when it reopens (the
// WAL is off: closing must persist the memtables).
TEST_F(StoreTest, FlushedRowsSurviveReopen) {
  const RocksDbStoreOptions options = Options(4);
  std::vector<float> before(8);
  {
    SmallStore s = OpenSmall(options);
    auto p = s.store->Prepare(Bag({42}));
    ASSERT_TRUE(p.ok());
    std::vector<float> grad(8, 2.0f);
    ASSERT_TRUE(s.store->BackwardUpdate(**p, grad.data(), 8).ok());
    ASSERT_TRUE(s.store->Flush().ok());
    ASSERT_TRUE(s.store->ReadRow(42, before.data()).ok());
  }
  SmallStore s = OpenSmall(options);
  std::vector<float> after(8);
  ASSERT_TRUE(s.store->ReadRow(42, after.data()).ok());
  EXPECT_TRUE(BitwiseEqual(before, after));
  EXPECT_EQ(s.store->step(), 1);
  EXPECT_EQ(s.store->metrics().rows_read, 1);
}

// ---------------------------------------------------------------- faults

// ------------------------------------------------- reading beside the step

// Every row of a table, one per bag: pooled, each bag is its row's weights.
data::SparseFeature EveryRow(int64_t rows) {
  data::SparseFeature f;
  f.offsets.resize(rows + 1);
  f.ids.resize(rows);
  for (int64_t r = 0; r <= rows; ++r) f.offsets[r] = r;
  for (int64_t r = 0; r < rows; ++r) f.ids[r] = r;
  return f;
}

// A job on the database's worker that holds it until Release() (or the
// gate's end): the store jobs queued behind it stay pending meanwhile.
class WorkerGate {
 public:
  explicit WorkerGate(RowDatabase& db) : state_(std::make_shared<State>()) {
    db.Submit([state = state_] {
      std::unique_lock<std::mutex> lock(state->mu);
      state->cv.wait(lock, [&] { return state->open; });
    });
  }
  ~WorkerGate() { Release(); }
  void Release() {
    {
      std::lock_guard<std::mutex> lock(state_->mu);
      state_->open = true;
    }
    state_->cv.notify_all();
  }

 private:
  // Shared with the job, which may still run after the gate is gone.
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    bool open = false;
  };
  std::shared_ptr<State> state_;
};

bool SameMetrics(const StoreMetrics& a, const StoreMetrics& b) {
  for (const auto field : StoreMetrics::kFields) {
    if (a.*field != b.*field) return false;
  }
  return true;
}

std::vector<bool> ResidentRows(const RocksDbCachedStore& store, int64_t rows) {
  std::vector<bool> resident(rows);
  for (int64_t r = 0; r < rows; ++r) resident[r] = store.IsResident(r);
  return resident;
}

// PoolReadOnly against an in-memory table trained on the same batches:
// between a Prepare and its BackwardUpdate, with the write-back of the
// Prepare's dirty victims held pending on the worker (every other step) and
// a prefetch queued behind it, every row (one per bag) and random bags pool
// bitwise as the table does, whether the row is resident, evicted dirty and
// not yet written, or only in RocksDB (written back, or never written). The
// reads change no counter and no resident row.
class ReadOnlyTest : public StoreCaseTest {};

TEST_P(ReadOnlyTest, PoolsEveryRowWhereverItLivesWithoutChangingTheCache) {
  const auto [type, pooling, eviction] = GetParam();
  const TableSpec spec = MakeSpec(4, 400, 16, pooling, type);
  const uint64_t seed = kSeed + 200 + static_cast<int>(type);
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  auto db = RowDatabase::Open(Options(40, eviction));
  ASSERT_TRUE(db.ok()) << db.status();
  auto made =
      RocksDbCachedStore::Create(spec, Options(40, eviction), db->get());
  ASSERT_TRUE(made.ok()) << made.status();
  RocksDbCachedStore& store = **made;
  EmbeddingTable reference(spec.table_index, spec.rows, spec.dim, spec.pooling,
                           spec.optimizer, spec.seed, spec.slice);
  Rng rng(seed);
  const int dim = spec.dim;
  const data::SparseFeature every = EveryRow(spec.rows);
  std::vector<float> want(spec.rows * dim), got(spec.rows * dim);
  std::vector<bool> written(spec.rows, false);
  int64_t resident = 0, pending = 0, stored_written = 0, never_written = 0;
  data::SparseFeature ids = HotHalfIds(rng, spec.rows, 8, 4);
  for (int step = 0; step < 40; ++step) {
    SCOPED_TRACE(testing::Message() << "step " << step);
    const data::SparseFeature next = HotHalfIds(rng, spec.rows, 8, 4);
    std::vector<bool> dirty_before(spec.rows);
    for (int64_t r = 0; r < spec.rows; ++r) dirty_before[r] = store.IsDirty(r);
    const bool hold = step % 2 == 0;
    std::optional<WorkerGate> gate;
    if (hold) gate.emplace(**db);
    absl::StatusOr<const data::SparseFeature*> prepared = store.Prepare(ids);
    ASSERT_TRUE(prepared.ok()) << prepared.status();
    ASSERT_TRUE(store.Prefetch(next).ok());
    const StoreMetrics metrics = store.metrics();
    const std::vector<bool> cached = ResidentRows(store, spec.rows);

    ASSERT_TRUE(store.PoolReadOnly(every, got.data(), dim).ok());
    reference.Forward(every, want.data(), dim);
    ASSERT_TRUE(BitwiseEqual(want, got));
    const data::SparseFeature bags = HotHalfIds(rng, spec.rows, 24, 6);
    std::vector<float> bag_want(24 * dim), bag_got(24 * dim, -1.0f);
    ASSERT_TRUE(store.PoolReadOnly(bags, bag_got.data(), dim).ok());
    reference.Forward(bags, bag_want.data(), dim);
    ASSERT_TRUE(BitwiseEqual(bag_want, bag_got));
    EXPECT_TRUE(SameMetrics(metrics, store.metrics()));
    EXPECT_EQ(cached, ResidentRows(store, spec.rows));
    for (int64_t r = 0; r < spec.rows; ++r) {
      if (cached[r]) {
        ++resident;
      } else if (dirty_before[r]) {
        // Evicted dirty by this Prepare: pending while the gate holds.
        written[r] = true;
        if (hold) ++pending;
      } else if (written[r]) {
        ++stored_written;
      } else {
        ++never_written;
      }
    }
    if (gate.has_value()) gate->Release();

    const std::vector<float> grad = RandomGrad(rng, 8, dim);
    reference.BackwardUpdate(ids, grad.data(), dim);
    ASSERT_TRUE(store.BackwardUpdate(**prepared, grad.data(), dim).ok());
    ids = next;
  }
  std::printf(
      "rows read: %lld resident, %lld pending write-back, %lld "
      "written back, %lld never written\n",
      static_cast<long long>(resident), static_cast<long long>(pending),
      static_cast<long long>(stored_written),
      static_cast<long long>(never_written));
  EXPECT_GT(resident, 0);
  EXPECT_GT(pending, 0);
  EXPECT_GT(stored_written, 0);
  EXPECT_GT(never_written, 0);

  // A bad id is refused, naming the table, the id and its position.
  const absl::Status bad =
      store.PoolReadOnly(Bag({3, spec.rows}), got.data(), dim);
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument) << bad;
  EXPECT_HAS_SUBSTR(bad.message(), "table 4: id 400 at position 1") << bad;
}

INSTANTIATE_TEST_SUITE_P(
    All, ReadOnlyTest,
    testing::Values(std::make_tuple(OptimizerConfig::SGD, POOLING_SUM,
                                    EvictionPolicy::kLru),
                    std::make_tuple(OptimizerConfig::ADAGRAD, POOLING_MEAN,
                                    EvictionPolicy::kLfu),
                    std::make_tuple(OptimizerConfig::ADAM, POOLING_SUM,
                                    EvictionPolicy::kLru)),
    test::StoreCaseName);

// What one training run of a cached store gave: the pooled output of every
// step, every row's final record, the counters and the resident rows.
struct RunResult {
  std::vector<std::vector<float>> outputs;
  std::vector<float> records;
  StoreMetrics metrics;
  std::vector<bool> resident;
};

// Trains a fresh cached store (prefetching the next batch every step) on
// `batches`, with `grads`. With `reader`, another thread pools `probe`
// with PoolReadOnly for as long as the training runs, under a shared lock
// the step takes exclusively only around BackwardUpdate (as the model's
// weights_mutex()), and records which step's values it read
// (`completed` steps when it took the lock); the trainer waits for a read
// every 4 steps so the reads span the run.
RunResult TrainBesideReader(
    const TableSpec& spec, const RocksDbStoreOptions& options,
    const std::vector<data::SparseFeature>& batches,
    const std::vector<std::vector<float>>& grads,
    const data::SparseFeature* probe,
    std::vector<std::pair<int, std::vector<float>>>* reads) {
  RunResult result;
  auto db = RowDatabase::Open(options);
  EXPECT_TRUE(db.ok()) << db.status();
  auto store = RocksDbCachedStore::Create(spec, options, db->get());
  EXPECT_TRUE(store.ok()) << store.status();
  if (!db.ok() || !store.ok()) return result;
  const int dim = spec.dim;
  const int steps = static_cast<int>(grads.size());

  std::shared_mutex weights;
  int completed = 0;  // guarded by `weights`
  std::atomic<bool> done{false};
  std::atomic<int> read_count{0};
  std::thread reader;
  if (probe != nullptr) {
    reader = std::thread([&] {
      while (!done.load()) {
        std::vector<float> out(probe->num_bags() * dim);
        int at;
        absl::Status st;
        {
          std::shared_lock<std::shared_mutex> lock(weights);
          at = completed;
          st = (*store)->PoolReadOnly(*probe, out.data(), dim);
        }
        EXPECT_TRUE(st.ok()) << st;
        if (!st.ok()) break;
        reads->emplace_back(at, std::move(out));
        ++read_count;
      }
    });
  }
  for (int i = 0; i < steps; ++i) {
    if (probe != nullptr && i % 4 == 0) {
      const int before = read_count.load();
      while (read_count.load() == before && !done.load()) {
        std::this_thread::yield();
      }
    }
    absl::StatusOr<const data::SparseFeature*> prepared =
        (*store)->Prepare(batches[i]);
    EXPECT_TRUE(prepared.ok()) << prepared.status();
    if (!prepared.ok()) break;
    EXPECT_TRUE((*store)->Prefetch(batches[i + 1]).ok());
    std::vector<float> out(batches[i].num_bags() * dim);
    EXPECT_TRUE((*store)->Forward(**prepared, out.data(), dim).ok());
    result.outputs.push_back(std::move(out));
    std::unique_lock<std::shared_mutex> writing(weights);
    EXPECT_TRUE(
        (*store)->BackwardUpdate(**prepared, grads[i].data(), dim).ok());
    ++completed;
  }
  done.store(true);
  if (reader.joinable()) reader.join();
  result.metrics = (*store)->metrics();
  result.resident = ResidentRows(**store, spec.rows);
  result.records.resize(spec.rows *
                        (dim + StateFloatsPerRow(spec.optimizer, dim)));
  EXPECT_TRUE((*store)->ReadRows(0, spec.rows, result.records.data()).ok());
  return result;
}

// Reads on another thread beside the training: each equals, bitwise, the
// in-memory table's pool after exactly the steps completed when it took
// the lock (never a row of another step, wherever the row was), and the
// training gives bitwise the same outputs, rows, counters and resident
// rows as the same training without the reader.
TEST_F(StoreTest, ReadOnlyPoolBesideTrainingSeesOneStepAndChangesNothing) {
  const TableSpec spec =
      MakeSpec(6, 600, 16, POOLING_SUM, OptimizerConfig::ADAGRAD);
  const uint64_t seed = kSeed + 300;
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  Rng rng(seed);
  constexpr int kSteps = 60;
  constexpr int64_t kBags = 10;
  std::vector<data::SparseFeature> batches;
  std::vector<std::vector<float>> grads;
  for (int i = 0; i <= kSteps; ++i) {
    batches.push_back(HotHalfIds(rng, spec.rows, kBags, 4));
  }
  for (int i = 0; i < kSteps; ++i) {
    grads.push_back(RandomGrad(rng, kBags, spec.dim));
  }
  // Every row, then random bags.
  data::SparseFeature probe = EveryRow(spec.rows);
  const data::SparseFeature bags = HotHalfIds(rng, spec.rows, 32, 6);
  for (int64_t s = 0; s < bags.num_bags(); ++s) {
    probe.ids.insert(probe.ids.end(), bags.ids.begin() + bags.offsets[s],
                     bags.ids.begin() + bags.offsets[s + 1]);
    probe.offsets.push_back(static_cast<int64_t>(probe.ids.size()));
  }

  // The in-memory table's pool of the probe after each step.
  EmbeddingTable reference(spec.table_index, spec.rows, spec.dim, spec.pooling,
                           spec.optimizer, spec.seed, spec.slice);
  std::vector<std::vector<float>> expected(kSteps + 1);
  for (int s = 0; s <= kSteps; ++s) {
    expected[s].resize(probe.num_bags() * spec.dim);
    reference.Forward(probe, expected[s].data(), spec.dim);
    if (s < kSteps) {
      reference.BackwardUpdate(batches[s], grads[s].data(), spec.dim);
    }
  }

  std::vector<std::pair<int, std::vector<float>>> reads;
  const RunResult alone =
      TrainBesideReader(spec, Options(48, EvictionPolicy::kLru, "alone"),
                        batches, grads, nullptr, nullptr);
  const RunResult beside =
      TrainBesideReader(spec, Options(48, EvictionPolicy::kLru, "beside"),
                        batches, grads, &probe, &reads);

  ASSERT_EQ(alone.outputs.size(), static_cast<size_t>(kSteps));
  ASSERT_EQ(beside.outputs.size(), static_cast<size_t>(kSteps));
  for (int i = 0; i < kSteps; ++i) {
    ASSERT_TRUE(BitwiseEqual(alone.outputs[i], beside.outputs[i]))
        << "step " << i;
  }
  EXPECT_TRUE(BitwiseEqual(alone.records, beside.records));
  EXPECT_TRUE(SameMetrics(alone.metrics, beside.metrics));
  EXPECT_EQ(alone.resident, beside.resident);
  EXPECT_GT(beside.metrics.evictions, 0);
  EXPECT_GT(beside.metrics.prefetch_hits, 0);

  ASSERT_FALSE(reads.empty());
  std::set<int> steps_seen;
  for (const auto& [at, out] : reads) {
    ASSERT_LE(at, kSteps);
    steps_seen.insert(at);
    ASSERT_TRUE(BitwiseEqual(out, expected[at]))
        << "a read after " << at << " steps is not that step's";
  }
  std::printf("%zu reads over %zu steps\n", reads.size(), steps_seen.size());
  // At least the steps the trainer waited at (every 4th).
  EXPECT_GE(steps_seen.size(), static_cast<size_t>(kSteps / 4));
}

// The tier over a disk that fails RocksDB's flushes: its write-backs fail
// once RocksDB stops taking writes, and the store either recovers (retrying
// the write) or stops with the error. Small memtables make flushes happen
// within a few dozen steps.
class StoreFaultTest : public StoreTest {
 protected:
  void SetUp() override {
    StoreTest::SetUp();
    fs_ = std::make_shared<RocksDbFaultInjectionFs>();
    options_ = Options(200);
    options_.write_buffer_bytes = 64 << 10;
    options_.file_system = fs_;
    spec_ = MakeSpec(3, 2000, 16, POOLING_SUM, OptimizerConfig::ADAM);
    auto db = RowDatabase::Open(options_);
    ASSERT_TRUE(db.ok()) << db.status();
    db_ = std::move(*db);
    auto store = RocksDbCachedStore::Create(spec_, options_, db_.get());
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
    reference_ = std::make_unique<EmbeddingTable>(
        spec_.table_index, spec_.rows, spec_.dim, spec_.pooling,
        spec_.optimizer, spec_.seed, spec_.slice);
  }
  void TearDown() override {
    store_.reset();
    db_.reset();
    StoreTest::TearDown();
  }

  // Trains the store and the in-memory reference on the same `steps`
  // batches (seed printed), checking the pooled outputs bitwise. A step
  // whose Prepare fails is recorded and, when `on_failure` returns true,
  // tried again with the same batch; otherwise the run stops there. Returns
  // the failures.
  std::vector<absl::Status> Train(
      int steps, uint64_t seed,
      const std::function<bool(const absl::Status&)>& on_failure) {
    std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
    Rng rng(seed);
    constexpr int64_t kBags = 48;
    const int dim = spec_.dim;
    std::vector<float> out_ref(kBags * dim), out_store(kBags * dim);
    std::vector<absl::Status> failures;
    for (int i = 0; i < steps; ++i) {
      const data::SparseFeature ids = HotHalfIds(rng, spec_.rows, kBags, 5);
      const std::vector<float> grad = RandomGrad(rng, kBags, dim);
      absl::StatusOr<const data::SparseFeature*> prepared =
          store_->Prepare(ids);
      while (!prepared.ok()) {
        std::printf("step %d failed: %s\n", i,
                    prepared.status().ToString().c_str());
        failures.push_back(prepared.status());
        if (failures.size() > 10 || !on_failure(prepared.status())) {
          return failures;
        }
        prepared = store_->Prepare(ids);
      }
      reference_->Forward(ids, out_ref.data(), dim);
      EXPECT_TRUE(store_->Forward(**prepared, out_store.data(), dim).ok());
      EXPECT_TRUE(BitwiseEqual(out_ref, out_store)) << "forward, step " << i;
      reference_->BackwardUpdate(ids, grad.data(), dim);
      EXPECT_TRUE(store_->BackwardUpdate(**prepared, grad.data(), dim).ok());
    }
    return failures;
  }

  // Checks every row the store can read against the reference, bitwise;
  // returns how many it could not read.
  int64_t CompareRows() {
    const int record_floats =
        spec_.dim + StateFloatsPerRow(spec_.optimizer, spec_.dim);
    std::vector<float> record(record_floats);
    int64_t unreadable = 0;
    for (int64_t r = 0; r < spec_.rows; ++r) {
      if (!store_->ReadRow(r, record.data()).ok()) {
        ++unreadable;
        continue;
      }
      EXPECT_TRUE(BitwiseEqual(record, RecordOf(*reference_, r)))
          << "row " << r;
    }
    return unreadable;
  }

  std::shared_ptr<RocksDbFaultInjectionFs> fs_;
  RocksDbStoreOptions options_;
  TableSpec spec_;
  std::unique_ptr<RowDatabase> db_;
  std::unique_ptr<RocksDbCachedStore> store_;
  std::unique_ptr<EmbeddingTable> reference_;
};

// A flush fails once with a transient (retryable) error: RocksDB stops
// flushing, its memtables fill and it refuses the next write-back; the store
// asks it to recover, writes again, and training never notices. Every row
// then equals the fault-free reference bitwise, and so does a checkpoint.
TEST_F(StoreFaultTest, TransientFlushFailureIsRetriedAndLosesNothing) {
  fs_->FailWrites(1, RocksDbFault::kRetryable);
  const std::vector<absl::Status> failures =
      Train(120, kSeed + 40, [](const absl::Status&) { return false; });
  EXPECT_TRUE(failures.empty()) << failures.front();
  EXPECT_EQ(fs_->injected(), 1);
  EXPECT_GE(store_->metrics().write_retries, 1);
  EXPECT_GT(store_->metrics().rows_written, 1000);
  EXPECT_EQ(CompareRows(), 0);
  ASSERT_TRUE(store_->Flush().ok());
  ASSERT_TRUE(db_->Checkpoint(dir_ + "/checkpoint").ok());
  auto restored = RowDatabase::RestoreCheckpoint(
      dir_ + "/checkpoint", Options(200, EvictionPolicy::kLru, "restored"));
  ASSERT_TRUE(restored.ok()) << restored.status();
  auto store = RocksDbCachedStore::Create(
      spec_, Options(200, EvictionPolicy::kLru, "restored"), restored->get());
  ASSERT_TRUE(store.ok()) << store.status();
  std::vector<float> record(spec_.dim * 3);
  for (int64_t r = 0; r < spec_.rows; ++r) {
    ASSERT_TRUE((*store)->ReadRow(r, record.data()).ok());
    ASSERT_TRUE(BitwiseEqual(record, RecordOf(*reference_, r))) << "row " << r;
  }
}

// A full disk: RocksDB refuses writes, the step fails with
// RESOURCE_EXHAUSTED naming the table and the file, and nothing changes.
// Once there is room again the same batch trains, and no row is lost.
TEST_F(StoreFaultTest, FullDiskStopsTheStepUntilThereIsRoom) {
  fs_->FailAllWrites(RocksDbFault::kNoSpace);
  const std::vector<absl::Status> failures =
      Train(120, kSeed + 41, [&](const absl::Status& s) {
        EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
        EXPECT_HAS_SUBSTR(s.message(), "table 3") << s;
        EXPECT_HAS_SUBSTR(s.message(), ".sst") << s;
        // Still full: the retry fails the same way.
        EXPECT_EQ(store_->Prepare(Bag({1})).status().code(),
                  absl::StatusCode::kResourceExhausted);
        // The rows whose write-back failed are read from its buffer.
        const data::SparseFeature every = EveryRow(spec_.rows);
        std::vector<float> want(spec_.rows * spec_.dim),
            got(spec_.rows * spec_.dim);
        reference_->Forward(every, want.data(), spec_.dim);
        EXPECT_TRUE(store_->PoolReadOnly(every, got.data(), spec_.dim).ok());
        EXPECT_TRUE(BitwiseEqual(want, got));
        fs_->Reset();
        return true;
      });
  ASSERT_EQ(failures.size(), 1u);
  EXPECT_GE(store_->metrics().write_retries, 1);
  EXPECT_EQ(CompareRows(), 0);
  ASSERT_TRUE(store_->Flush().ok());
  EXPECT_TRUE(db_->Checkpoint(dir_ + "/checkpoint").ok());
}

// A device that fails for good: RocksDB turns read-only, the step fails
// with INTERNAL naming the table, and so does every later step (also after
// the fault is gone: RocksDB cannot recover). No row ever reads wrong: a
// row either reads as the reference has it or not at all.
TEST_F(StoreFaultTest, PermanentWriteFailureStopsWithAClearError) {
  fs_->FailAllWrites(RocksDbFault::kFatal);
  const std::vector<absl::Status> failures =
      Train(120, kSeed + 42, [](const absl::Status&) { return false; });
  ASSERT_EQ(failures.size(), 1u);
  EXPECT_EQ(failures[0].code(), absl::StatusCode::kInternal) << failures[0];
  EXPECT_HAS_SUBSTR(failures[0].message(), "table 3") << failures[0];
  EXPECT_HAS_SUBSTR(failures[0].message(), "(injected)") << failures[0];
  fs_->Reset();
  EXPECT_FALSE(store_->Prepare(Bag({1})).ok());
  EXPECT_FALSE(store_->Flush().ok());
  EXPECT_GT(CompareRows(), 0);
}

// ---------------------------------------------------------------- memory

// kB of a "Vm...:" line of /proc/self/status (-1 when missing).
int64_t StatusKb(const std::string& field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field + ":", 0) == 0) {
      return std::stoll(line.substr(field.size() + 1));
    }
  }
  return -1;
}

constexpr char kMemoryChildEnv[] = "DLRM_STORE_MEMORY_CHILD";

// The memory bound, run in a fresh process by RssStaysWithinCacheBudget
// (skipped otherwise, so nothing else in this process skews its RSS): a
// 8M x 16 table (512 MB of rows) behind a cache of 400k rows (25.6 MB, a
// twentieth) trains 160 batches of 8192 uniform ids, almost all misses, so
// about 850k dirty rows go through RocksDB. The peak
// RSS over the process's RSS before the table existed stays under the
// cache (rows and bookkeeping, 144 B a row) plus a fixed 80 MiB: RocksDB's
// two 4 MiB memtables, 8 MiB block cache, index and bloom filters and
// flush/compaction buffers, the prefetch staging and batch scratch,
// allocator slack (measured: about 55 MiB). The table in memory would need
// 512 MB, over three times the bound.
TEST_F(StoreTest, MemoryBoundChild) {
  if (std::getenv(kMemoryChildEnv) == nullptr) {
    GTEST_SKIP() << "run by RssStaysWithinCacheBudget in a fresh process";
  }
  constexpr int64_t kRows = 8'000'000, kCacheRows = 400'000, kBatch = 8192;
  constexpr int kDim = 16, kSteps = 160;
  constexpr int64_t kOverheadBytes = int64_t{80} << 20;
  const int64_t baseline_kb = StatusKb("VmRSS");
  ASSERT_GT(baseline_kb, 0);
  RocksDbStoreOptions options = Options(kCacheRows);
  options.write_buffer_bytes = 4 << 20;
  options.block_cache_bytes = 8 << 20;
  const TableSpec spec =
      MakeSpec(3, kRows, kDim, POOLING_SUM, OptimizerConfig::SGD);
  const int64_t table_bytes = kRows * kDim * 4;
  const int64_t cache_bytes = kCacheRows * kDim * 4;
  // Per cached row, besides its floats: its Slot record (48 B) and its
  // entry in the id -> slot map (about 24 B at its load factor).
  constexpr int64_t kBookkeepingPerRow = 80;
  const int64_t bound_bytes =
      cache_bytes + kCacheRows * kBookkeepingPerRow + kOverheadBytes;
  ASSERT_GE(table_bytes, 5 * cache_bytes);
  ASSERT_GT(table_bytes, 3 * bound_bytes);
  {
    auto db = RowDatabase::Open(options);
    ASSERT_TRUE(db.ok()) << db.status();
    auto store = RocksDbCachedStore::Create(spec, options, db->get());
    ASSERT_TRUE(store.ok()) << store.status();
    Rng rng(kSeed);
    auto batch = [&] {
      data::SparseFeature f;
      f.offsets.resize(kBatch + 1);
      f.ids.resize(kBatch);
      for (int64_t i = 0; i < kBatch; ++i) {
        f.offsets[i] = i;
        f.ids[i] = static_cast<int64_t>(rng.NextU64() % kRows);
      }
      f.offsets[kBatch] = kBatch;
      return f;
    };
    std::vector<float> out(kBatch * kDim), grad(kBatch * kDim, 0.01f);
    data::SparseFeature ids = batch();
    for (int step = 0; step < kSteps; ++step) {
      data::SparseFeature next = batch();
      auto p = (*store)->Prepare(ids);
      ASSERT_TRUE(p.ok()) << p.status();
      ASSERT_TRUE((*store)->Prefetch(next).ok());
      ASSERT_TRUE((*store)->Forward(**p, out.data(), kDim).ok());
      ASSERT_TRUE((*store)->BackwardUpdate(**p, grad.data(), kDim).ok());
      ids = std::move(next);
    }
    ASSERT_TRUE((*store)->Flush().ok());
    const StoreMetrics m = (*store)->metrics();
    EXPECT_GT(m.rows_written, 700'000);
    EXPECT_GT(m.evictions, 700'000);
  }
  const int64_t peak_kb = StatusKb("VmHWM");
  std::printf(
      "table %lld MiB, cache %lld MiB, RSS before %lld MiB, peak %lld MiB "
      "(+%lld MiB), bound +%lld MiB\n",
      static_cast<long long>(table_bytes >> 20),
      static_cast<long long>(cache_bytes >> 20),
      static_cast<long long>(baseline_kb >> 10),
      static_cast<long long>(peak_kb >> 10),
      static_cast<long long>((peak_kb - baseline_kb) >> 10),
      static_cast<long long>(bound_bytes >> 20));
  EXPECT_LE((peak_kb - baseline_kb) * 1024, bound_bytes);
}

// Runs MemoryBoundChild in a new process of this binary and requires it
// to pass (not skip).
TEST(StoreMemoryTest, RssStaysWithinCacheBudget) {
  const std::string filter = "--gtest_filter=StoreTest.MemoryBoundChild";
  const std::string out = testing::TempDir() + "/embedding_store_memory_" +
                          std::to_string(getpid()) + ".txt";
  const std::string output = "--gtest_output=json:" + out;
  test::SpawnOptions options;
  options.env = {std::string(kMemoryChildEnv) + "=1"};
  const pid_t pid =
      test::Spawn({test::SelfPath(), filter, output}, options).pid;
  ASSERT_NE(pid, -1);
  ASSERT_EQ(test::WaitExit(pid, 240), 0);
  // The child ran the test rather than skipping it.
  std::ifstream in(out);
  std::string json((std::istreambuf_iterator<char>(in)),
                   std::istreambuf_iterator<char>());
  std::filesystem::remove(out);
  EXPECT_HAS_SUBSTR(json, "\"MemoryBoundChild\"");
  EXPECT_NO_SUBSTR(json, "SKIPPED") << json;
}

}  // namespace
}  // namespace dlrm::embedding
