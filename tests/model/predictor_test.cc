// Tests for model/predictor.h: predictions beside a running training step
// read the weights of exactly one completed step (never a mix), with tables
// in host memory or on RocksDB, and leave the step's results unchanged; on
// the CPU and, with a dense part on CUDA (the GPU cases skip without a CUDA
// device and fail instead under DLRM_REQUIRE_CUDA=1), on the GPU.
#include "model/predictor.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/config.h"
#include "core/device.h"
#include "data/synthetic.h"
#include "model/checkpoint.h"
#include "model/model.h"
#include "tests/support/expect.h"
#include "tests/support/synthetic.h"

namespace dlrm::model {
namespace {

ModelConfig Tiny() {
  auto c = LoadModelConfig("tiny");
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

// Where the dense part runs: the CPU, or CUDA device 0 at `precision` with
// float GEMMs (TF32 off), the tables in host memory or on RocksDB.
struct Dense {
  ComputeDevice device = DEVICE_CPU;
  DensePrecision precision = PRECISION_FP32;
};
constexpr Dense kCpu;
constexpr Dense kCuda{DEVICE_CUDA, PRECISION_FP32};
constexpr Dense kCudaBf16{DEVICE_CUDA, PRECISION_BF16};

// `c` with its dense part on `dense`.
ModelConfig On(ModelConfig c, Dense dense) {
  c.set_device(dense.device);
  c.set_dense_precision(dense.precision);
  if (dense.device == DEVICE_CUDA) c.set_gpu_disable_tf32(true);
  return c;
}

// How far a prediction beside the step may be from the replayed model's
// after the same step. CPU: float noise (the same oneDNN kernels on the
// same inputs). CUDA: the predictor's backend runs the same kernels on the
// same weights and inputs as the replay's (fp32 GEMMs with TF32 off, or the
// same bf16 ones), so equal in practice; 1e-5 leaves room for a GEMM
// algorithm cuBLASLt might pick for differently aligned buffers (another
// summation order), a tenth of the 1e-4 every step moves the predictions.
double Tolerance(Dense dense) {
  return dense.device == DEVICE_CUDA ? 1e-5 : 1e-6;
}

// Skips a GPU case without a CUDA device (fails it instead under
// DLRM_REQUIRE_CUDA=1).
#define SKIP_WITHOUT_DEVICE(dense)                                   \
  do {                                                               \
    if ((dense).device == DEVICE_CUDA && CudaDeviceCount() == 0) {   \
      const char* required = std::getenv("DLRM_REQUIRE_CUDA");       \
      if (required != nullptr && std::string(required) == "1") {     \
        FAIL() << "DLRM_REQUIRE_CUDA=1 but no CUDA device: "         \
               << CudaUnavailableReason();                           \
      }                                                              \
      GTEST_SKIP() << "no CUDA device: " << CudaUnavailableReason(); \
    }                                                                \
  } while (0)

// The tiny model with learning rates large enough that every step moves
// every prediction measurably (so a step's predictions identify it).
ModelConfig FastLearning(OptimizerConfig::Type type) {
  ModelConfig c = Tiny();
  c.mutable_dense_optimizer()->set_type(type);
  c.mutable_sparse_optimizer()->set_type(type);
  c.mutable_dense_optimizer()->set_learning_rate(
      type == OptimizerConfig::SGD ? 0.5f : 0.05f);
  c.mutable_sparse_optimizer()->set_learning_rate(
      type == OptimizerConfig::SGD ? 0.5f : 0.05f);
  auto normalised = NormalizeModelConfig(c);
  EXPECT_TRUE(normalised.ok()) << normalised.status();
  return *normalised;
}

// A scratch directory for the test's RocksDB databases, removed at the end.
class ScratchDir {
 public:
  explicit ScratchDir(const std::string& name)
      : path_((std::filesystem::temp_directory_path() /
               ("predictor_test_" + name + "_" + std::to_string(::getpid())))
                  .string()) {
    std::filesystem::remove_all(path_);
  }
  ~ScratchDir() { std::filesystem::remove_all(path_); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// `c` with tables of 1000, 400 and 2000 rows: big enough that a cache of
// 200 rows (which a batch of 64 samples always fits in) evicts every step.
ModelConfig BiggerTables(ModelConfig c) {
  c.mutable_tables(0)->set_rows(1000);
  c.mutable_tables(1)->set_rows(400);
  c.mutable_tables(2)->set_rows(2000);
  auto normalised = NormalizeModelConfig(c);
  EXPECT_TRUE(normalised.ok()) << normalised.status();
  return *normalised;
}

// `c` with every table on RocksDB under `dir`, behind caches of 200 rows.
ModelConfig OnRocksDb(const ModelConfig& c, const std::string& dir) {
  RocksDbConfig r;
  r.set_path(dir);
  r.set_cache_rows(200);
  auto placed = PlaceTablesOnRocksDb(c, {"all"}, r);
  EXPECT_TRUE(placed.ok()) << placed.status();
  return *placed;
}

// `count` batches of `n` samples of sample stream `seed`, labelled by the
// default teacher.
std::vector<data::Batch> Batches(const ModelConfig& c, int count, int64_t n,
                                 uint64_t seed) {
  return test::SyntheticBatches(c, count, n, {.sample_seed = seed});
}

double MaxDiff(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    d = std::max(d, std::fabs(static_cast<double>(a[i]) - b[i]));
  }
  return d;
}

// Every prediction taken while another thread trains equals, within
// Tolerance(dense), the replayed model's prediction after exactly the step
// it reports, and is far from the steps before and after it: the predictor
// never saw rows of one step with dense weights (or other rows) of another.
// With `rocksdb`, the model's tables are on RocksDB behind caches that
// evict every step (each step prefetching the next batch), replayed by the
// same model in host memory; the training beside the predictions then ends
// with the replay's weights and with the cache counters of the same
// training without predictions. On CUDA the model's dense update is still
// queued on its stream when the step returns: a prediction that copies
// the weights then must wait for that update, and for nothing later.
void CheckSnapshots(OptimizerConfig::Type type, bool rocksdb,
                    Dense dense = kCpu) {
  const ModelConfig fast = On(FastLearning(type), dense);
  const ModelConfig c = rocksdb ? BiggerTables(fast) : fast;
  const double tolerance = Tolerance(dense);
  const ScratchDir dir(std::string("snapshots_") +
                       (type == OptimizerConfig::SGD ? "sgd" : "adagrad"));
  const ModelConfig trained_config = rocksdb ? OnRocksDb(c, dir.path()) : c;
  const int kSteps = 60;
  const std::vector<data::Batch> train = Batches(c, kSteps, 64, 3);
  const data::Batch probe = Batches(c, 1, 32, 99)[0];
  auto next = [&](int s) { return s + 1 < kSteps ? &train[s + 1] : nullptr; };

  // The replay: the model's own prediction after each step.
  auto replay_model = Model::Create(c);
  ASSERT_TRUE(replay_model.ok()) << replay_model.status();
  std::vector<std::vector<float>> expected(kSteps + 1);
  for (int s = 0; s <= kSteps; ++s) {
    ASSERT_TRUE((*replay_model)->Predict(probe, &expected[s]).ok());
    if (s < kSteps) {
      ASSERT_TRUE((*replay_model)->TrainStep(train[s]).ok());
    }
  }
  for (int s = 0; s < kSteps; ++s) {
    ASSERT_GT(MaxDiff(expected[s], expected[s + 1]), 1e-4)
        << "steps " << s << " and " << s + 1 << " predict alike";
  }

  auto model = Model::Create(trained_config);
  ASSERT_TRUE(model.ok()) << model.status();
  ASSERT_EQ((*model)->shards().has_database(), rocksdb);
  auto predictor = SnapshotPredictor::Create(model->get());
  ASSERT_TRUE(predictor.ok()) << predictor.status();

  std::atomic<bool> done{false};
  std::atomic<int> predictions{0};
  std::vector<std::pair<int64_t, std::vector<float>>> seen;
  std::thread reader([&] {
    while (!done.load()) {
      std::vector<float> probs;
      int64_t step = -1;
      const absl::Status st = (*predictor)->Predict(probe, &probs, &step);
      ASSERT_TRUE(st.ok()) << st;
      seen.emplace_back(step, std::move(probs));
      ++predictions;
    }
  });
  for (int s = 0; s < kSteps; ++s) {
    // Every 10 steps the trainer lets a prediction in, so that predictions
    // span the run however the threads are scheduled; the others race it.
    if (s % 10 == 0) {
      const int before = predictions.load();
      while (predictions.load() == before) std::this_thread::yield();
    }
    ASSERT_TRUE((*model)->TrainStep(train[s], next(s)).ok());
  }
  done.store(true);
  reader.join();

  ASSERT_FALSE(seen.empty());
  std::map<int64_t, int> per_step;
  int64_t last = 0;
  for (const auto& [step, probs] : seen) {
    ASSERT_GE(step, last) << "a prediction went back in time";
    last = step;
    ASSERT_LE(step, kSteps);
    ++per_step[step];
    const double d = MaxDiff(probs, expected[step]);
    EXPECT_LT(d, tolerance)
        << "prediction at step " << step << " is not that step's";
    if (step > 0) {
      EXPECT_GT(MaxDiff(probs, expected[step - 1]), 1e-5);
    }
    if (step < kSteps) {
      EXPECT_GT(MaxDiff(probs, expected[step + 1]), 1e-5);
    }
  }
  // After training the predictor reads the final weights.
  std::vector<float> final_probs;
  int64_t final_step = -1;
  ASSERT_TRUE((*predictor)->Predict(probe, &final_probs, &final_step).ok());
  EXPECT_EQ(final_step, kSteps);
  EXPECT_LT(MaxDiff(final_probs, expected[kSteps]), tolerance);
  // Predictions really ran while the model trained (they saw more than one
  // step's weights).
  EXPECT_GT(per_step.size(), 1u) << seen.size() << " predictions";
  if (!rocksdb) return;

  // The caches really moved rows, and the predictions moved none of them:
  // the weights are the replay's, and the counters (hits, misses,
  // evictions, prefetch hits, rows read and written) those of the same
  // training without predictions.
  const embedding::StoreMetrics beside = (*model)->shards().HostCacheMetrics();
  EXPECT_GT(beside.evictions, 0);
  EXPECT_GT(beside.rows_written, 0);
  EXPECT_GT(beside.prefetch_hits, 0);
  auto alone = Model::Create(trained_config);
  ASSERT_TRUE(alone.ok()) << alone.status();
  for (int s = 0; s < kSteps; ++s) {
    ASSERT_TRUE((*alone)->TrainStep(train[s], next(s)).ok());
  }
  const embedding::StoreMetrics without = (*alone)->shards().HostCacheMetrics();
  for (const auto field : embedding::StoreMetrics::kFields) {
    EXPECT_EQ(beside.*field, without.*field);
  }
  auto want_sum = (*replay_model)->WeightChecksum();
  auto got_sum = (*model)->WeightChecksum();
  ASSERT_TRUE(want_sum.ok() && got_sum.ok());
  EXPECT_EQ(*got_sum, *want_sum);
}

TEST(SnapshotPredictorTest, PredictionsBesideTrainingSeeOneStepSgd) {
  CheckSnapshots(OptimizerConfig::SGD, /*rocksdb=*/false);
}

TEST(SnapshotPredictorTest, PredictionsBesideTrainingSeeOneStepAdagrad) {
  CheckSnapshots(OptimizerConfig::ADAGRAD, /*rocksdb=*/false);
}

TEST(SnapshotPredictorTest, PredictionsBesideTrainingOnRocksDbSeeOneStepSgd) {
  CheckSnapshots(OptimizerConfig::SGD, /*rocksdb=*/true);
}

TEST(SnapshotPredictorTest,
     PredictionsBesideTrainingOnRocksDbSeeOneStepAdagrad) {
  CheckSnapshots(OptimizerConfig::ADAGRAD, /*rocksdb=*/true);
}

TEST(SnapshotPredictorTest, OnCudaPredictionsBesideTrainingSeeOneStepSgd) {
  SKIP_WITHOUT_DEVICE(kCuda);
  CheckSnapshots(OptimizerConfig::SGD, /*rocksdb=*/false, kCuda);
}

TEST(SnapshotPredictorTest, OnCudaPredictionsBesideTrainingSeeOneStepAdagrad) {
  SKIP_WITHOUT_DEVICE(kCuda);
  CheckSnapshots(OptimizerConfig::ADAGRAD, /*rocksdb=*/false, kCuda);
}

// The predictor's bf16 weight copies follow each refresh of its weights.
TEST(SnapshotPredictorTest, OnCudaBf16PredictionsBesideTrainingSeeOneStep) {
  SKIP_WITHOUT_DEVICE(kCudaBf16);
  CheckSnapshots(OptimizerConfig::SGD, /*rocksdb=*/false, kCudaBf16);
}

TEST(SnapshotPredictorTest,
     OnCudaPredictionsBesideTrainingOnRocksDbSeeOneStepAdagrad) {
  SKIP_WITHOUT_DEVICE(kCuda);
  CheckSnapshots(OptimizerConfig::ADAGRAD, /*rocksdb=*/true, kCuda);
}

TEST(SnapshotPredictorTest, EqualsModelPredictAndRefusesBadBatches) {
  const ModelConfig c = Tiny();
  auto model = Model::Create(c);
  ASSERT_TRUE(model.ok());
  auto predictor = SnapshotPredictor::Create(model->get());
  ASSERT_TRUE(predictor.ok()) << predictor.status();
  for (const int64_t n : {1, 7, 300}) {
    const data::Batch batch = Batches(c, 1, n, n)[0];
    std::vector<float> want, got;
    int64_t step = -1;
    ASSERT_TRUE((*model)->Predict(batch, &want).ok());
    ASSERT_TRUE((*predictor)->Predict(batch, &got, &step).ok());
    EXPECT_EQ(step, 0);
    ASSERT_EQ(got.size(), static_cast<size_t>(n));
    EXPECT_LT(MaxDiff(got, want), 1e-6) << n << " samples";
  }
  // An empty batch is refused, as the model refuses it.
  data::Batch empty;
  empty.sparse.resize(c.tables_size());
  std::vector<float> none;
  int64_t at = -1;
  EXPECT_EQ((*predictor)->Predict(empty, &none, &at).code(),
            absl::StatusCode::kInvalidArgument);
  data::Batch bad = Batches(c, 1, 4, 5)[0];
  bad.sparse[2].ids[1] = c.tables(2).rows();  // one past the table's end
  std::vector<float> probs;
  int64_t step = -1;
  const absl::Status st = (*predictor)->Predict(bad, &probs, &step);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_HAS_SUBSTR(st.message(), "sparse") << st;
}

// A predictor made before a checkpoint restore predicts with the restored
// weights afterwards. With `rocksdb` the model's tables are on RocksDB, whose
// stores the restore replaces under the predictor.
// On CUDA the restore's dense weights reach the device before the
// predictor copies them from there.
void CheckRestore(bool rocksdb, Dense dense = kCpu) {
  const ScratchDir db_dir(rocksdb ? "restore_db" : "restore_unused");
  const ModelConfig fast = On(FastLearning(OptimizerConfig::SGD), dense);
  const ModelConfig c =
      rocksdb ? OnRocksDb(BiggerTables(fast), db_dir.path()) : fast;
  const std::vector<data::Batch> train = Batches(c, 5, 64, 3);
  const data::Batch probe = Batches(c, 1, 16, 99)[0];
  auto trained = Model::Create(c);
  ASSERT_TRUE(trained.ok());
  for (const data::Batch& b : train) ASSERT_TRUE((*trained)->TrainStep(b).ok());
  const ScratchDir dir("restore");
  ASSERT_TRUE(SaveCheckpoint(**trained, dir.path()).ok());
  std::vector<float> want;
  ASSERT_TRUE((*trained)->Predict(probe, &want).ok());

  auto fresh = Model::Create(c);
  ASSERT_TRUE(fresh.ok());
  ASSERT_EQ((*fresh)->shards().has_database(), rocksdb);
  auto predictor = SnapshotPredictor::Create(fresh->get());
  ASSERT_TRUE(predictor.ok());
  std::vector<float> before, after;
  int64_t step = -1;
  ASSERT_TRUE((*predictor)->Predict(probe, &before, &step).ok());
  EXPECT_EQ(step, 0);
  ASSERT_TRUE(RestoreCheckpoint(**fresh, dir.path()).ok());
  ASSERT_TRUE((*predictor)->Predict(probe, &after, &step).ok());
  EXPECT_EQ(step, 5);
  EXPECT_LT(MaxDiff(after, want), Tolerance(dense));
  EXPECT_GT(MaxDiff(after, before), 1e-4);
}

TEST(SnapshotPredictorTest, SeesARestoreWhole) { CheckRestore(false); }

TEST(SnapshotPredictorTest, SeesARestoreOfTablesOnRocksDbWhole) {
  CheckRestore(true);
}

TEST(SnapshotPredictorTest, OnCudaSeesARestoreWhole) {
  SKIP_WITHOUT_DEVICE(kCuda);
  CheckRestore(false, kCuda);
}

TEST(SnapshotPredictorTest, OnCudaBf16SeesARestoreWhole) {
  SKIP_WITHOUT_DEVICE(kCudaBf16);
  CheckRestore(false, kCudaBf16);
}

// A CUDA model whose rows are read through its stream keeps predictions
// between steps: a table in GPU memory, a device cache over host memory,
// and any table with the dense part replaying CUDA graphs. Each refusal
// says why (naming the table); the same model with its tables in host
// memory is accepted.
TEST(SnapshotPredictorTest, OnCudaRefusesDeviceTablesAndGraphs) {
  SKIP_WITHOUT_DEVICE(kCuda);
  const ModelConfig host = On(Tiny(), kCuda);
  auto accepted = Model::Create(host);
  ASSERT_TRUE(accepted.ok()) << accepted.status();
  EXPECT_TRUE(SnapshotPredictor::Create(accepted->get()).ok());
  struct Refused {
    const char* what;
    ModelConfig config;
    const char* message;
  };
  std::vector<Refused> cases;
  ModelConfig device_table = host;
  device_table.mutable_tables(1)->set_storage(STORAGE_DEVICE);
  cases.push_back({"device table", device_table, "GPU memory"});
  ModelConfig device_cache = device_table;
  device_cache.mutable_tables(1)->set_device_cache_rows(8);
  cases.push_back({"device cache", device_cache, "GPU memory"});
  ModelConfig graphs = host;
  graphs.set_gpu_cuda_graphs(true);
  cases.push_back({"graphs", graphs, "gpu_cuda_graphs"});
  for (const Refused& r : cases) {
    SCOPED_TRACE(r.what);
    auto normalised = NormalizeModelConfig(r.config);
    ASSERT_TRUE(normalised.ok()) << normalised.status();
    auto model = Model::Create(*normalised);
    ASSERT_TRUE(model.ok()) << model.status();
    auto predictor = SnapshotPredictor::Create(model->get());
    ASSERT_EQ(predictor.status().code(), absl::StatusCode::kFailedPrecondition)
        << predictor.status();
    const std::string message(predictor.status().message());
    EXPECT_HAS_SUBSTR(message, r.message) << message;
    if (r.config.tables(1).storage() == STORAGE_DEVICE) {
      EXPECT_HAS_SUBSTR(message, r.config.tables(1).name()) << message;
    }
  }
}

// A model with a table on RocksDB behind a cache of 6 rows (of 20) is
// predicted beside its step, also for batches with more unique ids than its
// cache holds; its predictions equal those of the same model in host
// memory, and a bad id is refused naming the field before any store is
// read.
TEST(SnapshotPredictorTest, ServesTablesOnRocksDb) {
  const ModelConfig host = Tiny();
  ModelConfig c = host;
  c.mutable_tables(1)->set_storage(STORAGE_ROCKSDB);
  const ScratchDir dir("db");
  c.mutable_rocksdb()->set_path(dir.path());
  c.mutable_rocksdb()->set_cache_rows(6);
  auto normalised = NormalizeModelConfig(c);
  ASSERT_TRUE(normalised.ok()) << normalised.status();
  auto model = Model::Create(*normalised);
  ASSERT_TRUE(model.ok()) << model.status();
  auto in_memory = Model::Create(host);
  ASSERT_TRUE(in_memory.ok()) << in_memory.status();
  auto predictor = SnapshotPredictor::Create(model->get());
  ASSERT_TRUE(predictor.ok()) << predictor.status();
  // Two samples a step: at most 6 ids of the table on RocksDB.
  for (const data::Batch& b : Batches(host, 8, 2, 5)) {
    ASSERT_TRUE((*model)->TrainStep(b).ok());
    ASSERT_TRUE((*in_memory)->TrainStep(b).ok());
  }
  EXPECT_GT((*model)->shards().HostCacheMetrics().evictions, 0);
  const data::Batch batch = Batches(host, 1, 40, 8)[0];
  std::vector<float> want, got;
  int64_t step = -1;
  ASSERT_TRUE((*predictor)->Predict(batch, &got, &step).ok());
  ASSERT_TRUE((*in_memory)->Predict(batch, &want).ok());
  EXPECT_EQ(step, 8);
  ASSERT_EQ(got.size(), want.size());
  EXPECT_LT(MaxDiff(got, want), 1e-6);
  data::Batch bad = batch;
  bad.sparse[1].ids[0] = -1;
  const absl::Status st = (*predictor)->Predict(bad, &got, &step);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_HAS_SUBSTR(st.message(), "sparse") << st;
}

// Every prediction and step checks its batch with ValidateBatch: a dynamic
// table's ids are raw ids in [0, 2^63 - 1), a static table's its rows.
TEST(ValidateBatchTest, DynamicTablesTakeRawIdsStaticTablesTheirRows) {
  ModelConfig config = Tiny();
  config.mutable_tables(0)->set_dynamic(true);  // one id per bag
  data::Batch batch = test::SyntheticBatch(Tiny(), 4, 1);
  const int64_t raw = (int64_t{1} << 40) + 7;
  batch.sparse[0].ids[0] = raw;
  EXPECT_TRUE(ValidateBatch(config, batch).ok());

  batch.sparse[0].ids[2] = -1;
  const absl::Status negative = ValidateBatch(config, batch);
  EXPECT_EQ(negative.code(), absl::StatusCode::kInvalidArgument) << negative;
  EXPECT_NE(std::string(negative.message())
                .find("sparse[0].ids[2] (sample 2) = -1 is out of range: a "
                      "dynamic table's ids"),
            std::string::npos)
      << negative;

  batch.sparse[0].ids[2] = 0;
  batch.sparse[1].ids[0] = config.tables(1).rows();
  const absl::Status rows = ValidateBatch(config, batch);
  EXPECT_EQ(rows.code(), absl::StatusCode::kInvalidArgument) << rows;
  EXPECT_NE(
      std::string(rows.message()).find("sparse[1].ids[0] (sample 0) = 20"),
      std::string::npos)
      << rows;
}

}  // namespace
}  // namespace dlrm::model
