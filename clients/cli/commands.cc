// dlrm_client's other subcommands: info, train (a stream of local
// samples), eval, predict, checkpoints, export and learning rates.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <future>
#include <iostream>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "clients/cli/cli.h"
#include "clients/tsv_input.h"
#include "core/config.h"
#include "core/status.h"
#include "data/criteo.h"
#include "google/protobuf/text_format.h"

namespace dlrm::clients::cli {

ProgressOptions StdoutProgress() {
  ProgressOptions options;
  options.interactive = isatty(STDOUT_FILENO) == 1;
  return options;
}

void PrintMetrics(const std::string& label, const EvalMetrics& m) {
  std::printf(
      "%s: samples %lld  auc %.4f  logloss %.4f  accuracy %.4f  ctr %.4f\n",
      label.c_str(), static_cast<long long>(m.samples()), m.auc(), m.log_loss(),
      m.accuracy(), m.ctr());
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
  std::printf("%s\n", InteractionFieldsText(c).c_str());
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

}  // namespace dlrm::clients::cli
