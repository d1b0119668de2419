// dlrm_client's subcommands (clients/dlrm_client_main.cc parses the
// command line): the flags they read, and the helpers they share for
// local data, data on the server and jobs.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "clients/client.h"
#include "clients/progress.h"
#include "data/source.h"
#include "dlrm/config.pb.h"
#include "dlrm/service.pb.h"

namespace dlrm::clients::cli {

// Where samples come from, for subcommands that read or name data.
struct DataFlags {
  // Local files (train, eval, predict) or files on the server (job).
  std::vector<std::string> files;
  // Synthetic samples per epoch: < 0 = not synthetic, 0 = endless.
  int64_t synthetic = -1;
  bool hash_ids = false;
  // The files on the server are NumPy days (prefixes or files); also true
  // when every path ends in .npy or .npz.
  bool npy = false;
  double zipf_alpha = 1.05;
  // Teacher seed of synthetic data; 0 = the model's seed.
  uint64_t data_seed = 0;
};

struct Flags {
  // How this program was invoked (argv[0]), for the commands it suggests.
  std::string program = "dlrm_client";
  std::string server = "127.0.0.1:50051";
  double connect_timeout = 10;

  // security (docs/security.md "Security")
  bool tls = false;
  std::string tls_ca, tls_cert, tls_key, tls_server_name;
  std::string auth_token_file;

  // train / predict / eval (local data)
  DataFlags data;
  std::string config;  // shapes local data; empty = the server's
  int64_t batch_size = 2048;
  int epochs = 1;
  int64_t steps = 0;
  int in_flight = 4;

  // job start
  DataFlags eval_data;
  int64_t eval_interval = 0;
  int64_t eval_samples = 0;
  bool wait = false;
  std::string job_id;
  double poll_interval = 0.5;
  double wait_timeout = 0;

  // eval
  std::vector<std::string> server_files;
  int64_t max_samples = 0;

  // predict
  std::string input = "-";

  // checkpoint
  std::string checkpoint_dir;

  // export
  std::string export_path;

  // set-learning-rate
  std::optional<float> dense_rate, sparse_rate;

  // info
  bool config_text = false;
};

// A local source of samples: synthetic, stdin ('-'), one .bin file, or TSV
// files; `total` is its sample count per epoch when known (else 0).
struct LocalData {
  std::unique_ptr<data::BatchSource> source;
  int64_t total = 0;
};

// `s` ends with `suffix`.
bool EndsWith(const std::string& s, const std::string& suffix);

// A progress bar on stdout, redrawn in place when stdout is a terminal.
ProgressOptions StdoutProgress();

// The config that shapes local data: `spec` when given, else the server's.
absl::StatusOr<ModelConfig> ResolveConfig(Client& client,
                                          const std::string& spec);

// Opens `flags`' local samples shaped by `config`; a synthetic source's
// sample seed is its teacher seed + `sample_seed_offset`. InvalidArgument
// for no data or both files and synthetic samples; the readers' errors.
absl::StatusOr<LocalData> OpenLocalData(const DataFlags& flags,
                                        const ModelConfig& config,
                                        uint64_t sample_seed_offset);

// A dataset read by the server: synthetic, one .bin file, NumPy days, or
// TSV files; `what` names it in errors ("training", "evaluation"), and
// `sample_seed_offset` is added to the teacher seed for the sample stream.
absl::StatusOr<DatasetSpec> ServerDataset(const DataFlags& flags,
                                          const std::string& what,
                                          uint64_t model_seed,
                                          uint64_t sample_seed_offset);

// Prints evaluation metrics on one line, after `label`.
void PrintMetrics(const std::string& label, const EvalMetrics& m);

// The subcommands; each prints its result on stdout and returns the
// client's error, or InvalidArgument naming the flag for bad flags.
absl::Status Info(Client& client, const Flags& f);
absl::Status Train(Client& client, const Flags& f);
// job start (with --wait, then as WaitForJob).
absl::Status JobStart(Client& client, const Flags& f);
// job list / status / cancel print each job on one line.
void PrintJob(const JobStatus& job);
// Waits for job `id` with a progress bar of `total_samples` (0: unknown);
// OK once it succeeded, Cancelled or Aborted otherwise. Ctrl-C ends the
// wait, not the job (it prints how to cancel it).
absl::Status WaitForJob(Client& client, const std::string& id,
                        int64_t total_samples, const Flags& f);
absl::Status Eval(Client& client, const Flags& f);
absl::Status Predict(Client& client, const Flags& f);
// checkpoint save (`save`) or load of `dir` on the server.
absl::Status Checkpoint(Client& client, const std::string& dir, bool save);
absl::Status Export(Client& client, const std::string& path);
absl::Status SetLearningRate(Client& client, const Flags& f);

}  // namespace dlrm::clients::cli
