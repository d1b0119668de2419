// The planted Teacher of synthetic data (data/synthetic.h).
#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "core/random.h"
#include "data/synthetic.h"
#include "data/synthetic_internal.h"

namespace dlrm::data {
namespace {
using namespace synthetic_internal;  // NOLINT: data/'s own internals
}  // namespace

Teacher::Teacher(const ModelConfig& config, uint64_t teacher_seed,
                 int64_t vocabulary)
    : seed_(teacher_seed), num_dense_(config.num_dense_features()) {
  const int num_tables = config.tables_size();
  double variance = 0;

  if (num_dense_ > 0) {
    std::vector<double> g(num_dense_);
    double norm = 0;
    for (int j = 0; j < num_dense_; ++j) {
      g[j] = NormalAt(seed_, kDenseWeightStream, j);
      norm += g[j] * g[j];
    }
    const double scale = std::sqrt(kDenseVariance / std::max(norm, 1e-12));
    for (int j = 0; j < num_dense_; ++j) {
      const auto [mean, sd] = DenseMoments(DenseSpecFor(j));
      dense_mean_.push_back(mean);
      dense_weight_.push_back(g[j] * scale / sd);
    }
    variance += kDenseVariance;
  }

  const int max_pairs = num_tables * (num_tables - 1) / 2;
  const int num_pairs = std::min(kMaxPairs, max_pairs);
  Rng pair_rng(HashKey(seed_, kPairStream, 0));
  while (static_cast<int>(pairs_.size()) < num_pairs) {
    int t = static_cast<int>(pair_rng.Below(num_tables));
    int u = static_cast<int>(pair_rng.Below(num_tables));
    if (t == u) continue;
    if (t > u) std::swap(t, u);
    if (std::find(pairs_.begin(), pairs_.end(), std::make_pair(t, u)) ==
        pairs_.end()) {
      pairs_.emplace_back(t, u);
    }
  }

  tables_.resize(num_tables);
  std::vector<bool> in_pair(num_tables, false);
  for (const auto& [t, u] : pairs_) in_pair[t] = in_pair[u] = true;
  std::vector<double> mean_a(num_tables, 0.0);
  std::vector<std::array<double, kVectorDim>> mean_v(num_tables);
  for (auto& v : mean_v) v.fill(0.0);
  // Every pair term <V_t, V_u> has variance kVectorDim * c^2 when each
  // component of v_t has variance c, whatever the two tables.
  const double component_variance =
      num_pairs > 0 ? std::sqrt(kPairVariance / (kVectorDim * num_pairs)) : 0;
  if (vocabulary > 0) {
    // Every id alike (h = 1): Var a_t(id) = alpha_t^2 and each component of
    // v_t(id) has variance beta_t^2, for any id drawn. Stored while all
    // tables' parameters fit kMaxStoredParameters.
    int64_t parameters = 0;
    for (int t = 0; t < num_tables && vocabulary < kMaxStoredParameters; ++t) {
      parameters += (vocabulary + 1) * (in_pair[t] ? 1 + kVectorDim : 1);
    }
    const bool store =
        vocabulary < kMaxStoredParameters && parameters <= kMaxStoredParameters;
    for (int t = 0; t < num_tables; ++t) {
      pooling_mean_.push_back(config.tables(t).pooling() == POOLING_MEAN);
      Table& table = tables_[t];
      table.alpha = std::sqrt(kIdVariance / num_tables);
      table.in_pair = in_pair[t];
      if (in_pair[t]) table.beta = std::sqrt(component_variance);
      table.seed = seed_;
      table.a_stream = kIdEffectStream + t;
      table.v_stream = kIdVectorStream + t;
      if (!store) {
        table.computed_ids = vocabulary;
        continue;
      }
      table.a.assign(vocabulary + 1, 0.0f);
      table.v.assign(in_pair[t] ? (vocabulary + 1) * kVectorDim : 0, 0.0f);
      for (int64_t id = 0; id < vocabulary; ++id) {
        table.a[id] = EffectOf(table, id);
        if (in_pair[t]) VectorOf(table, id, &table.v[id * kVectorDim]);
      }
    }
    variance += kIdVariance;
    if (num_pairs > 0) variance += kPairVariance;
    bias_ = std::log(kTargetCtr / (1 - kTargetCtr)) *
            std::sqrt(1 + std::numbers::pi * variance / 8);
    return;
  }
  for (int t = 0; t < num_tables; ++t) {
    const TableConfig& config_table = config.tables(t);
    pooling_mean_.push_back(config_table.pooling() == POOLING_MEAN ? 1 : 0);
    // Scales assume the default Zipf(1.05) ids whatever the stream's alpha:
    // the ground truth must not depend on how samples are drawn.
    const std::vector<int64_t> quadrature = QuadratureIds(config_table.rows());
    double hot2 = 0;
    for (int64_t id : quadrature) hot2 += Hot(id) * Hot(id);
    hot2 /= quadrature.size();
    Table& table = tables_[t];
    table.alpha = std::sqrt(kIdVariance / num_tables / hot2);
    table.in_pair = in_pair[t];
    if (in_pair[t]) table.beta = std::sqrt(component_variance / hot2);
    const int64_t ids = std::min<int64_t>(
        kEffectIds, std::max<int64_t>(config_table.rows(), 0));
    // One zero entry past the end stands for every id without an effect.
    table.a.assign(ids + 1, 0.0f);
    table.v.assign(in_pair[t] ? (ids + 1) * kVectorDim : 0, 0.0f);
    for (int64_t id = 0; id < ids; ++id) {
      table.a[id] = static_cast<float>(
          table.alpha * Hot(id) * NormalAt(seed_, kIdEffectStream + t, id));
      if (!in_pair[t]) continue;
      const double scale = table.beta * Hot(id);
      for (int k = 0; k < kVectorDim; ++k) {
        table.v[id * kVectorDim + k] = static_cast<float>(
            scale * NormalAt(seed_, kIdVectorStream + t, kVectorDim * id + k));
      }
    }
    // Expected a_t and v_t, so the bias can cancel them: the hottest ids'
    // random effects would otherwise move the CTR from seed to seed.
    for (int64_t id : quadrature) {
      const uint64_t row = std::min<uint64_t>(id, ids);
      mean_a[t] += table.a[row] / quadrature.size();
      if (!in_pair[t]) continue;
      for (int k = 0; k < kVectorDim; ++k) {
        mean_v[t][k] += table.v[row * kVectorDim + k] / quadrature.size();
      }
    }
  }
  if (num_tables > 0) variance += kIdVariance;
  if (num_pairs > 0) variance += kPairVariance;

  const double base = std::log(kTargetCtr / (1 - kTargetCtr));
  bias_ = base * std::sqrt(1 + std::numbers::pi * variance / 8);
  for (int t = 0; t < num_tables; ++t) bias_ -= mean_a[t];
  for (const auto& [t, u] : pairs_) {
    for (int k = 0; k < kVectorDim; ++k) bias_ -= mean_v[t][k] * mean_v[u][k];
  }
}

float Teacher::EffectOf(const Table& table, int64_t id) {
  return static_cast<float>(table.alpha *
                            NormalAt(table.seed, table.a_stream, id));
}

void Teacher::VectorOf(const Table& table, int64_t id, float* v) {
  for (int k = 0; k < kVectorDim; ++k) {
    v[k] = static_cast<float>(
        table.beta * NormalAt(table.seed, table.v_stream, kVectorDim * id + k));
  }
}

double Teacher::PoolEffect(const Table& table, bool mean,
                           const SparseFeature& f, int64_t s) {
  const int64_t begin = f.offsets[s];
  const int64_t end = f.offsets[s + 1];
  double a = 0;
  if (table.computed_ids > 0) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t id = f.ids[i];
      if (id >= 0 && id < table.computed_ids) a += EffectOf(table, id);
    }
    return mean && end - begin > 1 ? a / (end - begin) : a;
  }
  const uint64_t none = table.a.size() - 1;
  for (int64_t i = begin; i < end; ++i) {
    // Cold, negative or out-of-range ids (the last two possible in a
    // caller's batch) all read the zero entry; no branch to mispredict.
    const uint64_t id = static_cast<uint64_t>(f.ids[i]);
    a += table.a[std::min(id, none)];
  }
  return mean && end - begin > 1 ? a / (end - begin) : a;
}

