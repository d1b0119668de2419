// The memory plan (model/memory_plan.h): its parts against the config, the
// machine's memory and its override, the refusal with the fix, and against
// real processes: dlrm_train and dlrm_server refusing the MLPerf DCNv2
// preset on a (simulated) small machine before they allocate, accepting it
// with a host budget, and a real training run's peak RSS within 10% of the
// plan it printed.
#include "model/memory_plan.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/config.h"
#include "core/status.h"
#include "core/storage_flags.h"
#include "embedding/sharding.h"
#include "gtest/gtest.h"
#include "tests/support/expect.h"
#include "tests/support/process.h"

namespace dlrm::model {
namespace {

namespace fs = std::filesystem;

ModelConfig Preset(const std::string& name) {
  absl::StatusOr<ModelConfig> c = LoadModelConfig(name);
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

std::string TempDir(const std::string& name) {
  const fs::path dir = fs::path(::testing::TempDir()) /
                       absl::StrCat("memory_plan_test_", getpid(), "_", name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

// Runs `argv` with `env` added to this process's environment, stdout and
// stderr to files under `dir`.
test::RunResult RunProcess(const std::vector<std::string>& argv,
                           const std::vector<std::string>& env,
                           const std::string& dir) {
  return test::Run(argv, dir, env);
}

// The total of the first "memory plan of rank ..." line: its MiB, in bytes.
int64_t PrintedPlanBytes(const std::string& out) {
  const size_t at = out.find("memory plan of rank");
  if (at == std::string::npos) return -1;
  const size_t colon = out.find("): ", at);
  const size_t mib = out.find(" MiB", colon);
  double value = 0;
  if (colon == std::string::npos || mib == std::string::npos ||
      !absl::SimpleAtod(out.substr(colon + 3, mib - colon - 3), &value)) {
    return -1;
  }
  return static_cast<int64_t>(value * 1048576.0);
}

constexpr int64_t kGiB = int64_t{1} << 30;
constexpr int64_t kHundredGB = int64_t{100'000'000'000};

// ------------------------------------------------------------ the plan

TEST(MemoryPlanTest, CountsHostTablesAsTheirRowsAndOptimizerState) {
  const ModelConfig c = Preset("kaggle");
  absl::StatusOr<MemoryPlan> m = PlanMemory(c, nullptr, MemoryPlanOptions());
  ASSERT_TRUE(m.ok()) << m.status();
  const embedding::ShardingPlan whole = embedding::WholeTablesPlan(c);
  EXPECT_EQ(m->host_tables,
            embedding::HostBytesPerRank(c, whole, c.rocksdb())[0]);
  EXPECT_EQ(m->row_caches, 0);
  EXPECT_EQ(m->rocksdb_buffers, 0);
  EXPECT_EQ(m->tables.size(), static_cast<size_t>(c.tables_size()));
  EXPECT_GE(m->dense, 2 * 4 * DenseParameterCount(c));
  EXPECT_GT(m->batch_buffers, 0);
  EXPECT_EQ(m->host_total(), m->host_tables + m->host_without_tables());
  EXPECT_HAS_SUBSTR(m->ToString(), "tables in host memory");
}

// kaggle with every table on RocksDB (--tables-on-rocksdb all, under a
// directory no plan opens) and --row-precision `row_precision` ("": the
// config's fp32) into *c, and its plan.
absl::StatusOr<MemoryPlan> PlanKaggleOnRocksDb(const std::string& row_precision,
                                               ModelConfig* c) {
  *c = Preset("kaggle");
  StorageFlags flags;
  flags.tables_on_rocksdb = {"all"};
  flags.rocksdb_dir = "/tmp/unused";
  flags.row_precision = row_precision;
  RETURN_IF_ERROR(flags.Apply(c));
  return PlanMemory(*c, nullptr, MemoryPlanOptions());
}

TEST(MemoryPlanTest, TablesOnRocksDbCountTheirCachesAndBuffers) {
  ModelConfig c;
  absl::StatusOr<MemoryPlan> m = PlanKaggleOnRocksDb("", &c);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->host_tables, 0);
  EXPECT_GT(m->row_caches, 0);
  // kaggle's tables train with SGD: no optimizer state.
  EXPECT_EQ(m->rocksdb_disk, 4 * EmbeddingParameterCount(c));
  EXPECT_EQ(m->rocksdb_buffers, c.rocksdb().block_cache_bytes() +
                                    c.tables_size() * (int64_t{64} << 20));
}

// bf16 rows on RocksDB: half the bytes on disk, and row caches whose slots
// hold 2 bytes a weight (plus the row each slot holds); the staged misses
// stay fp32 records.
TEST(MemoryPlanTest, SixteenBitRowsOnRocksDbHalveTheDiskAndTheSlots) {
  ModelConfig c;
  absl::StatusOr<MemoryPlan> fp32 = PlanKaggleOnRocksDb("", &c);
  ASSERT_TRUE(fp32.ok()) << fp32.status();
  absl::StatusOr<MemoryPlan> bf16 = PlanKaggleOnRocksDb("bf16", &c);
  ASSERT_TRUE(bf16.ok()) << bf16.status();
  EXPECT_EQ(bf16->rocksdb_disk, 2 * EmbeddingParameterCount(c));
  EXPECT_EQ(2 * bf16->rocksdb_disk, fp32->rocksdb_disk);
  int64_t cached_weights = 0;
  for (const auto& t : bf16->tables) cached_weights += t.cache_rows;
  cached_weights *= c.embedding_dim();
  // 2 bytes fewer a cached weight, 8 more a cached row.
  EXPECT_EQ(fp32->row_caches - bf16->row_caches,
            2 * cached_weights - 8 * cached_weights / c.embedding_dim());
}

TEST(MemoryPlanTest, BadOptionsAreInvalidArgument) {
  MemoryPlanOptions o;
  o.batch_size = 0;
  EXPECT_TRUE(
      absl::IsInvalidArgument(PlanMemory(Preset("tiny"), nullptr, o).status()));
  o.batch_size = 1;
  o.rank = 1;
  EXPECT_TRUE(
      absl::IsInvalidArgument(PlanMemory(Preset("tiny"), nullptr, o).status()));
}

// ------------------------------------------------------------ the machine

TEST(MemoryPlanTest, MachineMemoryOverrideIsUsedAndChecked) {
  setenv("DLRM_MACHINE_MEMORY_BYTES", "123456789", 1);
  absl::StatusOr<MachineMemory> m = AvailableMemory();
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->bytes, 123456789);
  EXPECT_EQ(m->source, "DLRM_MACHINE_MEMORY_BYTES");
  setenv("DLRM_MACHINE_MEMORY_BYTES", "lots", 1);
  absl::Status bad = AvailableMemory().status();
  EXPECT_TRUE(absl::IsInvalidArgument(bad)) << bad;
  EXPECT_HAS_SUBSTR(bad.message(), "DLRM_MACHINE_MEMORY_BYTES");
  unsetenv("DLRM_MACHINE_MEMORY_BYTES");
  m = AvailableMemory();
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_GT(m->bytes, 0);
  EXPECT_FALSE(m->source.empty());
}

TEST(MemoryPlanTest, DcnV2OnASmallMachineIsRefusedWithABudgetThatFits) {
  const ModelConfig c = Preset("mlperf-dlrm-dcnv2");
  absl::StatusOr<MemoryPlan> m = PlanMemory(c, nullptr, MemoryPlanOptions());
  ASSERT_TRUE(m.ok()) << m.status();
  // 105 GB of fp32 rows and row-wise Adagrad state.
  EXPECT_GT(m->host_tables, kHundredGB);
  const MachineMemory machine{24 * kGiB, "a test"};
  const absl::Status refused = CheckMemory(c, *m, machine);
  ASSERT_TRUE(absl::IsResourceExhausted(refused)) << refused;
  const std::string text(refused.message());
  EXPECT_HAS_SUBSTR(text, "short") << text;
  const size_t flag = text.find("--host-budget-mb ");
  ASSERT_NE(flag, std::string::npos) << text;
  EXPECT_HAS_SUBSTR(text, "--rocksdb-dir DIR") << text;
  int64_t budget_mb = 0;
  const std::string number =
      text.substr(flag + 17, text.find(' ', flag + 17) - flag - 17);
  ASSERT_TRUE(absl::SimpleAtoi(number, &budget_mb)) << text;
  // The budget it names fits the machine.
  ModelConfig budgeted = c;
  StorageFlags flags;
  flags.host_budget_mb = budget_mb;
  flags.rocksdb_dir = "/tmp/unused";
  ASSERT_TRUE(flags.Apply(&budgeted).ok());
  absl::StatusOr<ModelConfig> tiers = embedding::ApplyMemoryBudgets(budgeted);
  ASSERT_TRUE(tiers.ok()) << tiers.status();
  absl::StatusOr<MemoryPlan> fits =
      PlanMemory(*tiers, nullptr, MemoryPlanOptions());
  ASSERT_TRUE(fits.ok()) << fits.status();
  EXPECT_TRUE(CheckMemory(*tiers, *fits, machine).ok())
      << budget_mb << " MiB:\n"
      << fits->ToString();
}

TEST(MemoryPlanTest, CachesTooBigForTheMachineNameTheCacheFlags) {
  ModelConfig c = Preset("kaggle");
  StorageFlags flags;
  flags.tables_on_rocksdb = {"all"};
  flags.rocksdb_dir = "/tmp/unused";
  flags.cache_fraction = 1.0;
  c.mutable_rocksdb()->set_block_cache_bytes(8 << 20);
  c.mutable_rocksdb()->set_write_buffer_bytes(4 << 20);
  ASSERT_TRUE(flags.Apply(&c).ok());
  absl::StatusOr<MemoryPlan> m = PlanMemory(c, nullptr, MemoryPlanOptions());
  ASSERT_TRUE(m.ok()) << m.status();
  // Room for everything but half of the caches.
  const MachineMemory machine{m->host_without_tables() + m->row_caches / 2,
                              "a test"};
  const absl::Status refused = CheckMemory(c, *m, machine);
  ASSERT_TRUE(absl::IsResourceExhausted(refused)) << refused;
  EXPECT_HAS_SUBSTR(refused.message(), "--cache-fraction") << refused;
}

TEST(MemoryPlanTest, ShardingBudgetErrorSaysWhatTheFlagIs) {
  embedding::PlannerOptions po;
  po.memory_budget_bytes = 20 << 20;
  const absl::StatusOr<embedding::ShardingPlan> planned = ExplainShardingBudget(
      embedding::PlanSharding(Preset("mlperf-dlrm-dcnv2"), po),
      "--memory-budget-mb");
  ASSERT_TRUE(absl::IsResourceExhausted(planned.status())) << planned.status();
  const std::string text(planned.status().message());
  EXPECT_HAS_SUBSTR(text, "fits nowhere") << text;
  EXPECT_HAS_SUBSTR(text, "--memory-budget-mb is the sharding planner's limit")
      << text;
  EXPECT_HAS_SUBSTR(text, "--host-budget-mb N --rocksdb-dir DIR") << text;
}

TEST(StorageFlagsTest, BudgetWithoutADirectoryNamesTheFlag) {
  ModelConfig c = Preset("kaggle");
  StorageFlags flags;
  flags.host_budget_mb = 10;
  const absl::Status s = flags.Apply(&c);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_HAS_SUBSTR(s.message(), "--rocksdb-dir") << s;
}

TEST(StorageFlagsTest, KeepsTheConfigsRocksDbFieldsItIsNotGiven) {
  ModelConfig c = Preset("kaggle");
  c.mutable_rocksdb()->set_block_cache_bytes(8 << 20);
  c.mutable_rocksdb()->set_cache_rows(77);
  StorageFlags flags;
  flags.host_budget_mb = 10;
  flags.rocksdb_dir = "/tmp/unused";
  ASSERT_TRUE(flags.Apply(&c).ok());
  EXPECT_EQ(c.rocksdb().block_cache_bytes(), 8 << 20);
  EXPECT_EQ(c.rocksdb().cache_rows(), 77);
  EXPECT_EQ(c.rocksdb().host_budget_bytes(), 10 << 20);
  EXPECT_EQ(c.rocksdb().path(), "/tmp/unused");
}

// ------------------------------------------------------------ processes

// Less than the DCNv2 preset needs without a budget (16 GiB), and the
// 24 GiB machine of the docs' recipe (--host-budget-mb 12000).
const std::string kSmallMachine =
    absl::StrCat("DLRM_MACHINE_MEMORY_BYTES=", 16 * kGiB);
const std::string kMachine24 =
    absl::StrCat("DLRM_MACHINE_MEMORY_BYTES=", 24 * kGiB);

TEST(MemoryProcessTest, DlrmTrainRefusesDcnV2BeforeAllocating) {
  const std::string dir = TempDir("train_refuses");
  const test::RunResult r = RunProcess(
      {DLRM_TRAIN_BINARY, "--config", "mlperf-dlrm-dcnv2", "--steps", "1"},
      {kSmallMachine}, dir);
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_HAS_SUBSTR(r.err, "RESOURCE_EXHAUSTED") << r.err;
  EXPECT_HAS_SUBSTR(r.err, "DLRM_MACHINE_MEMORY_BYTES") << r.err;
  EXPECT_HAS_SUBSTR(r.err, "--host-budget-mb") << r.err;
  EXPECT_HAS_SUBSTR(r.err, "--rocksdb-dir DIR") << r.err;
  // The plan, and nothing of the model's 105 GB allocated.
  EXPECT_GT(PrintedPlanBytes(r.out), kHundredGB) << r.out;
  EXPECT_LT(r.peak_bytes, 1 * kGiB);
}

TEST(MemoryProcessTest, DlrmTrainAcceptsDcnV2WithAHostBudget) {
  const std::string dir = TempDir("train_budget");
  const test::RunResult r = RunProcess(
      {DLRM_TRAIN_BINARY, "--config", "mlperf-dlrm-dcnv2", "--host-budget-mb",
       "12000", "--rocksdb-dir", dir + "/rocksdb", "--dry-run"},
      {kMachine24}, dir);
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_HAS_SUBSTR(r.out, "dlrm_train --dry-run: fits") << r.out;
  EXPECT_HAS_SUBSTR(r.out, "rocksdb row caches") << r.out;
  const int64_t plan = PrintedPlanBytes(r.out);
  EXPECT_GT(plan, 12000LL << 20) << r.out;
  EXPECT_LT(plan, 24 * kGiB) << r.out;
  EXPECT_LT(r.peak_bytes, 1 * kGiB);
}

TEST(MemoryProcessTest, DlrmServerDryRunRefusesAndAcceptsAsARun) {
  const std::string dir = TempDir("server");
  test::RunResult r = RunProcess(
      {DLRM_SERVER_BINARY, "--config", "mlperf-dlrm-dcnv2", "--dry-run"},
      {kSmallMachine}, dir);
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_HAS_SUBSTR(r.err, "RESOURCE_EXHAUSTED") << r.err;
  EXPECT_HAS_SUBSTR(r.err, "--host-budget-mb") << r.err;
  r = RunProcess(
      {DLRM_SERVER_BINARY, "--config", "mlperf-dlrm-dcnv2", "--dry-run",
       "--host-budget-mb", "12000", "--rocksdb-dir", dir + "/rocksdb"},
      {kMachine24}, dir);
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_HAS_SUBSTR(r.out, "on rocksdb") << r.out;
  EXPECT_HAS_SUBSTR(r.out, "memory plan of rank 0") << r.out;
  // The old --memory-budget-mb error now says what that flag is.
  r = RunProcess({DLRM_SERVER_BINARY, "--config", "mlperf-dlrm-dcnv2",
                  "--dry-run", "--memory-budget-mb", "20"},
                 {}, dir);
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_HAS_SUBSTR(r.err, "sharding planner's limit") << r.err;
  EXPECT_HAS_SUBSTR(r.err, "--host-budget-mb N --rocksdb-dir DIR") << r.err;
}

// A scaled copy of the DCNv2 preset's shape (its 26 tables at a 100th of
// the rows, dim 128, its bags, MLPs and cross network) with small RocksDB
// buffers, trained under a host budget that moves its two largest tables to
// RocksDB: the measured peak RSS is within 10% of the printed plan.
TEST(MemoryProcessTest, PeakRssOfATrainingRunIsWithinATenthOfThePlan) {
  const std::string dir = TempDir("peak");
  ModelConfig c = Preset("mlperf-dlrm-dcnv2");
  for (TableConfig& t : *c.mutable_tables()) {
    t.set_rows(std::max<int64_t>(1, t.rows() / 100));
  }
  c.set_max_rows_per_table(0);
  c.mutable_rocksdb()->set_block_cache_bytes(8 << 20);
  c.mutable_rocksdb()->set_write_buffer_bytes(4 << 20);
  const std::string config = dir + "/dcnv2_small.textproto";
  std::ofstream(config) << c.DebugString();
  // 5 tables of 400000 rows (197 MiB each with row-wise Adagrad) and 21
  // small ones (21 MiB): a budget of 700 MiB keeps three of the large ones
  // in memory and puts two on RocksDB behind caches of 40000 rows.
  const test::RunResult r = RunProcess(
      {DLRM_TRAIN_BINARY, "--config", config, "--host-budget-mb", "700",
       "--rocksdb-dir", dir + "/rocksdb", "--steps", "3", "--batch", "256",
       "--eval-samples", "2048", "--log-interval", "1", "--threads", "2"},
      {}, dir);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_HAS_SUBSTR(r.out, "rocksdb row caches") << r.out;
  const int64_t plan = PrintedPlanBytes(r.out);
  ASSERT_GT(plan, 0) << r.out;
  const double peak = static_cast<double>(r.peak_bytes);
  std::printf("plan %.1f MiB, peak RSS %.1f MiB (%+.1f%%)\n", plan / 1048576.0,
              peak / 1048576.0, 100.0 * (plan - peak) / peak);
  EXPECT_LE(std::abs(plan - peak), 0.1 * peak) << r.out;
}

}  // namespace
}  // namespace dlrm::model
