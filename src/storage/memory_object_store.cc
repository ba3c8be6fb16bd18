// An in-memory object store with S3's conditions, for tests of what sits on the seam.
#include <chrono>
#include <cstring>
#include <map>
#include <mutex>

#include "storage/object_store.h"

namespace distckpt::internal_storage {
namespace {

int64_t host_now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

struct Object {
  std::string data;
  ObjectInfo info;
};

class MemoryStore final : public ObjectStore, public std::enable_shared_from_this<MemoryStore> {
 public:
  MemoryStore(std::string bucket, uint64_t part_bytes, bool enforce)
      : bucket_(std::move(bucket)), part_bytes_(part_bytes), enforce_(enforce) {}

  Result<std::string> put(const std::string& key, std::string_view data, const PutCondition& condition) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = objects_.find(key);
    if (condition.create_only && it != objects_.end() && enforce_)
      return already_exists("memory PUT " + where(key) + ": 412: the key exists (If-None-Match: *)");
    if (!condition.if_match.empty() && (it == objects_.end() || it->second.info.etag != condition.if_match) && enforce_)
      return aborted("memory PUT " + where(key) + ": 412: the object changed since it was read (If-Match)");
    return store(key, std::string(data), md5_hex(data));
  }

  Result<std::string> get(const std::string& key, std::string* etag, uint64_t max_bytes) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = objects_.find(key);
    if (it == objects_.end()) return not_found("memory GET " + where(key) + ": 404 NoSuchKey");
    if (it->second.data.size() > max_bytes) return corruption("memory GET " + where(key) + ": longer than expected");
    if (etag) *etag = it->second.info.etag;
    return it->second.data;
  }

  Status get_range(const std::string& key, uint64_t offset, std::size_t n, void* out,
                   const std::string& etag) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = objects_.find(key);
    if (it == objects_.end()) return not_found("memory GET " + where(key) + ": 404 NoSuchKey");
    if (!etag.empty() && it->second.info.etag != etag)
      return aborted("memory GET " + where(key) + ": the object changed while it was read");
    if (offset > it->second.data.size() || n > it->second.data.size() - offset)
      return corruption("memory GET " + where(key) + ": " + std::to_string(n) + " bytes at " + std::to_string(offset) +
                        ": past the object's end");
    std::memcpy(out, it->second.data.data() + offset, n);
    return Status();
  }

  Result<ObjectInfo> head(const std::string& key) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = objects_.find(key);
    if (it == objects_.end()) return not_found("memory HEAD " + where(key) + ": 404");
    return it->second.info;
  }

  Result<ObjectListing> list(const std::string& prefix, const std::string& delimiter) override {
    std::lock_guard<std::mutex> lock(mu_);
    ObjectListing out;
    for (auto it = objects_.lower_bound(prefix); it != objects_.end() && it->first.compare(0, prefix.size(), prefix) == 0;
         ++it) {
      const std::size_t d = delimiter.empty() ? std::string::npos : it->first.find(delimiter, prefix.size());
      if (d == std::string::npos) {
        out.objects.emplace_back(it->first, it->second.info);
      } else {
        const std::string p = it->first.substr(0, d + delimiter.size());
        if (out.prefixes.empty() || out.prefixes.back() != p) out.prefixes.push_back(p);
      }
    }
    return out;
  }

  Status remove(const std::string& key) override {
    std::lock_guard<std::mutex> lock(mu_);
    objects_.erase(key);
    return Status();
  }

  Result<std::unique_ptr<ObjectUpload>> start_upload(const std::string& key) override;

  Result<std::vector<IncompleteUpload>> list_uploads(const std::string& prefix) override {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<IncompleteUpload> out;
    for (const auto& [id, upload] : uploads_)
      if (upload.key.compare(0, prefix.size(), prefix) == 0) out.push_back(upload);
    return out;
  }
  Status abort_upload(const std::string&, const std::string& upload_id) override {
    std::lock_guard<std::mutex> lock(mu_);
    uploads_.erase(upload_id);
    return Status();
  }
  // An upload's life: begun (listed), then completed or aborted (gone).
  std::string begin_upload(const std::string& key) {
    std::lock_guard<std::mutex> lock(mu_);
    const std::string id = "upload-" + std::to_string(++upload_ids_);
    uploads_[id] = IncompleteUpload{key, id, host_now_ms()};
    return id;
  }
  bool end_upload(const std::string& id) {
    std::lock_guard<std::mutex> lock(mu_);
    return uploads_.erase(id) > 0;
  }

  Result<int64_t> now_ms() override { return host_now_ms(); }
  std::string describe() const override { return "memory store '" + bucket_ + "'"; }
  uint64_t part_bytes() const override { return part_bytes_; }

  std::string complete_upload(const std::string& key, std::string data) {
    std::lock_guard<std::mutex> lock(mu_);
    std::string etag = md5_hex(data) + "-1";  // S3's multipart tags end in -<parts>
    return store(key, std::move(data), std::move(etag));
  }

 private:
  std::string where(const std::string& key) const { return "s3://" + bucket_ + "/" + key; }
  std::string store(const std::string& key, std::string data, std::string etag) {
    Object& o = objects_[key];
    o.info.size = data.size();
    o.data = std::move(data);
    o.info.etag = std::move(etag);  // as S3: the same bytes, the same tag
    o.info.modified_ms = host_now_ms() / 1000 * 1000;
    return o.info.etag;
  }

  std::string bucket_;
  uint64_t part_bytes_;
  bool enforce_;
  std::mutex mu_;
  std::map<std::string, Object> objects_;
  std::map<std::string, IncompleteUpload> uploads_;
  uint64_t upload_ids_ = 0;
};

class MemoryUpload final : public ObjectUpload {
 public:
  MemoryUpload(std::shared_ptr<MemoryStore> store, std::string key)
      : store_(std::move(store)), key_(std::move(key)), id_(store_->begin_upload(key_)) {}
  Status upload_part(int number, std::string_view data) override {
    std::lock_guard<std::mutex> lock(mu_);
    parts_[number] = std::string(data);
    return Status();
  }
  Result<std::string> complete(int parts) override {
    if (!store_->end_upload(id_)) return not_found("memory upload of " + key_ + ": NoSuchUpload (aborted)");
    std::string all;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (int n = 1; n <= parts; ++n) {
        auto it = parts_.find(n);
        if (it == parts_.end()) return internal_error("memory upload of " + key_ + ": part " + std::to_string(n) + " missing");
        all += it->second;
      }
    }
    return store_->complete_upload(key_, std::move(all));
  }
  void abort() override { store_->end_upload(id_); }

 private:
  std::shared_ptr<MemoryStore> store_;
  std::string key_, id_;
  std::mutex mu_;
  std::map<int, std::string> parts_;
};

Result<std::unique_ptr<ObjectUpload>> MemoryStore::start_upload(const std::string& key) {
  return std::unique_ptr<ObjectUpload>(std::make_unique<MemoryUpload>(shared_from_this(), key));
}

}  // namespace

std::shared_ptr<ObjectStore> memory_object_store(std::string bucket, uint64_t part_bytes, bool enforce_conditions) {
  return std::make_shared<MemoryStore>(std::move(bucket), part_bytes, enforce_conditions);
}

}  // namespace distckpt::internal_storage
