// Child processes for the tests: the test binary re-executed as ranks, and
// the project's binaries (dlrm_server, dlrm_convert, dlrm_client ...)
// started with their output in files or a pipe, reaped with a deadline.
#ifndef DLRM_TESTS_SUPPORT_PROCESS_H_
#define DLRM_TESTS_SUPPORT_PROCESS_H_

#include <sys/types.h>
#include <unistd.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace dlrm::test {

// The running test binary's path (/proc/self/exe).
std::string SelfPath();

// How Spawn starts a process.
struct SpawnOptions {
  // NAME=VALUE entries added to this process's environment (replacing its
  // entries of those names). Default: none.
  std::vector<std::string> env;
  // File opened as stdin; "" keeps ours. Default: "".
  std::string stdin_path;
  // File stdout is written to (truncated); "" keeps ours. Default: "".
  std::string stdout_path;
  // Stdout into a pipe whose read end is Child::out_fd (instead of
  // stdout_path). Default: false.
  bool stdout_pipe = false;
  // File stderr is written to (truncated); "" keeps ours. Default: "".
  std::string stderr_path;
};

// A started process; pid -1 when it could not start.
struct Child {
  pid_t pid = -1;
  // The read end of its stdout with SpawnOptions::stdout_pipe, else -1.
  int out_fd = -1;
};

// The build tree this test binary sits in (build/tests/NAME -> build).
std::string BuildDir();

// The value of environment variable `env` when set and not empty, else the
// build tree's `relative` (e.g. "server/dlrm_server").
std::string BuildBinary(const char* env, const std::string& relative);

// BuildBinary("DLRM_SERVER", "server/dlrm_server").
std::string ServerBinary();

// `args` (a server's argv, or a launcher's) followed by the flags that keep
// a dlrm_server under test to itself: --listen on a free port of 127.0.0.1
// (it prints the one it got), no metrics listener, --threads 1.
std::vector<std::string> WithLocalServerFlags(std::vector<std::string> args);

// Starts args[0] with `args` as its argv (posix_spawn, no PATH search).
Child Spawn(const std::vector<std::string>& args,
            const SpawnOptions& options = {});

// Spawn with stdout in a pipe (Child::out_fd), stderr into the file
// `stderr_path` and `env` added to our environment.
Child SpawnPiped(const std::vector<std::string>& args,
                 const std::string& stderr_path,
                 const std::vector<std::string>& env = {});

// Starts SelfPath() with `args` as argv[1..] and the parent's environment;
// -1 (and a gtest failure) when posix_spawn fails.
pid_t SpawnSelf(const std::vector<std::string>& args);

// The exit code of `pid` within `seconds` (128 + the signal when a signal
// ended it), or -2 when it was still running at the deadline (then it is
// killed and reaped).
int WaitExit(pid_t pid, double seconds);

// Waits for every pid, at most `seconds` in all; kills what is left. Returns
// the exit codes in `pids`' order: -1 for a process killed (by the deadline
// or a signal).
std::vector<int> WaitAll(const std::vector<pid_t>& pids, double seconds);

// SpawnSelf(rank_args(r)) for r = 0..world-1, then WaitAll(seconds).
std::vector<int> RunRanks(
    int world, const std::function<std::vector<std::string>(int)>& rank_args,
    double seconds);

// Reads `fd` until it prints `prefix` and a word after it (up to a space);
// that word, or "" at the deadline or the end of the output.
std::string WaitForWord(int fd, const std::string& prefix, double seconds);

// What Run saw of a process it ran to its end.
struct RunResult {
  // Its exit code; -1 when it could not start or a signal ended it.
  int exit_code = -1;
  std::string out;
  std::string err;
  // Its peak resident memory (wait4's ru_maxrss), in bytes.
  int64_t peak_bytes = 0;
  // Why it could not start; "" when it did.
  std::string spawn_error;
};

// Runs `args` to its end with stdout and stderr in `dir`/`name`.out and
// .err (and stdin from `stdin_path`, "" = /dev/null), `env` added to ours
// as in SpawnOptions.
RunResult Run(const std::vector<std::string>& args, const std::string& dir,
              const std::vector<std::string>& env = {},
              const std::string& stdin_path = "",
              const std::string& name = "cmd");

// A TCP port of 127.0.0.1 that is free now (bound and closed); 0 if none
// could be had.
int FreePort();

// Where a rank of a test binary re-executed as ranks stands: what RankArgv
// passes first and TestsOrRankMain reads back.
struct RankPlace {
  // Ranks in the job. Default: 1.
  int world = 1;
  // This rank, in [0, world). Default: 0.
  int rank = 0;
  // Rank 0's coordinator, host:port. Default: "".
  std::string coordinator;
};

// A rank's arguments for SpawnSelf: `flag`, place.world, place.rank,
// place.coordinator, then the test's own `extra`.
std::vector<std::string> RankArgv(const std::string& flag,
                                  const RankPlace& place,
                                  const std::vector<std::string>& extra);

// The main() of a test binary that re-executes itself as ranks with
// RankArgv(`flag`, place, extra of `extra_count` arguments): as such a rank
// it runs worker(place, extra) (extra: argv's last `extra_count`) and
// returns 0, or 1 after printing "rank R: status" to stderr; otherwise it
// runs the tests.
int TestsOrRankMain(
    int argc, char** argv, const std::string& flag, int extra_count,
    const std::function<absl::Status(const RankPlace&, char** extra)>& worker);

}  // namespace dlrm::test

// In a test body or SetUp: skips the test unless `path` (binary `name`'s,
// e.g. dlrm::test::ServerBinary()) is an executable file, saying where it
// looked; `<< ...` adds to the message.
#define DLRM_SKIP_UNLESS_BUILT(name, path)              \
  if (::access(std::string(path).c_str(), X_OK) == 0) { \
  } else                                                \
    GTEST_SKIP() << name << " is not built (looked for " << (path) << ")"

#endif  // DLRM_TESTS_SUPPORT_PROCESS_H_
