#include "tests/support/process.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string_view>
#include <thread>

#include "tests/support/files.h"

extern char** environ;

namespace dlrm::test {

std::string SelfPath() {
  return std::filesystem::read_symlink("/proc/self/exe").string();
}

std::string BuildDir() {
  return std::filesystem::read_symlink("/proc/self/exe")
      .parent_path()
      .parent_path()
      .string();
}

std::string BuildBinary(const char* env, const std::string& relative) {
  const char* value = std::getenv(env);
  if (value != nullptr && *value != '\0') return value;
  return (std::filesystem::path(BuildDir()) / relative).string();
}

std::string ServerBinary() {
  return BuildBinary("DLRM_SERVER", "server/dlrm_server");
}

Child Spawn(const std::vector<std::string>& args, const SpawnOptions& options) {
  Child child;
  if (args.empty()) return child;
  int fds[2] = {-1, -1};
  if (options.stdout_pipe && pipe(fds) != 0) return child;
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  if (!options.stdin_path.empty()) {
    posix_spawn_file_actions_addopen(&actions, 0, options.stdin_path.c_str(),
                                     O_RDONLY, 0);
  }
  if (options.stdout_pipe) {
    posix_spawn_file_actions_adddup2(&actions, fds[1], 1);
    posix_spawn_file_actions_addclose(&actions, fds[0]);
  } else if (!options.stdout_path.empty()) {
    posix_spawn_file_actions_addopen(&actions, 1, options.stdout_path.c_str(),
                                     O_WRONLY | O_CREAT | O_TRUNC, 0644);
  }
  if (!options.stderr_path.empty()) {
    posix_spawn_file_actions_addopen(&actions, 2, options.stderr_path.c_str(),
                                     O_WRONLY | O_CREAT | O_TRUNC, 0644);
  }
  std::vector<char*> argv;
  for (const std::string& a : args)
    argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  // Ours, less the names options.env gives, then options.env.
  std::vector<char*> envp;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string_view entry(*e);
    const std::string_view name = entry.substr(0, entry.find('='));
    bool replaced = false;
    for (const std::string& given : options.env) {
      replaced |= given.size() > name.size() && given[name.size()] == '=' &&
                  std::string_view(given).substr(0, name.size()) == name;
    }
    if (!replaced) envp.push_back(*e);
  }
  for (const std::string& e : options.env) {
    envp.push_back(const_cast<char*>(e.c_str()));
  }
  envp.push_back(nullptr);
  if (posix_spawn(&child.pid, argv[0], &actions, nullptr, argv.data(),
                  envp.data()) != 0) {
    child.pid = -1;
  }
  posix_spawn_file_actions_destroy(&actions);
  if (options.stdout_pipe) {
    close(fds[1]);
    child.out_fd = fds[0];
  }
  return child;
}

std::vector<std::string> WithLocalServerFlags(std::vector<std::string> args) {
  args.insert(args.end(), {"--listen", "127.0.0.1:0", "--metrics-listen", "",
                           "--threads", "1"});
  return args;
}

Child SpawnPiped(const std::vector<std::string>& args,
                 const std::string& stderr_path,
                 const std::vector<std::string>& env) {
  SpawnOptions options;
  options.env = env;
  options.stdout_pipe = true;
  options.stderr_path = stderr_path;
  return Spawn(args, options);
}

pid_t SpawnSelf(const std::vector<std::string>& args) {
  std::vector<std::string> all = {SelfPath()};
  all.insert(all.end(), args.begin(), args.end());
  const Child child = Spawn(all);
  EXPECT_NE(child.pid, -1) << "posix_spawn " << all[0];
  return child.pid;
}

int WaitExit(pid_t pid, double seconds) {
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < deadline) {
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid) {
      return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  return -2;
}

