// The Gloo store over a coordinator session (comm/coordinator_store.h).
#include "comm/coordinator_store.h"

#include <gloo/common/error.h>

#include <utility>

namespace dlrm::comm {
namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

CoordinatorStore::CoordinatorStore(CoordinatorClient* client,
                                   uint64_t session_id, double timeout_seconds)
    : client_(client),
      session_id_(session_id),
      deadline_(Clock::now() +
                std::chrono::duration_cast<Clock::duration>(
                    std::chrono::duration<double>(timeout_seconds))) {}

double CoordinatorStore::CallTimeout(double requested) const {
  const double left =
      std::chrono::duration<double>(deadline_ - Clock::now()).count();
  // A call with no time left still goes out, briefly, so that it reports
  // what is missing instead of failing blind.
  const double capped = requested > 0 ? std::min(requested, left) : left;
  return std::max(capped, 0.05);
}

void CoordinatorStore::Throw(absl::Status status) {
  last_error_ = std::move(status);
  throw gloo::IoException(std::string(last_error_.message()));
}

void CoordinatorStore::set(const std::string& key,
                           const std::vector<char>& data) {
  absl::Status status = client_->StoreSet(
      session_id_, key, std::string_view(data.data(), data.size()),
      CallTimeout(0));
  if (!status.ok()) Throw(std::move(status));
}

std::vector<char> CoordinatorStore::get(const std::string& key) {
  absl::StatusOr<std::string> value =
      client_->StoreGet(session_id_, key, CallTimeout(0));
  if (!value.ok()) Throw(std::move(value).status());
  return std::vector<char>(value->begin(), value->end());
}

void CoordinatorStore::wait(const std::vector<std::string>& keys) {
  wait(keys, std::chrono::milliseconds(0));
}

void CoordinatorStore::wait(const std::vector<std::string>& keys,
                            const std::chrono::milliseconds& timeout) {
  // gloo passes kNoTimeout (0) for "no timeout of its own".
  absl::Status status = client_->StoreWait(
      session_id_, keys,
      CallTimeout(std::chrono::duration<double>(timeout).count()));
  if (!status.ok()) Throw(std::move(status));
}

}  // namespace dlrm::comm
