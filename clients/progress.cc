// Progress bars and log lines for the dlrm_client CLI.
#include "clients/progress.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace dlrm::clients {

absl::Status ProgressOptions::Validate() const {
  if (!(redraw_interval_seconds >= 0) || !(log_interval_seconds >= 0)) {
    return absl::InvalidArgumentError(
        "progress intervals must be non-negative");
  }
  if (bar_width < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("bar_width must be positive, got ", bar_width));
  }
  return absl::OkStatus();
}

std::string FormatCount(double n) {
  const double a = std::fabs(n);
  if (a < 1e3) return absl::StrFormat("%.0f", n);
  if (a < 1e6) return absl::StrFormat("%.1fk", n / 1e3);
  if (a < 1e9) return absl::StrFormat("%.2fM", n / 1e6);
  return absl::StrFormat("%.2fG", n / 1e9);
}

std::string FormatDuration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const int64_t s = static_cast<int64_t>(std::llround(seconds));
  if (s >= 3600) {
    return absl::StrFormat("%d:%02d:%02d", s / 3600, s / 60 % 60, s % 60);
  }
  return absl::StrFormat("%d:%02d", s / 60, s % 60);
}

ProgressReporter::ProgressReporter(std::string label, int64_t total_samples,
                                   const ProgressOptions& options,
                                   std::FILE* out)
    : label_(std::move(label)),
      total_(total_samples),
      options_(options),
      out_(out),
      start_(Clock::now()) {}

std::string ProgressReporter::Render(const ProgressState& state,
                                     double elapsed_seconds) const {
  const bool known_samples = state.samples >= 0;
  double rate = state.samples_per_second;
  if (rate <= 0 && elapsed_seconds > 0 && known_samples) {
    rate = static_cast<double>(state.samples) / elapsed_seconds;
  }
  const bool known_total = total_ > 0 && known_samples;
  const double fraction = known_total
                              ? std::clamp(static_cast<double>(state.samples) /
                                               static_cast<double>(total_),
                                           0.0, 1.0)
                              : 0;
  const double eta =
      known_total && rate > 0
          ? static_cast<double>(std::max<int64_t>(total_ - state.samples, 0)) /
                rate
          : -1;
  std::string line = label_;
  if (options_.interactive) {
    if (known_total) {
      const int filled = static_cast<int>(fraction * options_.bar_width);
      absl::StrAppend(&line, " [", std::string(filled, '#'),
                      std::string(options_.bar_width - filled, '.'), "] ",
                      absl::StrFormat("%3.0f%%", 100 * fraction));
    }
    if (state.step > 0) absl::StrAppend(&line, "  step ", state.step);
    if (known_samples) {
      absl::StrAppend(&line, "  ", FormatCount(state.samples));
      if (known_total) absl::StrAppend(&line, "/", FormatCount(total_));
      absl::StrAppend(&line, " samples  ", FormatCount(rate), " samples/s");
    }
    if (!std::isnan(state.loss)) {
      absl::StrAppend(&line, absl::StrFormat("  loss %.4f", state.loss));
    }
    absl::StrAppend(&line, "  ", FormatDuration(elapsed_seconds));
    if (known_total) absl::StrAppend(&line, " ETA ", FormatDuration(eta));
    return line;
  }
  absl::StrAppend(&line, ":");
  if (state.step > 0) absl::StrAppend(&line, " step ", state.step);
  if (known_samples) {
    absl::StrAppend(&line, " samples ", state.samples);
    if (known_total) {
      absl::StrAppend(&line, "/", total_,
                      absl::StrFormat(" (%.0f%%)", 100 * fraction));
    }
    absl::StrAppend(&line, absl::StrFormat(" samples/s %.0f", rate));
  }
  if (!std::isnan(state.loss)) {
    absl::StrAppend(&line, absl::StrFormat(" loss %.5f", state.loss));
  }
  absl::StrAppend(&line, absl::StrFormat(" elapsed %.1fs", elapsed_seconds));
  if (known_total && eta >= 0) {
    absl::StrAppend(&line, absl::StrFormat(" eta %.1fs", eta));
  }
  return line;
}

void ProgressReporter::Update(const ProgressState& state) {
  state_ = state;
  dirty_ = true;
  const double elapsed =
      std::chrono::duration<double>(Clock::now() - start_).count();
  const double interval = options_.interactive
                              ? options_.redraw_interval_seconds
                              : options_.log_interval_seconds;
  if (last_draw_ < 0 || elapsed - last_draw_ >= interval) Draw(elapsed);
}

void ProgressReporter::Finish() {
  if (finished_) return;
  finished_ = true;
  if (options_.interactive || dirty_ || last_draw_ < 0) {
    Draw(std::chrono::duration<double>(Clock::now() - start_).count());
  }
  if (options_.interactive) std::fputc('\n', out_);
  std::fflush(out_);
}

void ProgressReporter::Draw(double elapsed_seconds) {
  last_draw_ = elapsed_seconds;
  dirty_ = false;
  const std::string line = Render(state_, elapsed_seconds);
  if (options_.interactive) {
    // Blank out what is left of a longer previous line.
    const size_t pad =
        last_width_ > line.size() ? last_width_ - line.size() : 0;
    std::fprintf(out_, "\r%s%s", line.c_str(), std::string(pad, ' ').c_str());
    last_width_ = line.size();
  } else {
    std::fprintf(out_, "%s\n", line.c_str());
  }
  std::fflush(out_);
}

}  // namespace dlrm::clients
