// dlrm_bench: the "CPU vs one GPU vs DGX" throughput table, reproduced on
// the hardware at hand by driving a real dlrm_server over gRPC. Measures the
// CPU scenarios and, where a GPU is present, the GPU ones (else says why
// they have no number), projects an N-rank accelerator node from measured
// stage times plus a communication model (kept apart from the
// measurements), and writes a table (stdout), a JSON file and a PNG bar
// chart. docs/benchmark.md describes the protocol.
#include <google/protobuf/text_format.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "clients/client.h"
#include "clients/server_process.h"
#include "core/cli_parse.h"
#include "core/config.h"
#include "core/device.h"
#include "core/status.h"
#include "data/rotating_source.h"
#include "data/synthetic.h"
#include "model/model.h"

namespace dlrm {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// Why the GPU rows have no number here; empty when a GPU is present.
std::string GpuRowsUnavailable() {
#if defined(DLRM_WITH_CUDA)
  if (CudaDeviceCount() > 0) return "";
  const std::string reason = CudaUnavailableReason();
  return absl::StrCat(
      "not measured: ",
      reason.rfind("no CUDA device", 0) == 0 ? "" : "no CUDA device: ", reason);
#else
  return "not measured: not built with CUDA";
#endif
}

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

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

std::string JsonQuote(const std::string& s) {
  std::string out = "\"";
  for (const char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += absl::StrFormat("\\u%04x", c);
    } else {
      out += c;
    }
  }
  return out + "\"";
}

std::string JsonNumbers(const std::vector<double>& v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) {
    absl::StrAppend(&out, i ? ", " : "", absl::StrFormat("%.1f", v[i]));
  }
  return out + "]";
}

std::string JsonMap(const std::map<std::string, double>& m) {
  std::string out = "{";
  bool first = true;
  for (const auto& [k, v] : m) {
    absl::StrAppend(&out, first ? "" : ", ", JsonQuote(k), ": ",
                    absl::StrFormat("%.6g", v));
    first = false;
  }
  return out + "}";
}

// Output of `command` (trailing newline removed); empty on failure.
std::string CommandOutput(const std::string& command) {
  FILE* p = popen(command.c_str(), "r");
  if (p == nullptr) return "";
  std::string out;
  char buf[256];
  while (fgets(buf, sizeof(buf), p) != nullptr) out += buf;
  if (pclose(p) != 0) return "";
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) {
    out.pop_back();
  }
  return out;
}

struct Machine {
  std::string cpu_model = "unknown";
  int cores = 0;
  double memory_gib = 0;
  double available_gib = 0;
};

Machine DescribeMachine() {
  Machine m;
  m.cores = static_cast<int>(std::thread::hardware_concurrency());
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);) {
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      if (colon != std::string::npos) m.cpu_model = line.substr(colon + 2);
      break;
    }
  }
  std::ifstream meminfo("/proc/meminfo");
  for (std::string line; std::getline(meminfo, line);) {
    std::istringstream fields(line);
    std::string key;
    double kb = 0;
    fields >> key >> kb;
    if (key == "MemTotal:") m.memory_gib = kb / (1 << 20);
    if (key == "MemAvailable:") m.available_gib = kb / (1 << 20);
  }
  return m;
}

// The config with every table's rows divided by `scale` (rounded up) and
// the cap applied first, so the result needs no max_rows_per_table.
ModelConfig ScaleTables(ModelConfig config, double scale) {
  for (TableConfig& t : *config.mutable_tables()) {
    t.set_rows(std::max<int64_t>(
        1, static_cast<int64_t>(
               std::ceil(static_cast<double>(t.rows()) / scale))));
  }
  config.set_max_rows_per_table(0);
  return config;
}

// A loopback port that was free a moment ago (for the coordinator).
absl::StatusOr<int> FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return absl::InternalError("socket failed");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    close(fd);
    return absl::InternalError("cannot bind a loopback port");
  }
  const int port = ntohs(addr.sin_port);
  close(fd);
  return port;
}

// Prometheus counters of interest: per-stage seconds and steps.
struct StageCounters {
  std::map<std::string, double> stage_seconds;
  double steps = 0;
};

StageCounters ParseMetrics(const std::string& text) {
  StageCounters c;
  std::istringstream lines(text);
  const std::string stage_prefix = "dlrm_train_stage_seconds_total{stage=\"";
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind(stage_prefix, 0) == 0) {
      const size_t end = line.find('"', stage_prefix.size());
      if (end == std::string::npos) continue;
      const std::string stage =
          line.substr(stage_prefix.size(), end - stage_prefix.size());
      c.stage_seconds[stage] = std::atof(line.c_str() + line.rfind(' ') + 1);
    } else if (line.rfind("dlrm_train_steps_total ", 0) == 0) {
      c.steps = std::atof(line.c_str() + line.rfind(' ') + 1);
    }
  }
  return c;
}

