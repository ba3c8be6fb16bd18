#include "storage/object_fs.h"

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <cstring>
#include <list>
#include <map>
#include <mutex>
#include <thread>

#include "base/kill_point.h"
#include "base/strings.h"
#include "storage/s3_store.h"

namespace distckpt::internal_storage {
namespace {

Result<std::pair<std::shared_ptr<ObjectStore>, std::string>> locate(const std::string& path) {
  DISTCKPT_ASSIGN_OR_RETURN(std::shared_ptr<ObjectStore> store, object_store_for(path));
  return std::make_pair(std::move(store), object_key(path));
}

// Sends a multipart upload's parts from a thread of its own, so that the writer fills the
// next part while the last one travels; at most kQueued parts wait (memory: that many
// parts per file being written).
class PartSender {
 public:
  static constexpr std::size_t kQueued = 1;
  static constexpr int kThreads = 2;  // parts in flight at once, each on its own connection
  explicit PartSender(ObjectUpload& upload) : upload_(upload) {
    for (int i = 0; i < kThreads; ++i) threads_.emplace_back([this] { run(); });
  }
  ~PartSender() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
      queue_.clear();  // an abandoned upload: what is queued is never sent
    }
    cv_.notify_all();
    for (std::thread& t : threads_) t.join();
  }
  // Queues part `number`, waiting while kQueued are queued. The first failure of any part
  // is returned by this and every later call.
  Status send(int number, std::string bytes) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return queue_.size() < kQueued || !failed_.ok(); });
    if (!failed_.ok()) return failed_;
    queue_.emplace_back(number, std::move(bytes));
    cv_.notify_all();
    return Status();
  }
  // Waits until every queued part is sent.
  Status drain() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return (queue_.empty() && busy_ == 0) || !failed_.ok(); });
    return failed_;
  }

 private:
  void run() {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      cv_.wait(lock, [this] { return !queue_.empty() || stopping_; });
      if (queue_.empty()) return;
      auto [number, bytes] = std::move(queue_.front());
      queue_.pop_front();
      ++busy_;
      lock.unlock();
      Status st = failed_.ok() ? upload_.upload_part(number, bytes) : Status();
      lock.lock();
      --busy_;
      if (!st.ok() && failed_.ok()) failed_ = st;
      cv_.notify_all();
    }
  }
  ObjectUpload& upload_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<int, std::string>> queue_;
  int busy_ = 0;  // parts being sent
  bool stopping_ = false;
  Status failed_;
  std::vector<std::thread> threads_;  // last: they start once the rest is built
};

class ObjectWritable final : public WritableFile {
 public:
  ObjectWritable(std::shared_ptr<ObjectStore> store, std::string key, std::string path)
      : store_(std::move(store)), key_(std::move(key)), path_(std::move(path)), part_bytes_(store_->part_bytes()) {}
  ~ObjectWritable() override {
    sender_.reset();  // before the upload it sends to
    if (upload_ && !finished_) upload_->abort();
  }

  Status write_at(const void* data, std::size_t n, uint64_t offset) override {
    if (finished_) return io_error("write '" + path_ + "': the object is already complete");
    const uint64_t end = sent_ + current_.size();
    if (offset < sent_)
      return io_error("write '" + path_ + "': " + std::to_string(n) + " bytes at " + std::to_string(offset) +
                      ": an object is written once, front to back, and those bytes are sent");
    if (offset > end) {
      pending_[offset].assign(static_cast<const char*>(data), n);
      return Status();
    }
    // Overlapping or appending to the bytes not yet sent.
    place(static_cast<std::size_t>(offset - sent_), static_cast<const char*>(data), n);
    while (!pending_.empty() && pending_.begin()->first <= sent_ + current_.size()) {
      auto node = pending_.extract(pending_.begin());
      place(static_cast<std::size_t>(node.key() - sent_), node.mapped().data(), node.mapped().size());
    }
    return send_full_parts();
  }

  Status truncate(uint64_t length) override {
    if (length < sent_) return io_error("truncate '" + path_ + "' to " + std::to_string(length) + ": bytes already sent");
    current_.resize(static_cast<std::size_t>(length - sent_));
    return Status();
  }

  Status sync() override { return finish(); }
  Status close() override { return finish(); }

 private:
  // S3 takes at most 10,000 parts: the part size doubles every 1,000 parts (16 MiB parts
  // then reach about 16 TiB by part 10,000).
  uint64_t part_size(int number) const { return part_bytes_ << std::min((number - 1) / 1000, 20); }

  void place(std::size_t at, const char* data, std::size_t n) {
    const uint64_t part = part_size(parts_ + 1);
    if (current_.capacity() < part + n) current_.reserve(part + n);
    if (current_.size() < at + n) current_.resize(at + n);
    std::memcpy(current_.data() + at, data, n);
  }

