// dlrm_server's run (server_start.h): one start path for any number of
// ranks.
#include "server/server_start.h"

#include <omp.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "comm/coordinator.h"
#include "comm/factory.h"
#include "core/config.h"
#include "core/status.h"
#include "dense/cpu_isa.h"
#include "server/checkpoint_follower.h"
#include "server/dlrm_server.h"
#include "server/rank_group.h"
#include "server/start_plan.h"
#include "server/startup_checks.h"
#include "spdlog/sinks/stdout_color_sinks.h"
#include "spdlog/spdlog.h"

namespace dlrm::server {
namespace {

// How long a follower that got SIGINT/SIGTERM waits for rank 0's Shutdown.
constexpr int kFollowerGraceSeconds = 10;

// Where --checkpoint-on-exit writes, under --checkpoint-dir.
constexpr char kExitCheckpoint[] = "final";

// The job id of the ranks' heartbeats (Coordinator.Heartbeat).
constexpr char kRanksJob[] = "dlrm-server";

// The signals of a rank of a job of several, taken by a thread of their
// own (Watch). Until rank 0 serves (connecting may wait minutes for the
// other ranks) and on followers they end the process at once: there is
// nothing to save. Once rank 0 serves, they start the orderly shutdown
// (Wait). Static: the detached thread may outlive RunServer.
class RankSignals {
 public:
  // Starts the thread that takes `signals` (blocked on every thread).
  static void Watch(const sigset_t& signals) {
    waited_ = signals;
    std::thread([] {
      int received = 0;
      sigwait(&waited_, &received);
      if (following_.load()) {
        // A terminal's Ctrl-C reaches every rank at once: leave rank 0 the
        // time to finish its step and end the job in order.
        spdlog::info("signal {}: waiting up to {} s for rank 0 to end the job",
                     received, kFollowerGraceSeconds);
        std::this_thread::sleep_for(
            std::chrono::seconds(kFollowerGraceSeconds));
      }
      if (!serving_.load()) {
        spdlog::info("signal {}: exiting", received);
        std::_Exit(128 + received);
      }
      std::lock_guard<std::mutex> lock(mu_);
      signal_ = received;
      cv_.notify_all();
    }).detach();
  }
  // From here a signal means the orderly shutdown, also one that arrives
  // as soon as the "listening" line is read.
  static void Serving() { serving_.store(true); }
  // This rank follows rank 0: a signal waits for rank 0's Shutdown first.
  static void Following() { following_.store(true); }
  // Blocks until a signal arrives once Serving(); returns it.
  static int Wait() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [] { return signal_ != 0; });
    return signal_;
  }

 private:
  static inline std::mutex mu_;
  static inline std::condition_variable cv_;
  static inline int signal_ = 0;  // guarded by mu_
  static inline std::atomic<bool> serving_{false};
  static inline std::atomic<bool> following_{false};
  static inline sigset_t waited_;
};

// The communicators of a rank of a job of several, each on a job id of its
// own so that their collectives never interleave.
enum class Channel {
  kModel,    // the model's exchanges and the ranks' control traffic
  kDense,    // --overlap-allreduce: the dense gradients' all-reduce
  kPredict,  // predictions beside training (docs/server.md)
  kDevice,   // STORAGE_DEVICE tables' pooled vectors, in device memory
};

// The options of `channel`'s communicator: every one dials the same
// coordinator with the same timeouts; host buffers (Gloo) but for kDevice.
comm::CommOptions ChannelOptions(const ServerFlags& f, Channel channel) {
  comm::CommOptions o;
  o.memory_space = comm::MemorySpace::kHost;
  o.rank = f.rank;
  o.world_size = f.world_size;
  o.coordinator_address = f.coordinator;
  o.coordinator_client = CoordinatorClientFrom(f);
  o.bind_address = f.comm_bind_address;
  o.op_timeout_seconds = f.comm_timeout_s;
  o.connect_timeout_seconds = f.comm_connect_timeout_s;
  switch (channel) {
    case Channel::kModel:
      o.job_id = "dlrm-server";
      break;
    case Channel::kDense:
      o.job_id = "dlrm-server-dense";
      break;
    case Channel::kPredict:
      o.job_id = "dlrm-server-predict";
      break;
    case Channel::kDevice:
      o.job_id = "dlrm-server-device";
      o.memory_space = comm::MemorySpace::kDevice;
      // Checked with the flags (ValidateFlags): auto when unparsable.
      o.backend = comm::ParseCommBackend("--device-comm", f.device_comm,
                                         comm::MemorySpace::kDevice)
                      .value_or(comm::CommBackend::kAuto);
      break;
  }
  return o;
}

