// CPU kernels of EmbeddingTable: hash-based initialisation, pooled lookups
// (embedding_kernels.h) and the backward pass fused with the sparse
// optimizers of optim/rules.h.
#include "embedding/embedding_table.h"

#include <omp.h>
#if defined(__linux__)
#include <sys/mman.h>
#endif

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#if defined(__AVX__)
#include <immintrin.h>
#endif

#include "core/host_device.h"
#include "core/random.h"
#include "embedding/embedding_kernels.h"
#include "embedding/row_precision.h"
#include "optim/optimizer.h"

namespace dlrm::embedding {
namespace {

// Below about this many floats touched, starting a parallel region costs
// more than it saves.
constexpr int64_t kParallelWork = int64_t{1} << 17;

// How many unique rows ahead BackwardUpdate prefetches a row's weights and
// optimizer state (and the gradient row of its first occurrence).
constexpr int64_t kUpdatePrefetchDistance = 8;

// Parallelise only big work, and never inside a region someone else opened
// (the model calls tables from an `omp parallel for` over tables).
bool UseParallel(int64_t work) {
  return work >= kParallelWork && !omp_in_parallel() &&
         omp_get_max_threads() > 1;
}

// Tables of up to this many rows (or 8 per id of the batch) deduplicate
// through a rows-long array rather than a hash table.
constexpr int64_t kDirectMapRows = int64_t{1} << 16;

// Rows whose updates BackwardUpdate interleaves.
constexpr int kRowGroup = 8;

// sums[j] for j < n <= kRowGroup: Rule's row reduction of g[j][0, dim), the
// sum from 0 in column order of RowTerm(g[j][c]) that optim::UpdateSparseRow
// computes, but kRowGroup rows' sums interleaved so that their dependent
// additions overlap (the same operations per row: the same bits). Rows past
// n repeat row 0, to keep the loop's shape fixed.
template <typename Rule>
void RowReductions(const float* const* g, int n, int dim, float* sums) {
  const float* r[kRowGroup];
  float s[kRowGroup];
  for (int j = 0; j < kRowGroup; ++j) {
    r[j] = g[j < n ? j : 0];
    s[j] = 0.0f;
  }
  int c = 0;
#if defined(__AVX__)
  // Eight columns at a time: the 8 x 8 block of the rows' columns
  // transposed, so that lane j of each vector is row j's column.
  __m256 acc = _mm256_setzero_ps();
  for (; c + 8 <= dim; c += 8) {
    __m256 t[8];
    for (int j = 0; j < 8; ++j) t[j] = _mm256_loadu_ps(r[j] + c);
    const __m256 a0 = _mm256_unpacklo_ps(t[0], t[1]);
    const __m256 a1 = _mm256_unpackhi_ps(t[0], t[1]);
    const __m256 a2 = _mm256_unpacklo_ps(t[2], t[3]);
    const __m256 a3 = _mm256_unpackhi_ps(t[2], t[3]);
    const __m256 a4 = _mm256_unpacklo_ps(t[4], t[5]);
    const __m256 a5 = _mm256_unpackhi_ps(t[4], t[5]);
    const __m256 a6 = _mm256_unpacklo_ps(t[6], t[7]);
    const __m256 a7 = _mm256_unpackhi_ps(t[6], t[7]);
    const __m256 b0 = _mm256_shuffle_ps(a0, a2, 0x44);
    const __m256 b1 = _mm256_shuffle_ps(a0, a2, 0xee);
    const __m256 b2 = _mm256_shuffle_ps(a1, a3, 0x44);
    const __m256 b3 = _mm256_shuffle_ps(a1, a3, 0xee);
    const __m256 b4 = _mm256_shuffle_ps(a4, a6, 0x44);
    const __m256 b5 = _mm256_shuffle_ps(a4, a6, 0xee);
    const __m256 b6 = _mm256_shuffle_ps(a5, a7, 0x44);
    const __m256 b7 = _mm256_shuffle_ps(a5, a7, 0xee);
    // Column c + i of rows 0..7, in column order.
    const __m256 col[8] = {_mm256_permute2f128_ps(b0, b4, 0x20),
                           _mm256_permute2f128_ps(b1, b5, 0x20),
                           _mm256_permute2f128_ps(b2, b6, 0x20),
                           _mm256_permute2f128_ps(b3, b7, 0x20),
                           _mm256_permute2f128_ps(b0, b4, 0x31),
                           _mm256_permute2f128_ps(b1, b5, 0x31),
                           _mm256_permute2f128_ps(b2, b6, 0x31),
                           _mm256_permute2f128_ps(b3, b7, 0x31)};
    for (int i = 0; i < 8; ++i) {
      // RowTerm(x) is x * x for the one row-reduction rule (Adagrad).
      static_assert(std::is_same_v<Rule, optim::Adagrad>);
      acc = _mm256_add_ps(acc, _mm256_mul_ps(col[i], col[i]));
    }
  }
  _mm256_storeu_ps(s, acc);
#endif
  for (; c < dim; ++c) {
    for (int j = 0; j < kRowGroup; ++j) {
      s[j] = RnAdd(s[j], Rule::RowTerm(r[j][c]));
    }
  }
  for (int j = 0; j < n; ++j) sums[j] = s[j];
}

// Prefetches the cache lines of p[0, n) for reading.
void PrefetchRead(const float* p, int64_t n) {
  for (int64_t c = 0; c < n; c += 16) __builtin_prefetch(p + c, 0, 3);
  if (n % 16 != 0) __builtin_prefetch(p + n - 1, 0, 3);
}

// Prefetches the cache lines of p[0, n) for writing.
template <typename T>
void PrefetchForWrite(const T* p, int64_t n) {
  constexpr int64_t kPerLine = 64 / sizeof(T);
  for (int64_t c = 0; c < n; c += kPerLine) __builtin_prefetch(p + c, 1, 3);
  if (n % kPerLine != 0) __builtin_prefetch(p + n - 1, 1, 3);
}

// Rounds the updated fp32 row w[0, dim) back into the 16-bit `out` of
// `precision`, stochastically with the bits of (row_key, col_begin + c).
void NarrowRow(RowPrecision precision, const float* w, int dim,
               uint64_t row_key, int col_begin, uint16_t* out) {
  if (precision == ROW_FP16) {
    for (int c = 0; c < dim; ++c) {
      out[c] =
          FloatToHalfStochastic(w[c], RoundingBits(row_key, col_begin + c));
    }
  } else {
    for (int c = 0; c < dim; ++c) {
      out[c] =
          FloatToBf16Stochastic(w[c], RoundingBits(row_key, col_begin + c));
    }
  }
}

// Widens the 16-bit row in[0, dim) of `precision` into out[0, dim).
void WidenRow(RowPrecision precision, const uint16_t* in, int dim, float* out) {
  if (precision == ROW_FP16) {
    for (int c = 0; c < dim; ++c) out[c] = HalfToFloat(in[c]);
  } else {
    for (int c = 0; c < dim; ++c) out[c] = Bf16ToFloat(in[c]);
  }
}

// Per-table random stream, so a row's values do not depend on its column
// count and each (row, col) hashes independently.
inline uint64_t RowKey(uint64_t seed, int table, int64_t row) {
  return HashKey(seed, static_cast<uint64_t>(static_cast<uint32_t>(table)),
                 static_cast<uint64_t>(row));
}

inline float RowValue(uint64_t row_key, int col, float bound) {
  // BitsToUnitFloat's value, converted through int32 (exact: 24 bits) because
  // AVX2 has no vector uint64 -> float conversion and this loop should
  // vectorise.
  const float u = static_cast<float>(static_cast<int32_t>(
                      Mix64(row_key + static_cast<uint64_t>(col)) >> 40)) *
                  (1.0f / 16777216.0f);
  // 2u - 1 is exact and lies in [-1, 1 - 2^-23], so the result stays below
  // `bound` after rounding.
  return (2.0f * u - 1.0f) * bound;
}

// A separate function with a restrict pointer lets GCC vectorise the hash
// (it does not inside the OpenMP-outlined loop body).
void InitRow(uint64_t row_key, int col_begin, int dim, float bound,
             float* __restrict row) {
  for (int c = 0; c < dim; ++c)
    row[c] = RowValue(row_key, col_begin + c, bound);
}

inline float InitBound(int64_t rows) {
  return static_cast<float>(1.0 / std::sqrt(static_cast<double>(rows)));
}

// Sizes `v` to n copies of `value`, asking Linux for transparent huge pages
// before anything touches the memory: random rows of a multi-GB table
// otherwise miss the TLB on nearly every lookup, and 4 KiB first-touch
// faults dominate initialisation. (Only a hint; a no-op elsewhere.) Buffers
// under one huge page could not use one anyway.
template <typename T>
void ResizeWithHugePages(AlignedVector<T>& v, size_t n, T value) {
  v.reserve(n);
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  constexpr size_t kMinBytes = size_t{2} << 20;
  constexpr uintptr_t kPage = 4096;
  const uintptr_t begin =
      (reinterpret_cast<uintptr_t>(v.data()) + kPage - 1) & ~(kPage - 1);
  const uintptr_t end =
      (reinterpret_cast<uintptr_t>(v.data() + n)) & ~(kPage - 1);
  if (n * sizeof(T) >= kMinBytes && end > begin) {
    madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
  }
#endif
  v.assign(n, value);
}

}  // namespace

float InitialValue(uint64_t seed, int table, int64_t rows, int64_t row,
                   int col) {
  return RowValue(RowKey(seed, table, row), col, InitBound(rows));
}

void InitialRow(uint64_t seed, int table, int64_t rows, int64_t row,
                int col_begin, int dim, float* out) {
  InitRow(RowKey(seed, table, row), col_begin, dim, InitBound(rows), out);
}

EmbeddingTable::EmbeddingTable(int table_index, int64_t rows, int dim,
                               Pooling pooling,
                               const OptimizerConfig& optimizer,
                               RowPrecision precision, NoInit)
    : table_index_(table_index),
      rows_(rows),
      dim_(dim),
      pooling_(pooling),
      optimizer_(optimizer),
      precision_(precision) {
  if (precision == ROW_FP32) {
    ResizeWithHugePages(weights_, static_cast<size_t>(rows) * dim, 0.0f);
  } else {
    ResizeWithHugePages(words_, static_cast<size_t>(rows) * dim, uint16_t{0});
  }
  const std::span<const optim::StateArray> arrays =
      optim::SparseState(optimizer);
  AlignedVector<float>* state[2] = {&state1_, &state2_};
  for (size_t k = 0; k < arrays.size() && k < 2; ++k) {
    state_floats_[k] = optim::FloatsPerRow(arrays[k], dim);
    ResizeWithHugePages(*state[k], static_cast<size_t>(rows) * state_floats_[k],
                        optim::InitialValue(arrays[k], optimizer));
  }
}

EmbeddingTable::EmbeddingTable(int table_index, int64_t rows, int dim,
                               Pooling pooling,
                               const OptimizerConfig& optimizer, uint64_t seed,
                               const TableSlice& slice, RowPrecision precision)
    : EmbeddingTable(table_index, rows, dim, pooling, optimizer, precision,
                     NoInit{}) {
  seed_ = seed;
  row_begin_ = slice.row_begin;
  col_begin_ = slice.col_begin;
  const float bound = InitBound(slice.table_rows > 0 ? slice.table_rows : rows);
  const int64_t row_begin = slice.row_begin;
  const int col_begin = slice.col_begin;
  if (precision == ROW_FP32) {
    float* w = weights_.data();
    // Full Kaggle vocabularies are 34M rows: initialise them in parallel.
#pragma omp parallel for schedule(static) if (UseParallel(rows * dim))
    for (int64_t r = 0; r < rows; ++r) {
      InitRow(RowKey(seed, table_index, row_begin + r), col_begin, dim, bound,
              w + r * dim);
    }
    return;
  }
  uint16_t* words = words_.data();
#pragma omp parallel if (UseParallel(rows * dim))
  {
    std::vector<float> row(dim);
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      InitRow(RowKey(seed, table_index, row_begin + r), col_begin, dim, bound,
              row.data());
      for (int c = 0; c < dim; ++c) {
        words[r * dim + c] = FloatToWord(precision, row[c]);
      }
    }
  }
}

