// The gloo::rendezvous::Store the Gloo communicator connects its ranks
// through: one session of the coordinator's key-value store.
#pragma once

#include <gloo/rendezvous/store.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "comm/coordinator_client.h"

namespace dlrm::comm {

// gloo::rendezvous::Store over one session of a CoordinatorClient, for
// gloo::rendezvous::Context::connectFullMesh. As that interface requires,
// failures throw gloo::IoException: call it only from code that catches, and
// take the real Status from last_error(). Not thread-safe.
class CoordinatorStore final : public gloo::rendezvous::Store {
 public:
  // `client` must outlive the store. Every call gives up at the latest
  // `timeout_seconds` after construction, however many calls gloo makes.
  CoordinatorStore(CoordinatorClient* client, uint64_t session_id,
                   double timeout_seconds);

  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

  // The Status behind the most recent exception; OK if none was thrown.
  const absl::Status& last_error() const { return last_error_; }

 private:
  // Records a failed `status` and throws it as a gloo::IoException.
  [[noreturn]] void Throw(absl::Status status);
  // Seconds a call may take: `requested` (if > 0) capped by the deadline.
  double CallTimeout(double requested) const;

  CoordinatorClient* client_;
  const uint64_t session_id_;
  const std::chrono::steady_clock::time_point deadline_;
  absl::Status last_error_;
};

}  // namespace dlrm::comm