// What a rank of a job of several holds to talk to the others. Declared
// before the model and everything that owns it, so that it outlives them:
// the model borrows `dense` and `device`, the heartbeats borrow
// `coordinator` and `heartbeat_client`.
struct RankComms {
  std::unique_ptr<comm::CoordinatorServer> coordinator;       // rank 0's
  std::unique_ptr<comm::CoordinatorClient> heartbeat_client;  // followers'
  std::unique_ptr<comm::Communicator> model;    // moved into the RankGroup
  std::unique_ptr<comm::Communicator> predict;  // moved into the RankGroup
  std::unique_ptr<comm::Communicator> dense;    // null without overlap
  std::unique_ptr<comm::Communicator> device;   // null without device tables
};

// Rank 0 hosts the coordinator at --coordinator; every rank connects the
// model's communicator through it.
absl::Status ConnectRank(const ServerFlags& f, RankComms* comms) {
  if (!f.join_token.empty() && f.coordinator_tls_ca.empty()) {
    spdlog::warn(
        "the join token crosses the network in plaintext: give the ranks "
        "--coordinator-tls-ca (and rank 0 a certificate) off loopback");
  }
  if (f.rank == 0) {
    ASSIGN_OR_RETURN(comms->coordinator,
                     comm::CoordinatorServer::Start(CoordinatorServerFrom(f)));
    spdlog::info("coordinator listening on {} ({})",
                 comms->coordinator->address(), ControlPlaneSummary(f));
  }
  spdlog::info("connecting rank {} of {} through {}", f.rank, f.world_size,
               f.coordinator);
  ASSIGN_OR_RETURN(comms->model, comm::CreateCommunicator(
                                     ChannelOptions(f, Channel::kModel)));
  return absl::OkStatus();
}

// The communicators the model of `config` needs beside the model's own.
absl::Status OpenModelComms(const ServerFlags& f, const ModelConfig& config,
                            RankComms* comms) {
  std::vector<std::pair<Channel, std::unique_ptr<comm::Communicator>*>> open;
  if (f.overlap_allreduce) open.push_back({Channel::kDense, &comms->dense});
  open.push_back({Channel::kPredict, &comms->predict});
  if (config.device() == DEVICE_CUDA &&
      std::any_of(
          config.tables().begin(), config.tables().end(),
          [](const TableConfig& t) { return t.storage() == STORAGE_DEVICE; })) {
    open.push_back({Channel::kDevice, &comms->device});
  }
  for (auto& [channel, comm] : open) {
    ASSIGN_OR_RETURN(*comm,
                     comm::CreateCommunicator(ChannelOptions(f, channel)));
  }
  return absl::OkStatus();
}

// The start rank 0 chose (ChooseStart), on every rank: rank 0 tells the
// others the checkpoint it resumes from, so that every rank plans from the
// same config (followers need not have --checkpoint-dir). `comm` is null
// for a job of one rank.
absl::StatusOr<StartPlan> AgreeOnStart(const ServerFlags& f,
                                       comm::Communicator* comm) {
  StartPlan start;
  if (f.rank == 0) {
    ASSIGN_OR_RETURN(start, ChooseStart(f));
  }
  if (comm == nullptr) return start;
  std::string dir =
      start.kind == StartPlan::Kind::kResume ? start.dir : std::string();
  int64_t size = static_cast<int64_t>(dir.size());
  RETURN_IF_ERROR(comm->Broadcast(&size, 1, comm::DataType::kInt64, 0));
  dir.resize(size);
  RETURN_IF_ERROR(comm->Broadcast(dir.data(), size, comm::DataType::kUint8, 0));
  if (f.rank != 0 && !dir.empty()) {
    start.kind = StartPlan::Kind::kResume;
    start.dir = dir;
  } else if (f.rank != 0 && !f.restore.empty()) {
    start.kind = StartPlan::Kind::kRestore;
    start.dir = f.restore;
  }
  return start;
}

