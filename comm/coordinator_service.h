// The Coordinator gRPC service rank 0 hosts (proto/dlrm/coordinator.proto):
// rank registration in rounds and a session-scoped key-value store, and a
// standalone server for it. The control plane may run over TLS and require
// a join token on every call (docs/security.md "Security"); without a token
// anyone who reaches the port can join a job.
#pragma once

#include <grpcpp/server.h>
#include <grpcpp/support/server_callback.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
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

}  // namespace dlrm::comm
