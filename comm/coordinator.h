// Rendezvous through a coordinator: the Coordinator gRPC service that rank 0
// hosts, a standalone server for it, a Status-returning client, and the
// gloo::rendezvous::Store the Gloo communicator connects through. The
// control plane may run over TLS and require a join token on every call
// (docs/server.md "Security"); without a token anyone who reaches the
// port can join a job.
#pragma once

#include <gloo/rendezvous/store.h>
#include <grpcpp/channel.h>
#include <grpcpp/server.h>
#include <grpcpp/support/server_callback.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "comm/grpc_auth.h"
#include "dlrm/coordinator.grpc.pb.h"

namespace dlrm::comm {

struct CoordinatorOptions {
  // Longest a waiting call (RegisterRank, StoreGet, StoreWait) waits when
  // its client's deadline is later or unset, in seconds. Default: 600.
  double max_wait_seconds = 600;
  // Largest value StoreSet accepts, in bytes (a Gloo rank stores about
  // 100 bytes per peer). Default: 1 MiB.
  int64_t max_value_bytes = 1 << 20;
  // The shared secret every call must carry as "authorization: Bearer
  // <token>"; a call without it, or with another, gets UNAUTHENTICATED
  // before it can register a rank, set a key or wake a waiter. At least 16
  // printable ASCII characters without spaces. Empty: every call is
  // accepted. Default: empty.
  std::string join_token;

  absl::Status Validate() const;
};

class CoordinatorState;

// The last heartbeat of one rank (Coordinator.Heartbeat).
struct RankHeartbeat {
  int rank = 0;
  std::string host;
  // Seconds since it arrived.
  double age_seconds = 0;
};

// The Coordinator service (proto/dlrm/coordinator.proto): register it with
// the grpc::ServerBuilder of the server rank 0 runs. It must outlive that
// server. Thread-safe.
class CoordinatorService final : public ::dlrm::Coordinator::CallbackService {
 public:
  // InvalidArgument when `options` are invalid.
  static absl::StatusOr<std::unique_ptr<CoordinatorService>> Create(
      const CoordinatorOptions& options);
  ~CoordinatorService() override;

  // Answers every waiting call, and every later call, with UNAVAILABLE. Call
  // it before grpc::Server::Shutdown() without a deadline, which would
  // otherwise wait for the waiting calls to time out.
  void Shutdown();

  // Every handler first refuses a call without the join token
  // (UNAUTHENTICATED, "join token rejected"), then proceeds as in
  // coordinator.proto.
  grpc::ServerUnaryReactor* RegisterRank(
      grpc::CallbackServerContext* context,
      const ::dlrm::RegisterRankRequest* request,
      ::dlrm::RegisterRankResponse* response) override;
  grpc::ServerUnaryReactor* StoreSet(
      grpc::CallbackServerContext* context,
      const ::dlrm::StoreSetRequest* request,
      ::dlrm::StoreSetResponse* response) override;
  grpc::ServerUnaryReactor* StoreGet(
      grpc::CallbackServerContext* context,
      const ::dlrm::StoreGetRequest* request,
      ::dlrm::StoreGetResponse* response) override;
  grpc::ServerUnaryReactor* StoreWait(
      grpc::CallbackServerContext* context,
      const ::dlrm::StoreWaitRequest* request,
      ::dlrm::StoreWaitResponse* response) override;
  grpc::ServerUnaryReactor* Heartbeat(
      grpc::CallbackServerContext* context,
      const ::dlrm::HeartbeatRequest* request,
      ::dlrm::HeartbeatResponse* response) override;

  // The last heartbeat of every rank of `job_id` that sent one, by rank.
  std::vector<RankHeartbeat> Heartbeats(const std::string& job_id) const;

 private:
  explicit CoordinatorService(const CoordinatorOptions& options);

  // A reactor already finished with UNAUTHENTICATED when the call's join
  // token is missing or wrong (`rpc` names it in the log); null when the
  // call may proceed.
  grpc::ServerUnaryReactor* RefuseWithoutToken(
      grpc::CallbackServerContext* context, absl::string_view rpc);

  const CoordinatorOptions options_;
  std::unique_ptr<CoordinatorState> state_;
  struct Beat {
    std::string host;
    std::chrono::steady_clock::time_point at;
  };
  mutable std::mutex beats_mu_;
  // By job id, then rank; guarded by beats_mu_.
  std::map<std::string, std::map<int, Beat>> beats_;
};

struct CoordinatorServerOptions {
  // host:port to listen on; port 0 picks a free port (see address()).
  // Default: "127.0.0.1:0".
  std::string listen_address = "127.0.0.1:0";
  CoordinatorOptions coordinator;
  // TLS of the port; with client_ca_file every rank must present a
  // certificate signed by it (mutual TLS). Default: plaintext.
  TlsServerOptions tls;

  absl::Status Validate() const;
};

// A grpc::Server that hosts only a CoordinatorService: for tests, and for a
// job whose rank 0 runs no public server. Thread-safe.
class CoordinatorServer {
 public:
  // Starts serving. InvalidArgument for bad options or a TLS file with no
  // PEM block, NotFound for a TLS file that cannot be read, Unavailable
  // when the address cannot be bound ("--coordinator ADDRESS: address
  // already in use": the port is bound without SO_REUSEPORT).
  static absl::StatusOr<std::unique_ptr<CoordinatorServer>> Start(
      const CoordinatorServerOptions& options);
  // Answers waiting calls with UNAVAILABLE and stops the server.
  ~CoordinatorServer();

  // The host:port clients dial, with the port actually bound.
  const std::string& address() const { return address_; }
  int port() const { return port_; }
  // CoordinatorService::Heartbeats of the service it hosts.
  std::vector<RankHeartbeat> Heartbeats(const std::string& job_id) const {
    return service_->Heartbeats(job_id);
  }

 private:
  CoordinatorServer(std::unique_ptr<CoordinatorService> service,
                    std::unique_ptr<grpc::Server> server, std::string address,
                    int port);

  std::unique_ptr<CoordinatorService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
  int port_;
};

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
  // Why the channel does not connect: the error of a call that does not
  // wait for it (connection refused, TLS handshake failure); empty when it
  // connects.
  std::string LastConnectionError() const;

  const std::string address_;
  const CoordinatorClientOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<::dlrm::Coordinator::Stub> stub_;
};

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
