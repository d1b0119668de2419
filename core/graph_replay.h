// When a fixed sequence of device launches runs as a captured graph: the
// policy behind the CUDA dense backend's CUDA graphs (docs/cuda.md "CUDA
// graphs"), apart from the CUDA calls so that it runs and is tested on the
// CPU. Needs no CUDA.
#pragma once

#include <compare>
#include <cstdint>
#include <iterator>
#include <map>
#include <optional>
#include <utility>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/status.h"

namespace dlrm {

// One launch sequence: which call of its owner (the owner's numbering) on
// which batch size. The sequence must launch the same work on the same
// pointers every time it runs with the same key, until Invalidate.
struct GraphKey {
  int call = 0;
  int64_t batch = 0;

  friend auto operator<=>(const GraphKey&, const GraphKey&) = default;
};

// Runs launch sequences plainly or as graphs. `Ops` captures and launches:
//   using Graph = ...;                      // movable; owns an instantiated
//                                           // graph
//   absl::Status BeginCapture();            // the stream starts capturing
//   absl::StatusOr<Graph> EndCapture();     // ends the capture (always
//                                           // called after a successful
//                                           // BeginCapture, even when the
//                                           // launches failed) and
//                                           // instantiates it
//   absl::Status Launch(Graph& graph);      // queues the graph
// The CUDA backend's Ops work on its stream; the tests' record what they
// are asked to do.
//
// A key runs plainly the first time it is seen (since construction or the
// last Invalidate): the warm-up, which lets its buffers grow and its
// cuBLASLt plans be made outside a capture. The second time it is captured
// and the graph launched; after that the graph is replayed and the launches
// are not called. A capture that fails (BeginCapture, the launches or
// EndCapture returns an error) is dropped, the launches run plainly instead
// (so a bad argument returns the same error as without graphs) and that
// key runs plainly from then on, Invalidate or not. Not thread-safe.
template <typename Ops>
class GraphReplay {
 public:
  using Graph = typename Ops::Graph;

  // `ops` is borrowed and must outlive this. When !enabled every Run runs
  // its launches plainly and nothing is captured.
  GraphReplay(Ops* ops, bool enabled) : ops_(ops), enabled_(enabled) {}

  bool enabled() const { return enabled_; }

  // Queues the sequence `launches` queues, for `key`: plainly, captured or
  // replayed as described above. Returns the launches' error when they run
  // plainly, Launch's error when a graph is launched.
  absl::Status Run(const GraphKey& key,
                   absl::FunctionRef<absl::Status()> launches) {
    if (!enabled_) {
      ++plain_runs_;
      return launches();
    }
    Entry& e = entries_[key];
    if (e.graph.has_value()) {
      ++replays_;
      return ops_->Launch(*e.graph);
    }
    if (e.failed || !e.seen) {
      e.seen = true;
      ++plain_runs_;
      return launches();
    }
    absl::StatusOr<Graph> graph = Capture(launches);
    if (!graph.ok()) {
      e.failed = true;
      ++failed_captures_;
      last_failure_ = graph.status();
      ++plain_runs_;
      return launches();
    }
    e.graph = std::move(*graph);
    ++captures_;
    return ops_->Launch(*e.graph);
  }

  // Before the calls of a step on `batch` samples: a batch larger than any
  // before may grow the buffers the graphs point into, so it drops every
  // graph (Invalidate) first.
  void Reserve(int64_t batch) {
    if (batch <= high_water_) return;
    if (high_water_ >= 0) Invalidate();
    high_water_ = batch;
  }

  // Drops every graph (buffers were reallocated): each key warms up again.
  // Keys whose capture failed stay plain.
  void Invalidate() {
    for (auto it = entries_.begin(); it != entries_.end();) {
      it = it->second.failed ? std::next(it) : entries_.erase(it);
    }
    ++invalidations_;
  }

  // Counters since construction.
  int64_t plain_runs() const { return plain_runs_; }
  int64_t captures() const { return captures_; }
  int64_t replays() const { return replays_; }
  int64_t failed_captures() const { return failed_captures_; }
  int64_t invalidations() const { return invalidations_; }
  // The error of the last failed capture (OK when none failed).
  const absl::Status& last_failure() const { return last_failure_; }

 private:
  struct Entry {
    bool seen = false;
    bool failed = false;
    std::optional<Graph> graph;
  };

  absl::StatusOr<Graph> Capture(absl::FunctionRef<absl::Status()> launches) {
    RETURN_IF_ERROR(ops_->BeginCapture());
    const absl::Status work = launches();
    absl::StatusOr<Graph> graph = ops_->EndCapture();
    RETURN_IF_ERROR(work);
    return graph;
  }

  Ops* ops_;
  const bool enabled_;
  std::map<GraphKey, Entry> entries_;
  int64_t high_water_ = -1;
  int64_t plain_runs_ = 0, captures_ = 0, replays_ = 0, failed_captures_ = 0,
          invalidations_ = 0;
  absl::Status last_failure_;
};

}  // namespace dlrm
