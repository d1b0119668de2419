// dlrm_bench_serve: a real dlrm_server child process measured through the
// C++ client library: streaming-training samples/s over gRPC beside the
// in-process step on the same batches, and Predict latency at several client
// concurrencies; or (--load) a load test of many Predict clients while a
// Train stream runs, on that server or (--load-replica) on an inference
// replica that follows its checkpoints. Prints one JSON line per
// measurement.
#include <omp.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bench/bench_util.h"
#include "clients/client.h"
#include "clients/server_process.h"
#include "core/cli_parse.h"
#include "core/config.h"
#include "core/status.h"
#include "data/rotating_source.h"
#include "data/synthetic.h"
#include "model/model.h"

namespace dlrm {
namespace {

namespace fs = std::filesystem;
using bench::Median;
using bench::SyntheticBatches;
using bench::TimedSteps;
using Clock = std::chrono::steady_clock;

struct Flags {
  // dlrm_server binary; empty: ../server/dlrm_server next to this binary.
  std::string server;
  // Extra dlrm_server flags, e.g. --server-arg=--predict-max-wait-us=200.
  std::vector<std::string> server_args;
  std::string config = "kaggle";
  // Compute threads of the server and of the in-process model; 0 = all.
  int threads = 0;
  // Not a flag: the server's dense precision, oneDNN ISA and CPU as JSON
  // members (HostJson of its ModelInfo), set once it answers, for every
  // line printed.
  std::string host_json;
  // Training: batches of `batch` samples, `batches` of them pre-generated
  // and rotated; `warmup` untimed steps, then `repeats` x `steps` timed.
  int64_t batch = 2048;
  int batches = 4;
  int warmup = 5;
  int steps = 30;
  int repeats = 5;
  int in_flight = 4;
  double alpha = 1.05;
  // Predict: each level runs that many client threads (one Client
  // each) for `duration` seconds, requests of `request_size` samples.
  std::vector<int> concurrency = {1, 8, 64};
  int64_t request_size = 16;
  double duration = 5;
  bool no_train = false;
  bool no_predict = false;
  // Load test instead of the measurements above: `load_clients` Predict
  // clients back to back while one Train stream runs, for `duration`
  // seconds; exits non-zero on any error, or when the server's peak RSS
  // grows past `max_rss_growth_mb` over its RSS at the start (0 = no bound).
  bool load = false;
  int load_clients = 64;
  // The load test without the Train stream: Predict clients alone, the
  // baseline the latency beside training is compared with.
  bool load_idle = false;
  double max_rss_growth_mb = 0;
  // The load test's Predict clients call an inference replica
  // (dlrm_server --inference-only --follow DIR) instead of the training
  // server, which writes a checkpoint into DIR every
  // `replica_checkpoint_seconds` while it trains; the replica looks every
  // `replica_poll_seconds` and swaps each new one in. `replica_threads`
  // compute threads for the replica (0 = as --threads).
  bool load_replica = false;
  double replica_checkpoint_seconds = 5;
  double replica_poll_seconds = 1;
  int replica_threads = 0;
};

// The value at quantile q of sorted `values` (nearest rank).
double Quantile(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return 0;
  const size_t i = static_cast<size_t>(q * static_cast<double>(sorted.size()));
  return sorted[std::min(i, sorted.size() - 1)];
}

// `args` joined by spaces, as a JSON string literal.
std::string JsonString(const std::vector<std::string>& args) {
  std::string out = "\"";
  for (size_t i = 0; i < args.size(); ++i) {
    if (i > 0) out += ' ';
    for (const char c : args[i]) {
      if (c == '"' || c == '\\') out += '\\';
      out += c;
    }
  }
  return out + "\"";
}

// ModelInfo's dense_precision, dense_isa and cpu_model as the JSON members
// "precision", "isa", "cpu" (each line names its host).
std::string HostJson(const ModelInfo& info) {
  return absl::StrCat(
      "\"precision\": ", JsonString({PrecisionName(info.dense_precision())}),
      ", \"isa\": ", JsonString({info.dense_isa()}),
      ", \"cpu\": ", JsonString({info.cpu_model()}));
}

// `count` batches of `size` samples, ids of Zipf `alpha`.
absl::StatusOr<std::vector<data::Batch>> MakeBatches(const ModelConfig& config,
                                                     int count, int64_t size,
                                                     double alpha,
                                                     uint64_t sample_seed) {
  data::SyntheticOptions options;
  options.zipf_alpha = alpha;
  options.teacher_seed = config.seed();
  options.sample_seed = sample_seed;
  return SyntheticBatches(config, options, count, size);
}

// Samples/s of each training repeat: over gRPC (client wall time of the
// Train call), inside the server's model (median of the StepResults'), and
// of the in-process model on the same batches.
struct TrainRates {
  std::vector<double> grpc;
  std::vector<double> server_model;
  std::vector<double> in_process;
};

// Warm-up, then `f.repeats` rounds of f.steps timed steps through one Train
// stream each, then the same in process (model::Model, the protocol of
// dlrm_bench_train). Rounds alternate so that a change in the shared
// machine's load hits both alike; the two never run at the same time (the
// server idles while the in-process model trains, and the other way round).
absl::StatusOr<TrainRates> MeasureTraining(
    clients::Client& client, const ModelConfig& config,
    const std::vector<data::Batch>& batches, const Flags& f) {
  ASSIGN_OR_RETURN(std::unique_ptr<model::Model> model,
                   model::Model::Create(config));
  int64_t local_step = 0;
  clients::TrainOptions options;
  options.batch_size = f.batch;
  options.max_in_flight = f.in_flight;
  if (f.warmup > 0) {
    data::RotatingSource warmup(&batches, f.warmup);
    RETURN_IF_ERROR(client.Train(warmup, options, nullptr).status());
    RETURN_IF_ERROR(
        TimedSteps(*model, batches, f.warmup, &local_step).status());
  }
  TrainRates rates;
  for (int r = 0; r < f.repeats; ++r) {
    data::RotatingSource source(&batches, f.steps);
    std::vector<double> model_rates;
    ASSIGN_OR_RETURN(clients::TrainSummary summary,
                     client.Train(source, options, [&](const StepResult& s) {
                       model_rates.push_back(s.samples_per_second());
                     }));
    rates.grpc.push_back(summary.samples_per_second);
    rates.server_model.push_back(Median(model_rates));

    ASSIGN_OR_RETURN(const double local,
                     TimedSteps(*model, batches, f.steps, &local_step));
    rates.in_process.push_back(local);
  }
  return rates;
}

// Predict latency with `clients` threads, each with its own Client,
// calling back to back for f.duration seconds after 3 untimed calls.
absl::Status MeasurePredict(const std::string& address, int clients,
                            const std::vector<data::Batch>& requests,
                            const Flags& f) {
  std::vector<std::unique_ptr<clients::Client>> connections;
  for (int c = 0; c < clients; ++c) {
    ASSIGN_OR_RETURN(std::unique_ptr<clients::Client> client,
                     clients::Client::Connect(address));
    connections.push_back(std::move(client));
  }
  std::vector<std::vector<double>> latencies(clients);
  std::vector<absl::Status> errors(clients);
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  Clock::time_point start, deadline;
  std::vector<Clock::time_point> finish(clients);
  std::vector<std::thread> threads;
  for (int c = 0; c < clients; ++c) {
    threads.emplace_back([&, c] {
      clients::Client& client = *connections[c];
      size_t next = c;
      for (int i = 0; i < 3 && errors[c].ok(); ++i) {
        errors[c] = client.Predict(requests[next++ % requests.size()]).status();
      }
      ready.fetch_add(1);
      while (!go.load()) std::this_thread::yield();
      while (errors[c].ok() && Clock::now() < deadline) {
        const Clock::time_point t0 = Clock::now();
        absl::StatusOr<std::vector<float>> p =
            client.Predict(requests[next++ % requests.size()]);
        if (!p.ok()) {
          errors[c] = p.status();
          break;
        }
        latencies[c].push_back(
            std::chrono::duration<double>(Clock::now() - t0).count());
      }
      finish[c] = Clock::now();
    });
  }
  while (ready.load() < clients) std::this_thread::yield();
  start = Clock::now();
  deadline = start + std::chrono::duration_cast<Clock::duration>(
                         std::chrono::duration<double>(f.duration));
  go = true;
  for (std::thread& t : threads) t.join();
  for (const absl::Status& e : errors) RETURN_IF_ERROR(e);

  std::vector<double> all;
  for (const std::vector<double>& l : latencies) {
    all.insert(all.end(), l.begin(), l.end());
  }
  std::sort(all.begin(), all.end());
  const double elapsed =
      std::chrono::duration<double>(
          *std::max_element(finish.begin(), finish.end()) - start)
          .count();
  double sum = 0;
  for (const double x : all) sum += x;
  const double n = static_cast<double>(all.size());
  std::printf(
      "{\"bench\": \"serve_predict\", \"config\": %s, "
      "\"server_args\": %s, %s, \"threads\": %d, \"clients\": %d, "
      "\"request_samples\": %lld, \"requests\": %zu, \"seconds\": %.2f, "
      "\"requests_per_s\": %.0f, \"samples_per_s\": %.0f, "
      "\"latency_ms\": {\"p50\": %.3f, \"p99\": %.3f, \"mean\": %.3f, "
      "\"max\": %.3f}}\n",
      JsonString({f.config}).c_str(), JsonString(f.server_args).c_str(),
      f.host_json.c_str(), omp_get_max_threads(), clients,
      static_cast<long long>(f.request_size), all.size(), elapsed, n / elapsed,
      n * static_cast<double>(f.request_size) / elapsed,
      1e3 * Quantile(all, 0.5), 1e3 * Quantile(all, 0.99),
      all.empty() ? 0 : 1e3 * sum / n, all.empty() ? 0 : 1e3 * all.back());
  std::fflush(stdout);
  return absl::OkStatus();
}

// Resident set size of process `pid` in MiB (VmRSS), or -1 if unreadable.
double RssMiB(pid_t pid) {
  std::FILE* f =
      std::fopen(absl::StrCat("/proc/", pid, "/status").c_str(), "r");
  if (f == nullptr) return -1;
  char line[256];
  double mib = -1;
  while (std::fgets(line, sizeof(line), f) != nullptr) {
    long long kib = 0;
    if (std::sscanf(line, "VmRSS: %lld kB", &kib) == 1) {
      mib = static_cast<double>(kib) / 1024;
      break;
    }
  }
  std::fclose(f);
  return mib;
}

// A RotatingSource that ends once `stop` is set: the load test's Train
// stream runs for exactly as long as its Predict clients.
class UntilStopped final : public data::BatchSource {
 public:
  UntilStopped(const std::vector<data::Batch>* batches,
               const std::atomic<bool>* stop)
      : rotating_(batches, std::numeric_limits<int64_t>::max()), stop_(stop) {}
  absl::StatusOr<bool> Next(int64_t max_samples, data::Batch* batch) override {
    if (stop_->load()) return false;
    return rotating_.Next(max_samples, batch);
  }
  absl::Status Rewind() override { return rotating_.Rewind(); }

