// dlrm_bench_train: training samples/s of the in-process DLRM step on
// pre-generated synthetic batches (the same protocol as the peers in
// bench/peers: a few batches rotated, warm-up, then timed steps). Prints a
// JSON line per repetition's median and per-stage times; with --roofline a
// second line (and a table on stderr) of each stage against the host's
// ceilings measured in the same run (bench/roofline.h).
#include <omp.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "bench/roofline.h"
#include "bench/step_flags.h"
#include "core/cli_parse.h"
#include "core/config.h"
#include "core/dense_flags.h"
#include "core/status.h"
#include "core/storage_flags.h"
#include "data/synthetic.h"
#include "dense/cpu_isa.h"
#include "embedding/sharding.h"
#include "model/memory_plan.h"
#include "model/model.h"

namespace dlrm {
namespace {

// The step flags (bench/step_flags.h) and this binary's.
struct Flags : bench::StepFlags {
  int threads = 0;
  // Tables in GPU memory (STORAGE_DEVICE): "all" or names.
  std::vector<std::string> tables_on_device;
  // Also measure the host's GEMM ceilings and copy bandwidth.
  bool roofline = false;
};

// The roofline line: every stage against its ceiling, measured now.
void PrintRoofline(const std::string& name, const ModelConfig& config,
                   bool bf16, int64_t batch,
                   const std::vector<data::Batch>& batches,
                   const model::StageTimes& stages, double steps) {
  const std::vector<bench::GemmShape> gemms = bench::StepGemms(config, batch);
  std::vector<double> seconds;
  double flops = 0, gemm_s = 0;
  for (const bench::GemmShape& g : gemms) {
    seconds.push_back(bench::TimeGemm(g, bf16, 5));
    flops += g.flops();
    gemm_s += seconds.back();
  }
  const double copy = bench::CopyBandwidth(int64_t{256} << 20, 5);
  bench::EmbeddingBytes bytes;
  for (const data::Batch& b : batches) {
    const bench::EmbeddingBytes e = bench::StepEmbeddingBytes(config, b);
    bytes.lookup += e.lookup / batches.size();
    bytes.update += e.update / batches.size();
  }
  std::array<double, model::StageTimes::kNumStages> per_step{};
  double step_s = 0;
  for (int s = 0; s < model::StageTimes::kNumStages; ++s) {
    per_step[s] = stages.seconds[s] / steps;
    step_s += per_step[s];
  }
  const std::vector<bench::StageRoof> roof =
      bench::Roofline(per_step, gemms, seconds, bytes, copy);
  double unbounded_ms = 0;
  std::fprintf(stderr,
               "roofline: GEMM ceiling %.1f GFLOP/s over the step's %zu GEMM "
               "shapes (%s), copy %.1f GB/s\n"
               "  %-13s %10s %10s %9s  %s\n",
               flops / gemm_s * 1e-9, gemms.size(), bf16 ? "bf16" : "fp32",
               copy * 1e-9, "stage", "ms/step", "ceiling", "fraction", "bound");
  std::printf(
      "{\"bench\": \"roofline\", \"config\": \"%s\", \"precision\": "
      "\"%s\", \"cpu\": \"%s\", \"isa\": \"%s\", \"batch\": %lld, "
      "\"threads\": %d, \"gemm_ceiling_gflops\": %.1f, \"copy_gb_s\": "
      "%.2f, \"lookup_bytes\": %.0f, \"update_bytes\": %.0f, "
      "\"stages\": [",
      name.c_str(), bf16 ? "bf16" : "fp32", dense::CpuModel().c_str(),
      dense::MatmulIsa(bf16).c_str(), static_cast<long long>(batch),
      omp_get_max_threads(), flops / gemm_s * 1e-9, copy * 1e-9, bytes.lookup,
      bytes.update);
  for (size_t i = 0; i < roof.size(); ++i) {
    const bench::StageRoof& r = roof[i];
    if (r.bound.empty()) unbounded_ms += r.measured_ms;
    std::fprintf(stderr, "  %-13s %10.3f %10.3f %9.2f  %s\n", r.stage,
                 r.measured_ms, r.ceiling_ms, r.fraction,
                 r.bound.empty() ? "-" : r.bound.c_str());
    std::printf(
        "%s{\"stage\": \"%s\", \"ms\": %.3f, \"ceiling_ms\": %.3f, "
        "\"fraction\": %.3f, \"bound\": \"%s\"}",
        i ? ", " : "", r.stage, r.measured_ms, r.ceiling_ms, r.fraction,
        r.bound.c_str());
  }
  const double unbounded_share =
      step_s > 0 ? unbounded_ms * 1e-3 / step_s : 0.0;
  std::printf("], \"unbounded_share\": %.3f}\n", unbounded_share);
  std::fprintf(stderr, "  stages with no ceiling: %.1f%% of the step\n",
               100 * unbounded_share);
}

absl::Status Run(const Flags& f) {
  ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(f.config));
  RETURN_IF_ERROR(f.dense.Apply(&config));
  if (f.rows > 0) {
    for (auto& t : *config.mutable_tables()) t.set_rows(f.rows);
    // Or the config's cap (kaggle: 100k) would shrink the tables again when
    // PlaceTablesOnRocksDb normalises it, and the tiers would differ.
    config.set_max_rows_per_table(0);
  }
  RETURN_IF_ERROR(f.storage.Apply(&config));
  if (!f.tables_on_device.empty()) {
    const bool all = f.tables_on_device == std::vector<std::string>{"all"};
    int placed = 0;
    for (TableConfig& t : *config.mutable_tables()) {
      if (all || std::find(f.tables_on_device.begin(), f.tables_on_device.end(),
                           t.name()) != f.tables_on_device.end()) {
        t.set_storage(STORAGE_DEVICE);
        ++placed;
      }
    }
    if (!all && placed != static_cast<int>(f.tables_on_device.size())) {
      return absl::InvalidArgumentError(
          "--tables-on-device names a table the config does not have");
    }
    ASSIGN_OR_RETURN(config, NormalizeModelConfig(config));
  }
  // The tiers the model will choose (it plans the same when created).
  ASSIGN_OR_RETURN(config, embedding::ApplyMemoryBudgets(config));
  if (f.threads > 0) {
    omp_set_num_threads(f.threads);
  }
  // What the model will hold (on stderr: stdout is the JSON lines),
  // checked against the machine before anything is allocated.
  model::MemoryPlanOptions mo;
  mo.batch_size = f.batch;
  mo.eval_batch_size = 0;
  ASSIGN_OR_RETURN(const model::MemoryPlan plan,
                   model::PlanMemory(config, nullptr, mo));
  std::fprintf(stderr, "%s", plan.ToString().c_str());
  ASSIGN_OR_RETURN(const model::MachineMemory machine,
                   model::AvailableMemory());
  RETURN_IF_ERROR(model::CheckMemory(config, plan, machine));
  ASSIGN_OR_RETURN(auto model, model::Model::Create(config));
  data::SyntheticOptions so;
  so.zipf_alpha = f.alpha;
  so.vocabulary = f.vocabulary;
  so.drift = f.drift;
  const int num_batches = std::max(f.batches, 1);
  ASSIGN_OR_RETURN(const std::vector<data::Batch> batches,
                   bench::SyntheticBatches(config, so, num_batches, f.batch));
  ASSIGN_OR_RETURN(const bench::StepTimings run,
                   bench::RunTimedSteps(*model, batches, f.prefetch, f.warmup,
                                        f.repeats, f.iters, f.batch));
  const std::vector<double>& rates = run.rates;
  const model::StageTimes& stages = run.times;
  // Cache counters of the timed steps only.
  const embedding::StoreMetrics& warm = run.warm;
  const embedding::StoreMetrics& timed = run.timed;
  const int64_t hits = timed.hits - warm.hits;
  const int64_t lookups = hits + timed.misses - warm.misses;
  const double hit_rate =
      lookups > 0 ? static_cast<double>(hits) / lookups : 1.0;
  int rocksdb_tables = 0, device_tables = 0;
  int64_t max_rows = 0;
  for (const auto& t : model->config().tables()) {
    rocksdb_tables += t.storage() == STORAGE_ROCKSDB;
    device_tables += t.storage() == STORAGE_DEVICE;
    max_rows = std::max(max_rows, t.rows());
  }
  // The tables' precision (weight_precision: "mixed" when they differ) and
  // the bytes their stores hold in host memory and on disk (MemoryBytes:
  // RocksDB's live files).
  std::string row_precision;
  for (const auto& t : model->config().tables()) {
    const std::string p = RowPrecisionName(t.weight_precision());
    row_precision = row_precision.empty() || row_precision == p ? p : "mixed";
  }
  int64_t table_host_bytes = 0, table_disk_bytes = 0;
  for (int j = 0; j < model->shards().size(); ++j) {
    const embedding::StoreBytes b = model->shards()[j].store->MemoryBytes();
    table_host_bytes += b.host;
    table_disk_bytes += b.disk;
  }
  std::vector<double> sorted = rates;
  std::sort(sorted.begin(), sorted.end());
  const double median = sorted[sorted.size() / 2];
  std::printf(
      "{\"bench\": \"dlrm-server-cpu\", \"config\": \"%s\", "
      "\"device\": \"%s\", \"precision\": \"%s\", \"cpu\": \"%s\", "
      "\"isa\": \"%s\", \"rows\": %lld, \"batch\": "
      "%lld, \"threads\": %d, "
      "\"iters\": %d, \"repeats\": %d, \"batches\": %d, "
      "\"device_tables\": %d, "
      "\"rocksdb_tables\": %d, \"cache_fraction\": %.3f, "
      "\"row_precision\": \"%s\", \"table_host_mib\": %.1f, "
      "\"table_disk_mib\": %.1f, "
      "\"hit_rate\": %.4f, \"prefetch_hits\": %lld, "
      "\"samples_per_s\": %.0f, "
      "\"min\": %.0f, \"max\": %.0f, \"stage_ms\": {",
      f.config.c_str(), DeviceName(model->config().device()),
      PrecisionName(model->dense_precision()), dense::CpuModel().c_str(),
      dense::MatmulIsa(model->dense_precision() == PRECISION_BF16).c_str(),
      static_cast<long long>(max_rows), static_cast<long long>(f.batch),
      omp_get_max_threads(), f.iters, f.repeats, num_batches, device_tables,
      rocksdb_tables,
      rocksdb_tables > 0 ? model->config().rocksdb().cache_fraction() : 1.0,
      row_precision.c_str(), static_cast<double>(table_host_bytes) / 1048576.0,
      static_cast<double>(table_disk_bytes) / 1048576.0, hit_rate,
      static_cast<long long>(timed.prefetch_hits - warm.prefetch_hits), median,
      sorted.front(), sorted.back());
  const double steps = static_cast<double>(f.iters) * f.repeats;
  for (int s = 0; s < model::StageTimes::kNumStages; ++s) {
    std::printf("%s\"%s\": %.3f", s ? ", " : "", model::StageTimes::Name(s),
                1e3 * stages.seconds[s] / steps);
  }
  std::printf("}}\n");
  if (f.roofline) {
    PrintRoofline(f.config, model->config(),
                  model->dense_precision() == PRECISION_BF16, f.batch, batches,
                  stages, steps);
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace dlrm

int main(int argc, char** argv) {
  dlrm::Flags f;
  CLI::App app{"Training throughput of the in-process DLRM step."};
  f.AddTo(app);
  app.add_option("--threads", f.threads, "Threads (0 = all cores)");
  app.add_option("--tables-on-device", f.tables_on_device,
                 "Tables in GPU memory (STORAGE_DEVICE, with --device cuda): "
                 "'all' or names")
      ->delimiter(',');
  app.add_flag("--roofline", f.roofline,
               "Then measure the host's GEMM ceiling at each of the step's "
               "GEMM shapes and its copy bandwidth, and print each stage's "
               "fraction of its ceiling");
  CLI11_PARSE(app, argc, argv);
  return dlrm::ExitStatus(dlrm::Run(f), "dlrm_bench_train");
}
