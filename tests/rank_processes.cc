#include "rank_processes.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

#include <chrono>
#include <filesystem>
#include <thread>

extern char** environ;

namespace dlrm::test {

std::string SelfPath() {
  return std::filesystem::read_symlink("/proc/self/exe").string();
}

pid_t SpawnSelf(const std::vector<std::string>& args) {
  std::vector<std::string> all = {SelfPath()};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& s : all) argv.push_back(s.data());
  argv.push_back(nullptr);
  pid_t pid = -1;
  const int error =
      posix_spawn(&pid, argv[0], nullptr, nullptr, argv.data(), environ);
  EXPECT_EQ(error, 0) << "posix_spawn " << all[0];
  return error == 0 ? pid : -1;
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

}  // namespace dlrm::test
