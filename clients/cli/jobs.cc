// dlrm_client job: starting a server-side job and waiting for it with a
// progress bar; Ctrl-C then ends the wait, not the job.
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "clients/cli/cli.h"
#include "core/status.h"

namespace dlrm::clients::cli {

namespace {

// Samples a job will train on, when the request says (else 0).
int64_t JobTotalSamples(const JobRequest& request) {
  const int64_t batch = request.batch_size() > 0 ? request.batch_size() : 2048;
  const int epochs = request.epochs() > 0 ? request.epochs() : 1;
  int64_t total = 0;
  if (request.train().has_synthetic()) {
    total = request.train().synthetic().num_samples() * epochs;
  }
  if (request.max_steps() > 0 &&
      (total == 0 || request.max_steps() * batch < total)) {
    total = request.max_steps() * batch;
  }
  return total;
}

// `s` quoted for a POSIX shell when it holds anything but safe characters.
std::string ShellQuoted(const std::string& s) {
  const bool safe = !s.empty() && s.find_first_not_of(
                                      "abcdefghijklmnopqrstuvwxyz"
                                      "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
                                      "_-./:=@,+%") == std::string::npos;
  if (safe) return s;
  std::string quoted = "'";
  for (const char c : s) {
    if (c == '\'') {
      quoted += "'\\''";
    } else {
      quoted += c;
    }
  }
  return quoted + "'";
}

// The dlrm_client command line that reaches the same server as this one:
// `program`, --server and the security flags given.
std::string SameServerCommand(const std::string& program, const Flags& f) {
  std::vector<std::string> args = {program, "--server", f.server};
  const auto add = [&args](const char* flag, const std::string& value) {
    if (value.empty()) return;
    args.push_back(flag);
    args.push_back(value);
  };
  if (f.tls) args.push_back("--tls");
  add("--tls-ca", f.tls_ca);
  add("--tls-cert", f.tls_cert);
  add("--tls-key", f.tls_key);
  add("--tls-server-name", f.tls_server_name);
  add("--auth-token-file", f.auth_token_file);
  std::string out;
  for (const std::string& a : args) {
    if (!out.empty()) out += ' ';
    out += ShellQuoted(a);
  }
  return out;
}

// What SIGINT prints while a job is waited for; written by the handler,
// which may call only async-signal-safe functions.
std::string* interrupt_message = nullptr;

void OnInterrupt(int) {
  if (interrupt_message != nullptr) {
    const ssize_t ignored = write(STDERR_FILENO, interrupt_message->data(),
                                  interrupt_message->size());
    (void)ignored;
  }
  _exit(130);  // 128 + SIGINT, as a shell reports an interrupted command
}

// From here on, Ctrl-C (SIGINT) ends the client with exit status 130 and
// says that job `id` goes on on the server, and how to cancel it. Once per
// process (later calls keep the first job's message).
void TellOnInterrupt(const std::string& id, const Flags& f) {
  if (interrupt_message != nullptr) return;
  const std::string same = SameServerCommand(f.program, f);
  interrupt_message = new std::string(absl::StrCat(
      "\ndlrm_client: interrupted; job ", id,
      " goes on on the server. Cancel it with:\n  ", same, " job cancel ", id,
      "\nor follow it again with:\n  ", same, " job wait ", id, "\n"));
  struct sigaction action = {};
  action.sa_handler = OnInterrupt;
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, nullptr);
}

// Waits for a job with a progress bar; non-OK unless it succeeded.
}  // namespace

void PrintJob(const JobStatus& job) {
  std::printf(
      "job %s %s  steps %lld  samples %lld  loss %.5f  samples/s %.0f  "
      "elapsed %.1fs\n",
      job.id().c_str(), JobStatus::State_Name(job.state()).c_str(),
      static_cast<long long>(job.steps()),
      static_cast<long long>(job.samples()), job.loss(),
      job.samples_per_second(), job.elapsed_seconds());
  if (job.has_eval()) PrintMetrics("  eval", job.eval());
  if (job.has_eval_reference()) {
    PrintMetrics("  teacher (the ceiling)", job.eval_reference());
  }
  if (!job.error().empty()) std::printf("  error: %s\n", job.error().c_str());
  std::fflush(stdout);
}

// Ctrl-C ends the wait, not the job (TellOnInterrupt).
absl::Status WaitForJob(Client& client, const std::string& id,
                        int64_t total_samples, const Flags& f) {
  TellOnInterrupt(id, f);
  ProgressReporter progress(absl::StrCat("job ", id), total_samples,
                            StdoutProgress(), stdout);
  WaitOptions options;
  options.poll_interval_seconds = f.poll_interval;
  options.timeout_seconds = f.wait_timeout;
  absl::StatusOr<JobStatus> job =
      client.WaitJob(id, options, [&](const JobStatus& s) {
        ProgressState state;
        state.step = s.steps();
        state.samples = s.samples();
        if (s.steps() > 0) state.loss = s.loss();
        state.samples_per_second = s.samples_per_second();
        progress.Update(state);
      });
  progress.Finish();
  if (!job.ok()) return job.status();
  PrintJob(*job);
  switch (job->state()) {
    case JobStatus::SUCCEEDED:
      return absl::OkStatus();
    case JobStatus::CANCELLED:
      return absl::CancelledError(absl::StrCat("job ", id, " was cancelled"));
    default:
      return absl::AbortedError(
          absl::StrCat("job ", id, " failed: ", job->error()));
  }
}

absl::Status JobStart(Client& client, const Flags& f) {
  ASSIGN_OR_RETURN(ModelInfo info, client.GetModelInfo());
  const uint64_t seed = info.config().seed();
  JobRequest request;
  ASSIGN_OR_RETURN(*request.mutable_train(),
                   ServerDataset(f.data, "training", seed, 1));
  if (f.eval_data.synthetic >= 0 || !f.eval_data.files.empty()) {
    DataFlags eval = f.eval_data;
    eval.hash_ids = f.data.hash_ids;
    eval.zipf_alpha = f.data.zipf_alpha;
    eval.data_seed = f.data.data_seed;
    eval.npy = f.data.npy;
    ASSIGN_OR_RETURN(*request.mutable_eval(),
                     ServerDataset(eval, "evaluation", seed, 2));
  }
  request.set_batch_size(f.batch_size);
  request.set_epochs(f.epochs);
  request.set_max_steps(f.steps);
  request.set_eval_interval(f.eval_interval);
  request.set_eval_samples(f.eval_samples);
  ASSIGN_OR_RETURN(const JobStatus job, client.StartJob(request));
  // Before the job's first line, so that a Ctrl-C as soon as it shows is
  // told of too.
  if (f.wait) TellOnInterrupt(job.id(), f);
  PrintJob(job);
  if (!f.wait) return absl::OkStatus();
  return WaitForJob(client, job.id(), JobTotalSamples(request), f);
}

}  // namespace dlrm::clients::cli