// Milliseconds per step of each stage between two scrapes.
std::map<std::string, double> StageMs(const StageCounters& before,
                                      const StageCounters& after) {
  std::map<std::string, double> ms;
  const double steps = after.steps - before.steps;
  if (steps <= 0) return ms;
  for (const auto& [stage, s] : after.stage_seconds) {
    const auto it = before.stage_seconds.find(stage);
    const double s0 = it == before.stage_seconds.end() ? 0 : it->second;
    ms[stage] = 1e3 * (s - s0) / steps;
  }
  return ms;
}

// Runs one server-side synthetic job of `steps` steps and returns its
// samples per second of server wall time (data generation included).
absl::StatusOr<double> RunJob(clients::Client& client, const Flags& f,
                              int steps) {
  JobRequest request;
  request.set_batch_size(f.batch);
  request.set_max_steps(steps);
  request.mutable_train()->mutable_synthetic()->set_zipf_alpha(f.alpha);
  ASSIGN_OR_RETURN(const JobStatus started, client.StartJob(request));
  clients::WaitOptions wait;
  wait.poll_interval_seconds = 0.02;
  ASSIGN_OR_RETURN(const JobStatus done,
                   client.WaitJob(started.id(), wait, nullptr));
  if (done.state() != JobStatus::SUCCEEDED) {
    return absl::InternalError(absl::StrCat("job ", done.id(), " ended ",
                                            JobStatus::State_Name(done.state()),
                                            ": ", done.error()));
  }
  if (done.elapsed_seconds() <= 0) {
    return absl::InternalError("job reported no elapsed time");
  }
  return static_cast<double>(done.samples()) / done.elapsed_seconds();
}

// Warm-up job, then f.repeats measured jobs; `stage_ms` gets the server's
// per-stage times over the measured jobs.
absl::StatusOr<std::vector<double>> MeasureJobs(
    clients::Client& client, const Flags& f,
    std::map<std::string, double>* stage_ms) {
  if (f.warmup > 0) RETURN_IF_ERROR(RunJob(client, f, f.warmup).status());
  ASSIGN_OR_RETURN(const std::string m0, client.GetMetrics());
  std::vector<double> rates;
  for (int r = 0; r < f.repeats; ++r) {
    ASSIGN_OR_RETURN(const double rate, RunJob(client, f, f.steps));
    rates.push_back(rate);
  }
  ASSIGN_OR_RETURN(const std::string m1, client.GetMetrics());
  *stage_ms = StageMs(ParseMetrics(m0), ParseMetrics(m1));
  return rates;
}

absl::StatusOr<std::vector<data::Batch>> MakeBatches(const ModelConfig& config,
                                                     const Flags& f) {
  data::SyntheticOptions options;
  options.zipf_alpha = f.alpha;
  options.teacher_seed = config.seed();
  options.sample_seed = config.seed() + 1;
  ASSIGN_OR_RETURN(std::unique_ptr<data::BatchSource> source,
                   data::MakeSyntheticSource(config, options));
  std::vector<data::Batch> batches(4);
  for (data::Batch& b : batches) {
    ASSIGN_OR_RETURN(const bool more, source->Next(f.batch, &b));
    if (!more) return absl::InternalError("synthetic source ended");
  }
  return batches;
}

// The same steps pushed by this client over one Train stream per
// repetition (client wall time).
absl::StatusOr<std::vector<double>> MeasureStream(
    clients::Client& client, const std::vector<data::Batch>& batches,
    const Flags& f) {
  clients::TrainOptions options;
  options.batch_size = f.batch;
  if (f.warmup > 0) {
    data::RotatingSource warmup(&batches, f.warmup);
    RETURN_IF_ERROR(client.Train(warmup, options, nullptr).status());
  }
  std::vector<double> rates;
  for (int r = 0; r < f.repeats; ++r) {
    data::RotatingSource source(&batches, f.steps);
    ASSIGN_OR_RETURN(const clients::TrainSummary s,
                     client.Train(source, options, nullptr));
    rates.push_back(s.samples_per_second);
  }
  return rates;
}

