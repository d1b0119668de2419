// RowDatabase over rocksdb::DB (embedding/row_database.h).
#include "embedding/row_database.h"

#include <rocksdb/cache.h>
#include <rocksdb/db.h>
#include <rocksdb/env.h>
#include <rocksdb/filter_policy.h>
#include <rocksdb/listener.h>
#include <rocksdb/table.h>
#include <rocksdb/utilities/checkpoint.h>

#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace dlrm::embedding {
namespace {

// Turns RocksDB's automatic recovery from background errors off (the
// retryable ones are off through max_bgerror_resume_count): recovery runs
// only when a store asks for it, from the thread that needs it.
class NoAutoRecovery final : public rocksdb::EventListener {
 public:
  void OnErrorRecoveryBegin(rocksdb::BackgroundErrorReason /*reason*/,
                            rocksdb::Status /*bg_error*/,
                            bool* auto_recovery) override {
    *auto_recovery = false;
  }
};

}  // namespace

absl::Status RocksDbStatus(const rocksdb::Status& s, const std::string& what) {
  const std::string message =
      absl::StrCat("RocksDB ", what, ": ", s.ToString());
  if (s.IsNotFound()) return absl::NotFoundError(message);
  if (s.IsNoSpace()) return absl::ResourceExhaustedError(message);
  if (s.IsCorruption()) return absl::DataLossError(message);
  if (s.IsInvalidArgument()) return absl::InvalidArgumentError(message);
  if (s.IsNotSupported()) return absl::UnimplementedError(message);
  if (s.IsBusy() || s.IsTimedOut() || s.IsTryAgain()) {
    return absl::UnavailableError(message);
  }
  return absl::InternalError(message);
}

absl::StatusOr<std::unique_ptr<RowDatabase>> RowDatabase::Open(
    const RocksDbStoreOptions& options) {
  RETURN_IF_ERROR(options.Validate());
  std::error_code ec;
  std::filesystem::create_directories(options.path, ec);
  if (ec) {
    return absl::UnavailableError(absl::StrCat(
        "cannot create RocksDB directory ", options.path, ": ", ec.message()));
  }
  std::unique_ptr<RowDatabase> db(new RowDatabase());
  db->options_ = options;

  rocksdb::DBOptions db_options;
  db_options.create_if_missing = true;
  db_options.create_missing_column_families = true;
  db_options.max_bgerror_resume_count = 0;
  db_options.listeners.push_back(std::make_shared<NoAutoRecovery>());
  if (options.file_system != nullptr) {
    db->env_ = rocksdb::NewCompositeEnv(options.file_system);
    db_options.env = db->env_.get();
  }
  rocksdb::BlockBasedTableOptions table_options;
  if (options.block_cache_bytes > 0) {
    table_options.block_cache =
        rocksdb::NewLRUCache(static_cast<size_t>(options.block_cache_bytes));
  }
  if (options.bloom_bits_per_key > 0) {
    table_options.filter_policy.reset(
        rocksdb::NewBloomFilterPolicy(options.bloom_bits_per_key, false));
  }
  db->family_options_ = std::make_unique<rocksdb::ColumnFamilyOptions>();
  db->family_options_->table_factory.reset(
      rocksdb::NewBlockBasedTableFactory(table_options));
  // Rows are float bits, which do not compress: compression would only cost
  // the flushes and compactions CPU.
  db->family_options_->compression = rocksdb::kNoCompression;
  db->family_options_->write_buffer_size =
      static_cast<size_t>(options.write_buffer_bytes);

  // A new database has no list yet: it starts with the default family.
  std::vector<std::string> names;
  if (!rocksdb::DB::ListColumnFamilies(db_options, options.path, &names).ok() ||
      names.empty()) {
    names = {rocksdb::kDefaultColumnFamilyName};
  }
  std::vector<rocksdb::ColumnFamilyDescriptor> descriptors;
  for (const std::string& name : names) {
    descriptors.emplace_back(name, *db->family_options_);
  }
  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  rocksdb::DB* raw = nullptr;
  const rocksdb::Status s =
      rocksdb::DB::Open(db_options, options.path, descriptors, &handles, &raw);
  if (!s.ok()) return RocksDbStatus(s, absl::StrCat("open ", options.path));
  db->db_.reset(raw);
  for (size_t i = 0; i < handles.size(); ++i) {
    db->families_.emplace_back(names[i], handles[i]);
  }
  try {
    db->worker_ = std::thread([raw_db = db.get()] { raw_db->WorkerLoop(); });
  } catch (const std::system_error& e) {
    return absl::InternalError(absl::StrCat(
        "cannot start the RocksDB worker of ", options.path, ": ", e.what()));
  }
  return db;
}

