// ServerProcess: fork/exec of dlrm_server with a pipe on its stdout.
#include "clients/server_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <sstream>

#include "absl/strings/str_cat.h"

extern char** environ;

namespace dlrm::clients {
namespace {

using Clock = std::chrono::steady_clock;

// Forks and execs `args` with stdout on `out_fd` (in the child) and this
// process's environment with the NAME=VALUE entries of `env` added or
// replacing theirs; the child dies with its parent. Returns the pid, or -1
// when fork fails.
pid_t Spawn(const std::vector<std::string>& args, int out_fd,
            const std::vector<std::string>& env) {
  // Built before the fork: the child of a threaded process may only make
  // async-signal-safe calls.
  std::vector<std::string> entries = env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry = *e;
    const std::string name = entry.substr(0, entry.find('='));
    const bool replaced =
        std::any_of(env.begin(), env.end(), [&name](const std::string& o) {
          return o.compare(0, name.size() + 1, name + "=") == 0;
        });
    if (!replaced) entries.push_back(entry);
  }
  std::vector<char*> envp;
  for (const std::string& e : entries)
    envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  std::vector<char*> argv;
  for (const std::string& a : args)
    argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid != 0) return pid;
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(1);
  dup2(out_fd, 1);
  execve(argv[0], argv.data(), envp.data());
  _exit(127);
}

}  // namespace

ServerProcess::~ServerProcess() {
  if (pid_ > 0) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  CloseOutput();
}

absl::Status ServerProcess::Start(const std::vector<std::string>& args,
                                  double timeout_seconds,
                                  const std::vector<std::string>& env) {
  if (args.empty() || pid_ > 0) {
    return absl::InternalError("ServerProcess: no args, or already running");
  }
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return absl::InternalError("pipe failed");
  pid_ = Spawn(args, fds[1], env);
  close(fds[1]);
  out_fd_ = fds[0];
  if (pid_ < 0) return absl::InternalError("fork failed");
  const std::string prefix = "dlrm_server: listening on ";
  const Clock::time_point deadline =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(
                         std::chrono::duration<double>(timeout_seconds));
  std::string buffer;
  while (Clock::now() < deadline) {
    pollfd p{out_fd_, POLLIN, 0};
    if (poll(&p, 1, 100) <= 0) continue;
    char chunk[4096];
    const ssize_t n = read(out_fd_, chunk, sizeof(chunk));
    if (n <= 0) {
      return absl::UnavailableError(
          absl::StrCat(args[0], " exited before listening; stdout:\n", buffer));
    }
    buffer.append(chunk, n);
    std::istringstream lines(buffer);
    for (std::string line; std::getline(lines, line);) {
      if (line.rfind(prefix, 0) != 0) continue;
      std::istringstream fields(line.substr(prefix.size()));
      fields >> address_;
      // Keep reading, so the server never blocks on a full pipe.
      drain_ = std::thread([fd = out_fd_] {
        char sink[4096];
        while (read(fd, sink, sizeof(sink)) > 0) {
        }
      });
      return absl::OkStatus();
    }
  }
  return absl::UnavailableError(absl::StrCat(
      args[0], " printed no listening line within ", timeout_seconds, " s"));
}

absl::Status ServerProcess::StartDetached(const std::vector<std::string>& args,
                                          const std::vector<std::string>& env) {
  if (args.empty() || pid_ > 0) {
    return absl::InternalError("ServerProcess: no args, or already running");
  }
  const int null_fd = open("/dev/null", O_WRONLY | O_CLOEXEC);
  if (null_fd < 0) return absl::InternalError("cannot open /dev/null");
  pid_ = Spawn(args, null_fd, env);
  close(null_fd);
  if (pid_ < 0) return absl::InternalError("fork failed");
  return absl::OkStatus();
}

absl::Status ServerProcess::Stop(double timeout_seconds) {
  if (pid_ <= 0) return absl::OkStatus();
  kill(pid_, SIGTERM);
  int status = 0;
  bool exited = false;
  const Clock::time_point deadline =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(
                         std::chrono::duration<double>(timeout_seconds));
  while (!exited && Clock::now() < deadline) {
    exited = waitpid(pid_, &status, WNOHANG) == pid_;
    if (!exited) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (!exited) {
    kill(pid_, SIGKILL);
    waitpid(pid_, &status, 0);
  }
  pid_ = -1;
  CloseOutput();
  if (!exited) {
    return absl::InternalError(absl::StrCat("dlrm_server ignored SIGTERM for ",
                                            timeout_seconds, " s"));
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return absl::InternalError(
        absl::StrCat("dlrm_server exited with status ", status));
  }
  return absl::OkStatus();
}

void ServerProcess::CloseOutput() {
  if (drain_.joinable()) drain_.join();
  if (out_fd_ >= 0) close(out_fd_);
  out_fd_ = -1;
}

std::vector<std::string> LoopbackServerArgs(const std::string& binary,
                                            const std::string& config,
                                            int threads) {
  std::vector<std::string> args = {
      binary,        "--listen", "127.0.0.1:0", "--metrics-listen",     "",
      "--log-level", "warn",     "--threads",   std::to_string(threads)};
  if (!config.empty()) args.insert(args.end(), {"--config", config});
  return args;
}

}  // namespace dlrm::clients