// The model's step in this process (no server, no gRPC), same batches.
absl::StatusOr<std::vector<double>> MeasureInProcess(
    const ModelConfig& config, const std::vector<data::Batch>& batches,
    const Flags& f) {
  ASSIGN_OR_RETURN(std::unique_ptr<model::Model> model,
                   model::Model::Create(config));
  int64_t step = 0;
  auto run = [&](int n) -> absl::Status {
    for (int i = 0; i < n; ++i) {
      RETURN_IF_ERROR(
          model->TrainStep(batches[step++ % batches.size()]).status());
    }
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(run(f.warmup));
  std::vector<double> rates;
  for (int r = 0; r < f.repeats; ++r) {
    const Clock::time_point t0 = Clock::now();
    RETURN_IF_ERROR(run(f.steps));
    const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    rates.push_back(static_cast<double>(f.batch) * f.steps / dt);
  }
  return rates;
}

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

// Starts the ranks of `launch`, runs `measure` with a client of rank 0,
// then stops every rank (rank 0 first: it tells the followers to exit).
absl::Status WithServers(
    const Flags& f, const Launch& launch,
    const std::function<absl::Status(clients::Client&)>& measure) {
  std::string coordinator;
  if (launch.ranks > 1) {
    ASSIGN_OR_RETURN(const int port, FreePort());
    coordinator = absl::StrCat("127.0.0.1:", port);
  }
  std::vector<std::unique_ptr<clients::ServerProcess>> ranks;
  for (int r = launch.ranks - 1; r >= 0; --r) {
    std::vector<std::string> args = {f.server,
                                     "--listen",
                                     "127.0.0.1:0",
                                     "--metrics-listen",
                                     "",
                                     "--config",
                                     launch.config_path,
                                     "--log-level",
                                     "warn",
                                     "--threads",
                                     std::to_string(launch.threads)};
    args.insert(args.end(), launch.extra_args.begin(), launch.extra_args.end());
    if (launch.ranks > 1) {
      args.insert(args.end(),
                  {"--world-size", std::to_string(launch.ranks), "--rank",
                   std::to_string(r), "--coordinator", coordinator});
    }
    std::vector<std::string> env;
    if (launch.gpu_per_rank) {
      env.push_back(absl::StrCat("CUDA_VISIBLE_DEVICES=", r));
    }
    auto p = std::make_unique<clients::ServerProcess>();
    if (r == 0) {
      RETURN_IF_ERROR(p->Start(args, 120, env));
    } else {
      RETURN_IF_ERROR(p->StartDetached(args, env));
    }
    ranks.push_back(std::move(p));
  }
  clients::ServerProcess& leader = *ranks.back();
  {
    clients::ClientOptions options;
    options.call_timeout_seconds = 0;
    ASSIGN_OR_RETURN(std::unique_ptr<clients::Client> client,
                     clients::Client::Connect(leader.address(), options));
    RETURN_IF_ERROR(measure(*client));
  }
  RETURN_IF_ERROR(leader.Stop());
  for (auto& p : ranks) RETURN_IF_ERROR(p->Stop());
  return absl::OkStatus();
}

// The server-side jobs of MeasureJobs against the servers of `launch`.
absl::StatusOr<std::vector<double>> MeasureLaunch(
    const Flags& f, const Launch& launch,
    std::map<std::string, double>* stage_ms) {
  std::vector<double> rates;
  RETURN_IF_ERROR(WithServers(f, launch, [&](clients::Client& client) {
    ASSIGN_OR_RETURN(rates, MeasureJobs(client, f, stage_ms));
    return absl::OkStatus();
  }));
  return rates;
}

// `config` with the dense part on CUDA and every table in `storage`.
ModelConfig OnGpu(ModelConfig config, StorageTier storage) {
  config.set_device(DEVICE_CUDA);
  for (TableConfig& t : *config.mutable_tables()) {
    t.set_storage(storage);
    t.clear_device_cache_rows();
  }
  return config;
}

// Writes `config` as text to `path`; returns the text.
absl::StatusOr<std::string> WriteConfig(const ModelConfig& config,
                                        const fs::path& path) {
  std::string text;
  google::protobuf::TextFormat::PrintToString(config, &text);
  std::ofstream out(path);
  out << text;
  if (!out) {
    return absl::InternalError(absl::StrCat("cannot write ", path.string()));
  }
  return text;
}

// Projection of an R-rank node (weak scaling: every rank keeps the
// measured local batch) from the measured single-process stage times and
// docs/hybrid.md's bytes per exchange for table-wise tables spread evenly.
Row Project(const ModelConfig& config, const Flags& f, int ranks,
            const std::map<std::string, double>& stage_ms,
            const std::string& hardware) {
  double tables = 0, dims = 0, ids = 0;
  for (const TableConfig& t : config.tables()) {
    tables += 1;
    dims += t.dim();
    // Bags hold k ids (MULTI_HOT_FIXED) or 1..k uniformly: (k + 1) / 2 on
    // average.
    ids += t.multi_hot_distribution() == MULTI_HOT_FIXED
               ? t.multi_hot_size()
               : (t.multi_hot_size() + 1) / 2.0;
  }
  const double r = ranks;
  const double n = static_cast<double>(f.batch);
  const double global = r * n;
  const double remote = 1 - 1 / r;
  const double dense = static_cast<double>(DenseParameterCount(config));
  Row row;
  row.projected = true;
  row.hardware = hardware;
  row.scenario = absl::StrCat(ranks, " ranks hybrid parallel");
  row.feed = "projected from measured stage times";
  row.bytes_per_step = {
      {"lengths", 8 * n * tables * remote},
      {"ids", 8 * n * ids * remote},
      {"pooled", 4 * (dims / r) * (global - n)},
      {"gradients", 4 * n * dims * remote},
      {"dense_allreduce", 2 * remote * 4 * (dense + 1)},
  };
  // Share of a rank's peers on other nodes; their traffic takes the
  // network, the rest NVLink, concurrently.
  const double off =
      ranks > f.ranks_per_node ? (r - f.ranks_per_node) / (r - 1) : 0;
  const double alpha = f.latency_us * 1e-6;
  auto all_to_all = [&](double bytes) {
    return alpha + std::max(bytes * (1 - off) / (f.nvlink_gbps * 1e9),
                            bytes * off / (f.network_gbps * 1e9));
  };
  const double ring_bw = off > 0 ? f.network_gbps * 1e9 : f.nvlink_gbps * 1e9;
  double compute = 0;
  for (const auto& [stage, ms] : stage_ms) compute += ms * 1e-3;
  compute /= f.compute_speedup;
  row.model_ms = {
      {"compute", 1e3 * compute},
      {"input_dist", 1e3 * (all_to_all(row.bytes_per_step["lengths"]) +
                            all_to_all(row.bytes_per_step["ids"]))},
      {"output_dist", 1e3 * all_to_all(row.bytes_per_step["pooled"])},
      {"backward_dist", 1e3 * all_to_all(row.bytes_per_step["gradients"])},
      {"allreduce", 1e3 * (2 * (r - 1) * alpha +
                           row.bytes_per_step["dense_allreduce"] / ring_bw)},
  };
  double step = 0;
  for (const auto& [name, ms] : row.model_ms) step += ms * 1e-3;
  row.model_ms["step"] = 1e3 * step;
  row.samples_per_s = {global / step};
  return row;
}

std::string RateCell(const Row& row) {
  if (!row.note.empty()) return row.note;
  const auto [lo, hi] =
      std::minmax_element(row.samples_per_s.begin(), row.samples_per_s.end());
  if (row.projected) return absl::StrFormat("%.0f", *lo);
  return absl::StrFormat("%.0f [%.0f-%.0f]", Median(row.samples_per_s), *lo,
                         *hi);
}

std::string SpeedupCell(const Row& row, double base) {
  if (!row.note.empty() || base <= 0) return "-";
  return absl::StrFormat("%.2fx", Median(row.samples_per_s) / base);
}

void PrintSection(const std::string& title, const std::vector<Row>& rows,
                  double base) {
  std::printf("\n%s\n\n", title.c_str());
  std::printf(
      "| hardware | scenario | feed | samples/s median [min-max] | speedup "
      "over CPU |\n| --- | --- | --- | ---: | ---: |\n");
  for (const Row& row : rows) {
    std::printf("| %s | %s | %s | %s | %s |\n", row.hardware.c_str(),
                row.scenario.c_str(), row.feed.c_str(), RateCell(row).c_str(),
                SpeedupCell(row, base).c_str());
  }
}

std::string RowJson(const Row& row, double base) {
  std::string out = absl::StrCat("{\"hardware\": ", JsonQuote(row.hardware),
                                 ", \"scenario\": ", JsonQuote(row.scenario),
                                 ", \"feed\": ", JsonQuote(row.feed));
  if (!row.precision.empty()) {
    absl::StrAppend(&out, ", \"precision\": ", JsonQuote(row.precision),
                    ", \"isa\": ", JsonQuote(row.isa));
  }
  if (!row.note.empty()) {
    absl::StrAppend(
        &out, ", \"available\": false, \"note\": ", JsonQuote(row.note), "}");
    return out;
  }
  const auto [lo, hi] =
      std::minmax_element(row.samples_per_s.begin(), row.samples_per_s.end());
  absl::StrAppend(
      &out, absl::StrFormat(", \"samples_per_s\": {\"median\": %.1f, \"min\": "
                            "%.1f, \"max\": %.1f}, \"speedup_over_cpu\": %.4f",
                            Median(row.samples_per_s), *lo, *hi,
                            base > 0 ? Median(row.samples_per_s) / base : 0));
  if (row.projected) {
    absl::StrAppend(&out, ", \"model_ms\": ", JsonMap(row.model_ms),
                    ", \"bytes_per_step\": ", JsonMap(row.bytes_per_step));
  } else {
    absl::StrAppend(&out,
                    ", \"repetitions\": ", JsonNumbers(row.samples_per_s));
  }
  return out + "}";
}

// Writes the bar chart with gnuplot (else python3-matplotlib). Returns the
// PNG path, or FailedPrecondition naming what to install.
absl::StatusOr<std::string> WriteChart(const fs::path& dir,
                                       const std::vector<Row>& measured,
                                       const std::vector<Row>& projected) {
  const fs::path dat = dir / "chart.dat";
  const fs::path png = dir / "dlrm_bench.png";
  {
    std::ofstream out(dat);
    int i = 0;
    auto add = [&](const Row& row, int kind) {
      if (!row.note.empty()) return;
      std::string label = absl::StrCat(row.scenario, "\\n", row.feed);
      std::replace(label.begin(), label.end(), '"', '\'');
      out << i++ << " \"" << label << "\" " << Median(row.samples_per_s) << " "
          << kind << "\n";
    };
    for (const Row& row : measured) add(row, 0);
    for (const Row& row : projected) add(row, 1);
    if (!out)
      return absl::InternalError(absl::StrCat("cannot write ", dat.string()));
  }
  if (!CommandOutput("command -v gnuplot").empty()) {
    const fs::path script = dir / "chart.gp";
    std::ofstream gp(script);
    gp << "set terminal pngcairo size 1200,600 font 'sans,9'\n"
       << "set output '" << png.string() << "'\n"
       << "set title 'dlrm_bench: training samples/s (solid: measured, "
          "hatched: projected)' noenhanced\n"
       << "set ylabel 'samples/s'\nset logscale y\nset grid ytics\n"
       << "set style fill solid 0.8 border -1\nset boxwidth 0.6\n"
       << "set xtics rotate by -25 noenhanced\nset bmargin 9\n"
       << "set key top left\nset rmargin 14\nset offsets 0.5, 0.5, 0, 0\n"
       << "plot '" << dat.string()
       << "' using 1:($4==0?$3:1/0):xtic(2) with boxes lc rgb '#1f77b4' "
          "fs solid 0.8 title 'measured', \\\n  '' using 1:($4==1?$3:1/0) "
          "with boxes lc rgb '#d62728' fs pattern 4 border title "
          "'projected (not measured)'\n";
    gp.close();
    if (std::system(absl::StrCat("gnuplot '", script.string(), "'").c_str()) !=
        0) {
      return absl::InternalError("gnuplot failed (see its message above)");
    }
    return png.string();
  }
  if (std::system("python3 -c 'import matplotlib' >/dev/null 2>&1") == 0) {
    const fs::path script = dir / "chart.py";
    std::ofstream py(script);
    py << "import shlex, matplotlib\nmatplotlib.use('Agg')\n"
       << "import matplotlib.pyplot as plt\nrows = []\n"
       << "for line in open('" << dat.string() << "'):\n"
       << "    i, label, v, k = shlex.split(line)\n"
       << "    rows.append((label.replace('\\\\n', '\\n'), float(v), "
          "int(k)))\n"
       << "fig, ax = plt.subplots(figsize=(12, 6))\n"
       << "for i, (label, v, k) in enumerate(rows):\n"
       << "    ax.bar(i, v, color='#d62728' if k else '#1f77b4', "
          "hatch='//' if k else None, label=['measured', 'projected (not "
          "measured)'][k])\n"
       << "h, l = ax.get_legend_handles_labels()\n"
       << "d = dict(zip(l, h))\nax.legend(d.values(), d.keys())\n"
       << "ax.set_xticks(range(len(rows)))\n"
       << "ax.set_xticklabels([r[0] for r in rows], rotation=25, "
          "ha='right', fontsize=8)\n"
       << "ax.set_yscale('log')\nax.set_ylabel('samples/s')\n"
       << "fig.tight_layout()\nfig.savefig('" << png.string() << "')\n";
    py.close();
    if (std::system(absl::StrCat("python3 '", script.string(), "'").c_str()) !=
        0) {
      return absl::InternalError("python3-matplotlib failed");
    }
    return png.string();
  }
  return absl::FailedPreconditionError(
      "no chart: neither gnuplot nor python3-matplotlib is installed "
      "(apt-get install gnuplot-nox)");
}

absl::Status Run(Flags& f, const std::vector<std::string>& argv) {
  RETURN_IF_ERROR(f.Validate());
  const fs::path self = fs::read_symlink("/proc/self/exe");
  if (f.server.empty()) {
    f.server =
        (self.parent_path().parent_path() / "server" / "dlrm_server").string();
  }
  if (access(f.server.c_str(), X_OK) != 0) {
    return absl::NotFoundError(
        absl::StrCat(f.server, " is not an executable (--server)"));
  }
  const Machine machine = DescribeMachine();
  const int cores = std::max(1, machine.cores);
  const int threads = f.threads > 0 ? f.threads : cores;

  ASSIGN_OR_RETURN(const ModelConfig loaded, LoadModelConfig(f.config));
  ASSIGN_OR_RETURN(const ModelConfig config,
                   NormalizeModelConfig(ScaleTables(loaded, f.table_scale)));
  const int64_t embedding_params = EmbeddingParameterCount(config);
  const double embedding_gib =
      4.0 * static_cast<double>(embedding_params) / (1 << 30);
  // The multi-rank row holds the tables once across its ranks, the
  // in-process row a second copy beside the server's.
  if (machine.available_gib > 0 &&
      embedding_gib * (f.in_process ? 2 : 1) > 0.8 * machine.available_gib) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "the %s tables at --table-scale %g need %.1f GiB of fp32 weights "
        "(x2 with the in-process row); %.1f GiB are available: raise "
        "--table-scale",
        f.config, f.table_scale, embedding_gib, machine.available_gib));
  }

  const fs::path dir = f.out;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", f.out));
  const fs::path config_path = fs::absolute(dir / "model.textproto");
  ASSIGN_OR_RETURN(const std::string config_text,
                   WriteConfig(config, config_path));

  const std::string cpu =
      absl::StrFormat("CPU: %s, %d cores", machine.cpu_model, machine.cores);
  std::vector<Row> measured;
  std::map<std::string, double> stage_ms, rank_stage_ms, gpu_stage_ms,
      gpu_node_stage_ms;
  Launch one_process;
  one_process.config_path = config_path.string();
  one_process.threads = threads;
  RETURN_IF_ERROR(WithServers(f, one_process, [&](clients::Client& client) {
    Row job;
    job.hardware = cpu;
    job.scenario = absl::StrCat("CPU only, 1 process, ", threads, " threads");
    job.feed = "server-side synthetic job";
    ASSIGN_OR_RETURN(job.samples_per_s, MeasureJobs(client, f, &stage_ms));
    ASSIGN_OR_RETURN(const ModelInfo info, client.GetModelInfo());
    job.precision = PrecisionName(info.dense_precision());
    job.isa = info.dense_isa();
    measured.push_back(job);
    if (!f.client_stream && !f.in_process) return absl::OkStatus();
    ASSIGN_OR_RETURN(const std::vector<data::Batch> batches,
                     MakeBatches(config, f));
    if (f.client_stream) {
      Row stream = job;
      stream.feed = "client stream (gRPC Train, loopback)";
      ASSIGN_OR_RETURN(stream.samples_per_s, MeasureStream(client, batches, f));
      measured.push_back(stream);
    }
    if (f.in_process) {
      // The server idles meanwhile: its model sits in memory untouched.
      Row local = job;
      local.feed = "in-process step (no server, no gRPC)";
      ASSIGN_OR_RETURN(local.samples_per_s,
                       MeasureInProcess(config, batches, f));
      measured.push_back(local);
    }
    return absl::OkStatus();
  }));
  if (f.ranks >= 2) {
    Row ranks;
    ranks.hardware = cpu;
    // The same binary, config and host as the one process: the same
    // resolved precision.
    ranks.precision = measured.front().precision;
    ranks.isa = measured.front().isa;
    ranks.scenario =
        absl::StrCat("CPU only, ", f.ranks,
                     " rank processes hybrid parallel (Gloo loopback), ",
                     std::max(1, cores / f.ranks),
                     cores / f.ranks > 1 ? " threads" : " thread", " each");
    ranks.feed = "server-side synthetic job";
    Launch launch = one_process;
    launch.ranks = f.ranks;
    launch.threads = std::max(1, cores / f.ranks);
    ASSIGN_OR_RETURN(ranks.samples_per_s,
                     MeasureLaunch(f, launch, &rank_stage_ms));
    measured.push_back(ranks);
  }
  // The field's two GPU rows: measured where a GPU is present, else a note
  // saying why, never a number.
  Row gpu_host, gpu_node;
  gpu_host.hardware = "1 GPU + host memory";
  gpu_host.scenario = "one GPU (dense part), tables in host memory";
  gpu_node.hardware = "GPU node";
  gpu_node.feed = gpu_host.feed = "server-side synthetic job";
  const std::string unavailable = GpuRowsUnavailable();
  if (!unavailable.empty()) {
    gpu_node.scenario = "8 GPUs hybrid parallel";
    for (Row* row : {&gpu_host, &gpu_node}) {
      row->feed = "-";
      row->note = unavailable;
    }
  } else {
    const int gpus = std::min(8, CudaDeviceCount());
    Launch host = one_process;
    host.config_path = fs::absolute(dir / "model-gpu-host.textproto").string();
    host.gpu_per_rank = true;
    RETURN_IF_ERROR(
        WriteConfig(OnGpu(config, STORAGE_HOST), host.config_path).status());
    ASSIGN_OR_RETURN(gpu_host.samples_per_s,
                     MeasureLaunch(f, host, &gpu_stage_ms));
    Launch node = host;
    node.config_path =
        fs::absolute(dir / "model-gpu-device.textproto").string();
    node.ranks = gpus;
    node.threads = std::max(1, cores / gpus);
    if (gpus > 1) node.extra_args = {"--device-comm", "nccl"};
    RETURN_IF_ERROR(
        WriteConfig(OnGpu(config, STORAGE_DEVICE), node.config_path).status());
    gpu_node.scenario = absl::StrCat(
        gpus, gpus > 1 ? " GPUs hybrid parallel (NCCL), " : " GPU, ",
        "tables in device memory (as the device budget allows)");
    ASSIGN_OR_RETURN(gpu_node.samples_per_s,
                     MeasureLaunch(f, node, &gpu_node_stage_ms));
  }
  measured.push_back(gpu_host);
  measured.push_back(gpu_node);

  std::vector<Row> projected;
  for (const int r : f.project_ranks) {
    const std::string hw = absl::StrFormat(
        "%d ranks x (this CPU's measured step%s), NVLink %g GB/s%s", r,
        f.compute_speedup == 1
            ? ""
            : absl::StrFormat(" / %g", f.compute_speedup).c_str(),
        f.nvlink_gbps,
        r > f.ranks_per_node
            ? absl::StrFormat(", network %g GB/s", f.network_gbps).c_str()
            : "");
    projected.push_back(Project(config, f, r, stage_ms, hw));
  }

  const double base = Median(measured.front().samples_per_s);
  std::printf(
      "dlrm_bench: %s (table scale %g: %lld embedding + %lld dense "
      "parameters), batch %lld, %d x %d steps after %d warm-up\n",
      f.config.c_str(), f.table_scale, static_cast<long long>(embedding_params),
      static_cast<long long>(DenseParameterCount(config)),
      static_cast<long long>(f.batch), f.repeats, f.steps, f.warmup);
  PrintSection("Measured", measured, base);
  PrintSection("Projected (a model, not a measurement: docs/benchmark.md)",
               projected, base);

  std::string chart_json = "null", chart_note;
  if (!f.no_chart) {
    absl::StatusOr<std::string> png = WriteChart(dir, measured, projected);
    if (png.ok()) {
      chart_json = JsonQuote(*png);
      std::printf("\nchart: %s\n", png->c_str());
    } else {
      chart_note = std::string(png.status().message());
      std::fprintf(stderr, "dlrm_bench: %s\n", chart_note.c_str());
    }
  } else {
    chart_note = "--no-chart";
  }

  std::string commit = CommandOutput(absl::StrCat(
      "git -C '", self.parent_path().string(), "' rev-parse HEAD 2>/dev/null"));
  if (commit.empty()) commit = "unknown";
  std::string command;
  for (const std::string& a : argv) absl::StrAppend(&command, " ", a);
  std::string json = absl::StrCat(
      "{\n  \"bench\": \"dlrm_bench\",\n  \"command\": ",
      JsonQuote(command.empty() ? "" : command.substr(1)),
      ",\n  \"git_commit\": ", JsonQuote(commit),
      ",\n  \"machine\": {\"cpu_model\": ", JsonQuote(machine.cpu_model),
      ", \"cores\": ", machine.cores,
      absl::StrFormat(", \"memory_gib\": %.1f}", machine.memory_gib),
      ",\n  \"config\": {\"model\": ", JsonQuote(f.config),
      absl::StrFormat(", \"table_scale\": %g", f.table_scale),
      ", \"embedding_parameters\": ", embedding_params,
      ", \"dense_parameters\": ", DenseParameterCount(config),
      ", \"batch\": ", f.batch, ", \"warmup\": ", f.warmup,
      ", \"steps\": ", f.steps, ", \"repeats\": ", f.repeats,
      absl::StrFormat(", \"zipf_alpha\": %g", f.alpha),
      ", \"threads\": ", threads, ", \"ranks\": ", f.ranks,
      ", \"model_config\": ", JsonQuote(config_text), "}",
      ",\n  \"measured\": [");
  for (size_t i = 0; i < measured.size(); ++i) {
    absl::StrAppend(&json, i ? ",\n    " : "\n    ",
                    RowJson(measured[i], base));
  }
  absl::StrAppend(
      &json, "\n  ],\n  \"stage_ms\": {\"one_process\": ", JsonMap(stage_ms),
      ", \"rank0_of_multi_rank\": ", JsonMap(rank_stage_ms),
      ", \"gpu_host_memory\": ", JsonMap(gpu_stage_ms),
      ", \"rank0_of_gpu_node\": ", JsonMap(gpu_node_stage_ms), "}");
  absl::StrAppend(
      &json,
      absl::StrFormat(",\n  \"projected\": {\"parameters\": {\"nvlink_gbps\": "
                      "%g, \"network_gbps\": %g, \"latency_us\": %g, "
                      "\"ranks_per_node\": %d, \"compute_speedup\": %g}, "
                      "\"rows\": [",
                      f.nvlink_gbps, f.network_gbps, f.latency_us,
                      f.ranks_per_node, f.compute_speedup));
  for (size_t i = 0; i < projected.size(); ++i) {
    absl::StrAppend(&json, i ? ",\n    " : "\n    ",
                    RowJson(projected[i], base));
  }
  absl::StrAppend(&json, "\n  ]},\n  \"chart\": ", chart_json,
                  ",\n  \"chart_note\": ", JsonQuote(chart_note), "\n}\n");
  const fs::path json_path = dir / "dlrm_bench.json";
  std::ofstream out(json_path);
  out << json;
  if (!out)
    return absl::InternalError(
        absl::StrCat("cannot write ", json_path.string()));
  std::printf("json: %s\n", json_path.c_str());
  return absl::OkStatus();
}

}  // namespace
}  // namespace dlrm

