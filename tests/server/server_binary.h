// Tests of the built dlrm_server binary: a fixture that runs it in a
// directory of its own, and waiting for a job to take its steps.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "clients/client.h"
#include "tests/support/files.h"
#include "tests/support/process.h"

namespace dlrm::test {

// Skipped when dlrm_server (ServerBinary()) is not built; dir_ is a fresh
// directory (MakeTestDir), removed at the end unless the test failed, so
// that the servers' logs stay to be read. A SetUp that overrides this one
// calls it first and returns when IsSkipped().
class ServerBinaryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    DLRM_SKIP_UNLESS_BUILT("dlrm_server", ServerBinary());
    dir_ = MakeTestDir();
  }

  void TearDown() override {
    if (!HasFailure()) std::filesystem::remove_all(dir_);
  }

  std::filesystem::path dir_;
};

// Polls job `id` on `client` until it has taken `steps` steps, or, when
// `seconds` > 0, until that long has passed: its last status. An error when
// a poll fails or the job is neither pending nor running (its state and
// error named).
inline absl::StatusOr<JobStatus> WaitForJobSteps(clients::Client& client,
                                                 const std::string& id,
                                                 int64_t steps,
                                                 double seconds = 0) {
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  absl::StatusOr<JobStatus> job;
  do {
    job = client.GetJob(id);
    if (!job.ok()) return job.status();
    if (job->state() != JobStatus::PENDING &&
        job->state() != JobStatus::RUNNING) {
      return absl::FailedPreconditionError(absl::StrCat(
          id, " is ", JobStatus::State_Name(job->state()), ": ", job->error()));
    }
  } while (job->steps() < steps &&
           (seconds <= 0 || std::chrono::steady_clock::now() < deadline));
  return job;
}

}  // namespace dlrm::test