std::unique_ptr<EmbeddingTable> EmbeddingTable::SlotArray(
    int table_index, int64_t slots, int dim, Pooling pooling,
    const OptimizerConfig& optimizer, RowPrecision precision, uint64_t seed,
    const TableSlice& slice) {
  // The constructor is private: std::make_unique cannot reach it.
  std::unique_ptr<EmbeddingTable> t(new EmbeddingTable(
      table_index, slots, dim, pooling, optimizer, precision, NoInit{}));
  if (precision != ROW_FP32) {
    t->seed_ = seed;
    t->row_begin_ = slice.row_begin;
    t->col_begin_ = slice.col_begin;
    t->slot_rows_.assign(slots, 0);
  }
  return t;
}

void EmbeddingTable::ReadRecord(int64_t row, float* record) const {
  if (precision_ == ROW_FP32) {
    std::memcpy(record, weights_.data() + row * dim_, dim_ * sizeof(float));
  } else {
    WidenRow(precision_, words_.data() + row * dim_, dim_, record);
  }
  float* out = record + dim_;
  const AlignedVector<float>* state[2] = {&state1_, &state2_};
  for (int k = 0; k < 2 && state_floats_[k] > 0; ++k) {
    const int n = state_floats_[k];
    std::memcpy(out, state[k]->data() + row * n, n * sizeof(float));
    out += n;
  }
}