int main(int argc, char** argv) {
  dlrm::Flags f;
  CLI::App app{
      "Throughput table (CPU, one GPU, GPU node) through a real dlrm_server: "
      "measured CPU scenarios, projected multi-rank node, JSON and chart."};
  app.add_option("--server", f.server,
                 "dlrm_server binary (default: ../server/dlrm_server next to "
                 "this binary)");
  dlrm::AddConfigFlag(app, &f.config, dlrm::PresetNames(), "")
      ->capture_default_str();
  app.add_option("--table-scale", f.table_scale,
                 "Divide every table's rows by this (per-sample work stays)")
      ->capture_default_str();
  app.add_option(dlrm::kBatchFlag, f.batch, "Samples per step (per rank)")
      ->capture_default_str();
  app.add_option("--warmup", f.warmup, "Untimed steps per scenario")
      ->capture_default_str();
  app.add_option(dlrm::kStepsFlag, f.steps, "Timed steps per repetition")
      ->capture_default_str();
  app.add_option("--repeats", f.repeats, "Repetitions per scenario")
      ->capture_default_str();
  app.add_option(dlrm::kAlphaFlag, f.alpha, "Zipf exponent of synthetic ids")
      ->capture_default_str();
  app.add_option("--threads", f.threads,
                 "Threads of the 1-process server (0 = all cores)")
      ->capture_default_str();
  app.add_option("--ranks", f.ranks,
                 "Rank processes of the multi-rank CPU row (0 = skip)")
      ->capture_default_str();
  app.add_flag("!--no-client-stream", f.client_stream,
               "Skip the client-stream row");
  app.add_flag("!--no-in-process", f.in_process, "Skip the in-process row");
  app.add_option("--project-ranks", f.project_ranks,
                 "Projected node sizes, e.g. 8,16")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--ranks-per-node", f.ranks_per_node,
                 "Projection: ranks sharing NVLink")
      ->capture_default_str();
  app.add_option("--nvlink-gbps", f.nvlink_gbps,
                 "Projection: NVLink GB/s per rank and direction")
      ->capture_default_str();
  app.add_option("--network-gbps", f.network_gbps,
                 "Projection: network GB/s per rank and direction")
      ->capture_default_str();
  app.add_option("--latency-us", f.latency_us,
                 "Projection: latency per collective, microseconds")
      ->capture_default_str();
  app.add_option("--compute-speedup", f.compute_speedup,
                 "Projection: a rank computes this much faster than the "
                 "measured process")
      ->capture_default_str();
  app.add_option("--out", f.out, "Output directory")->capture_default_str();
  app.add_flag("--no-chart", f.no_chart, "Do not draw the chart");
  CLI11_PARSE(app, argc, argv);
  const absl::Status s =
      dlrm::Run(f, std::vector<std::string>(argv, argv + argc));
  if (!s.ok()) {
    std::fprintf(stderr, "dlrm_bench: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
