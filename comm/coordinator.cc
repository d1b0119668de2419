// The coordinator: rank registration in rounds, a session-scoped key-value
// store with blocking reads, its gRPC service and client, and the Gloo store.
#include "comm/coordinator.h"

#include <gloo/common/error.h>
#include <grpcpp/server_builder.h>

#include <algorithm>
#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "comm/listen_address.h"
#include "core/secrets.h"
#include "core/status.h"
#include "spdlog/spdlog.h"

namespace dlrm::comm {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

std::chrono::system_clock::duration ToSystemDuration(double seconds) {
  return std::chrono::duration_cast<std::chrono::system_clock::duration>(
      std::chrono::duration<double>(seconds));
}

// Only this file speaks gRPC for comm/, so the Status <-> grpc::Status
// mapping lives here; the codes have the same numbers in both.
grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      std::string(status.message()));
}

std::string QuotedKeys(const std::vector<std::string>& keys) {
  return absl::StrCat(
      "[",
      absl::StrJoin(keys, ", ",
                    [](std::string* out, const std::string& key) {
                      absl::StrAppend(out, "'", key, "'");
                    }),
      "]");
}

}  // namespace

// Everything the service knows, apart from gRPC: jobs, their forming rounds,
// sessions with their key-value stores, and the calls waiting on them. A
// waiting call is completed exactly once, outside the lock: by the event it
// waits for, by its deadline (a timer thread), by Cancel, or by Shutdown.
class CoordinatorState {
 public:
  // What a waiting call gets: a status and, when OK, the session id
  // (RegisterRank) or the value (StoreGet).
  struct Outcome {
    absl::Status status;
    uint64_t session_id = 0;
    std::string value;
  };
  using DoneFn = std::function<void(Outcome)>;
  // Completions collected under the lock, run after it is released.
  using Ready = std::vector<std::pair<DoneFn, Outcome>>;

  static Outcome Failure(absl::Status status) {
    Outcome outcome;
    outcome.status = std::move(status);
    return outcome;
  }

  explicit CoordinatorState(const CoordinatorOptions& options)
      : options_(options), random_(std::random_device{}()) {
    timer_ = std::thread([this] { TimerLoop(); });
  }