// --follow: the model of the newest checkpoint under --follow's directory
// that loads (checksums verified), the others skipped with a warning;
// waits, looking every --follow-poll-seconds, until one does. Sets
// f.server.loaded_from. Cancelled when one of `signals` (blocked) arrives
// meanwhile.
absl::StatusOr<std::unique_ptr<model::Model>> FirstFollowedModel(
    ServerFlags& f, const sigset_t& signals) {
  CheckpointPicker picker(f.server.follow_dir);
  bool told = false;
  while (true) {
    int skipped = 0;
    for (const model::CheckpointEntry& e :
         picker.Candidates(ServedCheckpoint(), &skipped)) {
      absl::StatusOr<std::unique_ptr<model::Model>> model =
          LoadModel(f, e.dir, /*weights_only=*/true);
      if (!model.ok()) {
        picker.Failed(e, model.status());
        continue;
      }
      spdlog::info("serving checkpoint {} (step {})", e.dir, (*model)->steps());
      f.server.loaded_from = e.dir;
      return model;
    }
    if (!told) {
      spdlog::info(
          "waiting for a complete checkpoint in {} (looking every {} s); "
          "the server listens once it has one",
          f.server.follow_dir, f.server.follow_poll_seconds);
      told = true;
    }
    const double s = f.server.follow_poll_seconds;
    timespec wait;
    wait.tv_sec = static_cast<time_t>(s);
    wait.tv_nsec = static_cast<long>((s - wait.tv_sec) * 1e9);
    const int received = sigtimedwait(&signals, nullptr, &wait);
    if (received > 0) {
      return absl::CancelledError(absl::StrCat(
          "signal ", received, " while waiting for a checkpoint in ",
          f.server.follow_dir));
    }
  }
}

// The model of a job of one process, as `start` says. `signals` as
// FirstFollowedModel's.
absl::StatusOr<std::unique_ptr<model::Model>> OneProcessModel(
    ServerFlags& f, const StartPlan& start, const sigset_t& signals) {
  switch (start.kind) {
    case StartPlan::Kind::kFollow:
      return FirstFollowedModel(f, signals);
    case StartPlan::Kind::kResume: {
      // Each checkpoint loads with its own config (and --config's changes).
      std::unique_ptr<model::Model> model;
      RETURN_IF_ERROR(ResumeNewestFirst(
          start,
          [&](const model::CheckpointEntry& e,
              std::vector<ConfigDifference>* changes,
              bool* fatal) -> absl::StatusOr<int64_t> {
            absl::StatusOr<ModelConfig> config =
                ResumedConfig(f, e.dir, changes);
            *fatal = absl::IsFailedPrecondition(config.status());
            RETURN_IF_ERROR(config.status());
            ASSIGN_OR_RETURN(
                model, model::LoadCheckpointWith(
                           e.dir, /*weights_only=*/false, [&](ModelConfig* c) {
                             *c = *config;
                             return CheckMemoryOf(f, *c, nullptr).status();
                           }));
            return model->steps();
          },
          &f));
      return model;
    }
    case StartPlan::Kind::kRestore:
      spdlog::info("loading {} from {}",
                   f.server.inference_only ? "weights" : "the checkpoint",
                   f.restore);
      f.server.loaded_from = f.restore;
      return LoadModel(f, f.restore, /*weights_only=*/f.server.inference_only);
    case StartPlan::Kind::kFresh:
      break;
  }
  if (f.server.inference_only) {
    return absl::InvalidArgumentError(
        "--inference-only needs --restore or --follow (the weights to "
        "serve)");
  }
  ASSIGN_OR_RETURN(ModelConfig config, ConfigOnDevice(f, f.config));
  RETURN_IF_ERROR(CheckMemoryOf(f, config, nullptr).status());
  return model::Model::Create(config);
}

