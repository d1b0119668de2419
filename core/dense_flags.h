// The flags of the binaries that train (dlrm_train, dlrm_bench_train,
// dlrm_server, dlrm_bench_hybrid) that say where and how the dense part
// runs: --device, --precision, --tf32 and --cuda-graphs (core/config.h's
// Apply*Flag).
// Header-only, so that core does not link CLI11.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "core/config.h"
#include "core/status.h"
#include "dlrm/config.pb.h"

namespace dlrm {

struct DenseFlags {
  // "cpu" or "cuda"; empty keeps the config's device.
  std::string device;
  // "auto", "fp32" or "bf16" (dense_precision); empty keeps the config's.
  std::string precision;
  // "on" or "off" (TF32 GEMMs on a GPU: gpu_disable_tf32 false / true);
  // empty keeps the config's.
  std::string tf32;
  // "on" or "off" (CUDA graphs for the dense backend's launch sequences:
  // gpu_cuda_graphs); empty keeps the config's.
  std::string cuda_graphs;

  // Adds the four options to `app`.
  void AddTo(CLI::App& app) {
    app.add_option("--device", device,
                   "Where the dense part runs: cpu or cuda (default: the "
                   "config's device, cpu unless it sets one)")
        ->check(CLI::IsMember({"cpu", "cuda"}));
    app.add_option("--precision", precision,
                   "Precision of the dense GEMMs: auto, fp32 or bf16 "
                   "(default: the config's dense_precision, auto unless it "
                   "sets one: bf16 where oneDNN runs AMX kernels, fp32 "
                   "elsewhere; bf16 runs fp32 on a CPU without bf16 "
                   "instructions)")
        ->check(CLI::IsMember({"auto", "fp32", "bf16"}));
    const auto on_off = [&app](const char* name, std::string& value,
                               const char* help) {
      app.add_option(name, value, help)->check(CLI::IsMember({"on", "off"}));
    };
    on_off("--tf32", tf32,
           "device cuda: on runs the float GEMMs on the tensor cores in TF32, "
           "off keeps them in float (default: the config's gpu_disable_tf32, "
           "on unless it sets it)");
    on_off("--cuda-graphs", cuda_graphs,
           "device cuda: on replays the dense backend's launch sequences as "
           "CUDA graphs, off launches them one by one (default: the config's "
           "gpu_cuda_graphs, off unless it sets it; not yet run on a GPU)");
  }

  // Sets them in `config` (InvalidArgument as the Apply*Flag functions).
  absl::Status Apply(ModelConfig* config) const {
    RETURN_IF_ERROR(ApplyDeviceFlag(device, config));
    RETURN_IF_ERROR(ApplyPrecisionFlag(precision, config));
    RETURN_IF_ERROR(ApplyTf32Flag(tf32, config));
    return ApplyCudaGraphsFlag(cuda_graphs, config);
  }
};

}  // namespace dlrm
