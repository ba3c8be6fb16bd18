#include "storage/fault_fs.h"

#include <algorithm>

namespace distckpt::internal_storage {
namespace {

bool matches(const std::string& needle, const std::string& path) {
  return !needle.empty() && path.find(needle) != std::string::npos;
}

// A file whose reads fail (FaultSpec::fail_read_if_contains); everything else is the
// base file's.
class FailingReadableFile final : public ReadableFile {
 public:
  FailingReadableFile(std::unique_ptr<ReadableFile> base, std::string path) : base_(std::move(base)), path_(std::move(path)) {}
  Status read_at(void*, std::size_t, uint64_t) const override { return failed(); }
  Result<uint64_t> size() const override { return base_->size(); }
  Status read_batch(std::span<const ReadRequest>) const override { return failed(); }
  std::string_view batch_method() const override { return base_->batch_method(); }
  bool can_read_direct() const override { return base_->can_read_direct(); }
  Result<std::size_t> read_direct(void*, std::size_t, uint64_t) const override { return failed(); }
  double cached_fraction() const override { return base_->cached_fraction(); }

 private:
  Status failed() const { return io_error("read '" + path_ + "': Input/output error (injected)"); }
  std::unique_ptr<ReadableFile> base_;
  std::string path_;
};

class FaultWritableFile final : public WritableFile {
 public:
  FaultWritableFile(FaultFileSystem* fs, std::unique_ptr<WritableFile> base, std::string path)
      : fs_(fs), base_(std::move(base)), path_(std::move(path)) {}
  Status write_at(const void* data, std::size_t n, uint64_t offset) override {
    fs_->on_op("write", path_);
    const uint64_t allowed = fs_->reserve(n, path_);
    // A direct file only takes aligned lengths: there the injected fault writes nothing.
    if (allowed == n || (allowed > 0 && !base_->direct()))
      DISTCKPT_RETURN_IF_ERROR(base_->write_at(data, allowed, offset));
    if (allowed < n)
      return io_error("write '" + path_ + "': No space left on device (injected after " +
                      std::to_string(allowed) + " of " + std::to_string(n) + " bytes)");
    return Status();
  }
  Status sync() override {
    fs_->on_op("sync", path_);
    if (matches(fs_->spec().fail_sync_if_contains, path_))
      return io_error("fsync '" + path_ + "': Input/output error (injected)");
    return base_->sync();
  }
  Status close() override {
    fs_->on_op("close", path_);
    return base_->close();
  }
  bool direct() const override { return base_->direct(); }
  // Writes through a mapping cannot be cut short: a file under a write budget is never mapped.
  Result<char*> map_for_write(uint64_t size) override {
    if (fs_->spec().write_budget) return static_cast<char*>(nullptr);
    fs_->on_op("map", path_);
    return base_->map_for_write(size);
  }
  Status truncate(uint64_t size) override {
    fs_->on_op("truncate", path_);
    return base_->truncate(size);
  }

 private:
  FaultFileSystem* fs_;
  std::unique_ptr<WritableFile> base_;
  std::string path_;
};

}  // namespace

uint64_t FaultFileSystem::reserve(uint64_t n, const std::string& path) {
  if (!spec_.budget_path_contains.empty() && path.find(spec_.budget_path_contains) == std::string::npos) return n;
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t allowed = n;
  if (spec_.write_budget) {
    const uint64_t used = written_.load();
    allowed = used >= *spec_.write_budget ? 0 : std::min(n, *spec_.write_budget - used);
  }
  written_ += allowed;
  return allowed;
}

Result<std::unique_ptr<WritableFile>> FaultFileSystem::open_writable(const std::string& path,
                                                                     const WriteOpenOptions& options) {
  on_op("create", path);
  if (matches(spec_.fail_create_if_contains, path))
    return io_error("create '" + path + "': Permission denied (injected)");
  DISTCKPT_ASSIGN_OR_RETURN(auto base, base_->open_writable(path, options));
  return std::unique_ptr<WritableFile>(new FaultWritableFile(this, std::move(base), path));
}
Result<std::unique_ptr<ReadableFile>> FaultFileSystem::open_readable(const std::string& path) {
  on_op("open", path);
  DISTCKPT_ASSIGN_OR_RETURN(auto base, base_->open_readable(path));
  if (!matches(spec_.fail_read_if_contains, path)) return base;
  return std::unique_ptr<ReadableFile>(new FailingReadableFile(std::move(base), path));
}
Status FaultFileSystem::create_dir(const std::string& path) {
  on_op("mkdir", path);
  return base_->create_dir(path);
}
Status FaultFileSystem::create_dirs(const std::string& path) {
  on_op("mkdir", path);
  return base_->create_dirs(path);
}
Status FaultFileSystem::rename(const std::string& from, const std::string& to) {
  on_op("rename", from);
  if (matches(spec_.fail_rename_if_contains, from))
    return io_error("rename '" + from + "' -> '" + to + "': Input/output error (injected)");
  return base_->rename(from, to);
}
Status FaultFileSystem::rename_no_replace(const std::string& from, const std::string& to) {
  on_op("rename", from);
  if (matches(spec_.fail_rename_if_contains, from))
    return io_error("rename '" + from + "' -> '" + to + "': Input/output error (injected)");
  return base_->rename_no_replace(from, to);
}
Status FaultFileSystem::remove_file(const std::string& path) {
  on_op("remove", path);
  return base_->remove_file(path);
}
Status FaultFileSystem::remove_all(const std::string& path) {
  on_op("remove", path);
  return base_->remove_all(path);
}
Result<std::vector<DirEntry>> FaultFileSystem::list_dir(const std::string& path) { return base_->list_dir(path); }
bool FaultFileSystem::exists(const std::string& path) { return base_->exists(path); }
Result<uint64_t> FaultFileSystem::file_size(const std::string& path) { return base_->file_size(path); }
Status FaultFileSystem::sync_dir(const std::string& path) {
  on_op("sync_dir", path);
  return base_->sync_dir(path);
}
Status FaultFileSystem::sync_file(const std::string& path) {
  on_op("sync", path);
  if (!spec_.fail_sync_if_contains.empty() && path.find(spec_.fail_sync_if_contains) != std::string::npos)
    return io_error("fsync '" + path + "': injected EIO");
  return base_->sync_file(path);
}

}  // namespace distckpt::internal_storage

namespace distckpt::internal_storage {

Status FaultFileSystem::append_synced(const std::string& path, const std::string& data) {
  on_op("append", path);
  if (reserve(data.size(), path) < data.size())
    return io_error("append '" + path + "': No space left on device (injected)");
  if (!spec_.fail_sync_if_contains.empty() && path.find(spec_.fail_sync_if_contains) != std::string::npos)
    return io_error("fsync '" + path + "': injected EIO");
  return base_->append_synced(path, data);
}

}  // namespace distckpt::internal_storage
