// bench/roofline.h: the step's GEMM shapes and FLOPs, the embedding stages'
// bytes, and the fractions of the ceilings (no timing is asserted).
#include "bench/roofline.h"

#include <cmath>

#include "gtest/gtest.h"

namespace dlrm::bench {
namespace {

using model::StageTimes;

ModelConfig Small(Interaction interaction) {
  ModelConfig c;
  c.set_num_dense_features(3);
  c.add_bottom_mlp(4);
  c.add_bottom_mlp(2);
  for (int k = 0; k < 2; ++k) {
    TableConfig* t = c.add_tables();
    t->set_name("t" + std::to_string(k));
    t->set_rows(10);
    t->set_dim(2);
  }
  c.add_top_mlp(3);
  c.add_top_mlp(1);
  c.set_interaction(interaction);
  c.set_dcn_num_layers(2);
  c.set_dcn_low_rank_dim(5);
  return c;
}

struct Want {
  StageTimes::Stage stage;
  char ta, tb;
  int64_t m, n, k;
};

void ExpectShapes(const std::vector<GemmShape>& got,
                  const std::vector<Want>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    SCOPED_TRACE(got[i].what);
    EXPECT_EQ(got[i].stage, want[i].stage);
    EXPECT_EQ(got[i].trans_a, want[i].ta);
    EXPECT_EQ(got[i].trans_b, want[i].tb);
    EXPECT_EQ(got[i].m, want[i].m);
    EXPECT_EQ(got[i].n, want[i].n);
    EXPECT_EQ(got[i].k, want[i].k);
  }
}

// Bottom 3 -> 4 -> 2 (no dX of its first layer), the dot interaction of 3
// vectors (3 pairs: the top MLP's input is 2 + 3 = 5), top 5 -> 3 -> 1.
TEST(RooflineTest, DotModelGemmsAreTheMlpLayers) {
  const int64_t b = 8;
  const auto f = StageTimes::kBottomForward, bb = StageTimes::kBottomBackward;
  const auto tf = StageTimes::kTopForward, tb = StageTimes::kTopBackward;
  ExpectShapes(StepGemms(Small(INTERACTION_DOT), b), {{f, 'N', 'T', b, 4, 3},
                                                      {bb, 'T', 'N', 4, 3, b},
                                                      {f, 'N', 'T', b, 2, 4},
                                                      {bb, 'T', 'N', 2, 4, b},
                                                      {bb, 'N', 'N', b, 4, 2},
                                                      {tf, 'N', 'T', b, 3, 5},
                                                      {tb, 'T', 'N', 3, 5, b},
                                                      {tb, 'N', 'N', b, 5, 3},
                                                      {tf, 'N', 'T', b, 1, 3},
                                                      {tb, 'T', 'N', 1, 3, b},
                                                      {tb, 'N', 'N', b, 3, 1}});
}

// DCN over N = 2 + 2 + 2 = 6 with rank 5: two maps forward and four GEMMs
// backward per layer, and the top MLP over N.
TEST(RooflineTest, DcnModelAddsTheCrossNetworksMaps) {
  const int64_t b = 8;
  const std::vector<GemmShape> gemms = StepGemms(Small(INTERACTION_DCN), b);
  int cross = 0;
  double cross_flops = 0;
  for (const GemmShape& g : gemms) {
    if (g.stage == StageTimes::kInteractionForward ||
        g.stage == StageTimes::kInteractionBackward) {
      ++cross;
      cross_flops += g.flops();
    }
  }
  EXPECT_EQ(cross, 12);
  // Per layer: forward 2 x (2 b N r), backward 4 x (2 b N r).
  EXPECT_DOUBLE_EQ(cross_flops, 2 * 6 * 2.0 * b * 6 * 5);
  const GemmShape& top0 = gemms[5 + 12];
  EXPECT_EQ(top0.what, "top_mlp.0 Y");
  EXPECT_EQ(top0.k, 6);
}

// Two samples, table 0 ids {1, 1, 2} (2 distinct), table 1 ids {4, 4}
// (1 distinct), rows of 2 floats: the lookup reads 8 bytes per id, its row
// and writes each sample's pooled vector; the update reads the pooled
// gradients and reads and writes each distinct row and its state.
TEST(RooflineTest, EmbeddingBytesCountRowsIdsAndState) {
  data::Batch batch;
  batch.size = 2;
  batch.sparse.resize(2);
  batch.sparse[0].offsets = {0, 2, 3};
  batch.sparse[0].ids = {1, 1, 2};
  batch.sparse[1].offsets = {0, 1, 2};
  batch.sparse[1].ids = {4, 4};
  ModelConfig c = Small(INTERACTION_DOT);
  c.mutable_sparse_optimizer()->set_type(OptimizerConfig::SGD);
  EmbeddingBytes sgd = StepEmbeddingBytes(c, batch);
  EXPECT_DOUBLE_EQ(sgd.lookup, (3 + 2) * (8 + 8) + 2 * (2 * 8));
  EXPECT_DOUBLE_EQ(sgd.update, 2 * (2 * 8) + 2 * (2 + 1) * 8);
  c.mutable_sparse_optimizer()->set_type(OptimizerConfig::ADAM);
  EmbeddingBytes adam = StepEmbeddingBytes(c, batch);
  // Adam: two moments per element, 16 more bytes read and written a row.
  EXPECT_DOUBLE_EQ(adam.update, sgd.update + 2 * (2 + 1) * 16);
  c.mutable_sparse_optimizer()->set_type(OptimizerConfig::ROWWISE_ADAGRAD);
  EmbeddingBytes adagrad = StepEmbeddingBytes(c, batch);
  EXPECT_DOUBLE_EQ(adagrad.update, sgd.update + 2 * (2 + 1) * 4);
}

TEST(RooflineTest, FractionsAreCeilingOverMeasured) {
  std::array<double, StageTimes::kNumStages> measured{};
  measured[StageTimes::kTopForward] = 0.004;
  measured[StageTimes::kLookup] = 0.002;
  measured[StageTimes::kDenseUpdate] = 0.001;
  const std::vector<GemmShape> gemms = {
      {StageTimes::kTopForward, "a", 'N', 'T', 1, 1, 1},
      {StageTimes::kTopForward, "b", 'N', 'T', 1, 1, 1}};
  EmbeddingBytes bytes;
  bytes.lookup = 1e6;
  const std::vector<StageRoof> roof =
      Roofline(measured, gemms, {0.001, 0.002}, bytes, 1e9);
  ASSERT_EQ(roof.size(), static_cast<size_t>(StageTimes::kNumStages));
  EXPECT_STREQ(roof[StageTimes::kTopForward].stage, "top_fwd");
  EXPECT_DOUBLE_EQ(roof[StageTimes::kTopForward].ceiling_ms, 3.0);
  EXPECT_DOUBLE_EQ(roof[StageTimes::kTopForward].fraction, 0.75);
  EXPECT_EQ(roof[StageTimes::kTopForward].bound, "gemm");
  EXPECT_DOUBLE_EQ(roof[StageTimes::kLookup].fraction, 0.5);
  EXPECT_EQ(roof[StageTimes::kLookup].bound, "copy");
  EXPECT_EQ(roof[StageTimes::kDenseUpdate].bound, "");
  EXPECT_DOUBLE_EQ(roof[StageTimes::kDenseUpdate].fraction, 0);
}

// The measurements run and give finite positive numbers (their size is
// the benchmark's to print, not the test's to judge).
TEST(RooflineTest, MeasurementsRun) {
  const GemmShape g{StageTimes::kTopForward, "x", 'N', 'T', 64, 32, 16};
  for (const bool bf16 : {false, true}) {
    const double s = TimeGemm(g, bf16, 2);
    EXPECT_TRUE(std::isfinite(s) && s > 0) << s;
  }
  const double copy = CopyBandwidth(1 << 20, 2);
  EXPECT_TRUE(std::isfinite(copy) && copy > 0) << copy;
}

}  // namespace
}  // namespace dlrm::bench