  ~CoordinatorState() {
    Shutdown();
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_timer_ = true;
    }
    cv_.notify_all();
    timer_.join();
  }

  // An id for a waiting call, unique for this state's life.
  uint64_t NextCallId() {
    std::lock_guard<std::mutex> lock(mu_);
    return next_call_id_++;
  }

  void RegisterRank(uint64_t call_id, const RegisterRankRequest& request,
                    Clock::time_point deadline, DoneFn done) {
    Ready ready;
    {
      std::lock_guard<std::mutex> lock(mu_);
      // RegisterLocked takes `done` only when it accepts the call.
      absl::Status refused =
          RegisterLocked(call_id, request, deadline, done, ready);
      if (!refused.ok()) ready.emplace_back(std::move(done), Failure(refused));
    }
    cv_.notify_all();
    Complete(ready);
  }

  absl::Status StoreSet(const StoreSetRequest& request) {
    Ready ready;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (shut_down_) return ShutDownError();
      if (request.key().empty()) {
        return absl::InvalidArgumentError("StoreSet: empty key");
      }
      if (static_cast<int64_t>(request.value().size()) >
          options_.max_value_bytes) {
        return absl::InvalidArgumentError(
            absl::StrCat("StoreSet: value of ", request.value().size(),
                         " bytes is larger than max_value_bytes = ",
                         options_.max_value_bytes));
      }
      auto it = sessions_.find(request.session_id());
      if (it == sessions_.end()) return UnknownSession(request.session_id());
      it->second.values[request.key()] = request.value();
      WakeSessionWaitersLocked(request.session_id(), it->second, ready);
    }
    Complete(ready);
    return absl::OkStatus();
  }

  // Waits for `keys` of `session_id`; with `want_value` (StoreGet, one key)
  // the outcome carries the key's value.
  void StoreWait(uint64_t call_id, uint64_t session_id,
                 std::vector<std::string> keys, bool want_value,
                 Clock::time_point deadline, DoneFn done) {
    Ready ready;
    {
      std::lock_guard<std::mutex> lock(mu_);
      absl::Status refused;
      auto it = sessions_.find(session_id);
      if (shut_down_) {
        refused = ShutDownError();
      } else if (keys.empty() ||
                 std::any_of(keys.begin(), keys.end(),
                             [](const std::string& k) { return k.empty(); })) {
        refused = absl::InvalidArgumentError("no keys, or an empty key");
      } else if (it == sessions_.end()) {
        refused = UnknownSession(session_id);
      }
      if (!refused.ok()) {
        ready.emplace_back(std::move(done), Failure(refused));
      } else {
        Waiter w;
        w.kind = want_value ? Waiter::Kind::kGet : Waiter::Kind::kWait;
        w.session_id = session_id;
        w.keys = std::move(keys);
        w.start = Clock::now();
        w.deadline = deadline;
        w.done = std::move(done);
        waiters_.emplace(call_id, std::move(w));
        WakeSessionWaitersLocked(session_id, it->second, ready);
      }
    }
    cv_.notify_all();
    Complete(ready);
  }

  // Forgets the waiting call `call_id` without completing it; false when it
  // is not waiting (never was, or already completed).
  bool Cancel(uint64_t call_id) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = waiters_.find(call_id);
    if (it == waiters_.end()) return false;
    RemoveWaiterLocked(it);
    return true;
  }

  void Shutdown() {
    Ready ready;
    {
      std::lock_guard<std::mutex> lock(mu_);
      shut_down_ = true;
      while (!waiters_.empty()) {
        ready.emplace_back(std::move(waiters_.begin()->second.done),
                           Failure(ShutDownError()));
        RemoveWaiterLocked(waiters_.begin());
      }
    }
    Complete(ready);
  }

 private:
  struct Waiter {
    enum class Kind { kRegister, kGet, kWait };
    Kind kind = Kind::kWait;
    // kRegister: the job and rank that wait for their round.
    std::string job_id;
    int rank = 0;
    // kGet and kWait: the session and the keys waited for.
    uint64_t session_id = 0;
    std::vector<std::string> keys;
    Clock::time_point start;
    Clock::time_point deadline;
    DoneFn done;
  };

  // Ranks that have registered for the next session of a job.
  struct Round {
    int64_t generation = 0;
    int world_size = 0;
    // rank -> the call id of its waiting RegisterRank.
    std::map<int, uint64_t> ranks;
    // Ranks that registered, then gave up waiting (timed out or cancelled):
    // they did come, so a timeout message does not call them missing.
    std::set<int> gave_up;
  };

  struct Job {
    int64_t newest_generation = 0;
    std::optional<Round> round;
    // Sessions of this job still alive (the newest one in practice).
    std::set<uint64_t> sessions;
  };

  struct Session {
    std::string job_id;
    std::map<std::string, std::string> values;
  };

  static absl::Status ShutDownError() {
    return absl::UnavailableError("the coordinator is shutting down");
  }

  static absl::Status UnknownSession(uint64_t session_id) {
    return absl::FailedPreconditionError(absl::StrCat(
        "session ", session_id,
        " is not open here: a newer round of its job replaced it, or it "
        "belongs to another coordinator"));
  }

  static void Complete(Ready& ready) {
    for (auto& [done, outcome] : ready) done(std::move(outcome));
  }

  absl::Status RegisterLocked(uint64_t call_id,
                              const RegisterRankRequest& request,
                              Clock::time_point deadline, DoneFn& done,
                              Ready& ready) {
    if (shut_down_) return ShutDownError();
    const std::string& job_id = request.job_id();
    if (job_id.empty()) return absl::InvalidArgumentError("empty job_id");
    if (request.world_size() < 1 || request.rank() < 0 ||
        request.rank() >= request.world_size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("rank ", request.rank(), " is not a rank of a world of ",
                       request.world_size()));
    }
    auto [job_it, first_of_job] = jobs_.try_emplace(job_id);
    Job& job = job_it->second;
    if (first_of_job) {
      job.newest_generation = request.generation();
    } else if (request.generation() < job.newest_generation) {
      return absl::FailedPreconditionError(absl::StrCat(
          "rank ", request.rank(), " of job '", job_id, "' has generation ",
          request.generation(), ", older than generation ",
          job.newest_generation,
          " that already registered: it is a stale rank of an earlier run"));
    } else if (request.generation() > job.newest_generation) {
      const std::string why =
          absl::StrCat("job '", job_id, "' was superseded by generation ",
                       request.generation(), " (this call had generation ",
                       job.newest_generation, ")");
      AbandonRoundLocked(job, absl::AbortedError(why), ready);
      CloseSessionsLocked(job, absl::AbortedError(why), ready);
      job.newest_generation = request.generation();
    }
    if (!job.round.has_value()) {
      job.round.emplace();
      job.round->generation = request.generation();
      job.round->world_size = request.world_size();
    }
    Round& round = *job.round;
    if (round.world_size != request.world_size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "rank ", request.rank(), " of job '", job_id, "' says world size ",
          request.world_size(), " but ranks ", RankList(round),
          " already registered with world size ", round.world_size));
    }
    if (round.ranks.count(request.rank()) > 0) {
      return absl::AlreadyExistsError(
          absl::StrCat("rank ", request.rank(), " of job '", job_id,
                       "' is already registered and waiting for its round; "
                       "two processes were given the same rank"));
    }
    Waiter w;
    w.kind = Waiter::Kind::kRegister;
    w.job_id = job_id;
    w.rank = request.rank();
    w.start = Clock::now();
    w.deadline = deadline;
    w.done = std::move(done);
    waiters_.emplace(call_id, std::move(w));
    round.ranks[request.rank()] = call_id;
    round.gave_up.erase(request.rank());
    if (static_cast<int>(round.ranks.size()) == round.world_size) {
      OpenSessionLocked(job_id, job, ready);
    }
    return absl::OkStatus();
  }

  // The round of `job` is complete: open its session (closing older ones:
  // every rank of the job has moved on) and answer every rank.
  void OpenSessionLocked(const std::string& job_id, Job& job, Ready& ready) {
    CloseSessionsLocked(
        job,
        absl::AbortedError(absl::StrCat("a newer round of job '", job_id,
                                        "' replaced this session")),
        ready);
    uint64_t session_id = 0;
    while (session_id == 0 || sessions_.count(session_id) > 0) {
      session_id = random_();
    }
    sessions_[session_id].job_id = job_id;
    job.sessions.insert(session_id);
    for (const auto& [rank, call_id] : job.round->ranks) {
      auto it = waiters_.find(call_id);
      Outcome outcome;
      outcome.session_id = session_id;
      ready.emplace_back(std::move(it->second.done), std::move(outcome));
      waiters_.erase(it);
    }
    job.round.reset();
  }

  void AbandonRoundLocked(Job& job, const absl::Status& why, Ready& ready) {
    if (!job.round.has_value()) return;
    for (const auto& [rank, call_id] : job.round->ranks) {
      auto it = waiters_.find(call_id);
      ready.emplace_back(std::move(it->second.done), Failure(why));
      waiters_.erase(it);
    }
    job.round.reset();
  }

  void CloseSessionsLocked(Job& job, const absl::Status& why, Ready& ready) {
    for (uint64_t session_id : job.sessions) {
      for (auto it = waiters_.begin(); it != waiters_.end();) {
        if (it->second.kind != Waiter::Kind::kRegister &&
            it->second.session_id == session_id) {
          ready.emplace_back(std::move(it->second.done), Failure(why));
          it = waiters_.erase(it);
        } else {
          ++it;
        }
      }
      sessions_.erase(session_id);
    }
    job.sessions.clear();
  }

  // Completes the waiters of `session` whose keys are all set.
  void WakeSessionWaitersLocked(uint64_t session_id, const Session& session,
                                Ready& ready) {
    for (auto it = waiters_.begin(); it != waiters_.end();) {
      const Waiter& w = it->second;
      if (w.kind == Waiter::Kind::kRegister || w.session_id != session_id ||
          !MissingKeys(session, w.keys).empty()) {
        ++it;
        continue;
      }
      Outcome outcome;
      if (w.kind == Waiter::Kind::kGet) {
        outcome.value = session.values.at(w.keys.front());
      }
      ready.emplace_back(std::move(it->second.done), std::move(outcome));
      it = waiters_.erase(it);
    }
  }

  static std::vector<std::string> MissingKeys(
      const Session& session, const std::vector<std::string>& keys) {
    std::vector<std::string> missing;
    for (const std::string& key : keys) {
      if (session.values.count(key) == 0) missing.push_back(key);
    }
    return missing;
  }

  static std::string RankList(const Round& round) {
    std::vector<int> ranks;
    for (const auto& [rank, call_id] : round.ranks) ranks.push_back(rank);
    return absl::StrCat("[", absl::StrJoin(ranks, ", "), "]");
  }

  // Why the waiter `w` timed out, naming what it still misses.
  absl::Status TimeoutError(const Waiter& w) const {
    const std::string waited = absl::StrFormat("%.1f s", SecondsSince(w.start));
    if (w.kind == Waiter::Kind::kRegister) {
      const Job& job = jobs_.at(w.job_id);
      const Round& round = *job.round;
      std::vector<int> missing;
      for (int r = 0; r < round.world_size; ++r) {
        if (round.ranks.count(r) == 0 && round.gave_up.count(r) == 0) {
          missing.push_back(r);
        }
      }
      return absl::DeadlineExceededError(absl::StrCat(
          "ranks [", absl::StrJoin(missing, ", "), "] of ", round.world_size,
          " did not register with the coordinator in ", waited, " (job '",
          w.job_id, "', generation ", round.generation,
          "; waiting: ", RankList(round), ", gave up: [",
          absl::StrJoin(round.gave_up, ", "), "])"));
    }
    auto session = sessions_.find(w.session_id);
    const std::vector<std::string> missing =
        session == sessions_.end() ? w.keys
                                   : MissingKeys(session->second, w.keys);
    return absl::DeadlineExceededError(
        absl::StrCat("keys ", QuotedKeys(missing), " of session ", w.session_id,
                     " were not set in ", waited));
  }

  void RemoveWaiterLocked(std::map<uint64_t, Waiter>::iterator it) {
    const Waiter& w = it->second;
    if (w.kind == Waiter::Kind::kRegister) {
      // The rank leaves its round, so that it can register again later.
      Job& job = jobs_.at(w.job_id);
      job.round->ranks.erase(w.rank);
      job.round->gave_up.insert(w.rank);
      if (job.round->ranks.empty()) job.round.reset();
    }
    waiters_.erase(it);
  }

  void TimerLoop() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!stop_timer_) {
      Ready ready;
      const Clock::time_point now = Clock::now();
      std::optional<Clock::time_point> next;
      // Messages first, removals after: ranks of one round that give up
      // together all name the same missing ranks.
      std::vector<uint64_t> expired;
      for (auto& [call_id, w] : waiters_) {
        if (w.deadline <= now) {
          ready.emplace_back(std::move(w.done), Failure(TimeoutError(w)));
          expired.push_back(call_id);
        } else if (!next || w.deadline < *next) {
          next = w.deadline;
        }
      }
      for (uint64_t call_id : expired) {
        RemoveWaiterLocked(waiters_.find(call_id));
      }
      if (!ready.empty()) {
        lock.unlock();
        Complete(ready);
        lock.lock();
        continue;
      }
      if (next) {
        cv_.wait_until(lock, *next);
      } else {
        cv_.wait(lock);
      }
    }
  }

  const CoordinatorOptions options_;
  std::mutex mu_;
  // Wakes the timer thread: a waiter was added, or it must stop.
  std::condition_variable cv_;
  bool shut_down_ = false;
  bool stop_timer_ = false;
  uint64_t next_call_id_ = 1;
  // Session ids are random so that a rank holding an id from a coordinator
  // that restarted cannot land in a new job's session.
  std::mt19937_64 random_;
  std::map<std::string, Job> jobs_;
  std::map<uint64_t, Session> sessions_;
  std::map<uint64_t, Waiter> waiters_;
  std::thread timer_;
};

