// Rank processes for the multi-rank tests: the test binary re-executes
// itself, one process per rank, with worker arguments of its own, and the
// parent reaps them with a deadline.
#ifndef DLRM_TESTS_RANK_PROCESSES_H_
#define DLRM_TESTS_RANK_PROCESSES_H_

#include <sys/types.h>

#include <functional>
#include <string>
#include <vector>

namespace dlrm::test {

// The running test binary's path (/proc/self/exe).
std::string SelfPath();

// Starts SelfPath() with `args` as argv[1..] and the parent's environment;
// -1 (and a gtest failure) when posix_spawn fails.
pid_t SpawnSelf(const std::vector<std::string>& args);

// Waits for every pid, at most `seconds` in all; kills what is left. Returns
// the exit codes in `pids`' order: -1 for a process killed (by the deadline
// or a signal).
std::vector<int> WaitAll(const std::vector<pid_t>& pids, double seconds);

// SpawnSelf(rank_args(r)) for r = 0..world-1, then WaitAll(seconds).
std::vector<int> RunRanks(
    int world, const std::function<std::vector<std::string>(int)>& rank_args,
    double seconds);

}  // namespace dlrm::test

#endif  // DLRM_TESTS_RANK_PROCESSES_H_
