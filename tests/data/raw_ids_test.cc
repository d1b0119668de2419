// Raw ids of dynamic tables (issue 33) through the data layer: the id limits
// every batch check takes, the Criteo readers' raw ids, and the synthetic
// vocabulary with drift.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/config.h"
#include "core/random.h"
#include "data/batch.h"
#include "data/criteo.h"
#include "data/multi_hot.h"
#include "data/synthetic.h"
#include "data/wire.h"
#include "dlrm/config.pb.h"
#include "model/metrics.h"
#include "tests/support/expect.h"
#include "tests/support/files.h"

namespace dlrm::data {
namespace {

using test::ExpectInvalid;

constexpr int64_t kRawId = (int64_t{1} << 40) + 7;

// Two tables of 10 rows: table 0 static, table 1 dynamic.
ModelConfig StaticAndDynamic() {
  ModelConfig config;
  config.set_num_dense_features(1);
  TableConfig* fixed = config.add_tables();
  fixed->set_name("fixed");
  fixed->set_rows(10);
  TableConfig* dynamic = config.add_tables();
  dynamic->set_name("dynamic");
  dynamic->set_rows(10);
  dynamic->set_dynamic(true);
  return config;
}

// Two samples, one id per bag in each table.
Batch TwoSamples(int64_t fixed0, int64_t fixed1, int64_t dynamic0,
                 int64_t dynamic1) {
  Batch b;
  b.Reset(1, 2);
  b.size = 2;
  b.dense = {0.5f, 1.5f};
  b.labels = {0, 1};
  b.sparse[0].offsets = {0, 1, 2};
  b.sparse[0].ids = {fixed0, fixed1};
  b.sparse[1].offsets = {0, 1, 2};
  b.sparse[1].ids = {dynamic0, dynamic1};
  return b;
}

dlrm::Batch Wire(const Batch& b) {
  dlrm::Batch wire;
  BatchToProto(b, /*include_labels=*/true, &wire);
  return wire;
}

TEST(TableIdLimitsTest, StaticTablesTheirRowsDynamicTablesTwoToThe63Minus1) {
  EXPECT_EQ(TableIdLimits(StaticAndDynamic()),
            (std::vector<int64_t>{10, kDynamicIdLimit}));
  EXPECT_EQ(kDynamicIdLimit, int64_t{0x7fffffffffffffff});
}

TEST(TableIdLimitsTest, ValidateTakesRawIdsOfDynamicTablesOnly) {
  const std::vector<int64_t> limits = TableIdLimits(StaticAndDynamic());
  EXPECT_TRUE(TwoSamples(3, 9, kRawId, 0).Validate(1, limits).ok());
  EXPECT_TRUE(
      TwoSamples(3, 9, 0, kDynamicIdLimit - 1).Validate(1, limits).ok());

  ExpectInvalid(TwoSamples(3, 9, 5, -1).Validate(1, limits),
                "sparse[1].ids[1] (sample 1) = -1 is out of range: a dynamic "
                "table's ids are raw ids in [0, 2^63 - 1)");
  ExpectInvalid(TwoSamples(3, 9, kDynamicIdLimit, 0).Validate(1, limits),
                "sparse[1].ids[0] (sample 0) = 9223372036854775807 is out of "
                "range");
  // A static table still takes its rows only.
  ExpectInvalid(TwoSamples(3, 10, 5, 5).Validate(1, limits),
                "sparse[0].ids[1] (sample 1) = 10 is out of range [0, 10)");
  ExpectInvalid(TwoSamples(kRawId, 0, 5, 5).Validate(1, limits),
                "sparse[0].ids[0] (sample 0) = 1099511627783 is out of range "
                "[0, 10)");
}

TEST(TableIdLimitsTest, WireBatchesTakeRawIdsOfDynamicTablesOnly) {
  BatchShape shape;
  shape.num_dense = 1;
  shape.id_limits = TableIdLimits(StaticAndDynamic());
  Batch out;
  ASSERT_TRUE(BatchFromProto(Wire(TwoSamples(3, 9, kRawId, 0)), shape,
                             Labels::kRequired, 0, "batch", &out)
                  .ok());
  EXPECT_EQ(out.sparse[1].ids, (std::vector<int64_t>{kRawId, 0}));

  ExpectInvalid(BatchFromProto(Wire(TwoSamples(3, 9, 5, -1)), shape,
                               Labels::kRequired, 0, "batch", &out),
                "batch.sparse[1].ids[1] (sample 1): id -1 out of range: a "
                "dynamic table's ids are raw ids in [0, 2^63 - 1)");
  ExpectInvalid(BatchFromProto(Wire(TwoSamples(3, 10, 5, 5)), shape,
                               Labels::kIgnored, 0, "batch", &out),
                "batch.sparse[0].ids[1] (sample 1): id 10 out of range [0, "
                "10)");
}

// --- the Criteo readers ----------------------------------------------------

// Every sample of `source`, in batches of 3, joined.
Batch ReadAll(BatchSource* source) {
  Batch all;
  while (true) {
    Batch batch;
    absl::StatusOr<bool> more = source->Next(3, &batch);
    EXPECT_TRUE(more.ok()) << more.status();
    if (!more.ok() || !*more) break;
    all.Append(batch);
  }
  return all;
}

// Hex values of categorical column 0 (static, 10 rows) and column 1
// (dynamic, 10 rows) of five TSV lines with one dense column.
const std::vector<std::pair<uint32_t, uint32_t>> kValues = {
    {0x3, 0x7}, {0x68fd1e64, 0xffffffff}, {0x11, 0x0}, {0x0, 0x2a}, {0x9, 0x9}};

// The id limits of the tables CriteoRawIdsTest::Options describes.
const std::vector<int64_t> kLimits = {10, kDynamicIdLimit};

class CriteoRawIdsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = test::MakeTestDir();
    tsv_ = (dir_ / "day.tsv").string();
    std::string text;
    for (size_t i = 0; i < kValues.size(); ++i) {
      char line[64];
      std::snprintf(line, sizeof(line), "%zu\t%zu\t%x\t%x\n", i % 2, i,
                    kValues[i].first, kValues[i].second);
      text += line;
    }
    test::WriteFile(tsv_, text);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // Table 0 static, table 1 dynamic, both of 10 rows and bags of `k`.
  static CriteoOptions Options(bool hash_ids, int k) {
    CriteoOptions options;
    options.num_dense = 1;
    options.table_rows = {10, 10};
    options.dynamic = {false, true};
    options.hash_ids = hash_ids;
    options.multi_hot_sizes = {k, k};
    return options;
  }