namespace {

// A call that may wait: completed by the state through its DoneFn, or here
// when gRPC cancels it while it still waits. gRPC deletes it after Finish.
class WaitingCall final : public grpc::ServerUnaryReactor {
 public:
  WaitingCall(CoordinatorState* state, uint64_t call_id)
      : state_(state), call_id_(call_id) {}

  void OnCancel() override {
    // When the state no longer holds the call it has finished it (or is
    // about to), and finishing twice is not allowed.
    if (state_->Cancel(call_id_)) Finish(grpc::Status::CANCELLED);
  }
  void OnDone() override { delete this; }

 private:
  CoordinatorState* state_;
  const uint64_t call_id_;
};

// When a waiting call gives up: a little before the client's deadline, so
// that the answer naming what is missing arrives before the client's own
// DEADLINE_EXCEEDED, and never later than max_wait_seconds.
Clock::time_point WaitDeadline(const grpc::CallbackServerContext* context,
                               double max_wait_seconds) {
  using std::chrono::duration_cast;
  using std::chrono::nanoseconds;
  const auto max_wait = duration_cast<nanoseconds>(
      std::chrono::duration<double>(max_wait_seconds));
  auto remaining = max_wait;
  const auto client_deadline = context->deadline();
  const auto now = std::chrono::system_clock::now();
  if (client_deadline - now < max_wait) {
    remaining = duration_cast<nanoseconds>(client_deadline - now);
    const auto margin =
        std::min<nanoseconds>(std::chrono::milliseconds(200), remaining / 5);
    remaining = std::max<nanoseconds>(nanoseconds(0), remaining - margin);
  }
  return Clock::now() + remaining;
}

}  // namespace

