// The S3 implementation of the object-store seam (object_store.h) over S3Http.
#include "storage/s3_store.h"

#include <openssl/evp.h>

#include <cstdio>
#include <map>
#include <mutex>

#include "storage/s3_http.h"

namespace distckpt::internal_storage {
namespace {

std::string unquote(std::string etag) {
  if (etag.size() >= 2 && etag.front() == '"' && etag.back() == '"') etag = etag.substr(1, etag.size() - 2);
  return etag;
}

class S3Upload final : public ObjectUpload {
 public:
  S3Upload(const S3Http& http, std::string key, std::string upload_id)
      : http_(http), key_(std::move(key)), upload_id_(std::move(upload_id)) {}
  ~S3Upload() override {
    if (!done_) abort();
  }

  Status upload_part(int number, std::string_view data) override {
    S3Request r;
    r.method = "PUT";
    r.key = key_;
    r.query = {{"partNumber", std::to_string(number)}, {"uploadId", upload_id_}};
    r.body = data;
    r.sign_payload = false;
    DISTCKPT_ASSIGN_OR_RETURN(S3Response a, http_.call(r));
    if (a.status != 200) return http_.error_status(a, "upload part " + std::to_string(number) + " of", key_);
    std::lock_guard<std::mutex> lock(mu_);
    etags_[number] = unquote(a.header("etag"));
    return Status();
  }

  Result<std::string> complete(int parts) override {
    std::string xml = "<CompleteMultipartUpload>";
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (int n = 1; n <= parts; ++n) {
        auto it = etags_.find(n);
        if (it == etags_.end())
          return internal_error("S3 complete " + http_.url_of(key_) + ": part " + std::to_string(n) + " not uploaded");
        xml += "<Part><PartNumber>" + std::to_string(n) + "</PartNumber><ETag>\"" + it->second + "\"</ETag></Part>";
      }
    }
    xml += "</CompleteMultipartUpload>";
    S3Request r;
    r.method = "POST";
    r.key = key_;
    r.query = {{"uploadId", upload_id_}};
    r.body = xml;
    DISTCKPT_ASSIGN_OR_RETURN(S3Response a, http_.call(r));
    // S3 may fail a completion inside a 200 answer; a resent completion that the store
    // had already done answers NoSuchUpload: the object's presence decides then (its key
    // is this save's alone).
    if (a.status == 200 && a.error_code().empty()) {
      done_ = true;
      return unquote(xml_values(a.body, "ETag").empty() ? a.header("etag") : xml_values(a.body, "ETag").front());
    }
    if (a.error_code() == "NoSuchUpload") {
      S3Request h;
      h.method = "HEAD";
      h.key = key_;
      DISTCKPT_ASSIGN_OR_RETURN(S3Response head, http_.call(h));
      if (head.status == 200) return done_ = true, unquote(head.header("etag"));
    }
    return http_.error_status(a, "complete upload of", key_);
  }

  void abort() override {
    done_ = true;
    S3Request r;
    r.method = "DELETE";
    r.key = key_;
    r.query = {{"uploadId", upload_id_}};
    (void)http_.call(r);  // best effort: a bucket lifecycle rule collects what is left
  }

 private:
  const S3Http& http_;
  std::string key_, upload_id_;
  std::mutex mu_;
  std::map<int, std::string> etags_;
  bool done_ = false;
};

class S3Store final : public ObjectStore {
 public:
  S3Store(S3Config config, std::string bucket) : http_(std::move(config), std::move(bucket)) {}

  Result<std::string> put(const std::string& key, std::string_view data, const PutCondition& condition) override {
    S3Request r;
    r.method = "PUT";
    r.key = key;
    r.body = data;
    if (condition.create_only) r.headers.push_back("If-None-Match: *");
    if (!condition.if_match.empty()) r.headers.push_back("If-Match: " + condition.if_match);
    DISTCKPT_ASSIGN_OR_RETURN(S3Response a, http_.call(r));
    if (a.status == 200) return unquote(a.header("etag"));
    if (a.status == 412) {
      // An earlier attempt whose answer was lost may have written it (ours, or libcurl's
      // own resend on a fresh connection, which we never see): ours if our bytes are in
      // place. The bytes are compared, not the ETag (with SSE-KMS or SSE-C an ETag is not
      // the MD5 of the bytes). The protocol's conditional writes are small and all carry
      // bytes no other writer makes (a save id, a random tail), so equal bytes are ours.
      std::string etag;
      auto there = get(key, &etag, data.size());
      if (there.ok() && *there == data) return etag;
      const std::string m = "S3 PUT " + http_.url_of(key) + ": 412 PreconditionFailed: ";
      if (condition.create_only) return already_exists(m + "the key exists (If-None-Match: *)");
      return aborted(m + "the object changed since it was read (If-Match)");
    }
    return http_.error_status(a, "PUT", key);
  }

  Result<std::string> get(const std::string& key, std::string* etag, uint64_t max_bytes) override {
    S3Request r;
    r.key = key;
    r.max_body = max_bytes;
    DISTCKPT_ASSIGN_OR_RETURN(S3Response a, http_.call(r));
    if (a.status != 200) return http_.error_status(a, "GET", key);
    if (etag) *etag = unquote(a.header("etag"));
    return std::move(a.body);
  }