 private:
  data::RotatingSource rotating_;
  const std::atomic<bool>* stop_;
};

// The load test: f.load_clients Predict clients (one connection each) call
// `server` back to back for f.duration seconds while one Train stream trains
// `trained` on rotating batches (the same server, or the training server a
// replica `server` follows); a sampler reads `server`'s RSS every 50 ms.
// Every error is counted (calls go on after one), not returned early.
absl::Status RunLoad(clients::ServerProcess& server,
                     clients::ServerProcess& trained, const ModelConfig& config,
                     const Flags& f) {
  ASSIGN_OR_RETURN(const std::vector<data::Batch> requests,
                   MakeBatches(config, 64, f.request_size, f.alpha, 3));
  ASSIGN_OR_RETURN(const std::vector<data::Batch> batches,
                   MakeBatches(config, f.batches, f.batch, f.alpha, 2));
  const int n = f.load_clients;
  std::vector<std::unique_ptr<clients::Client>> connections;
  for (int c = 0; c < n; ++c) {
    ASSIGN_OR_RETURN(std::unique_ptr<clients::Client> client,
                     clients::Client::Connect(server.address()));
    connections.push_back(std::move(client));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<clients::Client> trainer,
                   clients::Client::Connect(trained.address()));
  // The checkpoint step the predictions start on (a replica's, or the
  // server's own step).
  ASSIGN_OR_RETURN(const ModelInfo info_start, connections[0]->GetModelInfo());

  const double rss_start = RssMiB(server.pid());
  std::atomic<double> rss_peak{rss_start};
  std::atomic<bool> stop{false};
  std::thread sampler([&] {
    while (!stop.load()) {
      const double rss = RssMiB(server.pid());
      double peak = rss_peak.load();
      while (rss > peak && !rss_peak.compare_exchange_weak(peak, rss)) {
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  });

  absl::StatusOr<clients::TrainSummary> train_summary = clients::TrainSummary();
  std::thread train_thread;
  if (!f.load_idle) {
    train_thread = std::thread([&] {
      UntilStopped source(&batches, &stop);
      clients::TrainOptions options;
      options.batch_size = f.batch;
      options.max_in_flight = f.in_flight;
      train_summary = trainer->Train(source, options, nullptr);
    });
  }

  std::vector<std::vector<double>> latencies(n);
  std::vector<int64_t> errors(n, 0);
  std::vector<absl::Status> first_error(n);
  const Clock::time_point start = Clock::now();
  const Clock::time_point deadline =
      start + std::chrono::duration_cast<Clock::duration>(
                  std::chrono::duration<double>(f.duration));
  std::vector<std::thread> threads;
  for (int c = 0; c < n; ++c) {
    threads.emplace_back([&, c] {
      size_t next = c;
      while (Clock::now() < deadline) {
        const Clock::time_point t0 = Clock::now();
        absl::StatusOr<std::vector<float>> p =
            connections[c]->Predict(requests[next++ % requests.size()]);
        if (!p.ok()) {
          if (errors[c]++ == 0) first_error[c] = p.status();
          continue;
        }
        latencies[c].push_back(
            std::chrono::duration<double>(Clock::now() - t0).count());
      }
    });
  }
  for (std::thread& t : threads) t.join();
  const double elapsed =
      std::chrono::duration<double>(Clock::now() - start).count();
  stop = true;
  if (train_thread.joinable()) train_thread.join();
  sampler.join();
  // After the load: what the server keeps once every call has finished.
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  const double rss_end = RssMiB(server.pid());
  ASSIGN_OR_RETURN(const ModelInfo info_end, connections[0]->GetModelInfo());
  // What answered the predictions: the step of the served checkpoint on a
  // replica, of the model itself on the training server.
  auto served_step = [&](const ModelInfo& info) {
    return f.load_replica ? info.served_checkpoint_step() : info.steps();
  };

  std::vector<double> all;
  int64_t total_errors = 0;
  absl::Status an_error;
  for (int c = 0; c < n; ++c) {
    all.insert(all.end(), latencies[c].begin(), latencies[c].end());
    total_errors += errors[c];
    if (an_error.ok()) an_error = first_error[c];
  }
  if (!train_summary.ok()) {
    ++total_errors;
    if (an_error.ok()) an_error = train_summary.status();
  }
  std::sort(all.begin(), all.end());
  const double requests_done = static_cast<double>(all.size());
  const int64_t train_steps = train_summary.ok() ? train_summary->steps : 0;
  std::printf(
      "{\"bench\": \"serve_load\", \"training\": %s, \"config\": %s, "
      "\"server_args\": %s, %s, "
      "\"threads\": %d, \"predict_clients\": %d, \"request_samples\": %lld, "
      "\"train_batch\": %lld, \"seconds\": %.2f, \"predict_requests\": %zu, "
      "\"predict_requests_per_s\": %.0f, \"train_steps\": %lld, "
      "\"train_samples_per_s\": %.0f, \"errors\": %lld, "
      "\"latency_ms\": {\"p50\": %.3f, \"p99\": %.3f, \"max\": %.3f}, "
      "\"server_rss_mb\": {\"start\": %.1f, \"peak\": %.1f, \"end\": %.1f}, "
      "\"replica\": %s, \"served_step\": {\"start\": %lld, \"end\": %lld}}\n",
      f.load_idle ? "false" : "true", JsonString({f.config}).c_str(),
      JsonString(f.server_args).c_str(), f.host_json.c_str(),
      omp_get_max_threads(), n, static_cast<long long>(f.request_size),
      static_cast<long long>(f.batch), elapsed, all.size(),
      requests_done / elapsed, static_cast<long long>(train_steps),
      static_cast<double>(train_steps * f.batch) / elapsed,
      static_cast<long long>(total_errors), 1e3 * Quantile(all, 0.5),
      1e3 * Quantile(all, 0.99), all.empty() ? 0 : 1e3 * all.back(), rss_start,
      rss_peak.load(), rss_end, f.load_replica ? "true" : "false",
      static_cast<long long>(served_step(info_start)),
      static_cast<long long>(served_step(info_end)));
  std::fflush(stdout);
  if (total_errors > 0) {
    return absl::InternalError(absl::StrCat(
        "load test: ", total_errors, " errors, e.g. ", an_error.ToString()));
  }
  if (train_steps == 0 && !f.load_idle) {
    return absl::InternalError("load test: the Train stream took no step");
  }
  if (f.max_rss_growth_mb > 0 &&
      rss_peak.load() - rss_start > f.max_rss_growth_mb) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "load test: server RSS grew from ", rss_start, " MiB to a peak of ",
        rss_peak.load(), " MiB, more than --max-rss-growth-mb ",
        f.max_rss_growth_mb));
  }
  return absl::OkStatus();
}

absl::Status Validate(const Flags& f) {
  if (f.batch <= 0 || f.batches <= 0 || f.steps <= 0 || f.repeats <= 0 ||
      f.warmup < 0 || f.in_flight <= 0 || f.request_size <= 0 ||
      !(f.duration > 0) || f.threads < 0) {
    return absl::InvalidArgumentError(
        "--batch, --batches, --steps, --repeats, --in-flight, "
        "--request-size and --duration must be positive, --warmup and "
        "--threads >= 0");
  }
  if (f.load_clients <= 0 || f.max_rss_growth_mb < 0) {
    return absl::InvalidArgumentError(
        "--load-clients must be positive, --max-rss-growth-mb >= 0");
  }
  if (f.load_replica && !f.load) {
    return absl::InvalidArgumentError("--load-replica needs --load");
  }
  if (!(f.replica_checkpoint_seconds > 0) || !(f.replica_poll_seconds > 0) ||
      f.replica_threads < 0) {
    return absl::InvalidArgumentError(
        "--replica-checkpoint-seconds and --replica-poll-seconds must be "
        "positive, --replica-threads >= 0");
  }
  for (const int c : f.concurrency) {
    if (c <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--concurrency values must be positive, got ", c));
    }
  }
  return absl::OkStatus();
}

absl::Status Run(Flags& f) {
  RETURN_IF_ERROR(Validate(f));
  if (f.server.empty()) {
    f.server = (fs::read_symlink("/proc/self/exe").parent_path().parent_path() /
                "server" / "dlrm_server")
                   .string();
  }
  if (access(f.server.c_str(), X_OK) != 0) {
    return absl::NotFoundError(
        absl::StrCat(f.server, " is not an executable (--server)"));
  }
  if (f.threads > 0) omp_set_num_threads(f.threads);
  const int threads = omp_get_max_threads();

  std::vector<std::string> args =
      clients::LoopbackServerArgs(f.server, f.config, threads);
  args.insert(args.end(), f.server_args.begin(), f.server_args.end());
  std::string follow_dir;
  if (f.load_replica) {
    char dir_template[] = "/tmp/dlrm_bench_replica.XXXXXX";
    if (mkdtemp(dir_template) == nullptr) {
      return absl::InternalError("mkdtemp for the replica's checkpoints");
    }
    follow_dir = dir_template;
    args.insert(args.end(),
                {"--checkpoint-dir", follow_dir, "--checkpoint-every-seconds",
                 absl::StrCat(f.replica_checkpoint_seconds)});
  }
  // Removes the replica's checkpoints whichever way Run returns.
  struct RemoveDir {
    const std::string& dir;
    ~RemoveDir() {
      std::error_code ignored;
      if (!dir.empty()) fs::remove_all(dir, ignored);
    }
  } remove_follow_dir{follow_dir};
  clients::ServerProcess server;
  RETURN_IF_ERROR(server.Start(args, 120));
  clients::ClientOptions client_options;
  client_options.call_timeout_seconds = 0;
  ASSIGN_OR_RETURN(std::unique_ptr<clients::Client> client,
                   clients::Client::Connect(server.address(), client_options));
  ASSIGN_OR_RETURN(ModelInfo info, client->GetModelInfo());
  f.host_json = HostJson(info);
  ASSIGN_OR_RETURN(const ModelConfig config,
                   NormalizeModelConfig(info.config()));

  if (f.load && f.load_replica) {
    // A first checkpoint for the replica to start from, then the replica;
    // the training server writes the next ones while the Train stream runs.
    RETURN_IF_ERROR(client->SaveCheckpoint("initial").status());
    clients::ServerProcess replica;
    std::vector<std::string> replica_args = clients::LoopbackServerArgs(
        f.server, "", f.replica_threads > 0 ? f.replica_threads : threads);
    replica_args.insert(
        replica_args.end(),
        {"--inference-only", "--follow", follow_dir, "--follow-poll-seconds",
         absl::StrCat(f.replica_poll_seconds)});
    RETURN_IF_ERROR(replica.Start(replica_args, 120));
    RETURN_IF_ERROR(RunLoad(replica, server, config, f));
    RETURN_IF_ERROR(replica.Stop());
    client.reset();
    return server.Stop();
  }
  if (f.load) {
    RETURN_IF_ERROR(RunLoad(server, server, config, f));
    client.reset();
    return server.Stop();
  }
  if (!f.no_train) {
    ASSIGN_OR_RETURN(const std::vector<data::Batch> batches,
                     MakeBatches(config, f.batches, f.batch, f.alpha, 2));
    ASSIGN_OR_RETURN(const TrainRates rates,
                     MeasureTraining(*client, config, batches, f));
    // The ratio of each round, then their median: both sides of a round
    // ran under the same load.
    std::vector<double> ratios;
    for (int r = 0; r < f.repeats; ++r) {
      ratios.push_back(rates.grpc[r] / rates.in_process[r]);
    }
    std::printf(
        "{\"bench\": \"serve_train\", \"config\": %s, \"server_args\": %s, "
        "%s, \"batch\": %lld, \"threads\": %d, \"steps\": %d, \"repeats\": %d, "
        "\"in_flight\": %d, \"grpc_samples_per_s\": %.0f, "
        "\"grpc_min\": %.0f, \"grpc_max\": %.0f, "
        "\"server_model_samples_per_s\": %.0f, "
        "\"in_process_samples_per_s\": %.0f, \"in_process_min\": %.0f, "
        "\"in_process_max\": %.0f, \"grpc_over_in_process\": %.3f}\n",
        JsonString({f.config}).c_str(), JsonString(f.server_args).c_str(),
        f.host_json.c_str(), static_cast<long long>(f.batch), threads, f.steps,
        f.repeats, f.in_flight, Median(rates.grpc),
        *std::min_element(rates.grpc.begin(), rates.grpc.end()),
        *std::max_element(rates.grpc.begin(), rates.grpc.end()),
        Median(rates.server_model), Median(rates.in_process),
        *std::min_element(rates.in_process.begin(), rates.in_process.end()),
        *std::max_element(rates.in_process.begin(), rates.in_process.end()),
        Median(ratios));
    std::fflush(stdout);
  }
  if (!f.no_predict) {
    ASSIGN_OR_RETURN(const std::vector<data::Batch> requests,
                     MakeBatches(config, 64, f.request_size, f.alpha, 3));
    for (const int c : f.concurrency) {
      RETURN_IF_ERROR(MeasurePredict(server.address(), c, requests, f));
    }
  }
  client.reset();
  return server.Stop();
}

}  // namespace
}  // namespace dlrm

