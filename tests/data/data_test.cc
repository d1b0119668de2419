// Tests for data/: Batch validation and slicing, the Criteo TSV and binary
// readers, the multi-hot derivation, the TSV -> binary conversion (and
// dlrm_convert), the synthetic generator, and skipping and reading sample
// ranges of each.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/config.h"
#include "core/random.h"
#include "data/batch.h"
#include "data/criteo.h"
#include "data/multi_hot.h"
#include "data/range_reader.h"
#include "data/synthetic.h"
#include "data/wire.h"
#include "tests/support/expect.h"
#include "tests/support/files.h"
#include "tests/support/random.h"
#include "tests/support/synthetic.h"

namespace dlrm::data {
namespace {

using test::WriteFile;

using test::ExpectBatchesEqual;
using test::ExpectInvalid;
using test::ExpectMentions;

// --- helpers ---------------------------------------------------------------

// 4 samples, 3 dense features, table 0 (100 rows) multi-hot, table 1
// (10 rows) one id per bag.
Batch GoodBatch() {
  Batch b;
  b.Reset(3, 2);
  b.size = 4;
  b.dense = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};
  b.labels = {0, 1, 1, 0};
  b.sparse[0].offsets = {0, 2, 3, 3, 5};
  b.sparse[0].ids = {1, 99, 0, 5, 6};
  b.sparse[1].offsets = {0, 1, 2, 3, 4};
  b.sparse[1].ids = {9, 0, 3, 3};
  return b;
}
const std::vector<int64_t> kGoodRows = {100, 10};

absl::Status ValidateGood(const Batch& b) { return b.Validate(3, kGoodRows); }

std::vector<Batch> ReadAll(BatchSource* source, int64_t batch_size) {
  std::vector<Batch> batches;
  while (true) {
    Batch batch;
    absl::StatusOr<bool> more = source->Next(batch_size, &batch);
    EXPECT_TRUE(more.ok()) << more.status();
    if (!more.ok() || !*more) break;
    batches.push_back(std::move(batch));
  }
  return batches;
}

// Two epochs of `got` and `want` (rewound in between), `batch_size` samples
// a batch: `batches` equal batches each epoch, valid for `rows` (13 dense
// features).
void ExpectSameEpochs(BatchSource* got, BatchSource* want, int64_t batch_size,
                      size_t batches, const std::vector<int64_t>& rows) {
  for (int epoch = 0; epoch < 2; ++epoch) {
    SCOPED_TRACE(::testing::Message() << "epoch " << epoch);
    std::vector<Batch> expected = ReadAll(want, batch_size);
    std::vector<Batch> actual = ReadAll(got, batch_size);
    ASSERT_EQ(expected.size(), batches);
    ASSERT_EQ(actual.size(), expected.size());
    for (size_t i = 0; i < expected.size(); ++i) {
      ExpectBatchesEqual(actual[i], expected[i]);
      EXPECT_TRUE(actual[i].Validate(13, rows).ok());
    }
    ASSERT_TRUE(want->Rewind().ok());
    ASSERT_TRUE(got->Rewind().ok());
  }
}

// `name` in the temp directory, made unique to this process: CTest runs
// each test in a process of its own, several at once, and tests that share
// a file name must not write each other's files.
std::string TempPath(const std::string& name) {
  return (std::filesystem::path(testing::TempDir()) /
          (std::to_string(getpid()) + "_" + name))
      .string();
}

// A Criteo line with 13 dense and 26 categorical fields.
std::string Line(const std::string& label, std::vector<std::string> dense,
                 std::vector<std::string> cats) {
  dense.resize(13);
  cats.resize(26);
  std::string line = label;
  for (const std::string& d : dense) line += "\t" + d;
  for (const std::string& c : cats) line += "\t" + c;
  return line;
}

std::vector<int64_t> CriteoRows(int64_t rows) {
  return std::vector<int64_t>(26, rows);
}

// Area under the ROC curve, ties counted half (rank-sum formula).
double Auc(const std::vector<float>& scores, const std::vector<float>& labels) {
  std::vector<size_t> order(scores.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return scores[a] < scores[b]; });
  double positive_rank_sum = 0;
  double positives = 0;
  for (size_t i = 0; i < order.size();) {
    size_t j = i;
    while (j < order.size() && scores[order[j]] == scores[order[i]]) ++j;
    const double mid_rank = (i + 1 + j) / 2.0;  // 1-based average rank
    for (size_t k = i; k < j; ++k) {
      if (labels[order[k]] == 1.0f) {
        positive_rank_sum += mid_rank;
        positives += 1;
      }
    }
    i = j;
  }
  const double negatives = static_cast<double>(scores.size()) - positives;
  return (positive_rank_sum - positives * (positives + 1) / 2) /
         (positives * negatives);
}

ModelConfig Preset(const std::string& name) {
  absl::StatusOr<ModelConfig> config = LoadModelConfig(name);
  EXPECT_TRUE(config.ok()) << config.status();
  return *config;
}

// --- Batch -----------------------------------------------------------------

TEST(BatchTest, GoodBatchPasses) {
  EXPECT_TRUE(ValidateGood(GoodBatch()).ok()) << ValidateGood(GoodBatch());
}

TEST(BatchTest, ResetShapesAnEmptyBatch) {
  Batch b = GoodBatch();
  b.Reset(5, 3);
  EXPECT_EQ(b.size, 0);
  EXPECT_EQ(b.num_dense, 5);
  EXPECT_TRUE(b.dense.empty());
  EXPECT_TRUE(b.labels.empty());
  ASSERT_EQ(b.sparse.size(), 3u);
  for (const SparseFeature& f : b.sparse) {
    EXPECT_EQ(f.offsets, std::vector<int64_t>{0});
    EXPECT_TRUE(f.ids.empty());
    EXPECT_EQ(f.num_bags(), 0);
  }
}

TEST(BatchTest, EmptyBatchIsAnError) {
  Batch b;
  b.Reset(3, 2);
  ExpectInvalid(ValidateGood(b), "batch is empty");
}

TEST(BatchTest, RejectsWrongFeatureCounts) {
  Batch b = GoodBatch();
  b.num_dense = 4;
  ExpectInvalid(ValidateGood(b), "num_dense = 4, the model has 3");

  b = GoodBatch();
  b.sparse.pop_back();
  ExpectInvalid(ValidateGood(b),
                "batch has 1 sparse features, the model has 2");

  b = GoodBatch();
  b.dense.pop_back();
  ExpectInvalid(ValidateGood(b), "dense must have size x num_dense");

  b = GoodBatch();
  b.labels.push_back(0);
  ExpectInvalid(ValidateGood(b), "labels must have size = 4 entries, has 5");

  b = GoodBatch();
  b.size = -1;
  ExpectInvalid(ValidateGood(b), "negative");
}

TEST(BatchTest, RejectsBadOffsets) {
  Batch b = GoodBatch();
  b.sparse[1].offsets = {0, 1, 2};
  ExpectInvalid(ValidateGood(b),
                "sparse[1].offsets must have size+1 = 5 entries, has 3");

  b = GoodBatch();
  b.sparse[1].offsets.clear();
  ExpectInvalid(ValidateGood(b),
                "sparse[1].offsets must have size+1 = 5 entries, has 0");

  b = GoodBatch();
  b.sparse[0].offsets = {1, 2, 3, 3, 5};
  ExpectInvalid(ValidateGood(b), "sparse[0].offsets[0] = 1 must be 0");

  b = GoodBatch();
  b.sparse[0].offsets = {0, 3, 2, 3, 5};
  ExpectInvalid(ValidateGood(b),
                "sparse[0].offsets[2] = 2 is less than "
                "offsets[1] = 3 (sample 1)");

  b = GoodBatch();
  b.sparse[0].offsets = {0, 2, 3, 3, 4};
  ExpectInvalid(ValidateGood(b),
                "sparse[0].offsets[4] = 4 must equal ids.size() = 5");

  b = GoodBatch();
  b.sparse[0].offsets = {0, 2, 3, 3, 9};
  ExpectInvalid(ValidateGood(b),
                "sparse[0].offsets[4] = 9 must equal ids.size() = 5");
}

TEST(BatchTest, RejectsIdsOutOfRange) {
  Batch b = GoodBatch();
  b.sparse[0].ids[4] = 120;
  ExpectInvalid(ValidateGood(b),
                "sparse[0].ids[4] (sample 3) = 120 is out of range [0, 100)");

  b = GoodBatch();
  b.sparse[1].ids[2] = -1;
  ExpectInvalid(ValidateGood(b),
                "sparse[1].ids[2] (sample 2) = -1 is out of range [0, 10)");

  b = GoodBatch();
  b.sparse[1].ids[0] = 10;
  ExpectInvalid(ValidateGood(b),
                "sparse[1].ids[0] (sample 0) = 10 is out of range [0, 10)");
}

TEST(BatchTest, RejectsNonFiniteDense) {
  Batch b = GoodBatch();
  b.dense[2 * 3 + 1] = std::numeric_limits<float>::quiet_NaN();
  ExpectInvalid(ValidateGood(b), "dense[sample 2, feature 1] is NaN");

  b = GoodBatch();
  b.dense[3 * 3 + 2] = -std::numeric_limits<float>::infinity();
  ExpectInvalid(ValidateGood(b), "dense[sample 3, feature 2] is -inf");
}

TEST(BatchTest, RejectsLabelsOtherThanZeroOrOne) {
  Batch b = GoodBatch();
  b.labels[3] = 0.5f;
  ExpectInvalid(ValidateGood(b), "labels[3] = 0.5 must be 0 or 1");

  b = GoodBatch();
  b.labels[1] = std::numeric_limits<float>::quiet_NaN();
  ExpectInvalid(ValidateGood(b), "labels[1]");
}

// Random corruptions of a good batch must give OK or InvalidArgument, never
// a crash (run under ASan to make this test bite).
TEST(BatchTest, NeverCrashesOnMalformedBatches) {
  Rng rng = test::SeededRng(20261122);
  auto pick = [&](int64_t lo, int64_t hi) {
    return lo + static_cast<int64_t>(rng.Below(hi - lo + 1));
  };
  for (int trial = 0; trial < 5000; ++trial) {
    Batch b = GoodBatch();
    for (int m = 0; m < 3; ++m) {
      switch (rng.Below(9)) {
        case 0:
          b.size = pick(-3, 8);
          break;
        case 1:
          b.dense.resize(pick(0, 20));
          break;
        case 2:
          b.labels.resize(pick(0, 8));
          break;
        case 3:
          b.sparse.resize(pick(0, 4));
          break;
        case 4:
          if (!b.sparse.empty()) {
            auto& f = b.sparse[rng.Below(b.sparse.size())];
            f.offsets.resize(pick(0, 7));
            for (auto& o : f.offsets) o = pick(-2, 9);
          }
          break;
        case 5:
          if (!b.sparse.empty()) {
            b.sparse[rng.Below(b.sparse.size())].ids.resize(pick(0, 9));
          }
          break;
        case 6:
          if (!b.sparse.empty()) {
            auto& f = b.sparse[rng.Below(b.sparse.size())];
            for (auto& id : f.ids) id = pick(-5, 120);
          }
          break;
        case 7:
          b.num_dense = static_cast<int>(pick(-1, 5));
          break;
        default:
          if (!b.dense.empty()) {
            b.dense[rng.Below(b.dense.size())] =
                std::numeric_limits<float>::infinity();
          }
      }
    }
    const absl::Status status = ValidateGood(b);
    EXPECT_TRUE(status.ok() ||
                status.code() == absl::StatusCode::kInvalidArgument)
        << status;
  }
}

