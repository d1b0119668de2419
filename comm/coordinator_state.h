// The Coordinator service's state apart from gRPC (comm/coordinator_service.h
// wraps it): rounds of rank registration and the sessions' key-value
// stores. Internal to comm/.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "comm/coordinator_service.h"
#include "dlrm/coordinator.pb.h"

namespace dlrm::comm {

// Everything the service knows, apart from gRPC: jobs, their forming rounds,
// sessions with their key-value stores, and the calls waiting on them. A
// waiting call is completed exactly once, outside the lock: by the event it
// waits for, by its deadline (a timer thread), by Cancel, or by Shutdown.
// Thread-safe.
class CoordinatorState {
 public:
  using Clock = std::chrono::steady_clock;
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

  // An Outcome of `status` (not OK).
  static Outcome Failure(absl::Status status);

  // Starts the timer thread that times waiting calls out.
  explicit CoordinatorState(const CoordinatorOptions& options);
  // Shutdown, then stops the timer thread.
  ~CoordinatorState();

  // An id for a waiting call, unique for this state's life.
  uint64_t NextCallId();

  // Joins `request`'s rank to its job's next round; `done` gets the
  // session id once the round is complete, or why it failed (at once for a
  // refused request, at `deadline` when ranks are missing).
  void RegisterRank(uint64_t call_id, const RegisterRankRequest& request,
                    Clock::time_point deadline, DoneFn done);

  // Sets a key of a session and wakes the calls waiting for it.
  // InvalidArgument for an empty key or a value over max_value_bytes,
  // FailedPrecondition for an unknown session, Unavailable once shut down.
  absl::Status StoreSet(const StoreSetRequest& request);

  // Waits for `keys` of `session_id`; with `want_value` (StoreGet, one key)
  // the outcome carries the key's value.
  void StoreWait(uint64_t call_id, uint64_t session_id,
                 std::vector<std::string> keys, bool want_value,
                 Clock::time_point deadline, DoneFn done);

  // Forgets the waiting call `call_id` without completing it; false when it
  // is not waiting (never was, or already completed).
  bool Cancel(uint64_t call_id);

  // Completes every waiting call, and refuses every later one, with
  // Unavailable.
  void Shutdown();

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

  static absl::Status ShutDownError();

  static absl::Status UnknownSession(uint64_t session_id);

  static void Complete(Ready& ready);

  absl::Status RegisterLocked(uint64_t call_id,
                              const RegisterRankRequest& request,
                              Clock::time_point deadline, DoneFn& done,
                              Ready& ready);

  // The round of `job` is complete: open its session (closing older ones:
  // every rank of the job has moved on) and answer every rank.
  void OpenSessionLocked(const std::string& job_id, Job& job, Ready& ready);

  void AbandonRoundLocked(Job& job, const absl::Status& why, Ready& ready);

  void CloseSessionsLocked(Job& job, const absl::Status& why, Ready& ready);

  // Completes the waiters of `session` whose keys are all set.
  void WakeSessionWaitersLocked(uint64_t session_id, const Session& session,
                                Ready& ready);

  static std::vector<std::string> MissingKeys(
      const Session& session, const std::vector<std::string>& keys);

  static std::string RankList(const Round& round);

  // Why the waiter `w` timed out, naming what it still misses.
  absl::Status TimeoutError(const Waiter& w) const;

  void RemoveWaiterLocked(std::map<uint64_t, Waiter>::iterator it);

  void TimerLoop();

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

}  // namespace dlrm::comm
