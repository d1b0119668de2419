// Tests for core/: config parsing, presets, normalisation and validation.
#include <gtest/gtest.h>

#include "core/config.h"
#include "core/random.h"
#include "core/status.h"

namespace dlrm {
namespace {

TEST(ConfigTest, KagglePresetHasTheCriteoShape) {
  auto c = LoadModelConfig("kaggle");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->num_dense_features(), 13);
  ASSERT_EQ(c->tables_size(), 26);
  for (const auto& t : c->tables()) {
    EXPECT_EQ(t.dim(), 16);
    EXPECT_LE(t.rows(), 100000);
    EXPECT_EQ(t.multi_hot_size(), 1);
  }
  EXPECT_EQ(InteractionOutputDim(*c), 367);
  EXPECT_EQ(c->bottom_mlp_size(), 4);
  EXPECT_EQ(c->top_mlp(c->top_mlp_size() - 1), 1);
}

TEST(ConfigTest, KaggleFullPresetHasTheKaggleVocabularies) {
  auto c = LoadModelConfig("kaggle-full");
  ASSERT_TRUE(c.ok()) << c.status();
  int64_t rows = 0;
  for (const auto& t : c->tables()) rows += t.rows();
  EXPECT_EQ(rows, 33762577);
  EXPECT_EQ(c->tables(2).rows(), 10131227);
}

TEST(ConfigTest, MaxRowsPerTableCapsTables) {
  auto c = ParseModelConfigText(R"(
    embedding_dim: 4 max_rows_per_table: 10
    tables { name: "a" rows: 100 } tables { name: "b" rows: 5 }
    bottom_mlp: [4] top_mlp: [1])");
  ASSERT_TRUE(c.ok()) << c.status();
  auto n = NormalizeModelConfig(*c);
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(n->tables(0).rows(), 10);
  EXPECT_EQ(n->tables(1).rows(), 5);
  EXPECT_EQ(n->num_dense_features(), 13);
  EXPECT_FLOAT_EQ(n->dense_optimizer().learning_rate(), 0.1f);
}

TEST(ConfigTest, SyntaxErrorNamesTheLine) {
  auto c = ParseModelConfigText("embedding_dim: 4\ntables { rows: }\n");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(c.status().message().find("line 2"), std::string::npos)
      << c.status();
}

TEST(ConfigTest, ValidationNamesTheField) {
  struct Case {
    const char* text;
    const char* field;
  };
  const Case cases[] = {
      {"embedding_dim: 4 tables { name: 'a' rows: 0 } bottom_mlp: [4] "
       "top_mlp: [1]",
       "tables[0].rows"},
      {"embedding_dim: 4 tables { name: 'a' rows: 3 } tables { name: 'a' "
       "rows: 3 } bottom_mlp: [4] top_mlp: [1]",
       "tables[1].name"},
      {"embedding_dim: 4 tables { name: 'a' rows: 3 } bottom_mlp: [8] "
       "top_mlp: [1]",
       "tables[0].dim"},
      {"embedding_dim: 4 tables { name: 'a' rows: 3 } bottom_mlp: [4] "
       "top_mlp: [2]",
       "top_mlp"},
      {"embedding_dim: 4 tables { name: 'a' rows: 3 } bottom_mlp: [4] "
       "top_mlp: [1] dense_optimizer { learning_rate: -1 }",
       "dense_optimizer.learning_rate"},
      {"embedding_dim: 4 tables { name: 'a' rows: 3 } bottom_mlp: [4, -2] "
       "top_mlp: [1]",
       "bottom_mlp[1]"},
  };
  for (const Case& c : cases) {
    auto parsed = ParseModelConfigText(c.text);
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    auto n = NormalizeModelConfig(*parsed);
    ASSERT_FALSE(n.ok()) << c.text;
    EXPECT_EQ(n.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(n.status().message().find(c.field), std::string::npos)
        << n.status() << " should name " << c.field;
  }
}

TEST(ConfigTest, UnknownPresetOrFileIsNotFound) {
  auto c = LoadModelConfig("/nonexistent/config.textproto");
  EXPECT_EQ(c.status().code(), absl::StatusCode::kNotFound);
}

TEST(ConfigTest, ParameterCounts) {
  auto c = LoadModelConfig("kaggle");
  ASSERT_TRUE(c.ok());
  // bottom 13-512-256-64-16 and top 367-512-256-1, weights plus biases.
  const int64_t bottom =
      13 * 512 + 512 + 512 * 256 + 256 + 256 * 64 + 64 + 64 * 16 + 16;
  const int64_t top = 367 * 512 + 512 + 512 * 256 + 256 + 256 + 1;
  EXPECT_EQ(DenseParameterCount(*c), bottom + top);
}

TEST(RandomTest, HashIsAPureFunction) {
  EXPECT_EQ(HashKey(1, 2, 3), HashKey(1, 2, 3));
  EXPECT_NE(HashKey(1, 2, 3), HashKey(1, 2, 4));
  EXPECT_NE(HashKey(1, 2, 3), HashKey(2, 2, 3));
  Rng a(5), b(5);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(a.NextU64(), b.NextU64());
  Rng r(9);
  double sum = 0;
  for (int i = 0; i < 10000; ++i) {
    const uint64_t v = r.Below(7);
    ASSERT_LT(v, 7u);
    sum += r.Normal();
  }
  EXPECT_NEAR(sum / 10000, 0.0, 0.05);
}

}  // namespace
}  // namespace dlrm
