// dlrm_client: the command-line client of dlrm-server. Trains by streaming
// local data or by starting server-side jobs, evaluates, predicts, and runs
// the admin calls (info, metrics, checkpoints, weights export, learning
// rates). This file parses the command line; the subcommands are in
// clients/cli/.
#include <CLI/CLI.hpp>
#include <cctype>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "clients/cli/cli.h"
#include "core/cli_parse.h"
#include "core/config.h"
#include "core/status.h"

namespace dlrm::clients::cli {
namespace {

// The bearer token in `path`, without trailing whitespace (a final newline).
// NotFound when it cannot be read, InvalidArgument when it is empty.
absl::StatusOr<std::string> ReadTokenFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat("cannot read --auth-token-file ", path));
  }
  std::string token((std::istreambuf_iterator<char>(in)),
                    std::istreambuf_iterator<char>());
  while (!token.empty() &&
         std::isspace(static_cast<unsigned char>(token.back())) != 0) {
    token.pop_back();
  }
  if (token.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--auth-token-file ", path, " is empty"));
  }
  return token;
}

// The connection options the global flags ask for.
absl::StatusOr<ClientOptions> ConnectOptions(const Flags& f) {
  ClientOptions options;
  options.connect_timeout_seconds = f.connect_timeout;
  options.tls = f.tls || !f.tls_ca.empty() || !f.tls_cert.empty() ||
                !f.tls_server_name.empty();
  options.tls_ca_file = f.tls_ca;
  options.tls_cert_file = f.tls_cert;
  options.tls_key_file = f.tls_key;
  options.tls_server_name = f.tls_server_name;
  if (!f.auth_token_file.empty()) {
    ASSIGN_OR_RETURN(options.auth_token, ReadTokenFile(f.auth_token_file));
  }
  return options;
}

// Flags shared by the subcommands that read local samples.
void AddLocalDataFlags(CLI::App* app, Flags& f, bool synthetic) {
  app->add_option("--data", f.data.files,
                  "Local Criteo TSV files, one .bin file, NumPy days "
                  "(DIR/day_N prefixes or their .npy/.npz files), or - for "
                  "stdin");
  if (synthetic) {
    app->add_option("--synthetic", f.data.synthetic,
                    "Generate this many synthetic samples per epoch instead "
                    "(0 = endless, with --steps)");
    AddDefaulted(*app, dlrm::kAlphaFlag, f.data.zipf_alpha,
                 "Synthetic id skew");
    app->add_option("--data-seed", f.data.data_seed,
                    "Synthetic teacher seed (0 = the model's seed)");
  }
  app->add_flag("--hash-ids", f.data.hash_ids,
                "Hash Criteo categoricals before the modulo");
  dlrm::AddConfigFlag(*app, &f.config, PresetNames(),
                      "shapes the data (default: the server's)");
}

