// dlrm_bench's projected rows: an N-rank accelerator node modelled from
// the measured stage times and the bytes each exchange moves (a model,
// not a measurement: docs/benchmark.md).
#include <algorithm>

#include "bench/dlrm_bench.h"
#include "core/config.h"

namespace dlrm::bench {

Row Project(const ModelConfig& config, const Flags& f, int ranks,
            const std::map<std::string, double>& stage_ms,
            const std::string& hardware) {
  double tables = 0, dims = 0, ids = 0;
  for (const TableConfig& t : config.tables()) {
    tables += 1;
    dims += t.dim();
    // Bags hold k ids (MULTI_HOT_FIXED) or 1..k uniformly: (k + 1) / 2 on
    // average.
    ids += t.multi_hot_distribution() == MULTI_HOT_FIXED
               ? t.multi_hot_size()
               : (t.multi_hot_size() + 1) / 2.0;
  }
  const double r = ranks;
  const double n = static_cast<double>(f.batch);
  const double global = r * n;
  const double remote = 1 - 1 / r;
  const double dense = static_cast<double>(DenseParameterCount(config));
  Row row;
  row.projected = true;
  row.hardware = hardware;
  row.scenario = absl::StrCat(ranks, " ranks hybrid parallel");
  row.feed = "projected from measured stage times";
  row.bytes_per_step = {
      {"lengths", 8 * n * tables * remote},
      {"ids", 8 * n * ids * remote},
      {"pooled", 4 * (dims / r) * (global - n)},
      {"gradients", 4 * n * dims * remote},
      {"dense_allreduce", 2 * remote * 4 * (dense + 1)},
  };
  // Share of a rank's peers on other nodes; their traffic takes the
  // network, the rest NVLink, concurrently.
  const double off =
      ranks > f.ranks_per_node ? (r - f.ranks_per_node) / (r - 1) : 0;
  const double alpha = f.latency_us * 1e-6;
  auto all_to_all = [&](double bytes) {
    return alpha + std::max(bytes * (1 - off) / (f.nvlink_gbps * 1e9),
                            bytes * off / (f.network_gbps * 1e9));
  };
  const double ring_bw = off > 0 ? f.network_gbps * 1e9 : f.nvlink_gbps * 1e9;
  double compute = 0;
  for (const auto& [stage, ms] : stage_ms) compute += ms * 1e-3;
  compute /= f.compute_speedup;
  row.model_ms = {
      {"compute", 1e3 * compute},
      {"input_dist", 1e3 * (all_to_all(row.bytes_per_step["lengths"]) +
                            all_to_all(row.bytes_per_step["ids"]))},
      {"output_dist", 1e3 * all_to_all(row.bytes_per_step["pooled"])},
      {"backward_dist", 1e3 * all_to_all(row.bytes_per_step["gradients"])},
      {"allreduce", 1e3 * (2 * (r - 1) * alpha +
                           row.bytes_per_step["dense_allreduce"] / ring_bw)},
  };
  double step = 0;
  for (const auto& [name, ms] : row.model_ms) step += ms * 1e-3;
  row.model_ms["step"] = 1e3 * step;
  row.samples_per_s = {global / step};
  return row;
}

}  // namespace dlrm::bench
