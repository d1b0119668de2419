// Tests for dynamic tables (embedding/dynamic_ids.h, dynamic_store.h): the
// id map against a plain reference on random id streams (rows, victims,
// refusals under LRU, LFU, TTL and each admission kind), and the store over
// the host and RocksDB tiers: bitwise like a static table fed the map's
// rows, admitted rows reset, the kept row zero or trained, predictions
// never admit, a failed Prepare changes nothing.
#include "embedding/dynamic_store.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/random.h"
#include "embedding/dynamic_ids.h"
#include "embedding/embedding_store.h"
#include "embedding/row_database.h"
#include "embedding/sharding_memory.h"
#include "optim/optimizer.h"
#include "tests/support/files.h"
#include "tests/support/table_spec.h"

namespace dlrm::embedding {
namespace {

constexpr uint64_t kSeed = 20261202;

// The map's policy the slow way: an unordered_map of id -> row and, per
// bucket, the list of its rows' entries, searched and sorted in full.
class ReferenceMap {
 public:
  struct Entry {
    int64_t id = -1;
    int64_t last = 0;
    int64_t sightings = 0;
  };

  // `bucket_of` is the map's bucket function (the hash, not the policy).
  ReferenceMap(const DynamicIdOptions& o, const DynamicIdMap& bucket_of)
      : o_(o), buckets_of_(bucket_of), rows_(o.rows - 1) {}

  // Per position: the row, or -1. Applies the batch.
  std::vector<int64_t> Batch(const std::vector<int64_t>& ids, int64_t step) {
    std::vector<int64_t> uniques;
    std::unordered_map<int64_t, int64_t> decided;
    for (const int64_t id : ids) {
      if (decided.emplace(id, -1).second) uniques.push_back(id);
    }
    std::vector<bool> claimed(rows_.size(), false);
    std::vector<int64_t> new_ids;
    for (const int64_t id : uniques) {
      auto it = row_of_.find(id);
      if (it != row_of_.end() && !Expired(it->second, step)) {
        decided[id] = it->second;
        claimed[it->second] = true;
      } else {
        new_ids.push_back(id);
      }
    }
    std::vector<std::pair<int64_t, int64_t>> admitted;  // id, row
    for (const int64_t id : new_ids) {
      if (!Admits(id, step)) continue;
      const int64_t b = buckets_of_.Bucket(id);
      const int64_t begin = buckets_of_.BucketBegin(b);
      const int64_t end = begin + buckets_of_.BucketSize(b);
      std::vector<int64_t> free_rows, taken;
      if (auto own = row_of_.find(id);
          own != row_of_.end() && !claimed[own->second]) {
        // Expired, and its row is still free: it comes back there.
        claimed[own->second] = true;
        decided[id] = own->second;
        admitted.push_back({id, own->second});
        continue;
      }
      for (int64_t r = begin; r < end; ++r) {
        if (claimed[r]) continue;
        (rows_[r].id < 0 || Expired(r, step) ? free_rows : taken).push_back(r);
      }
      int64_t chosen = -1;
      if (!free_rows.empty()) {
        chosen = *std::min_element(free_rows.begin(), free_rows.end());
      } else if (!taken.empty()) {
        std::sort(taken.begin(), taken.end(), [&](int64_t a, int64_t c) {
          const Entry &x = rows_[a], &y = rows_[c];
          if (o_.eviction == EvictionPolicy::kLfu &&
              x.sightings != y.sightings) {
            return x.sightings < y.sightings;
          }
          if (x.last != y.last) return x.last < y.last;
          return a < c;
        });
        chosen = taken.front();
      }
      if (chosen < 0) {
        ++refused;
        continue;
      }
      claimed[chosen] = true;
      decided[id] = chosen;
      admitted.push_back({id, chosen});
    }
    // Commit.
    for (const int64_t id : uniques) {
      auto it = row_of_.find(id);
      if (it != row_of_.end() && decided[id] == it->second &&
          !Expired(it->second, step)) {
        rows_[it->second].last = step;
        ++rows_[it->second].sightings;
      }
    }
    for (const auto& [id, row] : admitted) {
      if (rows_[row].id >= 0) {
        ++evicted;
        row_of_.erase(rows_[row].id);
      }
      // No id is in two rows: the map never leaves one behind.
      EXPECT_EQ(row_of_.count(id), 0u) << id;
      rows_[row] = {id, step, 1};
      row_of_[id] = row;
    }
    admitted_total += static_cast<int64_t>(admitted.size());
    for (const int64_t id : new_ids) ++count_[id];
    std::vector<int64_t> out;
    for (const int64_t id : ids) out.push_back(decided[id]);
    return out;
  }

  std::vector<int64_t> Keys() const {
    std::vector<int64_t> k;
    for (const Entry& e : rows_) k.push_back(e.id);
    return k;
  }

  int64_t refused = 0, evicted = 0, admitted_total = 0;

