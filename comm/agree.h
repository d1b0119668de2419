// AgreeOnStatus: every rank learns whether any rank failed at a collective
// point, and why. One agreement for the step's batch checks, the
// checkpoints' phases, a rank group's dataset opening and optimizer changes.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "comm/communicator.h"

namespace dlrm::comm {

// What AgreeOnStatus learned.
struct Agreement {
  // The communicator's error: then nothing was agreed and the communicator
  // is unusable. OK otherwise.
  absl::Status communicator;
  // The agreed outcome (meaningful when `communicator` is OK).
  absl::Status verdict;
};

// Every rank calls it with its own `local` outcome (a host communicator).
// The agreed verdict: `local` where it failed on this rank; else the first
// failing rank r's code with "<who> r: " and its whole message; else OK.
// Every rank gets the same verdict when at most one rank failed.
// `extra` (the same length on every rank) travels along in the same
// all-gather: with `all_extra` not null, every rank's words in rank order.
// One all-gather of 2 + extra.size() words when every rank is OK, and one
// broadcast of the failing rank's message more when one failed.
Agreement AgreeOnStatus(Communicator& comm, const absl::Status& local,
                        const std::vector<int64_t>& extra = {},
                        std::vector<int64_t>* all_extra = nullptr,
                        absl::string_view who = "rank");

}  // namespace dlrm::comm