void RowDatabase::Submit(std::function<void()> job) {
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    queue_.push_back(std::move(job));
  }
  queue_cv_.notify_one();
}

void RowDatabase::WorkerLoop() {
  while (true) {
    std::function<void()> job;
    {
      std::unique_lock<std::mutex> lock(queue_mu_);
      queue_cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;
      job = std::move(queue_.front());
      queue_.pop_front();
    }
    job();
  }
}

absl::StatusOr<std::unique_ptr<RowDatabase>> RowDatabase::RestoreCheckpoint(
    const std::string& checkpoint_dir, const RocksDbStoreOptions& options) {
  RETURN_IF_ERROR(options.Validate());
  std::error_code ec;
  if (!std::filesystem::is_directory(checkpoint_dir, ec)) {
    return absl::NotFoundError(
        absl::StrCat("checkpoint ", checkpoint_dir, " is not a directory"));
  }
  if (std::filesystem::exists(options.path, ec) &&
      !std::filesystem::is_empty(options.path, ec)) {
    return absl::AlreadyExistsError(absl::StrCat(
        "cannot restore into ", options.path, ": it exists and is not empty"));
  }
  std::filesystem::create_directories(options.path, ec);
  if (!ec) {
    std::filesystem::copy(checkpoint_dir, options.path,
                          std::filesystem::copy_options::recursive, ec);
  }
  if (ec) {
    return absl::UnavailableError(
        absl::StrCat("copying checkpoint ", checkpoint_dir, " to ",
                     options.path, ": ", ec.message()));
  }
  return Open(options);
}

RowDatabase::~RowDatabase() {
  if (worker_.joinable()) {
    {
      std::lock_guard<std::mutex> lock(queue_mu_);
      stopping_ = true;
    }
    queue_cv_.notify_one();
    worker_.join();
  }
  if (db_ == nullptr) return;
  for (auto& [name, handle] : families_) {
    db_->DestroyColumnFamilyHandle(handle);
  }
  // Close flushes memtables the WAL-less writes left unpersisted.
  db_->Close();
}

absl::StatusOr<rocksdb::ColumnFamilyHandle*> RowDatabase::ColumnFamily(
    const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [family_name, handle] : families_) {
    if (family_name == name) return handle;
  }
  rocksdb::ColumnFamilyHandle* handle = nullptr;
  const rocksdb::Status s =
      db_->CreateColumnFamily(*family_options_, name, &handle);
  if (!s.ok()) {
    return RocksDbStatus(
        s, absl::StrCat("create column family ", name, " in ", options_.path));
  }
  families_.emplace_back(name, handle);
  return handle;
}

absl::Status RowDatabase::Checkpoint(const std::string& dir) {
  std::error_code ec;
  if (std::filesystem::exists(dir, ec)) {
    return absl::AlreadyExistsError(
        absl::StrCat("checkpoint directory ", dir, " already exists"));
  }
  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [name, handle] : families_) handles.push_back(handle);
  }
  // Spill writes skip the WAL, so the memtables must reach SST files before
  // the hard links are taken.
  rocksdb::Status s = db_->Flush(rocksdb::FlushOptions(), handles);
  for (int retry = 0; !s.ok() && retry < options_.write_retries; ++retry) {
    if (!Recover().ok()) break;
    s = db_->Flush(rocksdb::FlushOptions(), handles);
  }
  if (!s.ok()) return RocksDbStatus(s, absl::StrCat("flush ", options_.path));
  rocksdb::Checkpoint* raw = nullptr;
  s = rocksdb::Checkpoint::Create(db_.get(), &raw);
  if (!s.ok()) return RocksDbStatus(s, "create checkpoint object");
  std::unique_ptr<rocksdb::Checkpoint> checkpoint(raw);
  s = checkpoint->CreateCheckpoint(dir);
  if (!s.ok()) return RocksDbStatus(s, absl::StrCat("checkpoint to ", dir));
  return absl::OkStatus();
}

absl::Status RowDatabase::Recover() {
  const rocksdb::Status s = db_->Resume();
  if (!s.ok()) {
    return RocksDbStatus(
        s, absl::StrCat("recover ", options_.path, " from a failed write"));
  }
  return absl::OkStatus();
}

std::string ColumnFamilyName(const TableSpec& spec) {
  const TableSlice& slice = spec.slice;
  if (slice.table_rows == 0 && slice.row_begin == 0 && slice.col_begin == 0) {
    return absl::StrCat("table_", spec.table_index);
  }
  return absl::StrCat("table_", spec.table_index, "_rows_", slice.row_begin,
                      "_", slice.row_begin + spec.rows, "_cols_",
                      slice.col_begin, "_", slice.col_begin + spec.dim);
}

}  // namespace dlrm::embedding
