// The model's step on a GPU with its tables in device memory
// (STORAGE_DEVICE: embedding::cuda::CudaStore, or the device cache with
// device_cache_rows over host memory or RocksDB, pooling into, and updating
// from, the CUDA dense backend's device buffers on its stream) against the same
// model on the CPU, and checkpoints between the two; the exchanges' CUDA column
// copies against their CPU reference; and the step across rank processes
// sharing the GPU through a host-staged communicator, and on one rank over the
// one-GPU communicator, against one CPU process. Skipped without a CUDA
// device (fails instead under DLRM_REQUIRE_CUDA=1). The checks that run on
// any machine (a device table refused without a device communicator, or
// without a GPU; the exchanges staged over the CPU Device) are in
// model_test and hybrid_test.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "comm/coordinator.h"
#include "comm/gloo_communicator.h"
#include "comm/host_staged_communicator.h"
#if defined(DLRM_TEST_NCCL)
#include "comm/factory.h"
#endif
#include "core/config.h"
#include "core/device.h"
#include "core/status.h"
#include "data/synthetic.h"
#include "embedding/sharding.h"
#include "model/checkpoint.h"
#include "model/exchange_memory.h"
#include "model/model.h"
#include "tests/support/cuda_test_util.h"
#include "tests/support/process.h"
#include "tests/support/ranks.h"
#include "tests/support/sharding.h"
#include "tests/support/synthetic.h"

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
  // With device_cache_rows: the caches backed by RocksDB
  // (device_cache_backing STORAGE_ROCKSDB) behind a row cache of 100 rows,
  // not by host memory.
  bool over_rocksdb = false;
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
  if (n == 0) {
    data::Batch b;
    b.Reset(c.num_dense_features(), c.tables_size());
    return b;
  }
  return test::SyntheticSamples(c, n, seed);
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
      if (c.over_rocksdb) {
        gpu_config.mutable_tables(k)->set_device_cache_backing(STORAGE_ROCKSDB);
      }
    }
  }
  const std::string rows_dir =
      (std::filesystem::temp_directory_path() /
       ("cuda_model_test_rows_" + std::to_string(::getpid()) + "_" + c.name))
          .string();
  if (c.over_rocksdb) {
    gpu_config.mutable_rocksdb()->set_path(rows_dir);
    gpu_config.mutable_rocksdb()->set_cache_rows(100);
    auto normalized = NormalizeModelConfig(gpu_config);
    ASSERT_TRUE(normalized.ok()) << normalized.status();
    gpu_config = *normalized;
  }
  auto cpu = Model::Create(cpu_config);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  auto gpu = Model::Create(gpu_config);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  int steps = 0;
  const std::vector<int64_t> sizes = {64, 0, 131, 7, 512};
  StepResult last;
  for (size_t i = 0; i < sizes.size(); ++i) {
    const int64_t n = sizes[i];
    SCOPED_TRACE(::testing::Message() << "batch " << n);
    const data::Batch b = Batch(cpu_config, n, 100 + n);
    // The next batch is prefetched on the GPU model (the device caches
    // stage its rows in the background while the step computes).
    const data::Batch next =
        Batch(cpu_config, i + 1 < sizes.size() ? sizes[i + 1] : 0,
              i + 1 < sizes.size() ? 100 + sizes[i + 1] : 0);
    auto want = (*cpu)->TrainStep(b);
    ASSERT_TRUE(want.ok()) << want.status();
    auto got = (*gpu)->TrainStep(b, &next);
    ASSERT_TRUE(got.ok()) << got.status();
    ++steps;
    if (n > 0) {
      EXPECT_NEAR(got->loss, want->loss, 1e-4 * want->loss);
    }
    last = *std::move(got);
  }
  EXPECT_EQ((*gpu)->steps(), steps);
  if (c.device_cache_rows > 0) {
    // Every device-cached table's counters, as of the last prepare.
    ASSERT_FALSE(last.stores.empty());
    int64_t misses = 0;
    for (const RankTableStore& s : last.stores) {
      EXPECT_TRUE(s.device) << s.table;
      EXPECT_EQ(s.cache_rows, std::min(c.device_cache_rows,
                                       cpu_config.tables(s.table).rows()));
      misses += s.metrics.misses;
    }
    EXPECT_GT(misses, 0);
  }
  for (int k = 0; k < cpu_config.tables_size(); ++k) {
    std::vector<float> want, got;
    ASSERT_TRUE((*cpu)->GatherTable(k, &want).ok());
    ASSERT_TRUE((*gpu)->GatherTable(k, &got).ok());
    ExpectCloseToScale(got, want, 1e-4, cpu_config.tables(k).name());
    EXPECT_EQ((*gpu)->shards().WholeStore(k)->step(),
              (*cpu)->shards().WholeStore(k)->step());
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
  on_cpu->reset();
  on_gpu->reset();
  gpu->reset();
  std::filesystem::remove_all(rows_dir);
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
                   true, 480},
        // The same caches over RocksDB, itself behind a 100-row host cache.
        DeviceCase{"DotAdagradCachedOverRocksDb", INTERACTION_DOT,
                   OptimizerConfig::ROWWISE_ADAGRAD, true, 480, true}),
    [](const ::testing::TestParamInfo<DeviceCase>& info) {
      return info.param.name;
    });

