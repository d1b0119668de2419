// Reading a model's tables whole, on every rank together: GatherTable
// and WeightChecksum (for tests, checkpoints and export).
#include <algorithm>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/random.h"
#include "core/status.h"
#include "model/model.h"

namespace dlrm::model {

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

}  // namespace dlrm::model
