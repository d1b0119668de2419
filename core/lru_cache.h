// A map of at most `capacity` entries that drops the least recently used
// one to make room: the CUDA backend's cuBLASLt plans (dense/cuda), one per
// GEMM shape, where a server answering many batch sizes would otherwise
// outgrow any fixed set. Needs no CUDA. Not thread-safe.
#pragma once

#include <cstddef>
#include <iterator>
#include <list>
#include <map>
#include <utility>

namespace dlrm {

template <typename Key, typename Value>
class LruCache {
 public:
  // `capacity` >= 1.
  explicit LruCache(size_t capacity) : capacity_(capacity < 1 ? 1 : capacity) {}

  LruCache(const LruCache&) = delete;
  LruCache& operator=(const LruCache&) = delete;

  // The value of `key`, which becomes the most recently used; null when
  // absent. The pointer is valid until the entry is dropped (an Insert of
  // capacity() other keys).
  Value* Find(const Key& key) {
    auto it = index_.find(key);
    if (it == index_.end()) return nullptr;
    order_.splice(order_.begin(), order_, it->second);
    return &it->second->second;
  }

  // Sets `key` to `value` as the most recently used entry, first dropping
  // the least recently used one when the cache is full and `key` is new.
  // Returns the stored value.
  Value& Insert(const Key& key, Value value) {
    if (Value* v = Find(key)) {
      *v = std::move(value);
      return *v;
    }
    if (order_.size() >= capacity_) {
      index_.erase(order_.back().first);
      order_.pop_back();
      ++evictions_;
    }
    order_.emplace_front(key, std::move(value));
    index_.emplace(key, order_.begin());
    return order_.front().second;
  }

  size_t size() const { return order_.size(); }
  size_t capacity() const { return capacity_; }
  // Entries dropped to make room so far.
  size_t evictions() const { return evictions_; }

 private:
  using Entry = std::pair<Key, Value>;

  size_t capacity_;
  size_t evictions_ = 0;
  // Most recently used first.
  std::list<Entry> order_;
  std::map<Key, typename std::list<Entry>::iterator> index_;
};

}  // namespace dlrm
