// Synthetic Criteo-shaped data: Zipf-distributed ids per table and labels
// drawn from a planted teacher model, so a trained model's AUC can be set
// against the best achievable (the teacher's own AUC on the same samples).
#pragma once

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "data/source.h"
#include "dlrm/config.pb.h"

namespace dlrm::data {

struct SyntheticOptions {
  // Zipf exponent of ids within each table (rank r drawn with weight
  // r^-alpha; id = r - 1, so id 0 is the hottest). Default: 1.05.
  double zipf_alpha = 1.05;
  // Seed of the teacher model: runs sharing it share the same ground truth.
  // Default: 1.
  uint64_t teacher_seed = 1;
  // Seed of the sample stream (use different ones for train and eval).
  // Default: 2.
  uint64_t sample_seed = 2;
  // Samples before the end of data; 0 = endless. Rewind() replays the same
  // samples. Default: 0.
  int64_t num_samples = 0;
  // Distinct ids of each table's vocabulary, in [0, 2^62] (issue 33): ids
  // are drawn Zipf over ranks [1, vocabulary], mapped to [0, vocabulary) by
  // a fixed permutation and moved by `drift` (see MakeSyntheticSource), and
  // a static table with fewer rows takes them % rows. 0: no vocabulary, ids
  // are ranks - 1 in [0, rows) (id 0 the hottest). Default: 0.
  int64_t vocabulary = 0;
  // With a vocabulary: the Zipf rank positions the vocabulary moves per
  // sample, >= 0, so the hottest ids of sample n are new ones as n grows
  // and old ones fade. Needs a vocabulary when > 0. Default: 0 (none).
  double drift = 0;
  // With drift: sample n is drawn where the vocabulary stands at sample
  // drift_start + n, >= 0 (an eval stream takes the training stream's
  // length, so it scores the vocabulary where training left it). Sample n
  // stays a pure function of (sample_seed, n). Default: 0.
  int64_t drift_start = 0;

  absl::Status Validate() const;
};

// Longest vocabulary SyntheticOptions takes.
inline constexpr int64_t kMaxSyntheticVocabulary = int64_t{1} << 62;

// The planted model that labels synthetic samples: a logistic model with a
// bias, dense weights, a per-id effect for every table, and low-rank
// interactions between pairs of tables; all parameters are pure functions
// of (teacher_seed, table, id), and only the 1024 hottest ids of a table
// have any, so tables of any size cost at most 20 KiB each.
//
// Precisely, for D dense features and T tables:
//
//   logit = b + sum_j w_j (x_j - mu_j) / sd_j              (dense, var 1.2)
//             + sum_t A_t                                  (ids, var 0.8)
//             + sum_{(t,u) in P} <V_t, V_u>                (pairs, var 0.3)
//   p = sigmoid(logit); label ~ Bernoulli(p)
//
// - x_j is dense feature j as generated (log1p of a heavy-tailed count, see
//   MakeSyntheticSource); mu_j and sd_j are its exact mean and standard
//   deviation under the generator (by quadrature), so each term is
//   standardised. w = sqrt(1.2) g / |g| with g_j = N(seed, 1, j).
// - A_t pools a_t(id) over the bag of table t (sum for POOLING_SUM, mean for
//   POOLING_MEAN; an empty bag gives 0), with
//   a_t(id) = alpha_t h(id) N(seed, 1000 + t, id), h(id) = (1+id/32)^-1/2
//   for id < 1024 and 0 beyond: hot (low) ids carry the effect, so a model
//   can learn it (under Zipf(1.05) the ids past 1024 would hold under 1% of
//   the variance, and dropping them keeps the teacher to table lookups).
//   alpha_t makes Var a_t(id) = 0.8 / T for one id drawn from table t's
//   Zipf(1.05) distribution (the default alpha, whatever the stream's).
// - V_t pools v_t(id) in R^4 the same way, v_t(id)_k =
//   beta_t h(id) N(seed, 2000 + t, 4 id + k), with beta_t set so that each of
//   the |P| pair terms has variance 0.3 / |P|. P holds min(8, T(T-1)/2)
//   distinct table pairs drawn from Rng(HashKey(seed, 3, 0)).
// - b = logit(0.25) sqrt(1 + pi V / 8) - sum_t E[a_t] - sum_P <E[v_t], E[v_u]>,
//   V the total variance above (the probit approximation of E[sigmoid]) and
//   the expectations over one Zipf(1.05) id (by quadrature), which puts the
//   CTR near 0.25 whatever the seed.
// - N(seed, stream, i): the i-th standard normal of a stream, by Box-Muller
//   on HashKey(seed, stream, 2 floor(i/2)) and HashKey(..., 2 floor(i/2)+1)
//   (cos for even i, sin for odd i). Parameters are rounded to float.
//
// With the "kaggle" preset this gives a CTR near 0.25 and a teacher AUC
// (its own probabilities scored on its own labels) near 0.8: the ceiling a
// trained model can approach.
//
// Under a vocabulary V > 0 (SyntheticOptions.vocabulary) every id of
// [0, V) of every table has an effect, the same for every id:
// a_t(id) = alpha_t N(seed, 1000 + t, id) and v_t(id)_k =
// beta_t N(seed, 2000 + t, 4 id + k), with alpha_t^2 = 0.8 / T and beta_t
// set as above (h = 1), and ids outside [0, V) add 0; the pairs and the
// dense terms are as above, and b = logit(0.25) sqrt(1 + pi V / 8) (the
// id effects have mean 0 over seeds). The hot ids, seen often, are what a
// model can learn. Parameters are stored (as without a vocabulary) while
// all tables' take at most 64 MiB, else computed for each lookup.
// Thread-safe after construction.
class Teacher {
 public:
  // `vocabulary` 0: the teacher above for ids in [0, rows); > 0: the
  // teacher of a vocabulary of that many ids per table.
  Teacher(const ModelConfig& config, uint64_t teacher_seed,
          int64_t vocabulary = 0);

