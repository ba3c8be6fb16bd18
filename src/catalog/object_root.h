// The root protocol on an object store (s3://bucket/prefix), where nothing can be renamed
// and nothing appended to: the second implementation of what commit.cc, claims.h and
// owner.h do on a file system, by conditional writes (storage/object_store.h).
//
// An object root holds:
//   <name>/index.pb               the checkpoint's index. Its create IS the commit: one
//                                 PUT with If-None-Match: *, made by rank 0 after every
//                                 rank's data objects are complete. A name exists iff
//                                 its index does; two saves of one name cannot both win.
//   <name>/s-<16 hex>/...         one save's data objects (data-<rank>.bin, uploaded by
//                                 each rank in parallel, multipart when large), under a
//                                 prefix no other save produces, so that a losing save of
//                                 the same name never touches the winner's bytes. The
//                                 index names them "s-<id>/data-<rank>.bin".
//   <name>/s-<id>/.distckpt-owner.json, .distckpt-heartbeat
//                                 the save's owner record, and the heartbeat its owner
//                                 rewrites (owner.h) while it runs: a collector judges
//                                 the heartbeat's Last-Modified against the store's own
//                                 clock (a response's Date), never a host's.
//   latest                        the newest checkpoint's name, moved forward only, by
//                                 compare-and-swap: read it (its ETag), check that its
//                                 target's commit sequence is below ours, PUT with
//                                 If-Match: <ETag> (If-None-Match: * when absent); a 412
//                                 means another commit moved it: read again.
//   .distckpt/seq                 the commit counter, moved by the same compare-and-swap.
//   .distckpt/locks/<what>        root locks (ObjectRootLock).
//   .distckpt/stats/<name>.json   a save's statistics (no appends: one object per save).
//   .distckpt/probe-<hex>         the start-up probe's object, removed after it.
#pragma once

#include <memory>
#include <string>

#include "catalog/commit.h"
#include "distckpt/status.h"
#include "storage/object_store.h"

namespace distckpt::internal_catalog {

// Whether `root` is an object root (s3://...).
bool is_object_root(const std::string& root);

// Checks once per root and process that its store enforces the two conditions the
// protocol relies on: a second create of one key fails (If-None-Match: *), and a replace
// with a stale ETag fails (If-Match). A store that does not is refused (kUnsupported,
// naming the store and the condition), unless DISTCKPT_S3_UNSAFE_NO_CONDITIONS=1, which
// is logged on stderr. Errors of the store.
Status probe_object_root(const std::string& root);

// begin_entry for an object root: probes it, refuses a taken name (kAlreadyExists),
// claims a commit sequence number, and writes the save's owner record under a fresh
// s-<id>/ prefix, which becomes entry.tmp (where the ranks write their data objects);
// entry.data_dir is "s-<id>". Starts the heartbeat when `fs_owner` is given.
Result<Entry> begin_object_entry(FileSystem& fs, const std::string& root, const std::string& name,
                                 const std::string& who, std::shared_ptr<FileSystem> fs_owner);
// finish_entry for an object root: creates <name>/index.pb from `index` (whose data file
// names carry entry.data_dir) with If-None-Match: *, then moves `latest` when asked. A
// name taken meanwhile is kAlreadyExists, and this save's objects are removed.
Result<CommitResult> commit_object_entry(FileSystem& fs, const Entry& entry, const proto::Index& index,
                                         bool update_latest);

// Creates the object at `path` (s3://...) holding `text` if no object is there
// (If-None-Match: *): kAlreadyExists when one is. A claim of an object root (claims.h).
Status create_object(const std::string& path, const std::string& text);

// A fresh commit sequence number of an object root: the counter .distckpt/seq moved by
// compare-and-swap (at most 1000 tries, then kAborted).
Result<uint64_t> claim_object_seq(internal_storage::ObjectStore& store, const std::string& root);
// Moves `latest` of an object root to `name` unless it names a checkpoint with a higher
// commit sequence number; compare-and-swap as above.
Status move_object_latest(internal_storage::ObjectStore& store, const std::string& root, const std::string& name, uint64_t commit_seq);

// Removes checkpoint `name` of an object root: its index first (from then on it is not a
// checkpoint), then its data objects. kNotFound without an index.
Status remove_object_checkpoint(const std::string& root, const std::string& name);

// A lock on something of an object root, for work that must not run twice at once.
// Taking it is a create of .distckpt/locks/<what> with If-None-Match: *, holding a record
// (owner, a random token, a count). The holder rewrites it every kLockBeatSeconds with
// If-Match: <its last ETag>; a 412 there means it was broken, and the lock is lost.
// S3 has no conditional delete, so a lock is never deleted: it is released by a replace
// (If-Match: <own ETag>) with a "free" record, and broken by a replace with If-Match: <the
// ETag a waiter saw unchanged for the silence (kObjectLockSilenceSeconds), by the store's clock>. Two waiters breaking
// at once both replace the same ETag: one wins, the other gets 412 and waits again; a
// holder that beats meanwhile changes the ETag and both breakers fail. So a lock has one
// holder at a time without ever comparing hosts' clocks.
// A holder's beat is one PUT, which may retry for a while when the store throttles: a
// waiter waits this long (by the store's clock) for a record to change before breaking it.
inline constexpr double kObjectLockSilenceSeconds = 30;

class ObjectRootLock {
 public:
  static Result<std::unique_ptr<ObjectRootLock>> acquire(std::shared_ptr<internal_storage::ObjectStore> store, const std::string& root,
                                                         const std::string& what, double timeout_s,
                                                         double silence_s = kObjectLockSilenceSeconds);
  ~ObjectRootLock();
  ObjectRootLock(const ObjectRootLock&) = delete;
  ObjectRootLock& operator=(const ObjectRootLock&) = delete;
  // OK while the lock is this one's (its last beat found its own record in place).
  Status still_held() const;

 private:
  struct State;
  explicit ObjectRootLock(std::shared_ptr<State> state);
  std::shared_ptr<State> state_;
};

}  // namespace distckpt::internal_catalog
