// Progress of long client work (train, job wait, eval): one bar redrawn in
// place on a terminal, or plain log lines when the output is a file or pipe.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>

#include "absl/status/status.h"

namespace dlrm::clients {

struct ProgressOptions {
  // Redraw one line in place (for a terminal) instead of printing log
  // lines. Default: false (callers pass isatty of their output).
  bool interactive = false;
  // Seconds between redraws of the bar. Default: 0.1.
  double redraw_interval_seconds = 0.1;
  // Seconds between log lines when not interactive. Default: 2.
  double log_interval_seconds = 2;
  // Characters of the bar itself. Default: 24.
  int bar_width = 24;

  absl::Status Validate() const;
};

// One snapshot of the work.
struct ProgressState {
  // Steps done; 0 hides the step.
  int64_t step = 0;
  // Samples done; < 0 = not known yet (hides samples, rate and ETA, e.g.
  // while waiting for a server that reports only at the end).
  int64_t samples = 0;
  // Latest loss; NaN hides it.
  double loss = std::numeric_limits<double>::quiet_NaN();
  // Throughput; 0 = samples over the time since the reporter was made.
  double samples_per_second = 0;
};

// Formats `n` compactly: 950, 12.3k, 4.56M, 7.89G.
std::string FormatCount(double n);
// Formats seconds as m:ss, or h:mm:ss from an hour on.
std::string FormatDuration(double seconds);

// Renders ProgressState lines for one piece of work. Not thread-safe.
class ProgressReporter {
 public:
  // `out` is borrowed and must outlive the reporter. `total_samples` <= 0
  // means the total is unknown (no bar, percentage or ETA).
  ProgressReporter(std::string label, int64_t total_samples,
                   const ProgressOptions& options, std::FILE* out);

  // Records `state`; draws it if the redraw (or log) interval has passed
  // since the last draw.
  void Update(const ProgressState& state);
  // Draws the last state (if not drawn yet, or always on a terminal, where
  // the elapsed time moves on) and ends the line. Idempotent.
  void Finish();

  // The line for `state` as it would be drawn `elapsed_seconds` in, without
  // the carriage return (exposed for tests).
  std::string Render(const ProgressState& state, double elapsed_seconds) const;

 private:
  using Clock = std::chrono::steady_clock;

  void Draw(double elapsed_seconds);

  std::string label_;
  int64_t total_;
  ProgressOptions options_;
  std::FILE* out_;
  Clock::time_point start_;
  double last_draw_ = -1;  // seconds since start_; < 0 = never drawn
  size_t last_width_ = 0;  // of the last interactive line, to blank it out
  ProgressState state_;
  bool dirty_ = false;  // state_ changed since the last draw
  bool finished_ = false;
};

}  // namespace dlrm::clients