// ------------------------------------------------ the exchanges' copies

// Random column blocks (copies, sums, scaled rows, zeros, in place, odd
// strides) through the CUDA exchange memory equal the CPU reference
// bitwise: both round each multiply and add on its own.
TEST(CudaExchangeMemoryTest, ColumnsMatchTheCpuReferenceBitwise) {
  DLRM_SKIP_WITHOUT_CUDA();
  auto stream = cuda::CudaStream::Create();
  ASSERT_TRUE(stream.ok()) << stream.status();
  auto gpu = MakeCudaExchangeMemory(stream->get());
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  std::unique_ptr<ExchangeMemory> cpu = MakeHostExchangeMemory();
  std::printf("seed %llu\n",
              static_cast<unsigned long long>(dlrm::testing::kCudaTestSeed));
  Rng rng(dlrm::testing::kCudaTestSeed);
  constexpr int64_t kRows = 37, kWidth = 29, kSize = kRows * kWidth;
  const std::vector<float> a = dlrm::testing::RandomFloats(rng, kSize);
  const std::vector<float> b = dlrm::testing::RandomFloats(rng, kSize);
  std::vector<float> scale = dlrm::testing::RandomFloats(rng, kRows);
  scale[3] = 0.0f;
  // The same buffers in both memories: kSend holds a, kRecv b, kScale the
  // row factors.
  std::vector<float*> g(3), c(3);
  const ExchangeMemory::Slot slots[] = {
      ExchangeMemory::kSend, ExchangeMemory::kRecv, ExchangeMemory::kScale};
  const std::vector<float>* init[] = {&a, &b, &scale};
  for (int i = 0; i < 3; ++i) {
    const int64_t n = static_cast<int64_t>(init[i]->size());
    g[i] = (*gpu)->Buffer(slots[i], n).value();
    c[i] = cpu->Buffer(slots[i], n).value();
    ASSERT_TRUE((*gpu)->Upload(init[i]->data(), n, g[i], n, 1, n).ok());
    ASSERT_TRUE(cpu->Upload(init[i]->data(), n, c[i], n, 1, n).ok());
  }
  auto blocks = [](const std::vector<float*>& m) {
    std::vector<ColumnBlock> out;
    ColumnBlock copy{m[0] + 2, kWidth, m[1] + 5, kWidth, kRows, 7};
    ColumnBlock sum{m[0] + 11, kWidth, m[1] + 5, kWidth, kRows, 7};
    sum.accumulate = true;
    ColumnBlock scaled{m[1] + 5, kWidth, m[1] + 5, kWidth, kRows, 7};
    scaled.row_scale = m[2];
    ColumnBlock zeros{nullptr, 0, m[1] + 20, kWidth, kRows - 1, 9};
    ColumnBlock packed{m[0] + 1, kWidth, m[0] + kSize - 3 * 13, 13, 3, 13};
    ColumnBlock none{m[0], kWidth, m[1], kWidth, 0, 4};
    return std::vector<ColumnBlock>{copy, sum, scaled, zeros, packed, none};
  };
  ASSERT_TRUE((*gpu)->Columns(blocks(g)).ok());
  ASSERT_TRUE(cpu->Columns(blocks(c)).ok());
  // Columns of a host matrix into a strided block.
  ASSERT_TRUE(
      (*gpu)->Upload(b.data() + 3, kWidth, g[0] + 4, kWidth, 5, 6).ok());
  ASSERT_TRUE(cpu->Upload(b.data() + 3, kWidth, c[0] + 4, kWidth, 5, 6).ok());
  for (int i = 0; i < 2; ++i) {
    std::vector<float> got(kSize), want(kSize);
    ASSERT_TRUE((*gpu)->Download(got.data(), g[i], kSize).ok());
    ASSERT_TRUE(cpu->Download(want.data(), c[i], kSize).ok());
    dlrm::testing::ExpectBitwiseEqual(got, want, absl::StrCat("buffer ", i));
  }
  ColumnBlock bad{g[0], 3, g[1], kWidth, 2, 4};
  EXPECT_EQ((*gpu)->Columns({&bad, 1}).code(),
            absl::StatusCode::kInvalidArgument);
}

