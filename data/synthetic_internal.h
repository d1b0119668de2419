// The synthetic world's shared parts (data/synthetic.h): the constants,
// the dense generator's fixed spec, the Zipf sampler, the vocabulary's
// permutation and the hashed normals that both the generator
// (synthetic.cc) and the planted teacher (synthetic_teacher.cc) use.
// Internal to data/.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numbers>
#include <utility>
#include <vector>

#include "core/random.h"
#include "dlrm/config.pb.h"

namespace dlrm::data::synthetic_internal {

// Variance budget of the teacher's logit (see the Teacher comment).
inline constexpr double kDenseVariance = 1.2;
inline constexpr double kIdVariance = 0.8;
inline constexpr double kPairVariance = 0.3;
inline constexpr double kTargetCtr = 0.25;
inline constexpr int kMaxPairs = 8;
inline constexpr int kVectorDim = 4;
// h(id) = (1 + id / kHotScale)^-1/2 for id < kEffectIds, else 0. Ids past
// kEffectIds would hold under 1% of the id variance under Zipf(1.05); giving
// them none lets the teacher be a few table lookups per sample.
inline constexpr double kHotScale = 32.0;
inline constexpr int64_t kEffectIds = 1024;

// Teacher streams (HashKey's second argument).
inline constexpr uint64_t kDenseWeightStream = 1;
inline constexpr uint64_t kPairStream = 3;
inline constexpr uint64_t kIdEffectStream = 1000;
inline constexpr uint64_t kIdVectorStream = 2000;

// Teacher parameters are stored while they take at most this many floats
// (64 MiB) over all tables, else computed per lookup.
inline constexpr int64_t kMaxStoredParameters = int64_t{1} << 24;

// Seed of the vocabulary permutations: like the dense spec, a fixed
// property of the synthetic world, so train and eval streams and every
// teacher seed share the vocabulary.
inline constexpr uint64_t kVocabularySeed = 0x70ca6b1a7e5eedULL;

// The dense generator's parameters are a fixed property of the synthetic
// world, not of any seed, so the teacher can standardise features exactly.
inline constexpr uint64_t kDenseSpecSeed = 0x5d1e7c0ffee5eedULL;

struct DenseSpec {
  double p_zero;  // probability of an exact 0
  double m;       // log-count location
  double s;       // log-count scale
};

inline DenseSpec DenseSpecFor(int j) {
  const auto unit = [j](uint64_t k) {
    return BitsToOpenUnitDouble(HashKey(kDenseSpecSeed, k, j));
  };
  return {0.05 + 0.35 * unit(0), 0.5 + 3.0 * unit(1), 0.5 + 0.7 * unit(2)};
}

// log1p of the small counts that most dense values are, so generation pays
// for one exp per value instead of exp and log1p. Same floats as computing.
inline constexpr int kSmallCounts = 4096;
inline const std::vector<float>& SmallCountLog1p() {
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
inline float DenseValue(const DenseSpec& spec, const float* small_log1p,
                        double g) {
  const double count =
      std::floor(std::exp(std::min(spec.m + spec.s * g, 40.0)));
  if (count < kSmallCounts) return small_log1p[static_cast<int>(count)];
  return static_cast<float>(std::log1p(count));
}

// Mean and standard deviation of a dense feature, by quadrature over g.
inline std::pair<double, double> DenseMoments(const DenseSpec& spec) {
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
  static inline constexpr int kCells = 16384;

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
  static inline constexpr int kRounds = 4;

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

inline double Hot(int64_t id) {
  if (id >= kEffectIds) return 0.0;
  return 1.0 / std::sqrt(1.0 + static_cast<double>(id) / kHotScale);
}

// Ids at stratified quantiles of a table's Zipf(1.05) distribution: means
// over them are the teacher's expectations over one drawn id.
inline std::vector<int64_t> QuadratureIds(int64_t rows) {
  constexpr int kPoints = 8192;
  const ZipfSampler zipf(rows, 1.05, /*lookup=*/false);
  std::vector<int64_t> ids(kPoints);
  for (int i = 0; i < kPoints; ++i) ids[i] = zipf.Id((i + 0.5) / kPoints);
  return ids;
}

// Standard normal i of a stream: Box-Muller on hashes 2 floor(i/2) and
// 2 floor(i/2) + 1, cos for even i and sin for odd i.
inline double NormalAt(uint64_t seed, uint64_t stream, uint64_t i) {
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

inline int MultiHot(const TableConfig& table) {
  return std::max(table.multi_hot_size(), 1);
}

}  // namespace dlrm::data::synthetic_internal
