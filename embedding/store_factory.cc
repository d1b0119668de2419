// CreateEmbeddingStore: builds the store of a StoreKind (host memory,
// RocksDB behind a host cache, device memory, a device cache over host
// memory or RocksDB). In a file of its own, apart from the tiers, so that
// code using only the host or device tier (the CUDA tests) does not link
// RocksDB.
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/device.h"
#include "core/status.h"
#include "embedding/embedding_store.h"
#include "embedding/rocksdb_store.h"

#if defined(DLRM_WITH_CUDA)
#include "embedding/cuda/cuda_store.h"
#include "embedding/cuda/device_slots.h"
#endif

namespace dlrm::embedding {

absl::StatusOr<std::unique_ptr<EmbeddingStore>> CreateEmbeddingStore(
    const TableSpec& spec, const StoreOptions& options, RowDatabase* db) {
  RETURN_IF_ERROR(spec.Validate());
  RETURN_IF_ERROR(options.Validate());
  if (options.kind == StoreKind::kHost) {
    return std::make_unique<HostStore>(spec);
  }
  if (options.kind == StoreKind::kDevice) {
#if defined(DLRM_WITH_CUDA)
    if (options.device_cache.cache_rows > 0) {
      // The whole table behind the slots: host memory or RocksDB.
      StoreOptions backing_options;
      backing_options.kind = options.device_cache_backing;
      backing_options.rocksdb = options.rocksdb;
      ASSIGN_OR_RETURN(std::unique_ptr<EmbeddingStore> backing,
                       CreateEmbeddingStore(spec, backing_options, db));
      ASSIGN_OR_RETURN(std::unique_ptr<CachedStore> cached,
                       cuda::CreateDeviceCachedStore(spec, options.device_cache,
                                                     options.cuda_stream,
                                                     std::move(backing)));
      return std::unique_ptr<EmbeddingStore>(std::move(cached));
    }
    ASSIGN_OR_RETURN(std::unique_ptr<cuda::CudaStore> store,
                     cuda::CudaStore::Create(spec, options.cuda_stream));
    return std::unique_ptr<EmbeddingStore>(std::move(store));
#else
    return absl::FailedPreconditionError(absl::StrCat(
        "table ", spec.table_index,
        ": the device tier needs a CUDA device: ", CudaUnavailableReason()));
#endif
  }
  if (db == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "table ", spec.table_index, ": the RocksDB tier needs a RowDatabase"));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<RocksDbCachedStore> store,
                   RocksDbCachedStore::Create(spec, options.rocksdb, db));
  return std::unique_ptr<EmbeddingStore>(std::move(store));
}

}  // namespace dlrm::embedding
