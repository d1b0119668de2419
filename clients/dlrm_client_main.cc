// dlrm_client: the command-line client of dlrm-server. Trains by streaming
// local data or by starting server-side jobs, evaluates, predicts, and runs
// the admin calls (info, metrics, checkpoints, weights export, learning
// rates).
#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <future>
#include <iostream>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "clients/client.h"
#include "clients/progress.h"
#include "clients/tsv_input.h"
#include "core/cli_parse.h"
#include "core/config.h"
#include "core/status.h"
#include "data/criteo.h"
#include "data/synthetic.h"
#include "google/protobuf/text_format.h"

namespace dlrm::clients {
namespace {

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

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

ProgressOptions StdoutProgress() {
  ProgressOptions options;
  options.interactive = isatty(STDOUT_FILENO) == 1;
  return options;
}

// The config that shapes local data: `spec` when given, else the server's.
absl::StatusOr<ModelConfig> ResolveConfig(Client& client,
                                          const std::string& spec) {
  if (!spec.empty()) return LoadModelConfig(spec);
  ASSIGN_OR_RETURN(ModelInfo info, client.GetModelInfo());
  return NormalizeModelConfig(info.config());
}

// A local source of samples: synthetic, stdin ('-'), one .bin file, or TSV
// files; `total` is its sample count per epoch when known (else 0).
struct LocalData {
  std::unique_ptr<data::BatchSource> source;
  int64_t total = 0;
};

absl::StatusOr<LocalData> OpenLocalData(const DataFlags& flags,
                                        const ModelConfig& config,
                                        uint64_t sample_seed_offset) {
  LocalData local;
  if (flags.synthetic >= 0) {
    if (!flags.files.empty()) {
      return absl::InvalidArgumentError(
          "give either --data or --synthetic, not both");
    }
    data::SyntheticOptions options;
    options.zipf_alpha = flags.zipf_alpha;
    options.teacher_seed =
        flags.data_seed != 0 ? flags.data_seed : config.seed();
    options.sample_seed = options.teacher_seed + sample_seed_offset;
    options.num_samples = flags.synthetic;
    ASSIGN_OR_RETURN(local.source, data::MakeSyntheticSource(config, options));
    local.total = flags.synthetic;
    return local;
  }
  if (flags.files.empty()) {
    return absl::InvalidArgumentError(
        "no data: give --data FILE... or --synthetic N");
  }
  const data::CriteoOptions options =
      data::CriteoOptionsForModel(config, flags.hash_ids);
  if (flags.files.size() == 1 && flags.files[0] == "-") {
    ASSIGN_OR_RETURN(local.source,
                     OpenCriteoStream(&std::cin, "stdin", options));
    return local;
  }
  if (flags.files.size() == 1 && EndsWith(flags.files[0], ".bin")) {
    ASSIGN_OR_RETURN(local.source,
                     data::OpenCriteoBinary(flags.files[0], options));
    // The opened file's header holds the count (0: unknown).
    local.total = data::ReadCriteoBinaryCount(flags.files[0]).value_or(0);
    return local;
  }
  if (data::IsCriteoNpy(flags.files)) {
    ASSIGN_OR_RETURN(
        std::vector<data::CriteoNpyDay> days,
        data::FindCriteoNpyDays(flags.files, options.AnyMultiHot()));
    ASSIGN_OR_RETURN(local.source,
                     data::OpenCriteoNpy(std::move(days), options));
    return local;
  }
  ASSIGN_OR_RETURN(local.source, data::OpenCriteoTsv(flags.files, options));
  return local;
}

// A dataset read by the server: synthetic, one .bin file, NumPy days, or
// TSV files.
// `sample_seed_offset` is added to the teacher seed for the sample stream.
absl::StatusOr<DatasetSpec> ServerDataset(const DataFlags& flags,
                                          const std::string& what,
                                          uint64_t model_seed,
                                          uint64_t sample_seed_offset) {
  DatasetSpec spec;
  if (flags.synthetic >= 0) {
    if (!flags.files.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "give either files or synthetic samples for ", what, ", not both"));
    }
    SyntheticData* synthetic = spec.mutable_synthetic();
    synthetic->set_num_samples(flags.synthetic);
    synthetic->set_zipf_alpha(flags.zipf_alpha);
    const uint64_t teacher =
        flags.data_seed != 0 ? flags.data_seed : model_seed;
    synthetic->set_teacher_seed(teacher);
    synthetic->set_sample_seed(teacher + sample_seed_offset);
    return spec;
  }
  if (flags.files.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("no ", what, " data: give files or synthetic samples"));
  }
  if (flags.files.size() == 1 && EndsWith(flags.files[0], ".bin")) {
    spec.set_criteo_binary(flags.files[0]);
    return spec;
  }
  const bool npy =
      flags.npy || std::all_of(flags.files.begin(), flags.files.end(),
                               [](const std::string& f) {
                                 return EndsWith(f, ".npy") ||
                                        EndsWith(f, ".npz");
                               });
  if (npy) {
    CriteoNpyDays* days = spec.mutable_criteo_npy();
    for (const std::string& f : flags.files) days->add_paths(f);
    days->set_hash_ids(flags.hash_ids);
    return spec;
  }
  CriteoFiles* tsv = spec.mutable_criteo_tsv();
  for (const std::string& f : flags.files) tsv->add_paths(f);
  tsv->set_hash_ids(flags.hash_ids);
  return spec;
}