std::vector<int> WaitAll(const std::vector<pid_t>& pids, double seconds) {
  constexpr int kRunning = -2;
  std::vector<int> codes(pids.size(), kRunning);
  size_t left = 0;
  for (size_t i = 0; i < pids.size(); ++i) {
    if (pids[i] > 0) {
      ++left;
    } else {
      codes[i] = -1;  // never started
    }
  }
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (left > 0) {
    for (size_t i = 0; i < pids.size(); ++i) {
      int status = 0;
      if (codes[i] == kRunning &&
          waitpid(pids[i], &status, WNOHANG) == pids[i]) {
        codes[i] = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
        --left;
      }
    }
    if (left > 0 && std::chrono::steady_clock::now() > deadline) {
      for (size_t i = 0; i < pids.size(); ++i) {
        if (codes[i] != kRunning) continue;
        kill(pids[i], SIGKILL);
        waitpid(pids[i], nullptr, 0);
        codes[i] = -1;
      }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return codes;
}

std::vector<int> RunRanks(
    int world, const std::function<std::vector<std::string>(int)>& rank_args,
    double seconds) {
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r) pids.push_back(SpawnSelf(rank_args(r)));
  return WaitAll(pids, seconds);
}

std::string WaitForWord(int fd, const std::string& prefix, double seconds) {
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  std::string buffer;
  while (std::chrono::steady_clock::now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 100) <= 0) continue;
    char chunk[4096];
    const ssize_t n = read(fd, chunk, sizeof(chunk));
    if (n <= 0) return "";
    buffer.append(chunk, n);
    const size_t at = buffer.find(prefix);
    if (at == std::string::npos) continue;
    const size_t end = buffer.find(' ', at + prefix.size());
    if (end == std::string::npos) continue;
    return buffer.substr(at + prefix.size(), end - at - prefix.size());
  }
  return "";
}

RunResult Run(const std::vector<std::string>& args, const std::string& dir,
              const std::vector<std::string>& env,
              const std::string& stdin_path, const std::string& name) {
  SpawnOptions options;
  options.env = env;
  options.stdin_path = stdin_path.empty() ? "/dev/null" : stdin_path;
  options.stdout_path = dir + "/" + name + ".out";
  options.stderr_path = dir + "/" + name + ".err";
  RunResult result;
  const Child child = Spawn(args, options);
  if (child.pid == -1) {
    result.spawn_error = "posix_spawn " + (args.empty() ? "" : args[0]);
    return result;
  }
  int status = 0;
  rusage usage{};
  if (wait4(child.pid, &status, 0, &usage) == child.pid && WIFEXITED(status)) {
    result.exit_code = WEXITSTATUS(status);
  }
  result.peak_bytes = static_cast<int64_t>(usage.ru_maxrss) * 1024;
  result.out = ReadFile(options.stdout_path);
  result.err = ReadFile(options.stderr_path);
  return result;
}

int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 0;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t size = sizeof(a);
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &size) == 0) {
    port = ntohs(a.sin_port);
  }
  close(fd);
  return port;
}

std::vector<std::string> RankArgv(const std::string& flag,
                                  const RankPlace& place,
                                  const std::vector<std::string>& extra) {
  std::vector<std::string> args = {flag, std::to_string(place.world),
                                   std::to_string(place.rank),
                                   place.coordinator};
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

int TestsOrRankMain(
    int argc, char** argv, const std::string& flag, int extra_count,
    const std::function<absl::Status(const RankPlace&, char** extra)>& worker) {
  // argv: the binary, flag, world, rank, coordinator, extra.
  constexpr int kPlaceArgs = 5;
  if (argc == kPlaceArgs + extra_count && argv[1] == flag) {
    RankPlace place;
    place.world = std::atoi(argv[2]);
    place.rank = std::atoi(argv[3]);
    place.coordinator = argv[4];
    const absl::Status s = worker(place, argv + kPlaceArgs);
    if (!s.ok()) {
      std::fprintf(stderr, "rank %d: %s\n", place.rank, s.ToString().c_str());
      return 1;
    }
    return 0;
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}

}  // namespace dlrm::test
