// Synthetic Criteo-shaped data: the planted Teacher and the generator that
// draws Zipf ids, Criteo-like dense features and teacher labels.
#include "data/synthetic.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <numbers>

#include "absl/strings/str_cat.h"
#include "core/random.h"
#include "core/status.h"
#include "data/row_reducer.h"
#include "data/source_checks.h"

namespace dlrm::data {
namespace {

// Variance budget of the teacher's logit (see the Teacher comment).
constexpr double kDenseVariance = 1.2;
constexpr double kIdVariance = 0.8;
constexpr double kPairVariance = 0.3;
constexpr double kTargetCtr = 0.25;
constexpr int kMaxPairs = 8;
constexpr int kVectorDim = 4;
// h(id) = (1 + id / kHotScale)^-1/2 for id < kEffectIds, else 0. Ids past
// kEffectIds would hold under 1% of the id variance under Zipf(1.05); giving
// them none lets the teacher be a few table lookups per sample.
constexpr double kHotScale = 32.0;
constexpr int64_t kEffectIds = 1024;

// Teacher streams (HashKey's second argument).
constexpr uint64_t kDenseWeightStream = 1;
constexpr uint64_t kPairStream = 3;
constexpr uint64_t kIdEffectStream = 1000;
constexpr uint64_t kIdVectorStream = 2000;

// Teacher parameters are stored while they take at most this many floats
// (64 MiB) over all tables, else computed per lookup.
constexpr int64_t kMaxStoredParameters = int64_t{1} << 24;

// Seed of the vocabulary permutations: like the dense spec, a fixed
// property of the synthetic world, so train and eval streams and every
// teacher seed share the vocabulary.
constexpr uint64_t kVocabularySeed = 0x70ca6b1a7e5eedULL;

// The dense generator's parameters are a fixed property of the synthetic
// world, not of any seed, so the teacher can standardise features exactly.
constexpr uint64_t kDenseSpecSeed = 0x5d1e7c0ffee5eedULL;

struct DenseSpec {
  double p_zero;  // probability of an exact 0
  double m;       // log-count location
  double s;       // log-count scale
};

DenseSpec DenseSpecFor(int j) {
  const auto unit = [j](uint64_t k) {
    return BitsToOpenUnitDouble(HashKey(kDenseSpecSeed, k, j));
  };
  return {0.05 + 0.35 * unit(0), 0.5 + 3.0 * unit(1), 0.5 + 0.7 * unit(2)};
}

// log1p of the small counts that most dense values are, so generation pays
// for one exp per value instead of exp and log1p. Same floats as computing.
constexpr int kSmallCounts = 4096;
const std::vector<float>& SmallCountLog1p() {
  static const std::vector<float> table = [] {
    std::vector<float> t(kSmallCounts);
    for (int c = 0; c < kSmallCounts; ++c) {
      t[c] = static_cast<float>(std::log1p(static_cast<double>(c)));
    }
    return t;
  }();
  return table;
}

// A nonzero dense value for standard normal g; exp is capped so no value is
// ever infinite.
float DenseValue(const DenseSpec& spec, const float* small_log1p, double g) {
  const double count =
      std::floor(std::exp(std::min(spec.m + spec.s * g, 40.0)));
  if (count < kSmallCounts) return small_log1p[static_cast<int>(count)];
  return static_cast<float>(std::log1p(count));
}

// Mean and standard deviation of a dense feature, by quadrature over g.
std::pair<double, double> DenseMoments(const DenseSpec& spec) {
  constexpr int kPoints = 8001;
  constexpr double kLimit = 8.0;
  const float* small_log1p = SmallCountLog1p().data();
  double w_sum = 0, m1 = 0, m2 = 0;
  for (int i = 0; i < kPoints; ++i) {
    const double g = -kLimit + 2 * kLimit * i / (kPoints - 1);
    const double w = std::exp(-0.5 * g * g);
    const double x = DenseValue(spec, small_log1p, g);
    w_sum += w;
    m1 += w * x;
    m2 += w * x * x;
  }
  const double mean = (1 - spec.p_zero) * m1 / w_sum;
  const double second = (1 - spec.p_zero) * m2 / w_sum;
  const double sd = std::sqrt(std::max(second - mean * mean, 0.0));
  return {mean, sd > 1e-9 ? sd : 1.0};
}

// Ids of one table: id = floor(r) - 1, r from the inverse CDF of the
// continuous density proportional to r^-alpha on [1, rows + 1).
class ZipfSampler {
 public:
  // `lookup` builds the table that speeds up Draw.
  ZipfSampler(int64_t rows, double alpha, bool lookup = true)
      : rows_(std::max<int64_t>(rows, 1)),
        a_(1.0 - alpha),
        log_n1_(std::log(static_cast<double>(rows_) + 1.0)),
        c_(std::expm1(a_ * log_n1_)),
        inv_a_(std::abs(a_) < 1e-9 ? 0.0 : 1.0 / a_) {
    if (lookup && rows_ <= std::numeric_limits<uint32_t>::max()) {
      edges_.resize(kCells + 1);
      for (int i = 0; i <= kCells; ++i) {
        edges_[i] = static_cast<uint32_t>(Id(static_cast<double>(i) / kCells));
      }
    }
  }

