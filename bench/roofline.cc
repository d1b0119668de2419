// The step's GEMM shapes, their timing on this host, the copy bandwidth,
// the embedding stages' bytes and the fractions of the ceilings.
#include "bench/roofline.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <unordered_set>

#include "core/aligned.h"
#include "dense/bf16.h"
#include "dense/linear.h"
#include "optim/optimizer.h"

namespace dlrm::bench {
namespace {

using Stage = model::StageTimes::Stage;

void AddMlp(const std::vector<int64_t>& widths, int64_t batch,
            const std::string& name, Stage forward, Stage backward,
            bool first_dx, std::vector<GemmShape>* out) {
  for (size_t i = 0; i + 1 < widths.size(); ++i) {
    const int64_t in = widths[i], o = widths[i + 1];
    const std::string layer = name + "." + std::to_string(i);
    out->push_back({forward, layer + " Y", 'N', 'T', batch, o, in});
    out->push_back({backward, layer + " dW", 'T', 'N', o, in, batch});
    if (i > 0 || first_dx) {
      out->push_back({backward, layer + " dX", 'N', 'N', batch, in, o});
    }
  }
}

double Seconds(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
      .count();
}

}  // namespace

std::vector<GemmShape> StepGemms(const ModelConfig& config, int64_t batch) {
  std::vector<GemmShape> out;
  std::vector<int64_t> bottom = {config.num_dense_features()};
  for (int w : config.bottom_mlp()) bottom.push_back(w);
  AddMlp(bottom, batch, "bottom_mlp", model::StageTimes::kBottomForward,
         model::StageTimes::kBottomBackward, /*first_dx=*/false, &out);
  const int64_t features = config.tables_size() + 1;
  int64_t n = bottom.back();
  for (const TableConfig& t : config.tables()) n += t.dim();
  int64_t top_in = n;
  if (config.interaction() == INTERACTION_DOT) {
    top_in = bottom.back() + features * (features - 1) / 2;
  }
  if (config.interaction() == INTERACTION_DCN) {
    const int64_t r = config.dcn_low_rank_dim();
    for (int l = 0; l < config.dcn_num_layers(); ++l) {
      const std::string layer = "cross." + std::to_string(l);
      const Stage f = model::StageTimes::kInteractionForward;
      const Stage b = model::StageTimes::kInteractionBackward;
      out.push_back({f, layer + " V x", 'N', 'T', batch, r, n});
      out.push_back({f, layer + " W h", 'N', 'T', batch, n, r});
      out.push_back({b, layer + " dW", 'T', 'N', n, r, batch});
      out.push_back({b, layer + " dh", 'N', 'N', batch, r, n});
      out.push_back({b, layer + " dV", 'T', 'N', r, n, batch});
      out.push_back({b, layer + " dx", 'N', 'N', batch, n, r});
    }
  }
  std::vector<int64_t> top = {top_in};
  for (int w : config.top_mlp()) top.push_back(w);
  AddMlp(top, batch, "top_mlp", model::StageTimes::kTopForward,
         model::StageTimes::kTopBackward, /*first_dx=*/true, &out);
  return out;
}

void AmxGemmAsLayers(const GemmShape& s, const dense::Bf16* a,
                     const dense::Bf16* b, dense::AmxPackedB* packed,
                     float* c) {
  if (s.trans_b == 'N') {
    packed->Pack(b, s.k, s.n, s.n);
  } else {
    packed->PackTransposed(b, s.k, s.n, s.k);
  }
  dense::AmxGemm(s.m, a, s.k, *packed, {nullptr, false, c, nullptr, s.n});
}

double TimeGemm(const GemmShape& s, bool bf16, int repeats) {
  const int64_t a_size = s.m * s.k, b_size = s.k * s.n;
  const int64_t lda = s.trans_a == 'N' ? s.k : s.m;
  const int64_t ldb = s.trans_b == 'N' ? s.n : s.k;
  AlignedVector<float> a(a_size), b(b_size), c(s.m * s.n);
  for (int64_t i = 0; i < a_size; ++i)
    a[i] = 0.001f * static_cast<float>(i % 97);
  for (int64_t i = 0; i < b_size; ++i)
    b[i] = 0.002f * static_cast<float>(i % 89);
  AlignedVector<dense::Bf16> a16, b16;
  if (bf16) {
    a16.resize(a_size);
    b16.resize(b_size);
    dense::ToBf16(a.data(), a_size, a16.data());
    dense::ToBf16(b.data(), b_size, b16.data());
  }
  auto call = [&] {
    if (bf16) {
      dense::Bgemm(s.trans_a, s.trans_b, s.m, s.n, s.k, a16.data(), lda,
                   b16.data(), ldb, 0.0f, c.data(), s.n);
    } else {
      dense::Sgemm(s.trans_a, s.trans_b, s.m, s.n, s.k, a.data(), lda, b.data(),
                   ldb, 0.0f, c.data(), s.n);
    }
  };
  // The AMX kernel as the layers call it (for 'T', A's values stand in for
  // the transposed copy the layer writes).
  dense::AmxPackedB packed;
  auto amx = [&] {
    AmxGemmAsLayers(s, a16.data(), b16.data(), &packed, c.data());
  };
  const bool with_amx = bf16 && dense::AmxGemmUsable();
  call();
  call();
  if (with_amx) {
    amx();
    amx();
  }
  double best = 1e30;
  for (int r = 0; r < std::max(repeats, 1); ++r) {
    auto t0 = std::chrono::steady_clock::now();
    call();
    best = std::min(best, Seconds(t0));
    if (with_amx) {
      t0 = std::chrono::steady_clock::now();
      amx();
      best = std::min(best, Seconds(t0));
    }
  }
  return best;
}

double CopyBandwidth(int64_t bytes, int repeats) {
  const int64_t n = std::max<int64_t>(bytes / 4, 1024);
  AlignedVector<float> from(n), to(n);
  // Touch both, so the pages exist before the timing.
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    from[i] = static_cast<float>(i & 1023);
    to[i] = 0;
  }
  double best = 1e30;
  for (int r = 0; r < std::max(repeats, 1) + 1; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel
    {
      const int64_t threads = omp_get_num_threads();
      const int64_t t = omp_get_thread_num();
      const int64_t begin = n * t / threads, end = n * (t + 1) / threads;
      std::memcpy(to.data() + begin, from.data() + begin,
                  (end - begin) * sizeof(float));
    }
    if (r > 0) best = std::min(best, Seconds(t0));
  }
  // Keep the copy from being optimised away.
  volatile float sink = to[n / 2];
  (void)sink;
  return 2.0 * static_cast<double>(n) * sizeof(float) / best;
}