absl::Status CoordinatorOptions::Validate() const {
  if (!(max_wait_seconds > 0)) {
    return absl::InvalidArgumentError("max_wait_seconds must be > 0");
  }
  if (max_value_bytes <= 0) {
    return absl::InvalidArgumentError("max_value_bytes must be > 0");
  }
  if (!join_token.empty()) {
    RETURN_IF_ERROR(ValidateSecretToken(join_token, "the join token"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<CoordinatorService>> CoordinatorService::Create(
    const CoordinatorOptions& options) {
  RETURN_IF_ERROR(options.Validate());
  return std::unique_ptr<CoordinatorService>(new CoordinatorService(options));
}

CoordinatorService::CoordinatorService(const CoordinatorOptions& options)
    : options_(options), state_(std::make_unique<CoordinatorState>(options)) {}

CoordinatorService::~CoordinatorService() = default;

void CoordinatorService::Shutdown() { state_->Shutdown(); }

grpc::ServerUnaryReactor* CoordinatorService::RefuseWithoutToken(
    grpc::CallbackServerContext* context, absl::string_view rpc) {
  if (options_.join_token.empty()) return nullptr;
  const BearerMatch match = MatchBearerToken(*context, options_.join_token);
  if (match == BearerMatch::kMatches) return nullptr;
  // Says whether a token came, never how close it was.
  const std::string why =
      match == BearerMatch::kMissing
          ? "join token rejected: the call carries no \"authorization: "
            "Bearer <token>\" metadata"
          : "join token rejected";
  spdlog::warn("coordinator: refused {} from {}: {}", std::string(rpc),
               context->peer(), why);
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status(grpc::StatusCode::UNAUTHENTICATED, why));
  return reactor;
}

grpc::ServerUnaryReactor* CoordinatorService::RegisterRank(
    grpc::CallbackServerContext* context, const RegisterRankRequest* request,
    RegisterRankResponse* response) {
  if (auto* refused = RefuseWithoutToken(context, "RegisterRank")) {
    return refused;
  }
  const uint64_t call_id = state_->NextCallId();
  auto* call = new WaitingCall(state_.get(), call_id);
  state_->RegisterRank(call_id, *request,
                       WaitDeadline(context, options_.max_wait_seconds),
                       [call, response](CoordinatorState::Outcome outcome) {
                         response->set_session_id(outcome.session_id);
                         call->Finish(ToGrpcStatus(outcome.status));
                       });
  return call;
}

grpc::ServerUnaryReactor* CoordinatorService::StoreSet(
    grpc::CallbackServerContext* context, const StoreSetRequest* request,
    StoreSetResponse* response) {
  if (auto* refused = RefuseWithoutToken(context, "StoreSet")) return refused;
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(state_->StoreSet(*request)));
  return reactor;
}

grpc::ServerUnaryReactor* CoordinatorService::StoreGet(
    grpc::CallbackServerContext* context, const StoreGetRequest* request,
    StoreGetResponse* response) {
  if (auto* refused = RefuseWithoutToken(context, "StoreGet")) return refused;
  const uint64_t call_id = state_->NextCallId();
  auto* call = new WaitingCall(state_.get(), call_id);
  state_->StoreWait(call_id, request->session_id(), {request->key()},
                    /*want_value=*/true,
                    WaitDeadline(context, options_.max_wait_seconds),
                    [call, response](CoordinatorState::Outcome outcome) {
                      *response->mutable_value() = std::move(outcome.value);
                      call->Finish(ToGrpcStatus(outcome.status));
                    });
  return call;
}

grpc::ServerUnaryReactor* CoordinatorService::StoreWait(
    grpc::CallbackServerContext* context, const StoreWaitRequest* request,
    StoreWaitResponse* response) {
  if (auto* refused = RefuseWithoutToken(context, "StoreWait")) {
    return refused;
  }
  const uint64_t call_id = state_->NextCallId();
  auto* call = new WaitingCall(state_.get(), call_id);
  state_->StoreWait(
      call_id, request->session_id(),
      std::vector<std::string>(request->keys().begin(), request->keys().end()),
      /*want_value=*/false, WaitDeadline(context, options_.max_wait_seconds),
      [call](CoordinatorState::Outcome outcome) {
        call->Finish(ToGrpcStatus(outcome.status));
      });
  return call;
}

grpc::ServerUnaryReactor* CoordinatorService::Heartbeat(
    grpc::CallbackServerContext* context, const HeartbeatRequest* request,
    HeartbeatResponse* response) {
  if (auto* refused = RefuseWithoutToken(context, "Heartbeat")) {
    return refused;
  }
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (request->job_id().empty() || request->rank() < 0) {
    reactor->Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                 "Heartbeat: needs a job_id and a rank >= 0"));
    return reactor;
  }
  {
    std::lock_guard<std::mutex> lock(beats_mu_);
    beats_[request->job_id()][request->rank()] =
        Beat{request->host(), std::chrono::steady_clock::now()};
  }
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

std::vector<RankHeartbeat> CoordinatorService::Heartbeats(
    const std::string& job_id) const {
  std::vector<RankHeartbeat> out;
  const auto now = std::chrono::steady_clock::now();
  std::lock_guard<std::mutex> lock(beats_mu_);
  const auto job = beats_.find(job_id);
  if (job == beats_.end()) return out;
  for (const auto& [rank, beat] : job->second) {
    out.push_back(RankHeartbeat{
        rank, beat.host, std::chrono::duration<double>(now - beat.at).count()});
  }
  return out;
}

// ------------------------------------------------------------------ server

absl::Status CoordinatorServerOptions::Validate() const {
  if (listen_address.empty() || listen_address.find(':') == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("listen_address '", listen_address, "' is not host:port"));
  }
  RETURN_IF_ERROR(tls.Validate());
  return coordinator.Validate();
}

