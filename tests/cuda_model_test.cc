// The model's step on a GPU with its tables in device memory
// (STORAGE_DEVICE: embedding::cuda::CudaStore, or the device cache with
// device_cache_rows, pooling into, and updating from, the CUDA dense
// backend's device buffers on its stream) against the
// same model on the CPU, and checkpoints between the two. Skipped without
// a CUDA device (fails instead under DLRM_REQUIRE_CUDA=1). The checks that
// run on any machine (a device table refused where the step exchanges, or
// without a GPU) are in model_test.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/device.h"
#include "cuda_test_util.h"
#include "data/synthetic.h"
#include "model/checkpoint.h"
#include "model/model.h"

namespace dlrm::model {
namespace {

using dlrm::testing::ExpectCloseToScale;

struct DeviceCase {
  const char* name;
  Interaction interaction;
  OptimizerConfig::Type optimizer;
  // Every other table stays in host memory (STORAGE_HOST): both kinds of
  // columns in one interaction input.
  bool mixed;
  // When > 0, the device tables' TableConfig.device_cache_rows: the device
  // cache in front of the tables in host memory (the 1000-row table
  // evicts; the others fit).
  int64_t device_cache_rows = 0;
};

// Four tables of dim 16 (the kernels' float4 path): one-hot, multi-hot
// with sum and with mean pooling (some bags empty), and a 3-row table every
// sample hits (long runs of one row in the sparse backward).
ModelConfig CaseConfig(const DeviceCase& c) {
  auto parsed = ParseModelConfigText(R"pb(
    num_dense_features: 5
    embedding_dim: 16
    tables { name: "one_hot" rows: 1000 }
    tables { name: "sum" rows: 300 multi_hot_size: 4 }
    tables { name: "mean" rows: 200 multi_hot_size: 3 pooling: POOLING_MEAN }
    tables { name: "tiny" rows: 3 multi_hot_size: 2 }
    bottom_mlp: [ 32, 16 ]
    top_mlp: [ 32, 1 ]
    dense_optimizer { learning_rate: 0.05 }
    sparse_optimizer { learning_rate: 0.05 }
    dcn_num_layers: 2
    dcn_low_rank_dim: 8
    seed: 11
  )pb");
  EXPECT_TRUE(parsed.ok()) << parsed.status();
  ModelConfig config = *parsed;
  config.set_interaction(c.interaction);
  if (c.interaction != INTERACTION_DCN) {
    config.clear_dcn_num_layers();
    config.clear_dcn_low_rank_dim();
  }
  config.mutable_dense_optimizer()->set_type(c.optimizer);
  config.mutable_sparse_optimizer()->set_type(c.optimizer);
  auto normalized = NormalizeModelConfig(config);
  EXPECT_TRUE(normalized.ok()) << normalized.status();
  return *normalized;
}

data::Batch Batch(const ModelConfig& c, int64_t n, uint64_t seed) {
  data::SyntheticOptions o;
  o.sample_seed = seed;
  auto src = data::MakeSyntheticSource(c, o);
  EXPECT_TRUE(src.ok()) << src.status();
  data::Batch b;
  if (n == 0) {
    b.Reset(c.num_dense_features(), c.tables_size());
    return b;
  }
  auto more = (*src)->Next(n, &b);
  EXPECT_TRUE(more.ok() && *more);
  return b;
}

class CudaModelTest : public ::testing::TestWithParam<DeviceCase> {};

// Tolerance: the dense part's GEMMs sum in cuBLAS's order (TF32 off: its
// 10-bit mantissas would not meet 1e-4), the row-wise Adagrad row sums and
// chunked long runs in the kernels' order; after a few steps every weight
// agrees within 1e-4 of the tensor's scale (as CudaBackendTest and the
// store tests allow per step).
TEST_P(CudaModelTest, DeviceTablesTrainLikeTheCpu) {
  DLRM_SKIP_WITHOUT_CUDA();
  const DeviceCase c = GetParam();
  const ModelConfig cpu_config = CaseConfig(c);
  ModelConfig gpu_config = cpu_config;
  gpu_config.set_device(DEVICE_CUDA);
  gpu_config.set_gpu_disable_tf32(true);
  for (int k = 0; k < gpu_config.tables_size(); ++k) {
    if (!c.mixed || k % 2 == 0) {
      gpu_config.mutable_tables(k)->set_storage(STORAGE_DEVICE);
      gpu_config.mutable_tables(k)->set_device_cache_rows(c.device_cache_rows);
    }
  }
  auto cpu = Model::Create(cpu_config);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  auto gpu = Model::Create(gpu_config);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  int steps = 0;
  for (const int64_t n : {64, 0, 131, 7, 512}) {
    SCOPED_TRACE(::testing::Message() << "batch " << n);
    const data::Batch b = Batch(cpu_config, n, 100 + n);
    auto want = (*cpu)->TrainStep(b);
    ASSERT_TRUE(want.ok()) << want.status();
    auto got = (*gpu)->TrainStep(b);
    ASSERT_TRUE(got.ok()) << got.status();
    ++steps;
    if (n > 0) EXPECT_NEAR(got->loss, want->loss, 1e-4 * want->loss);
  }
  EXPECT_EQ((*gpu)->steps(), steps);
  for (int k = 0; k < cpu_config.tables_size(); ++k) {
    std::vector<float> want, got;
    ASSERT_TRUE((*cpu)->GatherTable(k, &want).ok());
    ASSERT_TRUE((*gpu)->GatherTable(k, &got).ok());
    ExpectCloseToScale(got, want, 1e-4, cpu_config.tables(k).name());
    EXPECT_EQ((*gpu)->WholeStore(k)->step(), (*cpu)->WholeStore(k)->step());
  }
  const std::vector<dense::ParamRef>& pw = (*cpu)->dense_params();
  const std::vector<dense::ParamRef>& pg = (*gpu)->dense_params();
  ASSERT_EQ(pg.size(), pw.size());
  for (size_t i = 0; i < pw.size(); ++i) {
    ExpectCloseToScale({pg[i].value, static_cast<size_t>(pg[i].size)},
                       {pw[i].value, static_cast<size_t>(pw[i].size)}, 1e-4,
                       pw[i].name);
  }
  const data::Batch eval = Batch(cpu_config, 300, 7);
  std::vector<float> want, got;
  ASSERT_TRUE((*cpu)->Predict(eval, &want).ok());
  ASSERT_TRUE((*gpu)->Predict(eval, &got).ok());
  ExpectCloseToScale(got, want, 1e-4, "predictions");

  // A checkpoint of the device tables restores bitwise onto the GPU (the
  // config's STORAGE_DEVICE) and onto the CPU (into host memory).
  const std::string dir =
      (std::filesystem::temp_directory_path() /
       ("cuda_model_test_" + std::to_string(::getpid()) + "_" + c.name))
          .string();
  std::filesystem::remove_all(dir);
  ASSERT_TRUE(SaveCheckpoint(**gpu, dir).ok());
  auto checksum = (*gpu)->WeightChecksum();
  ASSERT_TRUE(checksum.ok()) << checksum.status();
  auto on_gpu = LoadCheckpoint(dir, /*weights_only=*/false);
  ASSERT_TRUE(on_gpu.ok()) << on_gpu.status();
  EXPECT_EQ((*on_gpu)->WeightChecksum().value(), *checksum);
  auto on_cpu = LoadCheckpointOn(dir, /*weights_only=*/false, DEVICE_CPU);
  ASSERT_TRUE(on_cpu.ok()) << on_cpu.status();
  EXPECT_EQ((*on_cpu)->WeightChecksum().value(), *checksum);
  // The restored GPU model goes on as the original does.
  const data::Batch next = Batch(cpu_config, 200, 9);
  auto a = (*gpu)->TrainStep(next);
  auto b = (*on_gpu)->TrainStep(next);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->loss, b->loss);
  EXPECT_EQ((*on_gpu)->WeightChecksum().value(),
            (*gpu)->WeightChecksum().value());
  std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, CudaModelTest,
    ::testing::Values(
        DeviceCase{"DotSgd", INTERACTION_DOT, OptimizerConfig::SGD, false},
        DeviceCase{"DotRowwiseAdagrad", INTERACTION_DOT,
                   OptimizerConfig::ROWWISE_ADAGRAD, false},
        DeviceCase{"DotAdamMixed", INTERACTION_DOT, OptimizerConfig::ADAM,
                   true},
        DeviceCase{"CatSgdMixed", INTERACTION_CAT, OptimizerConfig::SGD, true},
        DeviceCase{"DcnAdagrad", INTERACTION_DCN, OptimizerConfig::ADAGRAD,
                   false},
        // 480 slots: more than the unique ids of one table in the 512
        // batch, fewer than the one-hot table's 1000 rows.
        DeviceCase{"DotAdamCached", INTERACTION_DOT, OptimizerConfig::ADAM,
                   true, 480}),
    [](const ::testing::TestParamInfo<DeviceCase>& info) {
      return info.param.name;
    });

}  // namespace
}  // namespace dlrm::model