void PrintMetrics(const std::string& label, const EvalMetrics& m) {
  std::printf(
      "%s: samples %lld  auc %.4f  logloss %.4f  accuracy %.4f  ctr %.4f\n",
      label.c_str(), static_cast<long long>(m.samples()), m.auc(), m.log_loss(),
      m.accuracy(), m.ctr());
}

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

absl::Status Info(Client& client, const Flags& f) {
  ASSIGN_OR_RETURN(ModelInfo info, client.GetModelInfo());
  if (f.config_text) {
    std::string text;
    if (!google::protobuf::TextFormat::PrintToString(info.config(), &text)) {
      return absl::InternalError("could not print the model config");
    }
    std::fputs(text.c_str(), stdout);
    return absl::OkStatus();
  }
  const ModelConfig& c = info.config();
  std::printf("server: %s\n", client.address().c_str());
  std::printf("dense features: %d  tables: %d  embedding dim: %d\n",
              c.num_dense_features(), c.tables_size(), c.embedding_dim());
  std::printf("bottom mlp: %s  top mlp: %s  interaction: %s",
              absl::StrJoin(c.bottom_mlp(), "-").c_str(),
              absl::StrJoin(c.top_mlp(), "-").c_str(),
              Interaction_Name(c.interaction()).c_str());
  if (c.interaction() == INTERACTION_DCN) {
    std::printf(" (%d layers, rank %d)", c.dcn_num_layers(),
                c.dcn_low_rank_dim());
  }
  std::printf("\n");
  std::printf("parameters: embedding %lld  dense %lld\n",
              static_cast<long long>(info.embedding_parameters()),
              static_cast<long long>(info.dense_parameters()));
  std::printf("steps: %lld  world size: %d%s\n",
              static_cast<long long>(info.steps()), info.world_size(),
              info.inference_only() ? "  inference only" : "");
  std::printf("dense precision: %s (%s on %s)\n",
              PrecisionName(info.dense_precision()), info.dense_isa().c_str(),
              info.cpu_model().c_str());
  if (!info.served_checkpoint().empty()) {
    std::printf("served checkpoint: %s (step %lld)\n",
                info.served_checkpoint().c_str(),
                static_cast<long long>(info.served_checkpoint_step()));
  }
  // A proto map iterates in no fixed order: print the tiers sorted.
  const std::map<std::string, int64_t> memory(info.memory_bytes().begin(),
                                              info.memory_bytes().end());
  for (const auto& [tier, bytes] : memory) {
    std::printf("memory %s: %lld bytes\n", tier.c_str(),
                static_cast<long long>(bytes));
  }
  if (!info.sharding_plan().empty()) {
    std::printf("sharding plan:\n%s", info.sharding_plan().c_str());
    if (info.sharding_plan().back() != '\n') std::printf("\n");
  }
  return absl::OkStatus();
}

