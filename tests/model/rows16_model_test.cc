// Tests of a Model whose tables keep 16-bit rows (weight_precision ROW_FP16
// or ROW_BF16) on RocksDB behind a cache of 10% of their rows: it trains
// bitwise like the same model with the tables in host memory, its
// checkpoints round-trip bit for bit and convert between fp32 and 16-bit
// rows on restore (exactly into fp32, to nearest into 16 bits), and its
// weights export is the host tier's (F32 tensors).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/config.h"
#include "embedding/embedding_store.h"
#include "embedding/row_precision.h"
#include "model/checkpoint.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "model/weights_export.h"
#include "tests/support/store_model.h"
#include "tests/support/synthetic.h"

namespace dlrm::model {
namespace {

namespace fs = std::filesystem;

constexpr uint64_t kModelSeed = 20261202;
constexpr uint64_t kDataSeed = 91;

// Three tables of 1500-3000 rows (the caches hold 10%: rows spill and come
// back every few steps), multi-hot bags of up to 4 ids, `p` rows.
ModelConfig BaseConfig(OptimizerConfig::Type sparse, RowPrecision p) {
  return test::StoreTestConfig(sparse, kModelSeed, p);
}

std::string ScratchDir(const std::string& name) {
  return test::ScratchDir("rows16_model_test", name);
}

// `base` with every table on RocksDB under `dir`, caches of 10% of rows.
ModelConfig OnRocksDb(const ModelConfig& base, const std::string& dir) {
  return test::OnRocksDb(base, dir);
}

// `c` with every table's weight_precision `p`.
ModelConfig WithPrecision(ModelConfig c, RowPrecision p) {
  for (TableConfig& t : *c.mutable_tables()) t.set_weight_precision(p);
  return c;
}

// `count` batches of 32 samples, teacher kDataSeed, sample stream + 1.
std::vector<data::Batch> Batches(const ModelConfig& c, int count) {
  return test::SyntheticBatches(c, count, 32,
                                {.zipf_alpha = 1.05,
                                 .teacher_seed = kDataSeed,
                                 .sample_seed = kDataSeed + 1});
}

std::unique_ptr<Model> Make(const ModelConfig& c) { return test::MakeModel(c); }

// Every table's records (weights as floats, optimizer state) and step, read
// through the stores, then the dense weights.
std::vector<float> Everything(Model& m) {
  std::vector<float> out = test::StoreRecords(m, /*with_steps=*/true);
  for (dense::Mlp* mlp : {&m.bottom(), &m.top()}) {
    for (const dense::Linear& l : mlp->layers()) {
      out.insert(out.end(), l.weight(),
                 l.weight() + static_cast<int64_t>(l.in()) * l.out());
      out.insert(out.end(), l.bias(), l.bias() + l.out());
    }
  }
  return out;
}

// Every table's weights, gathered through the stores.
std::vector<std::vector<float>> Tables(Model& m) {
  std::vector<std::vector<float>> out(m.config().tables_size());
  for (int k = 0; k < m.config().tables_size(); ++k) {
    EXPECT_TRUE(m.GatherTable(k, &out[k]).ok());
  }
  return out;
}

void ExpectBitwiseEqual(const std::vector<float>& a,
                        const std::vector<float>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0)
      << what;
}

struct Case {
  OptimizerConfig::Type sparse;
  RowPrecision precision;
};

std::string CaseName(const testing::TestParamInfo<Case>& info) {
  return absl::StrCat(OptimizerConfig::Type_Name(info.param.sparse), "_",
                      RowPrecision_Name(info.param.precision));
}

class Rows16TierTest : public ::testing::TestWithParam<Case> {};

// 16-bit rows on RocksDB, rows evicted and re-read, with the next batch
// prefetched: every loss, row and prediction is the host tier's.
TEST_P(Rows16TierTest, RocksDbTrainsBitwiseLikeHostMemory) {
  const Case& p = GetParam();
  std::printf("model seed %llu, data seed %llu\n",
              static_cast<unsigned long long>(kModelSeed),
              static_cast<unsigned long long>(kDataSeed));
  const ModelConfig host_config = BaseConfig(p.sparse, p.precision);
  const std::string dir = ScratchDir("equiv");
  auto host = Make(host_config);
  auto rocks = Make(OnRocksDb(host_config, dir));
  ASSERT_TRUE(host && rocks);
  ExpectBitwiseEqual(Everything(*host), Everything(*rocks), "initial");
  constexpr int kSteps = 25;
  const auto batches = Batches(host_config, kSteps);
  ASSERT_NO_FATAL_FAILURE(
      test::TrainBothExpectSameLoss(*host, *rocks, batches, /*prefetch=*/true));
  const embedding::StoreMetrics m = rocks->shards().HostCacheMetrics();
  EXPECT_GT(m.evictions, 0);
  EXPECT_GT(m.rows_read, 0);
  ExpectBitwiseEqual(Everything(*host), Everything(*rocks), "trained");
  std::vector<float> pa, pb;
  ASSERT_TRUE(host->Predict(batches[0], &pa).ok());
  ASSERT_TRUE(rocks->Predict(batches[0], &pb).ok());
  ExpectBitwiseEqual(pa, pb, "predictions");
  rocks.reset();
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(
    Rules, Rows16TierTest,
    ::testing::Values(Case{OptimizerConfig::SGD, ROW_BF16},
                      Case{OptimizerConfig::ROWWISE_ADAGRAD, ROW_FP16},
                      Case{OptimizerConfig::ADAM, ROW_BF16},
                      Case{OptimizerConfig::ADAM, ROW_FP16}),
    CaseName);

// A checkpoint of 16-bit RocksDB tables: restored in place, into a new
// model and into host memory it is the saved rows bit for bit and trains
// on identically; fp32 rows restored into bf16 ones are rounded to nearest,
// and bf16 rows restored into fp32 ones are their values exactly (the same
// plan and tier, so the saved database is not copied as is).
TEST(Rows16CheckpointTest, RoundTripsBitForBitAndConverts) {
  const ModelConfig host_bf16 = BaseConfig(OptimizerConfig::ADAM, ROW_BF16);
  const std::string dir = ScratchDir("rows"), ckpt = ScratchDir("ckpt");
  const std::string dir32 = ScratchDir("rows32"), ckpt32 = ScratchDir("ckpt32");
  const ModelConfig rocks_bf16 = OnRocksDb(host_bf16, dir);
  auto rocks = Make(rocks_bf16);
  ASSERT_TRUE(rocks);
  const auto batches = Batches(host_bf16, 16);
  for (int i = 0; i < 8; ++i) ASSERT_TRUE(rocks->TrainStep(batches[i]).ok());
  ASSERT_TRUE(SaveCheckpoint(*rocks, ckpt).ok());
  const std::vector<float> at_save = Everything(*rocks);
  const auto tables_at_save = Tables(*rocks);
  const std::vector<double> losses = test::TrainLosses(*rocks, batches, 8, 16);
  const std::vector<float> at_end = Everything(*rocks);

  auto restored = RestoreCheckpoint(*rocks, ckpt);
  ASSERT_TRUE(restored.ok()) << restored.status();
  ExpectBitwiseEqual(Everything(*rocks), at_save, "restored in place");
  EXPECT_EQ(test::TrainLosses(*rocks, batches, 8, 16), losses);
  ExpectBitwiseEqual(Everything(*rocks), at_end, "trained on");

  auto loaded = LoadCheckpoint(ckpt, /*weights_only=*/false);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ExpectBitwiseEqual(Everything(**loaded), at_save, "loaded");
  loaded->reset();

  // Into host memory: the same 16-bit rows.
  auto host = Make(host_bf16);
  ASSERT_TRUE(RestoreCheckpoint(*host, ckpt).ok());
  ExpectBitwiseEqual(Everything(*host), at_save, "into host memory");

  // bf16 -> fp32 on RocksDB: the values, exactly.
  const ModelConfig rocks_fp32 =
      OnRocksDb(WithPrecision(host_bf16, ROW_FP32), dir32);
  auto wide = Make(rocks_fp32);
  ASSERT_TRUE(wide);
  ASSERT_TRUE(RestoreCheckpoint(*wide, ckpt).ok());
  EXPECT_EQ(Tables(*wide), tables_at_save);

  // fp32 -> bf16 on RocksDB: each weight rounded to nearest.
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(wide->TrainStep(batches[i]).ok());
  const auto want = Tables(*wide);
  ASSERT_TRUE(SaveCheckpoint(*wide, ckpt32).ok());
  ASSERT_TRUE(RestoreCheckpoint(*rocks, ckpt32).ok());
  const auto got = Tables(*rocks);
  ASSERT_EQ(got.size(), want.size());
  int64_t inexact = 0;
  for (size_t k = 0; k < want.size(); ++k) {
    ASSERT_EQ(got[k].size(), want[k].size());
    for (size_t i = 0; i < want[k].size(); ++i) {
      const float w = want[k][i];
      ASSERT_EQ(got[k][i], embedding::Bf16ToFloat(embedding::FloatToBf16(w)))
          << "table " << k << " element " << i;
      inexact += got[k][i] != w;
    }
  }
  EXPECT_GT(inexact, 0) << "the fp32 rows were all bf16 values already";

  rocks.reset();
  wide.reset();
  for (const std::string& d : {dir, ckpt, dir32, ckpt32}) fs::remove_all(d);
}

// The weights export of 16-bit RocksDB tables: the host tier's file, byte
// for byte (F32 tensors of the rows' values).
TEST(Rows16ExportTest, IsTheHostTiersF32Export) {
  const ModelConfig host_config = BaseConfig(OptimizerConfig::SGD, ROW_FP16);
  const std::string dir = ScratchDir("export_rows"), out = ScratchDir("export");
  fs::create_directories(out);
  auto host = Make(host_config);
  auto rocks = Make(OnRocksDb(host_config, dir));
  ASSERT_TRUE(host && rocks);
  for (const auto& b : Batches(host_config, 6)) {
    ASSERT_TRUE(host->TrainStep(b).ok());
    ASSERT_TRUE(rocks->TrainStep(b).ok());
  }
  const std::string b = test::ExpectSameExport(*host, *rocks, out);
  auto f = SafetensorsFile::Open(b);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ((*f)->DtypeOf("embedding_bags.C1.weight").value(), Dtype::kF32);
  rocks.reset();
  fs::remove_all(dir);
  fs::remove_all(out);
}

}  // namespace
}  // namespace dlrm::model