int Main(int argc, char** argv) {
  Flags f;
  if (argc > 0) f.program = argv[0];
  CLI::App app{"Command-line client of dlrm-server."};
  AddVersionFlag(app, "dlrm_client");
  app.require_subcommand(1);
  AddDefaulted(app, "--server", f.server, "Server address HOST:PORT");
  AddDefaulted(app, "--connect-timeout", f.connect_timeout,
               "Seconds to wait for the server to accept the connection");
  app.add_flag("--tls", f.tls,
               "Connect over TLS, trusting the system's root certificates "
               "(implied by --tls-ca, --tls-cert and --tls-server-name)");
  app.add_option("--tls-ca", f.tls_ca,
                 "PEM CA certificates that sign the server's certificate");
  app.add_option("--tls-cert", f.tls_cert,
                 "PEM client certificate, for servers started with "
                 "--tls-client-ca (with --tls-key)");
  app.add_option("--tls-key", f.tls_key, "PEM private key of --tls-cert");
  app.add_option("--tls-server-name", f.tls_server_name,
                 "Name the server's certificate must carry, when it is not "
                 "the host of --server");
  app.add_option("--auth-token-file", f.auth_token_file,
                 "File holding the server's bearer token (sent as "
                 "\"authorization: Bearer <token>\")");

  CLI::App* info = app.add_subcommand("info", "Show the model and its plan");
  info->add_flag("--config-text", f.config_text,
                 "Print the model config in text format (usable as --config)");
  CLI::App* metrics =
      app.add_subcommand("metrics", "Print the server's Prometheus metrics");

  CLI::App* train =
      app.add_subcommand("train", "Stream local samples to the server");
  AddLocalDataFlags(train, f, true);
  AddDefaulted(*train, dlrm::kBatchFlag, f.batch_size, "Samples per step");
  AddDefaulted(*train, "--epochs", f.epochs, "Passes over the data");
  train
      ->add_option(dlrm::kStepsFlag, f.steps,
                   "Stop after this many steps (0 = all)")
      ->capture_default_str();
  train
      ->add_option("--in-flight", f.in_flight,
                   "Batches sent ahead of the server's answers")
      ->capture_default_str();

  CLI::App* job = app.add_subcommand("job", "Training jobs run by the server");
  job->require_subcommand(1);
  CLI::App* job_start =
      job->add_subcommand("start", "Start a job on data the server reads");
  job_start->add_option("--data", f.data.files,
                        "Criteo TSV files, one .bin file or NumPy day files "
                        "(.npy/.npz), on the server");
  job_start->add_option("--synthetic", f.data.synthetic,
                        "Synthetic samples per epoch, generated on the server "
                        "(0 = endless, with --steps)");
  job_start->add_option("--eval-data", f.eval_data.files,
                        "Evaluation files on the server");
  job_start->add_option("--eval-synthetic", f.eval_data.synthetic,
                        "Synthetic evaluation samples");
  job_start->add_flag("--npy", f.data.npy,
                      "The --data and --eval-data paths are NumPy day "
                      "prefixes (DIR/day_N) on the server");
  job_start
      ->add_option(dlrm::kAlphaFlag, f.data.zipf_alpha, "Synthetic id skew")
      ->capture_default_str();
  job_start->add_option("--data-seed", f.data.data_seed,
                        "Synthetic teacher seed (0 = the model's seed)");
  job_start->add_flag("--hash-ids", f.data.hash_ids,
                      "Hash Criteo categoricals before the modulo");
  AddDefaulted(*job_start, dlrm::kBatchFlag, f.batch_size, "Samples per step");
  AddDefaulted(*job_start, "--epochs", f.epochs, "Passes over the data");
  job_start->add_option(dlrm::kStepsFlag, f.steps,
                        "Stop after this many steps");
  job_start->add_option("--eval-interval", f.eval_interval,
                        "Evaluate every N steps (0 = at the end)");
  job_start->add_option("--eval-samples", f.eval_samples,
                        "Evaluation samples to use (0 = all)");
  job_start->add_flag("--wait", f.wait, "Wait for the job, showing progress");
  CLI::App* job_list =
      job->add_subcommand("list", "Show the running and recent jobs");
  CLI::App* job_status = job->add_subcommand("status", "Show a job");
  CLI::App* job_cancel = job->add_subcommand("cancel", "Cancel a job");
  CLI::App* job_wait =
      job->add_subcommand("wait", "Wait for a job, showing progress");
  for (CLI::App* sub : {job_status, job_cancel, job_wait}) {
    sub->add_option("id", f.job_id, "Job id")->required();
  }
  for (CLI::App* sub : {job_start, job_wait}) {
    AddDefaulted(*sub, "--poll", f.poll_interval, "Seconds between polls");
    sub->add_option("--timeout", f.wait_timeout,
                    "Give up waiting after this many seconds (0 = never)");
  }

  CLI::App* eval = app.add_subcommand(
      "eval", "Evaluate on local data, server files or synthetic data");
  AddLocalDataFlags(eval, f, false);
  eval->add_option("--server-data", f.server_files,
                   "Criteo TSV files or one .bin file, on the server");
  eval->add_option("--synthetic", f.data.synthetic,
                   "Synthetic samples generated on the server (reports the "
                   "teacher's metrics too; 0 = endless, with --max-samples)");
  AddDefaulted(*eval, dlrm::kAlphaFlag, f.data.zipf_alpha, "Synthetic id skew");
  eval->add_option("--data-seed", f.data.data_seed,
                   "Synthetic teacher seed (0 = the model's seed)");
  eval->add_option("--max-samples", f.max_samples,
                   "Evaluate at most this many samples (0 = all)");
  AddDefaulted(*eval, dlrm::kBatchFlag, f.batch_size,
               "Samples per batch sent (local data)");

  CLI::App* predict = app.add_subcommand(
      "predict",
      "Click probabilities of Criteo TSV samples (with or without the label "
      "column), one per line");
  AddDefaulted(*predict, "input", f.input, "TSV file, or - for stdin");
  predict->add_flag("--hash-ids", f.data.hash_ids,
                    "Hash Criteo categoricals before the modulo");
  dlrm::AddConfigFlag(*predict, &f.config, PresetNames(),
                      "shapes the data (default: the server's)");
  AddDefaulted(*predict, dlrm::kBatchFlag, f.batch_size, "Samples per request");

  CLI::App* checkpoint =
      app.add_subcommand("checkpoint", "Save or restore a checkpoint");
  checkpoint->require_subcommand(1);
  CLI::App* save =
      checkpoint->add_subcommand("save", "Save to a directory on the server");
  CLI::App* load = checkpoint->add_subcommand(
      "load", "Restore from a directory on the server");
  for (CLI::App* sub : {save, load}) {
    sub->add_option("dir", f.checkpoint_dir, "Checkpoint directory")
        ->required();
  }

  CLI::App* export_weights = app.add_subcommand(
      "export",
      "Write the weights as a safetensors file on the server (for PyTorch)");
  export_weights
      ->add_option("--out", f.export_path,
                   "File on the server (under its --checkpoint-dir)")
      ->required();

  CLI::App* set_rate = app.add_subcommand(
      "set-learning-rate",
      "Change the running model's learning rates between two steps (on "
      "every rank; the next checkpoint saves them)");
  set_rate->add_option("--dense", f.dense_rate,
                       "The dense optimizer's learning rate (> 0)");
  set_rate->add_option("--sparse", f.sparse_rate,
                       "The embedding tables' learning rate (> 0)");

  if (const int code = ParseCommandLine(app, argc, argv, "dlrm_client");
      code >= 0) {
    return code;
  }

  absl::StatusOr<ClientOptions> options = ConnectOptions(f);
  absl::StatusOr<std::unique_ptr<Client>> client =
      options.ok() ? Client::Connect(f.server, *options)
                   : absl::StatusOr<std::unique_ptr<Client>>(options.status());
  absl::Status status = client.status();
  if (status.ok()) {
    Client& c = **client;
    if (info->parsed()) {
      status = Info(c, f);
    } else if (metrics->parsed()) {
      absl::StatusOr<std::string> text = c.GetMetrics();
      status = text.status();
      if (text.ok()) std::fputs(text->c_str(), stdout);
    } else if (train->parsed()) {
      status = Train(c, f);
    } else if (job_start->parsed()) {
      status = JobStart(c, f);
    } else if (job_list->parsed()) {
      absl::StatusOr<std::vector<JobStatus>> jobs = c.ListJobs();
      status = jobs.status();
      if (jobs.ok() && jobs->empty()) {
        std::printf("no jobs on %s (start one with: job start)\n",
                    f.server.c_str());
      } else if (jobs.ok()) {
        for (const JobStatus& j : *jobs) PrintJob(j);
      }
    } else if (job_status->parsed()) {
      absl::StatusOr<JobStatus> s = c.GetJob(f.job_id);
      status = s.status();
      if (s.ok()) PrintJob(*s);
    } else if (job_cancel->parsed()) {
      absl::StatusOr<JobStatus> s = c.CancelJob(f.job_id);
      status = s.status();
      if (s.ok()) PrintJob(*s);
    } else if (job_wait->parsed()) {
      status = WaitForJob(c, f.job_id, 0, f);
    } else if (eval->parsed()) {
      status = Eval(c, f);
    } else if (predict->parsed()) {
      status = Predict(c, f);
    } else if (save->parsed() || load->parsed()) {
      status = Checkpoint(c, f.checkpoint_dir, save->parsed());
    } else if (export_weights->parsed()) {
      status = Export(c, f.export_path);
    } else if (set_rate->parsed()) {
      status = SetLearningRate(c, f);
    }
  }
  std::fflush(stdout);
  return ExitStatus(status, "dlrm_client");
}

}  // namespace
}  // namespace dlrm::clients::cli

int main(int argc, char** argv) { return dlrm::clients::cli::Main(argc, argv); }