  // The id for u uniform in [0, 1): a pure function of u.
  int64_t Id(double u) const {
    const double r = inv_a_ == 0.0 ? std::exp(u * log_n1_)
                                   : std::exp(std::log1p(u * c_) * inv_a_);
    const int64_t id = static_cast<int64_t>(r) - 1;
    return std::clamp<int64_t>(id, 0, rows_ - 1);
  }

  // Id(u), skipping the exp and log1p when u falls in a cell of [0, 1) that
  // maps to one id (Id is non-decreasing): the hot ids, which most draws are.
  int64_t Draw(double u) const {
    if (!edges_.empty()) {
      const int cell = static_cast<int>(u * kCells);
      if (edges_[cell] == edges_[cell + 1]) return edges_[cell];
    }
    return Id(u);
  }

 private:
  // 64 KiB of edges per table: generation walks one table at a time.
  static constexpr int kCells = 16384;

  int64_t rows_;
  double a_;
  double log_n1_;
  double c_;
  double inv_a_;
  std::vector<uint32_t> edges_;  // Id(i / kCells)
};

// A fixed bijection of [0, size): a 4-round Feistel network on the
// smallest even bit width 2h >= 2 with 2^2h >= size, cycle-walked (applied
// again while the value is >= size), which maps [0, size) onto itself
// because the network permutes [0, 2^2h). At most 4 walks on average.
class Permutation {
 public:
  Permutation(int64_t size, uint64_t key) : size_(static_cast<uint64_t>(size)) {
    int bits = 2;
    while (bits < 62 && (uint64_t{1} << bits) < size_) bits += 2;
    half_ = bits / 2;
    mask_ = (uint64_t{1} << half_) - 1;
    for (int i = 0; i < kRounds; ++i) keys_[i] = HashKey(key, i, size_);
  }

  // The image of x in [0, size).
  uint64_t operator()(uint64_t x) const {
    do {
      x = Network(x);
    } while (x >= size_);
    return x;
  }

 private:
  static constexpr int kRounds = 4;

  uint64_t Network(uint64_t x) const {
    uint64_t left = x >> half_;
    uint64_t right = x & mask_;
    for (int i = 0; i < kRounds; ++i) {
      const uint64_t next = left ^ (Mix64(right ^ keys_[i]) & mask_);
      left = right;
      right = next;
    }
    return (left << half_) | right;
  }

