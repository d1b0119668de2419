// RankGroup's followers (ranks > 0): Follow() sends the rank's heartbeats
// and serves predictions beside training while FollowCommands obeys the
// leader's commands, running each operation's part of every rank.
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "server/rank_group.h"
#include "spdlog/spdlog.h"

namespace dlrm::server {

absl::Status RankGroup::Follow() {
  if (rank_ == 0) {
    return absl::FailedPreconditionError("rank 0 leads; it does not follow");
  }
  // Heartbeats to rank 0's coordinator, which names this rank if it dies
  // or freezes.
  std::mutex beat_mu;
  std::condition_variable beat_cv;
  bool stop_beats = false;
  std::thread beats;
  if (options_.send_heartbeat) {
    beats = std::thread([&] {
      bool failing = false;
      std::unique_lock<std::mutex> lock(beat_mu);
      while (!stop_beats) {
        lock.unlock();
        const absl::Status s = options_.send_heartbeat();
        if (!s.ok() && !failing) {
          spdlog::warn("rank {}: heartbeat to rank 0 failed: {}", rank_,
                       s.ToString());
        }
        failing = !s.ok();
        lock.lock();
        beat_cv.wait_for(lock,
                         std::chrono::duration<double>(kRankHeartbeatSeconds));
      }
    });
  }
  const auto stop = [&] {
    {
      std::lock_guard<std::mutex> lock(beat_mu);
      stop_beats = true;
    }
    beat_cv.notify_all();
    if (beats.joinable()) beats.join();
  };
  if (predictor_ == nullptr) {
    const absl::Status s = FollowCommands();
    stop();
    return s;
  }
  std::thread predictions([this] {
    const absl::Status s = predictor_->Serve();
    if (!s.ok()) {
      spdlog::error("rank {}: predictions beside training ended: {}", rank_,
                    std::string(s.message()));
    }
  });
  const absl::Status s = FollowCommands();
  // The leader stops the prediction loop before it says Shutdown; when the
  // leader is gone, the loop's communicator fails too (at the latest after
  // its op timeout).
  predictions.join();
  stop();
  return s;
}

absl::Status RankGroup::FollowCommands() {
  std::vector<int64_t> command;
  data::Batch slice, next_slice;
  std::string path;
  for (;;) {
    absl::Status s = channel_->Receive(&command);
    if (!s.ok()) return s;
    const std::vector<int64_t> bytes(command.begin() + kHeader, command.end());
    const int64_t op = command[0];
    switch (op) {
      case kTrain:
      case kPredict:
        s = ScatterBatch({}, bytes, op == kTrain, &slice);
        if (s.ok() && command[1] == 1) s = ScatterNext(nullptr, &next_slice);
        if (s.ok()) {
          s = RunStep(slice, command[1] == 1 ? &next_slice : nullptr,
                      op == kTrain, {}, nullptr, nullptr);
        }
        break;
      case kSave:
        s = BroadcastString(&path, command[1]);
        if (s.ok()) s = RunCheckpoint(/*save=*/true, path, "", nullptr);
        break;
      case kRestore:
        s = BroadcastString(&path, command[1]);
        if (s.ok()) s = RunCheckpoint(/*save=*/false, path, "", nullptr);
        if (usable()) RestoreDone().IgnoreError();
        break;
      case kChecksum:
        s = RunChecksum(nullptr);
        break;
      case kExport:
        s = FollowExport();
        break;
      case kData:
        s = BroadcastString(&path, command[1]);
        if (s.ok()) s = SetData(path);
        break;
      case kTrainAt: {
        const SampleRange next{command[4], command[5]};
        s = RunStepAt({command[2], command[3]},
                      command[1] == 1 ? &next : nullptr, nullptr);
        break;
      }
      case kSetOptimizers:
        s = BroadcastString(&path, command[1]);
        if (s.ok()) s = ApplyOptimizers(path);
        break;
      case kShutdown:
        return absl::OkStatus();
      default:
        return absl::InternalError(
            absl::StrCat("rank ", rank_, ": unknown command ", op));
    }
    if (!usable()) return channel_->broken();
    if (!s.ok()) {
      spdlog::warn("rank {}: {} refused: {}", rank_, OpName(op),
                   std::string(s.message()));
    }
  }
}

}  // namespace dlrm::server