void EmbeddingTable::WriteRecord(int64_t row, const float* record) {
  if (precision_ == ROW_FP32) {
    std::memcpy(weights_.data() + row * dim_, record, dim_ * sizeof(float));
  } else {
    uint16_t* w = words_.data() + row * dim_;
    for (int c = 0; c < dim_; ++c) w[c] = FloatToWord(precision_, record[c]);
  }
  const float* in = record + dim_;
  AlignedVector<float>* state[2] = {&state1_, &state2_};
  for (int k = 0; k < 2 && state_floats_[k] > 0; ++k) {
    const int n = state_floats_[k];
    std::memcpy(state[k]->data() + row * n, in, n * sizeof(float));
    in += n;
  }
}

void CopyRecords(const EmbeddingTable& src, const int64_t* src_rows,
                 EmbeddingTable& dst, const int64_t* dst_rows, int64_t n) {
  const int64_t dim = src.dim();
  const int64_t n1 = src.state_floats(0), n2 = src.state_floats(1);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t s = src_rows[i], d = dst_rows[i];
    if (src.precision() == ROW_FP32) {
      std::memcpy(dst.weights() + d * dim, src.weights() + s * dim,
                  dim * sizeof(float));
    } else {
      std::memcpy(dst.words() + d * dim, src.words() + s * dim,
                  dim * sizeof(uint16_t));
    }
    if (n1 > 0) {
      std::memcpy(dst.state1().data() + d * n1, src.state1().data() + s * n1,
                  n1 * sizeof(float));
    }
    if (n2 > 0) {
      std::memcpy(dst.state2().data() + d * n2, src.state2().data() + s * n2,
                  n2 * sizeof(float));
    }
  }
}