// Upload's source may be rewritten as soon as the call returns (the
// model's loss is a stack variable): 64 MiB of pageable memory, rewritten
// at once, then read back as it was uploaded.
TEST(CudaExchangeMemoryTest, UploadSourceMayBeRewrittenOnReturn) {
  DLRM_SKIP_WITHOUT_CUDA();
  auto stream = cuda::CudaStream::Create();
  ASSERT_TRUE(stream.ok()) << stream.status();
  auto gpu = MakeCudaExchangeMemory(stream->get());
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  constexpr int64_t kCount = int64_t{1} << 24;
  auto dst = (*gpu)->Buffer(ExchangeMemory::kSend, kCount);
  ASSERT_TRUE(dst.ok()) << dst.status();
  std::vector<float> host(kCount);
  for (int64_t i = 0; i < kCount; ++i) host[i] = static_cast<float>(i % 4099);
  const std::vector<float> want = host;
  ASSERT_TRUE(
      (*gpu)->Upload(host.data(), kCount, *dst, kCount, 1, kCount).ok());
  std::fill(host.begin(), host.end(), -1.0f);
  std::vector<float> got(kCount);
  ASSERT_TRUE((*gpu)->Download(got.data(), *dst, kCount).ok());
  dlrm::testing::ExpectBitwiseEqual(got, want, "uploaded");
}

// ----------------------- CUDA graphs and the double-buffered step staging

struct GraphCase {
  const char* name;
  Interaction interaction;
  OptimizerConfig::Type optimizer;
  // A warm-up learning-rate schedule on both optimizers: the rate changes
  // every step, so a replayed graph must not have baked it in.
  bool warmup;
  // As DeviceCase::mixed: every other table in host memory (the step then
  // waits for the interaction gradient, and uploads host columns).
  bool mixed;
  // dense_precision PRECISION_BF16 (the bf16 GEMMs and conversions in the
  // graphs).
  bool bf16 = false;
};

ModelConfig GraphConfig(const GraphCase& c, bool graphs) {
  // A layer-wise optimizer (LAMB, LARS) is the dense one only; the tables
  // then take Adagrad.
  const bool layer_wise = c.optimizer == OptimizerConfig::LAMB ||
                          c.optimizer == OptimizerConfig::LARS;
  ModelConfig config = CaseConfig(
      {c.name, c.interaction,
       layer_wise ? OptimizerConfig::ADAGRAD : c.optimizer, c.mixed});
  if (layer_wise) {
    OptimizerConfig* dense = config.mutable_dense_optimizer();
    dense->set_type(c.optimizer);
    dense->set_weight_decay(0.01f);
    if (c.optimizer == OptimizerConfig::LARS) {
      dense->set_momentum(0.9f);
      dense->set_trust_coefficient(0.001f);
    }
    auto normalized = NormalizeModelConfig(config);
    EXPECT_TRUE(normalized.ok()) << normalized.status();
    if (normalized.ok()) config = *normalized;
  }
  config.set_device(DEVICE_CUDA);
  config.set_gpu_cuda_graphs(graphs);
  if (c.bf16) config.set_dense_precision(PRECISION_BF16);
  for (int k = 0; k < config.tables_size(); ++k) {
    if (!c.mixed || k % 2 == 0) {
      config.mutable_tables(k)->set_storage(STORAGE_DEVICE);
    }
  }
  if (c.warmup) {
    for (OptimizerConfig* o : {config.mutable_dense_optimizer(),
                               config.mutable_sparse_optimizer()}) {
      o->mutable_schedule()->set_warmup_steps(6);
      o->mutable_schedule()->set_warmup_start_factor(0.1f);
    }
  }
  return config;
}