  Batch ReadTsv(const CriteoOptions& options) {
    auto source = OpenCriteoTsv({tsv_}, options);
    EXPECT_TRUE(source.ok()) << source.status();
    return source.ok() ? ReadAll(source->get()) : Batch{};
  }

  std::filesystem::path dir_;
  std::string tsv_;
};

TEST_F(CriteoRawIdsTest, TsvGivesDynamicTablesTheRawValue) {
  const Batch batch = ReadTsv(Options(false, 1));
  ASSERT_EQ(batch.size, 5);
  for (size_t i = 0; i < kValues.size(); ++i) {
    EXPECT_EQ(batch.sparse[0].ids[i], kValues[i].first % 10) << i;
    EXPECT_EQ(batch.sparse[1].ids[i], kValues[i].second) << i;
  }
  EXPECT_TRUE(batch.Validate(1, kLimits).ok());
  const std::vector<int64_t> both_static = {10, 10};
  EXPECT_FALSE(batch.Validate(1, both_static).ok());  // 0xffffffff: no row
}

TEST_F(CriteoRawIdsTest, HashIdsGiveDynamicTablesMix64InSixtyThreeBits) {
  const Batch batch = ReadTsv(Options(true, 1));
  ASSERT_EQ(batch.size, 5);
  for (size_t i = 0; i < kValues.size(); ++i) {
    const uint64_t hash = Mix64(kValues[i].second);
    EXPECT_EQ(batch.sparse[0].ids[i],
              static_cast<int64_t>(Mix64(kValues[i].first) % 10));
    EXPECT_EQ(batch.sparse[1].ids[i],
              static_cast<int64_t>(hash & ~(uint64_t{1} << 63)))
        << i;
    EXPECT_EQ(CriteoRawId(kValues[i].second, true), batch.sparse[1].ids[i]);
  }
  EXPECT_EQ(DynamicId(~uint64_t{0}), kDynamicIdLimit - 1);
  EXPECT_EQ(DynamicId(uint64_t{1} << 63), 0);
}

TEST_F(CriteoRawIdsTest, DynamicMultiHotBagsDeriveFromTheRawIdWithoutAModulo) {
  const int k = 4;
  const Batch batch = ReadTsv(Options(false, k));
  ASSERT_EQ(batch.size, 5);
  bool any_past_rows = false;
  for (size_t i = 0; i < kValues.size(); ++i) {
    int64_t want[k];
    DeriveDynamicMultiHotBag(kValues[i].second, k, MultiHotTableSeed(1), want);
    const int64_t* got = batch.sparse[1].ids.data() + i * k;
    EXPECT_EQ(std::vector<int64_t>(got, got + k),
              std::vector<int64_t>(want, want + k))
        << i;
    EXPECT_EQ(got[0], kValues[i].second);
    for (int j = 1; j < k; ++j) {
      EXPECT_EQ(got[j],
                DynamicId(HashKey(MultiHotTableSeed(1), kValues[i].second, j)));
      any_past_rows |= got[j] >= (int64_t{1} << 32);
    }
    // The static table's bag is today's, from the row.
    DeriveMultiHotBag(kValues[i].first % 10, 10, k, MultiHotTableSeed(0), want);
    const int64_t* fixed = batch.sparse[0].ids.data() + i * k;
    EXPECT_EQ(std::vector<int64_t>(fixed, fixed + k),
              std::vector<int64_t>(want, want + k));
  }
  EXPECT_TRUE(any_past_rows);
}

TEST_F(CriteoRawIdsTest, VersionOneBinaryServesDynamicTablesRawValues) {
  const std::string bin = (dir_ / "day.bin").string();
  ASSERT_TRUE(ConvertCriteoTsvToBinary({tsv_}, bin, 1, 2).ok());
  for (const bool hash : {false, true}) {
    for (const int k : {1, 3}) {
      SCOPED_TRACE(::testing::Message() << "hash_ids " << hash << " k " << k);
      auto source = OpenCriteoBinary(bin, Options(hash, k));
      ASSERT_TRUE(source.ok()) << source.status();
      test::ExpectBatchesEqual(ReadAll(source->get()),
                               ReadTsv(Options(hash, k)));
    }
  }
}

TEST_F(CriteoRawIdsTest,
       VersionTwoBinaryRecordsRawTablesAndRefusesTheOtherMode) {
  const std::string raw = (dir_ / "raw.bin").string();
  ASSERT_TRUE(
      ConvertCriteoTsvToMultiHotBinary({tsv_}, raw, Options(true, 3)).ok());
  auto source = OpenCriteoBinary(raw, Options(true, 3));
  ASSERT_TRUE(source.ok()) << source.status();
  test::ExpectBatchesEqual(ReadAll(source->get()), ReadTsv(Options(true, 3)));

  // Read as static: the raw table is refused by name.
  CriteoOptions fixed = Options(true, 3);
  fixed.dynamic = {false, false};
  ExpectInvalid(OpenCriteoBinary(raw, fixed).status(),
                "table 1: file holds raw ids, written for a dynamic table");

  // A file reduced for a static table is refused for a dynamic one.
  const std::string reduced = (dir_ / "reduced.bin").string();
  ASSERT_TRUE(ConvertCriteoTsvToMultiHotBinary({tsv_}, reduced, fixed).ok());
  ExpectInvalid(OpenCriteoBinary(reduced, Options(true, 3)).status(),
                "table 1: file's ids were reduced to 10 rows, written for a "
                "static table; the options read table 1 as a dynamic table");

  // A dynamic table of any rows converts: its ids are no rows.
  CriteoOptions huge = Options(false, 1);
  huge.table_rows = {10, int64_t{1} << 40};
  ASSERT_TRUE(ConvertCriteoTsvToMultiHotBinary({tsv_}, raw, huge).ok());
}

// A little-endian .npy file (version 1.0) of a C-order array.
void WriteNpy(const std::string& path, const std::string& descr,
              const std::vector<int64_t>& shape, const void* data,
              size_t bytes) {
  std::string dims;
  for (size_t i = 0; i < shape.size(); ++i) {
    dims += std::to_string(shape[i]) +
            (shape.size() == 1 || i + 1 < shape.size() ? "," : "");
    if (i + 1 < shape.size()) dims += " ";
  }
  std::string header = "{'descr': '" + descr +
                       "', 'fortran_order': False, 'shape': (" + dims + "), }";
  while ((10 + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  std::string file = "\x93NUMPY";
  file += '\x01';
  file += '\x00';
  const uint16_t length = static_cast<uint16_t>(header.size());
  file.append(reinterpret_cast<const char*>(&length), 2);
  file += header;
  file.append(static_cast<const char*>(data), bytes);
  test::WriteFile(path, file);
}

TEST_F(CriteoRawIdsTest, NumpyDaysGiveDynamicTablesSixtyFourBitRawIds) {
  const std::vector<float> dense = {0.5f, 1.5f, 2.5f};
  const std::vector<float> labels = {0, 1, 1};
  const std::vector<int64_t> sparse = {13, kRawId, 7, 5, 1, int64_t{1} << 62};
  const std::string prefix = (dir_ / "day_0").string();
  WriteNpy(prefix + "_dense.npy", "<f4", {3, 1}, dense.data(), 12);
  WriteNpy(prefix + "_labels.npy", "<f4", {3}, labels.data(), 12);
  WriteNpy(prefix + "_sparse.npy", "<i8", {3, 2}, sparse.data(), 48);
  for (const bool hash : {false, true}) {
    SCOPED_TRACE(::testing::Message() << "hash_ids " << hash);
    auto days = FindCriteoNpyDays({prefix}, false);
    ASSERT_TRUE(days.ok()) << days.status();
    auto source = OpenCriteoNpy(*days, Options(hash, 1));
    ASSERT_TRUE(source.ok()) << source.status();
    const Batch batch = ReadAll(source->get());
    ASSERT_EQ(batch.size, 3);
    for (int s = 0; s < 3; ++s) {
      const uint64_t fixed = static_cast<uint64_t>(sparse[2 * s]);
      const uint64_t raw = static_cast<uint64_t>(sparse[2 * s + 1]);
      EXPECT_EQ(batch.sparse[0].ids[s],
                static_cast<int64_t>((hash ? Mix64(fixed) : fixed) % 10));
      EXPECT_EQ(batch.sparse[1].ids[s],
                hash ? DynamicId(Mix64(raw)) : static_cast<int64_t>(raw));
    }
    EXPECT_TRUE(batch.Validate(1, kLimits).ok());
  }
}

TEST(CriteoOptionsTest, DynamicHasOneEntryPerTable) {
  CriteoOptions options;
  options.table_rows = {10, 20};
  options.dynamic = {true};
  ExpectInvalid(options.Validate(), "CriteoOptions.dynamic has 1 entries");
  ModelConfig config = StaticAndDynamic();
  const CriteoOptions from_model = CriteoOptionsForModel(config, false);
  EXPECT_EQ(from_model.dynamic, (std::vector<bool>{false, true}));
}

// --- the synthetic vocabulary ---------------------------------------------

// One-hot tables of `rows` rows, dynamic or not, 2 dense features.
ModelConfig Tables(const std::vector<std::pair<int64_t, bool>>& tables) {
  ModelConfig config;
  config.set_num_dense_features(2);
  for (size_t t = 0; t < tables.size(); ++t) {
    TableConfig* table = config.add_tables();
    table->set_name(absl::StrCat("t", t));
    table->set_rows(tables[t].first);
    table->set_dynamic(tables[t].second);
  }
  return config;
}

SyntheticOptions Vocabulary(int64_t v, double drift) {
  SyntheticOptions options;
  options.vocabulary = v;
  options.drift = drift;
  options.sample_seed = 11;
  std::printf(
      "teacher seed %llu, sample seed %llu, vocabulary %lld, "
      "drift %g\n",
      static_cast<unsigned long long>(options.teacher_seed),
      static_cast<unsigned long long>(options.sample_seed),
      static_cast<long long>(v), drift);
  return options;
}

// The first `n` samples of the stream, in batches of `batch_size`, joined.
Batch Samples(const ModelConfig& config, const SyntheticOptions& options,
              int64_t n, int64_t batch_size = 4096) {
  absl::StatusOr<std::unique_ptr<BatchSource>> source =
      MakeSyntheticSource(config, options);
  EXPECT_TRUE(source.ok()) << source.status();
  Batch all;
  if (!source.ok()) return all;
  for (int64_t done = 0; done < n;) {
    Batch batch;
    absl::StatusOr<bool> more =
        (*source)->Next(std::min(batch_size, n - done), &batch);
    EXPECT_TRUE(more.ok() && *more) << more.status();
    if (!more.ok() || !*more) break;
    done += batch.size;
    all.Append(batch);
  }
  return all;
}

// The `k` ids of `ids[begin, end)` seen most often.
std::set<int64_t> HotIds(const std::vector<int64_t>& ids, size_t begin,
                         size_t end, size_t k) {
  std::map<int64_t, int64_t> counts;
  for (size_t i = begin; i < end; ++i) ++counts[ids[i]];
  std::vector<std::pair<int64_t, int64_t>> by_count;
  for (const auto& [id, count] : counts) by_count.emplace_back(count, id);
  std::sort(by_count.rbegin(), by_count.rend());
  std::set<int64_t> hot;
  for (size_t i = 0; i < std::min(k, by_count.size()); ++i) {
    hot.insert(by_count[i].second);
  }
  return hot;
}

size_t Shared(const std::set<int64_t>& a, const std::set<int64_t>& b) {
  size_t n = 0;
  for (int64_t id : a) n += b.count(id);
  return n;
}

TEST(SyntheticVocabularyTest, SamplesArePureFunctionsOfSeedAndIndex) {
  const ModelConfig config = Tables({{100, true}, {100, false}, {5000, true}});
  const SyntheticOptions options = Vocabulary(20000, 0.05);
  const Batch a = Samples(config, options, 3000, 1000);
  const Batch b = Samples(config, options, 3000, 777);
  test::ExpectBatchesEqual(a, b);
  EXPECT_TRUE(a.Validate(2, TableIdLimits(config)).ok());

  // Skip moves to the same samples, Rewind replays them.
  auto source = MakeSyntheticSource(config, options);
  ASSERT_TRUE(source.ok()) << source.status();
  ASSERT_EQ(*(*source)->Skip(2000), 2000);
  Batch tail;
  ASSERT_TRUE(*(*source)->Next(1000, &tail));
  Batch want;
  a.Slice(2000, 3000, &want);
  test::ExpectBatchesEqual(tail, want);
  ASSERT_TRUE((*source)->Rewind().ok());
  Batch head;
  ASSERT_TRUE(*(*source)->Next(1000, &head));
  a.Slice(0, 1000, &want);
  test::ExpectBatchesEqual(head, want);

  // Another sample seed is another stream over the same vocabulary.
  SyntheticOptions other = options;
  other.sample_seed += 1;
  EXPECT_NE(Samples(config, other, 3000).sparse[0].ids, a.sparse[0].ids);
}

TEST(SyntheticVocabularyTest, DynamicTablesSeeFarMoreDistinctIdsThanRows) {
  const int64_t v = 100000;
  const ModelConfig config = Tables({{1000, true}});
  const Batch batch = Samples(config, Vocabulary(v, 0), 200000);
  const std::set<int64_t> distinct(batch.sparse[0].ids.begin(),
                                   batch.sparse[0].ids.end());
  std::printf("%zu distinct ids in 200000 samples\n", distinct.size());
  EXPECT_GT(distinct.size(), 10u * 1000);
  EXPECT_GE(*distinct.begin(), 0);
  EXPECT_LT(*distinct.rbegin(), v);
  // Hot ids are not the low ones: the permutation scatters the ranks.
  const std::set<int64_t> hot =
      HotIds(batch.sparse[0].ids, 0, batch.sparse[0].ids.size(), 100);
  EXPECT_GT(*hot.rbegin(), 1000);
}

TEST(SyntheticVocabularyTest, DriftReplacesTheHotIds) {
  const ModelConfig config = Tables({{1000, true}});
  const int64_t n = 200000, window = 20000;
  const Batch still = Samples(config, Vocabulary(100000, 0), n);
  const Batch drifting = Samples(config, Vocabulary(100000, 0.05), n);
  const auto overlap = [&](const Batch& b) {
    const std::vector<int64_t>& ids = b.sparse[0].ids;
    return Shared(HotIds(ids, 0, window, 100),
                  HotIds(ids, ids.size() - window, ids.size(), 100));
  };
  const size_t still_shared = overlap(still);
  const size_t drifting_shared = overlap(drifting);
  std::printf(
      "hot 100 of the first and last window share %zu ids without "
      "drift, %zu with drift 0.05 (10000 ranks over the run)\n",
      still_shared, drifting_shared);
  EXPECT_GE(still_shared, 70u);
  EXPECT_LE(drifting_shared, 10u);

  // The ids that are hottest at the end were the coldest at the start:
  // seen at most rarely in the first window.
  const std::vector<int64_t>& ids = drifting.sparse[0].ids;
  const std::set<int64_t> late =
      HotIds(ids, ids.size() - window, ids.size(), 10);
  const std::set<int64_t> early(ids.begin(), ids.begin() + window);
  EXPECT_LE(Shared(late, early), 2u);
}

TEST(SyntheticVocabularyTest, StaticTablesTakeTheVocabularyModuloTheirRows) {
  const SyntheticOptions options = Vocabulary(50000, 0.01);
  // The same tables, dynamic, static of fewer rows, static of more.
  const Batch dynamic =
      Samples(Tables({{100, true}, {100, true}}), options, 5000);
  const Batch fewer =
      Samples(Tables({{100, false}, {100, true}}), options, 5000);
  const Batch more =
      Samples(Tables({{50000, false}, {100, true}}), options, 5000);
  ASSERT_EQ(dynamic.sparse[0].ids.size(), fewer.sparse[0].ids.size());
  for (size_t i = 0; i < dynamic.sparse[0].ids.size(); ++i) {
    ASSERT_EQ(fewer.sparse[0].ids[i], dynamic.sparse[0].ids[i] % 100) << i;
  }
  EXPECT_EQ(more.sparse[0].ids, dynamic.sparse[0].ids);
  // The labels come from the vocabulary's ids, before the modulo.
  EXPECT_EQ(fewer.labels, dynamic.labels);
  EXPECT_EQ(more.labels, dynamic.labels);
  EXPECT_TRUE(SyntheticIdsAreTeacherIds(Tables({{100, true}}), options));
  EXPECT_TRUE(SyntheticIdsAreTeacherIds(Tables({{50000, false}}), options));
  EXPECT_FALSE(SyntheticIdsAreTeacherIds(Tables({{100, false}}), options));
  EXPECT_TRUE(
      SyntheticIdsAreTeacherIds(Tables({{100, false}}), SyntheticOptions{}));
}

// Kaggle's shape with every table dynamic, so the batch holds the
// teacher's ids. `store` false: a vocabulary too large for the teacher to
// store its parameters (they are computed per lookup instead).
void ExpectTeacherCtrAndAuc(int64_t v) {
  absl::StatusOr<ModelConfig> config = LoadModelConfig("kaggle");
  ASSERT_TRUE(config.ok()) << config.status();
  for (TableConfig& t : *config->mutable_tables()) {
    t.set_rows(1000);
    t.set_dynamic(true);
  }
  const SyntheticOptions options = Vocabulary(v, 0.01);
  const Batch batch = Samples(*config, options, 20000);
  const Teacher teacher(*config, options.teacher_seed, v);
  std::vector<float> p(batch.size);
  teacher.Probabilities(batch, p.data());
  double ctr = 0, mean_p = 0;
  for (int64_t s = 0; s < batch.size; ++s) {
    ctr += batch.labels[s] / batch.size;
    mean_p += p[s] / batch.size;
  }
  const double auc = model::RocAuc(p, batch.labels);
  std::printf("vocabulary %lld: teacher AUC %.4f, CTR %.4f, mean p %.4f\n",
              static_cast<long long>(v), auc, ctr, mean_p);
  EXPECT_GT(ctr, 0.2);
  EXPECT_LT(ctr, 0.3);
  EXPECT_GT(mean_p, 0.2);
  EXPECT_LT(mean_p, 0.3);
  EXPECT_GT(auc, 0.75);
  EXPECT_LT(auc, 0.9);
  // The teacher without a vocabulary is another ground truth.
  std::vector<float> q(batch.size);
  Teacher(*config, options.teacher_seed).Probabilities(batch, q.data());
  EXPECT_LT(model::RocAuc(q, batch.labels), auc - 0.05);
}

TEST(SyntheticVocabularyTest, TeacherKeepsTheCtrNearAQuarter) {
  ExpectTeacherCtrAndAuc(10000);  // stored: 26 x 10001 x (1 or 5) floats
}

TEST(SyntheticVocabularyTest, TeacherComputesParametersOfLargeVocabularies) {
  ExpectTeacherCtrAndAuc(int64_t{1} << 40);
}

TEST(SyntheticVocabularyTest, EveryIdOfTheVocabularyHasAnEffect) {
  const ModelConfig config = Tables({{10, true}});
  const Teacher teacher(config, 1, int64_t{1} << 40);
  Batch batch;
  batch.Reset(2, 1);
  const std::vector<int64_t> ids = {
      0, 1, 5000, int64_t{1} << 39, (int64_t{1} << 40) - 1, int64_t{1} << 40};
  batch.size = static_cast<int64_t>(ids.size());
  batch.dense.assign(2 * ids.size(), 0.0f);
  batch.labels.assign(ids.size(), 0.0f);
  for (size_t s = 0; s < ids.size(); ++s) {
    batch.sparse[0].ids.push_back(ids[s]);
    batch.sparse[0].offsets.push_back(static_cast<int64_t>(s) + 1);
  }
  std::vector<float> p(ids.size());
  teacher.Probabilities(batch, p.data());
  // Ids inside the vocabulary move the logit; the one past it reads 0,
  // the bias alone.
  std::set<float> distinct(p.begin(), p.end() - 1);
  EXPECT_EQ(distinct.size(), ids.size() - 1);
  const Batch empty = [&] {
    Batch b = batch;
    for (int64_t& id : b.sparse[0].ids) id = -1;
    return b;
  }();
  std::vector<float> bias(ids.size());
  teacher.Probabilities(empty, bias.data());
  EXPECT_EQ(p.back(), bias[0]);
  for (size_t s = 0; s + 1 < ids.size(); ++s) EXPECT_NE(p[s], bias[0]) << s;
}

TEST(SyntheticVocabularyTest, RejectsBadVocabularyAndDrift) {
  SyntheticOptions options;
  options.vocabulary = -1;
  ExpectInvalid(options.Validate(), "SyntheticOptions.vocabulary = -1");
  options.vocabulary = kMaxSyntheticVocabulary + 1;
  ExpectInvalid(options.Validate(), "SyntheticOptions.vocabulary");
  options.vocabulary = 0;
  options.drift = 0.5;
  ExpectInvalid(options.Validate(), "needs a vocabulary");
  options.vocabulary = 100;
  options.drift = -1;
  ExpectInvalid(options.Validate(), "SyntheticOptions.drift = -1");
  options.drift = std::nan("");
  ExpectInvalid(options.Validate(), "SyntheticOptions.drift");
  options.drift = 0.5;
  EXPECT_TRUE(options.Validate().ok());
  options.vocabulary = -5;
  ExpectInvalid(MakeSyntheticSource(Tables({{10, false}}), options).status(),
                "SyntheticOptions.vocabulary = -5");
}

}  // namespace
}  // namespace dlrm::data
