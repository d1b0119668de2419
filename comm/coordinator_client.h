// A Status-returning client of the Coordinator service
// (comm/coordinator_service.h), with TLS and the join token.
#pragma once

#include <grpcpp/channel.h>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "comm/grpc_auth.h"
#include "dlrm/coordinator.grpc.pb.h"

namespace dlrm::comm {

// How a rank dials the coordinator and proves it belongs to the job.
struct CoordinatorClientOptions {
  // TLS of the channel: when enabled, the coordinator's certificate must
  // chain to tls.ca_file (the system's roots if empty) and carry the host
  // of the address, or tls.server_name; tls.cert_file and tls.key_file are
  // presented when the coordinator requires client certificates.
  // Default: plaintext.
  TlsClientOptions tls;
  // Sent with every call as "authorization: Bearer <token>": the
  // coordinator's CoordinatorOptions::join_token. Empty sends none.
  // Default: empty.
  std::string join_token;

  // InvalidArgument for invalid TLS options or a join token that breaks
  // the token rule (ValidateSecretToken).
  absl::Status Validate() const;
};

// A client of the Coordinator service. Every call waits for the coordinator
// to come up (rank 0 may start last) until its timeout; a timeout gives
// DeadlineExceeded saying what was missing (for a coordinator it never
// reached, the last connection error: refused, TLS handshake). A refused
// join token gives Unauthenticated at once, naming the coordinator.
// Thread-safe.
class CoordinatorClient {
 public:
  // Makes a channel to `address` (host:port) with `options`, reading the
  // TLS files now; connects lazily. InvalidArgument for an empty address
  // or invalid options (or a TLS file with no PEM block), NotFound for a
  // TLS file that cannot be read.
  static absl::StatusOr<std::unique_ptr<CoordinatorClient>> Create(
      const std::string& address, const CoordinatorClientOptions& options = {});

  // Joins `rank` to the next round of `job_id` and waits for the other ranks
  // of the round; returns the round's session id. Codes as in
  // coordinator.proto; DeadlineExceeded names the ranks that did not come.
  absl::StatusOr<uint64_t> RegisterRank(std::string_view job_id,
                                        int64_t generation, int rank,
                                        int world_size, double timeout_seconds);
  // Stores `value` under `key` in the session.
  absl::Status StoreSet(uint64_t session_id, std::string_view key,
                        std::string_view value, double timeout_seconds);
  // The value of `key`, waiting until some rank sets it.
  absl::StatusOr<std::string> StoreGet(uint64_t session_id,
                                       std::string_view key,
                                       double timeout_seconds);
  // Waits until every key in `keys` is set.
  absl::Status StoreWait(uint64_t session_id,
                         const std::vector<std::string>& keys,
                         double timeout_seconds);
  // Coordinator.Heartbeat: `rank` of `job_id` on `host` is alive.
  absl::Status Heartbeat(std::string_view job_id, int rank,
                         std::string_view host, double timeout_seconds);

  const std::string& address() const { return address_; }

 private:
  CoordinatorClient(std::string address, CoordinatorClientOptions options,
                    std::shared_ptr<grpc::Channel> channel);

  // A context with the call's deadline, waiting for the coordinator to
  // come up, carrying the join token.
  void PrepareContext(grpc::ClientContext& context,
                      double timeout_seconds) const;
  // Turns a failed call into a Status that names the coordinator and `rpc`.
  absl::Status CallError(const grpc::Status& status, absl::string_view rpc,
                         double timeout_seconds) const;
  // Calls the stub's `rpc` (named `name`) on `request` with a context from
  // PrepareContext, filling *response; CallError of a failed call.
  template <typename Request, typename Response>
  absl::Status Call(const char* name,
                    grpc::Status (::dlrm::Coordinator::Stub::*rpc)(
                        grpc::ClientContext*, const Request&, Response*),
                    const Request& request, Response* response,
                    double timeout_seconds);
  // Why the channel does not connect: the error of a call that does not
  // wait for it (connection refused, TLS handshake failure); empty when it
  // connects.
  std::string LastConnectionError() const;

  const std::string address_;
  const CoordinatorClientOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<::dlrm::Coordinator::Stub> stub_;
};

}  // namespace dlrm::comm