int main(int argc, char** argv) {
  dlrm::Flags f;
  CLI::App app{
      "Serving benchmark: starts dlrm_server and measures streaming training "
      "(against the in-process step) and Predict latency through gRPC."};
  app.add_option("--server", f.server,
                 "dlrm_server binary (default: ../server/dlrm_server next to "
                 "this binary)");
  app.add_option("--server-arg", f.server_args,
                 "Extra dlrm_server flag, repeatable "
                 "(--server-arg=--predict-max-wait-us=200)");
  dlrm::AddConfigFlag(app, &f.config, dlrm::PresetNames(), "the server's")
      ->capture_default_str();
  dlrm::AddDefaulted(app, "--threads", f.threads,
                     "Compute threads of the server and the in-process model "
                     "(0 = all cores)");
  dlrm::AddDefaulted(app, dlrm::kBatchFlag, f.batch,
                     "Training samples per step");
  dlrm::AddDefaulted(app, "--batches", f.batches,
                     "Pre-generated training batches, rotated");
  dlrm::AddDefaulted(app, "--warmup", f.warmup, "Untimed training steps");
  dlrm::AddDefaulted(app, dlrm::kStepsFlag, f.steps,
                     "Timed training steps per repeat");
  dlrm::AddDefaulted(app, "--repeats", f.repeats,
                     "Training repeats (median reported)");
  dlrm::AddDefaulted(app, "--in-flight", f.in_flight,
                     "Train stream: batches sent and not yet answered");
  dlrm::AddDefaulted(app, dlrm::kAlphaFlag, f.alpha, "Zipf exponent of ids");
  dlrm::AddDefaulted(app, "--concurrency", f.concurrency,
                     "Predict client threads per level, e.g. 1,8,64")
      ->delimiter(',');
  dlrm::AddDefaulted(app, "--request-size", f.request_size,
                     "Samples per Predict");
  dlrm::AddDefaulted(app, "--duration", f.duration,
                     "Seconds of Predict calls per concurrency level");
  app.add_flag("--no-train", f.no_train, "Skip the training measurement");
  app.add_flag("--no-predict", f.no_predict, "Skip the Predict measurement");
  app.add_flag("--load", f.load,
               "Load test: --load-clients Predict clients while a Train "
               "stream runs, for --duration seconds; fails on any error");
  app.add_flag("--load-idle", f.load_idle,
               "With --load: no Train stream, Predict clients alone");
  dlrm::AddDefaulted(app, "--load-clients", f.load_clients,
                     "Concurrent Predict clients of the load test");
  app.add_flag("--load-replica", f.load_replica,
               "With --load: Predict clients call an inference replica "
               "(--inference-only --follow) of the training server, which "
               "writes a checkpoint every --replica-checkpoint-seconds");
  dlrm::AddDefaulted(
      app, "--replica-checkpoint-seconds", f.replica_checkpoint_seconds,
      "--load-replica: the training server's checkpoint interval");
  dlrm::AddDefaulted(app, "--replica-poll-seconds", f.replica_poll_seconds,
                     "--load-replica: the replica's --follow-poll-seconds");
  dlrm::AddDefaulted(app, "--replica-threads", f.replica_threads,
                     "--load-replica: the replica's compute threads (0 = as "
                     "--threads)");
  dlrm::AddDefaulted(app, "--max-rss-growth-mb", f.max_rss_growth_mb,
                     "Load test: fail when the server's peak RSS exceeds its "
                     "start RSS by more than this (0 = no bound)");
  CLI11_PARSE(app, argc, argv);
  return dlrm::ExitStatus(dlrm::Run(f), "dlrm_bench_serve");
}
