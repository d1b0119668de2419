// The bookkeeping of a cache of rows in a fixed number of slots, apart from
// where the slots live: row -> slot map, LRU or LFU order, dirty bits, and
// per batch the plan of which rows to load and which dirty rows to write
// back. RocksDbCachedStore (rocksdb_store.h) drives it over its host slots,
// CachedStore (cached_store.h) over host or device slots.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "data/batch.h"
#include "embedding/embedding_store.h"

namespace dlrm::embedding {

// What a batch needs done before its kernels run on slots.
struct SlotPlan {
  // Unique rows of the batch in first-occurrence order, and the slot each
  // one has (hits) or will have (misses) once the plan is committed.
  std::vector<int64_t> rows, slots;
  // Indices into rows / slots of the misses: rows to load into their slot.
  std::vector<int64_t> misses;
  // Dirty rows the plan evicts and the slots they hold now, sorted by row:
  // their records must be read out of the slots (and written to the
  // backing tier) before the misses are loaded.
  std::vector<int64_t> writeback_rows, writeback_slots;
  // Resident rows the plan evicts, clean or dirty.
  int64_t evictions = 0;
  // The batch with every id replaced by its row's slot.
  data::SparseFeature remapped;
};

// A fixed number of slots caching rows of one table: which row each slot
// holds, whether it changed since it was loaded, and the eviction order. A
// batch is planned (Plan: no change but the batch's hits becoming pinned)
// and then committed (Commit); rows of the last planned batch are never
// chosen as victims. Not thread-safe.
class SlotManager {
 public:
  // `capacity` slots (> 0) for a table of `rows` rows (> 0), replaced by
  // `policy`. Errors name the table by `table_index`, and a batch over
  // capacity names the cache (`cache_name`, e.g. "the row cache") and the
  // option that sizes it (`capacity_field`).
  SlotManager(int table_index, int64_t rows, int64_t capacity,
              EvictionPolicy policy, std::string cache_name,
              std::string capacity_field);

  // Plans `ids`: InvalidArgument naming the table for malformed offsets
  // (offsets[0] != 0, decreasing, or the last not ids.size()) or an id
  // outside [0, rows); ResourceExhausted when the batch has more unique
  // ids than capacity(). On error nothing changes. On success the plan is
  // plan() until the next Plan; nothing but the pinning changes until
  // Commit.
  absl::Status Plan(const data::SparseFeature& ids);
  const SlotPlan& plan() const { return plan_; }

  // Applies the last successful Plan: victims leave their slots (forgetting
  // their dirty bits), misses enter theirs clean, and every row of the
  // batch becomes the most recently used of its use count, in first
  // occurrence order. Call at most once per Plan.
  void Commit();

  // The slot holding `row`, or -1.
  int64_t SlotOf(int64_t row) const;
  // The row slot `slot` holds, or -1 when it is free.
  int64_t RowOf(int64_t slot) const { return slots_[slot].row; }
  bool IsDirty(int64_t slot) const { return slots_[slot].dirty; }
  void SetDirty(int64_t slot, bool dirty) { slots_[slot].dirty = dirty; }
  // Marks every slot of the committed plan dirty (after its update).
  void MarkBatchDirty();
  // Slots holding dirty rows, in slot order.
  std::vector<int64_t> DirtySlots() const;
  int64_t capacity() const { return static_cast<int64_t>(slots_.size()); }
  // Rows resident now.
  int64_t resident() const { return static_cast<int64_t>(slot_of_.size()); }

 private:
  struct Slot {
    // Row held, -1 when free.
    int64_t row = -1;
    bool dirty = false;
    // Batches that used the row since it became resident (LFU).
    int64_t uses = 0;
    // Number of the last Plan whose batch holds the row (never a victim of
    // that Plan).
    int64_t batch = 0;
    // Neighbours in the slot's eviction list (-1: none).
    int64_t prev = -1, next = -1;
  };
  // A doubly linked list of slots threaded through Slot::prev/next; the
  // head goes first.
  struct SlotList {
    int64_t head = -1, tail = -1;
  };

  // Eviction order: one list under LRU (least recent first), one per use
  // count under LFU (each least recent first), walked in key order.
  SlotList& ListOf(int64_t uses);
  void Unlink(int64_t slot);
  void Append(int64_t slot);
  // Up to `needed` victims in eviction order, skipping the planned batch.
  void PickVictims(int64_t needed, std::vector<int64_t>* victims) const;

  int table_index_;
  int64_t rows_;
  EvictionPolicy policy_;
  std::string cache_name_, capacity_field_;
  std::vector<Slot> slots_;
  absl::flat_hash_map<int64_t, int64_t> slot_of_;
  // Free slots; the last is taken first.
  std::vector<int64_t> free_;
  std::map<int64_t, SlotList> lists_;
  int64_t plans_ = 0;
  SlotPlan plan_;
  bool planned_ = false;
  // Plan's scratch: the victims' slots, the unique index of every id.
  std::vector<int64_t> victims_, unique_of_pos_;
  absl::flat_hash_map<int64_t, int64_t> batch_index_;
};

}  // namespace dlrm::embedding
