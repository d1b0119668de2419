// comm::CommandChannel and comm::AgreeOnStatus between real rank processes
// over Gloo on loopback: commands arrive in order with the heartbeats
// skipped, heartbeats keep idle followers past the op timeout, a lost
// leader ends the followers' wait, and every rank learns who failed and why.
#include "comm/command_channel.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "comm/agree.h"
#include "comm/communicator.h"
#include "comm/coordinator.h"
#include "comm/gloo_communicator.h"
#include "core/status.h"
#include "gtest/gtest.h"
#include "tests/support/process.h"

namespace dlrm::comm {
namespace {

// Ops of the test's protocol (1 is the channel's heartbeat).
constexpr int64_t kWork = 5;
constexpr int64_t kStop = 9;
// Gloo's op timeout in the workers: the leader idles longer than this.
constexpr double kOpTimeoutSeconds = 2;

// A rank's place (world, rank, coordinator), then its test's arguments.
struct WorkerArgs : test::RankPlace {
  std::string mode;
  int failing = -1;  // agree: the rank that fails, -1 for none
};

absl::Status Expect(bool ok, const std::string& what) {
  return ok ? absl::OkStatus() : absl::InternalError(what);
}

// A message longer than a fixed-size record would carry.
std::string LongMessage(int rank) {
  std::string m = absl::StrCat("rank ", rank, "'s reason: ");
  while (m.size() < 600) absl::StrAppend(&m, "file part-", m.size(), ".tsv; ");
  return m;
}

absl::Status RunAgree(const WorkerArgs& a, Communicator& comm) {
  const absl::Status local = a.rank == a.failing
                                 ? absl::NotFoundError(LongMessage(a.rank))
                                 : absl::OkStatus();
  const std::vector<int64_t> extra = {a.rank * 10, a.rank * 10 + 1};
  std::vector<int64_t> all;
  const Agreement agreement = AgreeOnStatus(comm, local, extra, &all);
  RETURN_IF_ERROR(agreement.communicator);
  const absl::Status& agreed = agreement.verdict;
  std::vector<int64_t> want;
  for (int r = 0; r < a.world; ++r) {
    want.push_back(r * 10);
    want.push_back(r * 10 + 1);
  }
  RETURN_IF_ERROR(Expect(all == want, "the extra words in rank order"));
  if (a.failing < 0) {
    return Expect(agreed.ok(), "OK everywhere: " + agreed.ToString());
  }
  if (a.rank == a.failing) {
    return Expect(agreed == local,
                  "the failing rank's own error: " + agreed.ToString());
  }
  return Expect(
      absl::IsNotFound(agreed) &&
          agreed.message() ==
              absl::StrCat("rank ", a.failing, ": ", LongMessage(a.failing)),
      "the failing rank's code and whole message: " + agreed.ToString());
}

// Rank 1 leaves before the agreement: rank 0 learns that the communicator
// failed, never a verdict.
absl::Status RunAgreeLost(const WorkerArgs& a, Communicator& comm) {
  if (a.rank == 1) std::_Exit(0);
  const Agreement agreed =
      AgreeOnStatus(comm, absl::NotFoundError("mine"), {1});
  return Expect(
      !agreed.communicator.ok() && agreed.verdict.ok(),
      "a communicator error, no verdict: " + agreed.communicator.ToString());
}

absl::Status RunCommands(const WorkerArgs& a, Communicator& comm) {
  CommandChannelOptions o;
  o.words = 3;
  o.heartbeat_seconds = 0.25;
  CommandChannel channel(&comm, o);
  if (a.rank == 0) {
    {
      const auto lock = channel.Lock();
      RETURN_IF_ERROR(channel.Send({kWork, 7, 8}, "work"));
      RETURN_IF_ERROR(
          Expect(absl::IsInvalidArgument(channel.Send({1, 2, 3, 4}, "long")),
                 "a command longer than the channel's words is refused"));
    }
    // Idle past the op timeout: only the heartbeats keep the followers in.
    std::this_thread::sleep_for(
        std::chrono::duration<double>(kOpTimeoutSeconds * 2));
    const auto lock = channel.Lock();
    RETURN_IF_ERROR(channel.Send({kWork, 9}, "work"));
    RETURN_IF_ERROR(channel.Send({kStop}, "stop"));
    channel.Close();
    return channel.broken();
  }
  std::vector<std::vector<int64_t>> got;
  std::vector<int64_t> command;
  for (;;) {
    RETURN_IF_ERROR(channel.Receive(&command));
    got.push_back(command);
    if (command[0] == kStop) break;
  }
  const std::vector<std::vector<int64_t>> want = {
      {kWork, 7, 8}, {kWork, 9, 0}, {kStop, 0, 0}};
  return Expect(got == want, absl::StrCat("rank ", a.rank, " got ", got.size(),
                                          " commands in order"));
}

absl::Status RunLostLeader(const WorkerArgs& a, Communicator& comm) {
  CommandChannelOptions o;
  o.heartbeat_seconds = 0.25;
  CommandChannel channel(&comm, o);
  if (a.rank == 0) {
    const auto lock = channel.Lock();
    RETURN_IF_ERROR(channel.Send({kWork, 1}, "work"));
    // Gone without a goodbye, as a killed leader is.
    std::_Exit(0);
  }
  std::vector<int64_t> command;
  RETURN_IF_ERROR(channel.Receive(&command));
  RETURN_IF_ERROR(Expect(command[0] == kWork, "the first command"));
  const absl::Status lost = channel.Receive(&command);
  RETURN_IF_ERROR(Expect(
      absl::IsUnavailable(lost) &&
          absl::StrContains(lost.message(),
                            absl::StrCat("rank ", a.rank,
                                         " lost the leader (rank 0) while "
                                         "waiting for a command")),
      "the lost leader named: " + lost.ToString()));
  return Expect(channel.broken() == lost, "the channel broken by it");
}

// A rank process (test::TestsOrRankMain): `extra` holds the mode and the
// failing rank.
absl::Status RunWorker(const test::RankPlace& place, char** extra) {
  const WorkerArgs a{place, extra[0], std::atoi(extra[1])};
  GlooOptions go;
  go.rank = a.rank;
  go.world_size = a.world;
  go.coordinator_address = a.coordinator;
  go.connect_timeout_seconds = 30;
  go.op_timeout_seconds = kOpTimeoutSeconds;
  go.job_id = a.mode;
  ASSIGN_OR_RETURN(std::unique_ptr<Communicator> comm, ConnectGloo(go));
  if (a.mode == "agree") return RunAgree(a, *comm);
  if (a.mode == "agree-lost") return RunAgreeLost(a, *comm);
  if (a.mode == "commands") return RunCommands(a, *comm);
  if (a.mode == "lost") return RunLostLeader(a, *comm);
  return absl::InvalidArgumentError("unknown mode " + a.mode);
}

std::vector<int> RunRanks(const std::string& mode, int world, int failing) {
  CoordinatorServerOptions so;
  auto coordinator = CoordinatorServer::Start(so);
  EXPECT_TRUE(coordinator.ok()) << coordinator.status();
  if (!coordinator.ok()) return {};
  const std::string address = (*coordinator)->address();
  return test::RunRanks(
      world,
      [&](int r) {
        return test::RankArgv("--channel-worker", {world, r, address},
                              {mode, std::to_string(failing)});
      },
      120);
}

void ExpectAllExitedZero(const std::vector<int>& codes, int world) {
  ASSERT_EQ(codes.size(), static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) EXPECT_EQ(codes[r], 0) << "rank " << r;
}

TEST(AgreeOnStatusTest, EveryRankLearnsTheFailingRanksWholeMessage) {
  for (const int failing : {-1, 0, 2}) {
    SCOPED_TRACE(failing);
    ExpectAllExitedZero(RunRanks("agree", 3, failing), 3);
  }
}

TEST(AgreeOnStatusTest, ALostRankIsACommunicatorErrorNotAVerdict) {
  ExpectAllExitedZero(RunRanks("agree-lost", 2, -1), 2);
}

TEST(AgreeOnStatusTest, OneRankIsItsOwnVerdict) {
  std::unique_ptr<Communicator> comm = MakeSingleRankCommunicator();
  std::vector<int64_t> all;
  const Agreement ok = AgreeOnStatus(*comm, absl::OkStatus(), {4, 5}, &all);
  ASSERT_TRUE(ok.communicator.ok()) << ok.communicator;
  EXPECT_TRUE(ok.verdict.ok());
  EXPECT_EQ(all, (std::vector<int64_t>{4, 5}));
  const absl::Status bad = absl::DataLossError("");
  const Agreement failed = AgreeOnStatus(*comm, bad);
  ASSERT_TRUE(failed.communicator.ok()) << failed.communicator;
  EXPECT_EQ(failed.verdict, bad);
}

TEST(CommandChannelTest, CommandsArriveInOrderAndHeartbeatsKeepFollowers) {
  ExpectAllExitedZero(RunRanks("commands", 3, -1), 3);
}

TEST(CommandChannelTest, FollowersLearnTheLeaderIsLost) {
  ExpectAllExitedZero(RunRanks("lost", 2, -1), 2);
}

TEST(CommandChannelTest, BreakKeepsTheFirstErrorAndNamesIt) {
  std::unique_ptr<Communicator> comm = MakeSingleRankCommunicator();
  int breaks = 0;
  CommandChannelOptions o;
  o.name = "test communicator";
  o.describe_break = [] { return std::string("; rank 1 is silent"); };
  o.on_break = [&breaks] { ++breaks; };
  CommandChannel channel(comm.get(), o);
  EXPECT_TRUE(channel.broken().ok());
  const absl::Status first =
      channel.Break(absl::DeadlineExceededError("timed out"), "a step");
  EXPECT_TRUE(absl::IsUnavailable(first));
  EXPECT_EQ(first.message(),
            "test communicator of rank 0 of 1 failed during a step: timed "
            "out; rank 1 is silent");
  EXPECT_EQ(channel.Break(absl::UnavailableError("later"), "another"), first);
  EXPECT_EQ(channel.broken(), first);
  EXPECT_EQ(breaks, 1);
  const auto lock = channel.Lock();
  EXPECT_EQ(channel.Send({2}, "after"), first);
}

TEST(CommandChannelTest, OptionsAreChecked) {
  CommandChannelOptions o;
  EXPECT_TRUE(o.Validate().ok());
  o.words = 0;
  EXPECT_TRUE(absl::IsInvalidArgument(o.Validate()));
  o.words = 2;
  o.heartbeat_seconds = 0;
  EXPECT_TRUE(absl::IsInvalidArgument(o.Validate()));
}

}  // namespace
}  // namespace dlrm::comm

int main(int argc, char** argv) {
  return dlrm::test::TestsOrRankMain(argc, argv, "--channel-worker", 2,
                                     dlrm::comm::RunWorker);
}