// Batches of 64 (warm-up, capture, replays), then 131 (larger: every graph
// dropped), then 64 again (new graphs on the grown buffers), then 0 and 7.
constexpr int64_t kGraphBatches[] = {64, 64, 64, 64, 131, 131, 131,
                                     64, 64, 64, 0,  7,   7,   7};

struct RunReport {
  std::vector<double> losses;  // NaN where not read
  std::vector<float> dense;
  std::vector<std::vector<float>> tables;
  dense::GraphCounts graphs;
};

// Trains kGraphBatches on a model of `config`, reading the loss of step i
// when i % read_every == read_every - 1.
RunReport TrainGraphRun(const ModelConfig& config, int read_every) {
  RunReport r;
  auto m = Model::Create(config);
  EXPECT_TRUE(m.ok()) << m.status();
  if (!m.ok()) return r;
  uint64_t seed = 500;
  int i = 0;
  for (const int64_t n : kGraphBatches) {
    const data::Batch b = Batch(config, n, seed++);
    const bool read = i++ % read_every == read_every - 1;
    auto step = (*m)->TrainStep(b, nullptr, read);
    EXPECT_TRUE(step.ok()) << step.status();
    if (!step.ok()) return r;
    // An empty global batch's mean is 0 / 0.
    EXPECT_EQ(std::isnan(step->loss), !read || n == 0) << "step " << i;
    r.losses.push_back(read ? step->loss
                            : std::numeric_limits<double>::quiet_NaN());
  }
  for (const dense::ParamRef& p : (*m)->dense_params()) {
    r.dense.insert(r.dense.end(), p.value, p.value + p.size);
  }
  for (int k = 0; k < config.tables_size(); ++k) {
    r.tables.emplace_back();
    EXPECT_TRUE((*m)->GatherTable(k, &r.tables.back()).ok());
  }
  r.graphs = (*m)->dense_graph_counts();
  return r;
}

// Bitwise: the same kernels in the same order on the same data.
void ExpectSameBits(const RunReport& got, const RunReport& want) {
  ASSERT_EQ(got.losses.size(), want.losses.size());
  for (size_t i = 0; i < want.losses.size(); ++i) {
    if (std::isnan(got.losses[i]) || std::isnan(want.losses[i])) continue;
    EXPECT_EQ(got.losses[i], want.losses[i]) << "step " << i;
  }
  EXPECT_EQ(got.dense, want.dense);
  ASSERT_EQ(got.tables.size(), want.tables.size());
  for (size_t k = 0; k < want.tables.size(); ++k) {
    EXPECT_EQ(got.tables[k], want.tables[k]) << "table " << k;
  }
}

class CudaGraphsTest : public ::testing::TestWithParam<GraphCase> {};

// gpu_cuda_graphs on trains bitwise like off: the graphs replay the same
// kernels on the same pointers, Update's graph reads the optimizer's
// changing constants (the warm-up rate, Adam's and LAMB's bias
// corrections) from the device memory each step's upload rewrites, and the
// batch size change drops and remakes the graphs keyed by batch size.
TEST_P(CudaGraphsTest, GraphsTrainLikePlainLaunches) {
  DLRM_SKIP_WITHOUT_CUDA();
  const GraphCase c = GetParam();
  const RunReport plain = TrainGraphRun(GraphConfig(c, false), 1);
  const RunReport graphs = TrainGraphRun(GraphConfig(c, true), 1);
  ExpectSameBits(graphs, plain);
  // The graphs did run: per graphed call, captures at 64, 131, 64 again
  // and 7 (4), replays 2 + 1 + 1 + 1 (5), one drop at 131; Update's one
  // graph captured on the second step and replayed on every later one
  // (the empty batch's too), never dropped; none failed.
  const dense::GraphCounts& g = graphs.graphs;
  EXPECT_EQ(g.failed_captures, 0) << g.last_failure;
  constexpr int64_t kSteps = std::size(kGraphBatches);
  EXPECT_EQ(g.update_captures, 1);
  EXPECT_EQ(g.update_replays, kSteps - 2);
  const int64_t call_captures = g.captures - g.update_captures;
  const int64_t call_replays = g.replays - g.update_replays;
  EXPECT_GE(call_captures, 4 * 4);
  EXPECT_EQ(call_captures % 4, 0);
  EXPECT_EQ(call_replays * 4, call_captures * 5);
  EXPECT_EQ(g.invalidations, 1);
  EXPECT_EQ(plain.graphs.captures + plain.graphs.replays, 0);
}