  Status get_range(const std::string& key, uint64_t offset, std::size_t n, void* out,
                   const std::string& etag) override {
    if (n == 0) return Status();
    S3Request r;
    r.key = key;
    r.headers.push_back("Range: bytes=" + std::to_string(offset) + "-" + std::to_string(offset + n - 1));
    if (!etag.empty()) r.headers.push_back("If-Match: " + etag);
    r.sink = out;
    r.sink_size = n;
    DISTCKPT_ASSIGN_OR_RETURN(S3Response a, http_.call(r));
    if (a.status == 412) return aborted("S3 GET " + http_.url_of(key) + ": the object changed while it was read");
    if (a.status == 416)
      return corruption("S3 GET " + http_.url_of(key) + ": " + std::to_string(n) + " bytes at " +
                        std::to_string(offset) + ": past the object's end");
    // Only a 206 holds the range asked for (a store or proxy that ignores Range answers
    // 200 with the whole object).
    const std::string range = a.header("content-range");
    if (a.status != 206) return a.status == 200 ? io_error("S3 GET " + http_.url_of(key) + ": the store ignored the Range "
                                                           "header (200, not 206)")
                                                : http_.error_status(a, "GET", key);
    if (range.rfind("bytes " + std::to_string(offset) + "-" + std::to_string(offset + n - 1) + "/", 0) != 0)
      return corruption("S3 GET " + http_.url_of(key) + ": asked for bytes " + std::to_string(offset) + "-" +
                        std::to_string(offset + n - 1) + ", got '" + range + "'");
    if (a.sunk != n)
      return corruption("S3 GET " + http_.url_of(key) + ": " + std::to_string(n) + " bytes at " +
                        std::to_string(offset) + ": the object ends after " + std::to_string(a.sunk));
    return Status();
  }

  Result<ObjectInfo> head(const std::string& key) override {
    S3Request r;
    r.method = "HEAD";
    r.key = key;
    DISTCKPT_ASSIGN_OR_RETURN(S3Response a, http_.call(r));
    if (a.status != 200) return http_.error_status(a, "HEAD", key);
    ObjectInfo info;
    const std::string length = a.header("content-length");
    char* end = nullptr;
    info.size = std::strtoull(length.c_str(), &end, 10);
    if (length.empty() || *end != '\0' || info.size > (uint64_t{1} << 50))
      return corruption("S3 HEAD " + http_.url_of(key) + ": Content-Length '" + length + "' is not a size");
    info.etag = unquote(a.header("etag"));
    info.modified_ms = parse_http_date_ms(a.header("last-modified"));  // -1 if unreadable
    return info;
  }

  Result<ObjectListing> list(const std::string& prefix, const std::string& delimiter) override {
    ObjectListing out;
    std::string token;
    do {
      S3Request r;
      r.query = {{"list-type", "2"}, {"prefix", prefix}};
      if (!delimiter.empty()) r.query["delimiter"] = delimiter;
      if (!token.empty()) r.query["continuation-token"] = token;
      DISTCKPT_ASSIGN_OR_RETURN(S3Response a, http_.call(r));
      if (a.status != 200) return http_.error_status(a, "list", prefix + "*");
      parse_page(a.body, &out);
      const auto truncated = xml_values(a.body, "IsTruncated");
      const auto next = xml_values(a.body, "NextContinuationToken");
      const bool more = !truncated.empty() && truncated.front() == "true";
      // A listing is whole or an error: never cut short, never a loop.
      if (more && (next.empty() || next.front() == token))
        return io_error("S3 list " + http_.url_of(prefix) + "*: the store says there is more but gives no new "
                        "continuation token");
      token = more ? next.front() : "";
    } while (!token.empty());
    return out;
  }

  Status remove(const std::string& key) override {
    S3Request r;
    r.method = "DELETE";
    r.key = key;
    DISTCKPT_ASSIGN_OR_RETURN(S3Response a, http_.call(r));
    if (a.status == 204 || a.status == 200 || a.status == 404) return Status();
    return http_.error_status(a, "DELETE", key);
  }

  Result<std::unique_ptr<ObjectUpload>> start_upload(const std::string& key) override {
    S3Request r;
    r.method = "POST";
    r.key = key;
    r.query = {{"uploads", ""}};
    DISTCKPT_ASSIGN_OR_RETURN(S3Response a, http_.call(r));
    const auto ids = xml_values(a.body, "UploadId");
    if (a.status != 200 || ids.empty()) return http_.error_status(a, "start upload of", key);
    return std::unique_ptr<ObjectUpload>(std::make_unique<S3Upload>(http_, key, ids.front()));
  }