  Status send_full_parts() {
    // A part is sent once a whole one and more is held, so that the last part is never
    // empty (S3 refuses parts under 5 MiB except the last).
    while (current_.size() > part_size(parts_ + 1)) {
      const uint64_t part = part_size(parts_ + 1);
      if (!upload_) {
        DISTCKPT_ASSIGN_OR_RETURN(upload_, store_->start_upload(key_));
        sender_ = std::make_unique<PartSender>(*upload_);
      }
      std::string rest = current_.substr(part);
      current_.resize(part);
      DISTCKPT_RETURN_IF_ERROR(sender_->send(++parts_, std::move(current_)).with_context("write '" + path_ + "'"));
      current_ = std::move(rest);
      sent_ += part;
      internal_base::kill_point("object-part");  // between parts
    }
    return Status();
  }

  Status finish() {
    if (finished_) return Status();
    if (!pending_.empty())
      return io_error("write '" + path_ + "': bytes at " + std::to_string(pending_.begin()->first) +
                      " follow a gap that was never written");
    if (!upload_) {
      DISTCKPT_RETURN_IF_ERROR(store_->put(key_, current_, {}).status());
    } else {
      DISTCKPT_RETURN_IF_ERROR(sender_->send(++parts_, std::move(current_)));
      DISTCKPT_RETURN_IF_ERROR(sender_->drain());
      internal_base::kill_point("object-complete");  // every part sent, the object not yet made
      DISTCKPT_RETURN_IF_ERROR(upload_->complete(parts_).status());
    }
    finished_ = true;
    std::string().swap(current_);
    return Status();
  }

  std::shared_ptr<ObjectStore> store_;
  std::string key_, path_;
  uint64_t part_bytes_;
  std::unique_ptr<ObjectUpload> upload_;
  std::unique_ptr<PartSender> sender_;  // after upload_: destroyed first
  std::string current_;  // bytes from sent_ on, not yet sent
  uint64_t sent_ = 0;
  int parts_ = 0;
  std::map<uint64_t, std::string> pending_;  // writes past the end of current_
  bool finished_ = false;
};

// Reads of one version of an object. Small reads fetch a whole block around them (a
// request costs a round trip; a load asks for many small pieces), kept in a small cache.
class ObjectReadable final : public ReadableFile {
 public:
  static constexpr uint64_t kBlock = 4 << 20;
  ObjectReadable(std::shared_ptr<ObjectStore> store, std::string key, ObjectInfo info)
      : store_(std::move(store)), key_(std::move(key)), info_(std::move(info)) {}

  Status read_at(void* data, std::size_t n, uint64_t offset) const override {
    if (offset > info_.size || n > info_.size - offset)
      return corruption("read '" + key_ + "': " + std::to_string(n) + " bytes at " + std::to_string(offset) +
                        ": the object has " + std::to_string(info_.size));
    if (n >= kBlock / 4) return store_->get_range(key_, offset, n, data, info_.etag);
    char* out = static_cast<char*>(data);
    while (n > 0) {
      const uint64_t block = offset / kBlock;
      DISTCKPT_ASSIGN_OR_RETURN(std::shared_ptr<const std::string> bytes, fetch(block));
      const std::size_t at = static_cast<std::size_t>(offset - block * kBlock);
      const std::size_t take = std::min(n, bytes->size() - at);
      std::memcpy(out, bytes->data() + at, take);
      out += take, offset += take, n -= take;
    }
    return Status();
  }
  Result<uint64_t> size() const override { return info_.size; }

 private:
  Result<std::shared_ptr<const std::string>> fetch(uint64_t block) const {
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (const auto& [b, bytes] : cache_)
        if (b == block) return bytes;
    }
    const uint64_t begin = block * kBlock, len = std::min(kBlock, info_.size - begin);
    auto bytes = std::make_shared<std::string>(static_cast<std::size_t>(len), '\0');
    DISTCKPT_RETURN_IF_ERROR(store_->get_range(key_, begin, bytes->size(), bytes->data(), info_.etag));
    std::lock_guard<std::mutex> lock(mu_);
    cache_.emplace_front(block, bytes);
    if (cache_.size() > 2) cache_.pop_back();
    return std::shared_ptr<const std::string>(bytes);
  }

  std::shared_ptr<ObjectStore> store_;
  std::string key_;
  ObjectInfo info_;
  mutable std::mutex mu_;
  mutable std::list<std::pair<uint64_t, std::shared_ptr<const std::string>>> cache_;
};

