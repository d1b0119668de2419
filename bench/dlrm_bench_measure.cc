// dlrm_bench's measured rows: the servers of a row started as processes,
// server-side jobs timed by the server (with its per-stage times from
// /metrics), a client's Train stream, and the model's step in process.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <memory>
#include <sstream>

#include "bench/bench_util.h"
#include "bench/dlrm_bench.h"
#include "clients/server_process.h"
#include "core/status.h"
#include "data/rotating_source.h"
#include "data/synthetic.h"
#include "model/model.h"

namespace dlrm::bench {

namespace {

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

}  // namespace

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
  return SyntheticBatches(config, options, 4, f.batch);
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
  RETURN_IF_ERROR(TimedSteps(*model, batches, f.warmup, &step).status());
  std::vector<double> rates;
  for (int r = 0; r < f.repeats; ++r) {
    ASSIGN_OR_RETURN(const double rate,
                     TimedSteps(*model, batches, f.steps, &step));
    rates.push_back(rate);
  }
  return rates;
}

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
    std::vector<std::string> args = clients::LoopbackServerArgs(
        f.server, launch.config_path, launch.threads);
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

}  // namespace dlrm::bench