  // Click probability of each sample of `batch` (batch.size values; the
  // batch must pass Validate). Reads only the dense features and tables the
  // batch and the config share.
  void Probabilities(const Batch& batch, float* out) const;

 private:
  // Per-table parameters: a_t and v_t of the ids that have any.
  struct Table {
    double alpha = 0;      // scale of a_t
    double beta = 0;       // scale of v_t; 0 when the table is in no pair
    std::vector<float> a;  // a_t(id), id < min(rows, 1024) (or < V under
                           // a vocabulary), then a 0; empty when computed
    std::vector<float> v;  // v_t(id), 4 per id, then 4 zeros; empty if
                           // the table is in no pair or when computed
    bool in_pair = false;
    // > 0: a and v are not stored; ids in [0, computed_ids) have theirs
    // computed from these streams of the teacher's seed.
    int64_t computed_ids = 0;
    uint64_t seed = 0;
    uint64_t a_stream = 0;
    uint64_t v_stream = 0;
  };

  // a_t(id) and v_t(id) (4 floats) computed from the table's streams.
  static float EffectOf(const Table& table, int64_t id);
  static void VectorOf(const Table& table, int64_t id, float* v);

  // a_t (v_t) pooled over bag s of `f`; ids without parameters add 0, and
  // an empty bag gives 0.
  static double PoolEffect(const Table& table, bool mean,
                           const SparseFeature& f, int64_t s);
  static void PoolVector(const Table& table, bool mean, const SparseFeature& f,
                         int64_t s, double* v);

  std::vector<int> pooling_mean_;     // per table: 1 = mean pooling
  std::vector<double> dense_weight_;  // w_j / sd_j
  std::vector<double> dense_mean_;    // mu_j
  std::vector<Table> tables_;
  std::vector<std::pair<int, int>> pairs_;
  double bias_ = 0;
  uint64_t seed_;
  int num_dense_;
};

// An endless (or num_samples long) synthetic stream for `config` (a
// normalised ModelConfig: tables, rows, multi_hot_size,
// multi_hot_distribution, pooling).
// Sample i is a pure function of (sample_seed, i): its random numbers are
// the outputs of Rng(HashKey(sample_seed, 0, i)), each feature at fixed
// positions of that stream (so batch boundaries never change a sample):
// - for each table, a bag of 1..multi_hot_size ids (exactly 1 when
//   multi_hot_size is 1, else a uniform length; exactly multi_hot_size
//   under MULTI_HOT_FIXED, whose first ids are the uniform bag's); each
//   id = floor(r) - 1 with rank r from the inverse CDF of the continuous
//   power law r^-zipf_alpha on [1, rows + 1), so id 0 is the hottest;
// - dense feature j is 0 with a fixed probability in [0.05, 0.4], else
//   log1p(floor(exp(m_j + s_j g))), g standard normal (Box-Muller, features
//   2p and 2p+1 sharing a pair), m_j in [0.5, 3.5] and s_j in [0.5, 1.2]
//   fixed per feature: values mostly in [0, 10], like Criteo's after its
//   transform;
// - the label is Bernoulli(p) with p from Teacher(config, teacher_seed,
//   vocabulary), of the ids before any reduction below.
// Under a vocabulary V > 0 the ranks r are drawn the same way over
// [1, V + 1), and the id of rank r in sample n is
//   Perm_t((r - 1 - floor((drift_start + n) drift)) mod V),
// Perm_t a fixed bijection of [0, V) per table (a 4-round Feistel network
// on the even bit width that holds V, cycle-walked into [0, V); the same
// for every seed), so hot ids are not contiguous, and as n grows ids that
// were the coldest become the hottest while the hot ones fade. A static
// table of rows < V then takes id % rows (today's modulo); a dynamic table
// (TableConfig.dynamic) or one of rows >= V takes the id as it is.
// Generates over 1M kaggle-shaped samples/s on one core without a
// vocabulary. InvalidArgument for bad options, a config without tables, a
// table without rows or with an invalid multi_hot_distribution.
absl::StatusOr<std::unique_ptr<BatchSource>> MakeSyntheticSource(
    const ModelConfig& config, SyntheticOptions options);

// Whether the ids of MakeSyntheticSource(config, options)'s batches are the
// ids their labels were drawn from, so that Teacher(config,
// options.teacher_seed, options.vocabulary) scores a batch with the
// probabilities it was drawn with: false when a vocabulary is reduced
// modulo a static table's rows.
bool SyntheticIdsAreTeacherIds(const ModelConfig& config,
                               const SyntheticOptions& options);

}  // namespace dlrm::data
