// EmbeddingBag tables on the CPU: pooled lookups (sum or mean over a
// multi-hot bag) and a backward pass fused with the sparse optimizer, which
// deduplicates ids, accumulates each touched row's gradient and updates only
// those rows. No dense gradient of a table ever exists.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/aligned.h"
#include "data/batch.h"
#include "dlrm/config.pb.h"

namespace dlrm::embedding {

// Initial value of element `col` of row `row` of table `table`: uniform in
// [-1/sqrt(rows), 1/sqrt(rows)) (the DLRM reference's range), a pure
// function of its arguments so any tier or rank can regenerate it.
float InitialValue(uint64_t seed, int table, int64_t rows, int64_t row,
                   int col);

// Writes InitialValue(seed, table, rows, row, col_begin + c) for c in
// [0, dim) into out[0, dim): a row (or a shard's columns of it) at once.
void InitialRow(uint64_t seed, int table, int64_t rows, int64_t row,
                int col_begin, int dim, float* out);

// Where an EmbeddingTable sits inside a bigger table when it holds a shard.
struct TableSlice {
  // Rows of the whole table (sets the initial values' range); 0 means the
  // slice is the whole table. Default: 0.
  int64_t table_rows = 0;
  // First row and first column of the slice in the whole table. Default: 0.
  int64_t row_begin = 0;
  int col_begin = 0;
};

// One table (or one shard of a table) with its optimizer state, in host
// memory. Its weights are fp32, or 16-bit words (IEEE half or bfloat16,
// RowPrecision) that Forward widens to fp32 and BackwardUpdate updates in
// fp32 and rounds back stochastically (row_precision.h); optimizer state is
// fp32 either way. Forward is const and may run concurrently with other
// Forwards; BackwardUpdate needs exclusive access, as does BeginUpdate
// (UpdateRows for disjoint ranges may run at once).
class EmbeddingTable {
 public:
  // `optimizer` must be normalised and valid for tables
  // (optim::ValidateSparse: not LAMB or LARS); ADAGRAD means row-wise
  // Adagrad here. Holds `rows` x `dim` elements: the whole
  // table, or the block of it that `slice` places, initialised with the whole
  // table's InitialValue (rounded to nearest in a 16-bit `precision`) so a
  // shard starts (and trains) exactly like the same rows and columns of an
  // unsharded table: a 16-bit table's updates round with the whole table's
  // row and column (RoundingRowKey under `seed`).
  EmbeddingTable(int table_index, int64_t rows, int dim, Pooling pooling,
                 const OptimizerConfig& optimizer, uint64_t seed,
                 const TableSlice& slice = {},
                 RowPrecision precision = ROW_FP32);

  // A table of `slots` rows for a storage tier to fill (embedding_store.h):
  // weights zero, optimizer state at its initial value, no InitialValue
  // pass. Its kernels then take slot indices instead of row ids. A 16-bit
  // `precision` keeps 16-bit words and rounds each update as the table (or
  // the shard `slice` places) of `seed` would round the row the slot holds
  // (set_slot_row): so a cached tier trains bitwise like the host tier.
  static std::unique_ptr<EmbeddingTable> SlotArray(
      int table_index, int64_t slots, int dim, Pooling pooling,
      const OptimizerConfig& optimizer, RowPrecision precision = ROW_FP32,
      uint64_t seed = 0, const TableSlice& slice = {});

  // Of a 16-bit slot array: slot `slot` now holds row `row` of its table
  // (or shard; row_begin of the slice is added), which its updates round
  // with. A no-op on an fp32 table or one that is not a slot array.
  void set_slot_row(int64_t slot, int64_t row) {
    if (!slot_rows_.empty()) slot_rows_[slot] = row;
  }

  // Pools each bag of `ids` (ids must be in [0, rows)) into row s of `out`
  // (at out + s * out_stride); an empty bag gives zeros.
  void Forward(const data::SparseFeature& ids, float* out,
               int64_t out_stride) const;

  // grad row s (at grad + s * grad_stride) is the loss gradient wrt bag s's
  // pooled output. Applies one optimizer step to every row that occurs in
  // `ids`, with that row's summed gradient.
  void BackwardUpdate(const data::SparseFeature& ids, const float* grad,
                      int64_t grad_stride);