EmbeddingBytes StepEmbeddingBytes(const ModelConfig& config,
                                  const data::Batch& batch) {
  EmbeddingBytes bytes;
  for (int k = 0;
       k < config.tables_size() && k < static_cast<int>(batch.sparse.size());
       ++k) {
    const TableConfig& t = config.tables(k);
    const data::SparseFeature& f = batch.sparse[k];
    const double row = 4.0 * t.dim();
    const double pooled = static_cast<double>(batch.size) * row;
    std::unordered_set<int64_t> distinct(f.ids.begin(), f.ids.end());
    const double u = static_cast<double>(distinct.size());
    bytes.lookup += static_cast<double>(f.ids.size()) * (row + 8) + pooled;
    const double state = 4.0 * optim::SparseStateFloatsPerRow(
                                   config.sparse_optimizer(), t.dim());
    bytes.update += pooled + 2.0 * u * (row + state);
  }
  return bytes;
}

std::vector<StageRoof> Roofline(
    const std::array<double, model::StageTimes::kNumStages>& stage_seconds,
    const std::vector<GemmShape>& gemms,
    const std::vector<double>& gemm_seconds, const EmbeddingBytes& bytes,
    double copy_bytes_per_s) {
  std::array<double, model::StageTimes::kNumStages> ceiling{};
  std::array<const char*, model::StageTimes::kNumStages> bound{};
  for (size_t i = 0; i < gemms.size() && i < gemm_seconds.size(); ++i) {
    ceiling[gemms[i].stage] += gemm_seconds[i];
    bound[gemms[i].stage] = "gemm";
  }
  if (copy_bytes_per_s > 0) {
    ceiling[model::StageTimes::kLookup] = bytes.lookup / copy_bytes_per_s;
    bound[model::StageTimes::kLookup] = "copy";
    ceiling[model::StageTimes::kEmbeddingUpdate] =
        bytes.update / copy_bytes_per_s;
    bound[model::StageTimes::kEmbeddingUpdate] = "copy";
  }
  std::vector<StageRoof> out;
  for (int s = 0; s < model::StageTimes::kNumStages; ++s) {
    StageRoof r;
    r.stage = model::StageTimes::Name(s);
    r.measured_ms = 1e3 * stage_seconds[s];
    r.ceiling_ms = 1e3 * ceiling[s];
    if (bound[s] != nullptr) r.bound = bound[s];
    if (r.ceiling_ms > 0 && r.measured_ms > 0) {
      r.fraction = r.ceiling_ms / r.measured_ms;
    }
    out.push_back(r);
  }
  return out;
}

}  // namespace dlrm::bench