  uint64_t size_;
  int half_ = 1;
  uint64_t mask_ = 1;
  std::array<uint64_t, kRounds> keys_{};
};

double Hot(int64_t id) {
  if (id >= kEffectIds) return 0.0;
  return 1.0 / std::sqrt(1.0 + static_cast<double>(id) / kHotScale);
}

// Ids at stratified quantiles of a table's Zipf(1.05) distribution: means
// over them are the teacher's expectations over one drawn id.
std::vector<int64_t> QuadratureIds(int64_t rows) {
  constexpr int kPoints = 8192;
  const ZipfSampler zipf(rows, 1.05, /*lookup=*/false);
  std::vector<int64_t> ids(kPoints);
  for (int i = 0; i < kPoints; ++i) ids[i] = zipf.Id((i + 0.5) / kPoints);
  return ids;
}

// Standard normal i of a stream: Box-Muller on hashes 2 floor(i/2) and
// 2 floor(i/2) + 1, cos for even i and sin for odd i.
double NormalAt(uint64_t seed, uint64_t stream, uint64_t i) {
  const uint64_t pair = i / 2;
  const double u1 = BitsToOpenUnitDouble(HashKey(seed, stream, 2 * pair));
  const double u2 = BitsToOpenUnitDouble(HashKey(seed, stream, 2 * pair + 1));
  const double radius = std::sqrt(-2.0 * std::log(u1));
  const double angle = 2.0 * std::numbers::pi * u2;
  return radius * (i % 2 == 0 ? std::cos(angle) : std::sin(angle));
}

// Draw i of a sample whose key is `key`: the i-th output of Rng(key),
// computed directly so a batch can be generated one feature at a time.
inline uint64_t SampleDraw(uint64_t key, uint64_t i) {
  return Mix64(key + i * 0x9e3779b97f4a7c15ULL);
}

// Uniform in [0, 1), as Rng::Uniform.
inline double UnitDouble(uint64_t bits) {
  return static_cast<double>(bits >> 11) * (1.0 / 9007199254740992.0);
}

int MultiHot(const TableConfig& table) {
  return std::max(table.multi_hot_size(), 1);
}

// Generates a batch feature by feature (all samples' ids of table 0, then of
// table 1, ...): each sample's draws sit at fixed positions of its own
// stream, so the order of work does not change the samples, and the loops
// over samples are independent, cache-friendly and free of push_backs.
class SyntheticSource final : public BatchSource {
 public:
  SyntheticSource(const ModelConfig& config, SyntheticOptions options)
      : options_(options),
        teacher_(config, options.teacher_seed, options.vocabulary),
        num_dense_(config.num_dense_features()) {
    uint64_t slot = 0;
    const int64_t v = options.vocabulary;
    for (int t = 0; t < config.tables_size(); ++t) {
      const TableConfig& table = config.tables(t);
      zipf_.emplace_back(v > 0 ? v : table.rows(), options.zipf_alpha);
      if (v > 0) {
        permutation_.emplace_back(v, HashKey(kVocabularySeed, t, 0));
        const bool reduce = !table.dynamic() && table.rows() < v;
        reduce_.push_back(reduce);
        reducer_.emplace_back(reduce ? table.rows() : 1);
      }
      const int k = MultiHot(table);
      multi_hot_.push_back(k);
      fixed_.push_back(table.multi_hot_distribution() == MULTI_HOT_FIXED);
      table_slot_.push_back(slot);
      slot += k == 1 ? 1 : 1 + k;
    }
    for (int j = 0; j < num_dense_; ++j) dense_.push_back(DenseSpecFor(j));
    zero_slot_ = slot;
    normal_slot_ = zero_slot_ + num_dense_;
    label_slot_ = normal_slot_ + 2 * ((num_dense_ + 1) / 2);
  }

  absl::Status Rewind() override {
    next_ = 0;
    return absl::OkStatus();
  }

  // Sample i depends on i alone, so skipping is moving the counter.
  absl::StatusOr<int64_t> Skip(int64_t n) override {
    return SkipNumbered(n,
                        options_.num_samples > 0
                            ? options_.num_samples
                            : std::numeric_limits<int64_t>::max(),
                        &next_);
  }

  absl::StatusOr<bool> Next(int64_t max_samples, Batch* batch) override {
    const int num_tables = static_cast<int>(zipf_.size());
    RETURN_IF_ERROR(StartBatch(num_dense_, num_tables, max_samples, batch));
    int64_t n = max_samples;
    if (options_.num_samples > 0) {
      n = std::min(n, options_.num_samples - next_);
    }
    if (n <= 0) return false;

    batch->size = n;
    keys_.resize(n);
    for (int64_t s = 0; s < n; ++s) {
      keys_[s] = HashKey(options_.sample_seed, 0, next_ + s);
    }
    for (int t = 0; t < num_tables; ++t) {
      GenerateIds(t, n, &batch->sparse[t]);
      if (options_.vocabulary > 0) MapToVocabulary(t, n, &batch->sparse[t]);
    }
    GenerateDense(n, batch);
    probability_.resize(n);
    teacher_.Probabilities(*batch, probability_.data());
    if (options_.vocabulary > 0) {
      for (int t = 0; t < num_tables; ++t) {
        if (!reduce_[t]) continue;
        const RowReducer& reducer = reducer_[t];
        for (int64_t& id : batch->sparse[t].ids) {
          id = reducer(static_cast<uint64_t>(id));
        }
      }
    }
    batch->labels.resize(n);
    for (int64_t s = 0; s < n; ++s) {
      const double u = UnitDouble(SampleDraw(keys_[s], label_slot_));
      batch->labels[s] = u < probability_[s] ? 1.0f : 0.0f;
    }
    next_ += n;
    return true;
  }