  // BackwardUpdate in pieces, for callers that spread one table's update
  // over threads. BeginUpdate counts the step, deduplicates `ids` and
  // returns u, the number of distinct rows in it; UpdateRows(begin, end)
  // then updates distinct rows [begin, end) of that batch (0 <= begin <= end
  // <= u) with their summed gradients. Calls for disjoint ranges may run at
  // once on different threads: each writes only its own rows, and a row's
  // gradient is summed in bag order whatever the ranges. Once ranges
  // covering [0, u) have run once each, the table holds the bits
  // BackwardUpdate(ids, grad, grad_stride) gives. `ids` and `grad` must stay
  // valid and unchanged until the last UpdateRows; no other call on the
  // table in between.
  int64_t BeginUpdate(const data::SparseFeature& ids, const float* grad,
                      int64_t grad_stride);
  void UpdateRows(int64_t begin, int64_t end);

  int table_index() const { return table_index_; }
  int64_t rows() const { return rows_; }
  int dim() const { return dim_; }
  Pooling pooling() const { return pooling_; }
  const OptimizerConfig& optimizer() const { return optimizer_; }
  // Replaces the optimizer's constants (rate, schedule, eps, ...) from the
  // next BackwardUpdate on; `optimizer` must have optimizer()'s type, so
  // the state arrays keep their meaning (EmbeddingStore::SetOptimizer
  // checks).
  void set_optimizer(const OptimizerConfig& optimizer) {
    optimizer_ = optimizer;
  }
  // Precision of the weights: ROW_FP32 (weights()) or 16-bit (words()).
  RowPrecision precision() const { return precision_; }
  // rows x dim fp32 weights, row-major; null for a 16-bit table (its
  // weights are words()). This array and the state arrays are sized once,
  // at construction, and never reallocated (a device cache pins and maps
  // them: cuda::DeviceSlots::MapHostTable); callers must not resize them.
  float* weights() { return weights_.empty() ? nullptr : weights_.data(); }
  const float* weights() const {
    return weights_.empty() ? nullptr : weights_.data();
  }
  // rows x dim 16-bit words of precision(), row-major; null for an fp32
  // table.
  uint16_t* words() { return words_.empty() ? nullptr : words_.data(); }
  const uint16_t* words() const {
    return words_.empty() ? nullptr : words_.data();
  }
  // Optimizer state, laid out as optim::SparseState(optimizer()) says:
  // state1 and state2 hold its arrays in order, rows x FloatsPerRow each
  // (row-wise Adagrad: one float per row in state1; Adam: rows x dim
  // moments in state1 and state2); an array the optimizer lacks is empty.
  AlignedVector<float>& state1() { return state1_; }
  AlignedVector<float>& state2() { return state2_; }
  const AlignedVector<float>& state1() const { return state1_; }
  const AlignedVector<float>& state2() const { return state2_; }
  // Floats per row of state1 (k = 0) or state2 (k = 1); 0 where the
  // optimizer lacks that array.
  int state_floats(int k) const { return state_floats_[k]; }
  // Copies row `row`'s record into `record`: its dim weights (as floats: a
  // 16-bit table's exact values), then its state arrays in order (dim +
  // optim::SparseStateFloatsPerRow floats in all). The layout the storage
  // tiers keep rows in. `row` must be in [0, rows).
  void ReadRecord(int64_t row, float* record) const;
  // Sets row `row` from a record laid out as ReadRecord writes it (a
  // 16-bit table rounds the weights to nearest: exact for values
  // ReadRecord of a table of its precision wrote).
  void WriteRecord(int64_t row, const float* record);
  // Updates applied so far (Adam's bias correction uses it).
  int64_t step() const { return step_; }
  void set_step(int64_t step) { step_ = step; }

 private:
  struct NoInit {};
  // Allocates the arrays; initialises optimizer state but not weights.
  EmbeddingTable(int table_index, int64_t rows, int dim, Pooling pooling,
                 const OptimizerConfig& optimizer, RowPrecision precision,
                 NoInit);