absl::Status Train(Client& client, const Flags& f) {
  ASSIGN_OR_RETURN(const ModelConfig config, ResolveConfig(client, f.config));
  if (f.data.synthetic == 0 && f.steps == 0) {
    return absl::InvalidArgumentError(
        "--steps is required with endless synthetic data (--synthetic 0)");
  }
  ASSIGN_OR_RETURN(LocalData local, OpenLocalData(f.data, config, 1));
  TrainOptions options;
  options.batch_size = f.batch_size;
  options.epochs = f.epochs;
  options.max_steps = f.steps;
  options.max_in_flight = f.in_flight;
  int64_t total = local.total * f.epochs;
  if (f.steps > 0 && (total == 0 || f.steps * f.batch_size < total)) {
    total = f.steps * f.batch_size;
  }
  ProgressReporter progress("train", total, StdoutProgress(), stdout);
  int64_t samples = 0;
  ASSIGN_OR_RETURN(
      const TrainSummary summary,
      client.Train(*local.source, options, [&](const StepResult& r) {
        samples += r.samples();
        ProgressState state;
        state.step = r.step();
        state.samples = samples;
        state.loss = r.loss();
        progress.Update(state);
      }));
  progress.Finish();
  std::printf(
      "train: %lld steps (server step %lld), %lld samples, %.1f s, "
      "%.0f samples/s, mean loss %.5f, final loss %.5f\n",
      static_cast<long long>(summary.steps),
      static_cast<long long>(summary.last_step),
      static_cast<long long>(summary.samples), summary.seconds,
      summary.samples_per_second, summary.mean_loss, summary.final_loss);
  return absl::OkStatus();
}

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

absl::Status Eval(Client& client, const Flags& f) {
  const int sources = static_cast<int>(!f.data.files.empty()) +
                      static_cast<int>(!f.server_files.empty()) +
                      static_cast<int>(f.data.synthetic >= 0);
  if (sources != 1) {
    return absl::InvalidArgumentError(
        "give exactly one of --data, --server-data or --synthetic");
  }
  ProgressReporter progress("eval", 0, StdoutProgress(), stdout);
  std::future<absl::StatusOr<EvaluateResponse>> result;
  LocalData data;
  if (!f.data.files.empty()) {
    ASSIGN_OR_RETURN(const ModelConfig config, ResolveConfig(client, f.config));
    ASSIGN_OR_RETURN(data, OpenLocalData(f.data, config, 2));
    result = std::async(std::launch::async, [&] {
      return client.EvaluateSource(*data.source, f.batch_size, f.max_samples);
    });
  } else {
    ASSIGN_OR_RETURN(ModelInfo info, client.GetModelInfo());
    DataFlags server = f.data;
    server.files = f.server_files;
    EvaluateRequest request;
    ASSIGN_OR_RETURN(
        *request.mutable_dataset(),
        ServerDataset(server, "evaluation", info.config().seed(), 2));
    request.set_max_samples(f.max_samples);
    result = std::async(std::launch::async, [&client, request] {
      return client.Evaluate(request);
    });
  }
  ProgressState waiting;
  waiting.samples = -1;
  while (result.wait_for(std::chrono::milliseconds(100)) !=
         std::future_status::ready) {
    progress.Update(waiting);
  }
  ASSIGN_OR_RETURN(const EvaluateResponse response, result.get());
  ProgressState done;
  done.samples = response.metrics().samples();
  progress.Update(done);
  progress.Finish();
  PrintMetrics("eval", response.metrics());
  if (response.has_reference()) {
    PrintMetrics("teacher (the ceiling)", response.reference());
  }
  return absl::OkStatus();
}

