// The embedding kernels alone on a config's tables (dlrm_bench_embedding):
// the pooled lookup and the fused sparse update of every table (a
// HostStore each) on one synthetic batch, called as the model calls them
// (the lookup an OpenMP loop over the tables, each table on one thread, the
// biggest first; the update embedding::UpdateStores, a big table's rows
// shared among the threads), against the copy
// bandwidth measured in the same run, with the bytes counted as
// dlrm_bench_train --roofline counts them (bench/roofline.h
// StepEmbeddingBytes). Prints one JSON line.
#include <omp.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "bench/roofline.h"
#include "core/cli_parse.h"
#include "core/config.h"
#include "core/random.h"
#include "core/status.h"
#include "data/synthetic.h"
#include "embedding/embedding_store.h"
#include "embedding/store_update.h"

namespace dlrm {
namespace {

struct Flags {
  std::string config = "mlperf-dlrm-dcnv2";
  int64_t rows = 100000;
  int64_t batch = 2048;
  int repeats = 5;
  int threads = 0;
  double alpha = 1.05;
  std::string update = "split";
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

absl::Status Run(const Flags& f) {
  ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(f.config));
  if (f.rows > 0) {
    for (auto& t : *config.mutable_tables()) t.set_rows(f.rows);
    config.set_max_rows_per_table(0);
    ASSIGN_OR_RETURN(config, NormalizeModelConfig(config));
  }
  if (f.threads > 0) omp_set_num_threads(f.threads);
  const int num_tables = config.tables_size();
  std::vector<std::unique_ptr<embedding::HostStore>> tables;
  std::vector<int64_t> column(num_tables + 1, 0);
  for (int k = 0; k < num_tables; ++k) {
    const TableConfig& t = config.tables(k);
    embedding::TableSpec spec;
    spec.table_index = k;
    spec.rows = t.rows();
    spec.dim = t.dim();
    spec.pooling = t.pooling();
    spec.optimizer = config.sparse_optimizer();
    spec.seed = config.seed();
    RETURN_IF_ERROR(spec.Validate());
    tables.push_back(std::make_unique<embedding::HostStore>(spec));
    column[k + 1] = column[k] + t.dim();
  }
  const int64_t width = column[num_tables];
  data::SyntheticOptions so;
  so.zipf_alpha = f.alpha;
  ASSIGN_OR_RETURN(auto source, data::MakeSyntheticSource(config, so));
  data::Batch batch;
  ASSIGN_OR_RETURN(bool more, source->Next(f.batch, &batch));
  if (!more) return absl::InternalError("synthetic source ended");
  std::vector<float> pooled(f.batch * width), grad(f.batch * width);
  Rng rng(7);
  for (float& g : grad) g = static_cast<float>(1e-3 * rng.Normal());