void EmbeddingTable::Forward(const data::SparseFeature& ids, float* out,
                             int64_t out_stride) const {
  if (precision_ == ROW_FP32) {
    PoolRows(weights_.data(), dim_, pooling_, ids, out, out_stride);
  } else {
    PoolRows16(words_.data(), precision_, dim_, pooling_, ids, out, out_stride);
  }
}

namespace {

// PoolRows' bags, in chunks on threads when the batch is big; pool_bags(b,
// e) pools bags [b, e).
template <typename PoolBagsFn>
void PoolInChunks(const data::SparseFeature& ids, int dim,
                  const PoolBagsFn& pool_bags) {
  const int64_t bags = ids.num_bags();
  const int64_t total = ids.offsets[bags];

  if (UseParallel((total + bags) * dim)) {
    // Chunks of bags, so each thread's prefetches run ahead within its own
    // stretch of ids.
    constexpr int64_t kChunk = 256;
    const int64_t chunks = (bags + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < chunks; ++i) {
      pool_bags(i * kChunk, std::min(bags, (i + 1) * kChunk));
    }
  } else {
    pool_bags(0, bags);
  }
}

// kernel(offsets, ids, bag_begin, bag_end, total, mean) over the chunks of
// the bags of `ids` (PoolInChunks).
template <typename Kernel>
void PoolEachChunk(const data::SparseFeature& ids, int dim, Pooling pooling,
                   Kernel kernel) {
  const int64_t bags = ids.num_bags();
  if (bags == 0) return;
  const int64_t* offsets = ids.offsets.data();
  const int64_t* id = ids.ids.data();
  const int64_t total = offsets[bags];
  const bool mean = pooling == POOLING_MEAN;
  PoolInChunks(ids, dim, [&](int64_t bag_begin, int64_t bag_end) {
    kernel(offsets, id, bag_begin, bag_end, total, mean);
  });
}

}  // namespace

