// Rank registration in rounds and the sessions' key-value stores with
// blocking reads (comm/coordinator_state.h).
#include "comm/coordinator_state.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace dlrm::comm {
namespace {

using Clock = CoordinatorState::Clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
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

CoordinatorState::Outcome CoordinatorState::Failure(absl::Status status) {
  Outcome outcome;
  outcome.status = std::move(status);
  return outcome;
}

CoordinatorState::CoordinatorState(const CoordinatorOptions& options)
    : options_(options), random_(std::random_device{}()) {
  timer_ = std::thread([this] { TimerLoop(); });
}

CoordinatorState::~CoordinatorState() {
  Shutdown();
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_timer_ = true;
  }
  cv_.notify_all();
  timer_.join();
}

uint64_t CoordinatorState::NextCallId() {
  std::lock_guard<std::mutex> lock(mu_);
  return next_call_id_++;
}

void CoordinatorState::RegisterRank(uint64_t call_id,
                                    const RegisterRankRequest& request,
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

absl::Status CoordinatorState::StoreSet(const StoreSetRequest& request) {
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

void CoordinatorState::StoreWait(uint64_t call_id, uint64_t session_id,
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

bool CoordinatorState::Cancel(uint64_t call_id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = waiters_.find(call_id);
  if (it == waiters_.end()) return false;
  RemoveWaiterLocked(it);
  return true;
}

void CoordinatorState::Shutdown() {
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

absl::Status CoordinatorState::ShutDownError() {
  return absl::UnavailableError("the coordinator is shutting down");
}

absl::Status CoordinatorState::UnknownSession(uint64_t session_id) {
  return absl::FailedPreconditionError(absl::StrCat(
      "session ", session_id,
      " is not open here: a newer round of its job replaced it, or it "
      "belongs to another coordinator"));
}

void CoordinatorState::Complete(Ready& ready) {
  for (auto& [done, outcome] : ready) done(std::move(outcome));
}

absl::Status CoordinatorState::RegisterLocked(
    uint64_t call_id, const RegisterRankRequest& request,
    Clock::time_point deadline, DoneFn& done, Ready& ready) {
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
        request.generation(), ", older than generation ", job.newest_generation,
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

void CoordinatorState::OpenSessionLocked(const std::string& job_id, Job& job,
                                         Ready& ready) {
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

void CoordinatorState::AbandonRoundLocked(Job& job, const absl::Status& why,
                                          Ready& ready) {
  if (!job.round.has_value()) return;
  for (const auto& [rank, call_id] : job.round->ranks) {
    auto it = waiters_.find(call_id);
    ready.emplace_back(std::move(it->second.done), Failure(why));
    waiters_.erase(it);
  }
  job.round.reset();
}

void CoordinatorState::CloseSessionsLocked(Job& job, const absl::Status& why,
                                           Ready& ready) {
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

void CoordinatorState::WakeSessionWaitersLocked(uint64_t session_id,
                                                const Session& session,
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

std::vector<std::string> CoordinatorState::MissingKeys(
    const Session& session, const std::vector<std::string>& keys) {
  std::vector<std::string> missing;
  for (const std::string& key : keys) {
    if (session.values.count(key) == 0) missing.push_back(key);
  }
  return missing;
}

std::string CoordinatorState::RankList(const Round& round) {
  std::vector<int> ranks;
  for (const auto& [rank, call_id] : round.ranks) ranks.push_back(rank);
  return absl::StrCat("[", absl::StrJoin(ranks, ", "), "]");
}

absl::Status CoordinatorState::TimeoutError(const Waiter& w) const {
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
  return absl::DeadlineExceededError(absl::StrCat("keys ", QuotedKeys(missing),
                                                  " of session ", w.session_id,
                                                  " were not set in ", waited));
}

void CoordinatorState::RemoveWaiterLocked(
    std::map<uint64_t, Waiter>::iterator it) {
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

void CoordinatorState::TimerLoop() {
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

}  // namespace dlrm::comm