// Reading the loss only every third step (the step then does not wait for
// the device, and the next one fills the other staging set while its
// kernels run) trains bitwise like reading it every step, and the losses
// read agree; with graphs too.
TEST_P(CudaGraphsTest, LossReadEveryThirdStepTrainsLikeEveryStep) {
  DLRM_SKIP_WITHOUT_CUDA();
  const GraphCase c = GetParam();
  for (const bool graphs : {false, true}) {
    SCOPED_TRACE(graphs ? "graphs" : "plain");
    const RunReport every = TrainGraphRun(GraphConfig(c, graphs), 1);
    const RunReport third = TrainGraphRun(GraphConfig(c, graphs), 3);
    ExpectSameBits(third, every);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cases, CudaGraphsTest,
    ::testing::Values(GraphCase{"dot_sgd", INTERACTION_DOT,
                                OptimizerConfig::SGD, false, false},
                      GraphCase{"dot_adam_warmup", INTERACTION_DOT,
                                OptimizerConfig::ADAM, true, false},
                      GraphCase{"dot_adam_warmup_mixed", INTERACTION_DOT,
                                OptimizerConfig::ADAM, true, true},
                      GraphCase{"dcn_adagrad_mixed", INTERACTION_DCN,
                                OptimizerConfig::ADAGRAD, false, true},
                      GraphCase{"cat_sgd_warmup_mixed", INTERACTION_CAT,
                                OptimizerConfig::SGD, true, true},
                      GraphCase{"dot_adam_warmup_mixed_bf16", INTERACTION_DOT,
                                OptimizerConfig::ADAM, true, true, true},
                      GraphCase{"dcn_adagrad_warmup", INTERACTION_DCN,
                                OptimizerConfig::ADAGRAD, true, false},
                      GraphCase{"dot_lamb_warmup_mixed", INTERACTION_DOT,
                                OptimizerConfig::LAMB, true, true},
                      GraphCase{"dcn_lars_warmup", INTERACTION_DCN,
                                OptimizerConfig::LARS, true, false},
                      GraphCase{"dot_lamb_warmup_bf16", INTERACTION_DOT,
                                OptimizerConfig::LAMB, true, false, true}),
    [](const ::testing::TestParamInfo<GraphCase>& info) {
      return std::string(info.param.name);
    });

// ------------------------------------------- the step across device ranks

// A model whose every table (or, with `host_tables`, every other one) is
// in device memory, sharded as `kind` says over `world` ranks: "table",
// "column", "row", "mixed" (table-, column-, row-wise and data-parallel),
// or "none" (the plan decides).
ModelConfig RanksConfig(const std::string& kind, int world, bool host_tables,
                        bool on_gpu) {
  ModelConfig c =
      CaseConfig({"ranks", INTERACTION_DOT, OptimizerConfig::ADAGRAD, false});
  if (on_gpu) {
    c.set_device(DEVICE_CUDA);
    c.set_gpu_disable_tf32(true);
  }
  for (int k = 0; k < c.tables_size(); ++k) {
    TableConfig* t = c.mutable_tables(k);
    if (on_gpu && (!host_tables || k % 2 == 0)) {
      t->set_storage(STORAGE_DEVICE);
    }
    test::ShardTableAs(kind, k, world, t);
  }
  return c;
}

constexpr int64_t kRanksBatches[] = {64, 7, 131, 40};

// What rank 0 reports: every step's loss, the dense weights, then every
// table gathered whole.
struct RanksReport {
  std::vector<double> losses;
  std::vector<float> dense;
  std::vector<std::vector<float>> tables;
};

absl::Status Collect(Model& m, RanksReport* r) {
  for (const dense::ParamRef& p : m.dense_params()) {
    r->dense.insert(r->dense.end(), p.value, p.value + p.size);
  }
  for (int k = 0; k < m.config().tables_size(); ++k) {
    r->tables.emplace_back();
    RETURN_IF_ERROR(m.GatherTable(k, &r->tables.back()));
  }
  return absl::OkStatus();
}

void WriteFloats(std::ofstream& f, const std::vector<float>& v) {
  const uint64_t n = v.size();
  f.write(reinterpret_cast<const char*>(&n), sizeof(n));
  f.write(reinterpret_cast<const char*>(v.data()), n * sizeof(float));
}

std::vector<float> ReadFloats(std::ifstream& f) {
  uint64_t n = 0;
  f.read(reinterpret_cast<char*>(&n), sizeof(n));
  std::vector<float> v(n);
  f.read(reinterpret_cast<char*>(v.data()), n * sizeof(float));
  return v;
}

// One rank process: `kind`/`host_tables` as RanksConfig, the output and
// backward dists over a host-staged communicator on CUDA device 0 (which
// every rank shares), control and ids over Gloo.
absl::Status RunRank(const std::string& kind, bool host_tables, int world,
                     int rank, const std::string& coordinator,
                     const std::string& out) {
  const ModelConfig c = RanksConfig(kind, world, host_tables, true);
  ASSIGN_OR_RETURN(embedding::ShardingPlan plan, test::PlanOver(c, world));
  comm::GlooOptions go = test::RankGloo(rank, world, coordinator, "control",
                                        /*connect=*/60, /*op=*/60);
  ASSIGN_OR_RETURN(std::unique_ptr<comm::Communicator> comm,
                   comm::ConnectGloo(go));
  go.job_id = "staged";
  ASSIGN_OR_RETURN(std::unique_ptr<comm::Communicator> host,
                   comm::ConnectGloo(go));
  ASSIGN_OR_RETURN(
      std::unique_ptr<comm::Communicator> device_comm,
      comm::MakeHostStagedCommunicator(std::move(host), DeviceKind::kCuda, 0));
  ASSIGN_OR_RETURN(
      std::unique_ptr<Model> m,
      Model::Create(c, plan, comm.get(), nullptr, device_comm.get()));
  RanksReport report;
  uint64_t seed = 300;
  for (const int64_t n : kRanksBatches) {
    const data::Batch global = Batch(c, n, seed++);
    data::Batch local;
    global.Slice(n * rank / world, n * (rank + 1) / world, &local);
    ASSIGN_OR_RETURN(StepResult r, m->TrainStep(local));
    report.losses.push_back(r.loss);
  }
  RETURN_IF_ERROR(Collect(*m, &report));
  if (rank != 0) return absl::OkStatus();
  std::ofstream f(out, std::ios::binary);
  WriteFloats(f, {report.losses.begin(), report.losses.end()});
  WriteFloats(f, report.dense);
  for (const auto& t : report.tables) WriteFloats(f, t);
  return f ? absl::OkStatus() : absl::InternalError("cannot write " + out);
}

// The single-process CPU model (host tables) on the same global batches.
RanksReport CpuReference(const std::string& kind, int world) {
  const ModelConfig c = RanksConfig(kind, world, false, false);
  auto m = Model::Create(c);
  EXPECT_TRUE(m.ok()) << m.status();
  RanksReport r;
  if (!m.ok()) return r;
  uint64_t seed = 300;
  for (const int64_t n : kRanksBatches) {
    auto step = (*m)->TrainStep(Batch(c, n, seed++));
    EXPECT_TRUE(step.ok()) << step.status();
    r.losses.push_back(step.ok() ? step->loss : 0);
  }
  EXPECT_TRUE(Collect(**m, &r).ok());
  return r;
}

// Tolerance as DeviceTablesTrainLikeTheCpu's (1e-4 of each tensor's
// scale): the GPU's GEMM and kernel sums, the ranks' dense all-reduce and
// row-wise shards' partial sums all reorder float sums.
void ExpectLikeReference(const RanksReport& got, const RanksReport& want) {
  ASSERT_EQ(got.losses.size(), want.losses.size());
  for (size_t i = 0; i < want.losses.size(); ++i) {
    EXPECT_NEAR(got.losses[i], want.losses[i], 1e-4 * want.losses[i])
        << "step " << i;
  }
  ExpectCloseToScale(got.dense, want.dense, 1e-4, "dense weights");
  ASSERT_EQ(got.tables.size(), want.tables.size());
  for (size_t k = 0; k < want.tables.size(); ++k) {
    ExpectCloseToScale(got.tables[k], want.tables[k], 1e-4,
                       absl::StrCat("table ", k));
  }
}

struct RanksCase {
  const char* kind;
  bool host_tables;
  int world;
};

class CudaRanksTest : public ::testing::TestWithParam<RanksCase> {};

// 2-3 rank processes on one GPU, their pooled vectors and gradients
// exchanged through a host-staged communicator over CUDA, train like one
// CPU process.
TEST_P(CudaRanksTest, SharedGpuRanksTrainLikeOneProcess) {
  DLRM_SKIP_WITHOUT_CUDA();
  const RanksCase p = GetParam();
  comm::CoordinatorServerOptions so;
  auto coordinator = comm::CoordinatorServer::Start(so);
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  const std::string out =
      (std::filesystem::temp_directory_path() /
       absl::StrCat("cuda_ranks_", ::getpid(), "_", p.kind, ".bin"))
          .string();
  const std::vector<int> codes = test::RunRanks(
      p.world,
      [&](int r) -> std::vector<std::string> {
        return {"--cuda-rank-worker",
                p.kind,
                p.host_tables ? "1" : "0",
                std::to_string(p.world),
                std::to_string(r),
                (*coordinator)->address(),
                out};
      },
      300);
  for (size_t r = 0; r < codes.size(); ++r) {
    ASSERT_EQ(codes[r], 0) << "rank " << r << " failed";
  }
  RanksReport got;
  {
    std::ifstream f(out, std::ios::binary);
    const std::vector<float> losses = ReadFloats(f);
    got.losses.assign(losses.begin(), losses.end());
    got.dense = ReadFloats(f);
    for (int k = 0; k < 4; ++k) got.tables.push_back(ReadFloats(f));
    ASSERT_TRUE(f.good()) << "short report " << out;
  }
  std::filesystem::remove(out);
  RanksReport want = CpuReference(p.kind, p.world);
  // The report holds float losses.
  for (double& l : want.losses) l = static_cast<float>(l);
  ExpectLikeReference(got, want);
}

INSTANTIATE_TEST_SUITE_P(Kinds, CudaRanksTest,
                         ::testing::Values(RanksCase{"table", false, 2},
                                           RanksCase{"column", false, 3},
                                           RanksCase{"row", false, 2},
                                           RanksCase{"mixed", false, 3},
                                           RanksCase{"mixed", true, 2}),
                         [](const ::testing::TestParamInfo<RanksCase>& info) {
                           return absl::StrCat(
                               info.param.kind,
                               info.param.host_tables ? "_host_tables" : "",
                               "_r", info.param.world);
                         });

// One process of RanksConfig("none", 1, host_tables) on the GPU over
// `plan`, its device exchanges on `device_comm` (null: no communicator,
// Model::Create(config)); what it reports after kRanksBatches.
absl::Status TrainOneRank(const ModelConfig& c,
                          const embedding::ShardingPlan* plan,
                          comm::Communicator* device_comm, RanksReport* got) {
  std::unique_ptr<comm::Communicator> host = comm::MakeSingleRankCommunicator();
  std::unique_ptr<Model> m;
  if (plan == nullptr) {
    ASSIGN_OR_RETURN(m, Model::Create(c));
  } else {
    ASSIGN_OR_RETURN(m,
                     Model::Create(c, *plan, host.get(), nullptr, device_comm));
  }
  uint64_t seed = 300;
  for (const int64_t n : kRanksBatches) {
    ASSIGN_OR_RETURN(const StepResult step, m->TrainStep(Batch(c, n, seed++)));
    got->losses.push_back(step.loss);
  }
  return Collect(*m, got);
}

// RanksConfig("none", 1, host tables)'s plan with tables 0 and 1 row-wise
// in two shards on rank 0, so that the exchanges run, in device memory.
embedding::ShardingPlan OneRankRowWisePlan(const ModelConfig& c) {
  embedding::ShardingPlan plan = embedding::WholeTablesPlan(c);
  for (int k : {0, 1}) {
    const int64_t rows = c.tables(k).rows();
    const int dim = c.tables(k).dim();
    plan.tables[k].kind = SHARDING_ROW_WISE;
    plan.tables[k].shards = {{0, 0, rows / 2, 0, dim},
                             {0, rows / 2, rows - rows / 2, 0, dim}};
  }
  return plan;
}

// One rank over the one-GPU device communicator with row-wise tables (two
// shards on the rank, so the exchanges run, in device memory; a device
// table and a host one): like one CPU process.
TEST(CudaRanksTest, OneRankRowWiseDeviceExchangesTrainLikeTheCpu) {
  DLRM_SKIP_WITHOUT_CUDA();
  const ModelConfig c = RanksConfig("none", 1, /*host_tables=*/true, true);
  const embedding::ShardingPlan plan = OneRankRowWisePlan(c);
  ASSERT_TRUE(plan.Validate(c).ok());
  auto device_comm = comm::MakeSingleRankDeviceCommunicator(0);
  ASSERT_TRUE(device_comm.ok()) << device_comm.status();
  RanksReport got;
  ASSERT_TRUE(TrainOneRank(c, &plan, device_comm->get(), &got).ok());
  ExpectLikeReference(got, CpuReference("none", 1));
}

#if defined(DLRM_TEST_NCCL)
// Built into cuda_model_nccl_test only (tests/CMakeLists.txt): it links
// libnccl, which scripts/gpu_lease.sh does not carry.
//
// NCCL at world size 1 (one GPU cannot host two NCCL ranks): the model's
// step over a real one-rank NCCL communicator trains like one process
// without a communicator (whole tables: on one rank the step calls no
// collective) and like the single-rank device communicator (row-wise
// tables, the exchanges in device memory), within ExpectLikeReference's
// tolerance (GPU sums are not promised to be bitwise reproducible run to
// run). NCCL's own collectives at world size 1 are comm_test's
// CommNcclTest.SingleRankCollectivesMatchReference.
TEST(CudaRanksTest, OneRankOverNcclTrainsLikeOneProcess) {
  DLRM_SKIP_WITHOUT_CUDA();
  const ModelConfig c = RanksConfig("none", 1, /*host_tables=*/true, true);
  comm::CommOptions o;
  o.world_size = 1;
  o.memory_space = comm::MemorySpace::kDevice;
  o.backend = comm::CommBackend::kNccl;
  auto nccl = comm::CreateCommunicator(o);
  ASSERT_TRUE(nccl.ok()) << nccl.status();

  RanksReport alone, over_nccl;
  ASSERT_TRUE(TrainOneRank(c, nullptr, nullptr, &alone).ok());
  const embedding::ShardingPlan whole = embedding::WholeTablesPlan(c);
  absl::Status s = TrainOneRank(c, &whole, nccl->get(), &over_nccl);
  ASSERT_TRUE(s.ok()) << s;
  ExpectLikeReference(over_nccl, alone);

  const embedding::ShardingPlan rows = OneRankRowWisePlan(c);
  auto single = comm::MakeSingleRankDeviceCommunicator(0);
  ASSERT_TRUE(single.ok()) << single.status();
  RanksReport row_nccl, row_single;
  s = TrainOneRank(c, &rows, nccl->get(), &row_nccl);
  ASSERT_TRUE(s.ok()) << s;
  s = TrainOneRank(c, &rows, single->get(), &row_single);
  ASSERT_TRUE(s.ok()) << s;
  ExpectLikeReference(row_nccl, row_single);
  ExpectLikeReference(row_nccl, CpuReference("none", 1));
}
#endif  // DLRM_TEST_NCCL

}  // namespace
}  // namespace dlrm::model

int main(int argc, char** argv) {
  if (argc == 8 && std::strcmp(argv[1], "--cuda-rank-worker") == 0) {
    const absl::Status s = dlrm::model::RunRank(
        argv[2], std::strcmp(argv[3], "1") == 0, std::atoi(argv[4]),
        std::atoi(argv[5]), argv[6], argv[7]);
    if (!s.ok()) {
      std::fprintf(stderr, "rank %s: %s\n", argv[5], s.ToString().c_str());
      return 1;
    }
    return 0;
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