  Result<std::vector<IncompleteUpload>> list_uploads(const std::string& prefix) override {
    std::vector<IncompleteUpload> out;
    std::string key_marker, id_marker;
    for (;;) {
      S3Request r;
      r.query = {{"uploads", ""}, {"prefix", prefix}};
      if (!key_marker.empty()) r.query["key-marker"] = key_marker;
      if (!id_marker.empty()) r.query["upload-id-marker"] = id_marker;
      DISTCKPT_ASSIGN_OR_RETURN(S3Response a, http_.call(r));
      if (a.status != 200) return http_.error_status(a, "list uploads", prefix + "*");
      for (const std::string& u : xml_values(a.body, "Upload")) {
        const auto key = xml_values(u, "Key"), id = xml_values(u, "UploadId"), at = xml_values(u, "Initiated");
        if (key.empty() || id.empty()) continue;
        out.push_back({key.front(), id.front(), at.empty() ? -1 : parse_iso_date_ms(at.front())});
      }
      const auto truncated = xml_values(a.body, "IsTruncated");
      if (truncated.empty() || truncated.front() != "true") return out;
      const auto next_key = xml_values(a.body, "NextKeyMarker"), next_id = xml_values(a.body, "NextUploadIdMarker");
      if (next_key.empty() || (next_key.front() == key_marker && (next_id.empty() || next_id.front() == id_marker)))
        return io_error("S3 list uploads " + http_.url_of(prefix) + "*: the store says there is more but gives no "
                        "new marker");
      key_marker = next_key.front();
      id_marker = next_id.empty() ? "" : next_id.front();
    }
  }

  Status abort_upload(const std::string& key, const std::string& upload_id) override {
    S3Request r;
    r.method = "DELETE";
    r.key = key;
    r.query = {{"uploadId", upload_id}};
    DISTCKPT_ASSIGN_OR_RETURN(S3Response a, http_.call(r));
    if (a.status == 204 || a.status == 200 || a.status == 404) return Status();
    return http_.error_status(a, "abort upload of", key);
  }

  Result<int64_t> now_ms() override {
    S3Request r;
    r.method = "HEAD";  // of the bucket: any answer carries the store's Date
    DISTCKPT_ASSIGN_OR_RETURN(S3Response a, http_.call(r));
    const int64_t ms = parse_http_date_ms(a.header("date"));
    if (ms < 0) return io_error("S3 " + describe() + ": the answer carries no Date: the store's clock is unknown");
    return ms;
  }

  std::string describe() const override { return "s3://" + http_.bucket() + " (" + http_.config().describe() + ")"; }
  uint64_t part_bytes() const override { return http_.config().part_bytes; }

 private:
  // One page of ListObjectsV2: <Contents> (Key, Size, ETag, LastModified) and
  // <CommonPrefixes><Prefix>.
  static void parse_page(const std::string& xml, ObjectListing* out) {
    for (const std::string& c : xml_values(xml, "Contents")) {
      const auto key = xml_values(c, "Key"), size = xml_values(c, "Size"), etag = xml_values(c, "ETag"),
                 modified = xml_values(c, "LastModified");
      if (key.empty()) continue;
      ObjectInfo info;
      info.size = size.empty() ? 0 : std::strtoull(size.front().c_str(), nullptr, 10);
      info.etag = etag.empty() ? "" : unquote(etag.front());
      info.modified_ms = modified.empty() ? -1 : parse_iso_date_ms(modified.front());
      out->objects.emplace_back(key.front(), info);
    }
    for (const std::string& p : xml_values(xml, "CommonPrefixes")) {
      const auto prefix = xml_values(p, "Prefix");
      if (!prefix.empty()) out->prefixes.push_back(prefix.front());
    }
  }

  S3Http http_;
};

std::mutex registry_mu;
std::map<std::string, std::shared_ptr<ObjectStore>>& registry() {
  static auto* stores = new std::map<std::string, std::shared_ptr<ObjectStore>>();
  return *stores;
}

}  // namespace

std::string md5_hex(std::string_view data) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  EVP_Digest(data.data(), data.size(), digest, &n, EVP_md5(), nullptr);
  std::string out;
  char buf[3];
  for (unsigned int i = 0; i < n; ++i) {
    std::snprintf(buf, sizeof(buf), "%02x", digest[i]);
    out += buf;
  }
  return out;
}

std::shared_ptr<ObjectStore> s3_object_store(const S3Config& config, const std::string& bucket) {
  return std::make_shared<S3Store>(config, bucket);
}

Result<std::shared_ptr<ObjectStore>> object_store_for(const std::string& url) {
  DISTCKPT_ASSIGN_OR_RETURN(S3Url parsed, parse_s3_url(url));
  std::lock_guard<std::mutex> lock(registry_mu);
  auto& stores = registry();
  if (auto it = stores.find(parsed.bucket); it != stores.end()) return it->second;
  DISTCKPT_ASSIGN_OR_RETURN(S3Config config, s3_config_from_environment());
  auto store = s3_object_store(config, parsed.bucket);
  stores[parsed.bucket] = store;
  return store;
}

void register_object_store(const std::string& bucket, std::shared_ptr<ObjectStore> store) {
  std::lock_guard<std::mutex> lock(registry_mu);
  if (store) registry()[bucket] = std::move(store);
  else registry().erase(bucket);
}

}  // namespace distckpt::internal_storage