absl::StatusOr<std::unique_ptr<CoordinatorServer>> CoordinatorServer::Start(
    const CoordinatorServerOptions& options) {
  RETURN_IF_ERROR(options.Validate());
  ASSIGN_OR_RETURN(std::shared_ptr<grpc::ServerCredentials> credentials,
                   MakeServerCredentials(options.tls));
  ASSIGN_OR_RETURN(std::unique_ptr<CoordinatorService> service,
                   CoordinatorService::Create(options.coordinator));
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(options.listen_address, credentials, &port);
  // The port is this coordinator's alone: with SO_REUSEPORT (gRPC's
  // default) a second job's rank 0 would share it and split the ranks.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.RegisterService(service.get());
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    return ListenFailure("--coordinator", options.listen_address);
  }
  const std::string host =
      options.listen_address.substr(0, options.listen_address.rfind(':'));
  return std::unique_ptr<CoordinatorServer>(
      new CoordinatorServer(std::move(service), std::move(server),
                            absl::StrCat(host, ":", port), port));
}

CoordinatorServer::CoordinatorServer(
    std::unique_ptr<CoordinatorService> service,
    std::unique_ptr<grpc::Server> server, std::string address, int port)
    : service_(std::move(service)),
      server_(std::move(server)),
      address_(std::move(address)),
      port_(port) {}

