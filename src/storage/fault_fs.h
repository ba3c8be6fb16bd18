// A FileSystem wrapper that injects faults, for tests (LevelDB's FaultInjectionTestEnv
// and RocksDB's kill points are the models). Thread-safe.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "distckpt/filesystem.h"

namespace distckpt::internal_storage {

struct FaultSpec {
  // After this many bytes written through the wrapper (over all files), a write stores
  // only what fits and fails with "No space left on device (injected)".
  std::optional<uint64_t> write_budget;
  // When set, the budget counts and limits only writes to paths containing this (e.g.
  // "data-": the disk fills during the data, not while the save's owner record is made).
  std::string budget_path_contains;
  // fsync of a file whose path contains this substring fails with EIO.
  std::string fail_sync_if_contains;
  // rename whose source contains this substring fails.
  std::string fail_rename_if_contains;
  // Creating a file whose path contains this substring fails.
  std::string fail_create_if_contains;
  // Reads of a file whose path contains this substring fail with EIO, buffered or
  // direct (the file still says whether it could read directly, as the base does).
  std::string fail_read_if_contains;
  // Called before every operation with its name ("create", "write", "sync", "rename",
  // "sync_dir", "remove", ...) and path: a test may crash the process here (kill point).
  std::function<void(const std::string& op, const std::string& path)> hook;
};

class FaultFileSystem final : public FileSystem {
 public:
  FaultFileSystem(std::shared_ptr<FileSystem> base, FaultSpec spec)
      : base_(std::move(base)), spec_(std::move(spec)) {}

  Result<std::unique_ptr<WritableFile>> open_writable(const std::string& path,
                                                      const WriteOpenOptions& options = {}) override;
  Result<std::unique_ptr<ReadableFile>> open_readable(const std::string& path) override;
  Status create_dir(const std::string& path) override;
  Status create_dirs(const std::string& path) override;
  Status rename(const std::string& from, const std::string& to) override;
  Status rename_no_replace(const std::string& from, const std::string& to) override;
  Status remove_file(const std::string& path) override;
  Status link_file(const std::string& from, const std::string& to) override {
    on_op("link", to);
    return base_->link_file(from, to);
  }
  Status remove_all(const std::string& path) override;
  Result<std::vector<DirEntry>> list_dir(const std::string& path) override;
  bool exists(const std::string& path) override;
  Result<uint64_t> file_size(const std::string& path) override;
  Status sync_dir(const std::string& path) override;
  Status sync_file(const std::string& path) override;
  Status evict_cached(const std::string& path) override { return base_->evict_cached(path); }
  Status append_synced(const std::string& path, const std::string& data) override;
  Result<int64_t> modified_time_ns(const std::string& path) override { return base_->modified_time_ns(path); }

  uint64_t bytes_written() const { return written_.load(); }

  // Used by the wrapped files.
  void on_op(const std::string& op, const std::string& path) const {
    if (spec_.hook) spec_.hook(op, path);
  }
  // Returns how many of `n` bytes may still be written (all of them without a budget).
  uint64_t reserve(uint64_t n, const std::string& path);
  const FaultSpec& spec() const { return spec_; }

 private:
  std::shared_ptr<FileSystem> base_;
  FaultSpec spec_;
  std::mutex mu_;
  std::atomic<uint64_t> written_{0};
};

}  // namespace distckpt::internal_storage