 private:
  // Table t's bags: draw table_slot_[t] is the bag length (when multi-hot
  // and uniform; unused under MULTI_HOT_FIXED), the draws after it the ids.
  // A fixed bag's ids are thus the uniform bag's ids extended to length k.
  void GenerateIds(int t, int64_t n, SparseFeature* f) const {
    const ZipfSampler& zipf = zipf_[t];
    const uint64_t slot = table_slot_[t];
    const int k = multi_hot_[t];
    f->offsets.resize(n + 1);
    if (k > 1 && fixed_[t]) {
      f->ids.resize(n * k);
      for (int64_t s = 0; s < n; ++s) {
        const uint64_t key = keys_[s];
        int64_t* ids = f->ids.data() + s * k;
        for (int i = 0; i < k; ++i) {
          ids[i] = zipf.Draw(UnitDouble(SampleDraw(key, slot + 1 + i)));
        }
        f->offsets[s + 1] = (s + 1) * k;
      }
      return;
    }
    if (k == 1) {
      f->ids.resize(n);
      for (int64_t s = 0; s < n; ++s) {
        f->offsets[s + 1] = s + 1;
        f->ids[s] = zipf.Draw(UnitDouble(SampleDraw(keys_[s], slot)));
      }
      return;
    }
    f->ids.clear();
    f->ids.reserve(n * k);
    for (int64_t s = 0; s < n; ++s) {
      const uint64_t key = keys_[s];
      const int length =
          1 + static_cast<int>(
                  (static_cast<unsigned __int128>(SampleDraw(key, slot)) * k) >>
                  64);
      for (int i = 0; i < length; ++i) {
        f->ids.push_back(zipf.Draw(UnitDouble(SampleDraw(key, slot + 1 + i))));
      }
      f->offsets[s + 1] = static_cast<int64_t>(f->ids.size());
    }
  }

  // Under a vocabulary: rank position x = r - 1 of sample n = next_ + s
  // becomes Perm_t((x - floor((drift_start + n) drift)) mod V).
  void MapToVocabulary(int t, int64_t n, SparseFeature* f) const {
    const Permutation& permutation = permutation_[t];
    const uint64_t v = static_cast<uint64_t>(options_.vocabulary);
    const double drift = options_.drift;
    for (int64_t s = 0; s < n; ++s) {
      uint64_t shift = 0;
      if (drift > 0) {
        const double moved = std::floor(
            static_cast<double>(options_.drift_start + next_ + s) * drift);
        shift = static_cast<uint64_t>(std::fmod(moved, static_cast<double>(v)));
        shift = std::min(shift, v - 1);
      }
      const uint64_t back = shift == 0 ? 0 : v - shift;  // -shift mod V
      for (int64_t i = f->offsets[s]; i < f->offsets[s + 1]; ++i) {
        uint64_t x = static_cast<uint64_t>(f->ids[i]) + back;
        if (x >= v) x -= v;
        f->ids[i] = static_cast<int64_t>(permutation(x));
      }
    }
  }

  // Features 2p and 2p+1 share one Box-Muller pair (cos, sin) from draws
  // normal_slot_ + 2p and + 2p + 1; draw zero_slot_ + j decides an exact 0.
  void GenerateDense(int64_t n, Batch* batch) const {
    const int d = num_dense_;
    batch->dense.resize(n * d);
    float* dense = batch->dense.data();
    for (int j = 0; j < d; j += 2) {
      const bool has_second = j + 1 < d;
      for (int64_t s = 0; s < n; ++s) {
        const uint64_t key = keys_[s];
        const double u1 =
            BitsToOpenUnitDouble(SampleDraw(key, normal_slot_ + j));
        const double u2 = UnitDouble(SampleDraw(key, normal_slot_ + j + 1));
        const double radius = std::sqrt(-2.0 * std::log(u1));
        const double angle = 2.0 * std::numbers::pi * u2;
        const bool zero0 =
            UnitDouble(SampleDraw(key, zero_slot_ + j)) < dense_[j].p_zero;
        dense[s * d + j] = zero0 ? 0.0f
                                 : DenseValue(dense_[j], small_log1p_,
                                              radius * std::cos(angle));
        if (has_second) {
          const bool zero1 = UnitDouble(SampleDraw(key, zero_slot_ + j + 1)) <
                             dense_[j + 1].p_zero;
          dense[s * d + j + 1] = zero1 ? 0.0f
                                       : DenseValue(dense_[j + 1], small_log1p_,
                                                    radius * std::sin(angle));
        }
      }
    }
  }

