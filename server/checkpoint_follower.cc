// CheckpointFollower: polling a checkpoint directory and swapping newer
// checkpoints in.
#include "server/checkpoint_follower.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <functional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "spdlog/spdlog.h"

namespace dlrm::server {
namespace {

namespace fs = std::filesystem;

constexpr char kManifestFile[] = "MANIFEST.json";

// Mixes `v` into the running hash `h` (FNV-1a over the value's bytes).
void Mix(uint64_t* h, uint64_t v) {
  for (int i = 0; i < 8; ++i) {
    *h ^= (v >> (8 * i)) & 0xff;
    *h *= 1099511628211ull;
  }
}

// True for the names of a save or prune in progress ("<name>.tmp-<pid>",
// "<name>.old-<pid>"): never a checkpoint, and no warning.
bool InProgress(const std::string& name) {
  return name.find(".tmp-") != std::string::npos ||
         name.find(".old-") != std::string::npos;
}

// (created_ms, step): the order "newer" follows (model::ListCheckpoints').
bool Newer(const model::Manifest& m, const ServedCheckpoint& served) {
  if (served.created_ms < 0) return true;
  if (m.created_ms != served.created_ms) {
    return m.created_ms > served.created_ms;
  }
  return m.step > served.step;
}

}  // namespace

absl::Status CheckpointFollowerOptions::Validate() const {
  if (dir.empty()) {
    return absl::InvalidArgumentError(
        "a checkpoint follower needs the directory to follow");
  }
  if (!(poll_seconds > 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the follower's poll interval (", poll_seconds, " s) must be > 0"));
  }
  return absl::OkStatus();
}

uint64_t CheckpointFilesFingerprint(const std::string& dir) {
  uint64_t h = 14695981039346656037ull;
  std::error_code ec;
  std::vector<std::pair<std::string, std::pair<uint64_t, uint64_t>>> files;
  for (auto it = fs::recursive_directory_iterator(dir, ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    std::error_code e;
    if (!it->is_regular_file(e)) continue;
    const uint64_t size = it->file_size(e);
    const uint64_t mtime = static_cast<uint64_t>(
        it->last_write_time(e).time_since_epoch().count());
    files.push_back(
        {it->path().lexically_relative(dir).string(), {e ? 0 : size, mtime}});
  }
  std::sort(files.begin(), files.end());
  for (const auto& [name, stat] : files) {
    Mix(&h, std::hash<std::string>()(name));
    Mix(&h, stat.first);
    Mix(&h, stat.second);
  }
  Mix(&h, files.size());
  return h;
}

bool CheckpointPicker::FirstSight(std::map<std::string, uint64_t>& seen,
                                  const std::string& name,
                                  uint64_t fingerprint) {
  auto [it, inserted] = seen.try_emplace(name, fingerprint);
  if (inserted) return true;
  if (it->second == fingerprint) return false;
  it->second = fingerprint;
  return true;
}

std::vector<model::CheckpointEntry> CheckpointPicker::Candidates(
    const ServedCheckpoint& served, int* skipped) {
  *skipped = 0;
  // Directories without a manifest: a copy still in progress, or a save by
  // something other than this server that never finished.
  std::error_code ec;
  std::set<std::string> present;
  for (auto it = fs::directory_iterator(dir_, ec);
       !ec && it != fs::directory_iterator(); it.increment(ec)) {
    std::error_code e;
    const std::string name = it->path().filename().string();
    if (!it->is_directory(e) || InProgress(name)) continue;
    present.insert(name);
    if (fs::exists(it->path() / kManifestFile, e)) {
      incomplete_.erase(name);
      continue;
    }
    if (FirstSight(incomplete_, name,
                   CheckpointFilesFingerprint(it->path().string()))) {
      spdlog::warn(
          "skipping checkpoint {}: no {} (half-written?); it is tried once "
          "it has one",
          it->path().string(), kManifestFile);
      ++*skipped;
    }
  }
  // Forget what is gone, so a checkpoint written again under an old name
  // is judged afresh.
  for (auto* seen : {&failed_, &damaged_, &incomplete_}) {
    for (auto it = seen->begin(); it != seen->end();) {
      it = present.count(it->first) ? std::next(it) : seen->erase(it);
    }
  }
  std::vector<model::CheckpointEntry> out;
  for (model::CheckpointEntry& e : model::ListCheckpoints(dir_)) {
    if (!e.manifest.ok()) {
      if (FirstSight(damaged_, e.name, CheckpointFilesFingerprint(e.dir))) {
        spdlog::warn("skipping checkpoint {}: {}; the served version stays",
                     e.dir, e.manifest.status().ToString());
        ++*skipped;
      }
      continue;
    }
    damaged_.erase(e.name);
    if (!Newer(*e.manifest, served)) continue;
    if (e.dir == served.dir && e.manifest->created_ms == served.created_ms) {
      continue;
    }
    const auto failed = failed_.find(e.name);
    if (failed != failed_.end() &&
        failed->second == CheckpointFilesFingerprint(e.dir)) {
      continue;
    }
    out.push_back(std::move(e));
  }
  return out;
}

void CheckpointPicker::Failed(const model::CheckpointEntry& entry,
                              const absl::Status& error) {
  failed_[entry.name] = CheckpointFilesFingerprint(entry.dir);
  spdlog::warn(
      "skipping checkpoint {}: {}; the served version stays, and it is tried "
      "again only if its files change",
      entry.dir, error.ToString());
}

CheckpointFollower::CheckpointFollower(ModelHost* host, ServerMetrics* metrics,
                                       CheckpointFollowerOptions options)
    : host_(host),
      metrics_(metrics),
      options_(std::move(options)),
      picker_(options_.dir) {}

absl::StatusOr<std::unique_ptr<CheckpointFollower>> CheckpointFollower::Start(
    ModelHost* host, ServerMetrics* metrics,
    CheckpointFollowerOptions options) {
  RETURN_IF_ERROR(options.Validate());
  if (host == nullptr || !host->inference_only()) {
    return absl::InvalidArgumentError(
        "only an inference-only server follows checkpoints (--follow needs "
        "--inference-only)");
  }
  std::unique_ptr<CheckpointFollower> f(
      new CheckpointFollower(host, metrics, std::move(options)));
  f->thread_ = std::thread([raw = f.get()] { raw->Loop(); });
  spdlog::info("following checkpoints in {} (every {} s)", f->options_.dir,
               f->options_.poll_seconds);
  return f;
}

CheckpointFollower::~CheckpointFollower() { Stop(); }

void CheckpointFollower::Stop() {
  {
    std::lock_guard<std::mutex> lock(stop_mu_);
    stop_ = true;
  }
  stop_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void CheckpointFollower::Loop() {
  const auto interval = std::chrono::duration_cast<std::chrono::nanoseconds>(
      std::chrono::duration<double>(options_.poll_seconds));
  std::unique_lock<std::mutex> lock(stop_mu_);
  while (!stop_cv_.wait_for(lock, interval, [this] { return stop_; })) {
    lock.unlock();
    PollOnce();
    lock.lock();
  }
}

bool CheckpointFollower::PollOnce() {
  std::lock_guard<std::mutex> lock(poll_mu_);
  int skipped = 0;
  const ServedCheckpoint served = host_->served_checkpoint();
  const std::vector<model::CheckpointEntry> candidates =
      picker_.Candidates(served, &skipped);
  bool swapped = false;
  for (const model::CheckpointEntry& e : candidates) {
    absl::StatusOr<model::CheckpointInfo> info =
        host_->RestoreCheckpoint(e.dir);
    if (!info.ok()) {
      picker_.Failed(e, info.status());
      ++skipped;
      continue;
    }
    spdlog::info("serving checkpoint {} (step {}; was {} at step {})", e.dir,
                 info->step, served.dir.empty() ? "(none)" : served.dir,
                 served.step);
    if (metrics_ != nullptr) metrics_->RecordCheckpointSwap();
    swapped = true;
    break;
  }
  if (metrics_ != nullptr) {
    for (int i = 0; i < skipped; ++i) metrics_->RecordCheckpointSwapFailure();
  }
  return swapped;
}

}  // namespace dlrm::server
