// CommandChannel: the leader's broadcasts and heartbeat thread, the
// followers' receive loop, and the broken state.
#include "comm/command_channel.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

namespace dlrm::comm {

absl::Status CommandChannelOptions::Validate() const {
  if (words < 1) {
    return absl::InvalidArgumentError("words must be at least 1");
  }
  if (!(heartbeat_seconds > 0)) {
    return absl::InvalidArgumentError("heartbeat_seconds must be positive");
  }
  return absl::OkStatus();
}

CommandChannel::CommandChannel(Communicator* comm,
                               CommandChannelOptions options)
    : comm_(comm),
      options_(std::move(options)),
      rank_(comm->rank()),
      world_(comm->world_size()),
      command_(options_.words, 0),
      last_command_(std::chrono::steady_clock::now()) {
  if (rank_ == 0 && world_ > 1) {
    heartbeat_ = std::thread([this] { HeartbeatLoop(); });
  }
}

CommandChannel::~CommandChannel() { StopHeartbeat(); }

void CommandChannel::StopHeartbeat() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_heartbeat_ = true;
  }
  heartbeat_cv_.notify_all();
  if (heartbeat_.joinable()) heartbeat_.join();
}

absl::Status CommandChannel::broken() const {
  std::lock_guard<std::mutex> lock(state_mu_);
  return broken_;
}

absl::Status CommandChannel::Break(const absl::Status& status,
                                   absl::string_view what) {
  {
    std::lock_guard<std::mutex> lock(state_mu_);
    if (!broken_.ok()) return broken_;
  }
  std::string message =
      absl::StrCat(options_.name, " of rank ", rank_, " of ", world_,
                   " failed during ", what, ": ", status.message());
  if (rank_ == 0 && options_.describe_break) {
    absl::StrAppend(&message, options_.describe_break());
  }
  {
    std::lock_guard<std::mutex> lock(state_mu_);
    if (!broken_.ok()) return broken_;
    broken_ = absl::UnavailableError(message);
  }
  spdlog::error("{}", message);
  if (options_.on_break) options_.on_break();
  return absl::UnavailableError(message);
}

absl::Status CommandChannel::Broadcast(absl::string_view what) {
  last_command_ = std::chrono::steady_clock::now();
  const absl::Status s =
      comm_->Broadcast(command_.data(), static_cast<int64_t>(command_.size()),
                       DataType::kInt64, 0);
  if (!s.ok()) return Break(s, what);
  return absl::OkStatus();
}

absl::Status CommandChannel::Send(std::vector<int64_t> command,
                                  absl::string_view what) {
  if (command.size() > command_.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("a command of ", command.size(), " words; the channel's ",
                     "are ", command_.size()));
  }
  if (absl::Status b = broken(); !b.ok()) return b;
  command.resize(command_.size(), 0);
  command_ = std::move(command);
  return Broadcast(what);
}

absl::Status CommandChannel::Receive(std::vector<int64_t>* command) {
  command->assign(command_.size(), 0);
  for (;;) {
    const absl::Status s =
        comm_->Broadcast(command->data(), static_cast<int64_t>(command->size()),
                         DataType::kInt64, 0);
    if (!s.ok()) {
      const absl::Status lost = absl::UnavailableError(absl::StrCat(
          "rank ", rank_, " lost the leader (rank 0) while ", "waiting for ",
          options_.waiting_for, ": ", s.message()));
      {
        std::lock_guard<std::mutex> lock(state_mu_);
        if (broken_.ok()) broken_ = lost;
      }
      return lost;
    }
    if ((*command)[0] != kHeartbeatOp) return absl::OkStatus();
  }
}

void CommandChannel::HeartbeatLoop() {
  const auto period = std::chrono::duration_cast<std::chrono::nanoseconds>(
      std::chrono::duration<double>(options_.heartbeat_seconds));
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_heartbeat_) {
    heartbeat_cv_.wait_for(lock, period / 2);
    if (stop_heartbeat_ || closed_ || !broken().ok()) continue;
    if (std::chrono::steady_clock::now() - last_command_ >= period) {
      std::fill(command_.begin(), command_.end(), 0);
      command_[0] = kHeartbeatOp;
      // An error is recorded by Break() and logged there.
      Broadcast("heartbeat").IgnoreError();
    }
  }
}

}  // namespace dlrm::comm
