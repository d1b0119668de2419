// A dlrm_server child process (one rank or a whole single-rank server) for
// benchmarks and tools that drive a real server: start, learn its address
// from the listening line, stop it with SIGTERM.
#pragma once

#include <sys/types.h>

#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"

namespace dlrm::clients {

// The command line of the dlrm_server `binary` on a free loopback port,
// without /metrics, logging warnings only, with `threads` compute threads
// and the model `config` (none when empty, e.g. a replica's).
std::vector<std::string> LoopbackServerArgs(const std::string& binary,
                                            const std::string& config,
                                            int threads);

// Owns one child process. The child is killed (SIGKILL) if this process
// dies, and by the destructor if it still runs. Not thread-safe.
class ServerProcess {
 public:
  ServerProcess() = default;
  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;
  ~ServerProcess();

  // Runs `args` (args[0] the binary; stderr is ours) and waits for the line
  // "dlrm_server: listening on HOST:PORT ..." on its stdout (read and
  // discarded afterwards). The child has this process's environment with
  // the NAME=VALUE entries of `env` added or replacing theirs. Unavailable
  // if the child exits or prints no such line within `timeout_seconds`;
  // Internal if fork or pipe fail.
  absl::Status Start(const std::vector<std::string>& args,
                     double timeout_seconds,
                     const std::vector<std::string>& env = {});

  // Runs `args` (environment as Start's) with stdout on /dev/null and
  // returns at once (a follower rank, which prints no listening line).
  // Internal if fork fails.
  absl::Status StartDetached(const std::vector<std::string>& args,
                             const std::vector<std::string>& env = {});

  // SIGTERM, then waits up to `timeout_seconds` (SIGKILL after that).
  // OK when the child exited 0 (or was not running); Internal otherwise,
  // naming the exit status.
  absl::Status Stop(double timeout_seconds = 30);

  // The address from the listening line ("" after StartDetached).
  const std::string& address() const { return address_; }
  bool running() const { return pid_ > 0; }
  // The child's process id (-1 when not running), e.g. to read its memory
  // use from /proc.
  pid_t pid() const { return pid_; }

 private:
  void CloseOutput();

  pid_t pid_ = -1;
  int out_fd_ = -1;
  std::thread drain_;
  std::string address_;
};

}  // namespace dlrm::clients
