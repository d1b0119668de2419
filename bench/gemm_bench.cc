// dlrm_bench_gemm: the bf16 GEMMs of one training step (bench/roofline.h
// StepGemms) on oneDNN's matmul (dense::Bgemm) and on the hand-written AMX
// kernel (dense/amx_gemm.h, the packing of its B operand included, as the
// layers pay it), interleaved (onednn, amx, onednn, amx, ...) so that a
// loaded machine slows both alike. Prints one JSON line per shape with
// the median wall and CPU (all threads) milliseconds of each, their GFLOP/s
// and the onednn / amx ratio of wall times (> 1: the AMX kernel is
// faster), then the sums over the step's shapes.
#include <omp.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <string>
#include <vector>

#include "bench/roofline.h"
#include "core/aligned.h"
#include "core/config.h"
#include "dense/amx_gemm.h"
#include "dense/bf16.h"
#include "dense/cpu_isa.h"

namespace dlrm {
namespace {

struct Flags {
  std::string config = "kaggle";
  int64_t batch = 2048;
  int repeats = 15;
  int threads = 0;
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double CpuMs() {
  timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return t.tv_sec * 1e3 + t.tv_nsec * 1e-6;
}

double WallMs() {
  return std::chrono::duration<double, std::milli>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

struct Times {
  std::vector<double> wall, cpu;
};

template <typename Fn>
void TimeOnce(Fn fn, Times* t) {
  const double w0 = WallMs(), c0 = CpuMs();
  fn();
  t->cpu.push_back(CpuMs() - c0);
  t->wall.push_back(WallMs() - w0);
}

struct Totals {
  double onednn_wall = 0, amx_wall = 0, onednn_cpu = 0, amx_cpu = 0;
};

void RunShape(const bench::GemmShape& s, int repeats, Totals* totals) {
  // op(A) [m x k] and op(B) [k x n] as stored for oneDNN; the AMX kernel
  // reads A row-major [m x k] (for 'T', A's values stand in for the
  // transposed copy the layer writes) and packs B from its stored form.
  const int64_t lda = s.trans_a == 'N' ? s.k : s.m;
  const int64_t ldb = s.trans_b == 'N' ? s.n : s.k;
  AlignedVector<dense::Bf16> a(s.m * s.k), b(s.k * s.n);
  for (int64_t i = 0; i < s.m * s.k; ++i) {
    a[i] = dense::ToBf16(0.001f * static_cast<float>(i % 97));
  }
  for (int64_t i = 0; i < s.k * s.n; ++i) {
    b[i] = dense::ToBf16(0.002f * static_cast<float>(i % 89));
  }
  AlignedVector<float> c(s.m * s.n);
  dense::AmxPackedB packed;
  auto onednn = [&] {
    dense::Bgemm(s.trans_a, s.trans_b, s.m, s.n, s.k, a.data(), lda, b.data(),
                 ldb, 0.0f, c.data(), s.n);
  };
  auto amx = [&] {
    bench::AmxGemmAsLayers(s, a.data(), b.data(), &packed, c.data());
  };
  onednn();
  amx();
  Times o, x;
  for (int r = 0; r < repeats; ++r) {
    TimeOnce(onednn, &o);
    TimeOnce(amx, &x);
  }
  const double ow = Median(o.wall), xw = Median(x.wall);
  const double oc = Median(o.cpu), xc = Median(x.cpu);
  const double gflop = s.flops() * 1e-6;  // per ms: GFLOP/s
  std::printf(
      "{\"shape\": \"%s\", \"op\": \"%c%c\", \"m\": %lld, \"n\": %lld, \"k\": "
      "%lld, \"onednn_ms\": %.4f, \"amx_ms\": %.4f, \"onednn_cpu_ms\": %.4f, "
      "\"amx_cpu_ms\": %.4f, \"onednn_gflops\": %.0f, \"amx_gflops\": %.0f, "
      "\"onednn_over_amx\": %.2f}\n",
      s.what.c_str(), s.trans_a, s.trans_b, static_cast<long long>(s.m),
      static_cast<long long>(s.n), static_cast<long long>(s.k), ow, xw, oc, xc,
      gflop / ow, gflop / xw, ow / xw);
  totals->onednn_wall += ow;
  totals->amx_wall += xw;
  totals->onednn_cpu += oc;
  totals->amx_cpu += xc;
}

int Run(const Flags& f) {
  if (f.threads > 0) omp_set_num_threads(f.threads);
  if (!dense::AmxGemmUsable()) {
    std::fprintf(stderr,
                 "dlrm_bench_gemm: AMX tiles are not usable here (%s); "
                 "nothing to compare\n",
                 dense::AmxUnusableReason(dense::DetectAmx()).empty()
                     ? "no AMX, oneDNN held below it, or DLRM_AMX_GEMM=0"
                     : dense::AmxUnusableReason(dense::DetectAmx()).c_str());
    return 1;
  }
  auto config = LoadModelConfig(f.config);
  if (!config.ok()) {
    std::fprintf(stderr, "dlrm_bench_gemm: %s\n",
                 std::string(config.status().message()).c_str());
    return 2;
  }
  std::printf(
      "{\"bench\": \"gemm\", \"config\": \"%s\", \"batch\": %lld, "
      "\"threads\": %d, \"cpu\": \"%s\", \"onednn_isa\": \"%s\"}\n",
      f.config.c_str(), static_cast<long long>(f.batch), omp_get_max_threads(),
      dense::CpuModel().c_str(), dense::MatmulIsa(true).c_str());
  Totals t;
  for (const bench::GemmShape& s : bench::StepGemms(*config, f.batch)) {
    RunShape(s, f.repeats, &t);
  }
  std::printf(
      "{\"total\": true, \"onednn_ms\": %.3f, \"amx_ms\": %.3f, "
      "\"onednn_cpu_ms\": %.3f, \"amx_cpu_ms\": %.3f, \"onednn_over_amx\": "
      "%.2f}\n",
      t.onednn_wall, t.amx_wall, t.onednn_cpu, t.amx_cpu,
      t.onednn_wall / t.amx_wall);
  return 0;
}

}  // namespace
}  // namespace dlrm

int main(int argc, char** argv) {
  dlrm::Flags f;
  CLI::App app{"bf16 step GEMMs: oneDNN matmul against the AMX kernel"};
  app.add_option("--config", f.config, "model config name or path");
  app.add_option("--batch", f.batch, "samples per step");
  app.add_option("--repeats", f.repeats, "timed calls of each, interleaved");
  app.add_option("--threads", f.threads, "OpenMP threads (0: default)");
  CLI11_PARSE(app, argc, argv);
  return dlrm::Run(f);
}