// Rank `f.rank` of a job of several, connected (`comms`): builds its part
// of the model from the same (deterministic) plan as every rank. Rank 0
// returns the host it serves, resumed or restored as `start` says; the
// others follow rank 0 until it says Shutdown, then return null.
absl::StatusOr<std::unique_ptr<ModelHost>> RankHost(ServerFlags& f,
                                                    const StartPlan& start,
                                                    RankComms* comms) {
  // Every rank compares its own --config (the same on every rank) with the
  // checkpoint's, so that they plan alike; rank 0 logs the changes.
  std::vector<ConfigDifference> changes;
  ASSIGN_OR_RETURN(const ModelConfig config, StartConfig(f, start, &changes));
  ASSIGN_OR_RETURN(const embedding::ShardingPlan plan,
                   PlanShardingOf(f, config));
  RETURN_IF_ERROR(CheckMemoryOf(f, config, &plan).status());
  RETURN_IF_ERROR(OpenModelComms(f, config, comms));
  ASSIGN_OR_RETURN(
      std::unique_ptr<model::Model> model,
      model::Model::Create(config, plan, comms->model.get(), comms->dense.get(),
                           comms->device.get()));
  RankGroupOptions ro;
  ro.heartbeat_seconds = std::min(10.0, f.comm_timeout_s / 4);
  // Followers' heartbeats to the coordinator name a rank that dies or
  // freezes (RankGroup::Health).
  if (f.rank == 0) {
    ro.heartbeats = [c = comms->coordinator.get()] {
      return c->Heartbeats(kRanksJob);
    };
  } else {
    ASSIGN_OR_RETURN(comms->heartbeat_client,
                     comm::CoordinatorClient::Create(f.coordinator,
                                                     CoordinatorClientFrom(f)));
    char host[256] = {};
    gethostname(host, sizeof(host) - 1);
    ro.send_heartbeat = [c = comms->heartbeat_client.get(), rank = f.rank,
                         host = std::string(host)] {
      return c->Heartbeat(kRanksJob, rank, host, 2 * kRankHeartbeatSeconds);
    };
  }
  ASSIGN_OR_RETURN(std::unique_ptr<RankGroup> group,
                   RankGroup::Create(std::move(comms->model), std::move(model),
                                     ro, std::move(comms->predict)));
  if (f.rank != 0) {
    // A follower stops when rank 0 says so; a signal ends it at once.
    spdlog::info("following rank 0");
    RankSignals::Following();
    RETURN_IF_ERROR(group->Follow());
    spdlog::info("rank 0 shut the job down");
    return nullptr;
  }
  spdlog::info("sharding plan ({} ranks):\n{}", f.world_size,
               plan.ToString(config));
  ASSIGN_OR_RETURN(
      std::unique_ptr<ModelHost> host,
      ModelHost::Create(std::move(group), HostOptionsFrom(f.server)));
  if (start.kind == StartPlan::Kind::kResume) {
    // Every candidate restores into the model of the newest one's config.
    RETURN_IF_ERROR(ResumeNewestFirst(
        start,
        [&](const model::CheckpointEntry& e,
            std::vector<ConfigDifference>* resumed_changes,
            bool*) -> absl::StatusOr<int64_t> {
          ASSIGN_OR_RETURN(const model::CheckpointInfo info,
                           host->RestoreCheckpoint(e.dir));
          if (e.dir == start.dir) *resumed_changes = changes;
          return info.step;
        },
        &f));
  } else if (start.kind == StartPlan::Kind::kRestore) {
    spdlog::info("restoring every rank from {}", f.restore);
    ASSIGN_OR_RETURN(const model::CheckpointInfo info,
                     host->RestoreCheckpoint(f.restore));
    spdlog::info("restored step {}", info.step);
  }
  return host;
}