 private:
  bool Expired(int64_t row, int64_t step) const {
    return o_.ttl_steps > 0 && step - rows_[row].last > o_.ttl_steps;
  }
  bool Admits(int64_t id, int64_t step) const {
    switch (o_.admission) {
      case Admission::ADMIT_AFTER_SIGHTINGS: {
        // The map's count-min estimate (called before its Commit): never
        // below the exact count, sometimes above (shared cells).
        auto it = count_.find(id);
        const int64_t exact = it == count_.end() ? 0 : it->second;
        const int64_t estimate = buckets_of_.SketchCount(id);
        EXPECT_GE(estimate, exact) << id;
        return estimate + 1 >= o_.min_sightings;
      }
      case Admission::ADMIT_WITH_PROBABILITY:
        return AdmittedWithProbability(o_.seed, step, id, o_.probability);
      default:
        return true;
    }
  }

  DynamicIdOptions o_;
  const DynamicIdMap& buckets_of_;
  std::vector<Entry> rows_;
  std::unordered_map<int64_t, int64_t> row_of_;
  // Exact counts of the batches each id was new in.
  std::unordered_map<int64_t, int64_t> count_;
};

// Ids for batch `b`: Zipf-like over a vocabulary of `vocab` raw ids (large
// values, so they are not rows), drifting by `drift` ids per batch.
std::vector<int64_t> StreamBatch(Rng& rng, int64_t b, int64_t vocab,
                                 int64_t drift, int n) {
  std::vector<int64_t> ids;
  for (int i = 0; i < n; ++i) {
    // Squaring a uniform skews towards small ranks.
    const double u = static_cast<double>(rng.Below(1 << 20)) / (1 << 20);
    const int64_t rank = static_cast<int64_t>(u * u * vocab);
    ids.push_back(int64_t{1} << 40 | (rank + b * drift) * 7919);
  }
  return ids;
}

struct MapCase {
  std::string name;
  int64_t rows;
  Admission::Kind admission;
  int min_sightings;
  double probability;
  EvictionPolicy eviction;
  int64_t ttl_steps;
  int batch;
};

class DynamicIdMapTest : public ::testing::TestWithParam<MapCase> {};

TEST_P(DynamicIdMapTest, MatchesTheReferenceOnARandomStream) {
  const MapCase& c = GetParam();
  DynamicIdOptions o;
  o.rows = c.rows;
  o.admission = c.admission;
  o.min_sightings = c.min_sightings;
  o.probability = c.probability;
  o.seed = kSeed;
  o.eviction = c.eviction;
  o.ttl_steps = c.ttl_steps;
  ASSERT_TRUE(o.Validate().ok()) << o.Validate();
  DynamicIdMap map(o);
  DynamicIdMap again(o);
  ReferenceMap ref(o, map);
  SCOPED_TRACE(::testing::Message() << "seed " << kSeed);
  Rng rng(kSeed);
  DynamicIdMap::Plan plan, plan_again;
  for (int64_t b = 0; b < 200; ++b) {
    const int64_t step = b + 1;
    const std::vector<int64_t> ids = StreamBatch(rng, b, 400, 2, c.batch);
    ASSERT_TRUE(map.MakePlan(ids, step, &plan).ok());
    const std::vector<int64_t> want = ref.Batch(ids, step);
    ASSERT_EQ(plan.rows, want) << "batch " << b;
    map.Commit(plan);
    ASSERT_EQ(map.keys(), ref.Keys()) << "batch " << b;
    ASSERT_EQ(map.counters().refused, ref.refused) << "batch " << b;
    ASSERT_EQ(map.counters().evicted, ref.evicted) << "batch " << b;
    ASSERT_EQ(map.counters().admitted, ref.admitted_total) << "batch " << b;
    // Deterministic: a second map given the same batches agrees.
    ASSERT_TRUE(again.MakePlan(ids, step, &plan_again).ok());
    again.Commit(plan_again);
    ASSERT_EQ(plan_again.rows, plan.rows);
    // A lookup finds the rows the batch got.
    for (size_t p = 0; p < ids.size(); ++p) {
      ASSERT_EQ(map.Lookup(ids[p]), plan.rows[p]);
    }
  }
  EXPECT_EQ(again.keys(), map.keys());
  EXPECT_EQ(again.last_steps(), map.last_steps());
  EXPECT_EQ(again.sightings(), map.sightings());
  EXPECT_EQ(again.sketch(), map.sketch());
  // The stream holds more ids than rows: some were evicted or refused
  // (every case exercises its policy).
  EXPECT_GT(map.counters().evicted + map.counters().refused, 0);
  EXPECT_GT(map.counters().admitted, 0);
}

INSTANTIATE_TEST_SUITE_P(
    Policies, DynamicIdMapTest,
    ::testing::Values(
        MapCase{"Lru", 101, Admission::ADMIT_ALWAYS, 2, 1.0,
                EvictionPolicy::kLru, 0, 48},
        MapCase{"Lfu", 101, Admission::ADMIT_ALWAYS, 2, 1.0,
                EvictionPolicy::kLfu, 0, 48},
        MapCase{"Ttl", 101, Admission::ADMIT_ALWAYS, 2, 1.0,
                EvictionPolicy::kLru, 3, 48},
        MapCase{"LfuTtl", 101, Admission::ADMIT_ALWAYS, 2, 1.0,
                EvictionPolicy::kLfu, 5, 48},
        MapCase{"AfterSightings", 101, Admission::ADMIT_AFTER_SIGHTINGS, 3, 1.0,
                EvictionPolicy::kLru, 0, 48},
        MapCase{"WithProbability", 101, Admission::ADMIT_WITH_PROBABILITY, 2,
                0.3, EvictionPolicy::kLfu, 0, 48},
        // One bucket of 16 rows, batches of more distinct ids: refusals.
        MapCase{"Refusals", 17, Admission::ADMIT_ALWAYS, 2, 1.0,
                EvictionPolicy::kLru, 0, 40},
        // A short last bucket (2 rows).
        MapCase{"ShortBucket", 35, Admission::ADMIT_ALWAYS, 2, 1.0,
                EvictionPolicy::kLru, 0, 24}),
    [](const ::testing::TestParamInfo<MapCase>& info) {
      return info.param.name;
    });

DynamicIdOptions Options(int64_t rows) {
  DynamicIdOptions o;
  o.rows = rows;
  o.seed = kSeed;
  return o;
}

TEST(DynamicIdMap, BucketsCoverTheRowsButTheKeptOne) {
  DynamicIdMap map(Options(35));
  EXPECT_EQ(map.kept_row(), 34);
  ASSERT_EQ(map.num_buckets(), 3);
  EXPECT_EQ(map.BucketSize(0), 16);
  EXPECT_EQ(map.BucketSize(2), 2);
  // The bucket is a function of the id alone (not of a seed).
  DynamicIdOptions other = Options(35);
  other.seed = kSeed + 1;
  DynamicIdMap map2(other);
  for (int64_t id : {0LL, 1LL, 123456789LL, (1LL << 62) + 5}) {
    EXPECT_EQ(map.Bucket(id), map2.Bucket(id));
  }
}

TEST(DynamicIdMap, HoldsTheBytesThePlannersCount) {
  DynamicIdOptions o = Options(5000);
  EXPECT_EQ(DynamicIdMap(o).MemoryBytes(), DynamicIdMap::BytesFor(o));
  EXPECT_EQ(DynamicIdMap::BytesFor(o), 4999 * 28);
  o.admission = Admission::ADMIT_AFTER_SIGHTINGS;
  EXPECT_EQ(DynamicIdMap(o).MemoryBytes(), DynamicIdMap::BytesFor(o));
  EXPECT_EQ(DynamicIdMap::BytesFor(o), 4999 * 28 + 4 * 8192 * 4);
  TableConfig t;
  t.set_rows(5000);
  EXPECT_EQ(DynamicMapBytes(t), 0);
  t.set_dynamic(true);
  EXPECT_EQ(DynamicMapBytes(t), 4999 * 28);
}

TEST(DynamicIdMap, IdsOfTheBatchAreNeverVictims) {
  // One bucket of 16 rows: 16 ids fill it; a batch of those 16 and one new
  // id refuses the new one; a later batch without them evicts the LRU.
  DynamicIdMap map(Options(17));
  std::vector<int64_t> first;
  for (int64_t i = 0; i < 16; ++i) first.push_back(1000 + i);
  DynamicIdMap::Plan plan;
  ASSERT_TRUE(map.MakePlan(first, 1, &plan).ok());
  map.Commit(plan);
  EXPECT_EQ(map.occupied(), 16);
  std::vector<int64_t> second = first;
  second.push_back(5000);
  ASSERT_TRUE(map.MakePlan(second, 2, &plan).ok());
  EXPECT_EQ(plan.rows.back(), -1);
  EXPECT_EQ(plan.refused, 1);
  map.Commit(plan);
  // 1000..1014 seen at step 3; 1015 last seen at step 2 is the LRU.
  std::vector<int64_t> third(first.begin(), first.end() - 1);
  ASSERT_TRUE(map.MakePlan(third, 3, &plan).ok());
  map.Commit(plan);
  const int64_t row_of_1015 = map.Lookup(1015);
  ASSERT_TRUE(map.MakePlan(std::vector<int64_t>{5000}, 4, &plan).ok());
  ASSERT_EQ(plan.admitted.size(), 1u);
  EXPECT_EQ(plan.admitted[0].victim, 1015);
  EXPECT_EQ(plan.rows[0], row_of_1015);
  map.Commit(plan);
  EXPECT_EQ(map.Lookup(1015), -1);
  EXPECT_EQ(map.counters().evicted, 1);
  EXPECT_EQ(map.counters().refused, 1);
}

TEST(DynamicIdMap, ExpiredIdsMissAndFreeTheirRows) {
  DynamicIdOptions o = Options(17);
  o.ttl_steps = 2;
  DynamicIdMap map(o);
  DynamicIdMap::Plan plan;
  ASSERT_TRUE(map.MakePlan(std::vector<int64_t>{7, 8}, 1, &plan).ok());
  map.Commit(plan);
  ASSERT_TRUE(map.MakePlan(std::vector<int64_t>{8}, 3, &plan).ok());
  map.Commit(plan);
  // At step 3, 7 was last seen 2 steps ago: still there.
  EXPECT_GE(map.Lookup(7), 0);
  ASSERT_TRUE(map.MakePlan(std::vector<int64_t>{8}, 4, &plan).ok());
  map.Commit(plan);
  // 3 steps: expired, a lookup misses.
  EXPECT_EQ(map.Lookup(7), -1);
  EXPECT_GE(map.Lookup(8), 0);
}

TEST(DynamicIdMap, RefusesNegativeIdsAndChangesNothing) {
  DynamicIdMap map(Options(17));
  DynamicIdMap::Plan plan;
  const absl::Status s = map.MakePlan(std::vector<int64_t>{3, -2}, 1, &plan);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("-2"), std::string::npos) << s;
  EXPECT_EQ(map.occupied(), 0);
  EXPECT_EQ(map.Lookup(3), -1);
}

TEST(DynamicIdMap, AdmitsWithTheGivenProbability) {
  int admitted = 0;
  constexpr int kDraws = 20000;
  for (int i = 0; i < kDraws; ++i) {
    admitted += AdmittedWithProbability(kSeed, i % 7, 1000003LL * i, 0.25);
  }
  EXPECT_NEAR(static_cast<double>(admitted) / kDraws, 0.25, 0.02);
  for (int i = 0; i < 100; ++i) {
    EXPECT_TRUE(AdmittedWithProbability(kSeed, i, i, 1.0));
  }
}

TEST(DynamicIdMap, RestoresItsStateAndRefusesAForeignOne) {
  DynamicIdOptions o = Options(101);
  o.admission = Admission::ADMIT_AFTER_SIGHTINGS;
  DynamicIdMap map(o);
  Rng rng(kSeed);
  DynamicIdMap::Plan plan;
  for (int64_t b = 0; b < 20; ++b) {
    ASSERT_TRUE(
        map.MakePlan(StreamBatch(rng, b, 300, 1, 32), b + 1, &plan).ok());
    map.Commit(plan);
  }
  DynamicIdMap copy(o);
  ASSERT_TRUE(copy.Restore(map.keys(), map.last_steps(), map.sightings(),
                           map.sketch(), map.step())
                  .ok());
  EXPECT_EQ(copy.occupied(), map.occupied());
  // Both go on the same way.
  DynamicIdMap::Plan a, b;
  const std::vector<int64_t> next = StreamBatch(rng, 20, 300, 1, 32);
  ASSERT_TRUE(map.MakePlan(next, 21, &a).ok());
  ASSERT_TRUE(copy.MakePlan(next, 21, &b).ok());
  EXPECT_EQ(a.rows, b.rows);

  std::vector<int64_t> keys = map.keys();
  const auto it =
      std::find_if(keys.begin(), keys.end(), [](int64_t k) { return k >= 0; });
  ASSERT_NE(it, keys.end());
  // Moved to a row of another bucket.
  const int64_t id = *it;
  const int64_t elsewhere =
      (map.BucketBegin((map.Bucket(id) + 1) % map.num_buckets()));
  std::swap(keys[it - keys.begin()], keys[elsewhere]);
  DynamicIdMap bad(o);
  const absl::Status s = bad.Restore(keys, map.last_steps(), map.sightings(),
                                     map.sketch(), map.step());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(bad.occupied(), 0);
  EXPECT_EQ(bad.Restore({1, 2}, {0, 0}, {0, 0}, {}, 0).code(),
            absl::StatusCode::kInvalidArgument);
}

// A restore on another shard count places saved ids into a fresh map:
// each in its bucket, the most recently seen first; a bucket given more
// ids than rows keeps the most recent and counts the rest as evicted.
TEST(DynamicIdMap, PlacesSavedIdsMostRecentFirst) {
  DynamicIdMap map(Options(17));  // one bucket of 16 rows
  std::vector<DynamicIdMap::SavedId> ids;
  for (int64_t i = 0; i < 20; ++i) ids.push_back({100 + i, 1 + i, 2 * i});
  std::reverse(ids.begin(), ids.end());
  std::swap(ids[3], ids[17]);  // the order given does not matter
  absl::StatusOr<std::vector<int64_t>> rows = map.PlaceSaved(ids, 25);
  ASSERT_TRUE(rows.ok()) << rows.status();
  ASSERT_EQ(rows->size(), ids.size());
  EXPECT_EQ(map.occupied(), 16);
  EXPECT_EQ(map.counters().evicted, 4);
  EXPECT_EQ(map.step(), 25);
  for (size_t i = 0; i < ids.size(); ++i) {
    const int64_t id = ids[i].id;
    if (id < 104) {
      EXPECT_EQ((*rows)[i], -1) << id;
      EXPECT_EQ(map.Lookup(id), -1) << id;
      continue;
    }
    // Most recent first: 119 in row 0.
    EXPECT_EQ((*rows)[i], 119 - id) << id;
    EXPECT_EQ(map.Lookup(id), (*rows)[i]) << id;
    EXPECT_EQ(map.last_steps()[(*rows)[i]], ids[i].last_step);
    EXPECT_EQ(map.sightings()[(*rows)[i]], ids[i].sightings);
  }
  // It trains on from there: a new id takes the least recently seen's row.
  DynamicIdMap::Plan plan;
  ASSERT_TRUE(map.MakePlan(std::vector<int64_t>{7}, 26, &plan).ok());
  ASSERT_EQ(plan.admitted.size(), 1u);
  EXPECT_EQ(plan.admitted[0].victim, 104);

  // Bad input changes nothing; a map that holds ids takes none.
  DynamicIdMap fresh(Options(17));
  const std::vector<DynamicIdMap::SavedId> twice = {{5, 1, 1}, {5, 2, 1}};
  EXPECT_EQ(fresh.PlaceSaved(twice, 3).status().code(),
            absl::StatusCode::kInvalidArgument);
  const std::vector<DynamicIdMap::SavedId> negative = {{5, 1, 1}, {-4, 2, 1}};
  EXPECT_EQ(fresh.PlaceSaved(negative, 3).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(fresh.occupied(), 0);
  EXPECT_EQ(fresh.Lookup(5), -1);
  EXPECT_EQ(map.PlaceSaved(twice, 3).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

// Sketches merged from maps of other widths (a restore on another shard
// count) never count an id below what the saved sketches together did;
// one of the same width merged into an empty map is that sketch.
TEST(DynamicIdMap, MergedSketchesNeverUndercount) {
  auto sighted = [](int64_t rows) {
    DynamicIdOptions o = Options(rows);
    o.admission = Admission::ADMIT_AFTER_SIGHTINGS;
    o.min_sightings = 1000;  // admit none: every sighting is counted
    return o;
  };
  DynamicIdMap wide(sighted(1500)), narrow(sighted(100));
  ASSERT_EQ(wide.sketch_width(), 2048);
  ASSERT_EQ(narrow.sketch_width(), 1024);
  Rng rng(kSeed);
  DynamicIdMap::Plan plan;
  std::vector<int64_t> drawn;
  for (int64_t b = 0; b < 30; ++b) {
    for (DynamicIdMap* m : {&wide, &narrow}) {
      const std::vector<int64_t> ids = StreamBatch(rng, b, 5000, 1, 64);
      drawn.insert(drawn.end(), ids.begin(), ids.end());
      ASSERT_TRUE(m->MakePlan(ids, b + 1, &plan).ok());
      m->Commit(plan);
    }
  }
  for (const int64_t rows : {600, 3000}) {
    DynamicIdMap merged(sighted(rows));
    ASSERT_TRUE(merged.MergeSketch(wide.sketch(), wide.sketch_width()).ok());
    ASSERT_TRUE(
        merged.MergeSketch(narrow.sketch(), narrow.sketch_width()).ok());
    int64_t counted = 0;
    for (const int64_t id : drawn) {
      const uint32_t both = wide.SketchCount(id) + narrow.SketchCount(id);
      EXPECT_GE(merged.SketchCount(id), both) << rows << ": id " << id;
      counted += both > 1;
    }
    EXPECT_GT(counted, 100);
  }
  DynamicIdMap same(sighted(1200));
  ASSERT_TRUE(same.MergeSketch(wide.sketch(), wide.sketch_width()).ok());
  EXPECT_EQ(same.sketch(), wide.sketch());
  EXPECT_EQ(same.MergeSketch(std::vector<uint32_t>(10, 0), 3).code(),
            absl::StatusCode::kInvalidArgument);
  // Without a sketch here there is nothing to merge.
  DynamicIdMap none(Options(100));
  EXPECT_TRUE(none.MergeSketch(wide.sketch(), wide.sketch_width()).ok());
}

TEST(DynamicIdOptions, RefusesFieldsOutOfRange) {
  DynamicIdOptions o = Options(1);
  EXPECT_EQ(o.Validate().code(), absl::StatusCode::kInvalidArgument);
  o = Options(10);
  o.admission = Admission::ADMIT_WITH_PROBABILITY;
  o.probability = 0;
  EXPECT_NE(o.Validate().message().find("probability"), std::string::npos);
  o.probability = 1.5;
  EXPECT_EQ(o.Validate().code(), absl::StatusCode::kInvalidArgument);
  o = Options(10);
  o.ttl_steps = -1;
  EXPECT_NE(o.Validate().message().find("ttl_steps"), std::string::npos);
  o = Options(10);
  o.admission = Admission::ADMIT_AFTER_SIGHTINGS;
  o.min_sightings = 0;
  EXPECT_NE(o.Validate().message().find("min_sightings"), std::string::npos);
}

// ---- DynamicStore over the host and RocksDB tiers.

constexpr int kDim = 8;

TableSpec Spec(int64_t rows) {
  return test::MakeTableSpec(/*table_index=*/2, rows, kDim, POOLING_MEAN,
                             OptimizerConfig::ADAGRAD, kSeed);
}

int64_t RecordFloats(const TableSpec& spec) {
  return spec.dim + StateFloatsPerRow(spec.optimizer, spec.dim);
}

// The record an id admitted into a table of `spec` starts from.
std::vector<float> AdmittedRecord(const TableSpec& spec, int64_t id) {
  std::vector<float> r(RecordFloats(spec));
  InitialRow(spec.seed, spec.table_index, spec.rows, id, 0, spec.dim, r.data());
  optim::InitialSparseState(spec.optimizer, spec.dim, r.data() + spec.dim);
  return r;
}

// The kept row's record under UNADMITTED_ZERO.
std::vector<float> ZeroRecord(const TableSpec& spec) {
  std::vector<float> r(RecordFloats(spec), 0.0f);
  optim::InitialSparseState(spec.optimizer, spec.dim, r.data() + spec.dim);
  return r;
}

std::vector<float> Row(EmbeddingStore& store, int64_t row) {
  std::vector<float> r(RecordFloats(store.spec()));
  EXPECT_TRUE(store.ReadRow(row, r.data()).ok());
  return r;
}

// Bags of raw ids (large values) drawn from `vocab` of them.
data::SparseFeature RawBags(Rng& rng, int64_t vocab, int64_t bags) {
  return test::RandomBags(
      rng, bags, 3, [&](const data::SparseFeature&, int64_t) -> int64_t {
        return (int64_t{1} << 50) + 104729 * rng.Below(vocab);
      });
}

enum class Tier { kHost, kRocksDb };

class DynamicStoreTest : public ::testing::TestWithParam<Tier> {
 protected:
  void SetUp() override {
    if (GetParam() == Tier::kRocksDb) {
      dir_ = test::MakeTestDir();
      RocksDbStoreOptions o;
      o.path = (dir_ / "db").string();
      o.block_cache_bytes = 0;
      auto db = RowDatabase::Open(o);
      ASSERT_TRUE(db.ok()) << db.status();
      db_ = *std::move(db);
    }
  }
  void TearDown() override {
    db_.reset();
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }

  // A store of `spec` on the test's tier (a row cache of `cache_rows`),
  // dynamic with `admission`, `eviction` and `unadmitted`.
  std::unique_ptr<EmbeddingStore> Make(
      const TableSpec& spec, Admission admission = {}, Eviction eviction = {},
      UnadmittedIds unadmitted = UNADMITTED_ZERO,
      int64_t cache_rows = 1 << 12) {
    StoreOptions o;
    o.kind =
        GetParam() == Tier::kHost ? StoreKind::kHost : StoreKind::kRocksDbCache;
    o.rocksdb.cache_rows = cache_rows;
    if (db_ != nullptr) o.rocksdb.path = db_->options().path;
    o.dynamic = true;
    o.admission = admission;
    o.eviction = eviction;
    o.unadmitted = unadmitted;
    auto store = CreateEmbeddingStore(spec, o, db_.get());
    EXPECT_TRUE(store.ok()) << store.status();
    return store.ok() ? *std::move(store) : nullptr;
  }

  std::filesystem::path dir_;
  std::unique_ptr<RowDatabase> db_;
};

DynamicStore& Dynamic(EmbeddingStore& store) {
  return dynamic_cast<DynamicStore&>(store);
}

TEST_P(DynamicStoreTest, TrainsLikeAStaticTableFedTheMapsRows) {
  const TableSpec spec = Spec(1025);
  std::unique_ptr<EmbeddingStore> dynamic = Make(spec);
  ASSERT_NE(dynamic, nullptr);
  HostStore fixed(spec);
  SCOPED_TRACE(::testing::Message() << "seed " << kSeed);
  Rng rng(kSeed);
  // 120 ids into 64 buckets of 16: nothing is evicted or refused.
  std::vector<data::SparseFeature> batches;
  std::vector<std::vector<float>> grads;
  for (int b = 0; b < 30; ++b) {
    batches.push_back(RawBags(rng, 120, 24));
    grads.push_back(test::RandomGrad(rng, 24, kDim));
  }
  std::vector<std::vector<float>> outs;
  for (int b = 0; b < 30; ++b) {
    auto prepared = dynamic->Prepare(batches[b]);
    ASSERT_TRUE(prepared.ok()) << prepared.status();
    std::vector<float> out(24 * kDim);
    ASSERT_TRUE(dynamic->Forward(**prepared, out.data(), kDim).ok());
    outs.push_back(out);
    ASSERT_TRUE(
        dynamic->BackwardUpdate(**prepared, grads[b].data(), kDim).ok());
  }
  const DynamicIdMap& map = Dynamic(*dynamic).map();
  ASSERT_EQ(map.counters().evicted, 0);
  ASSERT_EQ(map.counters().refused, 0);
  // The static table: each id's row starts from the id's initial record
  // (written before any batch touches it), the kept row from zero.
  ASSERT_TRUE(fixed.WriteRows(spec.rows - 1, 1, ZeroRecord(spec).data()).ok());
  std::map<int64_t, int64_t> row_of;
  for (const data::SparseFeature& f : batches) {
    for (const int64_t id : f.ids) row_of[id] = map.Lookup(id);
  }
  for (const auto& [id, row] : row_of) {
    ASSERT_GE(row, 0) << id;
    ASSERT_TRUE(fixed.WriteRows(row, 1, AdmittedRecord(spec, id).data()).ok());
  }
  for (int b = 0; b < 30; ++b) {
    data::SparseFeature rows = batches[b];
    for (int64_t& id : rows.ids) id = row_of[id];
    std::vector<float> out(24 * kDim);
    ASSERT_TRUE(fixed.Forward(rows, out.data(), kDim).ok());
    ASSERT_EQ(out, outs[b]) << "batch " << b;
    ASSERT_TRUE(fixed.BackwardUpdate(rows, grads[b].data(), kDim).ok());
  }
  EXPECT_EQ(test::AllRecords(*dynamic), test::AllRecords(fixed));
  EXPECT_EQ(dynamic->step(), fixed.step());
  const StoreMetrics m = dynamic->metrics();
  EXPECT_EQ(m.ids_admitted, static_cast<int64_t>(row_of.size()));
  EXPECT_EQ(m.ids_occupied, static_cast<int64_t>(row_of.size()));
  EXPECT_EQ(m.ids_evicted, 0);
}

TEST_P(DynamicStoreTest, AnEvictedRowStartsAgainFromTheNewIdsValue) {
  // One bucket of 16 rows: the 17th id evicts the least recently seen.
  const TableSpec spec = Spec(17);
  std::unique_ptr<EmbeddingStore> store = Make(spec);
  ASSERT_NE(store, nullptr);
  std::vector<float> grad(kDim, 0.5f);
  for (int64_t i = 0; i < 17; ++i) {
    const int64_t id = 900 + i;
    auto prepared = store->Prepare(test::Bag({id}));
    ASSERT_TRUE(prepared.ok()) << prepared.status();
    const int64_t row = Dynamic(*store).map().Lookup(id);
    ASSERT_GE(row, 0);
    // Fresh: the id's initial value and fresh optimizer state, whatever
    // the row held before.
    EXPECT_EQ(Row(*store, row), AdmittedRecord(spec, id)) << id;
    ASSERT_TRUE(store->BackwardUpdate(**prepared, grad.data(), kDim).ok());
    EXPECT_NE(Row(*store, row), AdmittedRecord(spec, id)) << id;
  }
  // 900, seen first, lost its row to 916.
  EXPECT_EQ(Dynamic(*store).map().Lookup(900), -1);
  EXPECT_EQ(store->metrics().ids_evicted, 1);
  EXPECT_EQ(store->metrics().ids_occupied, 16);
}

TEST_P(DynamicStoreTest, UnadmittedIdsPoolAZeroRowThatStaysZero) {
  const TableSpec spec = Spec(33);
  Admission after;
  after.set_kind(Admission::ADMIT_AFTER_SIGHTINGS);
  after.set_min_sightings(3);
  std::unique_ptr<EmbeddingStore> store = Make(spec, after);
  ASSERT_NE(store, nullptr);
  std::vector<float> grad(2 * kDim, 1.0f);
  data::SparseFeature f;
  f.offsets = {0, 1, 3};
  f.ids = {77, 77, 78};
  for (int b = 0; b < 3; ++b) {
    auto prepared = store->Prepare(f);
    ASSERT_TRUE(prepared.ok()) << prepared.status();
    std::vector<float> out(2 * kDim, -1.0f);
    ASSERT_TRUE(store->Forward(**prepared, out.data(), kDim).ok());
    if (b < 2) {
      // Seen in fewer than 3 batches: zero, gradient dropped.
      EXPECT_EQ(out, std::vector<float>(2 * kDim, 0.0f)) << b;
      EXPECT_EQ(Dynamic(*store).map().Lookup(77), -1);
    } else {
      EXPECT_GE(Dynamic(*store).map().Lookup(77), 0);
      EXPECT_NE(out[0], 0.0f);
    }
    ASSERT_TRUE(store->BackwardUpdate(**prepared, grad.data(), kDim).ok());
    EXPECT_EQ(Row(*store, spec.rows - 1), ZeroRecord(spec)) << b;
  }
  EXPECT_EQ(store->metrics().ids_admitted, 2);
}

TEST_P(DynamicStoreTest, TheSharedRowTrains) {
  const TableSpec spec = Spec(33);
  Admission maybe;
  maybe.set_kind(Admission::ADMIT_WITH_PROBABILITY);
  maybe.set_probability(1e-9f);
  std::unique_ptr<EmbeddingStore> store =
      Make(spec, maybe, {}, UNADMITTED_SHARED_ROW);
  ASSERT_NE(store, nullptr);
  const std::vector<float> before = Row(*store, spec.rows - 1);
  // Not zeroed: the row's own initial value.
  EXPECT_NE(before, ZeroRecord(spec));
  auto prepared = store->Prepare(test::Bag({5, 6}));
  ASSERT_TRUE(prepared.ok()) << prepared.status();
  EXPECT_EQ(store->metrics().ids_admitted, 0);
  std::vector<float> grad(kDim, 1.0f);
  ASSERT_TRUE(store->BackwardUpdate(**prepared, grad.data(), kDim).ok());
  EXPECT_NE(Row(*store, spec.rows - 1), before);
}

TEST_P(DynamicStoreTest, PredictionsNeverAdmit) {
  const TableSpec spec = Spec(65);
  std::unique_ptr<EmbeddingStore> store = Make(spec);
  ASSERT_NE(store, nullptr);
  auto prepared = store->Prepare(test::Bag({10}));
  ASSERT_TRUE(prepared.ok());
  std::vector<float> grad(kDim, 1.0f);
  ASSERT_TRUE(store->BackwardUpdate(**prepared, grad.data(), kDim).ok());
  const std::vector<float> records = test::AllRecords(*store);

  // A known id pools its row; an unknown one the zero row.
  data::SparseFeature f;
  f.offsets = {0, 1, 2};
  f.ids = {10, 11};
  std::vector<float> pooled(2 * kDim);
  ASSERT_TRUE(store->PoolReadOnly(f, pooled.data(), kDim).ok());
  const std::vector<float> row10 =
      Row(*store, Dynamic(*store).map().Lookup(10));
  EXPECT_TRUE(std::equal(pooled.begin(), pooled.begin() + kDim, row10.begin()));
  EXPECT_EQ(std::vector<float>(pooled.begin() + kDim, pooled.end()),
            std::vector<float>(kDim, 0.0f));
  // PrepareLookup (Model's predictions) pools the same, admits nothing.
  auto looked = store->PrepareLookup(f);
  ASSERT_TRUE(looked.ok()) << looked.status();
  std::vector<float> out(2 * kDim);
  ASSERT_TRUE(store->Forward(**looked, out.data(), kDim).ok());
  EXPECT_EQ(out, pooled);
  EXPECT_EQ(Dynamic(*store).map().Lookup(11), -1);
  EXPECT_EQ(store->metrics().ids_occupied, 1);
  EXPECT_EQ(store->metrics().unknown_lookups, 2);
  EXPECT_EQ(test::AllRecords(*store), records);
}

TEST_P(DynamicStoreTest, AFailedPrepareChangesNothing) {
  const TableSpec spec = Spec(65);
  // RocksDB: a row cache of 4 rows refuses a batch of 6 ids. Host: a
  // negative id.
  std::unique_ptr<EmbeddingStore> store =
      Make(spec, {}, {}, UNADMITTED_ZERO, /*cache_rows=*/4);
  ASSERT_NE(store, nullptr);
  auto first = store->Prepare(test::Bag({1, 2}));
  ASSERT_TRUE(first.ok()) << first.status();
  const std::vector<float> records = test::AllRecords(*store);
  const std::vector<int64_t> keys = Dynamic(*store).map().keys();
  const data::SparseFeature bad = GetParam() == Tier::kRocksDb
                                      ? test::Bag({3, 4, 5, 6, 7, 8})
                                      : test::Bag({3, 4, -5});
  auto prepared = store->Prepare(bad);
  ASSERT_FALSE(prepared.ok());
  EXPECT_EQ(prepared.status().code(), GetParam() == Tier::kRocksDb
                                          ? absl::StatusCode::kResourceExhausted
                                          : absl::StatusCode::kInvalidArgument)
      << prepared.status();
  EXPECT_EQ(Dynamic(*store).map().keys(), keys);
  EXPECT_EQ(store->metrics().ids_admitted, 2);
  EXPECT_EQ(test::AllRecords(*store), records);
}

INSTANTIATE_TEST_SUITE_P(Tiers, DynamicStoreTest,
                         ::testing::Values(Tier::kHost, Tier::kRocksDb),
                         [](const ::testing::TestParamInfo<Tier>& info) {
                           return info.param == Tier::kHost ? "Host"
                                                            : "RocksDb";
                         });

}  // namespace
}  // namespace dlrm::embedding
