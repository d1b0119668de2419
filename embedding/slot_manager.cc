// SlotManager: planning a batch over the slots, and the eviction lists.
#include "embedding/slot_manager.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace dlrm::embedding {

SlotManager::SlotManager(int table_index, int64_t rows, int64_t capacity,
                         EvictionPolicy policy, std::string cache_name,
                         std::string capacity_field)
    : table_index_(table_index),
      rows_(rows),
      policy_(policy),
      cache_name_(std::move(cache_name)),
      capacity_field_(std::move(capacity_field)),
      slots_(static_cast<size_t>(capacity)) {
  free_.reserve(capacity);
  // Slot 0 is taken first.
  for (int64_t s = capacity - 1; s >= 0; --s) free_.push_back(s);
}

int64_t SlotManager::SlotOf(int64_t row) const {
  const auto it = slot_of_.find(row);
  return it == slot_of_.end() ? -1 : it->second;
}

SlotManager::SlotList& SlotManager::ListOf(int64_t uses) {
  return lists_[policy_ == EvictionPolicy::kLfu ? uses : 0];
}

void SlotManager::Unlink(int64_t slot) {
  Slot& info = slots_[slot];
  const int64_t key = policy_ == EvictionPolicy::kLfu ? info.uses : 0;
  const auto it = lists_.find(key);
  SlotList& list = it->second;
  if (info.prev >= 0) {
    slots_[info.prev].next = info.next;
  } else {
    list.head = info.next;
  }
  if (info.next >= 0) {
    slots_[info.next].prev = info.prev;
  } else {
    list.tail = info.prev;
  }
  info.prev = info.next = -1;
  // Empty use-count lists go, so the victim walk never visits them.
  if (list.head < 0 && key != 0) lists_.erase(it);
}

void SlotManager::Append(int64_t slot) {
  Slot& info = slots_[slot];
  SlotList& list = ListOf(info.uses);
  info.prev = list.tail;
  info.next = -1;
  if (list.tail >= 0) {
    slots_[list.tail].next = slot;
  } else {
    list.head = slot;
  }
  list.tail = slot;
}

void SlotManager::PickVictims(int64_t needed,
                              std::vector<int64_t>* victims) const {
  victims->clear();
  if (needed <= 0) return;
  for (const auto& [uses, list] : lists_) {
    for (int64_t slot = list.head;
         slot >= 0 && static_cast<int64_t>(victims->size()) < needed;
         slot = slots_[slot].next) {
      if (slots_[slot].batch != plans_) victims->push_back(slot);
    }
    if (static_cast<int64_t>(victims->size()) >= needed) return;
  }
}

absl::Status SlotManager::Plan(const data::SparseFeature& ids) {
  planned_ = false;
  const int64_t n = static_cast<int64_t>(ids.ids.size());
  RETURN_IF_ERROR(CheckBagOffsets(table_index_, ids));
  // Unique rows in first-occurrence order.
  batch_index_.clear();
  plan_.rows.clear();
  unique_of_pos_.resize(n);
  for (int64_t p = 0; p < n; ++p) {
    const int64_t row = ids.ids[p];
    if (row < 0 || row >= rows_) {
      return absl::InvalidArgumentError(
          absl::StrCat("table ", table_index_, ": id ", row, " at position ", p,
                       " outside [0, ", rows_, ")"));
    }
    const auto [it, inserted] =
        batch_index_.try_emplace(row, static_cast<int64_t>(plan_.rows.size()));
    if (inserted) plan_.rows.push_back(row);
    unique_of_pos_[p] = it->second;
  }
  const int64_t unique = static_cast<int64_t>(plan_.rows.size());
  if (unique > capacity()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "table ", table_index_, ": batch has ", unique, " unique ids but ",
        cache_name_, " holds ", capacity(), " rows (", capacity_field_,
        "); use smaller batches or a bigger cache"));
  }

  // Hits keep their slot and are pinned (no victims of this plan); misses
  // take free slots (the last first), then victims' slots.
  ++plans_;
  plan_.slots.assign(unique, -1);
  plan_.misses.clear();
  for (int64_t k = 0; k < unique; ++k) {
    const auto it = slot_of_.find(plan_.rows[k]);
    if (it != slot_of_.end()) {
      plan_.slots[k] = it->second;
      slots_[it->second].batch = plans_;
    } else {
      plan_.misses.push_back(k);
    }
  }
  const int64_t misses = static_cast<int64_t>(plan_.misses.size());
  const int64_t from_free =
      std::min(misses, static_cast<int64_t>(free_.size()));
  PickVictims(misses - from_free, &victims_);
  for (int64_t i = 0; i < misses; ++i) {
    plan_.slots[plan_.misses[i]] =
        i < from_free ? free_[free_.size() - 1 - i] : victims_[i - from_free];
  }
  plan_.evictions = static_cast<int64_t>(victims_.size());
  std::vector<std::pair<int64_t, int64_t>> writeback;
  for (const int64_t slot : victims_) {
    if (slots_[slot].dirty) writeback.emplace_back(slots_[slot].row, slot);
  }
  std::sort(writeback.begin(), writeback.end());
  plan_.writeback_rows.resize(writeback.size());
  plan_.writeback_slots.resize(writeback.size());
  for (size_t i = 0; i < writeback.size(); ++i) {
    plan_.writeback_rows[i] = writeback[i].first;
    plan_.writeback_slots[i] = writeback[i].second;
  }
  plan_.remapped.offsets = ids.offsets;
  plan_.remapped.ids.resize(n);
  for (int64_t p = 0; p < n; ++p) {
    plan_.remapped.ids[p] = plan_.slots[unique_of_pos_[p]];
  }
  planned_ = true;
  return absl::OkStatus();
}

void SlotManager::Commit() {
  if (!planned_) return;
  planned_ = false;
  for (const int64_t slot : victims_) {
    Unlink(slot);
    slot_of_.erase(slots_[slot].row);
    slots_[slot] = Slot{};
  }
  const int64_t from_free = static_cast<int64_t>(plan_.misses.size()) -
                            static_cast<int64_t>(victims_.size());
  free_.resize(free_.size() - from_free);
  for (const int64_t k : plan_.misses) {
    const int64_t slot = plan_.slots[k];
    Slot& info = slots_[slot];
    info = Slot{};
    info.row = plan_.rows[k];
    info.batch = plans_;
    slot_of_.emplace(info.row, slot);
  }
  // Every row of the batch becomes the most recent of its use count.
  for (const int64_t slot : plan_.slots) {
    Slot& info = slots_[slot];
    if (info.uses > 0) Unlink(slot);
    ++info.uses;
    Append(slot);
  }
}

void SlotManager::MarkBatchDirty() {
  for (const int64_t slot : plan_.slots) slots_[slot].dirty = true;
}

std::vector<int64_t> SlotManager::DirtySlots() const {
  std::vector<int64_t> dirty;
  for (int64_t s = 0; s < capacity(); ++s) {
    if (slots_[s].dirty) dirty.push_back(s);
  }
  return dirty;
}

}  // namespace dlrm::embedding