// A random batch of `n` samples: 3 dense features, 2 sparse features with
// 0-4 ids each in [0, 10), labels 0/1.
Batch RandomBatch(Rng* rng, int64_t n) {
  Batch b;
  b.Reset(3, 2);
  b.size = n;
  for (int64_t s = 0; s < n; ++s) {
    for (int j = 0; j < 3; ++j) {
      b.dense.push_back(static_cast<float>(rng->Uniform() * 8 - 4));
    }
    b.labels.push_back(rng->Uniform() < 0.3 ? 1.0f : 0.0f);
    for (SparseFeature& f : b.sparse) {
      const int64_t len = static_cast<int64_t>(rng->NextU64() % 5);
      for (int64_t i = 0; i < len; ++i) {
        f.ids.push_back(static_cast<int64_t>(rng->NextU64() % 10));
      }
      f.offsets.push_back(static_cast<int64_t>(f.ids.size()));
    }
  }
  return b;
}

// The column layout between ranks carries every slice bit for bit.
TEST(BatchColumnsTest, RoundTripsRandomSlices) {
  Rng rng = test::SeededRng(20261124);
  for (int trial = 0; trial < 50; ++trial) {
    const int64_t n = static_cast<int64_t>(rng.NextU64() % 20);
    const Batch b = RandomBatch(&rng, n);
    const int64_t begin = n == 0 ? 0 : static_cast<int64_t>(rng.NextU64() % n);
    const int64_t end =
        begin + static_cast<int64_t>(rng.NextU64() % (n - begin + 1));
    Batch expected;
    b.Slice(begin, end, &expected);
    std::string bytes;
    EncodeColumns(b, begin, end, /*labels=*/true, &bytes);
    Batch decoded;
    ASSERT_TRUE(DecodeColumns(bytes, 3, 2, &decoded).ok());
    ExpectBatchesEqual(decoded, expected);
    EXPECT_EQ(decoded.labels, expected.labels);
    // Without labels: the same samples, labels 0.
    bytes.clear();
    EncodeColumns(b, begin, end, /*labels=*/false, &bytes);
    ASSERT_TRUE(DecodeColumns(bytes, 3, 2, &decoded).ok());
    EXPECT_EQ(decoded.dense, expected.dense);
    EXPECT_EQ(decoded.labels, std::vector<float>(expected.size, 0.0f));
  }
}