absl::Status Predict(Client& client, const Flags& f) {
  ASSIGN_OR_RETURN(const ModelConfig config, ResolveConfig(client, f.config));
  const data::CriteoOptions options =
      data::CriteoOptionsForModel(config, f.data.hash_ids);
  std::ifstream file;
  std::istream* in = &std::cin;
  std::string name = "stdin";
  if (f.input != "-") {
    file.open(f.input);
    if (!file) {
      return absl::NotFoundError(absl::StrCat("cannot open ", f.input));
    }
    in = &file;
    name = f.input;
  }
  ASSIGN_OR_RETURN(std::unique_ptr<data::BatchSource> source,
                   OpenCriteoStream(in, name, options));
  data::Batch batch;
  while (true) {
    ASSIGN_OR_RETURN(const bool more, source->Next(f.batch_size, &batch));
    if (!more) break;
    ASSIGN_OR_RETURN(const std::vector<float> probabilities,
                     client.Predict(batch));
    for (const float p : probabilities) std::printf("%.9g\n", p);
  }
  std::fflush(stdout);
  return absl::OkStatus();
}

absl::Status Checkpoint(Client& client, const std::string& dir, bool save) {
  ASSIGN_OR_RETURN(
      const CheckpointResponse r,
      save ? client.SaveCheckpoint(dir) : client.RestoreCheckpoint(dir));
  std::printf("%s %s: step %lld, %lld bytes\n", save ? "saved" : "restored",
              dir.c_str(), static_cast<long long>(r.step()),
              static_cast<long long>(r.bytes()));
  return absl::OkStatus();
}

absl::Status Export(Client& client, const std::string& path) {
  ASSIGN_OR_RETURN(const ExportResponse r, client.ExportWeights(path));
  std::printf("exported %s: step %lld, %lld tensors, %lld bytes\n",
              r.path().c_str(), static_cast<long long>(r.step()),
              static_cast<long long>(r.tensors()),
              static_cast<long long>(r.bytes()));
  return absl::OkStatus();
}

absl::Status SetLearningRate(Client& client, const Flags& f) {
  ASSIGN_OR_RETURN(const SetLearningRateResponse r,
                   client.SetLearningRate(f.dense_rate, f.sparse_rate));
  std::printf("learning rates: dense %g, sparse %g (from step %lld on)\n",
              r.dense(), r.sparse(), static_cast<long long>(r.step() + 1));
  return absl::OkStatus();
}

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
    app->add_option(dlrm::kAlphaFlag, f.data.zipf_alpha, "Synthetic id skew")
        ->capture_default_str();
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
  app.add_option("--server", f.server, "Server address HOST:PORT")
      ->capture_default_str();
  app.add_option("--connect-timeout", f.connect_timeout,
                 "Seconds to wait for the server to accept the connection")
      ->capture_default_str();
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
  train->add_option(dlrm::kBatchFlag, f.batch_size, "Samples per step")
      ->capture_default_str();
  train->add_option("--epochs", f.epochs, "Passes over the data")
      ->capture_default_str();
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
  job_start->add_option(dlrm::kBatchFlag, f.batch_size, "Samples per step")
      ->capture_default_str();
  job_start->add_option("--epochs", f.epochs, "Passes over the data")
      ->capture_default_str();
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
    sub->add_option("--poll", f.poll_interval, "Seconds between polls")
        ->capture_default_str();
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
  eval->add_option(dlrm::kAlphaFlag, f.data.zipf_alpha, "Synthetic id skew")
      ->capture_default_str();
  eval->add_option("--data-seed", f.data.data_seed,
                   "Synthetic teacher seed (0 = the model's seed)");
  eval->add_option("--max-samples", f.max_samples,
                   "Evaluate at most this many samples (0 = all)");
  eval->add_option(dlrm::kBatchFlag, f.batch_size,
                   "Samples per batch sent (local data)")
      ->capture_default_str();

  CLI::App* predict = app.add_subcommand(
      "predict",
      "Click probabilities of Criteo TSV samples (with or without the label "
      "column), one per line");
  predict->add_option("input", f.input, "TSV file, or - for stdin")
      ->capture_default_str();
  predict->add_flag("--hash-ids", f.data.hash_ids,
                    "Hash Criteo categoricals before the modulo");
  dlrm::AddConfigFlag(*predict, &f.config, PresetNames(),
                      "shapes the data (default: the server's)");
  predict->add_option(dlrm::kBatchFlag, f.batch_size, "Samples per request")
      ->capture_default_str();

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
  if (!status.ok()) {
    std::fprintf(stderr, "dlrm_client: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace dlrm::clients

int main(int argc, char** argv) { return dlrm::clients::Main(argc, argv); }
