// CommandChannel: how a leader (rank 0) tells its followers what to do next
// over one communicator: fixed-size commands by broadcast, heartbeats while
// the leader is idle, and a broken state after the first communicator
// error. The server's rank group (server::RankGroup) and the predictions
// beside training (model::RanksPredictor) each run their protocol on one.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "comm/communicator.h"

namespace dlrm::comm {

struct CommandChannelOptions {
  // Words in every command; word 0 is the op, kHeartbeatOp reserved.
  // Default: 2.
  int words = 2;
  // While idle the leader sends a heartbeat this often, in seconds, so that
  // followers waiting for a command do not hit the communicator's op
  // timeout, and a dead rank is noticed between operations. Must be below
  // that timeout. Default: 10.
  double heartbeat_seconds = 10;
  // Names the communicator in errors ("communicator of rank 1 of 2 failed
  // during ..."). Default: "communicator".
  std::string name = "communicator";
  // What followers wait for, in their error when the leader is lost
  // ("rank 1 lost the leader (rank 0) while waiting for a command").
  // Default: "a command".
  std::string waiting_for = "a command";
  // Leader: appended to the error that breaks the channel (e.g. which ranks
  // went silent); called once, with the channel's lock held. Null: nothing.
  // Default: null.
  std::function<std::string()> describe_break;
  // Called once when the channel breaks, after the error is recorded, with
  // the lock held (e.g. to stop what depends on the ranks). Null: nothing.
  // Default: null.
  std::function<void()> on_break;

  absl::Status Validate() const;
};

// One rank's end of the channel. The leader's operations hold Lock() across
// their command and every collective that follows it, so that a heartbeat
// never falls between them; Break() and broken() may be called from any
// thread. Followers call Receive() from one thread. Borrows `comm`, which
// must outlive the channel.
class CommandChannel {
 public:
  // The op of a heartbeat; followers' Receive() skips it.
  static constexpr int64_t kHeartbeatOp = 1;

  // `options` must be valid (Validate()). The leader of several ranks
  // starts its heartbeat thread here.
  CommandChannel(Communicator* comm, CommandChannelOptions options);
  // Stops the heartbeat thread.
  ~CommandChannel();
  CommandChannel(const CommandChannel&) = delete;
  CommandChannel& operator=(const CommandChannel&) = delete;

  int rank() const { return rank_; }
  int world_size() const { return world_; }
  Communicator& communicator() { return *comm_; }

  // The lock of the leader's operations (the heartbeat takes it too).
  std::unique_lock<std::mutex> Lock() {
    return std::unique_lock<std::mutex>(mu_);
  }

  // Leader, with Lock() held: broadcasts `command` (padded with zeros to
  // options.words; longer is InvalidArgument). A communicator error breaks
  // the channel; returns the broken error, naming `what`. Unavailable when
  // already broken.
  absl::Status Send(std::vector<int64_t> command, absl::string_view what);

  // Follower: the next command that is not a heartbeat, options.words long.
  // A communicator error: Unavailable, "rank r lost the leader (rank 0)
  // while waiting for ...", which breaks the channel.
  absl::Status Receive(std::vector<int64_t>* command);

  // Records `status` (a communicator error during `what`) as the reason the
  // channel is broken, when it is the first; returns the broken error:
  // Unavailable, "<name> of rank r of R failed during <what>: <message>"
  // and, on the leader, options.describe_break()'s text.
  absl::Status Break(const absl::Status& status, absl::string_view what);

  // OK while usable, else the error that broke the channel.
  absl::Status broken() const;

  // Leader, with Lock() held: the last command has been sent (the
  // followers stop listening); no more heartbeats.
  void Close() { closed_ = true; }

  // Ends the heartbeat thread (the destructor's first step). Without the
  // lock held.
  void StopHeartbeat();

 private:
  void HeartbeatLoop();
  // Leader, with mu_ held: broadcasts command_ as it is.
  absl::Status Broadcast(absl::string_view what);

  Communicator* const comm_;
  const CommandChannelOptions options_;
  const int rank_, world_;

  std::mutex mu_;  // the leader's operations and the heartbeat
  std::vector<int64_t> command_;
  std::chrono::steady_clock::time_point last_command_;
  std::condition_variable heartbeat_cv_;
  bool stop_heartbeat_ = false;
  bool closed_ = false;  // guarded by mu_
  std::thread heartbeat_;

  mutable std::mutex state_mu_;  // guards broken_
  absl::Status broken_;          // the first communicator error
};

}  // namespace dlrm::comm
