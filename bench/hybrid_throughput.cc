// dlrm_bench_hybrid: training samples/s of the hybrid-parallel step on N
// rank processes of this machine (Gloo over loopback), with per-stage times
// and the bytes each exchange moved, next to what docs/hybrid.md's formula
// predicts. The binary re-executes itself as the ranks. With
// --tables-on-rocksdb, tables live on RocksDB behind per-shard caches (each
// rank its own database under --rocksdb-dir/rank_<r>).
#include <omp.h>
#include <spawn.h>
#include <sys/wait.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "bench/step_flags.h"
#include "comm/coordinator.h"
#include "comm/gloo_communicator.h"
#include "core/cli_parse.h"
#include "core/config.h"
#include "core/dense_flags.h"
#include "core/status.h"
#include "core/storage_flags.h"
#include "data/synthetic.h"
#include "dense/cpu_isa.h"
#include "embedding/sharding.h"
#include "model/model.h"

extern char** environ;

namespace dlrm {
namespace {

// The step flags (bench/step_flags.h; fewer steps by default: every rank
// is a process of its own) and the ranks'.
struct Flags : bench::StepFlags {
  Flags() {
    warmup = 3;
    iters = 20;
    repeats = 3;
  }
  int ranks = 2;
  int threads_per_rank = 0;
  // All-reduce dense gradients on a second communicator, overlapped with
  // the backward pass.
  bool overlap = false;
  // Set on the rank processes only.
  int rank = -1;
  std::string coordinator;
};

absl::Status RunRank(const Flags& f) {
  if (f.threads_per_rank > 0) omp_set_num_threads(f.threads_per_rank);
  ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(f.config));
  RETURN_IF_ERROR(f.dense.Apply(&config));
  if (f.rows > 0) {
    // Also lifts the preset's max_rows_per_table, which normalising the
    // config again (PlaceTablesOnRocksDb) would otherwise reapply.
    config.set_max_rows_per_table(0);
    for (auto& t : *config.mutable_tables()) t.set_rows(f.rows);
  }
  RETURN_IF_ERROR(f.storage.Apply(&config));
  embedding::PlannerOptions po;
  po.world_size = f.ranks;
  ASSIGN_OR_RETURN(embedding::ShardingPlan plan,
                   embedding::PlanSharding(config, po));
  // The tiers the model will choose (it plans the same when created).
  ASSIGN_OR_RETURN(config, embedding::ApplyMemoryBudgets(config, &plan));
  const int rocksdb_tables = static_cast<int>(std::count_if(
      config.tables().begin(), config.tables().end(),
      [](const TableConfig& t) { return t.storage() == STORAGE_ROCKSDB; }));
  if (f.rank == 0) std::fprintf(stderr, "%s", plan.ToString(config).c_str());
  comm::GlooOptions go;
  go.rank = f.rank;
  go.world_size = f.ranks;
  go.coordinator_address = f.coordinator;
  go.job_id = "bench";
  ASSIGN_OR_RETURN(auto comm, comm::ConnectGloo(go));
  std::unique_ptr<comm::Communicator> dense_comm;
  if (f.overlap) {
    go.job_id = "bench-dense";
    ASSIGN_OR_RETURN(dense_comm, comm::ConnectGloo(go));
  }
  ASSIGN_OR_RETURN(auto model, model::Model::Create(config, plan, comm.get(),
                                                    dense_comm.get()));
  data::SyntheticOptions so;
  so.zipf_alpha = f.alpha;
  so.vocabulary = f.vocabulary;
  so.drift = f.drift;
  ASSIGN_OR_RETURN(auto source, data::MakeSyntheticSource(config, so));
  const int kBatches = std::max(1, f.batches);
  const bool prefetch = f.prefetch && rocksdb_tables > 0;
  std::vector<data::Batch> local(kBatches);
  std::vector<int64_t> sizes(f.ranks);
  for (int r = 0; r < f.ranks; ++r) {
    sizes[r] = f.batch * (r + 1) / f.ranks - f.batch * r / f.ranks;
  }
  for (auto& b : local) {
    data::Batch global;
    ASSIGN_OR_RETURN(bool more, source->Next(f.batch, &global));
    if (!more) return absl::InternalError("synthetic source ended");
    global.Slice(f.batch * f.rank / f.ranks, f.batch * (f.rank + 1) / f.ranks,
                 &b);
  }
  // The ranks start each round together.
  ASSIGN_OR_RETURN(
      bench::StepTimings run,
      bench::RunTimedSteps(*model, local, prefetch, f.warmup, f.repeats,
                           f.iters, f.batch, [&] { return comm->Barrier(); }));
  if (f.rank != 0) return absl::OkStatus();
  std::vector<double>& rates = run.rates;
  const model::StageTimes& total = run.times;
  const embedding::StoreMetrics& warm = run.warm;
  const embedding::StoreMetrics& timed = run.timed;
  const int64_t lookups =
      (timed.hits - warm.hits) + (timed.misses - warm.misses);
  std::sort(rates.begin(), rates.end());
  const double steps = static_cast<double>(f.iters) * f.repeats;
  std::printf(
      "{\"bench\": \"dlrm-server-hybrid-cpu\", \"config\": \"%s\", "
      "\"device\": \"%s\", \"precision\": \"%s\", \"cpu\": \"%s\", "
      "\"isa\": \"%s\", \"tf32\": %s, "
      "\"rows\": %lld, \"batch\": %lld, \"ranks\": %d, "
      "\"threads_per_rank\": %d, \"overlap\": %s, \"iters\": %d, "
      "\"repeats\": %d, \"batches\": %d, \"rocksdb_tables\": %d, "
      "\"cache_fraction\": %.3f, \"prefetch\": %s, "
      "\"rank0_hit_rate\": %.4f, \"rank0_prefetch_hits\": %lld, "
      "\"samples_per_s\": %.0f, \"min\": %.0f, \"max\": %.0f, "
      "\"stage_ms\": {",
      f.config.c_str(), DeviceName(config.device()),
      PrecisionName(model->dense_precision()), dense::CpuModel().c_str(),
      dense::MatmulIsa(model->dense_precision() == PRECISION_BF16).c_str(),
      config.gpu_disable_tf32() ? "false" : "true",
      static_cast<long long>(f.rows), static_cast<long long>(f.batch), f.ranks,
      omp_get_max_threads(), f.overlap ? "true" : "false", f.iters, f.repeats,
      kBatches, rocksdb_tables,
      rocksdb_tables > 0 ? config.rocksdb().cache_fraction() : 1.0,
      prefetch ? "true" : "false",
      lookups > 0 ? static_cast<double>(timed.hits - warm.hits) / lookups : 0.0,
      static_cast<long long>(timed.prefetch_hits - warm.prefetch_hits),
      rates[rates.size() / 2], rates.front(), rates.back());
  for (int s = 0; s < model::StageTimes::kNumStages; ++s) {
    std::printf("%s\"%s\": %.3f", s ? ", " : "", model::StageTimes::Name(s),
                1e3 * total.seconds[s] / steps);
  }
  // Rank 0's bytes per step against the formula, averaged over the local
  // batches the timed steps cycled through.
  std::array<int64_t, model::StageTimes::kNumExchanges> predicted{};
  for (int64_t i = 0; i < f.iters * f.repeats; ++i) {
    const auto p = model::PredictedExchangeBytes(
        config, plan, local[(f.warmup + i) % kBatches], sizes, f.rank,
        prefetch ? &local[(f.warmup + i + 1) % kBatches] : nullptr);
    for (size_t e = 0; e < p.size(); ++e) predicted[e] += p[e];
  }
  std::printf("}, \"bytes_per_step\": {");
  for (int e = 0; e < model::StageTimes::kNumExchanges; ++e) {
    std::printf("%s\"%s\": [%.0f, %.0f]", e ? ", " : "",
                model::StageTimes::ExchangeName(e), total.bytes_sent[e] / steps,
                predicted[e] / steps);
  }
  std::printf("}}\n");
  return absl::OkStatus();
}

// The parent: a coordinator and N rank processes of this same binary.
absl::Status RunParent(const Flags& f, const std::vector<std::string>& args) {
  ASSIGN_OR_RETURN(auto coordinator, comm::CoordinatorServer::Start(
                                         comm::CoordinatorServerOptions{}));
  const std::string self = std::filesystem::read_symlink("/proc/self/exe");
  std::vector<pid_t> pids;
  for (int r = 0; r < f.ranks; ++r) {
    std::vector<std::string> argv_s = args;
    argv_s[0] = self;
    argv_s.insert(argv_s.end(), {"--rank", std::to_string(r), "--coordinator",
                                 coordinator->address()});
    std::vector<char*> argv;
    for (auto& s : argv_s) argv.push_back(s.data());
    argv.push_back(nullptr);
    pid_t pid;
    if (posix_spawn(&pid, argv[0], nullptr, nullptr, argv.data(), environ) !=
        0) {
      return absl::InternalError("cannot start rank process");
    }
    pids.push_back(pid);
  }
  bool ok = true;
  for (pid_t pid : pids) {
    int status = 0;
    waitpid(pid, &status, 0);
    ok = ok && WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }
  return ok ? absl::OkStatus() : absl::InternalError("a rank failed");
}

}  // namespace
}  // namespace dlrm

int main(int argc, char** argv) {
  dlrm::Flags f;
  CLI::App app{"Training throughput of the hybrid-parallel step on N ranks."};
  f.AddTo(app);
  dlrm::AddDefaulted(app, "--ranks", f.ranks, "Rank processes");
  app.add_option("--threads-per-rank", f.threads_per_rank,
                 "OpenMP threads per rank (0 = all cores / ranks)");
  app.add_flag("--overlap", f.overlap,
               "All-reduce dense gradients on a second communicator, "
               "overlapped with the backward pass");
  app.add_option("--rank", f.rank, "(internal) this process's rank");
  app.add_option("--coordinator", f.coordinator, "(internal) coordinator");
  CLI11_PARSE(app, argc, argv);
  if (f.threads_per_rank == 0) {
    f.threads_per_rank = std::max(1, omp_get_num_procs() / f.ranks);
  }
  return dlrm::ExitStatus(
      f.rank >= 0
          ? dlrm::RunRank(f)
          : dlrm::RunParent(f, std::vector<std::string>(argv, argv + argc)),
      "dlrm_bench_hybrid");
}