void PoolRows(const float* weights, int dim, Pooling pooling,
              const data::SparseFeature& ids, float* out, int64_t out_stride) {
  const kernels::Isa isa = kernels::BestIsa();
  PoolEachChunk(ids, dim, pooling,
                [&](const int64_t* offsets, const int64_t* id, int64_t begin,
                    int64_t end, int64_t total, bool mean) {
                  kernels::PoolBags(isa, weights, dim, mean, offsets, id, begin,
                                    end, total, out, out_stride);
                });
}

void PoolRows16(const uint16_t* words, RowPrecision precision, int dim,
                Pooling pooling, const data::SparseFeature& ids, float* out,
                int64_t out_stride) {
  const kernels::Isa isa = kernels::BestIsa();
  PoolEachChunk(ids, dim, pooling,
                [&](const int64_t* offsets, const int64_t* id, int64_t begin,
                    int64_t end, int64_t total, bool mean) {
                  kernels::PoolBags16(isa, precision, words, dim, mean, offsets,
                                      id, begin, end, total, out, out_stride);
                });
}

int64_t EmbeddingTable::Deduplicate(const data::SparseFeature& ids) {
  const int64_t bags = ids.num_bags();
  const int64_t total = ids.offsets[bags];
  const int64_t* id = ids.ids.data();
  // Sized for the worst case (every id distinct) so the loops below never
  // check capacity.
  // unique_start_ counts each unique row's occurrences until the prefix sum
  // below, each count zeroed as its row is first seen (no pass over all).
  unique_ids_.resize(total);
  unique_start_.resize(total + 1);
  unique_of_pos_.resize(total);
  int64_t num_unique = 0;
  // A table of few rows for the batch's ids (the multi-hot ones): id ->
  // unique index through a rows-long array, kept between calls and reset
  // for the ids seen, instead of a hash table of 2 slots per id.
  const bool direct = total < std::numeric_limits<int32_t>::max() &&
                      rows_ <= std::max<int64_t>(kDirectMapRows, 8 * total);
  if (direct) {
    if (static_cast<int64_t>(unique_of_row_.size()) != rows_) {
      unique_of_row_.assign(rows_, -1);
    }
    int32_t* unique_of_row = unique_of_row_.data();
    for (int64_t p = 0; p < total; ++p) {
      const int64_t key = id[p];
      int32_t& u = unique_of_row[key];
      if (u < 0) {
        u = static_cast<int32_t>(num_unique);
        unique_start_[num_unique] = 0;
        unique_ids_[num_unique++] = key;
      }
      unique_of_pos_[p] = u;
      ++unique_start_[u];
    }
    for (int64_t k = 0; k < num_unique; ++k) {
      unique_of_row[unique_ids_[k]] = -1;
    }
  } else {
    // Load factor <= 1/2 keeps probe sequences short even when every id is
    // distinct; a power of two makes the slot a shift of a multiplicative
    // hash.
    const uint64_t capacity =
        std::bit_ceil(static_cast<uint64_t>(std::max<int64_t>(16, 2 * total)));
    const int shift = 64 - std::countr_zero(capacity);
    const uint64_t mask = capacity - 1;
    // Only the slots a call fills are freed after it, so the table is
    // cleared whole only when its size changes.
    if (hash_.size() != capacity) hash_.assign(capacity, HashSlot{-1, 0});
    used_slots_.resize(total);
    for (int64_t p = 0; p < total; ++p) {
      const int64_t key = id[p];
      uint64_t slot =
          (static_cast<uint64_t>(key) * 0x9e3779b97f4a7c15ULL) >> shift;
      while (hash_[slot].key != key && hash_[slot].key != -1) {
        slot = (slot + 1) & mask;
      }
      HashSlot& entry = hash_[slot];
      if (entry.key == -1) {
        entry.key = key;
        entry.unique = num_unique;
        used_slots_[num_unique] = slot;
        unique_start_[num_unique] = 0;
        unique_ids_[num_unique++] = key;
      }
      unique_of_pos_[p] = entry.unique;
      ++unique_start_[entry.unique];
    }
    for (int64_t k = 0; k < num_unique; ++k) hash_[used_slots_[k]].key = -1;
  }
  unique_start_[num_unique] = 0;

  // Counting sort of the occurrences by unique row. It is stable, so each
  // row's bags stay in bag order: the accumulation order is fixed by the
  // batch alone, whatever the thread count.
  int64_t sum = 0;
  for (int64_t k = 0; k <= num_unique; ++k) {
    const int64_t count = unique_start_[k];
    unique_start_[k] = sum;
    sum += count;
  }
  order_.resize(total);
  cursor_.assign(unique_start_.begin(), unique_start_.begin() + num_unique);
  for (int64_t s = 0; s < bags; ++s) {
    for (int64_t p = ids.offsets[s]; p < ids.offsets[s + 1]; ++p) {
      order_[cursor_[unique_of_pos_[p]]++] = s;
    }
  }
  return num_unique;
}

