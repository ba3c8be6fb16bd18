// The object-store seam: one bucket's objects by key, with the two conditional writes a
// commit protocol needs (create-if-absent, replace-if-unchanged). The S3 client
// (s3_store.cc) and an in-memory store for tests implement it; the object file system
// (object_fs.h) and the object catalog (catalog/object_root.h) sit on it.
//
// Every call is local (no MPI), may be made from any thread, and borrows its buffers for
// the call. Errors name the bucket and key: kNotFound for a missing object (or bucket),
// kAlreadyExists when a create found the key taken, kAborted when a replace found the
// object changed (both: the store's 412), kAuthFailed for refused credentials or
// signatures, kIoError for anything else once retries ran out.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "distckpt/status.h"

namespace distckpt::internal_storage {

struct ObjectInfo {
  uint64_t size = 0;
  std::string etag;           // without quotes
  int64_t modified_ms = 0;    // the store's clock (Last-Modified: whole seconds on S3)
};

// A PUT's condition: none, If-None-Match: * (create only), or If-Match: <etag>.
struct PutCondition {
  bool create_only = false;
  std::string if_match;
};

// A multipart upload begun and neither completed nor aborted: invisible, but its parts are
// kept (and billed) by the store until aborted.
struct IncompleteUpload {
  std::string key, upload_id;
  int64_t initiated_ms = -1;  // the store's clock
};

struct ObjectListing {
  std::vector<std::pair<std::string, ObjectInfo>> objects;  // full keys, in key order
  std::vector<std::string> prefixes;  // with a delimiter: the "directories" (full, ending in it)
};

// An upload of one large object in parts (S3 multipart). Parts are numbered from 1, each
// but the last at least 5 MiB; any thread may upload a part. Nothing is visible until
// complete(); abort() (or destruction without complete) removes the parts.
class ObjectUpload {
 public:
  virtual ~ObjectUpload() = default;
  virtual Status upload_part(int number, std::string_view data) = 0;
  // Joins the parts 1..n; returns the object's ETag.
  virtual Result<std::string> complete(int parts) = 0;
  virtual void abort() = 0;
};

class ObjectStore {
 public:
  virtual ~ObjectStore() = default;
  // Stores `data` under `key` if `condition` holds; returns the new ETag. A retry after an
  // answer that never arrived is judged by the object's ETag: a create or replace that
  // finds our own bytes in place succeeded.
  virtual Result<std::string> put(const std::string& key, std::string_view data, const PutCondition& condition) = 0;
  // The whole object (refused, kCorruption, over `max_bytes`); its ETag into `etag` if given.
  virtual Result<std::string> get(const std::string& key, std::string* etag = nullptr,
                                  uint64_t max_bytes = uint64_t{1} << 30) = 0;
  // Exactly `n` bytes at `offset` into `out`; kCorruption if the object ends first.
  // With `etag` set, kAborted if the object is no longer that version.
  virtual Status get_range(const std::string& key, uint64_t offset, std::size_t n, void* out,
                           const std::string& etag = "") = 0;
  virtual Result<ObjectInfo> head(const std::string& key) = 0;
  // The keys under `prefix` (all of them, paginated); with `delimiter` ("/"), keys past
  // the next delimiter are folded into `prefixes`.
  virtual Result<ObjectListing> list(const std::string& prefix, const std::string& delimiter = "") = 0;
  // Removes `key`; a missing key is fine (S3 answers 204 either way).
  virtual Status remove(const std::string& key) = 0;
  virtual Result<std::unique_ptr<ObjectUpload>> start_upload(const std::string& key) = 0;
  // The incomplete multipart uploads of keys under `prefix` (all of them, paginated).
  virtual Result<std::vector<IncompleteUpload>> list_uploads(const std::string& prefix) = 0;
  // Aborts one (its parts are freed); an upload already gone is fine.
  virtual Status abort_upload(const std::string& key, const std::string& upload_id) = 0;
  // The store's clock now, in milliseconds since the epoch (S3: a response's Date
  // header, whole seconds): leases are judged by it, never by a host's clock.
  virtual Result<int64_t> now_ms() = 0;
  // The bucket and where it is served, for messages (never a secret).
  virtual std::string describe() const = 0;
  // The smallest part of a multipart upload; objects below it go in one put.
  virtual uint64_t part_bytes() const = 0;
};

// An in-memory store honouring conditions as S3 does (ETag: MD5 hex of the bytes; the
// clock: the host's), or ignoring them as some stores do (`enforce_conditions` false: what
// the start-up probe must refuse). Thread-safe. For tests.
std::shared_ptr<ObjectStore> memory_object_store(std::string bucket = "memory", uint64_t part_bytes = 5u << 20,
                                                 bool enforce_conditions = true);

// MD5 of `data` in hex: the ETag S3 gives an object stored by one PUT.
std::string md5_hex(std::string_view data);

}  // namespace distckpt::internal_storage