  auto seconds = [](auto t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
        .count();
  };
  // CPU seconds of the process (all threads): steadier than wall time on a
  // shared machine, where other tenants take the cores away.
  auto cpu = [] {
    timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
  };
  // Each OpenMP thread's CPU seconds: the most any thread spent in a stage
  // is its critical path on a host with a core per thread, whatever the
  // other tenants take (waits at barriers count as CPU time too unless
  // OMP_WAIT_POLICY=passive makes them sleep).
  const int max_threads = omp_get_max_threads();
  auto thread_cpu = [max_threads](std::vector<double>& out) {
    out.assign(max_threads, 0.0);
#pragma omp parallel
    {
      timespec t;
      clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
      out[omp_get_thread_num()] = t.tv_sec + 1e-9 * t.tv_nsec;
    }
  };
  std::vector<double> threads0, threads1;
  // The tables handed out most work first, as the model's lookup hands out
  // its shards (Model::OrderShardsByWork).
  std::vector<int> by_work(num_tables);
  for (int k = 0; k < num_tables; ++k) by_work[k] = k;
  std::stable_sort(by_work.begin(), by_work.end(), [&](int a, int b) {
    return static_cast<int64_t>(batch.sparse[a].ids.size()) *
               config.tables(a).dim() >
           static_cast<int64_t>(batch.sparse[b].ids.size()) *
               config.tables(b).dim();
  });
  std::vector<double> lookup_s, update_s, lookup_cpu, update_cpu,
      update_thread_max;
  for (int r = 0; r < f.repeats + 1; ++r) {
    const double c0 = cpu();
    auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel for schedule(dynamic, 1)
    for (int i = 0; i < num_tables; ++i) {
      const int k = by_work[i];
      tables[k]->table().Forward(batch.sparse[k], pooled.data() + column[k],
                                 width);
    }
    const double lookup = seconds(t0);
    thread_cpu(threads0);
    const double c1 = cpu();
    t0 = std::chrono::steady_clock::now();
    if (f.update == "tables") {
#pragma omp parallel for schedule(dynamic, 1)
      for (int i = 0; i < num_tables; ++i) {
        const int k = by_work[i];
        tables[k]->table().BackwardUpdate(batch.sparse[k],
                                          grad.data() + column[k], width);
      }
    } else {
      std::vector<embedding::StoreUpdate> updates(num_tables);
      for (int k = 0; k < num_tables; ++k) {
        updates[k] = {tables[k].get(), &batch.sparse[k],
                      grad.data() + column[k], width, absl::OkStatus()};
      }
      embedding::UpdateStores(updates);
      for (const embedding::StoreUpdate& u : updates) {
        RETURN_IF_ERROR(u.status);
      }
    }
    const double update = seconds(t0);
    const double c2 = cpu();
    thread_cpu(threads1);
    double most = 0.0;
    for (int t = 0; t < max_threads; ++t) {
      most = std::max(most, threads1[t] - threads0[t]);
    }
    if (r > 0) {  // The first call of each sizes its scratch.
      lookup_s.push_back(lookup);
      update_s.push_back(update);
      lookup_cpu.push_back(c1 - c0);
      update_cpu.push_back(c2 - c1);
      update_thread_max.push_back(most);
    }
  }
  const double copy = bench::CopyBandwidth(int64_t{256} << 20, 5);
  const bench::EmbeddingBytes bytes = bench::StepEmbeddingBytes(config, batch);
  const double lookup = Median(lookup_s), update = Median(update_s);
  std::fprintf(stderr,
               "%s: copy %.1f GB/s; lookup %.3f ms (%.1f GB/s, %.2f of copy); "
               "update %.3f ms (%.1f GB/s, %.2f of copy); CPU ms: lookup "
               "%.3f, update %.3f (most on one thread %.3f)\n",
               f.config.c_str(), copy * 1e-9, lookup * 1e3,
               bytes.lookup / lookup * 1e-9, bytes.lookup / lookup / copy,
               update * 1e3, bytes.update / update * 1e-9,
               bytes.update / update / copy, Median(lookup_cpu) * 1e3,
               Median(update_cpu) * 1e3, Median(update_thread_max) * 1e3);
  std::printf(
      "{\"bench\": \"embedding\", \"config\": \"%s\", \"rows\": %lld, "
      "\"batch\": %lld, \"threads\": %d, \"copy_gb_s\": %.2f, "
      "\"lookup_ms\": %.3f, \"lookup_fraction\": %.3f, \"update_ms\": %.3f, "
      "\"update_fraction\": %.3f, \"lookup_cpu_ms\": %.3f, "
      "\"update_cpu_ms\": %.3f, \"update_thread_max_cpu_ms\": %.3f, "
      "\"update_loop\": \"%s\"}\n",
      f.config.c_str(), static_cast<long long>(f.rows),
      static_cast<long long>(f.batch), omp_get_max_threads(), copy * 1e-9,
      lookup * 1e3, bytes.lookup / lookup / copy, update * 1e3,
      bytes.update / update / copy, Median(lookup_cpu) * 1e3,
      Median(update_cpu) * 1e3, Median(update_thread_max) * 1e3,
      f.update.c_str());
  return absl::OkStatus();
}

}  // namespace
}  // namespace dlrm

int main(int argc, char** argv) {
  dlrm::Flags f;
  CLI::App app{
      "The embedding lookup and update kernels against copy bandwidth."};
  dlrm::AddDefaulted(app, "--config", f.config, "Preset name or config file");
  dlrm::AddDefaulted(app, "--rows", f.rows,
                     "Rows of every table (0: the config's)");
  dlrm::AddDefaulted(app, "--batch", f.batch, "Samples");
  dlrm::AddDefaulted(app, "--repeats", f.repeats,
                     "Timed calls (median reported)");
  app.add_option("--threads", f.threads, "Threads (0 = all cores)");
  dlrm::AddDefaulted(app, "--alpha", f.alpha, "Zipf exponent of ids");
  dlrm::AddDefaulted(app, "--update", f.update,
                     "split: embedding::UpdateStores, as the model; tables: "
                     "each table's whole BackwardUpdate on a loop over the "
                     "tables, most work first (the model before it)")
      ->check(CLI::IsMember({"split", "tables"}));
  CLI11_PARSE(app, argc, argv);
  const absl::Status s = dlrm::Run(f);
  if (!s.ok()) {
    std::fprintf(stderr, "%s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