void EmbeddingTable::BackwardUpdate(const data::SparseFeature& ids,
                                    const float* grad, int64_t grad_stride) {
  const int64_t num_unique = BeginUpdate(ids, grad, grad_stride);
  if (num_unique == 0) return;
  const int64_t total = ids.offsets[ids.num_bags()];
  if (UseParallel((total + 2 * num_unique) * dim_)) {
    // Each thread owns a contiguous range of the unique rows: no row is
    // written by two threads, and no atomics.
#pragma omp parallel
    {
      const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
      UpdateRows(num_unique * t / nt, num_unique * (t + 1) / nt);
    }
  } else {
    UpdateRows(0, num_unique);
  }
}

int64_t EmbeddingTable::BeginUpdate(const data::SparseFeature& ids,
                                    const float* grad, int64_t grad_stride) {
  ++step_;
  update_ids_ = &ids;
  update_grad_ = grad;
  update_stride_ = grad_stride;
  const int64_t bags = ids.num_bags();
  return bags == 0 || ids.offsets[bags] == 0 ? 0 : Deduplicate(ids);
}

void EmbeddingTable::UpdateRows(int64_t k_begin, int64_t k_end) {
  if (k_begin >= k_end) return;
  const data::SparseFeature& ids = *update_ids_;
  const float* grad = update_grad_;
  const int64_t grad_stride = update_stride_;
  const int64_t total = ids.offsets[ids.num_bags()];

  const int dim = dim_;
  const bool mean = pooling_ == POOLING_MEAN;
  float* weights = weights_.data();
  uint16_t* words = words_.data();
  const bool narrow = precision_ != ROW_FP32;
  float* state1 = state1_.data();
  float* state2 = state2_.data();
  const int64_t floats1 = state_floats_[0], floats2 = state_floats_[1];
  const int64_t* offsets = ids.offsets.data();
  const int64_t* order = order_.data();
  const int64_t* starts = unique_start_.data();
  const int64_t* unique = unique_ids_.data();
  // A 16-bit slot array rounds by the row each slot holds.
  const int64_t* slot_rows = slot_rows_.empty() ? nullptr : slot_rows_.data();

  // kRowGroup accumulators (and a 16-bit table's widened row) of this
  // thread's own: calls on other threads update other rows at once. Rows
  // padded to whole cache lines.
  const int64_t padded_dim = (dim + 15) / 16 * 16;
  thread_local AlignedVector<float> scratch;
  if (static_cast<int64_t>(scratch.size()) < (kRowGroup + 1) * padded_dim) {
    scratch.resize((kRowGroup + 1) * padded_dim);
  }
  float* buffers = scratch.data();

  const kernels::Isa isa = kernels::BestIsa();
  // Unique row k's gradient, summed in bag order. A row seen once under sum
  // pooling (most rows of one-hot features) uses its bag's gradient row in
  // place; a row seen more often sums its occurrences' rows in registers
  // (kernels::SumRows). Under mean pooling each term is scaled first, and
  // the sum starts as 0 + the first term, like the reference's
  // zero-initialised dense gradient, without a separate zeroing pass.
  auto row_gradient = [&](int64_t k, float* __restrict buffer) {
    const int64_t first = starts[k], last = starts[k + 1];
    if (!mean) {
      if (last - first == 1) return grad + order[first] * grad_stride;
      kernels::SumRows(isa, grad, grad_stride, dim, order, first, last, total,
                       buffer);
      return static_cast<const float*>(buffer);
    }
    for (int64_t e = first; e < last; ++e) {
      // The gradient rows of occurrences a few ahead (of this row or the
      // next ones): random bags' rows.
      if (e + kUpdatePrefetchDistance < total) {
        PrefetchRead(grad + order[e + kUpdatePrefetchDistance] * grad_stride,
                     dim);
      }
      const int64_t s = order[e];
      const float* __restrict gs = grad + s * grad_stride;
      const float scale =
          1.0f / static_cast<float>(offsets[s + 1] - offsets[s]);
      if (e == first) {
        for (int c = 0; c < dim; ++c) buffer[c] = 0.0f + gs[c] * scale;
      } else {
        for (int c = 0; c < dim; ++c) buffer[c] += gs[c] * scale;
      }
    }
    return static_cast<const float*>(buffer);
  };
  // The rows a few unique rows ahead are random rows of the table: start
  // loading them (and their first gradient row) before they are needed.
  auto prefetch = [&](int64_t k) {
    const int64_t row = unique[k];
    if (narrow) {
      PrefetchForWrite(words + row * dim, dim);
    } else {
      PrefetchForWrite(weights + row * dim, dim);
    }
    if (floats1 > 0) PrefetchForWrite(state1 + row * floats1, floats1);
    if (floats2 > 0) PrefetchForWrite(state2 + row * floats2, floats2);
    PrefetchRead(grad + order[starts[k]] * grad_stride, dim);
  };

  optim::VisitElementWise(optimizer_.type(), [&](auto rule) {
    using Rule = decltype(rule);
    const typename Rule::Step step = Rule::MakeStep(optimizer_, step_);
    // kRowGroup unique rows at a time: their gradients into the group's
    // buffers, their row reductions interleaved, then each row's update.
    for (int64_t k0 = k_begin; k0 < k_end; k0 += kRowGroup) {
      const int n = static_cast<int>(std::min<int64_t>(kRowGroup, k_end - k0));
      const float* g[kRowGroup];
      for (int j = 0; j < n; ++j) {
        const int64_t k = k0 + j;
        if (k + kUpdatePrefetchDistance < k_end) {
          prefetch(k + kUpdatePrefetchDistance);
        }
        g[j] = row_gradient(k, buffers + j * padded_dim);
      }
      float sums[kRowGroup] = {};
      if constexpr (Rule::kRowReduction) {
        RowReductions<Rule>(g, n, dim, sums);
      }
      for (int j = 0; j < n; ++j) {
        const int64_t row = unique[k0 + j];
        if (!narrow) {
          optim::UpdateSparseRowWithSum<Rule>(
              step, sums[j], g[j], dim, weights + row * dim,
              state1 + row * floats1, state2 + row * floats2);
          continue;
        }
        // The rule's fp32 math on the widened row, then each element
        // rounded back stochastically by the whole table's row, column
        // and this step.
        float* w = buffers + kRowGroup * padded_dim;
        uint16_t* out = words + row * dim;
        WidenRow(precision_, out, dim, w);
        optim::UpdateSparseRowWithSum<Rule>(step, sums[j], g[j], dim, w,
                                            state1 + row * floats1,
                                            state2 + row * floats2);
        const int64_t table_row =
            row_begin_ + (slot_rows != nullptr ? slot_rows[row] : row);
        NarrowRow(precision_, w, dim,
                  RoundingRowKey(seed_, table_index_, table_row, step_),
                  col_begin_, out);
      }
    }
  });
}

}  // namespace dlrm::embedding
