// dlrm_bench: the "CPU vs one GPU vs DGX" throughput table, reproduced on
// the hardware at hand by driving a real dlrm_server over gRPC. Measures the
// CPU scenarios and, where a GPU is present, the GPU ones (else says why
// they have no number), projects an N-rank accelerator node from measured
// stage times plus a communication model (kept apart from the
// measurements), and writes a table (stdout), a JSON file and a PNG bar
// chart. docs/benchmark.md describes the protocol.
// The scenarios run here; their parts are in bench/dlrm_bench.h.
#include <google/protobuf/text_format.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/bench_util.h"
#include "bench/dlrm_bench.h"
#include "core/cli_parse.h"
#include "core/config.h"
#include "core/device.h"
#include "core/status.h"

namespace dlrm::bench {
namespace {

namespace fs = std::filesystem;

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
}  // namespace dlrm::bench

int main(int argc, char** argv) {
  dlrm::bench::Flags f;
  CLI::App app{
      "Throughput table (CPU, one GPU, GPU node) through a real dlrm_server: "
      "measured CPU scenarios, projected multi-rank node, JSON and chart."};
  app.add_option("--server", f.server,
                 "dlrm_server binary (default: ../server/dlrm_server next to "
                 "this binary)");
  dlrm::AddConfigFlag(app, &f.config, dlrm::PresetNames(), "")
      ->capture_default_str();
  dlrm::AddDefaulted(
      app, "--table-scale", f.table_scale,
      "Divide every table's rows by this (per-sample work stays)");
  dlrm::AddDefaulted(app, dlrm::kBatchFlag, f.batch,
                     "Samples per step (per rank)");
  dlrm::AddDefaulted(app, "--warmup", f.warmup, "Untimed steps per scenario");
  dlrm::AddDefaulted(app, dlrm::kStepsFlag, f.steps,
                     "Timed steps per repetition");
  dlrm::AddDefaulted(app, "--repeats", f.repeats, "Repetitions per scenario");
  dlrm::AddDefaulted(app, dlrm::kAlphaFlag, f.alpha,
                     "Zipf exponent of synthetic ids");
  dlrm::AddDefaulted(app, "--threads", f.threads,
                     "Threads of the 1-process server (0 = all cores)");
  dlrm::AddDefaulted(app, "--ranks", f.ranks,
                     "Rank processes of the multi-rank CPU row (0 = skip)");
  app.add_flag("!--no-client-stream", f.client_stream,
               "Skip the client-stream row");
  app.add_flag("!--no-in-process", f.in_process, "Skip the in-process row");
  dlrm::AddDefaulted(app, "--project-ranks", f.project_ranks,
                     "Projected node sizes, e.g. 8,16")
      ->delimiter(',');
  dlrm::AddDefaulted(app, "--ranks-per-node", f.ranks_per_node,
                     "Projection: ranks sharing NVLink");
  // The projection's links and compute (docs/benchmark.md).
  using Parameter = std::tuple<const char*, double*, const char*>;
  for (const auto& [name, value, help] : {
           Parameter{"--nvlink-gbps", &f.nvlink_gbps,
                     "NVLink GB/s per rank and direction"},
           Parameter{"--network-gbps", &f.network_gbps,
                     "network GB/s per rank and direction"},
           Parameter{"--latency-us", &f.latency_us,
                     "latency per collective, microseconds"},
           Parameter{"--compute-speedup", &f.compute_speedup,
                     "a rank computes this much faster than the measured "
                     "process"},
       }) {
    dlrm::AddDefaulted(app, name, *value, absl::StrCat("Projection: ", help));
  }
  dlrm::AddDefaulted(app, "--out", f.out, "Output directory");
  app.add_flag("--no-chart", f.no_chart, "Do not draw the chart");
  CLI11_PARSE(app, argc, argv);
  return dlrm::ExitStatus(
      dlrm::bench::Run(f, std::vector<std::string>(argv, argv + argc)),
      "dlrm_bench");
}
