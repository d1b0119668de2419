// dlrm_bench_interaction: the dot interaction's two CPU implementations
// (dense::DotImpl kLoops and kGemm) timed on the same random inputs, forward
// and backward, interleaved (loops, gemm, loops, gemm, ...) so that a noisy
// machine slows both alike. Prints one JSON line per shape with the median
// milliseconds of each and the loops / gemm ratio (> 1: the GEMMs are
// faster), and which one ChooseDotImpl picks for each pass.
#include <omp.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <vector>

#include "core/aligned.h"
#include "core/cli_parse.h"
#include "dense/interaction.h"

namespace dlrm {
namespace {

using dense::DotImpl;

struct Flags {
  std::vector<int> dims = {16, 128};
  std::vector<int64_t> batches = {2048, 16384};
  int vectors = 27;  // n: 26 tables + the bottom MLP's output
  int repeats = 9;
  int iters = 5;
  int threads = 0;
};

const char* Name(DotImpl impl) {
  return impl == DotImpl::kGemm ? "gemm" : "loops";
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Milliseconds per call of fn, averaged over `iters` calls.
template <typename Fn>
double TimeMs(int iters, Fn fn) {
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) fn();
  const std::chrono::duration<double, std::milli> ms =
      std::chrono::steady_clock::now() - start;
  return ms.count() / iters;
}

void RunShape(const Flags& f, int n, int d, int64_t batch) {
  const int zdim = dense::DotInteractionDim(n, d);
  std::mt19937 gen(7);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  AlignedVector<float> t(batch * n * d), dz(batch * zdim);
  for (float& x : t) x = dist(gen);
  for (float& x : dz) x = dist(gen);
  AlignedVector<float> z(batch * zdim), dt(batch * n * d);
  const DotImpl impls[2] = {DotImpl::kLoops, DotImpl::kGemm};
  std::vector<double> fwd[2], bwd[2];
  for (int r = -1; r < f.repeats; ++r) {  // r = -1: warm-up, not kept
    for (int k = 0; k < 2; ++k) {
      const double mf = TimeMs(f.iters, [&] {
        dense::DotInteractionForward(impls[k], t.data(), batch, n, d, z.data());
      });
      const double mb = TimeMs(f.iters, [&] {
        dense::DotInteractionBackward(impls[k], t.data(), dz.data(), batch, n,
                                      d, dt.data());
      });
      if (r >= 0) {
        fwd[k].push_back(mf);
        bwd[k].push_back(mb);
      }
    }
  }
  const double lf = Median(fwd[0]), gf = Median(fwd[1]);
  const double lb = Median(bwd[0]), gb = Median(bwd[1]);
  std::printf(
      "{\"n\": %d, \"d\": %d, \"batch\": %lld, \"threads\": %d, "
      "\"loops_fwd_ms\": %.3f, \"gemm_fwd_ms\": %.3f, \"fwd_ratio\": %.2f, "
      "\"loops_bwd_ms\": %.3f, \"gemm_bwd_ms\": %.3f, \"bwd_ratio\": %.2f, "
      "\"step_ratio\": %.2f, \"fwd_chosen\": \"%s\", \"bwd_chosen\": \"%s\"}\n",
      n, d, static_cast<long long>(batch), omp_get_max_threads(), lf, gf,
      lf / gf, lb, gb, lb / gb, (lf + lb) / (gf + gb),
      Name(dense::ChooseDotImpl(dense::DotPass::kForward, batch, n, d)),
      Name(dense::ChooseDotImpl(dense::DotPass::kBackward, batch, n, d)));
  std::fflush(stdout);
}

}  // namespace
}  // namespace dlrm

int main(int argc, char** argv) {
  dlrm::Flags f;
  CLI::App app{"The dot interaction: register-blocked loops vs batched GEMMs."};
  dlrm::AddDefaulted(app, "--dims", f.dims, "Vector widths d")->delimiter(',');
  dlrm::AddDefaulted(app, "--batches", f.batches, "Samples per call")
      ->delimiter(',');
  dlrm::AddDefaulted(app, "--vectors", f.vectors,
                     "Vectors per sample n (tables + 1)");
  dlrm::AddDefaulted(app, "--repeats", f.repeats,
                     "Timed repetitions (median reported)");
  dlrm::AddDefaulted(app, dlrm::kStepsFlag, f.iters, "Calls per repetition");
  app.add_option("--threads", f.threads, "Threads (0 = all cores)");
  CLI11_PARSE(app, argc, argv);
  if (f.threads > 0) omp_set_num_threads(f.threads);
  for (int d : f.dims) {
    for (int64_t batch : f.batches) dlrm::RunShape(f, f.vectors, d, batch);
  }
  return 0;
}
