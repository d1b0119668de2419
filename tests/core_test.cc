// Tests for core/: config parsing, presets, normalisation and validation.
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "core/config.h"
#include "core/crc32c.h"
#include "core/escape.h"
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

// Found by tests/fuzz/model_config_fuzz (docs/fuzzing.md): a table name
// that is not UTF-8 passed validation, and the server then could not send
// the config (GetModelInfo) or read it back from a checkpoint, since proto3
// strings must be UTF-8.
TEST(ConfigTest, RejectsNamesThatAreNotUtf8Text) {
  for (const char* name :
       {"a\\xff", "a\\xc3", "a\\xc0\\x80", "a\\x01", "\\xed\\xa0\\x80"}) {
    const std::string text =
        absl::StrCat("embedding_dim: 4 tables { name: \"", name,
                     "\" rows: 3 } bottom_mlp: [4] top_mlp: [1]");
    auto parsed = ParseModelConfigText(text);
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    auto n = NormalizeModelConfig(*parsed);
    EXPECT_EQ(n.status().code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_NE(n.status().message().find("tables[0].name is not UTF-8"),
              std::string::npos)
        << n.status();
  }
  auto ok = ParseModelConfigText(
      "embedding_dim: 4 tables { name: \"caf\\xc3\\xa9 \\xf0\\x9f\\x8d\\xb5\" "
      "rows: 3 } bottom_mlp: [4] top_mlp: [1]");
  ASSERT_TRUE(ok.ok());
  EXPECT_TRUE(NormalizeModelConfig(*ok).ok());
}

// Sizes that would overflow the derived counts (rows x dim, the dot
// interaction's n(n-1)/2) are refused by validation.
TEST(ConfigTest, RejectsSizesPastTheLimits) {
  struct Case {
    std::string text;
    const char* field;
  };
  std::string many_tables = "embedding_dim: 4 bottom_mlp: [4] top_mlp: [1]";
  for (int i = 0; i < 1025; ++i) {
    absl::StrAppend(&many_tables, " tables { name: 't", i, "' rows: 2 }");
  }
  const Case cases[] = {
      {"embedding_dim: 4 tables { name: 'a' rows: 4611686018427387904 } "
       "bottom_mlp: [4] top_mlp: [1]",
       "tables[0].rows = 4611686018427387904 must be in [1, 2^40]"},
      {"embedding_dim: 8192 tables { name: 'a' rows: 3 } bottom_mlp: [8192] "
       "top_mlp: [1]",
       "tables[0].dim = 8192"},
      {"embedding_dim: 4 tables { name: 'a' rows: 3 } bottom_mlp: [4] "
       "top_mlp: [100000, 1]",
       "top_mlp[0] = 100000"},
      {"num_dense_features: 1000000 embedding_dim: 4 tables { name: 'a' "
       "rows: 3 } bottom_mlp: [4] top_mlp: [1]",
       "num_dense_features = 1000000"},
      {many_tables, "tables: 1025 tables; at most 1024"},
  };
  for (const Case& c : cases) {
    auto parsed = ParseModelConfigText(c.text);
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    auto n = NormalizeModelConfig(*parsed);
    EXPECT_EQ(n.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(n.status().message().find(c.field), std::string::npos)
        << n.status() << " should name " << c.field;
  }
  // Every preset stays within them.
  for (const std::string& name : PresetNames()) {
    EXPECT_TRUE(LoadModelConfig(name).ok()) << name;
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

// The check values of RFC 3720 (iSCSI) appendix B.4 and the standard
// "123456789" check, through both the dispatching and the table path.
TEST(Crc32cTest, KnownVectors) {
  std::string zeros(32, '\0'), ones(32, '\xff'), up(32, 0), down(32, 0);
  for (int i = 0; i < 32; ++i) {
    up[i] = static_cast<char>(i);
    down[i] = static_cast<char>(31 - i);
  }
  const std::pair<std::string, uint32_t> cases[] = {
      {"123456789", 0xE3069283u}, {zeros, 0x8A9136AAu}, {ones, 0x62A8AB43u},
      {up, 0x46DD794Eu},          {down, 0x113FDB5Cu},  {"", 0u}};
  for (const auto& [text, want] : cases) {
    EXPECT_EQ(Crc32c(text.data(), text.size()), want) << text.size();
    EXPECT_EQ(internal::Crc32cExtendPortable(0, text.data(), text.size()), want)
        << text.size();
  }
}

// Extending piece by piece equals one pass, for every split and length
// (covering the 8-byte blocks and the byte tails of both paths).
TEST(Crc32cTest, ExtendEqualsOnePass) {
  std::string data(100, 0);
  Rng rng(3);
  for (char& c : data) c = static_cast<char>(rng.Below(256));
  for (size_t n = 0; n <= data.size(); n += 7) {
    const uint32_t whole = Crc32c(data.data(), n);
    EXPECT_EQ(internal::Crc32cExtendPortable(0, data.data(), n), whole);
    for (size_t cut = 0; cut <= n; cut += 3) {
      EXPECT_EQ(
          Crc32cExtend(Crc32c(data.data(), cut), data.data() + cut, n - cut),
          whole)
          << n << " " << cut;
    }
  }
}

TEST(EscapeForMessageTest, EscapesEveryByteOutsidePrintableAscii) {
  EXPECT_EQ(EscapeForMessage("plain text: \"a\\b\" 'c' ~"),
            "plain text: \"a\\b\" 'c' ~");
  EXPECT_EQ(EscapeForMessage(std::string("a\0b\n\r\t\x1b[2J\x7f\xc3\xa9", 13)),
            "a\\x00b\\n\\r\\t\\x1b[2J\\x7f\\xc3\\xa9");
  // Every byte value: the result is printable, and escaping it again
  // changes nothing.
  std::string all;
  for (int c = 0; c < 256; ++c) all.push_back(static_cast<char>(c));
  const std::string once = EscapeForMessage(all);
  for (const char c : once) {
    EXPECT_TRUE(c >= 0x20 && c < 0x7f) << static_cast<int>(c);
  }
  EXPECT_EQ(EscapeForMessage(once), once);
  EXPECT_EQ(EscapeForMessage(""), "");
}

}  // namespace
}  // namespace dlrm
