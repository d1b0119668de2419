// Tests for model/predictor.h: predictions beside a running training step
// read the weights of exactly one completed step (never a mix), and models
// whose weights cannot be read beside the step are refused with the reason.
#include "model/predictor.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <filesystem>
#include <map>
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
// rows of one step with dense weights (or other rows) of another.
void CheckSnapshots(OptimizerConfig::Type type) {
  const ModelConfig c = FastLearning(type);
  const int kSteps = 60;
  const std::vector<data::Batch> train = Batches(c, kSteps, 64, 3);
  const data::Batch probe = Batches(c, 1, 32, 99)[0];

  // The replay: the model's own prediction after each step.
  auto replay_model = Model::Create(c);
  ASSERT_TRUE(replay_model.ok()) << replay_model.status();
  std::vector<std::vector<float>> expected(kSteps + 1);
  for (int s = 0; s <= kSteps; ++s) {
    ASSERT_TRUE((*replay_model)->Predict(probe, &expected[s]).ok());
    if (s < kSteps) ASSERT_TRUE((*replay_model)->TrainStep(train[s]).ok());
  }
  for (int s = 0; s < kSteps; ++s) {
    ASSERT_GT(MaxDiff(expected[s], expected[s + 1]), 1e-4)
        << "steps " << s << " and " << s + 1 << " predict alike";
  }

  auto model = Model::Create(c);
  ASSERT_TRUE(model.ok()) << model.status();
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
    ASSERT_TRUE((*model)->TrainStep(train[s]).ok());
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
    if (step > 0) EXPECT_GT(MaxDiff(probs, expected[step - 1]), 1e-5);
    if (step < kSteps) EXPECT_GT(MaxDiff(probs, expected[step + 1]), 1e-5);
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
}

TEST(SnapshotPredictorTest, PredictionsBesideTrainingSeeOneStepSgd) {
  CheckSnapshots(OptimizerConfig::SGD);
}

TEST(SnapshotPredictorTest, PredictionsBesideTrainingSeeOneStepAdagrad) {
  CheckSnapshots(OptimizerConfig::ADAGRAD);
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

TEST(SnapshotPredictorTest, SeesARestoreWhole) {
  const ModelConfig c = FastLearning(OptimizerConfig::SGD);
  const std::vector<data::Batch> train = Batches(c, 5, 64, 3);
  const data::Batch probe = Batches(c, 1, 16, 99)[0];
  auto trained = Model::Create(c);
  ASSERT_TRUE(trained.ok());
  for (const data::Batch& b : train) ASSERT_TRUE((*trained)->TrainStep(b).ok());
  const std::string dir = (std::filesystem::temp_directory_path() /
                           ("predictor_test_" + std::to_string(::getpid())))
                              .string();
  std::filesystem::remove_all(dir);
  ASSERT_TRUE(SaveCheckpoint(**trained, dir).ok());
  std::vector<float> want;
  ASSERT_TRUE((*trained)->Predict(probe, &want).ok());

  auto fresh = Model::Create(c);
  ASSERT_TRUE(fresh.ok());
  auto predictor = SnapshotPredictor::Create(fresh->get());
  ASSERT_TRUE(predictor.ok());
  std::vector<float> before, after;
  int64_t step = -1;
  ASSERT_TRUE((*predictor)->Predict(probe, &before, &step).ok());
  EXPECT_EQ(step, 0);
  ASSERT_TRUE(RestoreCheckpoint(**fresh, dir).ok());
  ASSERT_TRUE((*predictor)->Predict(probe, &after, &step).ok());
  EXPECT_EQ(step, 5);
  EXPECT_LT(MaxDiff(after, want), 1e-6);
  EXPECT_GT(MaxDiff(after, before), 1e-4);
  std::filesystem::remove_all(dir);
}

TEST(SnapshotPredictorTest, RefusesTablesOnRocksDb) {
  ModelConfig c = Tiny();
  c.mutable_tables(1)->set_storage(STORAGE_ROCKSDB);
  c.mutable_rocksdb()->set_path(
      (std::filesystem::temp_directory_path() /
       ("predictor_test_db_" + std::to_string(::getpid())))
          .string());
  auto normalised = NormalizeModelConfig(c);
  ASSERT_TRUE(normalised.ok()) << normalised.status();
  auto model = Model::Create(*normalised);
  ASSERT_TRUE(model.ok()) << model.status();
  auto predictor = SnapshotPredictor::Create(model->get());
  EXPECT_EQ(predictor.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(predictor.status().message().find("t1"), std::string::npos)
      << predictor.status();
}

}  // namespace
}  // namespace dlrm::model
