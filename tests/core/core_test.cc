// Tests for core/: config parsing, presets, normalisation and validation;
// CRC-32C; the file system and its fault-injecting layer; the CUDA graph
// policy (GraphReplay) over recorded actions; the CUDA launch-grid
// arithmetic (core/cuda/launch_grid.h, no CUDA needed).
#include <google/protobuf/descriptor.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <functional>
#include <limits>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/config.h"
#include "core/config_change.h"
#include "core/crc32c.h"
#include "core/cuda/launch_grid.h"
#include "core/escape.h"
#include "core/fault_injection_file_system.h"
#include "core/file_system.h"
#include "core/graph_replay.h"
#include "core/lru_cache.h"
#include "core/random.h"
#include "core/status.h"
#include "tests/support/expect.h"

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

// The MLPerf DLRM-DCNv2 preset: the reference's vocabularies, fixed
// multi-hot bags of 214 ids per sample, DCN 3 x 512, Adagrad.
TEST(ConfigTest, MlperfDcnv2PresetHasTheReferenceShape) {
  auto c = LoadModelConfig("mlperf-dlrm-dcnv2");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->num_dense_features(), 13);
  ASSERT_EQ(c->tables_size(), 26);
  const int kSizes[26] = {3, 2, 1, 2, 6, 1, 1,  1,   1,  7,  3, 8, 1,
                          6, 9, 5, 1, 1, 1, 12, 100, 27, 10, 3, 1, 1};
  int lookups = 0;
  int64_t rows = 0;
  for (int i = 0; i < 26; ++i) {
    const TableConfig& t = c->tables(i);
    EXPECT_EQ(t.dim(), 128) << t.name();
    EXPECT_EQ(t.pooling(), POOLING_SUM) << t.name();
    EXPECT_EQ(t.multi_hot_distribution(), MULTI_HOT_FIXED) << t.name();
    EXPECT_EQ(t.multi_hot_size(), kSizes[i]) << t.name();
    EXPECT_LE(t.rows(), 40000000) << t.name();
    lookups += t.multi_hot_size();
    rows += t.rows();
  }
  EXPECT_EQ(lookups, 214);
  EXPECT_EQ(rows, 204184588);
  EXPECT_EQ(c->tables(0).rows(), 40000000);
  EXPECT_EQ(c->tables(1).rows(), 39060);
  EXPECT_EQ(c->tables(25).rows(), 36);
  EXPECT_EQ(c->interaction(), INTERACTION_DCN);
  EXPECT_EQ(c->dcn_num_layers(), 3);
  EXPECT_EQ(c->dcn_low_rank_dim(), 512);
  EXPECT_EQ(std::vector<int>(c->bottom_mlp().begin(), c->bottom_mlp().end()),
            (std::vector<int>{512, 256, 128}));
  EXPECT_EQ(std::vector<int>(c->top_mlp().begin(), c->top_mlp().end()),
            (std::vector<int>{1024, 1024, 512, 256, 1}));
  EXPECT_EQ(InteractionOutputDim(*c), 27 * 128);
  EXPECT_EQ(EmbeddingParameterCount(*c), int64_t{204184588} * 128);
  EXPECT_EQ(DenseParameterCount(*c), 16044545);
  for (const OptimizerConfig& o :
       {c->dense_optimizer(), c->sparse_optimizer()}) {
    EXPECT_EQ(o.type(), OptimizerConfig::ADAGRAD);
    EXPECT_FLOAT_EQ(o.learning_rate(), 0.005f);
    EXPECT_FLOAT_EQ(o.eps(), 1e-10f);
  }
}

