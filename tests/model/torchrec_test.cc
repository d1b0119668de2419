// Tests for model/torchrec.h without Python: TorchRec's names and shapes,
// export then import giving identical weights (host and RocksDB tiers, dot
// and DCN), checkpoints made from a state_dict, and bad state_dicts and
// configs refused naming the tensor or field.
// tests/model/torchrec_interop_test.py checks the same against the real
// TorchRec.
#include "model/torchrec.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/config.h"
#include "data/synthetic.h"
#include "embedding/dynamic_store.h"
#include "model/checkpoint.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "tests/support/expect.h"
#include "tests/support/synthetic.h"

namespace dlrm::model {
namespace {

namespace fs = std::filesystem;

// The model of the docs' example: 3 tables of dim 4, 5 dense features,
// bottom 5-8-4, top 6-3-1 (DLRM) or 6-1 (DLRM_DCN, 2 layers of rank 3).
ModelConfig Config(Interaction interaction) {
  std::string text = R"(
    num_dense_features: 5
    tables { name: "t0" rows: 10 dim: 4 }
    tables { name: "t1" rows: 11 dim: 4 pooling: POOLING_MEAN }
    tables { name: "t2" rows: 12 dim: 4 }
    bottom_mlp: [8, 4]
    dense_optimizer { type: ADAM learning_rate: 0.01 }
    sparse_optimizer { type: ADAGRAD learning_rate: 0.05 }
    seed: 5
  )";
  if (interaction == INTERACTION_DCN) {
    absl::StrAppend(&text,
                    "interaction: INTERACTION_DCN dcn_num_layers: 2 "
                    "dcn_low_rank_dim: 3 top_mlp: [6, 1]");
  } else {
    absl::StrAppend(&text, "interaction: INTERACTION_DOT top_mlp: [6, 3, 1]");
  }
  auto parsed = ParseModelConfigText(text);
  EXPECT_TRUE(parsed.ok()) << parsed.status();
  auto c = NormalizeModelConfig(*parsed);
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

data::Batch Batch(const ModelConfig& c, int64_t n, uint64_t seed) {
  return test::SyntheticSamples(c, n, seed);
}

std::unique_ptr<Model> Trained(const ModelConfig& c, int steps) {
  auto m = Model::Create(c);
  EXPECT_TRUE(m.ok()) << m.status();
  for (int s = 0; s < steps; ++s) {
    EXPECT_TRUE((*m)->TrainStep(Batch(c, 32, 100 + s)).ok());
  }
  return *std::move(m);
}

std::vector<float> Predictions(Model& m) {
  std::vector<float> probs;
  const absl::Status s = m.Predict(Batch(m.config(), 64, 7), &probs);
  EXPECT_TRUE(s.ok()) << s;
  return probs;
}

class TorchRecTest : public ::testing::TestWithParam<Interaction> {
 protected:
  void SetUp() override {
    // CTest runs the cases in parallel processes: the directory is the
    // case's and the process's own.
    const ::testing::TestInfo* info =
        ::testing::UnitTest::GetInstance()->current_test_info();
    std::string name = absl::StrCat("torchrec_", info->test_suite_name(), "_",
                                    info->name(), "_", ::getpid());
    std::replace(name.begin(), name.end(), '/', '_');
    dir_ = fs::path(::testing::TempDir()) / name;
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Every tensor of the state_dict files `a` and `b` of `config` equal.
  void ExpectSameTensors(const std::string& a, const std::string& b,
                         const ModelConfig& config) {
    auto fa = SafetensorsFile::Open(a);
    auto fb = SafetensorsFile::Open(b);
    ASSERT_TRUE(fa.ok() && fb.ok());
    EXPECT_EQ((*fa)->Names(), (*fb)->Names());
    const auto tensors = TorchRecTensors(config);
    ASSERT_TRUE(tensors.ok());
    for (const TorchRecTensor& t : *tensors) {
      auto x = (*fa)->Get(t.torchrec_name, t.shape);
      auto y = (*fb)->Get(t.torchrec_name, t.shape);
      ASSERT_TRUE(x.ok() && y.ok()) << t.torchrec_name;
      EXPECT_TRUE(std::equal(x->begin(), x->end(), y->begin(), y->end()))
          << t.torchrec_name;
    }
  }

  fs::path dir_;
};

TEST(TorchRecNamesTest, DotPairOrderIsTorchRecsUpperTriangle) {
  // n = 4: ours (1,0) (2,0) (2,1) (3,0) (3,1) (3,2); TorchRec (0,1) (0,2)
  // (0,3) (1,2) (1,3) (2,3).
  EXPECT_EQ(TorchRecDotPairOrder(4), (std::vector<int>{0, 1, 3, 2, 4, 5}));
  EXPECT_EQ(TorchRecDotPairOrder(3), (std::vector<int>{0, 1, 2}));
  EXPECT_TRUE(TorchRecDotPairOrder(1).empty());
  for (int n = 2; n <= 30; ++n) {
    std::vector<int> order = TorchRecDotPairOrder(n);
    std::sort(order.begin(), order.end());
    for (size_t p = 0; p < order.size(); ++p) ASSERT_EQ(order[p], int(p)) << n;
  }
}

// The keys and shapes TorchRec 1.9's state_dict() lists for the same
// models (printed from torchrec.models.dlrm.DLRM and DLRM_DCN), in order.
TEST(TorchRecNamesTest, NamesAndShapesAreTorchRecsStateDict) {
  const std::vector<std::pair<std::string, std::vector<int64_t>>> tables = {
      {"sparse_arch.embedding_bag_collection.embedding_bags.t0.weight",
       {10, 4}},
      {"sparse_arch.embedding_bag_collection.embedding_bags.t1.weight",
       {11, 4}},
      {"sparse_arch.embedding_bag_collection.embedding_bags.t2.weight",
       {12, 4}},
      {"dense_arch.model._mlp.0._linear.weight", {8, 5}},
      {"dense_arch.model._mlp.0._linear.bias", {8}},
      {"dense_arch.model._mlp.1._linear.weight", {4, 8}},
      {"dense_arch.model._mlp.1._linear.bias", {4}}};
  auto dlrm = tables;
  dlrm.insert(dlrm.end(), {{"over_arch.model.0._mlp.0._linear.weight", {6, 10}},
                           {"over_arch.model.0._mlp.0._linear.bias", {6}},
                           {"over_arch.model.0._mlp.1._linear.weight", {3, 6}},
                           {"over_arch.model.0._mlp.1._linear.bias", {3}},
                           {"over_arch.model.1.weight", {1, 3}},
                           {"over_arch.model.1.bias", {1}}});
  auto dcn = tables;
  dcn.insert(dcn.end(), {{"inter_arch.crossnet.W_kernels.0", {16, 3}},
                         {"inter_arch.crossnet.W_kernels.1", {16, 3}},
                         {"inter_arch.crossnet.V_kernels.0", {3, 16}},
                         {"inter_arch.crossnet.V_kernels.1", {3, 16}},
                         {"inter_arch.crossnet.bias.0", {16}},
                         {"inter_arch.crossnet.bias.1", {16}},
                         {"over_arch.model.0._mlp.0._linear.weight", {6, 16}},
                         {"over_arch.model.0._mlp.0._linear.bias", {6}},
                         {"over_arch.model.1.weight", {1, 6}},
                         {"over_arch.model.1.bias", {1}}});
  for (const auto& [interaction, expected] :
       {std::pair{INTERACTION_DOT, dlrm}, std::pair{INTERACTION_DCN, dcn}}) {
    auto tensors = TorchRecTensors(Config(interaction));
    ASSERT_TRUE(tensors.ok()) << tensors.status();
    ASSERT_EQ(tensors->size(), expected.size());
    for (size_t i = 0; i < expected.size(); ++i) {
      EXPECT_EQ((*tensors)[i].torchrec_name, expected[i].first);
      EXPECT_EQ((*tensors)[i].shape, expected[i].second) << expected[i].first;
      EXPECT_EQ((*tensors)[i].pair_columns_permuted,
                interaction == INTERACTION_DOT &&
                    (*tensors)[i].name == "top_mlp.0.weight");
    }
    // Our names cover every parameter once: the dense ones in the model's
    // order after the tables.
    auto m = Model::Create(Config(interaction));
    ASSERT_TRUE(m.ok());
    std::vector<std::string> ours, names;
    for (const auto& p : (*m)->dense_params()) ours.push_back(p.name);
    for (const TorchRecTensor& t : *tensors) names.push_back(t.name);
    std::sort(ours.begin(), ours.end());
    std::vector<std::string> dense_names(names.begin() + 3, names.end());
    std::sort(dense_names.begin(), dense_names.end());
    EXPECT_EQ(ours, dense_names);
  }
}

TEST(TorchRecNamesTest, ConfigsWithoutATorchRecCounterpartAreRefused) {
  ModelConfig cat = Config(INTERACTION_DOT);
  cat.set_interaction(INTERACTION_CAT);
  absl::Status s = CheckTorchRecCompatible(cat);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_HAS_SUBSTR(s.message(), "INTERACTION_CAT") << s;

  ModelConfig dims = Config(INTERACTION_DCN);
  dims.mutable_tables(1)->set_dim(8);  // DCN allows it, TorchRec does not
  ASSERT_TRUE(NormalizeModelConfig(dims).ok());
  s = CheckTorchRecCompatible(dims);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_HAS_SUBSTR(s.message(), "tables[1] (t1) has dim 8") << s;

  ModelConfig one = Config(INTERACTION_DOT);
  one.clear_top_mlp();
  one.add_top_mlp(1);
  s = TorchRecTensors(one).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_HAS_SUBSTR(s.message(), "top_mlp has 1 layer") << s;

  // The export refuses such a model rather than write another layout.
  auto m = Model::Create(*NormalizeModelConfig(cat));
  ASSERT_TRUE(m.ok());
  const std::string path =
      (fs::path(::testing::TempDir()) /
       absl::StrCat("torchrec_cat_", ::getpid(), ".safetensors"))
          .string();
  EXPECT_EQ(ExportTorchRec(**m, path).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE(fs::exists(path));
}

TEST_P(TorchRecTest, ExportThenImportGivesIdenticalWeights) {
  const ModelConfig c = Config(GetParam());
  std::unique_ptr<Model> a = Trained(c, 3);
  const std::string first = (dir_ / "a.safetensors").string();
  auto exported = ExportTorchRec(*a, first);
  ASSERT_TRUE(exported.ok()) << exported.status();
  EXPECT_EQ(exported->step, 3);
  EXPECT_EQ(exported->tensors,
            static_cast<int64_t>(TorchRecTensors(c)->size()));
  EXPECT_EQ(exported->bytes, static_cast<int64_t>(fs::file_size(first)));

  // Into a model of other initial weights (another seed) whose table t2 is
  // on RocksDB: every weight is replaced, through the store too.
  ModelConfig other = c;
  other.set_seed(99);
  RocksDbConfig rocksdb;
  rocksdb.set_path((dir_ / "rocksdb").string());
  rocksdb.set_cache_rows(12);
  auto placed = PlaceTablesOnRocksDb(other, {"t2"}, rocksdb);
  ASSERT_TRUE(placed.ok()) << placed.status();
  auto b = Model::Create(*placed);
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_NE(*(*b)->WeightChecksum(), *a->WeightChecksum());
  auto file = SafetensorsFile::Open(first);
  ASSERT_TRUE(file.ok());
  ASSERT_TRUE(ImportTorchRecWeights(**file, **b).ok());
  EXPECT_EQ(*(*b)->WeightChecksum(), *a->WeightChecksum());
  EXPECT_EQ(Predictions(**b), Predictions(*a));
  EXPECT_EQ((*b)->steps(), 0);  // weights only

  // And back out, from the RocksDB tier: the same tensors.
  const std::string second = (dir_ / "b.safetensors").string();
  ASSERT_TRUE(ExportTorchRec(**b, second).ok());
  ExpectSameTensors(first, second, c);
}

TEST_P(TorchRecTest, CheckpointFromAStateDictServesTheSameModel) {
  const ModelConfig c = Config(GetParam());
  std::unique_ptr<Model> a = Trained(c, 2);
  const std::string state_dict = (dir_ / "a.safetensors").string();
  ASSERT_TRUE(ExportTorchRec(*a, state_dict).ok());

  const std::string ckpt = (dir_ / "ckpt").string();
  auto info = ImportTorchRecCheckpoint(state_dict, c, ckpt);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->step, 0);
  // A full restore (optimizer state included) works: the state is a new
  // model's, so training resumes from it.
  auto restored = LoadCheckpoint(ckpt, /*weights_only=*/false);
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_EQ(*(*restored)->WeightChecksum(), *a->WeightChecksum());
  EXPECT_EQ(Predictions(**restored), Predictions(*a));
  auto fresh = Model::Create(c);
  ASSERT_TRUE(fresh.ok());
  EXPECT_EQ((*restored)->dense_optimizer().step(),
            (*fresh)->dense_optimizer().step());
  EXPECT_TRUE((*restored)->TrainStep(Batch(c, 32, 5)).ok());

  // The directory exists now: refused unless overwriting.
  auto again = ImportTorchRecCheckpoint(state_dict, c, ckpt);
  EXPECT_EQ(again.status().code(), absl::StatusCode::kAlreadyExists);
  TorchRecImportOptions overwrite;
  overwrite.overwrite = true;
  EXPECT_TRUE(ImportTorchRecCheckpoint(state_dict, c, ckpt, overwrite).ok());

  // Checkpoint -> state_dict gives the file back.
  const std::string back = (dir_ / "back.safetensors").string();
  auto exported = ExportTorchRecCheckpoint(ckpt, back);
  ASSERT_TRUE(exported.ok()) << exported.status();
  ExpectSameTensors(state_dict, back, c);
}

// Writes the state_dict of `config` with `edit` applied to the tensor list
// (all zeros), returns its path.
std::string WriteStateDict(
    const fs::path& dir, const std::string& name, const ModelConfig& config,
    const std::function<void(std::vector<TensorSpec>*)>& edit) {
  std::vector<TensorSpec> specs;
  const auto all = TorchRecTensors(config);
  EXPECT_TRUE(all.ok());
  for (const TorchRecTensor& t : *all) {
    specs.push_back({t.torchrec_name, t.shape});
  }
  edit(&specs);
  std::vector<std::vector<float>> data;
  std::vector<TensorToWrite> tensors;
  for (const TensorSpec& s : specs) {
    int64_t n = 1;
    for (int64_t d : s.shape) n *= d;
    data.emplace_back(n, 0.0f);
  }
  for (size_t i = 0; i < specs.size(); ++i) {
    tensors.push_back({specs[i].name, specs[i].shape, data[i].data()});
  }
  const std::string path = (dir / name).string();
  EXPECT_TRUE(WriteSafetensors(path, tensors, {}).ok());
  return path;
}

TEST_P(TorchRecTest, BadStateDictsAreRefusedNamingTheTensor) {
  const ModelConfig c = Config(GetParam());
  auto m = Model::Create(c);
  ASSERT_TRUE(m.ok());
  const uint64_t before = *(*m)->WeightChecksum();
  const std::string bottom = "dense_arch.model._mlp.1._linear.weight";
  struct Case {
    std::string name;
    std::function<void(std::vector<TensorSpec>*)> edit;
    std::vector<std::string> expected;  // substrings of the message
  };
  const std::vector<Case> cases = {
      {"renamed",
       [&](std::vector<TensorSpec>* s) {
         for (auto& t : *s) {
           if (t.name == bottom) t.name = "module." + bottom;
         }
       },
       {"missing tensor " + bottom + " [4, 8] (our bottom_mlp.1.weight)",
        "unexpected tensor module." + bottom, "(" + bottom + " with a prefix"}},
      {"shape",
       [](std::vector<TensorSpec>* s) {
         (*s)[1].shape = {12, 4};  // t1 has 11 rows
       },
       {"tensor sparse_arch.embedding_bag_collection.embedding_bags.t1.weight "
        "has shape [12, 4], expected [11, 4] (our embedding_bags.t1.weight)"}},
      {"missing",
       [](std::vector<TensorSpec>* s) { s->pop_back(); },
       {"missing tensor over_arch.model.1.bias [1] (our top_mlp."}},
      {"extra",
       [](std::vector<TensorSpec>* s) {
         s->push_back({"over_arch.model.2.weight", {1, 1}});
       },
       {"unexpected tensor over_arch.model.2.weight"}},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.name);
    const std::string path =
        WriteStateDict(dir_, k.name + ".safetensors", c, k.edit);
    auto file = SafetensorsFile::Open(path);
    ASSERT_TRUE(file.ok()) << file.status();
    const absl::Status s = ImportTorchRecWeights(**file, **m);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    for (const std::string& e : k.expected) {
      EXPECT_HAS_SUBSTR(s.message(), e) << "'" << e << "' not in: " << s;
    }
    EXPECT_EQ(*(*m)->WeightChecksum(), before);
    // The checkpoint path refuses before writing anything, naming the file.
    const std::string ckpt = (dir_ / (k.name + "_ckpt")).string();
    const absl::Status t = ImportTorchRecCheckpoint(path, c, ckpt).status();
    EXPECT_EQ(t.code(), absl::StatusCode::kInvalidArgument) << t;
    EXPECT_HAS_SUBSTR(t.message(), path) << t;
    EXPECT_FALSE(fs::exists(ckpt));
  }