class ObjectFileSystem final : public FileSystem {
 public:
  Result<std::unique_ptr<WritableFile>> open_writable(const std::string& path, const WriteOpenOptions&) override {
    DISTCKPT_ASSIGN_OR_RETURN(auto at, locate(path));
    return std::unique_ptr<WritableFile>(std::make_unique<ObjectWritable>(at.first, at.second, path));
  }
  Result<std::unique_ptr<ReadableFile>> open_readable(const std::string& path) override {
    DISTCKPT_ASSIGN_OR_RETURN(auto at, locate(path));
    DISTCKPT_ASSIGN_OR_RETURN(ObjectInfo info, at.first->head(at.second));
    return std::unique_ptr<ReadableFile>(std::make_unique<ObjectReadable>(at.first, at.second, info));
  }
  Status create_dir(const std::string& path) override {
    return unsupported("create directory '" + path +
                       "': an object store has no atomic directories (object roots commit by conditional writes)");
  }
  Status create_dirs(const std::string&) override { return Status(); }
  Status rename(const std::string& from, const std::string& to) override {
    return unsupported("rename '" + from + "' -> '" + to + "': an object store has no rename, and copying is no rename");
  }
  Status rename_no_replace(const std::string& from, const std::string& to) override { return rename(from, to); }
  Status remove_file(const std::string& path) override {
    DISTCKPT_ASSIGN_OR_RETURN(auto at, locate(path));
    return at.first->remove(at.second);
  }
  Status remove_all(const std::string& path) override {
    DISTCKPT_ASSIGN_OR_RETURN(auto at, locate(path));
    DISTCKPT_ASSIGN_OR_RETURN(ObjectListing listing, at.first->list(at.second.empty() ? "" : at.second + "/"));
    for (const auto& [key, info] : listing.objects) DISTCKPT_RETURN_IF_ERROR(at.first->remove(key));
    // Uploads a killed writer left under it: invisible, but kept (and billed) until aborted.
    DISTCKPT_ASSIGN_OR_RETURN(auto uploads, at.first->list_uploads(at.second.empty() ? "" : at.second + "/"));
    for (const auto& u : uploads) DISTCKPT_RETURN_IF_ERROR(at.first->abort_upload(u.key, u.upload_id));
    return at.second.empty() ? Status() : at.first->remove(at.second);
  }
  Result<std::vector<DirEntry>> list_dir(const std::string& path) override {
    DISTCKPT_ASSIGN_OR_RETURN(auto at, locate(path));
    const std::string prefix = at.second.empty() ? "" : at.second + "/";
    DISTCKPT_ASSIGN_OR_RETURN(ObjectListing listing, at.first->list(prefix, "/"));
    std::vector<DirEntry> entries;
    for (const auto& [key, info] : listing.objects)
      if (key.size() > prefix.size()) entries.push_back({key.substr(prefix.size()), false});
    for (const std::string& p : listing.prefixes)
      entries.push_back({p.substr(prefix.size(), p.size() - prefix.size() - 1), true});
    // An empty prefix is an empty directory: a prefix exists once something is under it,
    // and a root is made by its first save (a missing bucket is kNotFound).
    return entries;
  }
  bool exists(const std::string& path) override {
    auto at = locate(path);
    if (!at.ok()) return false;
    if (at->first->head(at->second).ok()) return true;
    auto listing = at->first->list(at->second.empty() ? "" : at->second + "/", "/");
    return listing.ok() && (!listing->objects.empty() || !listing->prefixes.empty());
  }
  Result<uint64_t> file_size(const std::string& path) override {
    DISTCKPT_ASSIGN_OR_RETURN(auto at, locate(path));
    DISTCKPT_ASSIGN_OR_RETURN(ObjectInfo info, at.first->head(at.second));
    return info.size;
  }
  Status sync_dir(const std::string&) override { return Status(); }  // a completed object is durable
  Status sync_file(const std::string&) override { return Status(); }
  Result<int64_t> modified_time_ns(const std::string& path) override {
    DISTCKPT_ASSIGN_OR_RETURN(auto at, locate(path));
    DISTCKPT_ASSIGN_OR_RETURN(ObjectInfo info, at.first->head(at.second));
    if (info.modified_ms < 0) return io_error("'" + path + "': the store gave no readable Last-Modified");
    return info.modified_ms * 1000000;
  }
};

}  // namespace

std::string object_key(const std::string& path) {
  std::string rest = path.substr(std::min<std::size_t>(path.size(), 5));
  const std::size_t slash = rest.find('/');
  std::string key = slash == std::string::npos ? "" : rest.substr(slash + 1);
  while (internal_base::ends_with(key, "/")) key.pop_back();
  return key;
}

std::shared_ptr<FileSystem> object_filesystem() {
  static auto* fs = new std::shared_ptr<FileSystem>(std::make_shared<ObjectFileSystem>());
  return *fs;
}

std::shared_ptr<FileSystem> filesystem_for(const std::string& path, std::shared_ptr<FileSystem> given) {
  if (given) return given;
  return is_object_path(path) ? object_filesystem() : posix_filesystem();
}

}  // namespace distckpt::internal_storage
