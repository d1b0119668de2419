// Synthetic Criteo-shaped data: the generator that draws Zipf ids,
// Criteo-like dense features and teacher labels (the planted Teacher is in
// synthetic_teacher.cc).
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
#include "data/synthetic_internal.h"

namespace dlrm::data {
namespace {
using namespace synthetic_internal;  // NOLINT: data/'s own internals

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
