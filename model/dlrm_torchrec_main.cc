// dlrm_torchrec: converts between a TorchRec DLRM / DLRM_DCN state_dict in
// safetensors and a checkpoint directory of this project (docs/torchrec.md).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/cli_parse.h"
#include "core/config.h"
#include "core/status.h"
#include "model/torchrec.h"

namespace dlrm {
namespace {

struct Flags {
  std::string config;
  std::string in;
  std::string out;
  std::string checkpoint;
  bool overwrite = false;
};

absl::Status Import(const Flags& f) {
  ASSIGN_OR_RETURN(const ModelConfig config, LoadModelConfig(f.config));
  model::TorchRecImportOptions options;
  options.overwrite = f.overwrite;
  model::TorchRecImportReport report;
  ASSIGN_OR_RETURN(
      const model::CheckpointInfo info,
      model::ImportTorchRecCheckpoint(f.in, config, f.out, options, &report));
  std::printf(
      "imported %s into the checkpoint %s (%lld bytes); its optimizer state "
      "is a new model's\n",
      f.in.c_str(), f.out.c_str(), static_cast<long long>(info.bytes));
  if (report.ids + report.ids_dropped > 0) {
    std::printf(
        "dynamic tables: %lld ids of the managed-collision maps given a row, "
        "%lld without a free row in their bucket (they start unadmitted)\n",
        static_cast<long long>(report.ids),
        static_cast<long long>(report.ids_dropped));
  }
  return absl::OkStatus();
}

absl::Status Export(const Flags& f) {
  ASSIGN_OR_RETURN(const model::ExportInfo info,
                   model::ExportTorchRecCheckpoint(f.checkpoint, f.out));
  std::printf("exported %s: step %lld, %lld tensors, %lld bytes\n",
              f.out.c_str(), static_cast<long long>(info.step),
              static_cast<long long>(info.tensors),
              static_cast<long long>(info.bytes));
  return absl::OkStatus();
}

absl::Status Names(const Flags& f) {
  ASSIGN_OR_RETURN(const ModelConfig config, LoadModelConfig(f.config));
  ASSIGN_OR_RETURN(const std::vector<model::TorchRecTensor> tensors,
                   model::TorchRecTensors(config));
  std::printf("%s\n", config.interaction() == INTERACTION_DCN
                          ? "torchrec.models.dlrm.DLRM_DCN"
                          : "torchrec.models.dlrm.DLRM");
  for (const model::TorchRecTensor& t : tensors) {
    std::printf("%s [%s]%s %s%s\n", t.torchrec_name.c_str(),
                absl::StrJoin(t.shape, ", ").c_str(),
                t.dtype == model::Dtype::kF32 ? "" : " I64", t.name.c_str(),
                t.pair_columns_permuted ? " (pair columns reordered)" : "");
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace dlrm

int main(int argc, char** argv) {
  dlrm::Flags f;
  CLI::App app{
      "Convert between a TorchRec DLRM / DLRM_DCN state_dict (safetensors) "
      "and a dlrm-server checkpoint (docs/torchrec.md)."};
  app.require_subcommand(1);
  const std::string config_help = "describes the TorchRec model";

  CLI::App* import_cmd = app.add_subcommand(
      "import", "TorchRec state_dict -> checkpoint directory");
  dlrm::AddConfigFlag(*import_cmd, &f.config, dlrm::PresetNames(), config_help)
      ->required();
  import_cmd->add_option("--in", f.in, "The state_dict, a .safetensors file")
      ->required();
  import_cmd->add_option("--out", f.out, "The checkpoint directory to write")
      ->required();
  import_cmd->add_flag("--overwrite", f.overwrite,
                       "Replace a checkpoint already in --out");

  CLI::App* export_cmd = app.add_subcommand(
      "export", "checkpoint directory -> TorchRec state_dict");
  export_cmd
      ->add_option("--checkpoint", f.checkpoint, "The checkpoint directory")
      ->required();
  export_cmd->add_option("--out", f.out, "The .safetensors file to write")
      ->required();

  CLI::App* names_cmd = app.add_subcommand(
      "names", "print the TorchRec state_dict keys, shapes and our names");
  dlrm::AddConfigFlag(*names_cmd, &f.config, dlrm::PresetNames(), config_help)
      ->required();

  CLI11_PARSE(app, argc, argv);
  absl::Status s;
  if (import_cmd->parsed()) {
    s = dlrm::Import(f);
  } else if (export_cmd->parsed()) {
    s = dlrm::Export(f);
  } else {
    s = dlrm::Names(f);
  }
  if (absl::IsAlreadyExists(s)) {
    s = absl::AlreadyExistsError(
        absl::StrCat(s.message(), ", or pass --overwrite to replace it"));
  }
  if (!s.ok()) {
    std::fprintf(stderr, "dlrm_torchrec: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