// Serves until a signal: prints the "listening" line the launchers wait
// for, waits for `wait_for_signal` to return the signal, then stops the
// services after the current step and, with --checkpoint-on-exit, saves
// <checkpoint-dir>/final with the interrupted job. Warns at start of a
// training server without --checkpoint-dir, and at the stop of trained
// steps no checkpoint holds (server/startup_checks.h). The save's errors.
absl::Status ServeUntilSignal(const ServerFlags& f, DlrmServer& server,
                              const std::function<int()>& wait_for_signal) {
  const int64_t start_steps = server.host()->steps();
  if (const std::string lost = NoCheckpointDirWarning(f.server);
      !lost.empty()) {
    spdlog::warn("{}", lost);
  }
  std::printf(
      "dlrm_server: listening on %s metrics %s\n", server.address().c_str(),
      server.metrics_address().empty() ? "off"
                                       : server.metrics_address().c_str());
  std::fflush(stdout);
  const int signal = wait_for_signal();
  spdlog::info("{}: finishing the current step and shutting down",
               signal == SIGINT ? "SIGINT" : "SIGTERM");
  server.Shutdown();
  if (const std::string lost = UnsavedStepsWarning(
          f.server, f.checkpoint_on_exit, server.host()->steps(), start_steps);
      !lost.empty()) {
    spdlog::warn("{}", lost);
  }
  if (f.checkpoint_on_exit) {
    const std::string dir =
        (std::filesystem::path(f.server.checkpoint_dir) / kExitCheckpoint)
            .string();
    ASSIGN_OR_RETURN(
        model::CheckpointInfo info,
        server.host()->SaveCheckpoint(dir, server.InterruptedJob()));
    spdlog::info("saved checkpoint to {} at step {} ({} bytes)", dir, info.step,
                 info.bytes);
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status RunServer(ServerFlags& f) {
  auto logger = spdlog::stderr_color_mt("dlrm_server");
  logger->set_pattern(
      absl::StrCat("[%Y-%m-%d %H:%M:%S.%e] [rank ", f.rank, "] [%^%l%$] %v"));
  spdlog::set_default_logger(logger);
  spdlog::set_level(spdlog::level::from_str(f.log_level));

  if (!f.launcher_note.empty()) spdlog::info("{}", f.launcher_note);
  RETURN_IF_ERROR(ValidateServerFlags(f));
  // Model work runs on job, stream and batcher threads too, which
  // omp_set_num_threads below (this thread's) does not reach.
  f.server.compute_threads = f.threads;
  // A replica applies the flags to every checkpoint it swaps in, as to
  // the first one.
  f.server.adjust_loaded_config = [adjust = f](ModelConfig* config) {
    return AdjustAndCheck(adjust, config);
  };

  // Signals are taken by sigwait (one rank: below; several: RankSignals);
  // every thread started from here on inherits the mask, so none of them
  // is interrupted.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  if (f.threads > 0) omp_set_num_threads(f.threads);

  const bool ranks = f.world_size != 1;
  if (ranks) RankSignals::Watch(signals);
  RankComms comms;  // outlives the model (RankComms)
  if (ranks) RETURN_IF_ERROR(ConnectRank(f, &comms));
  ASSIGN_OR_RETURN(const StartPlan start, AgreeOnStart(f, comms.model.get()));
  std::unique_ptr<ModelHost> host;
  if (ranks) {
    ASSIGN_OR_RETURN(host, RankHost(f, start, &comms));
    if (host == nullptr) return absl::OkStatus();  // a follower, ended
  } else {
    absl::StatusOr<std::unique_ptr<model::Model>> made =
        OneProcessModel(f, start, signals);
    if (absl::IsCancelled(made.status())) {
      // A replica stopped before it had anything to serve: an orderly stop.
      spdlog::info("{}", std::string(made.status().message()));
      return absl::OkStatus();
    }
    ASSIGN_OR_RETURN(std::unique_ptr<model::Model> model, std::move(made));
    const ModelConfig& config = model->config();
    spdlog::info(
        "model: {} tables, {} embedding and {} dense parameters, step {}, "
        "{} compute threads, dense precision {}",
        config.tables_size(), EmbeddingParameterCount(config),
        DenseParameterCount(config), model->steps(), omp_get_max_threads(),
        dense::DescribePrecision(config.device(), config.dense_precision()));
    ASSIGN_OR_RETURN(
        host, ModelHost::Create(std::move(model), HostOptionsFrom(f.server)));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<DlrmServer> server,
                   DlrmServer::Start(std::move(host), f.server));
  if (!ranks) {
    return ServeUntilSignal(f, *server, [&signals] {
      int signal = 0;
      sigwait(&signals, &signal);
      return signal;
    });
  }
  RankSignals::Serving();
  RETURN_IF_ERROR(ServeUntilSignal(f, *server, RankSignals::Wait));
  const absl::Status stopped = server->host()->ShutdownRanks();
  if (!stopped.ok()) {
    spdlog::warn("could not shut the other ranks down: {}",
                 std::string(stopped.message()));
  }
  return absl::OkStatus();
}

}  // namespace dlrm::server