  int table_index_;
  int64_t rows_;
  int dim_;
  Pooling pooling_;
  OptimizerConfig optimizer_;
  RowPrecision precision_ = ROW_FP32;
  // The stochastic rounding's seed and where the table sits in the whole
  // table (16-bit tables round with the whole table's rows and columns).
  uint64_t seed_ = 0;
  int64_t row_begin_ = 0;
  int col_begin_ = 0;
  AlignedVector<float> weights_, state1_, state2_;
  // The weights of a 16-bit table (weights_ is empty then).
  AlignedVector<uint16_t> words_;
  // Of a 16-bit slot array: the row of the table each slot holds
  // (set_slot_row), which its updates round with; empty otherwise (row r
  // rounds as row r). Bookkeeping like the cache's slot map, not counted in
  // TableBytes.
  std::vector<int64_t> slot_rows_;
  // Floats per row of state1_ and state2_ (0 where the array is unused).
  int state_floats_[2] = {0, 0};
  int64_t step_ = 0;
  // The batch of the last BeginUpdate (UpdateRows' input).
  const data::SparseFeature* update_ids_ = nullptr;
  const float* update_grad_ = nullptr;
  int64_t update_stride_ = 0;
  // Scratch for BackwardUpdate, kept to avoid reallocating every step.
  // order_: the bag of every id occurrence, grouped by unique row and in bag
  // order within a row (the fixed accumulation order that makes updates
  // deterministic). (UpdateRows' accumulators are per thread, in
  // embedding_table.cc.)
  std::vector<int64_t> order_;
  // Open-addressing id -> unique index map used to deduplicate the batch;
  // key -1 marks a free slot, and every slot is free between calls
  // (used_slots_: the slots a call filled, freed at its end).
  struct HashSlot {
    int64_t key;
    int64_t unique;
  };
  std::vector<HashSlot> hash_;
  std::vector<uint64_t> used_slots_;
  // Instead of hash_ for a table of few rows for its batch: the unique index
  // of each row, -1 for rows not in the batch (reset after each call).
  std::vector<int32_t> unique_of_row_;
  // unique_ids_[k]: the id of unique row k; its occurrences are
  // order_[unique_start_[k] .. unique_start_[k + 1]).
  std::vector<int64_t> unique_ids_, unique_start_;
  // Unique index of every id occurrence, and the counting sort's cursors.
  std::vector<int64_t> unique_of_pos_, cursor_;

  // Fills unique_ids_, unique_start_ and order_ for `ids`; returns the
  // number of unique rows.
  int64_t Deduplicate(const data::SparseFeature& ids);
};

// EmbeddingTable::Forward's kernel over any rows x dim weight array (ids
// index its rows, and must be in range): each bag of `ids` pooled into
// out + s * out_stride, bitwise as reference::PoolForward. For tiers that
// gather rows into a buffer of their own before pooling.
void PoolRows(const float* weights, int dim, Pooling pooling,
              const data::SparseFeature& ids, float* out, int64_t out_stride);

// PoolRows over a rows x dim array of 16-bit words of `precision` (ROW_FP16
// or ROW_BF16): bitwise reference::PoolForward on the words widened to
// floats.
void PoolRows16(const uint16_t* words, RowPrecision precision, int dim,
                Pooling pooling, const data::SparseFeature& ids, float* out,
                int64_t out_stride);

// Copies whole rows (weights and optimizer state) of `src` into rows of
// `dst`, a table of the same dim, optimizer and precision: row src_rows[i] of
// `src` into row dst_rows[i] of `dst` for i in [0, n), dst_rows distinct; every
// row must be in range. HostSlots' direct path (cached_store.h), and the
// CPU reference of the device's record kernels
// (cuda/embedding_kernels.h LoadRecords / StoreRecords).
void CopyRecords(const EmbeddingTable& src, const int64_t* src_rows,
                 EmbeddingTable& dst, const int64_t* dst_rows, int64_t n);

// Plain loops: the references the optimized kernels are tested against.
namespace reference {

// Pooled lookup from a rows x dim weight array.
void PoolForward(const float* weights, int dim, Pooling pooling,
                 const data::SparseFeature& ids, float* out,
                 int64_t out_stride);

// Materialises the dense gradient of the whole table (rows x dim) and the
// set of touched rows, then applies `optimizer`'s rule (normalised, valid;
// optim::UpdateSparseRow) to each touched row in place. state1/state2 as
// EmbeddingTable; `step` is the step number after this update (1 for the
// first).
void DenseGradientUpdate(float* weights, float* state1, float* state2,
                         int64_t rows, int dim, Pooling pooling,
                         const OptimizerConfig& optimizer, int64_t step,
                         const data::SparseFeature& ids, const float* grad,
                         int64_t grad_stride);

// A 16-bit table's update (EmbeddingTable::BackwardUpdate) done plainly:
// `words` (rows x dim of `precision`) widened to floats, DenseGradientUpdate
// on them, then each touched row's element (r, c) rounded back with
// FloatToWordStochastic and RoundingBits(RoundingRowKey(seed, table,
// row_begin + r, step), col_begin + c); untouched rows keep their words.
void DenseGradientUpdate16(uint16_t* words, RowPrecision precision,
                           float* state1, float* state2, int64_t rows, int dim,
                           Pooling pooling, const OptimizerConfig& optimizer,
                           int64_t step, const data::SparseFeature& ids,
                           const float* grad, int64_t grad_stride,
                           uint64_t seed, int table, int64_t row_begin,
                           int col_begin);

}  // namespace reference

}  // namespace dlrm::embedding