void Teacher::PoolVector(const Table& table, bool mean, const SparseFeature& f,
                         int64_t s, double* v) {
  const int64_t begin = f.offsets[s];
  const int64_t end = f.offsets[s + 1];
  for (int k = 0; k < kVectorDim; ++k) v[k] = 0;
  if (table.computed_ids > 0) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t id = f.ids[i];
      if (id < 0 || id >= table.computed_ids) continue;
      float x[kVectorDim];
      VectorOf(table, id, x);
      for (int k = 0; k < kVectorDim; ++k) v[k] += x[k];
    }
    if (mean && end - begin > 1) {
      for (int k = 0; k < kVectorDim; ++k) v[k] /= (end - begin);
    }
    return;
  }
  const uint64_t none = table.v.size() / kVectorDim - 1;
  for (int64_t i = begin; i < end; ++i) {
    const uint64_t id = static_cast<uint64_t>(f.ids[i]);
    const float* x = &table.v[std::min(id, none) * kVectorDim];
    for (int k = 0; k < kVectorDim; ++k) v[k] += x[k];
  }
  if (mean && end - begin > 1) {
    for (int k = 0; k < kVectorDim; ++k) v[k] /= (end - begin);
  }
}

// Term by term over the whole batch rather than sample by sample: the
// samples' sums are independent, so the adds overlap instead of waiting on
// one long dependency chain per sample.
void Teacher::Probabilities(const Batch& batch, float* out) const {
  const int64_t n = batch.size;
  std::vector<double> logit(n, bias_);
  const int num_dense = std::min(num_dense_, batch.num_dense);
  const int stride = batch.num_dense;
  for (int j = 0; j < num_dense; ++j) {
    const float* x = batch.dense.data() + j;
    const double w = dense_weight_[j];
    const double mu = dense_mean_[j];
    for (int64_t s = 0; s < n; ++s) logit[s] += w * (x[s * stride] - mu);
  }
  const int num_tables =
      static_cast<int>(std::min(tables_.size(), batch.sparse.size()));
  for (int t = 0; t < num_tables; ++t) {
    const Table& table = tables_[t];
    const SparseFeature& f = batch.sparse[t];
    for (int64_t s = 0; s < n; ++s) {
      logit[s] += PoolEffect(table, pooling_mean_[t], f, s);
    }
  }
  // A table the batch lacks has no vectors, so its pair terms vanish.
  for (const auto& [t, u] : pairs_) {
    if (u >= num_tables) continue;
    for (int64_t s = 0; s < n; ++s) {
      double vt[kVectorDim], vu[kVectorDim];
      PoolVector(tables_[t], pooling_mean_[t], batch.sparse[t], s, vt);
      PoolVector(tables_[u], pooling_mean_[u], batch.sparse[u], s, vu);
      double dot = 0;
      for (int k = 0; k < kVectorDim; ++k) dot += vt[k] * vu[k];
      logit[s] += dot;
    }
  }
  for (int64_t s = 0; s < n; ++s) {
    out[s] = static_cast<float>(1.0 / (1.0 + std::exp(-logit[s])));
  }
}

}  // namespace dlrm::data
