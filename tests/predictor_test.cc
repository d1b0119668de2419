// Tests for model/predictor.h: predictions beside a running training step
// read the weights of exactly one completed step (never a mix), with tables
// in host memory or on RocksDB, and leave the step's results unchanged.
#include "model/predictor.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <filesystem>
#include <map>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/config.h"
#include "data/synthetic.h"
#include "model/checkpoint.h"
#include "model/model.h"

namespace dlrm::model {
namespace {

ModelConfig Tiny() {
  auto c = LoadModelConfig("tiny");
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

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

std::vector<data::Batch> Batches(const ModelConfig& c, int count, int64_t n,
                                 uint64_t seed) {
  data::SyntheticOptions o;
  o.sample_seed = seed;
  auto src = data::MakeSyntheticSource(c, o);
  EXPECT_TRUE(src.ok()) << src.status();
  std::vector<data::Batch> out(count);
  for (data::Batch& b : out) {
    auto more = (*src)->Next(n, &b);
    EXPECT_TRUE(more.ok() && *more);
  }
  return out;
}

double MaxDiff(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    d = std::max(d, std::fabs(static_cast<double>(a[i]) - b[i]));
  }
  return d;
}

// Every prediction taken while another thread trains equals, within float
// noise, the replayed model's prediction after exactly the step it reports,
// and is far from the steps before and after it: the predictor never saw
// rows of one step with dense weights (or other rows) of another. With
// `rocksdb`, the model's tables are on RocksDB behind caches that evict
// every step (each step prefetching the next batch), replayed by the same
// model in host memory; the training beside the predictions then ends with
// the replay's weights and with the cache counters of the same training
// without predictions.
void CheckSnapshots(OptimizerConfig::Type type, bool rocksdb) {
  const ModelConfig c =
      rocksdb ? BiggerTables(FastLearning(type)) : FastLearning(type);
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
  ASSERT_EQ((*model)->HasRocksDbShards(), rocksdb);
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
    EXPECT_LT(d, 1e-6) << "prediction at step " << step
                       << " is not that step's";
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
  EXPECT_LT(MaxDiff(final_probs, expected[kSteps]), 1e-6);
  // Predictions really ran while the model trained (they saw more than one
  // step's weights).
  EXPECT_GT(per_step.size(), 1u) << seen.size() << " predictions";
  if (!rocksdb) return;

  // The caches really moved rows, and the predictions moved none of them:
  // the weights are the replay's, and the counters (hits, misses,
  // evictions, prefetch hits, rows read and written) those of the same
  // training without predictions.
  const embedding::StoreMetrics beside = (*model)->RocksDbMetrics();
  EXPECT_GT(beside.evictions, 0);
  EXPECT_GT(beside.rows_written, 0);
  EXPECT_GT(beside.prefetch_hits, 0);
  auto alone = Model::Create(trained_config);
  ASSERT_TRUE(alone.ok()) << alone.status();
  for (int s = 0; s < kSteps; ++s) {
    ASSERT_TRUE((*alone)->TrainStep(train[s], next(s)).ok());
  }
  const embedding::StoreMetrics without = (*alone)->RocksDbMetrics();
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
  EXPECT_NE(st.message().find("sparse"), std::string::npos) << st;
}

// A predictor made before a checkpoint restore predicts with the restored
// weights afterwards. With `rocksdb` the model's tables are on RocksDB, whose
// stores the restore replaces under the predictor.
void CheckRestore(bool rocksdb) {
  const ScratchDir db_dir(rocksdb ? "restore_db" : "restore_unused");
  const ModelConfig c =
      rocksdb ? OnRocksDb(BiggerTables(FastLearning(OptimizerConfig::SGD)),
                          db_dir.path())
              : FastLearning(OptimizerConfig::SGD);
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
  ASSERT_EQ((*fresh)->HasRocksDbShards(), rocksdb);
  auto predictor = SnapshotPredictor::Create(fresh->get());
  ASSERT_TRUE(predictor.ok());
  std::vector<float> before, after;
  int64_t step = -1;
  ASSERT_TRUE((*predictor)->Predict(probe, &before, &step).ok());
  EXPECT_EQ(step, 0);
  ASSERT_TRUE(RestoreCheckpoint(**fresh, dir.path()).ok());
  ASSERT_TRUE((*predictor)->Predict(probe, &after, &step).ok());
  EXPECT_EQ(step, 5);
  EXPECT_LT(MaxDiff(after, want), 1e-6);
  EXPECT_GT(MaxDiff(after, before), 1e-4);
}

TEST(SnapshotPredictorTest, SeesARestoreWhole) { CheckRestore(false); }

TEST(SnapshotPredictorTest, SeesARestoreOfTablesOnRocksDbWhole) {
  CheckRestore(true);
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
  EXPECT_GT((*model)->RocksDbMetrics().evictions, 0);
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
  EXPECT_NE(st.message().find("sparse"), std::string::npos) << st;
}

}  // namespace
}  // namespace dlrm::model
