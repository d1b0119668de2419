// CheckpointFollower: makes an inference-only server a replica that
// follows training (docs/server.md "Replicas that follow training"). It
// polls a checkpoint directory on shared storage, and swaps the newest
// complete checkpoint newer than the served one in through
// ModelHost::RestoreCheckpoint (a fresh model loaded beside the served
// one, checksums verified, then swapped: no prediction fails or waits).
// A damaged, half-written or foreign checkpoint is skipped with a warning
// and the served version stays.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "model/checkpoint.h"
#include "server/metrics.h"
#include "server/model_host.h"

namespace dlrm::server {

struct CheckpointFollowerOptions {
  // The directory the training server writes its checkpoints into
  // (ckpt-<step>, final, named saves). Default: empty (must be set).
  std::string dir;
  // Seconds between two looks at `dir`. Default: 5.
  double poll_seconds = 5;

  // InvalidArgument for an empty dir or a poll_seconds not > 0.
  absl::Status Validate() const;
};

// A fingerprint of the files under checkpoint directory `dir` (names,
// sizes, modification times) and of its manifest's commit time: it changes
// when a copy in progress writes more, or the checkpoint is replaced.
uint64_t CheckpointFilesFingerprint(const std::string& dir);

// Tells which checkpoints under a directory are newer than the served one
// and worth a try, remembering those that failed (by fingerprint, so one
// that changes gets another try). Not thread-safe; CheckpointFollower
// serialises it.
class CheckpointPicker {
 public:
  explicit CheckpointPicker(std::string dir) : dir_(std::move(dir)) {}

  // The checkpoints to try, best first: those under the directory whose
  // manifest reads, newer than `served` (by commit time, then step; every
  // one when served.created_ms < 0), not the served one and not known to
  // fail as they are. Logs a warning (once per state of its files) for a
  // checkpoint whose manifest is damaged and for a directory that has no
  // manifest yet (half-written), and counts each in `skipped`.
  std::vector<model::CheckpointEntry> Candidates(const ServedCheckpoint& served,
                                                 int* skipped);
  // Records that `entry` failed to load with `error`; logs the warning.
  void Failed(const model::CheckpointEntry& entry, const absl::Status& error);

 private:
  // True the first time `name` is seen with `fingerprint` in `seen`.
  static bool FirstSight(std::map<std::string, uint64_t>& seen,
                         const std::string& name, uint64_t fingerprint);

  const std::string dir_;
  // By directory name: the fingerprint of a checkpoint that failed to
  // load, of a damaged manifest, of a directory without one.
  std::map<std::string, uint64_t> failed_, damaged_, incomplete_;
};

// Thread-safe. Stops (and joins its thread) on destruction.
class CheckpointFollower {
 public:
  // Follows options.dir for `host` (borrowed, inference-only, must outlive
  // the follower), counting swaps and skips in `metrics` (borrowed, may be
  // null): polls every options.poll_seconds on its own thread, the first
  // time one interval after the start. InvalidArgument for bad options or
  // a host that is not inference-only.
  static absl::StatusOr<std::unique_ptr<CheckpointFollower>> Start(
      ModelHost* host, ServerMetrics* metrics,
      CheckpointFollowerOptions options);

  ~CheckpointFollower();
  CheckpointFollower(const CheckpointFollower&) = delete;
  CheckpointFollower& operator=(const CheckpointFollower&) = delete;

  // One look at the directory (what the thread does every interval):
  // swaps in the newest checkpoint that loads, if one is newer than the
  // served one; the others are skipped with a warning. Returns whether it
  // swapped one in. Serialised with the thread's polls.
  bool PollOnce();

  // Ends the polling thread (after a poll in progress). Idempotent.
  void Stop();

  const CheckpointFollowerOptions& options() const { return options_; }

 private:
  CheckpointFollower(ModelHost* host, ServerMetrics* metrics,
                     CheckpointFollowerOptions options);
  void Loop();

  ModelHost* const host_;
  ServerMetrics* const metrics_;
  const CheckpointFollowerOptions options_;

  std::mutex poll_mu_;       // serialises PollOnce
  CheckpointPicker picker_;  // guarded by poll_mu_

  std::mutex stop_mu_;  // guards stop_
  std::condition_variable stop_cv_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace dlrm::server