// Cut, padded or reshaped bytes are InvalidArgument, never a crash.
TEST(BatchColumnsTest, RejectsBadStructure) {
  Rng rng(7);
  const Batch b = RandomBatch(&rng, 6);
  std::string bytes;
  EncodeColumns(b, 0, 6, /*labels=*/true, &bytes);
  Batch out;
  for (size_t cut = 0; cut < bytes.size(); cut += 3) {
    EXPECT_EQ(DecodeColumns(std::string_view(bytes).substr(0, cut), 3, 2, &out)
                  .code(),
              absl::StatusCode::kInvalidArgument)
        << "cut at " << cut;
  }
  EXPECT_EQ(DecodeColumns(bytes + "x", 3, 2, &out).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DecodeColumns(bytes, 4, 2, &out).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DecodeColumns(bytes, 3, 1, &out).code(),
            absl::StatusCode::kInvalidArgument);
  // A bag length far beyond the bytes that follow.
  std::string huge = bytes;
  const int64_t len = int64_t{1} << 40;
  const size_t lengths_at = 4 * 8 + 6 * 3 * 4 + 6 * 4;
  std::memcpy(huge.data() + lengths_at, &len, sizeof(len));
  EXPECT_EQ(DecodeColumns(huge, 3, 2, &out).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(BatchTest, SliceAndAppendRoundTrip) {
  const Batch b = GoodBatch();
  Batch joined;  // unshaped: takes the shape of the first append
  for (auto [begin, end] :
       {std::pair<int64_t, int64_t>{0, 1}, {1, 1}, {1, 3}, {3, 4}}) {
    Batch part;
    b.Slice(begin, end, &part);
    EXPECT_EQ(part.size, end - begin);
    if (part.size > 0) {
      EXPECT_TRUE(ValidateGood(part).ok()) << ValidateGood(part);
    }
    joined.Append(part);
  }
  ExpectBatchesEqual(joined, b);
  EXPECT_TRUE(ValidateGood(joined).ok());

  Batch middle;
  b.Slice(1, 3, &middle);
  EXPECT_EQ(middle.sparse[0].offsets, (std::vector<int64_t>{0, 1, 1}));
  EXPECT_EQ(middle.sparse[0].ids, (std::vector<int64_t>{0}));
  EXPECT_EQ(middle.labels, (std::vector<float>{1, 1}));
  EXPECT_EQ(middle.dense, (std::vector<float>{3, 4, 5, 6, 7, 8}));

  Batch self = GoodBatch();
  self.Slice(2, 4, &self);
  Batch expected;
  b.Slice(2, 4, &expected);
  ExpectBatchesEqual(self, expected);

  Batch twice = GoodBatch();
  twice.Append(twice);
  EXPECT_EQ(twice.size, 8);
  EXPECT_TRUE(twice.Validate(3, kGoodRows).ok());
}

// --- Criteo TSV --------------------------------------------------------------

TEST(CriteoParseTest, ParsesAFullLine) {
  CriteoRecord r;
  const std::string line =
      Line("1", {"0", "1", "5", "-3", "", "1000"},
           {"68fd1e64", "80e26c9b", "", "FFFFFFFF", "0", "a"});
  ASSERT_TRUE(ParseCriteoLine(line, 13, 26, "t:1", &r).ok());
  EXPECT_EQ(r.label, 1.0f);
  ASSERT_EQ(r.dense.size(), 13u);
  EXPECT_EQ(r.dense[0], 0.0f);
  EXPECT_FLOAT_EQ(r.dense[1], std::log(2.0f));
  EXPECT_FLOAT_EQ(r.dense[2], std::log(6.0f));
  EXPECT_EQ(r.dense[3], 0.0f);  // negative -> 0
  EXPECT_EQ(r.dense[4], 0.0f);  // empty -> 0
  EXPECT_FLOAT_EQ(r.dense[5], std::log(1001.0f));
  ASSERT_EQ(r.cats.size(), 26u);
  EXPECT_EQ(r.cats[0], 0x68fd1e64u);
  EXPECT_EQ(r.cats[1], 0x80e26c9bu);
  EXPECT_EQ(r.cats[2], 0u);
  EXPECT_EQ(r.cats[3], 0xffffffffu);
  EXPECT_EQ(r.cats[5], 0xau);
  EXPECT_EQ(r.cats[25], 0u);
}

TEST(CriteoParseTest, AllFeaturesEmptyAndCrlf) {
  CriteoRecord r;
  ASSERT_TRUE(
      ParseCriteoLine(Line("0", {}, {}) + "\r", 13, 26, "t:1", &r).ok());
  EXPECT_EQ(r.label, 0.0f);
  for (float d : r.dense) EXPECT_EQ(d, 0.0f);
  for (uint32_t c : r.cats) EXPECT_EQ(c, 0u);

  ASSERT_TRUE(
      ParseCriteoLine(Line("1", {"7"}, {"", "", "", "", "", "", "", "",   "",
                                        "", "", "", "", "", "", "", "",   "",
                                        "", "", "", "", "", "", "", "abc"}) +
                          "\r",
                      13, 26, "t:1", &r)
          .ok());
  EXPECT_EQ(r.cats[25], 0xabcu);  // the '\r' is not part of the last field
}

TEST(CriteoParseTest, RejectsWrongColumnCounts) {
  CriteoRecord r;
  std::string line = Line("1", {}, {});
  const std::string short_line = line.substr(0, line.rfind('\t'));
  ExpectInvalid(ParseCriteoLine(short_line, 13, 26, "day_0:17", &r),
                "day_0:17: line has 39 columns, expected 40");
  ExpectInvalid(ParseCriteoLine(line + "\t\t", 13, 26, "day_0:18", &r),
                "day_0:18: line has 42 columns, expected 40");
  ExpectInvalid(ParseCriteoLine("", 13, 26, "day_0:19", &r), "day_0:19");
  ExpectInvalid(ParseCriteoLine("1", 13, 26, "day_0:20", &r),
                "day_0:20: line has 1 columns, expected 40");
}

TEST(CriteoParseTest, RejectsBadValuesNamingTheColumn) {
  CriteoRecord r;
  ExpectInvalid(ParseCriteoLine(Line("1", {"", "1.5"}, {}), 13, 26, "f:3", &r),
                "f:3: column 2 (dense 1): bad integer '1.5'");
  ExpectInvalid(ParseCriteoLine(Line("1", {"abc"}, {}), 13, 26, "f:3", &r),
                "column 1 (dense 0): bad integer 'abc'");
  ExpectInvalid(ParseCriteoLine(Line("1", {"99999999999999999999"}, {}), 13, 26,
                                "f:3", &r),
                "column 1 (dense 0): bad integer");
  ExpectInvalid(ParseCriteoLine(Line("1", {}, {"zz"}), 13, 26, "f:4", &r),
                "f:4: column 14 (categorical 0): bad categorical 'zz'");
  ExpectInvalid(
      ParseCriteoLine(Line("1", {}, {"", "123456789"}), 13, 26, "f:4", &r),
      "column 15 (categorical 1): bad categorical '123456789'");
  ExpectInvalid(ParseCriteoLine(Line("1", {}, {"-1"}), 13, 26, "f:4", &r),
                "column 14");
  ExpectInvalid(ParseCriteoLine(Line("1", {}, {"0x12"}), 13, 26, "f:4", &r),
                "column 14");
  ExpectInvalid(ParseCriteoLine(Line("1", {}, {"12 "}), 13, 26, "f:4", &r),
                "column 14");
  ExpectInvalid(ParseCriteoLine(Line("2", {}, {}), 13, 26, "f:5", &r),
                "f:5: column 0 (label): label '2' must be 0 or 1");
  ExpectInvalid(ParseCriteoLine(Line("", {}, {}), 13, 26, "f:5", &r),
                "label '' must be 0 or 1");
  ExpectInvalid(ParseCriteoLine(Line("0.5", {}, {}), 13, 26, "f:5", &r),
                "label '0.5' must be 0 or 1");
}

// A field quoted back is at most 32 bytes of the file, escaped: no line of
// a file comes back whole, and no control byte reaches a terminal or a log.
TEST(CriteoParseTest, QuotesAShortEscapedExcerptOfABadField) {
  CriteoRecord r;
  const std::string label =
      std::string("\x01\x1b[2J\r", 6) + std::string(26, 'x') + "NOT-QUOTED";
  const absl::Status s =
      ParseCriteoLine(Line(label, {}, {}), 13, 26, "f:6", &r);
  ExpectInvalid(s, "f:6: column 0 (label): label '\\x01\\x1b[2J\\r" +
                       std::string(26, 'x') + "...' must be 0 or 1");
  EXPECT_NO_SUBSTR(s.message(), "NOT-QUOTED") << s;
  ExpectInvalid(ParseCriteoLine(Line("1", {std::string("1\n2", 3)}, {}), 13, 26,
                                "f:7", &r),
                "f:7: column 1 (dense 0): bad integer '1\\n2'");
  ExpectInvalid(ParseCriteoLine(Line("1", {}, {std::string("\xff\0", 2)}), 13,
                                26, "f:8", &r),
                "column 14 (categorical 0): bad categorical '\\xff\\x00'");
}

TEST(CriteoTsvTest, ReadsBatchesAcrossFilesAndRewinds) {
  const std::string a = TempPath("criteo_a.txt");
  const std::string b = TempPath("criteo_b.txt");
  WriteFile(a, Line("1", {"1"}, {"a"}) + "\n" + Line("0", {"2"}, {"b"}) +
                   "\r\n" + Line("1", {"3"}, {"c"}) + "\n");
  // No final newline, and a blank line in the middle.
  WriteFile(b, Line("0", {"4"}, {"d"}) + "\n\n" + Line("0", {"5"}, {"e"}));
  CriteoOptions options;
  options.table_rows = CriteoRows(7);
  absl::StatusOr<std::unique_ptr<BatchSource>> source =
      OpenCriteoTsv({a, b}, options);
  ASSERT_TRUE(source.ok()) << source.status();
  for (int epoch = 0; epoch < 2; ++epoch) {
    std::vector<Batch> batches = ReadAll(source->get(), 2);
    ASSERT_EQ(batches.size(), 3u);
    EXPECT_EQ(batches[0].size, 2);
    EXPECT_EQ(batches[1].size, 2);
    EXPECT_EQ(batches[2].size, 1);
    Batch all;
    for (const Batch& batch : batches) {
      EXPECT_TRUE(batch.Validate(13, options.table_rows).ok());
      all.Append(batch);
    }
    EXPECT_EQ(all.labels, (std::vector<float>{1, 0, 1, 0, 0}));
    EXPECT_EQ(all.sparse[0].ids,
              (std::vector<int64_t>{10 % 7, 11 % 7, 12 % 7, 13 % 7, 14 % 7}));
    EXPECT_EQ(all.sparse[0].offsets, (std::vector<int64_t>{0, 1, 2, 3, 4, 5}));
    EXPECT_EQ(all.sparse[1].ids, (std::vector<int64_t>(5, 0)));
    EXPECT_FLOAT_EQ(all.dense[4 * 13], std::log(6.0f));
    ASSERT_TRUE((*source)->Rewind().ok());
  }
}

TEST(CriteoTsvTest, HashIdsUsesMix64) {
  const std::string a = TempPath("criteo_hash.txt");
  WriteFile(a, Line("1", {}, {"68fd1e64"}) + "\n");
  CriteoOptions options;
  options.table_rows = CriteoRows(1000);
  options.hash_ids = true;
  auto source = OpenCriteoTsv({a}, options);
  ASSERT_TRUE(source.ok()) << source.status();
  std::vector<Batch> batches = ReadAll(source->get(), 10);
  ASSERT_EQ(batches.size(), 1u);
  EXPECT_EQ(batches[0].sparse[0].ids[0],
            static_cast<int64_t>(Mix64(0x68fd1e64u) % 1000));
  EXPECT_EQ(CriteoRow(0x68fd1e64u, 1000, false), 0x68fd1e64 % 1000);
}

TEST(CriteoTsvTest, ErrorsNameFileAndLine) {
  const std::string a = TempPath("criteo_ok.txt");
  const std::string b = TempPath("criteo_bad.txt");
  WriteFile(a, Line("1", {}, {}) + "\n");
  WriteFile(b, Line("1", {}, {}) + "\n" + Line("0", {}, {}) + "\n" +
                   Line("1", {}, {"xyz"}) + "\n");
  CriteoOptions options;
  options.table_rows = CriteoRows(10);
  auto source = OpenCriteoTsv({a, b}, options);
  ASSERT_TRUE(source.ok()) << source.status();
  Batch batch;
  absl::StatusOr<bool> more = (*source)->Next(100, &batch);
  ExpectInvalid(more.status(), b + ":3: column 14 (categorical 0)");
}

TEST(CriteoTsvTest, MissingFileIsNotFound) {
  CriteoOptions options;
  options.table_rows = CriteoRows(10);
  const std::string missing = TempPath("no_such_day.txt");
  auto source = OpenCriteoTsv({missing}, options);
  EXPECT_EQ(source.status().code(), absl::StatusCode::kNotFound);
  ExpectMentions(source.status(), missing);
}

TEST(CriteoTsvTest, OptionsValidate) {
  CriteoOptions options;
  ExpectInvalid(options.Validate(), "table_rows is empty");
  options.table_rows = {10, 0};
  ExpectInvalid(options.Validate(), "table_rows[1] = 0 must be positive");
  options.table_rows = {10};
  options.num_dense = -1;
  ExpectInvalid(options.Validate(), "num_dense = -1");
  options.num_dense = 13;
  EXPECT_TRUE(options.Validate().ok());
  ExpectInvalid(OpenCriteoTsv({"x"}, CriteoOptions{}).status(), "table_rows");
}

// --- Binary format -----------------------------------------------------------

// Random Criteo lines (empty fields, negatives, mixed-case hex of any length).
std::string RandomTsv(Rng* rng, int lines) {
  std::string text;
  for (int i = 0; i < lines; ++i) {
    std::vector<std::string> dense, cats;
    for (int j = 0; j < 13; ++j) {
      const uint64_t kind = rng->Below(10);
      if (kind == 0) {
        dense.push_back("");
      } else if (kind == 1) {
        dense.push_back(std::to_string(-static_cast<int64_t>(rng->Below(100))));
      } else {
        dense.push_back(
            std::to_string(rng->Below(uint64_t{1} << rng->Below(40))));
      }
    }
    for (int t = 0; t < 26; ++t) {
      if (rng->Below(10) == 0) {
        cats.push_back("");
        continue;
      }
      const int digits = 1 + static_cast<int>(rng->Below(8));
      std::string hex;
      for (int d = 0; d < digits; ++d) {
        hex.push_back((rng->Below(2) ? "0123456789abcdef"
                                     : "0123456789ABCDEF")[rng->Below(16)]);
      }
      cats.push_back(hex);
    }
    text += Line(rng->Below(4) == 0 ? "1" : "0", dense, cats);
    text += rng->Below(3) == 0 ? "\r\n" : "\n";
  }
  return text;
}

// Two files of RandomTsv lines, `lines_a` in TempPath(name + "_a.txt") and
// then `lines_b` in TempPath(name + "_b.txt"); their paths in that order.
std::vector<std::string> TwoRandomTsvFiles(Rng* rng, const std::string& name,
                                           int lines_a, int lines_b) {
  const std::vector<std::string> files = {TempPath(name + "_a.txt"),
                                          TempPath(name + "_b.txt")};
  WriteFile(files[0], RandomTsv(rng, lines_a));
  WriteFile(files[1], RandomTsv(rng, lines_b));
  return files;
}

// 26 row counts: every reduction path (1, 2^31 + 1, 2^32) and random ones;
// `max_rows` caps them (2^32 for a version-2 file).
std::vector<int64_t> TableRowsForTests(Rng* rng, int64_t max_rows) {
  std::vector<int64_t> rows = {1,
                               2,
                               3,
                               7,
                               100000,
                               1460,
                               24,
                               10131227,
                               (1LL << 31) + 1,
                               (1LL << 32) - 1,
                               1LL << 32,
                               1LL << 40};
  for (int64_t& r : rows) r = std::min(r, max_rows);
  while (rows.size() < 26) rows.push_back(1 + rng->Below(1 << 20));
  return rows;
}

TEST(CriteoBinaryTest, ConversionRoundTripsToTheTsvBatches) {
  Rng rng = test::SeededRng(424242);
  const std::vector<std::string> tsv_files =
      TwoRandomTsvFiles(&rng, "rt", 700, 333);
  const std::string bin = TempPath("rt.bin");
  absl::StatusOr<int64_t> count = ConvertCriteoTsvToBinary(tsv_files, bin);
  ASSERT_TRUE(count.ok()) << count.status();
  EXPECT_EQ(*count, 1033);
  EXPECT_EQ(std::filesystem::file_size(bin), 32u + 1033u * 4 * (1 + 13 + 26));

  // Row counts that exercise every reduction path, including 1 and >= 2^32.
  const std::vector<int64_t> rows = TableRowsForTests(&rng, int64_t{1} << 40);
  for (bool hash : {false, true}) {
    CriteoOptions options;
    options.table_rows = rows;
    options.hash_ids = hash;
    auto tsv = OpenCriteoTsv(tsv_files, options);
    auto binary = OpenCriteoBinary(bin, options);
    ASSERT_TRUE(tsv.ok()) << tsv.status();
    ASSERT_TRUE(binary.ok()) << binary.status();
    ExpectSameEpochs(binary->get(), tsv->get(), 128, 9, rows);
  }
}

TEST(CriteoBinaryTest, RejectsTruncatedFileAndBadMagic) {
  const std::string tsv = TempPath("small.txt");
  WriteFile(tsv,
            Line("1", {"1"}, {"a"}) + "\n" + Line("0", {"2"}, {"b"}) + "\n");
  const std::string bin = TempPath("small.bin");
  ASSERT_TRUE(ConvertCriteoTsvToBinary({tsv}, bin).ok());
  CriteoOptions options;
  options.table_rows = CriteoRows(10);
  ASSERT_TRUE(OpenCriteoBinary(bin, options).ok());

  const std::string truncated = TempPath("truncated.bin");
  std::filesystem::copy_file(bin, truncated,
                             std::filesystem::copy_options::overwrite_existing);
  std::filesystem::resize_file(truncated, std::filesystem::file_size(bin) - 3);
  ExpectInvalid(OpenCriteoBinary(truncated, options).status(),
                truncated + ": file has");
  std::filesystem::resize_file(truncated, 10);
  ExpectInvalid(OpenCriteoBinary(truncated, options).status(),
                truncated + ": file has 10 bytes");

  const std::string bad_magic = TempPath("bad_magic.bin");
  std::filesystem::copy_file(bin, bad_magic,
                             std::filesystem::copy_options::overwrite_existing);
  {
    std::fstream f(bad_magic, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(0);
    f.put('X');
  }
  ExpectInvalid(OpenCriteoBinary(bad_magic, options).status(),
                bad_magic + ": bad magic");

  CriteoOptions other = options;
  other.num_dense = 12;
  ExpectInvalid(OpenCriteoBinary(bin, other).status(),
                bin + ": file has 13 dense and 26 sparse features");

  const std::string missing = TempPath("missing.bin");
  auto source = OpenCriteoBinary(missing, options);
  EXPECT_EQ(source.status().code(), absl::StatusCode::kNotFound);
  ExpectMentions(source.status(), missing);
}

TEST(CriteoBinaryTest, FailedConversionLeavesNoOutput) {
  const std::string tsv = TempPath("bad_for_convert.txt");
  WriteFile(tsv, Line("1", {}, {}) + "\n" + Line("3", {}, {}) + "\n");
  const std::string bin = TempPath("never.bin");
  std::filesystem::remove(bin);
  absl::StatusOr<int64_t> count = ConvertCriteoTsvToBinary({tsv}, bin);
  ExpectInvalid(count.status(), tsv + ":2: column 0 (label)");
  EXPECT_FALSE(std::filesystem::exists(bin));
  for (const auto& entry :
       std::filesystem::directory_iterator(testing::TempDir())) {
    EXPECT_NO_SUBSTR(entry.path().string(), "never.bin.tmp");
  }
}

TEST(CriteoBinaryTest, EmptyInputGivesAnEmptyDataset) {
  const std::string tsv = TempPath("empty.txt");
  WriteFile(tsv, "");
  const std::string bin = TempPath("empty.bin");
  absl::StatusOr<int64_t> count = ConvertCriteoTsvToBinary({tsv}, bin);
  ASSERT_TRUE(count.ok()) << count.status();
  EXPECT_EQ(*count, 0);
  CriteoOptions options;
  options.table_rows = CriteoRows(10);
  auto source = OpenCriteoBinary(bin, options);
  ASSERT_TRUE(source.ok()) << source.status();
  EXPECT_TRUE(ReadAll(source->get(), 10).empty());
}

// --- Multi-hot bags from one-hot data ---------------------------------------

// MLPerf DLRM-DCNv2's multi-hot sizes (configs/mlperf-dlrm-dcnv2.textproto).
const std::vector<int> kDcnV2Sizes = {3, 2,  1,   2,  6,  1, 1, 1, 1,
                                      7, 3,  8,   1,  6,  9, 5, 1, 1,
                                      1, 12, 100, 27, 10, 3, 1, 1};

// The batch a Criteo reader should yield for the lines of `text` under
// `options`, built line by line: ParseCriteoLine, CriteoRow, then the bag
// DeriveMultiHotBag gives for that row with the table's seed.
Batch ReferenceBatch(const std::string& text, const CriteoOptions& options) {
  const int num_sparse = static_cast<int>(options.table_rows.size());
  Batch b;
  b.Reset(options.num_dense, num_sparse);
  size_t begin = 0;
  int line_number = 0;
  while (begin < text.size()) {
    size_t end = text.find('\n', begin);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(begin, end - begin);
    begin = end + 1;
    ++line_number;
    if (line.empty() || line == "\r") continue;
    CriteoRecord r;
    const absl::Status parsed =
        ParseCriteoLine(line, options.num_dense, num_sparse, "reference", &r);
    EXPECT_TRUE(parsed.ok()) << "line " << line_number << ": " << parsed;
    b.labels.push_back(r.label);
    b.dense.insert(b.dense.end(), r.dense.begin(), r.dense.end());
    for (int t = 0; t < num_sparse; ++t) {
      const int64_t rows = options.table_rows[t];
      const int k = options.MultiHotSize(t);
      std::vector<int64_t> bag(k);
      DeriveMultiHotBag(CriteoRow(r.cats[t], rows, options.hash_ids), rows, k,
                        MultiHotTableSeed(t), bag.data());
      b.sparse[t].ids.insert(b.sparse[t].ids.end(), bag.begin(), bag.end());
      b.sparse[t].offsets.push_back(
          static_cast<int64_t>(b.sparse[t].ids.size()));
    }
    ++b.size;
  }
  return b;
}

// All samples of `source` in one batch (read in batches of `batch_size`).
Batch ReadWhole(BatchSource* source, int64_t batch_size) {
  Batch all;
  for (const Batch& batch : ReadAll(source, batch_size)) all.Append(batch);
  return all;
}

// The derivation against its documented formula, on random rows, sizes and
// seeds: first id the row, the others HashKey(seed, row, j) scaled to rows.
TEST(MultiHotTest, BagIsTheRowThenHashedIdsInRange) {
  const uint64_t seed = 8080;
  Rng rng = test::SeededRng(seed);
  const std::vector<int64_t> row_counts = {
      1, 2, 3, 40000000, 1LL << 32, 1LL << 40, (1LL << 62) + 5};
  for (int i = 0; i < 2000; ++i) {
    const int64_t rows = row_counts[rng.Below(row_counts.size())];
    const int size = 1 + static_cast<int>(rng.Below(120));
    const uint64_t table_seed = rng.Below(30);
    const int64_t row = static_cast<int64_t>(rng.Below(rows));
    std::vector<int64_t> bag(size, -1), again(size, -2);
    DeriveMultiHotBag(row, rows, size, table_seed, bag.data());
    DeriveMultiHotBag(row, rows, size, table_seed, again.data());
    EXPECT_EQ(bag, again);
    ASSERT_EQ(bag[0], row);
    for (int j = 1; j < size; ++j) {
      const uint64_t bits = HashKey(table_seed, static_cast<uint64_t>(row), j);
      const int64_t expected =
          static_cast<int64_t>((static_cast<unsigned __int128>(bits) *
                                static_cast<uint64_t>(rows)) >>
                               64);
      ASSERT_EQ(bag[j], expected) << "rows " << rows << " row " << row;
      ASSERT_GE(bag[j], 0);
      ASSERT_LT(bag[j], rows);
    }
  }
  // Another table's seed gives another bag for the same row.
  std::vector<int64_t> t0(100), t1(100);
  DeriveMultiHotBag(12345, 40000000, 100, MultiHotTableSeed(0), t0.data());
  DeriveMultiHotBag(12345, 40000000, 100, MultiHotTableSeed(1), t1.data());
  EXPECT_EQ(t0[0], t1[0]);
  EXPECT_NE(t0, t1);
  EXPECT_EQ(MultiHotTableSeed(3), kMultiHotSeed + 3);
}

// The added ids are uniform over the table: the bags of the 10 rows of a
// table hold 100,000 added ids, each row about 10,000 times (standard
// deviation 95; the bounds are 6 of it).
TEST(MultiHotTest, AddedIdsAreUniform) {
  std::vector<int64_t> counts(10, 0);
  std::vector<int64_t> bag(10001);
  for (int64_t row = 0; row < 10; ++row) {
    DeriveMultiHotBag(row, 10, 10001, MultiHotTableSeed(4), bag.data());
    for (size_t j = 1; j < bag.size(); ++j) ++counts[bag[j]];
  }
  for (int64_t r = 0; r < 10; ++r) {
    EXPECT_GT(counts[r], 9430) << "row " << r;
    EXPECT_LT(counts[r], 10570) << "row " << r;
  }
}

TEST(MultiHotTest, OptionsValidateTheSizes) {
  CriteoOptions options;
  options.table_rows = {10, 20};
  options.multi_hot_sizes = {1};
  ExpectInvalid(options.Validate(), "multi_hot_sizes has 1 entries");
  options.multi_hot_sizes = {1, 0};
  ExpectInvalid(options.Validate(), "multi_hot_sizes[1] = 0 must be in [1, ");
  options.multi_hot_sizes = {kMaxMultiHotSize + 1, 1};
  ExpectInvalid(options.Validate(), "multi_hot_sizes[0] = 65537");
  options.multi_hot_sizes = {kMaxMultiHotSize, 3};
  EXPECT_TRUE(options.Validate().ok());
  EXPECT_EQ(options.MultiHotSize(1), 3);
  options.multi_hot_sizes.clear();
  EXPECT_EQ(options.MultiHotSize(1), 1);
  ExpectInvalid(OpenCriteoTsv({"x"}, CriteoOptions{.table_rows = {5},
                                                   .multi_hot_sizes = {-1}})
                    .status(),
                "multi_hot_sizes[0] = -1");
}

TEST(MultiHotTest, OptionsForModelTakeTheTablesMultiHotSizes) {
  const CriteoOptions dcn =
      CriteoOptionsForModel(Preset("mlperf-dlrm-dcnv2"), false);
  EXPECT_EQ(dcn.num_dense, 13);
  EXPECT_FALSE(dcn.hash_ids);
  EXPECT_EQ(dcn.multi_hot_sizes, kDcnV2Sizes);
  ASSERT_EQ(dcn.table_rows.size(), 26u);
  EXPECT_EQ(dcn.table_rows[0], 40000000);
  EXPECT_EQ(dcn.table_rows[5], 3);
  const CriteoOptions tiny = CriteoOptionsForModel(Preset("tiny"), true);
  EXPECT_EQ(tiny.num_dense, 4);
  EXPECT_TRUE(tiny.hash_ids);
  EXPECT_EQ(tiny.table_rows, (std::vector<int64_t>{50, 20, 100}));
  EXPECT_EQ(tiny.multi_hot_sizes, (std::vector<int>{1, 3, 2}));
  // multi_hot_size 0 (an unnormalised config) counts as 1.
  ModelConfig raw;
  raw.add_tables()->set_rows(9);
  EXPECT_EQ(CriteoOptionsForModel(raw, false).multi_hot_sizes,
            (std::vector<int>{1}));
}

// The TSV reader with multi-hot sizes against the reference built line by
// line, with and without hash_ids; sizes all 1 give today's one-hot batches.
TEST(CriteoTsvTest, MultiHotBagsAreTheDerivationOfEachRow) {
  Rng rng = test::SeededRng(5150);
  const std::string a = TempPath("mh_a.txt");
  const std::string b = TempPath("mh_b.txt");
  const std::string text_a = RandomTsv(&rng, 300);
  std::string text_b = "\n";  // a blank line first
  text_b += RandomTsv(&rng, 157);
  WriteFile(a, text_a);
  WriteFile(b, text_b);
  for (bool hash : {false, true}) {
    SCOPED_TRACE(hash ? "hash_ids" : "modulo");
    CriteoOptions options;
    options.table_rows = TableRowsForTests(&rng, int64_t{1} << 40);
    options.hash_ids = hash;
    options.multi_hot_sizes = kDcnV2Sizes;
    auto source = OpenCriteoTsv({a, b}, options);
    ASSERT_TRUE(source.ok()) << source.status();
    const Batch expected = ReferenceBatch(text_a + text_b, options);
    ASSERT_EQ(expected.size, 457);
    for (int epoch = 0; epoch < 2; ++epoch) {
      const Batch whole = ReadWhole(source->get(), 100);
      ExpectBatchesEqual(whole, expected);
      EXPECT_TRUE(whole.Validate(13, options.table_rows).ok());
      for (int t = 0; t < 26; ++t) {
        for (int64_t s = 0; s < whole.size; ++s) {
          ASSERT_EQ(whole.sparse[t].bag_size(s), kDcnV2Sizes[t]);
        }
      }
      ASSERT_TRUE((*source)->Rewind().ok());
    }

    // Sizes all 1, given or left empty: one id per bag, the one-hot row.
    CriteoOptions one_hot = options;
    one_hot.multi_hot_sizes.clear();
    CriteoOptions all_ones = options;
    all_ones.multi_hot_sizes.assign(26, 1);
    auto plain = OpenCriteoTsv({a, b}, one_hot);
    auto ones = OpenCriteoTsv({a, b}, all_ones);
    ASSERT_TRUE(plain.ok() && ones.ok());
    const Batch plain_whole = ReadWhole(plain->get(), 64);
    ExpectBatchesEqual(plain_whole, ReadWhole(ones->get(), 64));
    ExpectBatchesEqual(plain_whole, ReferenceBatch(text_a + text_b, one_hot));
    // Each multi-hot bag starts with the one-hot row.
    const Batch multi = ReferenceBatch(text_a + text_b, options);
    for (int t = 0; t < 26; ++t) {
      for (int64_t s = 0; s < multi.size; ++s) {
        ASSERT_EQ(multi.sparse[t].ids[multi.sparse[t].offsets[s]],
                  plain_whole.sparse[t].ids[s]);
      }
    }
  }
}

// A version-1 file (raw one-hot values) read with multi-hot sizes gives the
// TSV reader's bags; with sizes all 1 the batches of the default options.
TEST(CriteoBinaryTest, VersionOneWithMultiHotSizesEqualsTheTsvReader) {
  Rng rng = test::SeededRng(6160);
  const std::string a = TempPath("mh_v1.txt");
  WriteFile(a, RandomTsv(&rng, 411));
  const std::string bin = TempPath("mh_v1.bin");
  ASSERT_TRUE(ConvertCriteoTsvToBinary({a}, bin).ok());
  for (bool hash : {false, true}) {
    SCOPED_TRACE(hash ? "hash_ids" : "modulo");
    CriteoOptions options;
    options.table_rows = TableRowsForTests(&rng, int64_t{1} << 40);
    options.hash_ids = hash;
    for (int t = 0; t < 26; ++t) {
      options.multi_hot_sizes.push_back(1 + static_cast<int>(rng.Below(9)));
    }
    auto tsv = OpenCriteoTsv({a}, options);
    auto binary = OpenCriteoBinary(bin, options);
    ASSERT_TRUE(tsv.ok()) << tsv.status();
    ASSERT_TRUE(binary.ok()) << binary.status();
    ExpectSameEpochs(binary->get(), tsv->get(), 128, 4, options.table_rows);
    CriteoOptions all_ones = options;
    all_ones.multi_hot_sizes.assign(26, 1);
    CriteoOptions one_hot = options;
    one_hot.multi_hot_sizes.clear();
    ExpectBatchesEqual(ReadWhole(OpenCriteoBinary(bin, all_ones)->get(), 50),
                       ReadWhole(OpenCriteoBinary(bin, one_hot)->get(), 50));
  }
}

// Version 2: the converted file holds the TSV reader's bags, read back
// without deriving them (the same batches, Skip included), for the DCNv2
// sizes and random ones, with and without hash_ids.
TEST(CriteoBinaryTest, VersionTwoRoundTripsTheTsvReadersBags) {
  Rng rng = test::SeededRng(7170);
  const std::vector<std::string> tsv_files =
      TwoRandomTsvFiles(&rng, "mh_v2", 250, 123);
  const std::string bin = TempPath("mh_v2.bin");
  for (int trial = 0; trial < 3; ++trial) {
    CriteoOptions options;
    options.table_rows = TableRowsForTests(&rng, int64_t{1} << 32);
    options.hash_ids = trial == 1;
    if (trial == 2) {
      for (int t = 0; t < 26; ++t) {
        options.multi_hot_sizes.push_back(1 + static_cast<int>(rng.Below(5)));
      }
    } else {
      options.multi_hot_sizes = kDcnV2Sizes;
    }
    SCOPED_TRACE(absl::StrCat("trial ", trial));
    absl::StatusOr<int64_t> count =
        ConvertCriteoTsvToMultiHotBinary(tsv_files, bin, options);
    ASSERT_TRUE(count.ok()) << count.status();
    EXPECT_EQ(*count, 373);
    int64_t ids = 0;
    for (int t = 0; t < 26; ++t) ids += options.MultiHotSize(t);
    EXPECT_EQ(std::filesystem::file_size(bin),
              static_cast<uintmax_t>(32 + 16 * 26 + 373 * 4 * (1 + 13 + ids)));
    EXPECT_EQ(*ReadCriteoBinaryCount(bin), 373);

    auto tsv = OpenCriteoTsv(tsv_files, options);
    auto binary = OpenCriteoBinary(bin, options);
    ASSERT_TRUE(tsv.ok()) << tsv.status();
    ASSERT_TRUE(binary.ok()) << binary.status();
    ExpectSameEpochs(binary->get(), tsv->get(), 100, 4, options.table_rows);
    // Skipping moves over whole records of every table's bags.
    Batch whole, after_skip, expected;
    ASSERT_TRUE(*(*tsv)->Next(373, &whole));
    ASSERT_EQ(*(*binary)->Skip(200), 200);
    ASSERT_TRUE(*(*binary)->Next(10, &after_skip));
    whole.Slice(200, 210, &expected);
    ExpectBatchesEqual(after_skip, expected);
  }
}

// Copies `from` to `to` and overwrites `bytes` at `offset`.
void CopyAndPatch(const std::string& from, const std::string& to,
                  std::streamoff offset, const void* bytes, size_t size) {
  std::filesystem::copy_file(from, to,
                             std::filesystem::copy_options::overwrite_existing);
  std::fstream f(to, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(offset);
  f.write(static_cast<const char*>(bytes), static_cast<std::streamsize>(size));
  ASSERT_TRUE(f.good()) << to;
}

TEST(CriteoBinaryTest, VersionTwoRejectsHeadersUnlikeTheOptions) {
  const std::string tsv = TempPath("mh_small.txt");
  WriteFile(tsv, Line("1", {"1"}, {"a", "b"}) + "\n" +
                     Line("0", {"2"}, {"c", "d"}) + "\n" +
                     Line("1", {"3"}, {"e", "f"}) + "\n");
  const std::string bin = TempPath("mh_small.bin");
  CriteoOptions options;
  options.table_rows = CriteoRows(10);
  options.multi_hot_sizes = kDcnV2Sizes;
  ASSERT_TRUE(ConvertCriteoTsvToMultiHotBinary({tsv}, bin, options).ok());
  ASSERT_TRUE(OpenCriteoBinary(bin, options).ok());
  const size_t header = 32 + 16 * 26;
  const size_t record = 4 * (1 + 13 + 214);
  EXPECT_EQ(std::filesystem::file_size(bin), header + 3 * record);

  // Sizes, rows, hashing and columns must be the options'.
  CriteoOptions other = options;
  other.multi_hot_sizes[4] = 5;
  ExpectInvalid(OpenCriteoBinary(bin, other).status(),
                bin +
                    ": table 4: file's bags hold 6 ids, the options expect "
                    "multi_hot_sizes[4] = 5");
  other.multi_hot_sizes.clear();
  ExpectInvalid(OpenCriteoBinary(bin, other).status(),
                "table 0: file's bags hold 3 ids, the options expect "
                "multi_hot_sizes[0] = 1");
  other = options;
  other.table_rows[7] = 11;
  ExpectInvalid(OpenCriteoBinary(bin, other).status(),
                bin +
                    ": table 7: file's ids index 10 rows, the options "
                    "expect table_rows[7] = 11");
  other = options;
  other.hash_ids = true;
  ExpectInvalid(OpenCriteoBinary(bin, other).status(),
                "file's ids were reduced without hash_ids");
  other = options;
  other.num_dense = 12;
  ExpectInvalid(OpenCriteoBinary(bin, other).status(),
                "file has 13 dense and 26 sparse features");

  // Truncated records, a truncated table list, an unknown version, flag
  // or reserved field.
  const std::string bad = TempPath("mh_bad.bin");
  std::filesystem::copy_file(bin, bad,
                             std::filesystem::copy_options::overwrite_existing);
  std::filesystem::resize_file(bad, header + 3 * record - 4);
  ExpectInvalid(
      OpenCriteoBinary(bad, options).status(),
      absl::StrCat(bad, ": file has ", header + 3 * record - 4,
                   " bytes, which does not match its header's 3 "
                   "records of ",
                   record, " bytes after the ", header, "-byte header"));
  std::filesystem::resize_file(bad, 100);
  ExpectInvalid(OpenCriteoBinary(bad, options).status(),
                bad +
                    ": file has 100 bytes, fewer than the 448-byte header "
                    "and table list");
  const uint32_t three = 3;
  CopyAndPatch(bin, bad, 8, &three, sizeof(three));
  ExpectInvalid(OpenCriteoBinary(bad, options).status(),
                bad + ": unsupported version 3");
  const uint32_t flags = 6;
  CopyAndPatch(bin, bad, 20, &flags, sizeof(flags));
  ExpectInvalid(OpenCriteoBinary(bad, options).status(),
                bad + ": unknown flags 6");
  const uint32_t reserved = 1;
  CopyAndPatch(bin, bad, 32 + 16 * 2 + 12, &reserved, sizeof(reserved));
  ExpectInvalid(OpenCriteoBinary(bad, options).status(),
                bad + ": table 2: reserved field is 1");

  // An id outside its table names the record and table; reading goes on.
  const uint32_t ten = 10;
  CopyAndPatch(bin, bad, header + record + 4 * (1 + 13 + 3 + 1), &ten,
               sizeof(ten));  // record 1, table 1's second id
  auto source = OpenCriteoBinary(bad, options);
  ASSERT_TRUE(source.ok()) << source.status();
  Batch batch;
  ASSERT_TRUE(*(*source)->Next(1, &batch));
  ExpectInvalid((*source)->Next(2, &batch).status(),
                bad +
                    ": record 1: table 1: id 10 is not below the table's "
                    "10 rows");
  ASSERT_TRUE(*(*source)->Next(2, &batch));
  EXPECT_EQ(batch.size, 1);
  EXPECT_TRUE(batch.Validate(13, options.table_rows).ok());
}

TEST(CriteoBinaryTest, VersionTwoConversionRefusesTablesBeyondUint32) {
  const std::string tsv = TempPath("mh_huge.txt");
  WriteFile(tsv, Line("1", {}, {}) + "\n");
  const std::string bin = TempPath("mh_huge.bin");
  std::filesystem::remove(bin);
  CriteoOptions options;
  options.table_rows = CriteoRows(10);
  options.table_rows[2] = (int64_t{1} << 32) + 1;
  ExpectInvalid(ConvertCriteoTsvToMultiHotBinary({tsv}, bin, options).status(),
                "table 2 has 4294967297 rows (CriteoOptions.table_rows[2])");
  options.table_rows[2] = 10;
  options.multi_hot_sizes = {2};
  ExpectInvalid(ConvertCriteoTsvToMultiHotBinary({tsv}, bin, options).status(),
                "multi_hot_sizes has 1 entries");
  EXPECT_FALSE(std::filesystem::exists(bin));
}

TEST(CriteoBinaryTest, ReadCountFromEitherVersion) {
  const std::string tsv = TempPath("count.txt");
  WriteFile(tsv, Line("1", {}, {}) + "\n" + Line("0", {}, {}) + "\n");
  const std::string v1 = TempPath("count_v1.bin");
  const std::string v2 = TempPath("count_v2.bin");
  ASSERT_TRUE(ConvertCriteoTsvToBinary({tsv}, v1).ok());
  CriteoOptions options;
  options.table_rows = CriteoRows(5);
  options.multi_hot_sizes = kDcnV2Sizes;
  ASSERT_TRUE(ConvertCriteoTsvToMultiHotBinary({tsv}, v2, options).ok());
  EXPECT_EQ(*ReadCriteoBinaryCount(v1), 2);
  EXPECT_EQ(*ReadCriteoBinaryCount(v2), 2);
  const std::string missing = TempPath("count_missing.bin");
  EXPECT_EQ(ReadCriteoBinaryCount(missing).status().code(),
            absl::StatusCode::kNotFound);
  ExpectInvalid(ReadCriteoBinaryCount(tsv).status(), tsv + ": bad magic");
  const std::string short_file = TempPath("count_short.bin");
  WriteFile(short_file, "DLRMBIN1");
  ExpectInvalid(ReadCriteoBinaryCount(short_file).status(),
                short_file + ": file has 8 bytes");
}

// dlrm_convert --config writes version 2 with the config's bags; without
// it, version 1 as before.
TEST(ConvertToolTest, ConfigFlagWritesTheConfigsBags) {
  const std::string tsv = TempPath("tool.txt");
  std::string text;
  for (int i = 0; i < 40; ++i) {
    text += absl::StrCat(i % 3 == 0 ? "1" : "0", "\t", i, "\t\t", 2 * i,
                         "\t7\t", absl::Hex(i * 7919), "\t", absl::Hex(i), "\t",
                         absl::Hex(i * 31), "\n");
  }
  WriteFile(tsv, text);
  const std::string v2 = TempPath("tool_v2.bin");
  const std::string v1 = TempPath("tool_v1.bin");
  const std::string tool = DLRM_CONVERT_BINARY;
  ASSERT_EQ(std::system((tool + " --config tiny --out " + v2 + " " + tsv +
                         " > /dev/null")
                            .c_str()),
            0);
  ASSERT_EQ(std::system((tool + " --num-dense 4 --num-sparse 3 --out " + v1 +
                         " " + tsv + " > /dev/null")
                            .c_str()),
            0);
  const CriteoOptions options = CriteoOptionsForModel(Preset("tiny"), false);
  auto from_v2 = OpenCriteoBinary(v2, options);
  auto from_v1 = OpenCriteoBinary(v1, options);
  auto from_tsv = OpenCriteoTsv({tsv}, options);
  ASSERT_TRUE(from_v2.ok()) << from_v2.status();
  ASSERT_TRUE(from_v1.ok()) << from_v1.status();
  ASSERT_TRUE(from_tsv.ok()) << from_tsv.status();
  const Batch expected = ReadWhole(from_tsv->get(), 16);
  ASSERT_EQ(expected.size, 40);
  EXPECT_EQ(expected.sparse[1].ids.size(), 120u);
  ExpectBatchesEqual(ReadWhole(from_v2->get(), 16), expected);
  ExpectBatchesEqual(ReadWhole(from_v1->get(), 16), expected);
  // --config fixes the columns: --num-dense beside it is refused.
  EXPECT_NE(std::system((tool + " --config tiny --num-dense 4 --out " + v2 +
                         " " + tsv + " 2> /dev/null")
                            .c_str()),
            0);
  EXPECT_NE(std::system((tool + " --config no-such-preset --out " + v2 + " " +
                         tsv + " 2> /dev/null")
                            .c_str()),
            0);
}

// --- Synthetic
// -----------------------------------------------------------------

TEST(SyntheticTest, SameSeedSameBatchesAndRewindReplays) {
  const ModelConfig config = Preset("tiny");
  SyntheticOptions options;
  options.sample_seed = 99;
  std::printf("sample seed %llu\n",
              static_cast<unsigned long long>(options.sample_seed));
  auto s1 = MakeSyntheticSource(config, options);
  auto s2 = MakeSyntheticSource(config, options);
  ASSERT_TRUE(s1.ok()) << s1.status();
  ASSERT_TRUE(s2.ok()) << s2.status();
  std::vector<Batch> first;
  for (int i = 0; i < 3; ++i) {
    Batch b1, b2;
    ASSERT_TRUE(*(*s1)->Next(100, &b1));
    ASSERT_TRUE(*(*s2)->Next(100, &b2));
    ExpectBatchesEqual(b1, b2);
    first.push_back(std::move(b1));
  }
  ASSERT_TRUE((*s1)->Rewind().ok());
  for (int i = 0; i < 3; ++i) {
    Batch b;
    ASSERT_TRUE(*(*s1)->Next(100, &b));
    ExpectBatchesEqual(b, first[i]);
  }
  // Batch boundaries do not change the samples.
  ASSERT_TRUE((*s1)->Rewind().ok());
  Batch big, expected;
  ASSERT_TRUE(*(*s1)->Next(300, &big));
  for (const Batch& b : first) expected.Append(b);
  ExpectBatchesEqual(big, expected);

  options.sample_seed = 100;
  auto s3 = MakeSyntheticSource(config, options);
  Batch other;
  ASSERT_TRUE(*(*s3)->Next(100, &other));
  EXPECT_NE(other.sparse[0].ids, first[0].sparse[0].ids);
}

// The generator computes draw i of a sample's stream as
// Mix64(key + i * golden) and documents it as the i-th output of Rng(key).
TEST(SyntheticTest, SampleDrawsAreTheSampleRngStream) {
  const uint64_t key = HashKey(2, 0, 12345);
  Rng rng(key);
  for (uint64_t i = 0; i < 100; ++i) {
    EXPECT_EQ(rng.NextU64(), Mix64(key + i * 0x9e3779b97f4a7c15ULL)) << i;
  }
}

TEST(SyntheticTest, IdsInRangeAndBagSizesWithinMultiHot) {
  const ModelConfig config = Preset("tiny");
  auto source = MakeSyntheticSource(config, SyntheticOptions{});
  ASSERT_TRUE(source.ok()) << source.status();
  std::vector<int64_t> rows;
  for (const auto& t : config.tables()) rows.push_back(t.rows());
  Batch batch;
  ASSERT_TRUE(*(*source)->Next(5000, &batch));
  ASSERT_TRUE(batch.Validate(config.num_dense_features(), rows).ok())
      << batch.Validate(config.num_dense_features(), rows);
  for (int t = 0; t < config.tables_size(); ++t) {
    const int k = std::max(config.tables(t).multi_hot_size(), 1);
    std::vector<int64_t> sizes_seen(k + 1, 0);
    for (int64_t s = 0; s < batch.size; ++s) {
      const int64_t n = batch.sparse[t].bag_size(s);
      ASSERT_GE(n, 1);
      ASSERT_LE(n, k);
      ++sizes_seen[n];
    }
    for (int n = 1; n <= k; ++n) {
      EXPECT_GT(sizes_seen[n], batch.size / (2 * k)) << "table " << t;
    }
  }
  for (float d : batch.dense) {
    EXPECT_GE(d, 0.0f);
    EXPECT_LT(d, 20.0f);
  }
}

// MULTI_HOT_FIXED: every bag of every table holds exactly multi_hot_size
// ids (the MLPerf DLRM-DCNv2 preset, rows shrunk), in range; each fixed
// bag starts with the ids of the same sample's uniform bag.
TEST(SyntheticTest, FixedMultiHotBagsHoldExactlyMultiHotSizeIds) {
  ModelConfig config = Preset("mlperf-dlrm-dcnv2");
  std::vector<int64_t> rows;
  for (TableConfig& t : *config.mutable_tables()) {
    t.set_rows(std::min<int64_t>(t.rows(), 5000));
    rows.push_back(t.rows());
  }
  ModelConfig uniform = config;
  for (TableConfig& t : *uniform.mutable_tables()) {
    t.set_multi_hot_distribution(MULTI_HOT_UNIFORM);
  }
  auto fixed_source = MakeSyntheticSource(config, SyntheticOptions{});
  auto uniform_source = MakeSyntheticSource(uniform, SyntheticOptions{});
  ASSERT_TRUE(fixed_source.ok()) << fixed_source.status();
  ASSERT_TRUE(uniform_source.ok()) << uniform_source.status();
  Batch batch, uniform_batch;
  ASSERT_TRUE(*(*fixed_source)->Next(300, &batch));
  ASSERT_TRUE(*(*uniform_source)->Next(300, &uniform_batch));
  ASSERT_TRUE(batch.Validate(config.num_dense_features(), rows).ok())
      << batch.Validate(config.num_dense_features(), rows);
  int64_t lookups = 0;
  for (int t = 0; t < config.tables_size(); ++t) {
    const int k = config.tables(t).multi_hot_size();
    const SparseFeature& f = batch.sparse[t];
    const SparseFeature& u = uniform_batch.sparse[t];
    ASSERT_EQ(f.num_bags(), batch.size);
    for (int64_t s = 0; s < batch.size; ++s) {
      ASSERT_EQ(f.bag_size(s), k) << "table " << t << " sample " << s;
      for (int64_t i = 0; i < u.bag_size(s); ++i) {
        ASSERT_EQ(f.ids[f.offsets[s] + i], u.ids[u.offsets[s] + i])
            << "table " << t << " sample " << s;
      }
    }
    lookups += static_cast<int64_t>(f.ids.size());
  }
  EXPECT_EQ(lookups, 214 * batch.size);
  // The dense features do not depend on the bag lengths.
  EXPECT_EQ(batch.dense, uniform_batch.dense);
}

TEST(SyntheticTest, InvalidMultiHotDistributionIsRefused) {
  ModelConfig config = Preset("tiny");
  config.mutable_tables(0)->set_multi_hot_distribution(
      static_cast<MultiHotDistribution>(5));
  auto source = MakeSyntheticSource(config, SyntheticOptions{});
  EXPECT_EQ(source.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(SyntheticTest, IdsAreZipfSkewed) {
  const ModelConfig config = Preset("kaggle");
  const Batch batch = test::SyntheticBatch(config, 50000, SyntheticOptions{});
  ASSERT_EQ(batch.size, 50000);
  const int t = 2;  // C3: 100000 rows after the cap
  ASSERT_EQ(config.tables(t).rows(), 100000);
  std::vector<int64_t> count(100000, 0);
  for (int64_t id : batch.sparse[t].ids) {
    ASSERT_GE(id, 0);
    ASSERT_LT(id, 100000);
    ++count[id];
  }
  EXPECT_EQ(std::max_element(count.begin(), count.end()) - count.begin(), 0);
  EXPECT_GT(count[0], count[1]);
  EXPECT_GT(count[1], count[10]);
  EXPECT_GT(count[0], 20 * count[100]);
  // P(id 0) for Zipf(1.05) on 100000 rows is about 0.078.
  EXPECT_NEAR(count[0] / 50000.0, 0.078, 0.01);
  int64_t head = 0;
  for (int i = 0; i < 1000; ++i) head += count[i];
  EXPECT_GT(head, 50000 / 2);  // most lookups hit the hot ids
}

TEST(SyntheticTest, NumSamplesMakesAFiniteDataset) {
  SyntheticOptions options;
  options.num_samples = 1000;
  auto source = MakeSyntheticSource(Preset("tiny"), options);
  ASSERT_TRUE(source.ok()) << source.status();
  for (int epoch = 0; epoch < 2; ++epoch) {
    std::vector<Batch> batches = ReadAll(source->get(), 300);
    ASSERT_EQ(batches.size(), 4u);
    EXPECT_EQ(batches[3].size, 100);
    Batch after;
    EXPECT_FALSE(*(*source)->Next(300, &after));
    EXPECT_EQ(after.size, 0);
    ASSERT_TRUE((*source)->Rewind().ok());
  }
}

TEST(SyntheticTest, TeacherAucAndCtrOnKaggle) {
  const ModelConfig config = Preset("kaggle");
  SyntheticOptions options;
  options.sample_seed = 7;
  std::printf("sample seed %llu, teacher seed %llu\n",
              static_cast<unsigned long long>(options.sample_seed),
              static_cast<unsigned long long>(options.teacher_seed));
  auto source = MakeSyntheticSource(config, options);
  ASSERT_TRUE(source.ok()) << source.status();
  Batch batch;
  ASSERT_TRUE(*(*source)->Next(20000, &batch));
  const Teacher teacher(config, options.teacher_seed);
  std::vector<float> p(batch.size);
  teacher.Probabilities(batch, p.data());
  const double auc = Auc(p, batch.labels);
  const double ctr =
      std::accumulate(batch.labels.begin(), batch.labels.end(), 0.0) /
      batch.size;
  const double mean_p = std::accumulate(p.begin(), p.end(), 0.0) / batch.size;
  std::printf("teacher AUC %.4f, CTR %.4f, mean p %.4f\n", auc, ctr, mean_p);
  EXPECT_GE(auc, 0.78);
  EXPECT_LE(auc, 0.85);
  EXPECT_GT(ctr, 0.22);
  EXPECT_LT(ctr, 0.28);

  // A different teacher is a different ground truth.
  const Teacher other(config, options.teacher_seed + 1);
  std::vector<float> q(batch.size);
  other.Probabilities(batch, q.data());
  EXPECT_NE(p, q);
  EXPECT_LT(Auc(q, batch.labels), auc - 0.1);
}

TEST(SyntheticTest, TeacherAucOnTinyIsSensible) {
  const ModelConfig config = Preset("tiny");
  const Batch batch = test::SyntheticBatch(config, 20000, SyntheticOptions{});
  ASSERT_EQ(batch.size, 20000);
  std::vector<float> p(batch.size);
  Teacher(config, SyntheticOptions{}.teacher_seed)
      .Probabilities(batch, p.data());
  const double auc = Auc(p, batch.labels);
  const double ctr =
      std::accumulate(batch.labels.begin(), batch.labels.end(), 0.0) /
      batch.size;
  std::printf("tiny: teacher AUC %.4f, CTR %.4f\n", auc, ctr);
  EXPECT_GT(auc, 0.7);
  EXPECT_GT(ctr, 0.2);
  EXPECT_LT(ctr, 0.3);
}

TEST(SyntheticTest, GenerationSpeed) {
  const ModelConfig config = Preset("kaggle");
  auto source = MakeSyntheticSource(config, SyntheticOptions{});
  ASSERT_TRUE(source.ok()) << source.status();
  Batch batch;
  ASSERT_TRUE(*(*source)->Next(4096, &batch));  // warm up
  const int64_t total = 400000;
  const auto start = std::chrono::steady_clock::now();
  for (int64_t done = 0; done < total; done += 4096) {
    ASSERT_TRUE(*(*source)->Next(4096, &batch));
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  std::printf("synthetic kaggle: %.0f samples/s (single thread)\n",
              total / seconds);
}

TEST(SyntheticTest, RejectsBadOptionsAndConfigs) {
  SyntheticOptions options;
  options.zipf_alpha = -1;
  ExpectInvalid(options.Validate(), "zipf_alpha = -1");
  options.zipf_alpha = std::nan("");
  ExpectInvalid(options.Validate(), "zipf_alpha");
  options = SyntheticOptions{};
  options.num_samples = -5;
  ExpectInvalid(options.Validate(), "num_samples = -5");

  ModelConfig config = Preset("tiny");
  config.mutable_tables(1)->set_rows(0);
  ExpectInvalid(MakeSyntheticSource(config, SyntheticOptions{}).status(),
                "tables[1] (t1).rows = 0");
  ModelConfig no_tables = Preset("tiny");
  no_tables.clear_tables();
  ExpectInvalid(MakeSyntheticSource(no_tables, SyntheticOptions{}).status(),
                "no tables");
}

TEST(SyntheticTest, UniformWhenAlphaIsZero) {
  SyntheticOptions options;
  options.zipf_alpha = 0;
  auto source = MakeSyntheticSource(Preset("tiny"), options);
  ASSERT_TRUE(source.ok()) << source.status();
  Batch batch;
  ASSERT_TRUE(*(*source)->Next(20000, &batch));
  std::vector<int64_t> count(50, 0);  // table t0 has 50 rows
  for (int64_t id : batch.sparse[0].ids) ++count[id];
  for (int64_t c : count) EXPECT_NEAR(c, 400, 100);
}

TEST(WireTest, RoundTripKeepsTheBatch) {
  auto config = LoadModelConfig("tiny");
  ASSERT_TRUE(config.ok()) << config.status();
  SyntheticOptions o;
  auto src = MakeSyntheticSource(*config, o);
  ASSERT_TRUE(src.ok()) << src.status();
  Batch b;
  ASSERT_TRUE(*(*src)->Next(33, &b));
  BatchShape shape;
  shape.num_dense = 4;
  shape.id_limits = {50, 20, 100};
  dlrm::Batch wire;
  BatchToProto(b, /*include_labels=*/true, &wire);
  Batch back;
  ASSERT_TRUE(
      BatchFromProto(wire, shape, Labels::kRequired, 0, "batch", &back).ok());
  EXPECT_EQ(back.size, b.size);
  EXPECT_EQ(back.dense, b.dense);
  EXPECT_EQ(back.labels, b.labels);
  for (int t = 0; t < 3; ++t) {
    EXPECT_EQ(back.sparse[t].offsets, b.sparse[t].offsets);
    EXPECT_EQ(back.sparse[t].ids, b.sparse[t].ids);
  }
  // Predict-style conversion: no labels on the wire, zeros in the batch.
  BatchToProto(b, /*include_labels=*/false, &wire);
  EXPECT_EQ(wire.labels_size(), 0);
  ASSERT_TRUE(
      BatchFromProto(wire, shape, Labels::kIgnored, 0, "batch", &back).ok());
  EXPECT_EQ(back.labels, std::vector<float>(33, 0.0f));
}

TEST(WireTest, RejectsInconsistentMessagesNamingFieldAndSample) {
  BatchShape shape;
  shape.num_dense = 1;
  shape.id_limits = {10};
  dlrm::Batch good;
  good.set_size(2);
  good.add_dense(0.5f);
  good.add_dense(1.5f);
  good.add_labels(1);
  good.add_labels(0);
  good.add_sparse()->add_lengths(1);
  good.mutable_sparse(0)->add_lengths(2);
  for (int64_t id : {3, 4, 9}) good.mutable_sparse(0)->add_ids(id);
  Batch out;
  ASSERT_TRUE(
      BatchFromProto(good, shape, Labels::kRequired, 0, "batch", &out).ok());
  auto expect = [&](const dlrm::Batch& m, int64_t max,
                    const std::string& text) {
    const absl::Status s =
        BatchFromProto(m, shape, Labels::kRequired, max, "batch", &out);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_HAS_SUBSTR(std::string(s.message()), text)
        << s.message() << "\nexpected: " << text;
  };
  dlrm::Batch m = good;
  m.set_size(0);
  expect(m, 0, "batch.size = 0");
  expect(good, 1, "exceeds the limit of 1");
  m = good;
  m.add_dense(1);
  expect(m, 0, "batch.dense has 3 values");
  m = good;
  m.set_dense(1, std::nanf(""));
  expect(m, 0, "batch.dense[1] (sample 1, feature 0): value is NaN");
  m = good;
  m.mutable_sparse(0)->set_lengths(1, -1);
  expect(m, 0, "batch.sparse[0].lengths[1] (sample 1)");
  m = good;
  m.mutable_sparse(0)->add_ids(3);
  expect(m, 0, "batch.sparse[0].lengths sum to 3");
  m = good;
  m.mutable_sparse(0)->set_ids(2, 10);
  expect(m, 0, "batch.sparse[0].ids[2] (sample 1): id 10 out of range [0, 10)");
  m = good;
  m.set_labels(1, 0.5f);
  expect(m, 0, "batch.labels[1]");
  m = good;
  m.add_sparse();
  expect(m, 0, "batch.sparse has 2 features");
}

// Regressions found by tests/fuzz/wire_batch_fuzz (docs/fuzzing.md): a
// size near 2^62 overflowed size x num_dense (signed overflow, UB) before
// any check rejected it.
TEST(WireTest, HugeSizeIsRejectedWithoutOverflow) {
  BatchShape shape;
  shape.num_dense = 2;
  shape.id_limits = {10};
  dlrm::Batch m;
  m.set_size((int64_t{1} << 62) + 1);
  m.add_dense(1);
  m.add_dense(2);
  m.add_sparse()->add_lengths(1);
  m.mutable_sparse(0)->add_ids(0);
  Batch out;
  for (Labels labels : {Labels::kRequired, Labels::kIgnored}) {
    const absl::Status s = BatchFromProto(m, shape, labels, 0, "batch", &out);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_HAS_SUBSTR(std::string(s.message()),
                      "batch.size = 4611686018427387905 "
                      "exceeds the most samples")
        << s;
  }
}

// The same overflow in Batch::Validate, the model's own gate.
TEST(BatchTest, HugeSizeIsRejectedWithoutOverflow) {
  Batch b;
  b.Reset(2, 1);
  b.size = (int64_t{1} << 62) + 1;
  b.dense = {1, 2};
  b.labels = {1};
  const std::vector<int64_t> rows = {10};
  const absl::Status s = b.Validate(2, rows);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_HAS_SUBSTR(std::string(s.message()), "labels must have size") << s;
}

// Found by tests/fuzz/criteo_binary_fuzz: the binary reader passed any
// label and dense value on, so a corrupt file reached the model (which
// rejected the batch without saying which file or record).
TEST(CriteoBinaryTest, BadLabelOrDenseValueNamesFileAndRecord) {
  const std::string tsv = TempPath("three.txt");
  WriteFile(tsv, Line("1", {"1"}, {"a"}) + "\n" + Line("0", {"2"}, {"b"}) +
                     "\n" + Line("1", {"3"}, {"c"}) + "\n");
  const std::string bin = TempPath("three.bin");
  ASSERT_TRUE(ConvertCriteoTsvToBinary({tsv}, bin).ok());
  // Record bytes: label, 13 dense, 26 categorical (4 bytes each).
  const std::streamoff record = 4 * (1 + 13 + 26);
  const float half = 0.5f, nan = std::nanf("");
  {
    std::fstream f(bin, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(32 + 1 * record);  // record 1's label
    f.write(reinterpret_cast<const char*>(&half), sizeof(half));
    f.seekp(32 + 2 * record + 4 * 3);  // record 2's dense 2
    f.write(reinterpret_cast<const char*>(&nan), sizeof(nan));
  }
  CriteoOptions options;
  options.table_rows = CriteoRows(10);
  auto source = OpenCriteoBinary(bin, options);
  ASSERT_TRUE(source.ok()) << source.status();
  Batch batch;
  auto first = (*source)->Next(1, &batch);
  ASSERT_TRUE(first.ok() && *first) << first.status();
  EXPECT_TRUE(batch.Validate(13, options.table_rows).ok());
  ExpectInvalid((*source)->Next(1, &batch).status(),
                bin + ": record 1: label 0.5 must be 0 or 1");
  ExpectInvalid((*source)->Next(4, &batch).status(),
                bin + ": record 2: dense 2 is NaN");
  auto end = (*source)->Next(4, &batch);
  ASSERT_TRUE(end.ok());
  EXPECT_FALSE(*end);
}

// Found by tests/fuzz/criteo_binary_fuzz: with no dense features the
// reader (and the converter) passed a null pointer to memcpy (UB even for
// 0 bytes). Such files must convert and read back.
TEST(CriteoBinaryTest, NoDenseFeaturesRoundTrip) {
  const std::string tsv = TempPath("no_dense.txt");
  WriteFile(tsv, "1\ta\tb\tc\n0\t\t1f\t2\n");
  const std::string bin = TempPath("no_dense.bin");
  absl::StatusOr<int64_t> count =
      ConvertCriteoTsvToBinary({tsv}, bin, /*num_dense=*/0, /*num_sparse=*/3);
  ASSERT_TRUE(count.ok()) << count.status();
  EXPECT_EQ(*count, 2);
  CriteoOptions options;
  options.num_dense = 0;
  options.table_rows = {100, 100, 100};
  auto source = OpenCriteoBinary(bin, options);
  ASSERT_TRUE(source.ok()) << source.status();
  Batch batch;
  auto more = (*source)->Next(10, &batch);
  ASSERT_TRUE(more.ok() && *more) << more.status();
  EXPECT_EQ(batch.size, 2);
  EXPECT_TRUE(batch.dense.empty());
  EXPECT_EQ(batch.labels, (std::vector<float>{1, 0}));
  EXPECT_EQ(batch.sparse[1].ids, (std::vector<int64_t>{0xb, 0x1f}));
  EXPECT_TRUE(batch.Validate(0, options.table_rows).ok());
}

// --- Skip and RangeReader -------------------------------------------------

// One source of each kind over the same number of samples, and how to open
// it afresh.
struct SourceKind {
  std::string name;
  std::function<std::unique_ptr<BatchSource>()> open;
  int64_t samples;  // in an epoch (of an endless stream: the part tested)
  bool endless = false;
};

std::vector<SourceKind> EverySourceKind(Rng* rng) {
  // TSV over two files with blank and CRLF lines, the binary file
  // converted from them, and synthetic data finite and endless.
  const std::string a = TempPath("range_a.txt");
  const std::string b = TempPath("range_b.txt");
  std::string text_a = RandomTsv(rng, 150);
  text_a.insert(text_a.find('\n') + 1, "\n\r\n");
  WriteFile(a, "\n" + text_a);
  WriteFile(b, RandomTsv(rng, 91) + "\n");
  const std::string bin = TempPath("range.bin");
  EXPECT_EQ(*ConvertCriteoTsvToBinary({a, b}, bin), 241);
  CriteoOptions criteo;
  criteo.table_rows = CriteoRows(1000);
  // The same lines with the DCNv2 multi-hot sizes: bags derived from the
  // TSV and the version-1 file, and stored in a version-2 file.
  CriteoOptions multi_hot = criteo;
  multi_hot.multi_hot_sizes = kDcnV2Sizes;
  const std::string bin2 = TempPath("range_v2.bin");
  EXPECT_EQ(*ConvertCriteoTsvToMultiHotBinary({a, b}, bin2, multi_hot), 241);
  const ModelConfig config = Preset("tiny");
  auto synthetic = [config](int64_t n) {
    SyntheticOptions o;
    o.sample_seed = 5;
    o.num_samples = n;
    return std::move(*MakeSyntheticSource(config, o));
  };
  return {
      {"tsv",
       [=] {
         return std::move(*OpenCriteoTsv({a, b}, criteo));
       },
       241},
      {"binary", [=] { return std::move(*OpenCriteoBinary(bin, criteo)); },
       241},
      {"multi-hot tsv",
       [=] {
         return std::move(*OpenCriteoTsv({a, b}, multi_hot));
       },
       241},
      {"multi-hot binary v1",
       [=] { return std::move(*OpenCriteoBinary(bin, multi_hot)); }, 241},
      {"multi-hot binary v2",
       [=] { return std::move(*OpenCriteoBinary(bin2, multi_hot)); }, 241},
      {"synthetic", [=] { return synthetic(300); }, 300},
      {"endless synthetic", [=] { return synthetic(0); }, 400, true},
  };
}

// Skip(k) then Next(m), on random k and m, gives the samples that slicing
// the stream read whole gives.
TEST(SkipTest, SkippingEqualsSlicingTheWholeStream) {
  Rng rng = test::SeededRng(2718);
  for (const SourceKind& kind : EverySourceKind(&rng)) {
    SCOPED_TRACE(kind.name);
    std::unique_ptr<BatchSource> source = kind.open();
    Batch whole, batch;
    ASSERT_TRUE(*source->Next(kind.samples, &whole));
    ASSERT_EQ(whole.size, kind.samples);
    for (int epoch = 0; epoch < 2; ++epoch) {
      ASSERT_TRUE(source->Rewind().ok());
      int64_t at = 0;
      while (at < kind.samples) {
        const int64_t k = static_cast<int64_t>(rng.Below(40));
        const int64_t m = 1 + static_cast<int64_t>(rng.Below(30));
        absl::StatusOr<int64_t> skipped = source->Skip(k);
        ASSERT_TRUE(skipped.ok()) << skipped.status();
        const int64_t expect_skip =
            kind.endless ? k : std::min(k, kind.samples - at);
        ASSERT_EQ(*skipped, expect_skip) << "at " << at;
        at += *skipped;
        if (at >= kind.samples) break;
        const int64_t end = std::min(at + m, kind.samples);
        ASSERT_TRUE(*source->Next(end - at, &batch));
        Batch expected;
        whole.Slice(at, end, &expected);
        ExpectBatchesEqual(batch, expected);
        at = end;
      }
    }
    if (!kind.endless) {
      // At the end nothing is left to skip, and Next agrees.
      EXPECT_EQ(*source->Skip(5), 0);
      EXPECT_FALSE(*source->Next(5, &batch));
    }
    EXPECT_EQ(source->Skip(-1).status().code(),
              absl::StatusCode::kInvalidArgument);
  }
}

// Random ranges in random order (backwards too) through a RangeReader equal
// the slices of the stream read whole; a range past the end is OutOfRange.
TEST(RangeReaderTest, RangesInAnyOrderEqualSlicesOfTheWholeStream) {
  Rng rng = test::SeededRng(31415);
  for (const SourceKind& kind : EverySourceKind(&rng)) {
    SCOPED_TRACE(kind.name);
    Batch whole, batch, expected;
    ASSERT_TRUE(*kind.open()->Next(kind.samples, &whole));
    const int num_sparse = static_cast<int>(whole.sparse.size());
    RangeReader reader(kind.open(), whole.num_dense, num_sparse, kind.name);
    for (int i = 0; i < 200; ++i) {
      const int64_t begin = static_cast<int64_t>(rng.Below(kind.samples + 1));
      const int64_t count =
          static_cast<int64_t>(rng.Below(kind.samples - begin + 1));
      ASSERT_TRUE(reader.Read(begin, count, &batch).ok())
          << "[" << begin << ", +" << count << ")";
      whole.Slice(begin, begin + count, &expected);
      ExpectBatchesEqual(batch, expected);
      EXPECT_EQ(batch.sparse.size(), whole.sparse.size());
    }
    if (!kind.endless) {
      const absl::Status past = reader.Read(kind.samples - 3, 4, &batch);
      EXPECT_EQ(past.code(), absl::StatusCode::kOutOfRange) << past;
      ExpectMentions(past, absl::StrCat(kind.name, ": the data ends at sample ",
                                        kind.samples));
      // The reader goes on after the error.
      ASSERT_TRUE(reader.Read(7, 5, &batch).ok());
      whole.Slice(7, 12, &expected);
      ExpectBatchesEqual(batch, expected);
    }
    EXPECT_EQ(reader.Read(-1, 2, &batch).code(),
              absl::StatusCode::kInvalidArgument);
  }
}

// A malformed line is reported by the read whose range holds it, naming
// file and line; skipping over it is no error, and reads go on after it.
TEST(RangeReaderTest, MalformedLineFailsOnlyTheRangeThatHoldsIt) {
  const std::string a = TempPath("range_bad.txt");
  std::string text;
  for (int i = 0; i < 10; ++i) {
    text += Line("1", {std::to_string(i)}, {i == 6 ? "xyz" : "a"}) + "\n";
  }
  WriteFile(a, text);
  CriteoOptions options;
  options.table_rows = CriteoRows(100);
  RangeReader reader(std::move(*OpenCriteoTsv({a}, options)), 13, 26, a);
  Batch batch;
  ASSERT_TRUE(reader.Read(0, 3, &batch).ok());
  ASSERT_TRUE(reader.Read(7, 3, &batch).ok());
  EXPECT_FLOAT_EQ(batch.dense[0], std::log(8.0f));
  ExpectInvalid(reader.Read(4, 3, &batch), a + ":7: column 14");
  ASSERT_TRUE(reader.Read(3, 2, &batch).ok());
  EXPECT_FLOAT_EQ(batch.dense[13], std::log(5.0f));
}

}  // namespace
}  // namespace dlrm::data
