// Reading a model's tables whole, on every rank together: GatherTable,
// GatherTableIds and WeightChecksum (for tests, checkpoints and export).
#include <algorithm>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/random.h"
#include "core/status.h"
#include "embedding/dynamic_store.h"
#include "model/model.h"

namespace dlrm::model {
namespace {

// GatherTableIds' all-reduce: each row's entry comes from the one shard
// that holds it, the other ranks add 0. Entries are the id (or mark) plus
// kIdBias, taken modulo 2^64, so that no real entry is 0 and the largest
// id does not overflow (an int64 sum of one non-zero term is exact).
constexpr uint64_t kIdBias = 3;
static_assert(kFreeRowId + static_cast<int64_t>(kIdBias) > 0 &&
              kKeptRowId + static_cast<int64_t>(kIdBias) > 0);

int64_t EncodeId(int64_t id) {
  return static_cast<int64_t>(static_cast<uint64_t>(id) + kIdBias);
}
int64_t DecodeId(int64_t entry) {
  return static_cast<int64_t>(static_cast<uint64_t>(entry) - kIdBias);
}

}  // namespace

absl::StatusOr<uint64_t> Model::WeightChecksum() {
  uint64_t h = 0;
  auto add = [&h](const float* p, int64_t count) {
    for (int64_t i = 0; i < count; ++i) {
      uint32_t bits;
      std::memcpy(&bits, p + i, sizeof(bits));
      h = Mix64(h ^ bits);
    }
  };
  for (const dense::ParamRef& p : dense_params()) add(p.value, p.size);
  std::vector<float> table;
  for (int k = 0; k < config_.tables_size(); ++k) {
    RETURN_IF_ERROR(GatherTable(k, &table));
    add(table.data(), static_cast<int64_t>(table.size()));
  }
  return h;
}

absl::Status Model::GatherTable(int k, std::vector<float>* table) {
  const TableConfig& t = config_.tables(k);
  const int dim = t.dim();
  table->assign(static_cast<size_t>(t.rows()) * dim, 0.0f);
  std::vector<float> record;
  // Every other rank contributes zeros: the sum is exact. A replica is
  // whole on every rank: no exchange.
  absl::Status local;
  for (LocalShard& ls : local_) {
    if (ls.table != k) continue;
    const embedding::Shard& s = plan_.tables[k].shards[ls.shard];
    // fp32 rows in place; 16-bit ones widened through the store below.
    if (ls.host != nullptr && ls.host->precision() == ROW_FP32) {
      const float* w = ls.host->weights();
      for (int64_t r = 0; r < s.row_count; ++r) {
        std::memcpy(table->data() + (s.row_begin + r) * dim + s.col_begin,
                    w + r * s.col_count, sizeof(float) * s.col_count);
      }
      continue;
    }
    // Through the store (RocksDB, device memory), a chunk of rows a call.
    const embedding::TableSpec& spec = ls.store->spec();
    const int64_t floats =
        spec.dim + embedding::StateFloatsPerRow(spec.optimizer, spec.dim);
    constexpr int64_t kChunkRows = 4096;
    for (int64_t begin = 0; begin < s.row_count && local.ok();
         begin += kChunkRows) {
      const int64_t count = std::min(kChunkRows, s.row_count - begin);
      record.resize(count * floats);
      local = ls.store->ReadRows(begin, count, record.data());
      for (int64_t r = 0; r < count && local.ok(); ++r) {
        std::memcpy(
            table->data() + (s.row_begin + begin + r) * dim + s.col_begin,
            record.data() + r * floats, sizeof(float) * s.col_count);
      }
    }
  }
  if (replica_[k] >= 0) return local;
  RETURN_IF_ERROR(comm_->AllReduceSum(table->data(),
                                      static_cast<int64_t>(table->size()),
                                      comm::DataType::kFloat32));
  return local;
}

absl::Status Model::GatherTableIds(int k, std::vector<int64_t>* ids) {
  const TableConfig& t = config_.tables(k);
  if (!t.dynamic()) {
    return absl::FailedPreconditionError(
        absl::StrCat("table ", t.name(), " is not dynamic: its ids are rows"));
  }
  ids->assign(static_cast<size_t>(t.rows()), 0);
  absl::Status local;
  for (const LocalShard& ls : local_) {
    if (ls.table != k) continue;
    const embedding::Shard& s = plan_.tables[k].shards[ls.shard];
    if (s.col_begin != 0) continue;  // the first column block's map
    const auto* store = dynamic_cast<const embedding::DynamicStore*>(ls.store);
    if (store == nullptr) {
      // Still in the all-reduce below, as every rank.
      local = absl::InternalError(absl::StrCat(
          "dynamic table ", t.name(), ": shard ", ls.shard, " has no id map"));
      continue;
    }
    // Under the map's readers' rules: GatherTableIds runs between steps.
    const embedding::DynamicIdMap& map = store->map();
    const int64_t ttl = map.options().ttl_steps;
    int64_t* out = ids->data() + s.row_begin;
    for (int64_t r = 0; r < map.usable_rows(); ++r) {
      const int64_t key = map.keys()[r];
      const bool expired =
          ttl > 0 && key >= 0 && map.step() - map.last_steps()[r] > ttl;
      out[r] = EncodeId(key < 0 || expired ? kFreeRowId : key);
    }
    out[map.kept_row()] = EncodeId(kKeptRowId);
  }
  if (replica_[k] < 0) {
    RETURN_IF_ERROR(comm_->AllReduceSum(ids->data(),
                                        static_cast<int64_t>(ids->size()),
                                        comm::DataType::kInt64));
  }
  RETURN_IF_ERROR(local);
  for (size_t r = 0; r < ids->size(); ++r) {
    if ((*ids)[r] == 0) {
      return absl::InternalError(
          absl::StrCat("dynamic table ", t.name(), ": no shard holds row ", r));
    }
    (*ids)[r] = DecodeId((*ids)[r]);
  }
  return absl::OkStatus();
}

}  // namespace dlrm::model