  const SyntheticOptions options_;
  const Teacher teacher_;
  const int num_dense_;
  std::vector<ZipfSampler> zipf_;
  // Under a vocabulary, per table: Perm_t, whether its ids are reduced
  // (a static table of fewer rows) and the reduction.
  std::vector<Permutation> permutation_;
  std::vector<bool> reduce_;
  std::vector<RowReducer> reducer_;
  std::vector<int> multi_hot_;
  std::vector<bool> fixed_;  // per table: MULTI_HOT_FIXED
  std::vector<uint64_t> table_slot_;
  std::vector<DenseSpec> dense_;
  uint64_t zero_slot_ = 0;
  uint64_t normal_slot_ = 0;
  uint64_t label_slot_ = 0;
  const float* small_log1p_ = SmallCountLog1p().data();
  std::vector<uint64_t> keys_;
  std::vector<float> probability_;
  int64_t next_ = 0;
};

}  // namespace

absl::Status SyntheticOptions::Validate() const {
  if (!(zipf_alpha >= 0.0 && zipf_alpha <= 10.0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "SyntheticOptions.zipf_alpha = ", zipf_alpha, " must be in [0, 10]"));
  }
  if (num_samples < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("SyntheticOptions.num_samples = ", num_samples,
                     " must not be negative (0 = endless)"));
  }
  if (vocabulary < 0 || vocabulary > kMaxSyntheticVocabulary) {
    return absl::InvalidArgumentError(
        absl::StrCat("SyntheticOptions.vocabulary = ", vocabulary,
                     " must be in [0, 2^62]", " (0 = no vocabulary)"));
  }
  if (!(drift >= 0.0 && std::isfinite(drift))) {
    return absl::InvalidArgumentError(
        absl::StrCat("SyntheticOptions.drift = ", drift,
                     " must be finite and not negative"));
  }
  if (drift_start < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("SyntheticOptions.drift_start = ", drift_start,
                     " must not be negative"));
  }
  if (drift > 0 && vocabulary == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("SyntheticOptions.drift = ", drift,
                     " needs a vocabulary (SyntheticOptions.vocabulary > 0)"));
  }
  return absl::OkStatus();
}

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

bool SyntheticIdsAreTeacherIds(const ModelConfig& config,
                               const SyntheticOptions& options) {
  if (options.vocabulary == 0) return true;
  for (const TableConfig& table : config.tables()) {
    if (!table.dynamic() && table.rows() < options.vocabulary) return false;
  }
  return true;
}

absl::StatusOr<std::unique_ptr<BatchSource>> MakeSyntheticSource(
    const ModelConfig& config, SyntheticOptions options) {
  RETURN_IF_ERROR(options.Validate());
  if (config.num_dense_features() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_dense_features = ", config.num_dense_features(),
                     " must not be negative"));
  }
  if (config.tables_size() == 0) {
    return absl::InvalidArgumentError(
        "the config has no tables; pass a normalised ModelConfig");
  }
  for (int t = 0; t < config.tables_size(); ++t) {
    const TableConfig& table = config.tables(t);
    if (table.rows() <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tables[", t, "] (", table.name(), ").rows = ", table.rows(),
          " must be positive; pass a normalised ModelConfig"));
    }
    if (!MultiHotDistribution_IsValid(table.multi_hot_distribution())) {
      return absl::InvalidArgumentError(
          absl::StrCat("tables[", t, "] (", table.name(),
                       ").multi_hot_distribution is invalid"));
    }
    if (table.multi_hot_size() < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("tables[", t, "] (", table.name(), ").multi_hot_size = ",
                       table.multi_hot_size(), " must not be negative"));
    }
  }
  return std::unique_ptr<BatchSource>(
      std::make_unique<SyntheticSource>(config, options));
}

}  // namespace dlrm::data