  // A half-precision tensor is refused by the state_dict check, named.
  const std::string f16 = (dir_ / "f16.safetensors").string();
  {
    const std::string header =
        R"({"over_arch.model.1.bias":{"dtype":"F16","shape":[1],"data_offsets":[0,2]}})";
    std::ofstream out(f16, std::ios::binary);
    const uint64_t size = header.size();
    out.write(reinterpret_cast<const char*>(&size), 8);
    out << header << std::string(2, '\0');
  }
  const absl::Status s =
      ImportTorchRecCheckpoint(f16, c, (dir_ / "f16_ckpt").string()).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_HAS_SUBSTR(s.message(), "over_arch.model.1.bias has dtype F16") << s;
  EXPECT_EQ(ImportTorchRecCheckpoint((dir_ / "none.safetensors").string(), c,
                                     (dir_ / "none_ckpt").string())
                .status()
                .code(),
            absl::StatusCode::kNotFound);
}

// A DLRM with two dynamic tables (u: LRU, a time to live, unadmitted ids
// at zero; v: LFU, a shared row for unadmitted ids) and a static one.
ModelConfig DynamicConfig() {
  auto parsed = ParseModelConfigText(R"(
    num_dense_features: 5
    tables { name: "u" rows: 40 dim: 4 dynamic: true
             eviction { ttl_steps: 50 } }
    tables { name: "v" rows: 36 dim: 4 pooling: POOLING_MEAN dynamic: true
             unadmitted: UNADMITTED_SHARED_ROW eviction { kind: EVICT_LFU } }
    tables { name: "t2" rows: 12 dim: 4 }
    bottom_mlp: [8, 4] interaction: INTERACTION_DOT top_mlp: [6, 3, 1]
    dense_optimizer { type: ADAM learning_rate: 0.01 }
    sparse_optimizer { type: ADAGRAD learning_rate: 0.05 }
    seed: 5
  )");
  EXPECT_TRUE(parsed.ok()) << parsed.status();
  auto c = NormalizeModelConfig(*parsed);
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

// Synthetic batches whose raw ids come from a vocabulary of 400 per table
// (10x the dynamic tables' capacity: they evict).
std::vector<data::Batch> VocabularyBatches(const ModelConfig& c, int count,
                                           uint64_t seed) {
  data::SyntheticOptions o;
  o.teacher_seed = 5;
  o.sample_seed = seed;
  o.vocabulary = 400;
  return test::SyntheticBatches(c, count, 32, o);
}

embedding::DynamicStore* DynamicOf(Model& m, int k) {
  return dynamic_cast<embedding::DynamicStore*>(m.shards().WholeStore(k));
}

// The managed-collision buffer `buffer` of table `table` in `f`.
std::vector<int64_t> Mc(const SafetensorsFile& f, const std::string& table,
                        const std::string& buffer, int64_t size) {
  auto v =
      f.GetInt64(absl::StrCat(kTorchRecMcPrefix, "_managed_collision_modules.",
                              table, ".", buffer),
                 {size});
  EXPECT_TRUE(v.ok()) << v.status();
  return v.ok() ? *v : std::vector<int64_t>();
}

class TorchRecDynamicTest : public TorchRecTest {};

// After the DLRM's tensors, each dynamic table's MCHManagedCollisionModule
// buffers as torchrec 1.9.2's ManagedCollisionCollection.state_dict()
// lists them (int64; the metadata buffer of the table's policy).
TEST(TorchRecNamesTest, DynamicTablesAddTheirModulesBuffersInStateDictOrder) {
  const auto tensors = TorchRecTensors(DynamicConfig());
  ASSERT_TRUE(tensors.ok()) << tensors.status();
  std::vector<std::string> mc;
  for (const TorchRecTensor& t : *tensors) {
    if (t.mc == McBuffer::kNone) {
      EXPECT_TRUE(mc.empty()) << t.torchrec_name << " after an MC buffer";
      EXPECT_EQ(t.dtype, Dtype::kF32);
      continue;
    }
    EXPECT_EQ(t.dtype, Dtype::kI64);
    mc.push_back(absl::StrCat(t.torchrec_name, " [", t.shape[0], "]"));
  }
  const std::string p =
      "managed_collision_collection._managed_collision_modules.";
  EXPECT_EQ(mc, (std::vector<std::string>{
                    p + "u._output_segments_tensor [1025]",
                    p + "u._current_iter_tensor [1]",
                    p + "u._mch_sorted_raw_ids [40]",
                    p + "u._mch_remapped_ids_mapping [40]",
                    p + "u._mch_last_access_iter [40]",
                    p + "v._output_segments_tensor [1025]",
                    p + "v._current_iter_tensor [1]",
                    p + "v._mch_sorted_raw_ids [36]",
                    p + "v._mch_remapped_ids_mapping [36]",
                    p + "v._mch_counts [36]",
                }));
}

// The export writes each dynamic table's map as TorchRec's
// MCHManagedCollisionModule holds it: the ids sorted, empty slots at
// INT64_MAX (the last always), the row of each, the free rows and the
// kept row after them (a permutation), the policy's metadata; the import
// rebuilds a map that maps every id to a row of the same weights, so the
// imported model predicts the same bitwise and trains on.
TEST_F(TorchRecDynamicTest, ExportsTheMapsAsManagedCollisionBuffersAndBack) {
  const ModelConfig c = DynamicConfig();
  auto m = Model::Create(c);
  ASSERT_TRUE(m.ok()) << m.status();
  const std::vector<data::Batch> batches = VocabularyBatches(c, 12, 31);
  ASSERT_EQ(batches.size(), 12u);
  for (int i = 0; i < 10; ++i) ASSERT_TRUE((*m)->TrainStep(batches[i]).ok());
  const auto names = TorchRecTensors(c);
  ASSERT_TRUE(names.ok()) << names.status();
  const std::string path = (dir_ / "dlrm.safetensors").string();
  const auto exported = ExportTorchRec(**m, path);
  ASSERT_TRUE(exported.ok()) << exported.status();
  auto f = SafetensorsFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ((*f)->Names().size(), names->size());
  int64_t ids_total = 0;
  for (int k = 0; k < 2; ++k) {
    const TableConfig& t = c.tables(k);
    SCOPED_TRACE(t.name());
    const embedding::DynamicIdMap& map = DynamicOf(**m, k)->map();
    EXPECT_GT(map.counters().evicted, 0);
    const int64_t rows = t.rows();
    const std::vector<int64_t> ids =
        Mc(**f, t.name(), "_mch_sorted_raw_ids", rows);
    const std::vector<int64_t> mapping =
        Mc(**f, t.name(), "_mch_remapped_ids_mapping", rows);
    const std::vector<int64_t> segments =
        Mc(**f, t.name(), "_output_segments_tensor", 1025);
    ASSERT_EQ(ids.size(), static_cast<size_t>(rows));
    ASSERT_EQ(mapping.size(), static_cast<size_t>(rows));
    EXPECT_EQ(segments[0], 0);
    EXPECT_EQ(segments[1], rows);
    EXPECT_EQ(segments[2], -1);
    EXPECT_EQ(Mc(**f, t.name(), "_current_iter_tensor", 1),
              std::vector<int64_t>{map.step()});
    const std::vector<int64_t> metadata = Mc(
        **f, t.name(), k == 0 ? "_mch_last_access_iter" : "_mch_counts", rows);
    EXPECT_FALSE((*f)->Has(
        absl::StrCat(kTorchRecMcPrefix, "_managed_collision_modules.", t.name(),
                     k == 0 ? "._mch_counts" : "._mch_last_access_iter")));
    constexpr int64_t kEmpty = std::numeric_limits<int64_t>::max();
    EXPECT_EQ(ids.back(), kEmpty);
    EXPECT_EQ(mapping.back(), rows - 1);
    std::vector<int64_t> sorted = mapping;
    std::sort(sorted.begin(), sorted.end());
    for (int64_t r = 0; r < rows; ++r) EXPECT_EQ(sorted[r], r);
    int64_t held = 0;
    for (int64_t i = 0; i < rows; ++i) {
      if (ids[i] == kEmpty) continue;
      ++held;
      if (i > 0) {
        EXPECT_LT(ids[i - 1], ids[i]);
      }
      EXPECT_EQ(map.Lookup(ids[i]), mapping[i]) << "id " << ids[i];
      const int64_t row = mapping[i];
      EXPECT_EQ(metadata[i],
                k == 0 ? map.last_steps()[row] : map.sightings()[row]);
    }
    EXPECT_EQ(held, map.occupied());
    ids_total += held;
  }

  // Into a new model: every id finds a row of its bucket (the map came
  // from one), with the same weights.
  auto imported = Model::Create(c);
  ASSERT_TRUE(imported.ok());
  TorchRecImportReport report;
  const absl::Status s = ImportTorchRecWeights(**f, **imported, &report);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(report.ids, ids_total);
  EXPECT_EQ(report.ids_dropped, 0);
  for (int k = 0; k < 2; ++k) {
    const embedding::DynamicIdMap& a = DynamicOf(**m, k)->map();
    const embedding::DynamicIdMap& b = DynamicOf(**imported, k)->map();
    EXPECT_EQ(b.occupied(), a.occupied());
    EXPECT_EQ(b.step(), a.step());
    std::vector<float> ta, tb;
    ASSERT_TRUE((*m)->GatherTable(k, &ta).ok());
    ASSERT_TRUE((*imported)->GatherTable(k, &tb).ok());
    const int dim = c.tables(k).dim();
    for (int64_t r = 0; r < a.usable_rows(); ++r) {
      const int64_t id = a.keys()[r];
      if (id < 0) continue;
      const int64_t row = b.Lookup(id);
      ASSERT_GE(row, 0) << "id " << id;
      EXPECT_TRUE(std::equal(ta.begin() + r * dim, ta.begin() + (r + 1) * dim,
                             tb.begin() + row * dim))
          << "id " << id;
    }
    // The kept row: zero (u), TorchRec's default row (v, shared).
    const int64_t kept = a.kept_row();
    EXPECT_TRUE(std::equal(ta.begin() + kept * dim,
                           ta.begin() + (kept + 1) * dim,
                           tb.begin() + kept * dim));
  }
  std::vector<float> want, got;
  ASSERT_TRUE((*m)->Predict(batches[10], &want).ok());
  ASSERT_TRUE((*imported)->Predict(batches[10], &got).ok());
  EXPECT_EQ(got, want);
  EXPECT_TRUE((*imported)->TrainStep(batches[11]).ok());
}

// Managed-collision state that our map cannot take is refused naming the
// tensor, the model unchanged: a plain DLRM state_dict for a dynamic
// table, MC buffers for a static one, the other eviction policy's
// metadata, a negative id, ids out of order, a row given twice or out of
// range, segments of another size. An id of a full bucket is dropped and
// counted, the most recently used kept.
TEST_F(TorchRecDynamicTest, RefusesMapsOurTablesCannotHoldNamingTheTensor) {
  const ModelConfig c = DynamicConfig();
  auto m = Model::Create(c);
  ASSERT_TRUE(m.ok());
  for (const data::Batch& b : VocabularyBatches(c, 4, 41)) {
    ASSERT_TRUE((*m)->TrainStep(b).ok());
  }
  const std::string path = (dir_ / "dlrm.safetensors").string();
  const auto exported = ExportTorchRec(**m, path);
  ASSERT_TRUE(exported.ok()) << exported.status();
  auto f = SafetensorsFile::Open(path);
  ASSERT_TRUE(f.ok());
  const auto tensors = TorchRecTensors(c);
  ASSERT_TRUE(tensors.ok());

  // The exported file's tensors, with `edit` applied, as `name`.
  struct Tensor {
    std::string name;
    std::vector<int64_t> shape;
    Dtype dtype;
    std::vector<char> bytes;
  };
  auto load = [&]() {
    std::vector<Tensor> out;
    for (const TorchRecTensor& t : *tensors) {
      auto b = (*f)->GetBytes(t.torchrec_name, t.dtype, t.shape);
      EXPECT_TRUE(b.ok()) << b.status();
      out.push_back({t.torchrec_name, t.shape, t.dtype,
                     std::vector<char>(b->begin(), b->end())});
    }
    return out;
  };
  auto write = [&](const std::vector<Tensor>& ts, const std::string& name) {
    std::vector<TensorToWrite> w;
    for (const Tensor& t : ts) {
      w.push_back({t.name, t.shape, t.bytes.data(), t.dtype});
    }
    const std::string out = (dir_ / name).string();
    EXPECT_TRUE(WriteSafetensors(out, w, {}).ok());
    return out;
  };
  auto buffer = [](std::vector<Tensor>& ts, const std::string& suffix) {
    for (Tensor& t : ts) {
      if (t.name.ends_with("modules.u." + suffix)) {
        return reinterpret_cast<int64_t*>(t.bytes.data());
      }
    }
    ADD_FAILURE() << suffix;
    return static_cast<int64_t*>(nullptr);
  };
  const uint64_t before = *(*m)->WeightChecksum();
  auto expect_refused = [&](const std::string& file, const std::string& what) {
    auto g = SafetensorsFile::Open(file);
    ASSERT_TRUE(g.ok()) << g.status();
    const absl::Status s = ImportTorchRecWeights(**g, **m);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_HAS_SUBSTR(s.message(), what) << s;
    EXPECT_EQ(*(*m)->WeightChecksum(), before);
  };
  const std::string u =
      absl::StrCat(kTorchRecMcPrefix, "_managed_collision_modules.u.");

  {  // A plain DLRM state_dict (no managed collision) for dynamic tables.
    std::vector<Tensor> ts = load();
    std::erase_if(ts, [](const Tensor& t) {
      return t.name.starts_with(kTorchRecMcPrefix);
    });
    expect_refused(write(ts, "plain.safetensors"),
                   "missing tensor " + u +
                       "_mch_sorted_raw_ids [40] (our "
                       "dynamic_map.u.ids)");
  }
  {  // MC buffers for a static table.
    ModelConfig fixed = c;
    for (TableConfig& t : *fixed.mutable_tables()) {
      t.clear_dynamic();
      t.clear_eviction();
      t.clear_unadmitted();
    }
    const absl::Status s = CheckTorchRecStateDict(**f, fixed);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_HAS_SUBSTR(s.message(),
                      "unexpected tensor " + u + "_mch_sorted_raw_ids")
        << s;
    EXPECT_HAS_SUBSTR(s.message(), "imports into a dynamic table only") << s;
  }
  {  // LFU's counts where the table evicts by LRU.
    std::vector<Tensor> ts = load();
    for (Tensor& t : ts) {
      if (t.name == u + "_mch_last_access_iter") t.name = u + "_mch_counts";
    }
    expect_refused(write(ts, "lfu.safetensors"),
                   "missing tensor " + u + "_mch_last_access_iter");
  }
  {  // The ids as F32.
    std::vector<Tensor> ts = load();
    for (Tensor& t : ts) {
      if (t.name == u + "_current_iter_tensor") {
        t.dtype = Dtype::kF32;
        t.bytes.resize(4);
      }
    }
    expect_refused(write(ts, "f32.safetensors"),
                   "tensor " + u +
                       "_current_iter_tensor has dtype F32, "
                       "expected I64");
  }
  {  // A negative id.
    std::vector<Tensor> ts = load();
    buffer(ts, "_mch_sorted_raw_ids")[0] = -5;
    expect_refused(write(ts, "negative.safetensors"),
                   "tensor " + u + "_mch_sorted_raw_ids holds id -5 at 0");
  }
  {  // Out of order.
    std::vector<Tensor> ts = load();
    int64_t* ids = buffer(ts, "_mch_sorted_raw_ids");
    std::swap(ids[0], ids[1]);
    expect_refused(write(ts, "order.safetensors"),
                   "tensor " + u +
                       "_mch_sorted_raw_ids is not strictly "
                       "ascending at 1");
  }
  {  // A row given to two ids; the default row given to an id.
    std::vector<Tensor> ts = load();
    int64_t* rows = buffer(ts, "_mch_remapped_ids_mapping");
    rows[1] = rows[0];
    expect_refused(write(ts, "twice.safetensors"), "the row of another id");
    ts = load();
    buffer(ts, "_mch_remapped_ids_mapping")[0] = 39;
    expect_refused(write(ts, "default.safetensors"),
                   "_mch_remapped_ids_mapping gives id");
  }
  {  // Segments of a module of another size.
    std::vector<Tensor> ts = load();
    buffer(ts, "_output_segments_tensor")[1] = 80;
    expect_refused(write(ts, "segments.safetensors"),
                   "_output_segments_tensor does not hold 0 and the table's "
                   "rows, 40");
  }
  {  // 20 ids of one bucket (16 rows): the 16 seen last get rows.
    const embedding::DynamicIdMap& map = DynamicOf(**m, 0)->map();
    std::vector<int64_t> same;
    for (int64_t id = 0; same.size() < 20; ++id) {
      if (map.Bucket(id) == 0) same.push_back(id);
    }
    std::vector<Tensor> ts = load();
    int64_t* ids = buffer(ts, "_mch_sorted_raw_ids");
    int64_t* rows = buffer(ts, "_mch_remapped_ids_mapping");
    int64_t* last = buffer(ts, "_mch_last_access_iter");
    for (int64_t i = 0; i < 39; ++i) {
      ids[i] = i < 20 ? same[i] : std::numeric_limits<int64_t>::max();
      rows[i] = i;
      last[i] = i < 20 ? 100 + i : 0;
    }
    // Within u's time to live (50 steps) of every id's last step.
    buffer(ts, "_current_iter_tensor")[0] = 130;
    auto g = SafetensorsFile::Open(write(ts, "full.safetensors"));
    ASSERT_TRUE(g.ok());
    auto fresh = Model::Create(c);
    ASSERT_TRUE(fresh.ok());
    TorchRecImportReport report;
    const absl::Status s = ImportTorchRecWeights(**g, **fresh, &report);
    ASSERT_TRUE(s.ok()) << s;
    const embedding::DynamicIdMap& got = DynamicOf(**fresh, 0)->map();
    EXPECT_EQ(got.step(), 130);
    for (int i = 0; i < 20; ++i) {
      if (i < 4) {
        EXPECT_EQ(got.Lookup(same[i]), -1) << same[i];
      } else {
        ASSERT_GE(got.Lookup(same[i]), 0) << same[i];
        EXPECT_EQ(got.last_steps()[got.Lookup(same[i])], 100 + i);
      }
    }
    // v's ids all fit, u's 4 least recent did not.
    EXPECT_EQ(report.ids_dropped, 4);
  }
}

INSTANTIATE_TEST_SUITE_P(Interactions, TorchRecTest,
                         ::testing::Values(INTERACTION_DOT, INTERACTION_DCN),
                         [](const auto& info) {
                           return info.param == INTERACTION_DOT ? "Dot" : "Dcn";
                         });

}  // namespace
}  // namespace dlrm::model
