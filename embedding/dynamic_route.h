// Which row-wise shard of a dynamic table (docs/dynamic.md) takes a raw id:
// the input dist (model/exchange.cc) sends each id of a row-wise dynamic
// table to the shard this names, unchanged, and that shard's id map gives
// it one of its rows. A fixed hash of the id alone (salted, so not the one
// that picks the id's bucket inside the shard): every rank routes an id
// alike, and a restore on another rank count routes it again.
#pragma once

#include <cstdint>

#include "core/random.h"
#include "embedding/sharding_plan.h"

namespace dlrm::embedding {

// The shard, in [0, shards), of raw id `id` among a dynamic table's
// `shards` row-wise shards (shards > 0): the hash's share of [0, 2^64)
// scaled to the shard count.
inline int DynamicRowShard(int64_t id, int shards) {
  const uint64_t h = Mix64(static_cast<uint64_t>(id) ^ 0x5bd1e9955bd1e995ull);
  return static_cast<int>(
      (static_cast<unsigned __int128>(h) * static_cast<uint64_t>(shards)) >>
      64);
}

// Whether shard `index` of `placement` takes id `id` of a bag, and as
// which id: a row-wise shard takes the ids in its rows, as shard rows (id
// - row_begin), or, for a dynamic table (`dynamic`), the raw ids
// DynamicRowShard gives it, unchanged; any other shard takes every id
// unchanged. Returns the id the shard takes, or -1.
inline int64_t ShardTakes(const TablePlacement& placement, int index,
                          bool dynamic, int64_t id) {
  if (placement.kind != SHARDING_ROW_WISE) return id;
  if (dynamic) {
    const int shards = static_cast<int>(placement.shards.size());
    return DynamicRowShard(id, shards) == index ? id : -1;
  }
  const Shard& s = placement.shards[index];
  return id >= s.row_begin && id < s.row_begin + s.row_count ? id - s.row_begin
                                                             : -1;
}

}  // namespace dlrm::embedding
