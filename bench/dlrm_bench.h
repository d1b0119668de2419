// dlrm_bench's parts (docs/benchmark.md): its flags, the table's rows,
// the measured rows' server launches and measurements
// (dlrm_bench_measure.cc), the projection of an accelerator node
// (dlrm_bench_project.cc), and the table, JSON and chart
// (dlrm_bench_report.cc). dlrm_bench_main.cc runs the scenarios.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "clients/client.h"
#include "data/batch.h"
#include "dlrm/config.pb.h"

namespace dlrm::bench {

struct Flags {
  // dlrm_server binary. Default: ../server/dlrm_server next to this binary.
  std::string server;
  // Preset or text-format ModelConfig file. Default: kaggle.
  std::string config = "kaggle";
  // Every table's rows are divided by this (rounded up, at least 1); ids
  // per bag, dims and MLPs stay, so per-sample work is unchanged.
  // Default: 1.
  double table_scale = 1;
  // Samples per step (per rank in the projection). Default: 2048.
  int64_t batch = 2048;
  // Untimed steps before the measured ones, per scenario. Default: 5.
  int warmup = 5;
  // Timed steps per repetition. Default: 30.
  int steps = 30;
  // Repetitions per scenario (median, min, max reported). Default: 5.
  int repeats = 5;
  // Zipf exponent of the synthetic ids. Default: 1.05.
  double alpha = 1.05;
  // Compute threads of the single-process server. 0 = all cores.
  int threads = 0;
  // Rank processes of the multi-rank CPU row; 0 skips it. Default: 2.
  int ranks = 2;
  // Optional rows.
  bool client_stream = true;
  bool in_process = true;
  // Projection: ranks per projected node list, link bandwidths (GB/s, one
  // direction per rank), per-collective latency, and how much faster a
  // projected rank computes than the measured process (1 = as fast).
  std::vector<int> project_ranks = {8};
  int ranks_per_node = 8;
  double nvlink_gbps = 300;
  double network_gbps = 25;
  double latency_us = 10;
  double compute_speedup = 1;
  // Output directory for dlrm_bench.json, dlrm_bench.png and the chart's
  // inputs. Default: bench-out.
  std::string out = "bench-out";
  // Skip the chart (the JSON says so).
  bool no_chart = false;

  absl::Status Validate() const {
    if (!(table_scale >= 1) || batch <= 0 || steps <= 0 || repeats <= 0 ||
        warmup < 0 || threads < 0 || ranks < 0 || ranks == 1 ||
        ranks_per_node <= 0 || !(nvlink_gbps > 0) || !(network_gbps > 0) ||
        latency_us < 0 || !(compute_speedup > 0)) {
      return absl::InvalidArgumentError(
          "need --table-scale >= 1; --batch, --steps, --repeats, "
          "--ranks-per-node, bandwidths and --compute-speedup > 0; "
          "--warmup, --threads, --latency-us >= 0; --ranks 0 or >= 2");
    }
    for (const int r : project_ranks) {
      if (r < 2) {
        return absl::InvalidArgumentError(
            absl::StrCat("--project-ranks values must be >= 2, got ", r));
      }
    }
    return absl::OkStatus();
  }
};

// One row of the table: measured (repetitions filled), unavailable (note
// set) or projected (one value, `projected` true).
struct Row {
  std::string hardware;
  std::string scenario;
  std::string feed;
  // The precision the server's dense part ran at and its oneDNN matmul
  // implementation (ModelInfo's dense_precision, dense_isa); empty for a
  // row not measured here.
  std::string precision, isa;
  std::vector<double> samples_per_s;
  bool projected = false;
  std::string note;
  // Projection only: per-step model of the row.
  std::map<std::string, double> model_ms;
  std::map<std::string, double> bytes_per_step;
};

// How the servers of one measured row start.
struct Launch {
  // The model config file they load.
  std::string config_path;
  // Rank processes: 1 is one process, no coordinator; more run hybrid
  // parallel, rank 0 serving.
  int ranks = 1;
  // Compute threads of each process.
  int threads = 1;
  // More dlrm_server flags, e.g. --device-comm nccl.
  std::vector<std::string> extra_args;
  // Rank r sees only GPU r (CUDA_VISIBLE_DEVICES=r): one GPU per process.
  bool gpu_per_rank = false;
};

// The host: CPU model, cores, memory (from /proc).
struct Machine {
  std::string cpu_model = "unknown";
  int cores = 0;
  double memory_gib = 0;
  double available_gib = 0;
};

Machine DescribeMachine();

// Output of `command` (trailing newline removed); empty on failure.
std::string CommandOutput(const std::string& command);

// Measurement (dlrm_bench_measure.cc).

// Four synthetic batches of f.batch samples of `config`'s shape.
absl::StatusOr<std::vector<data::Batch>> MakeBatches(const ModelConfig& config,
                                                     const Flags& f);
// Warm-up job, then f.repeats measured jobs; `stage_ms` gets the server's
// per-stage times over the measured jobs.
absl::StatusOr<std::vector<double>> MeasureJobs(
    clients::Client& client, const Flags& f,
    std::map<std::string, double>* stage_ms);
// The same steps pushed by this client over one Train stream per
// repetition (client wall time).
absl::StatusOr<std::vector<double>> MeasureStream(
    clients::Client& client, const std::vector<data::Batch>& batches,
    const Flags& f);
// The model's step in this process (no server, no gRPC), same batches.
absl::StatusOr<std::vector<double>> MeasureInProcess(
    const ModelConfig& config, const std::vector<data::Batch>& batches,
    const Flags& f);
// Starts the ranks of `launch`, runs `measure` with a client of rank 0,
// then stops every rank (rank 0 first: it tells the followers to exit).
absl::Status WithServers(
    const Flags& f, const Launch& launch,
    const std::function<absl::Status(clients::Client&)>& measure);
// The server-side jobs of MeasureJobs against the servers of `launch`.
absl::StatusOr<std::vector<double>> MeasureLaunch(
    const Flags& f, const Launch& launch,
    std::map<std::string, double>* stage_ms);

// Projection of an R-rank node (dlrm_bench_project.cc): weak scaling, every
// rank keeping the measured local batch, from the measured single-process
// stage times and docs/hybrid.md's bytes per exchange for table-wise
// tables spread evenly.
Row Project(const ModelConfig& config, const Flags& f, int ranks,
            const std::map<std::string, double>& stage_ms,
            const std::string& hardware);

// Report (dlrm_bench_report.cc).

// `s` as a JSON string literal.
std::string JsonQuote(const std::string& s);
// `m` as a JSON object of numbers.
std::string JsonMap(const std::map<std::string, double>& m);
// Prints a markdown table of `rows` under `title`, with each row's speedup
// over `base` samples/s.
void PrintSection(const std::string& title, const std::vector<Row>& rows,
                  double base);
// `row` as a JSON object, its speedup over `base`.
std::string RowJson(const Row& row, double base);
// Writes the bar chart with gnuplot (else python3-matplotlib). Returns the
// PNG path, or FailedPrecondition naming what to install.
absl::StatusOr<std::string> WriteChart(const std::filesystem::path& dir,
                                       const std::vector<Row>& measured,
                                       const std::vector<Row>& projected);

}  // namespace dlrm::bench