// multi_hot_distribution outside the enum (as a binary proto may carry) is
// refused, naming the field.
TEST(ConfigTest, InvalidMultiHotDistributionIsRefused) {
  auto c = ParseModelConfigText(R"(
    embedding_dim: 4 tables { name: "a" rows: 10 multi_hot_size: 2 }
    bottom_mlp: [4] top_mlp: [1])");
  ASSERT_TRUE(c.ok()) << c.status();
  c->mutable_tables(0)->set_multi_hot_distribution(
      static_cast<MultiHotDistribution>(7));
  auto n = NormalizeModelConfig(*c);
  EXPECT_EQ(n.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_HAS_SUBSTR(n.status().message(), "multi_hot_distribution")
      << n.status();
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

// A dense LAMB / LARS with a schedule normalises: the fields' defaults
// filled, the schedule kept.
TEST(ConfigTest, LayerWiseDenseOptimizerWithSchedule) {
  auto parsed = ParseModelConfigText(
      "embedding_dim: 4 tables { name: 'a' rows: 3 } bottom_mlp: [4] "
      "top_mlp: [1] dense_optimizer { type: LARS momentum: 0.9 schedule { "
      "warmup_steps: 10 polynomial_decay { decay_steps: 100 } } } "
      "sparse_optimizer { type: ADAM schedule { step_decay { step_size: 5 } "
      "} }");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  auto n = NormalizeModelConfig(*parsed);
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(n->dense_optimizer().learning_rate(), 0.1f);
  EXPECT_EQ(n->dense_optimizer().trust_coefficient(), 0.001f);
  EXPECT_EQ(n->dense_optimizer().schedule().warmup_steps(), 10);
  EXPECT_EQ(n->dense_optimizer().schedule().polynomial_decay().power(), 2.0f);
  EXPECT_EQ(n->sparse_optimizer().schedule().step_decay().gamma(), 0.1f);
}

TEST(ConfigTest, SyntaxErrorNamesTheLine) {
  auto c = ParseModelConfigText("embedding_dim: 4\ntables { rows: }\n");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_HAS_SUBSTR(c.status().message(), "line 2") << c.status();
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
      // The layer-wise optimizers are for dense parameters only.
      {"embedding_dim: 4 tables { name: 'a' rows: 3 } bottom_mlp: [4] "
       "top_mlp: [1] sparse_optimizer { type: LAMB }",
       "sparse_optimizer.type LAMB"},
      {"embedding_dim: 4 tables { name: 'a' rows: 3 } bottom_mlp: [4] "
       "top_mlp: [1] sparse_optimizer { type: LARS }",
       "sparse_optimizer.type LARS"},
      {"embedding_dim: 4 tables { name: 'a' rows: 3 } bottom_mlp: [4] "
       "top_mlp: [1] sparse_optimizer { schedule { step_decay { gamma: 0.5 } "
       "} }",
       "sparse_optimizer.schedule.step_decay.step_size"},
      {"embedding_dim: 4 tables { name: 'a' rows: 3 } bottom_mlp: [4] "
       "top_mlp: [1] dense_optimizer { type: ADAM weight_decay: 0.1 }",
       "dense_optimizer.weight_decay"},
  };
  for (const Case& c : cases) {
    auto parsed = ParseModelConfigText(c.text);
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    auto n = NormalizeModelConfig(*parsed);
    ASSERT_FALSE(n.ok()) << c.text;
    EXPECT_EQ(n.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_HAS_SUBSTR(n.status().message(), c.field)
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
    EXPECT_HAS_SUBSTR(n.status().message(), "tables[0].name is not UTF-8")
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
    EXPECT_HAS_SUBSTR(n.status().message(), c.field)
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

// INTERACTION_DCN: the MLPerf DLRM-DCNv2 reference's 3 layers of rank 512
// by default, the input's width out, the cross parameters counted; the two
// fields checked and named, and refused with another interaction (which
// would ignore them).
TEST(ConfigTest, DcnDefaultsChecksAndCounts) {
  const std::string base =
      "num_dense_features: 4 embedding_dim: 8 tables { name: 'a' rows: 10 } "
      "tables { name: 'b' rows: 20 dim: 4 } bottom_mlp: [16, 8] "
      "top_mlp: [6, 1] ";
  auto load = [&](const std::string& extra) {
    auto parsed = ParseModelConfigText(base + extra);
    EXPECT_TRUE(parsed.ok()) << parsed.status();
    return NormalizeModelConfig(*parsed);
  };
  auto dcn = load("interaction: INTERACTION_DCN");
  ASSERT_TRUE(dcn.ok()) << dcn.status();
  EXPECT_EQ(dcn->dcn_num_layers(), 3);
  EXPECT_EQ(dcn->dcn_low_rank_dim(), 512);
  // Tables of other dims than the bottom MLP's output are fine: the cross
  // network runs over the concatenation, 8 + 8 + 4 wide.
  EXPECT_EQ(InteractionOutputDim(*dcn), 20);
  const int64_t mlps = 4 * 16 + 16 + 16 * 8 + 8 + 20 * 6 + 6 + 6 + 1;
  EXPECT_EQ(DenseParameterCount(*dcn), mlps + 3 * (2 * 20 * 512 + 20));
  auto set = load(
      "interaction: INTERACTION_DCN dcn_num_layers: 2 dcn_low_rank_dim: 5");
  ASSERT_TRUE(set.ok()) << set.status();
  EXPECT_EQ(set->dcn_num_layers(), 2);
  EXPECT_EQ(set->dcn_low_rank_dim(), 5);
  EXPECT_EQ(DenseParameterCount(*set), mlps + 2 * (2 * 20 * 5 + 20));
  // Normalising again changes nothing.
  auto again = NormalizeModelConfig(*set);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->DebugString(), set->DebugString());
  // Other interactions print as before: no DCN fields set.
  auto cat = load("interaction: INTERACTION_CAT");
  ASSERT_TRUE(cat.ok()) << cat.status();
  EXPECT_EQ(cat->dcn_num_layers(), 0);
  EXPECT_EQ(cat->dcn_low_rank_dim(), 0);

  struct Case {
    std::string extra, field;
  };
  const Case bad[] = {
      {"interaction: INTERACTION_DCN dcn_num_layers: -1", "dcn_num_layers"},
      {"interaction: INTERACTION_DCN dcn_num_layers: 65", "dcn_num_layers"},
      {"interaction: INTERACTION_DCN dcn_low_rank_dim: -3", "dcn_low_rank_dim"},
      {"interaction: INTERACTION_DCN dcn_low_rank_dim: 65537",
       "dcn_low_rank_dim"},
      {"interaction: INTERACTION_CAT dcn_num_layers: 2", "dcn_num_layers"},
      {"interaction: INTERACTION_CAT dcn_low_rank_dim: 64", "dcn_low_rank_dim"},
  };
  for (const Case& c : bad) {
    auto n = load(c.extra);
    EXPECT_EQ(n.status().code(), absl::StatusCode::kInvalidArgument)
        << c.extra << ": " << n.status();
    EXPECT_HAS_SUBSTR(n.status().message(), c.field)
        << n.status() << " should name " << c.field;
  }
}

// A one-table config (dim 4, MLPs [4] and [1]).
constexpr char kOneTable[] =
    "embedding_dim: 4 tables { name: 'a' rows: 10 } bottom_mlp: [4] "
    "top_mlp: [1] ";

// kOneTable with `extra` (config text) added, normalised.
absl::StatusOr<ModelConfig> LoadOneTable(const std::string& extra) {
  auto parsed = ParseModelConfigText(kOneTable + extra);
  EXPECT_TRUE(parsed.ok()) << parsed.status();
  return NormalizeModelConfig(parsed.value_or(ModelConfig()));
}

// dense_precision: PRECISION_FP32 unless set, PRECISION_BF16 parses and
// survives normalisation; a value outside the enum (as a binary proto may
// carry, or a number in the text) is refused naming the field.
TEST(ConfigTest, DensePrecision) {
  const auto load = LoadOneTable;
  auto plain = load("");
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(plain->dense_precision(), PRECISION_AUTO);
  auto fp32 = load("dense_precision: PRECISION_FP32");
  ASSERT_TRUE(fp32.ok()) << fp32.status();
  EXPECT_EQ(fp32->dense_precision(), PRECISION_FP32);
  auto bf16 = load("dense_precision: PRECISION_BF16");
  ASSERT_TRUE(bf16.ok()) << bf16.status();
  EXPECT_EQ(bf16->dense_precision(), PRECISION_BF16);
  for (const char* bad : {"dense_precision: 7", "dense_precision: -1"}) {
    auto n = load(bad);
    EXPECT_EQ(n.status().code(), absl::StatusCode::kInvalidArgument)
        << bad << ": " << n.status();
    EXPECT_HAS_SUBSTR(n.status().message(), "dense_precision") << n.status();
  }
  EXPECT_FALSE(ParseModelConfigText(std::string(kOneTable) +
                                    "dense_precision: PRECISION_FP8")
                   .ok());
}

// --precision: auto, fp32 or bf16 set the field, empty keeps the config's,
// anything else names the flag.
TEST(ConfigTest, PrecisionFlag) {
  ModelConfig config;
  config.set_dense_precision(PRECISION_BF16);
  ASSERT_TRUE(ApplyPrecisionFlag("", &config).ok());
  EXPECT_EQ(config.dense_precision(), PRECISION_BF16);
  ASSERT_TRUE(ApplyPrecisionFlag("fp32", &config).ok());
  EXPECT_EQ(config.dense_precision(), PRECISION_FP32);
  ASSERT_TRUE(ApplyPrecisionFlag("auto", &config).ok());
  EXPECT_EQ(config.dense_precision(), PRECISION_AUTO);
  ASSERT_TRUE(ApplyPrecisionFlag("bf16", &config).ok());
  EXPECT_EQ(config.dense_precision(), PRECISION_BF16);
  const absl::Status bad = ApplyPrecisionFlag("fp16", &config);
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_HAS_SUBSTR(bad.message(), "--precision") << bad;
  EXPECT_STREQ(PrecisionName(PRECISION_AUTO), "auto");
  EXPECT_STREQ(PrecisionName(PRECISION_FP32), "fp32");
  EXPECT_STREQ(PrecisionName(PRECISION_BF16), "bf16");
}

// The device: "cpu" / "cuda" from a flag, DEVICE_CPU unless the config
// says otherwise, an empty flag keeps the config's.
TEST(ConfigTest, Device) {
  EXPECT_EQ(*ParseDevice("cpu"), DEVICE_CPU);
  EXPECT_EQ(*ParseDevice("cuda"), DEVICE_CUDA);
  EXPECT_EQ(ParseDevice("gpu").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_STREQ(DeviceName(DEVICE_CUDA), "cuda");
  EXPECT_STREQ(DeviceName(DEVICE_CPU), "cpu");

  auto tiny = LoadModelConfig("tiny");
  ASSERT_TRUE(tiny.ok()) << tiny.status();
  EXPECT_EQ(tiny->device(), DEVICE_CPU);
  ModelConfig c = *tiny;
  ASSERT_TRUE(ApplyDeviceFlag("", &c).ok());
  EXPECT_EQ(c.device(), DEVICE_CPU);
  ASSERT_TRUE(ApplyDeviceFlag("cuda", &c).ok());
  EXPECT_EQ(c.device(), DEVICE_CUDA);
  const absl::Status bad = ApplyDeviceFlag("tpu", &c);
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_HAS_SUBSTR(bad.message(), "--device must be cpu or cuda") << bad;
  EXPECT_EQ(c.device(), DEVICE_CUDA);

  auto parsed = ParseModelConfigText(
      "tables { name: \"a\" rows: 5 } embedding_dim: 4 bottom_mlp: [4] "
      "top_mlp: [1] device: DEVICE_CUDA");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  auto normalised = NormalizeModelConfig(*parsed);
  ASSERT_TRUE(normalised.ok()) << normalised.status();
  EXPECT_EQ(normalised->device(), DEVICE_CUDA);
  parsed->set_device(static_cast<ComputeDevice>(7));
  EXPECT_EQ(NormalizeModelConfig(*parsed).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// A bool field of ModelConfig set by an on|off flag.
struct OnOffField {
  // The field's name in config text, e.g. "gpu_disable_tf32".
  std::string field;
  bool (ModelConfig::*get)() const;
  absl::Status (*apply)(std::string_view flag, ModelConfig* config);
  // The flag value that sets the field ("off" for --tf32) and the one that
  // clears it.
  std::string sets;
  std::string clears;
  // Values the flag refuses, and the refusal's text.
  std::vector<std::string> bad;
  std::string refusal;
};

// The field is false unless set and survives normalisation either way, on
// either device; the flag sets it, "" leaves it, any other value is
// refused naming the flag, the config unchanged.
void ExpectOnOffField(const OnOffField& f) {
  const auto load = LoadOneTable;
  auto plain = load("");
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_FALSE(((*plain).*f.get)());
  for (const char* device : {"DEVICE_CPU", "DEVICE_CUDA"}) {
    auto set = load(absl::StrCat(f.field, ": true device: ", device));
    ASSERT_TRUE(set.ok()) << set.status();
    EXPECT_TRUE(((*set).*f.get)()) << device;
  }

  ModelConfig c = *plain;
  ASSERT_TRUE(f.apply("", &c).ok());
  EXPECT_FALSE((c.*f.get)());
  ASSERT_TRUE(f.apply(f.sets, &c).ok());
  EXPECT_TRUE((c.*f.get)());
  ASSERT_TRUE(f.apply("", &c).ok());
  EXPECT_TRUE((c.*f.get)());
  for (const std::string& bad : f.bad) {
    const absl::Status st = f.apply(bad, &c);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_HAS_SUBSTR(st.message(), f.refusal) << st;
    EXPECT_TRUE((c.*f.get)()) << bad;
  }
  ASSERT_TRUE(f.apply(f.clears, &c).ok());
  EXPECT_FALSE((c.*f.get)());
}

// gpu_disable_tf32: false unless set (TF32 on for GPU GEMMs), survives
// normalisation either way, on either device; --tf32 on|off sets it and
// any other value is refused naming the flag, the config unchanged.
TEST(ConfigTest, GpuDisableTf32) {
  ExpectOnOffField({"gpu_disable_tf32",
                    &ModelConfig::gpu_disable_tf32,
                    &ApplyTf32Flag,
                    "off",
                    "on",
                    {"true", "OFF", "0", "tf32"},
                    "--tf32 must be on or off"});
}

// gpu_cuda_graphs: false unless set, survives normalisation on either
// device; --cuda-graphs on|off sets it and any other value is refused
// naming the flag, the config unchanged.
TEST(ConfigTest, GpuCudaGraphs) {
  ExpectOnOffField({"gpu_cuda_graphs",
                    &ModelConfig::gpu_cuda_graphs,
                    &ApplyCudaGraphsFlag,
                    "on",
                    "off",
                    {"true", "ON", "1", "graphs"},
                    "--cuda-graphs must be on or off"});
}

// GraphReplay's Ops for the tests: a "stream" that records what is queued
// on it. A launch sequence queues its name; while capturing, what is queued
// goes into the graph being captured instead, and launching a graph queues
// its recorded names. So `queued` is what the device would run, and the
// tests check it is the same with and without graphs.
struct RecordingOps {
  struct Graph {
    int id = 0;
    std::vector<std::string> work;
  };
  std::vector<std::string> queued;
  std::vector<std::string> actions;  // begin, end, launch <id>
  bool capturing = false;
  std::vector<std::string> capture;
  int next_id = 0;
  // Failures to inject, by the number of the BeginCapture / EndCapture
  // call (0-based); -1 for none.
  int fail_begin = -1, fail_end = -1;
  int begins = 0, ends = 0;

  void Queue(const std::string& work) {
    (capturing ? capture : queued).push_back(work);
  }
  absl::Status BeginCapture() {
    actions.push_back("begin");
    if (begins++ == fail_begin) {
      return absl::InternalError("cudaStreamBeginCapture failed");
    }
    capturing = true;
    capture.clear();
    return absl::OkStatus();
  }
  absl::StatusOr<Graph> EndCapture() {
    actions.push_back("end");
    capturing = false;
    if (ends++ == fail_end) {
      return absl::InternalError("cudaStreamEndCapture: capture invalidated");
    }
    return Graph{next_id++, std::move(capture)};
  }
  absl::Status Launch(Graph& g) {
    actions.push_back(absl::StrCat("launch ", g.id));
    queued.insert(queued.end(), g.work.begin(), g.work.end());
    return absl::OkStatus();
  }
};

// A call's launch sequence for the tests: queues "<name>/<batch>/<part>"
// for a few parts, counting how often the host ran it.
struct Sequence {
  Sequence(RecordingOps* ops, std::string name, int64_t batch)
      : ops(ops), name(std::move(name)), batch(batch) {}

  RecordingOps* ops;
  std::string name;
  int64_t batch;
  int host_runs = 0;
  absl::Status error;  // returned after the first part when not OK

  absl::Status operator()() {
    ++host_runs;
    ops->Queue(absl::StrCat(name, "/", batch, "/gemm"));
    if (!error.ok()) return error;
    ops->Queue(absl::StrCat(name, "/", batch, "/kernel"));
    return absl::OkStatus();
  }
};

// Runs `steps` of two calls each through `replay`, the batch of step i
// being batches[i]; returns what was queued.
std::vector<std::string> RunSteps(GraphReplay<RecordingOps>& replay,
                                  RecordingOps& ops,
                                  const std::vector<int64_t>& batches) {
  for (const int64_t b : batches) {
    replay.Reserve(b);
    for (int call = 0; call < 2; ++call) {
      Sequence seq{&ops, call == 0 ? "forward" : "backward", b};
      EXPECT_TRUE(replay.Run({call, b}, std::ref(seq)).ok());
    }
  }
  return ops.queued;
}

// Disabled: every run plain, nothing captured. Enabled: warm-up plain,
// captured on the second run, replayed after, and the device sees the same
// work in the same order either way.
TEST(GraphReplayTest, WarmUpCaptureReplaySameWork) {
  const std::vector<int64_t> batches = {64, 64, 64, 64, 64};
  RecordingOps off_ops;
  GraphReplay<RecordingOps> off(&off_ops, /*enabled=*/false);
  const std::vector<std::string> plain = RunSteps(off, off_ops, batches);
  EXPECT_EQ(off.plain_runs(), 10);
  EXPECT_EQ(off.captures(), 0);
  EXPECT_TRUE(off_ops.actions.empty());

  RecordingOps on_ops;
  GraphReplay<RecordingOps> on(&on_ops, /*enabled=*/true);
  EXPECT_EQ(RunSteps(on, on_ops, batches), plain);
  EXPECT_EQ(on.plain_runs(), 2);
  EXPECT_EQ(on.captures(), 2);
  EXPECT_EQ(on.replays(), 6);
  EXPECT_EQ(on.failed_captures(), 0);
  const std::vector<std::string> actions = {
      "begin",    "end",      "launch 0", "begin",    "end",      "launch 1",
      "launch 0", "launch 1", "launch 0", "launch 1", "launch 0", "launch 1"};
  EXPECT_EQ(on_ops.actions, actions);
}

// The host runs a sequence only for the warm-up and the capture; replays
// do not call it.
TEST(GraphReplayTest, ReplayDoesNotRunTheHostCode) {
  RecordingOps ops;
  GraphReplay<RecordingOps> replay(&ops, true);
  Sequence seq{&ops, "top", 7};
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(replay.Run({3, 7}, std::ref(seq)).ok());
  }
  EXPECT_EQ(seq.host_runs, 2);
  EXPECT_EQ(ops.queued.size(), 10u);
}

// A batch size change: each size has its own graphs; a batch larger than
// any before drops them all (its buffers may have grown), smaller ones
// keep them; the device sees the same work as without graphs.
TEST(GraphReplayTest, BatchSizesAndGrowth) {
  const std::vector<int64_t> batches = {64,  64,  64, 32, 32, 32,
                                        131, 131, 64, 64, 64, 131};
  RecordingOps off_ops;
  GraphReplay<RecordingOps> off(&off_ops, false);
  const std::vector<std::string> plain = RunSteps(off, off_ops, batches);

  RecordingOps ops;
  GraphReplay<RecordingOps> replay(&ops, true);
  EXPECT_EQ(RunSteps(replay, ops, batches), plain);
  // 64: warm-up, capture, replay; 32: the same (no growth); 131 drops all,
  // warm-up, capture; 64 again: warm-up, capture, replay; 131 replays.
  EXPECT_EQ(replay.invalidations(), 1);
  EXPECT_EQ(replay.captures(), 2 * 4);
  EXPECT_EQ(replay.plain_runs(), 2 * 4);
  EXPECT_EQ(replay.replays(), 2 * 4);
}

// A failed capture (at BeginCapture, in the launches, at EndCapture) falls
// back to a plain run with the same result, and that key is never captured
// again, not even after an Invalidate; other keys are unaffected.
TEST(GraphReplayTest, FailedCaptureFallsBackForGood) {
  for (const char* where : {"begin", "launches", "end"}) {
    SCOPED_TRACE(where);
    RecordingOps ops;
    if (std::string(where) == "begin") ops.fail_begin = 0;
    if (std::string(where) == "end") ops.fail_end = 0;
    GraphReplay<RecordingOps> replay(&ops, true);
    Sequence bad{&ops, "bad", 5};
    Sequence good{&ops, "good", 5};
    ASSERT_TRUE(replay.Run({0, 5}, std::ref(bad)).ok());  // warm-up
    if (std::string(where) == "launches") {
      bad.error = absl::InternalError("operation not permitted in capture");
    }
    // The capture fails; the plain run after it queues the work (and, for
    // an error in the launches, returns it as a plain run would).
    const absl::Status st = replay.Run({0, 5}, std::ref(bad));
    EXPECT_EQ(replay.failed_captures(), 1);
    EXPECT_FALSE(replay.last_failure().ok());
    if (std::string(where) == "launches") {
      EXPECT_EQ(st.code(), absl::StatusCode::kInternal);
      bad.error = absl::OkStatus();
    } else {
      EXPECT_TRUE(st.ok()) << st;
    }
    EXPECT_EQ(ops.queued.back().rfind("bad/5/", 0), 0u);
    EXPECT_FALSE(ops.capturing);
    const size_t actions = ops.actions.size();
    replay.Invalidate();
    for (int i = 0; i < 3; ++i) {
      ASSERT_TRUE(replay.Run({0, 5}, std::ref(bad)).ok());
    }
    // Plain every time: no capture was tried again.
    EXPECT_EQ(ops.actions.size(), actions);
    EXPECT_EQ(replay.failed_captures(), 1);
    // Another key still gets its graph.
    for (int i = 0; i < 3; ++i) {
      ASSERT_TRUE(replay.Run({1, 5}, std::ref(good)).ok());
    }
    EXPECT_EQ(replay.captures(), 1);
    EXPECT_EQ(replay.replays(), 1);
  }
}

// A bad argument (an error from the launches on their warm-up) is returned
// as without graphs, and the key is tried no differently after.
TEST(GraphReplayTest, WarmUpErrorIsReturned) {
  RecordingOps ops;
  GraphReplay<RecordingOps> replay(&ops, true);
  Sequence seq{&ops, "x", 3};
  seq.error = absl::InvalidArgumentError("batch: negative");
  EXPECT_EQ(replay.Run({0, 3}, std::ref(seq)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(ops.actions.empty());
}

// Random finds and inserts over more keys than fit, against a plain list
// kept in recency order: the same hits, values, size and evictions.
TEST(LruCacheTest, MatchesARecencyListOnRandomOperations) {
  for (const size_t capacity : {size_t{1}, size_t{3}, size_t{16}}) {
    SCOPED_TRACE(absl::StrCat("capacity ", capacity));
    LruCache<int, int> cache(capacity);
    std::vector<std::pair<int, int>> model;  // most recently used first
    size_t evictions = 0;
    Rng rng(20261125 + capacity);
    for (int op = 0; op < 4000; ++op) {
      const int key = static_cast<int>(rng.Below(3 * capacity + 2));
      auto it = std::find_if(model.begin(), model.end(),
                             [&](const auto& e) { return e.first == key; });
      if (rng.Below(2) == 0) {
        int* got = cache.Find(key);
        ASSERT_EQ(got != nullptr, it != model.end()) << "op " << op;
        if (got == nullptr) continue;
        EXPECT_EQ(*got, it->second) << "op " << op;
        std::rotate(model.begin(), it, it + 1);
      } else {
        const int value = op;
        EXPECT_EQ(cache.Insert(key, value), value);
        if (it != model.end()) {
          model.erase(it);
        } else if (model.size() == capacity) {
          model.pop_back();
          ++evictions;
        }
        model.insert(model.begin(), {key, value});
      }
      ASSERT_EQ(cache.size(), model.size()) << "op " << op;
    }
    EXPECT_EQ(cache.evictions(), evictions);
    EXPECT_GT(evictions, 0u);
    for (const auto& [key, value] : model) {
      ASSERT_NE(cache.Find(key), nullptr);
      EXPECT_EQ(*cache.Find(key), value);
    }
  }
}

// A table in device memory needs the model on CUDA, whether the config or
// the --device flag says where the model runs.
// NormalizeModelConfig refuses `c` with InvalidArgument, its message naming
// `field` and holding `also` (unless empty).
void ExpectRefused(const ModelConfig& c, const std::string& field,
                   const std::string& also = "") {
  const absl::Status st = NormalizeModelConfig(c).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_HAS_SUBSTR(st.message(), field) << st;
  if (!also.empty()) EXPECT_HAS_SUBSTR(st.message(), also) << st;
}

TEST(ConfigTest, StorageDeviceNeedsDeviceCuda) {
  auto parsed = ParseModelConfigText(
      "tables { name: \"a\" rows: 5 } tables { name: \"b\" rows: 5 "
      "storage: STORAGE_DEVICE } embedding_dim: 4 bottom_mlp: [4] "
      "top_mlp: [1]");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  const absl::Status on_cpu = NormalizeModelConfig(*parsed).status();
  EXPECT_EQ(on_cpu.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_HAS_SUBSTR(on_cpu.message(), "tables[1].storage") << on_cpu;
  EXPECT_HAS_SUBSTR(on_cpu.message(), "DEVICE_CUDA") << on_cpu;

  parsed->set_device(DEVICE_CUDA);
  auto on_cuda = NormalizeModelConfig(*parsed);
  ASSERT_TRUE(on_cuda.ok()) << on_cuda.status();
  EXPECT_EQ(on_cuda->tables(1).storage(), STORAGE_DEVICE);

  ModelConfig c = *on_cuda;
  const absl::Status flag = ApplyDeviceFlag("cpu", &c);
  EXPECT_EQ(flag.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_HAS_SUBSTR(flag.message(), "--device cpu") << flag;
  EXPECT_HAS_SUBSTR(flag.message(), "tables[1].storage") << flag;
  c = *on_cuda;
  EXPECT_TRUE(ApplyDeviceFlag("cuda", &c).ok());
}

// device_cache_rows: a STORAGE_DEVICE table's option, never negative; the
// errors name the table's field and the table.
TEST(ConfigTest, DeviceCacheRowsIsCheckedNamingTheTable) {
  auto parsed = ParseModelConfigText(
      "device: DEVICE_CUDA tables { name: \"a\" rows: 5 } "
      "tables { name: \"b\" rows: 500 storage: STORAGE_DEVICE "
      "device_cache_rows: 50 } embedding_dim: 4 bottom_mlp: [4] "
      "top_mlp: [1]");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  auto ok = NormalizeModelConfig(*parsed);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->tables(1).device_cache_rows(), 50);

  ModelConfig c = *parsed;
  c.mutable_tables(1)->set_device_cache_rows(-1);
  ExpectRefused(c, "tables[1].device_cache_rows (b)");

  c = *parsed;
  c.mutable_tables(0)->set_device_cache_rows(3);
  ExpectRefused(c, "tables[0].device_cache_rows (a)", "STORAGE_HOST");
}

// device_cache_backing: STORAGE_HOST (default) or STORAGE_ROCKSDB, only with
// a device cache, RocksDB only with rocksdb.path; RocksDB under the device
// cache gets the tier's defaults as a STORAGE_ROCKSDB table does.
TEST(ConfigTest, DeviceCacheBackingIsCheckedNamingTheTable) {
  auto parsed = ParseModelConfigText(
      "device: DEVICE_CUDA tables { name: \"a\" rows: 5 } "
      "tables { name: \"b\" rows: 500 storage: STORAGE_DEVICE "
      "device_cache_rows: 50 device_cache_backing: STORAGE_ROCKSDB } "
      "rocksdb { path: \"/tmp/rows\" } embedding_dim: 4 bottom_mlp: [4] "
      "top_mlp: [1]");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  auto ok = NormalizeModelConfig(*parsed);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->tables(1).device_cache_backing(), STORAGE_ROCKSDB);
  EXPECT_EQ(ok->tables(0).device_cache_backing(), STORAGE_HOST);
  EXPECT_TRUE(RowsOnRocksDb(ok->tables(1)));
  EXPECT_FALSE(RowsOnRocksDb(ok->tables(0)));
  // The host tier between the device and RocksDB: cache_fraction 0.1.
  EXPECT_DOUBLE_EQ(ok->rocksdb().cache_fraction(), 0.1);
  EXPECT_EQ(CachedRowsOfTable(*ok, 1), 50);

  ModelConfig c = *parsed;
  c.mutable_rocksdb()->clear_path();
  ExpectRefused(c, "tables[1].device_cache_backing (b)", "rocksdb.path");
  c = *parsed;
  c.mutable_tables(1)->set_device_cache_backing(STORAGE_DEVICE);
  ExpectRefused(c, "tables[1].device_cache_backing (b)", "STORAGE_HOST or");
  c = *parsed;
  c.mutable_tables(1)->set_device_cache_backing(static_cast<StorageTier>(9));
  ExpectRefused(c, "tables[1].device_cache_backing (b)", "STORAGE_HOST or");
  c = *parsed;
  c.mutable_tables(1)->set_device_cache_rows(0);
  ExpectRefused(c, "tables[1].device_cache_backing (b)", "device_cache_rows");
  // On a table without a device cache (a host table): refused too.
  c = *parsed;
  c.mutable_tables(0)->set_device_cache_backing(STORAGE_ROCKSDB);
  ExpectRefused(c, "tables[0].device_cache_backing (a)", "device_cache_rows");
  // STORAGE_HOST behind the device cache needs no path.
  c = *parsed;
  c.mutable_tables(1)->set_device_cache_backing(STORAGE_HOST);
  c.mutable_rocksdb()->clear_path();
  EXPECT_TRUE(NormalizeModelConfig(c).ok());
}

// weight_precision: a RowPrecision; 16-bit rows on STORAGE_HOST and
// STORAGE_ROCKSDB tables of a DEVICE_CPU model only, refused elsewhere (the
// device tier, with or without its cache) naming the field and the tier.
TEST(ConfigTest, WeightPrecisionIsCheckedNamingTheTableAndTier) {
  auto parsed = ParseModelConfigText(
      "tables { name: \"a\" rows: 5 weight_precision: ROW_BF16 } "
      "tables { name: \"b\" rows: 50 weight_precision: ROW_FP16 } "
      "rocksdb { path: \"/tmp/rows\" } embedding_dim: 4 bottom_mlp: [4] "
      "top_mlp: [1]");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  auto ok = NormalizeModelConfig(*parsed);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->tables(0).weight_precision(), ROW_BF16);
  EXPECT_EQ(ok->tables(1).weight_precision(), ROW_FP16);

  ModelConfig c = *parsed;
  c.mutable_tables(1)->set_weight_precision(static_cast<RowPrecision>(7));
  ExpectRefused(c, "tables[1].weight_precision (b)", "invalid");
  // The RocksDB tier keeps them.
  c = *parsed;
  c.mutable_tables(1)->set_storage(STORAGE_ROCKSDB);
  EXPECT_TRUE(NormalizeModelConfig(c).ok()) << NormalizeModelConfig(c).status();
  c.mutable_tables(0)->set_storage(STORAGE_ROCKSDB);
  c.mutable_rocksdb()->set_cache_fraction(0.5);
  EXPECT_TRUE(NormalizeModelConfig(c).ok()) << NormalizeModelConfig(c).status();
  c = *parsed;
  c.set_device(DEVICE_CUDA);
  c.mutable_tables(0)->set_storage(STORAGE_DEVICE);
  ExpectRefused(c, "tables[0].weight_precision (a)", "STORAGE_DEVICE tier");
  // A device cache over RocksDB is the device tier too.
  c.mutable_tables(0)->set_device_cache_rows(2);
  c.mutable_tables(0)->set_device_cache_backing(STORAGE_ROCKSDB);
  ExpectRefused(c, "tables[0].weight_precision (a)", "STORAGE_DEVICE tier");
  c = *parsed;
  c.set_device(DEVICE_CUDA);
  ExpectRefused(c, "tables[0].weight_precision (a)", "DEVICE_CPU");
  // fp32 rows go anywhere.
  c = *parsed;
  c.mutable_tables(1)->set_weight_precision(ROW_FP32);
  c.mutable_tables(1)->set_storage(STORAGE_ROCKSDB);
  EXPECT_TRUE(NormalizeModelConfig(c).ok());

  // --row-precision sets every table's; empty keeps the config's.
  c = *parsed;
  ASSERT_TRUE(ApplyRowPrecisionFlag("", &c).ok());
  EXPECT_EQ(c.tables(0).weight_precision(), ROW_BF16);
  ASSERT_TRUE(ApplyRowPrecisionFlag("fp16", &c).ok());
  EXPECT_EQ(c.tables(0).weight_precision(), ROW_FP16);
  EXPECT_EQ(c.tables(1).weight_precision(), ROW_FP16);
  ASSERT_TRUE(ApplyRowPrecisionFlag("fp32", &c).ok());
  EXPECT_EQ(c.tables(1).weight_precision(), ROW_FP32);
  const absl::Status bad = ApplyRowPrecisionFlag("half", &c);
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_HAS_SUBSTR(bad.message(), "--row-precision");
  EXPECT_STREQ(RowPrecisionName(ROW_BF16), "bf16");
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

// A fresh directory per test, removed afterwards.
class FileSystemTest : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::TempDir() + "/core_test_fs_" + std::to_string(getpid()) +
           "_" + testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::remove_all(dir_);
    ASSERT_TRUE(DefaultFileSystem()->CreateDirectories(dir_ + "/a/b").ok());
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string dir_;
};

TEST_F(FileSystemTest, PosixWritesRenamesExchangesAndRemoves) {
  FileSystem& fs = *DefaultFileSystem();
  const std::string x = dir_ + "/x", y = dir_ + "/y";
  ASSERT_TRUE(WriteFile(fs, x, "first").ok());
  ASSERT_TRUE(WriteFile(fs, y, "second").ok());
  EXPECT_EQ(*ReadFile(fs, x), "first");
  const absl::Status exchanged = fs.Exchange(x, y);
  if (!absl::IsUnimplemented(exchanged)) {
    ASSERT_TRUE(exchanged.ok()) << exchanged;
    EXPECT_EQ(*ReadFile(fs, x), "second");
    EXPECT_EQ(*ReadFile(fs, y), "first");
  }
  ASSERT_TRUE(fs.Rename(x, dir_ + "/a/z").ok());
  EXPECT_FALSE(std::filesystem::exists(x));
  ASSERT_TRUE(fs.SyncDirectory(dir_ + "/a").ok());
  ASSERT_TRUE(fs.RemoveAll(dir_ + "/a").ok());
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/a/z"));
  EXPECT_TRUE(fs.RemoveAll(dir_ + "/absent").ok());

  // Errors name the path and carry the errno's code.
  const absl::StatusOr<std::string> missing = ReadFile(fs, dir_ + "/absent");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_HAS_SUBSTR(missing.status().message(), dir_ + "/absent")
      << missing.status();
  EXPECT_EQ(fs.Rename(dir_ + "/absent", y).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(ErrnoStatus(ENOSPC, "writing", "/p").code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(ErrnoStatus(EDQUOT, "writing", "/p").code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(ErrnoStatus(EIO, "writing", "/p").code(),
            absl::StatusCode::kInternal);
  EXPECT_EQ(ErrnoStatus(EIO, "writing", "/p").message(),
            "writing /p: Input/output error");
}

TEST_F(FileSystemTest, FaultsHitTheChosenCallOnly) {
  FaultInjectionFileSystem fs(DefaultFileSystem());
  // The 2nd write to a path containing "b/" fails; others pass.
  fs.FailNth(FileOp::kWrite, 2, EIO, "b/");
  auto file = fs.NewWritableFile(dir_ + "/a/b/f");
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_TRUE(WriteFile(fs, dir_ + "/other", "x").ok());
  EXPECT_TRUE((*file)->Append("one").ok());
  const absl::Status second = (*file)->Append("two");
  EXPECT_EQ(second.code(), absl::StatusCode::kInternal);
  EXPECT_HAS_SUBSTR(second.message(), dir_ + "/a/b/f") << second;
  EXPECT_HAS_SUBSTR(second.message(), "(injected)") << second;
  EXPECT_TRUE((*file)->Append("three").ok());
  ASSERT_TRUE((*file)->Close().ok());
  EXPECT_EQ(*ReadFile(fs, dir_ + "/a/b/f"), "onethree");
  EXPECT_EQ(fs.injected(), 1);
  EXPECT_EQ(fs.Count(FileOp::kWrite), 4);

  // Every rename from now on, until Reset.
  fs.FailAll(FileOp::kRename, EIO);
  EXPECT_FALSE(fs.Rename(dir_ + "/other", dir_ + "/moved").ok());
  EXPECT_FALSE(fs.Rename(dir_ + "/other", dir_ + "/moved").ok());
  EXPECT_TRUE(std::filesystem::exists(dir_ + "/other"));
  fs.Reset();
  EXPECT_TRUE(fs.Rename(dir_ + "/other", dir_ + "/moved").ok());

  fs.SetExchangeSupported(false);
  EXPECT_TRUE(absl::IsUnimplemented(fs.Exchange(dir_ + "/moved", dir_ + "/a")));
}

TEST_F(FileSystemTest, FullDiskCutsTheWriteShort) {
  FaultInjectionFileSystem fs(DefaultFileSystem());
  fs.SetFreeBytes(5);
  const absl::Status s = WriteFile(fs, dir_ + "/f", "0123456789");
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_HAS_SUBSTR(s.message(), dir_ + "/f") << s;
  EXPECT_HAS_SUBSTR(s.message(), "No space left on device") << s;
  EXPECT_EQ(std::filesystem::file_size(dir_ + "/f"), 5u);
  fs.Reset();
  EXPECT_TRUE(WriteFile(fs, dir_ + "/f", "0123456789").ok());
}

TEST_F(FileSystemTest, CorruptReadsFlipABitOfMatchingFilesOnly) {
  FaultInjectionFileSystem fs(DefaultFileSystem());
  ASSERT_TRUE(WriteFile(fs, dir_ + "/bad.bin", "abc").ok());
  ASSERT_TRUE(WriteFile(fs, dir_ + "/good.bin", "abc").ok());
  fs.CorruptReads("bad");
  const absl::StatusOr<std::string> bad = ReadFile(fs, dir_ + "/bad.bin");
  ASSERT_TRUE(bad.ok());
  EXPECT_NE(*bad, "abc");
  EXPECT_EQ(bad->size(), 3u);
  EXPECT_EQ(*ReadFile(fs, dir_ + "/good.bin"), "abc");
  EXPECT_EQ(*ReadFile(*DefaultFileSystem(), dir_ + "/bad.bin"), "abc");
}

// The grids of the embedding kernels' launches near 2^31 items, where
// (a + b - 1) / b in int arithmetic would overflow.
TEST(LaunchGridTest, CeilDivDoesNotOverflowNearTheMaximum) {
  constexpr int kMax = std::numeric_limits<int>::max();
  EXPECT_EQ(cuda::CeilDiv(kMax, 256), 8388608);
  EXPECT_EQ(cuda::CeilDiv(kMax - 255, 256), 8388607);
  EXPECT_EQ(cuda::CeilDiv(kMax, 1), kMax);
  EXPECT_EQ(cuda::CeilDiv(0, 256), 0);
  EXPECT_EQ(cuda::CeilDiv(1, 256), 1);
  EXPECT_EQ(cuda::CeilDiv(256, 256), 1);
  EXPECT_EQ(cuda::CeilDiv(257, 256), 2);
  constexpr int64_t kMax64 = std::numeric_limits<int64_t>::max();
  EXPECT_EQ(cuda::CeilDiv<int64_t>(kMax64, 2), kMax64 / 2 + 1);
}

TEST(LaunchGridTest, GridBlocksCoversEveryItemUpToTheCap) {
  // ExpandKernel: one thread per id, up to 2^31 - 1 ids.
  constexpr int64_t kIds = std::numeric_limits<int32_t>::max();
  EXPECT_EQ(cuda::GridBlocks(kIds, 1, 256), 8388608);
  EXPECT_GE(cuda::GridBlocks(kIds, 1, 256) * 256, kIds);
  EXPECT_EQ(cuda::GridBlocks(kIds - 255, 1, 256), 8388607);
  // The row and record copies: n x floats items, at most 2^16 blocks.
  EXPECT_EQ(cuda::GridBlocks(1000, 3, 256, 1 << 16), 12);
  EXPECT_EQ(cuda::GridBlocks(int64_t{1} << 40, 3 * 1024, 256, 1 << 16),
            1 << 16);
  // A product past int64's range is the cap, never an overflow.
  EXPECT_EQ(cuda::GridBlocks(int64_t{1} << 62, int64_t{1} << 10, 256, 4096),
            4096);
  EXPECT_EQ(cuda::GridBlocks(0, 5, 256), 0);
  EXPECT_EQ(cuda::GridBlocks(5, 0, 256), 0);
  EXPECT_EQ(cuda::GridBlocks(1, 1, 256), 1);
  EXPECT_EQ(cuda::GridBlocks(int64_t{1} << 30, 1, 1024), int64_t{1} << 20);
  EXPECT_EQ(cuda::GridBlocks(int64_t{1} << 42, 1, 1024), cuda::kMaxGridX);
}

// ---- What a resumed model may change (core/config_change.h).

// Every leaf field under `d`, as FieldRule's paths ("tables.rows").
void LeafPaths(const google::protobuf::Descriptor* d, const std::string& prefix,
               std::vector<std::string>* out) {
  for (int k = 0; k < d->field_count(); ++k) {
    const google::protobuf::FieldDescriptor* f = d->field(k);
    if (f->message_type() != nullptr) {
      LeafPaths(f->message_type(), prefix + f->name() + ".", out);
    } else {
      out->push_back(prefix + f->name());
    }
  }
}

TEST(ConfigChangeTest, EveryFieldOfModelConfigHasARule) {
  std::vector<std::string> leaves;
  LeafPaths(ModelConfig::descriptor(), "", &leaves);
  ASSERT_GT(leaves.size(), 40u);
  for (const std::string& path : leaves) {
    EXPECT_TRUE(FieldRule(path).ok()) << path;
  }
  // And every top-level field is decided by an entry of its own (a new
  // field of ModelConfig needs a decision, not an inherited default).
  const std::vector<std::string> rules = ConfigFieldRulePaths();
  for (int k = 0; k < ModelConfig::descriptor()->field_count(); ++k) {
    const std::string name = ModelConfig::descriptor()->field(k)->name();
    EXPECT_NE(std::find(rules.begin(), rules.end(), name), rules.end()) << name;
  }
  EXPECT_FALSE(FieldRule("no_such_field").ok());
}

TEST(ConfigChangeTest, TheRulesKeepTheArchitectureAndFreeTheRates) {
  for (const char* path :
       {"tables.rows", "tables.dim", "tables", "bottom_mlp", "top_mlp",
        "interaction", "seed", "dense_optimizer.type", "sparse_optimizer.type",
        "sparse_optimizer.initial_accumulator", "embedding_dim",
        "dcn_low_rank_dim"}) {
    EXPECT_EQ(*FieldRule(path), FieldMutability::kImmutable) << path;
  }
  for (const char* path :
       {"dense_optimizer.learning_rate", "sparse_optimizer.learning_rate",
        "sparse_optimizer.schedule.warmup_steps",
        "dense_optimizer.schedule.polynomial_decay.decay_steps",
        "dense_optimizer.beta2", "tables.storage", "rocksdb.cache_rows",
        "device", "dense_precision"}) {
    EXPECT_EQ(*FieldRule(path), FieldMutability::kMutable) << path;
  }
}

TEST(ConfigChangeTest, ChangedRatesAndScheduleAreAppliedFieldByField) {
  const ModelConfig saved = *LoadModelConfig("tiny");
  ModelConfig next = saved;
  next.mutable_sparse_optimizer()->set_learning_rate(0.05f);
  next.mutable_dense_optimizer()->mutable_schedule()->set_warmup_steps(10);
  next = *NormalizeModelConfig(next);
  std::vector<ConfigDifference> changes;
  absl::StatusOr<ModelConfig> resumed = ResumeConfig(saved, next, &changes);
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_EQ(resumed->sparse_optimizer().learning_rate(), 0.05f);
  EXPECT_EQ(resumed->dense_optimizer().schedule().warmup_steps(), 10);
  ASSERT_EQ(changes.size(), 2u);
  EXPECT_EQ(changes[0].ToString(),
            "resume: dense_optimizer.schedule.warmup_steps 0 -> 10");
  EXPECT_EQ(changes[1].ToString(),
            "resume: sparse_optimizer.learning_rate 0.1 -> 0.05");
  // The same config changes nothing.
  ASSERT_TRUE(ResumeConfig(saved, saved, &changes).ok());
  EXPECT_TRUE(changes.empty());
}

TEST(ConfigChangeTest, AnImmutableChangeIsRefusedNamingTheFieldAndBothValues) {
  const ModelConfig saved = *LoadModelConfig("tiny");
  ModelConfig next = saved;
  next.mutable_tables(2)->set_rows(200);
  next.mutable_sparse_optimizer()->set_learning_rate(0.05f);
  std::vector<ConfigDifference> changes;
  absl::StatusOr<ModelConfig> resumed = ResumeConfig(saved, next, &changes);
  ASSERT_EQ(resumed.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_HAS_SUBSTR(resumed.status().message(),
                    "tables[2].rows: the checkpoint has 100, the config 200")
      << resumed.status();
  // The learning rate alone is not what is refused.
  EXPECT_NO_SUBSTR(resumed.status().message(), "learning_rate");

  next = saved;
  next.mutable_sparse_optimizer()->set_type(OptimizerConfig::ADAGRAD);
  next.add_top_mlp(1);
  resumed = ResumeConfig(saved, next, &changes);
  ASSERT_FALSE(resumed.ok());
  EXPECT_HAS_SUBSTR(resumed.status().message(),
                    "top_mlp: the checkpoint has [8, 1], the config [8, 1, 1]")
      << resumed.status();
  EXPECT_HAS_SUBSTR(resumed.status().message(),
                    "sparse_optimizer.type: the checkpoint has SGD, the config "
                    "ADAGRAD")
      << resumed.status();

  next = saved;
  next.add_tables()->set_name("t3");
  resumed = ResumeConfig(saved, next, &changes);
  ASSERT_FALSE(resumed.ok());
  EXPECT_HAS_SUBSTR(
      resumed.status().message(),
      "tables: the checkpoint has 3 entries, the config 4 entries")
      << resumed.status();
}

}  // namespace
}  // namespace dlrm