CoordinatorServer::~CoordinatorServer() {
  service_->Shutdown();
  // A rank's heartbeat cut off mid-call (a partitioned link) would hold a
  // Shutdown without a deadline forever; after it, calls are cancelled.
  server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  server_->Wait();
}

// ------------------------------------------------------------------ client

absl::Status CoordinatorClientOptions::Validate() const {
  RETURN_IF_ERROR(tls.Validate());
  if (!join_token.empty()) {
    RETURN_IF_ERROR(ValidateSecretToken(join_token, "the join token"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<CoordinatorClient>> CoordinatorClient::Create(
    const std::string& address, const CoordinatorClientOptions& options) {
  if (address.empty()) {
    return absl::InvalidArgumentError("empty coordinator address");
  }
  RETURN_IF_ERROR(options.Validate());
  grpc::ChannelArguments args;
  // Ranks usually start before rank 0's coordinator listens; gRPC's default
  // reconnect backoff (1 s growing to 120 s) would make them miss it for
  // long after it came up.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 50);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 50);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 500);
  ASSIGN_OR_RETURN(std::shared_ptr<grpc::Channel> channel,
                   MakeChannel(address, options.tls, args));
  return std::unique_ptr<CoordinatorClient>(
      new CoordinatorClient(address, options, std::move(channel)));
}

CoordinatorClient::CoordinatorClient(std::string address,
                                     CoordinatorClientOptions options,
                                     std::shared_ptr<grpc::Channel> channel)
    : address_(std::move(address)),
      options_(std::move(options)),
      channel_(std::move(channel)),
      stub_(Coordinator::NewStub(channel_)) {}

void CoordinatorClient::PrepareContext(grpc::ClientContext& context,
                                       double timeout_seconds) const {
  context.set_deadline(std::chrono::system_clock::now() +
                       ToSystemDuration(timeout_seconds));
  context.set_wait_for_ready(true);
  if (!options_.join_token.empty()) {
    context.AddMetadata(kAuthorizationKey, BearerValue(options_.join_token));
  }
}

std::string CoordinatorClient::LastConnectionError() const {
  // Without wait_for_ready a call on a channel that failed to connect ends
  // at once with gRPC's last connection error. The request is one the
  // service refuses at once (no key), should the channel connect now.
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::milliseconds(500));
  if (!options_.join_token.empty()) {
    context.AddMetadata(kAuthorizationKey, BearerValue(options_.join_token));
  }
  StoreGetRequest request;
  StoreGetResponse response;
  const grpc::Status status = stub_->StoreGet(&context, request, &response);
  if (status.error_code() != grpc::StatusCode::UNAVAILABLE) return "";
  return status.error_message();
}

absl::Status CoordinatorClient::CallError(const grpc::Status& status,
                                          absl::string_view rpc,
                                          double timeout_seconds) const {
  const auto code = static_cast<absl::StatusCode>(status.error_code());
  if (code == absl::StatusCode::kUnauthenticated) {
    return absl::UnauthenticatedError(absl::StrCat(
        "the coordinator at ", address_, " refused this rank's join token (",
        options_.join_token.empty() ? "this rank has none"
                                    : "it is not the coordinator's",
        "): ", rpc, ": ", status.error_message()));
  }
  // A deadline that gRPC itself enforced (the coordinator never answered)
  // has no message of ours; say whether the coordinator was reachable, and
  // why not when gRPC knows (refused, a TLS handshake that failed).
  if (code == absl::StatusCode::kDeadlineExceeded &&
      channel_->GetState(false) != GRPC_CHANNEL_READY) {
    const TlsClientOptions& tls = options_.tls;
    const std::string hint =
        tls.enabled
            ? absl::StrCat(
                  "is rank 0 up, at this address, and does its TLS "
                  "certificate chain to this rank's CA and carry the name ",
                  tls.server_name.empty()
                      ? address_.substr(0, address_.rfind(':'))
                      : tls.server_name,
                  "?")
            : "is rank 0 up, at this address, and without TLS like this "
              "rank?";
    const std::string last = LastConnectionError();
    return absl::DeadlineExceededError(absl::StrFormat(
        "coordinator %s: %s: could not reach the coordinator in %.1f s (%s)%s",
        address_, rpc, timeout_seconds, hint,
        last.empty() ? "" : absl::StrCat("; last connection error: ", last)));
  }
  return absl::Status(code, absl::StrCat("coordinator ", address_, ": ", rpc,
                                         ": ", status.error_message()));
}

absl::StatusOr<uint64_t> CoordinatorClient::RegisterRank(
    std::string_view job_id, int64_t generation, int rank, int world_size,
    double timeout_seconds) {
  RegisterRankRequest request;
  request.set_job_id(std::string(job_id));
  request.set_generation(generation);
  request.set_rank(rank);
  request.set_world_size(world_size);
  RegisterRankResponse response;
  grpc::ClientContext context;
  PrepareContext(context, timeout_seconds);
  const grpc::Status status = stub_->RegisterRank(&context, request, &response);
  if (!status.ok()) return CallError(status, "RegisterRank", timeout_seconds);
  return response.session_id();
}

absl::Status CoordinatorClient::StoreSet(uint64_t session_id,
                                         std::string_view key,
                                         std::string_view value,
                                         double timeout_seconds) {
  StoreSetRequest request;
  request.set_session_id(session_id);
  request.set_key(std::string(key));
  request.set_value(std::string(value));
  StoreSetResponse response;
  grpc::ClientContext context;
  PrepareContext(context, timeout_seconds);
  const grpc::Status status = stub_->StoreSet(&context, request, &response);
  if (!status.ok()) return CallError(status, "StoreSet", timeout_seconds);
  return absl::OkStatus();
}

absl::Status CoordinatorClient::Heartbeat(std::string_view job_id, int rank,
                                          std::string_view host,
                                          double timeout_seconds) {
  HeartbeatRequest request;
  request.set_job_id(std::string(job_id));
  request.set_rank(rank);
  request.set_host(std::string(host));
  HeartbeatResponse response;
  grpc::ClientContext context;
  PrepareContext(context, timeout_seconds);
  const grpc::Status status = stub_->Heartbeat(&context, request, &response);
  if (!status.ok()) return CallError(status, "Heartbeat", timeout_seconds);
  return absl::OkStatus();
}

absl::StatusOr<std::string> CoordinatorClient::StoreGet(
    uint64_t session_id, std::string_view key, double timeout_seconds) {
  StoreGetRequest request;
  request.set_session_id(session_id);
  request.set_key(std::string(key));
  StoreGetResponse response;
  grpc::ClientContext context;
  PrepareContext(context, timeout_seconds);
  const grpc::Status status = stub_->StoreGet(&context, request, &response);
  if (!status.ok()) return CallError(status, "StoreGet", timeout_seconds);
  return std::move(*response.mutable_value());
}

absl::Status CoordinatorClient::StoreWait(uint64_t session_id,
                                          const std::vector<std::string>& keys,
                                          double timeout_seconds) {
  StoreWaitRequest request;
  request.set_session_id(session_id);
  for (const std::string& key : keys) request.add_keys(key);
  StoreWaitResponse response;
  grpc::ClientContext context;
  PrepareContext(context, timeout_seconds);
  const grpc::Status status = stub_->StoreWait(&context, request, &response);
  if (!status.ok()) return CallError(status, "StoreWait", timeout_seconds);
  return absl::OkStatus();
}

// ------------------------------------------------------------- gloo store

CoordinatorStore::CoordinatorStore(CoordinatorClient* client,
                                   uint64_t session_id, double timeout_seconds)
    : client_(client),
      session_id_(session_id),
      deadline_(Clock::now() +
                std::chrono::duration_cast<Clock::duration>(
                    std::chrono::duration<double>(timeout_seconds))) {}

double CoordinatorStore::CallTimeout(double requested) const {
  const double left =
      std::chrono::duration<double>(deadline_ - Clock::now()).count();
  // A call with no time left still goes out, briefly, so that it reports
  // what is missing instead of failing blind.
  const double capped = requested > 0 ? std::min(requested, left) : left;
  return std::max(capped, 0.05);
}

void CoordinatorStore::Throw(absl::Status status) {
  last_error_ = std::move(status);
  throw gloo::IoException(std::string(last_error_.message()));
}

void CoordinatorStore::set(const std::string& key,
                           const std::vector<char>& data) {
  absl::Status status = client_->StoreSet(
      session_id_, key, std::string_view(data.data(), data.size()),
      CallTimeout(0));
  if (!status.ok()) Throw(std::move(status));
}

std::vector<char> CoordinatorStore::get(const std::string& key) {
  absl::StatusOr<std::string> value =
      client_->StoreGet(session_id_, key, CallTimeout(0));
  if (!value.ok()) Throw(std::move(value).status());
  return std::vector<char>(value->begin(), value->end());
}

void CoordinatorStore::wait(const std::vector<std::string>& keys) {
  wait(keys, std::chrono::milliseconds(0));
}

void CoordinatorStore::wait(const std::vector<std::string>& keys,
                            const std::chrono::milliseconds& timeout) {
  // gloo passes kNoTimeout (0) for "no timeout of its own".
  absl::Status status = client_->StoreWait(
      session_id_, keys,
      CallTimeout(std::chrono::duration<double>(timeout).count()));
  if (!status.ok()) Throw(std::move(status));
}

}  // namespace dlrm::comm
