#include "catalog/object_root.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include "base/kill_point.h"
#include "base/strings.h"
#include "catalog/claims.h"
#include "catalog/gc.h"
#include "catalog/listing.h"
#include "catalog/names.h"
#include "catalog/owner.h"
#include "format/native/index_codec.h"
#include "storage/object_fs.h"
#include "storage/s3_store.h"

namespace distckpt::internal_catalog {
namespace {

using internal_format::kIndexFileName;
using internal_storage::ObjectStore;
using internal_storage::PutCondition;

constexpr int kMaxSwaps = 1000;

// The key of `relative` in the object root `root` (its prefix, then the name).
std::string key_in(const std::string& root, const std::string& relative) {
  const std::string prefix = internal_storage::object_key(root);
  return prefix.empty() ? relative : prefix + "/" + relative;
}

void short_pause(int attempt) {
  thread_local std::minstd_rand jitter(std::random_device{}());
  const int cap_ms = std::min(200, 5 << std::min(attempt, 5));
  std::this_thread::sleep_for(std::chrono::milliseconds(std::uniform_int_distribution<int>(1, cap_ms)(jitter)));
}

bool unsafe_allowed() {
  const char* v = std::getenv("DISTCKPT_S3_UNSAFE_NO_CONDITIONS");
  return v != nullptr && *v != '\0' && std::string(v) != "0";
}

Status probe_conditions(ObjectStore& store, const std::string& root) {
  const std::string key = key_in(root, std::string(kMetaDir) + "/probe-" + make_save_dir());
  const std::string where = "object root '" + root + "' (" + store.describe() + ")";
  PutCondition create;
  create.create_only = true;
  DISTCKPT_ASSIGN_OR_RETURN(std::string etag, store.put(key, "probe 1\n", create));
  std::string failure;
  auto second = store.put(key, "probe 2\n", create);
  if (second.ok()) failure = "a second create of one key succeeded (If-None-Match: * is not enforced)";
  else if (second.status().code() != StatusCode::kAlreadyExists) failure = second.status().to_string();
  if (failure.empty()) {
    PutCondition current;  // a swap with the current ETag must succeed, or every swap spins
    current.if_match = etag;
    auto swapped = store.put(key, "probe 2b\n", current);
    if (!swapped.ok()) failure = "a replace with the current ETag failed (If-Match): " + swapped.status().to_string();
  }
  if (failure.empty()) {
    PutCondition stale;
    stale.if_match = "0123456789abcdef0123456789abcdef";
    auto swapped = store.put(key, "probe 3\n", stale);
    if (swapped.ok()) failure = "a replace with a stale ETag succeeded (If-Match is not enforced)";
    else if (swapped.status().code() != StatusCode::kAborted) failure = swapped.status().to_string();
  }
  (void)store.remove(key);
  if (failure.empty()) return Status();
  if (unsafe_allowed()) {
    std::fprintf(stderr,
                 "distckpt: WARNING: %s: %s; committing anyway because DISTCKPT_S3_UNSAFE_NO_CONDITIONS is set: two "
                 "saves of one name can both commit, and `latest` can move back\n",
                 where.c_str(), failure.c_str());
    return Status();
  }
  return unsupported(where + ": the store does not enforce conditional writes: " + failure +
                     "; distckpt commits by them and refuses such a store (DISTCKPT_S3_UNSAFE_NO_CONDITIONS=1 "
                     "overrides, unsafely)");
}

// The commit sequence number of checkpoint `name` of the root: 0 when it has no index or
// a damaged one (`latest` may then move past it); errors of the store (a transient one
// must not let `latest` move back).
Result<uint64_t> commit_seq_of(ObjectStore& store, const std::string& root, const std::string& name) {
  auto bytes = store.get(key_in(root, name + "/" + kIndexFileName), nullptr, uint64_t{1} << 30);
  if (!bytes.ok() && bytes.status().code() == StatusCode::kNotFound) return uint64_t{0};
  if (!bytes.ok()) return bytes.status();
  auto index = internal_format::parse_index(*bytes, root + "/" + name + "/" + kIndexFileName);
  return index.ok() ? index->commit_seq() : uint64_t{0};
}

}  // namespace

bool is_object_root(const std::string& root) { return internal_storage::is_object_path(root); }

Status probe_object_root(const std::string& root) {
  static std::mutex mu;
  static auto* probed = new std::set<std::string>();
  {
    std::lock_guard<std::mutex> lock(mu);
    if (probed->count(root)) return Status();
  }
  DISTCKPT_ASSIGN_OR_RETURN(std::shared_ptr<ObjectStore> store, internal_storage::object_store_for(root));
  DISTCKPT_RETURN_IF_ERROR(probe_conditions(*store, root));
  std::lock_guard<std::mutex> lock(mu);
  probed->insert(root);
  return Status();
}

Status create_object(const std::string& path, const std::string& text) {
  DISTCKPT_ASSIGN_OR_RETURN(std::shared_ptr<ObjectStore> store, internal_storage::object_store_for(path));
  PutCondition create;
  create.create_only = true;
  return store->put(internal_storage::object_key(path), text, create).status();
}

Result<uint64_t> claim_object_seq(ObjectStore& store, const std::string& root) {
  const std::string key = key_in(root, std::string(kMetaDir) + "/seq");
  for (int attempt = 0; attempt < kMaxSwaps; ++attempt) {
    std::string etag;
    auto text = store.get(key, &etag, 64);
    if (!text.ok() && text.status().code() != StatusCode::kNotFound) return text.status();
    uint64_t current = 0;
    if (text.ok()) {
      char* end = nullptr;
      current = std::strtoull(text->c_str(), &end, 10);
      if (end == text->c_str() || current >= internal_format::kCommitSeqLimit)
        return corruption("'" + root + "/" + kMetaDir + "/seq': not a commit counter");
    }
    // A random tail makes every write's bytes (hence its ETag) new, so that a swap never
    // succeeds against an equal-looking later version.
    const std::string next = std::to_string(current + 1) + " " + make_save_dir() + "\n";
    PutCondition condition;
    if (text.ok()) condition.if_match = etag;
    else condition.create_only = true;
    auto put = store.put(key, next, condition);
    if (put.ok()) return current + 1;
    const StatusCode c = put.status().code();
    if (c != StatusCode::kAborted && c != StatusCode::kAlreadyExists) return put.status();
    short_pause(attempt);  // another save took a number: read again
  }
  return aborted("'" + root + "/" + kMetaDir + "/seq': " + std::to_string(kMaxSwaps) +
                 " tries to move the commit counter all lost to other saves");
}

Status move_object_latest(ObjectStore& store, const std::string& root, const std::string& name, uint64_t commit_seq) {
  const std::string key = key_in(root, kLatestFileName);
  for (int attempt = 0; attempt < kMaxSwaps; ++attempt) {
    std::string etag;
    auto text = store.get(key, &etag, kMaxLatestBytes);
    if (!text.ok() && text.status().code() != StatusCode::kNotFound) return text.status();
    PutCondition condition;
    if (text.ok()) {
      const std::string current = parse_latest_pointer(*text);
      if (current == name) return Status();
      if (!current.empty()) {
        DISTCKPT_ASSIGN_OR_RETURN(uint64_t theirs, commit_seq_of(store, root, current));
        if (theirs > commit_seq) return Status();  // a later save's
      }
      condition.if_match = etag;
    } else {
      condition.create_only = true;
    }
    auto put = store.put(key, name + "\n", condition);
    if (put.ok()) return Status();
    const StatusCode c = put.status().code();
    if (c != StatusCode::kAborted && c != StatusCode::kAlreadyExists) return put.status();
    short_pause(attempt);
  }
  return aborted("'" + root + "/latest': " + std::to_string(kMaxSwaps) + " tries to move it all lost to other saves");
}

Result<Entry> begin_object_entry(FileSystem& fs, const std::string& root, const std::string& name,
                                 const std::string& who, std::shared_ptr<FileSystem> fs_owner) {
  DISTCKPT_RETURN_IF_ERROR(validate_checkpoint_name(name).with_context(who));
  DISTCKPT_RETURN_IF_ERROR(probe_object_root(root).with_context(who));
  DISTCKPT_ASSIGN_OR_RETURN(std::shared_ptr<ObjectStore> store, internal_storage::object_store_for(root));
  auto index = store->head(key_in(root, name + "/" + kIndexFileName));
  if (index.ok()) return already_exists(who + ": checkpoint '" + root + "/" + name + "' already exists");
  if (index.status().code() != StatusCode::kNotFound) return index.status().with_context(who);
  auto seq = claim_object_seq(*store, root);
  if (!seq.ok()) return seq.status().with_context(who);
  Entry entry;
  entry.root = root;
  entry.name = name;
  entry.path = root + "/" + name;
  entry.directory = true;
  entry.commit_seq = *seq;
  entry.data_dir = make_save_dir();
  entry.tmp = entry.path + "/" + entry.data_dir;
  if (Status st = write_owner(fs, entry.tmp, OwnerRecord::self()); !st.ok()) return st.with_context(who);
  if (fs_owner) entry.heartbeat = std::make_shared<Heartbeat>(std::move(fs_owner), entry.tmp);
  return entry;
}

Result<CommitResult> commit_object_entry(FileSystem& fs, const Entry& entry, const proto::Index& index,
                                         bool update_latest) {
  if (entry.heartbeat) entry.heartbeat->stop();
  for (const auto& f : index.files())
    if (f.checkpoint().empty() && f.name().rfind(entry.data_dir + "/", 0) != 0)
      return internal_error("commit: data file '" + f.name() + "' is not under the save's prefix '" + entry.data_dir +
                            "' (name_files_under_entry)");
  CommitResult result;
  const std::string framed = internal_format::frame_index(index);
  result.index_bytes = framed.size();
  const std::string index_path = entry.path + "/" + kIndexFileName;
  Status readable = internal_format::parse_index(framed, index_path).status();
  if (!readable.ok()) return internal_error("commit: the index would not be readable: " + readable.to_string());
  DISTCKPT_ASSIGN_OR_RETURN(std::shared_ptr<ObjectStore> store, internal_storage::object_store_for(entry.root));
  internal_base::kill_point("create_index_pb");
  PutCondition create;
  create.create_only = true;
  const std::string index_key = key_in(entry.root, entry.name + "/" + kIndexFileName);
  auto committed = store->put(index_key, framed, create);
  if (!committed.ok() && committed.status().code() == StatusCode::kAlreadyExists) {
    // Another save's index (put() compared the bytes): ours is garbage.
    discard_entry(fs, entry);
    return already_exists("commit: checkpoint '" + entry.path + "' was committed by another save meanwhile");
  }
  if (!committed.ok()) {
    // The PUT may have landed with its answer lost: the index in place decides. Only an
    // index that is surely absent lets this save's objects go; if it cannot be told, they
    // stay (gc collects them once their owner is gone, unless an index names them).
    auto there = store->get(index_key, nullptr, framed.size());
    if (there.ok() && *there == framed) {
      committed = std::string();  // ours: committed after all
    } else {
      if (!there.ok() && there.status().code() == StatusCode::kNotFound) discard_entry(fs, entry);
      return committed.status().with_context("commit: '" + index_path + "'");
    }
  }
  // Committed. The owner record is garbage from here (a crash leaves it, harmless).
  internal_base::kill_point("object-latest");  // committed, `latest` not yet moved
  (void)fs.remove_file(entry.tmp + "/" + kHeartbeatFile);
  (void)fs.remove_file(entry.tmp + "/" + kOwnerFile);
  if (update_latest) {
    Status st = move_object_latest(*store, entry.root, entry.name, entry.commit_seq);
    if (!st.ok())
      result.warning = "checkpoint '" + entry.path + "' is committed but the latest pointer was not moved: " +
                       st.to_string();
  }
  return result;
}

Result<std::vector<Candidate>> object_saves_in_flight(FileSystem& fs, const std::string& root,
                                                      std::vector<std::string>* warnings) {
  std::vector<Candidate> out;
  DISTCKPT_ASSIGN_OR_RETURN(auto names, fs.list_dir(root));
  for (const auto& n : names) {
    if (!n.is_dir || n.name.rfind(kMetaDir, 0) == 0) continue;
    const std::string dir = root + "/" + n.name;
    std::set<std::string> committed;  // the save prefixes the index names
    auto bytes = read_whole_file(fs, dir + "/" + kIndexFileName, uint64_t{1} << 30);
    if (!bytes.ok() && bytes.status().code() != StatusCode::kNotFound) {
      // Unreadable now (throttled, refused): whether a save committed cannot be told.
      if (warnings) warnings->push_back("gc: '" + dir + "' skipped: " + bytes.status().to_string());
      continue;
    }
    if (bytes.ok()) {
      auto index = internal_format::parse_index(*bytes, dir + "/" + kIndexFileName);
      if (!index.ok()) continue;  // damaged: listed as broken, never collected here
      for (const auto& f : index->files())
        if (const std::size_t slash = f.name().find('/'); slash != std::string::npos)
          committed.insert(f.name().substr(0, slash));
    }
    DISTCKPT_ASSIGN_OR_RETURN(auto saves, fs.list_dir(dir));
    for (const auto& s : saves)
      if (s.is_dir && internal_format::valid_save_dir(s.name) && !committed.count(s.name))
        out.push_back({dir + "/" + s.name, n.name + "/" + s.name, s.name, true});
  }
  return out;
}

Result<std::vector<GcEntry>> abort_stale_uploads(const std::string& root, double lease_s, bool dry_run) {
  DISTCKPT_ASSIGN_OR_RETURN(std::shared_ptr<ObjectStore> store, internal_storage::object_store_for(root));
  const std::string prefix = internal_storage::object_key(root);
  DISTCKPT_ASSIGN_OR_RETURN(auto uploads, store->list_uploads(prefix.empty() ? "" : prefix + "/"));
  std::vector<GcEntry> out;
  if (uploads.empty()) return out;
  DISTCKPT_ASSIGN_OR_RETURN(int64_t now_ms, store->now_ms());
  for (const auto& u : uploads) {
    const double age_s = u.initiated_ms < 0 ? -1 : static_cast<double>(now_ms - u.initiated_ms) / 1000;
    if (age_s < lease_s) continue;  // unknown or recent: a writer may be sending its parts
    const std::string shown = u.key.substr(std::min(u.key.size(), prefix.empty() ? 0 : prefix.size() + 1));
    if (!dry_run) DISTCKPT_RETURN_IF_ERROR(store->abort_upload(u.key, u.upload_id));
    internal_base::kill_point("gc-aborting");
    out.push_back(GcEntry{shown + " (incomplete upload)",
                          "begun " + std::to_string(static_cast<int64_t>(age_s)) + " s ago by the store's clock, past "
                          "the lease of " + std::to_string(static_cast<int64_t>(lease_s)) + " s",
                          !dry_run});
  }
  return out;
}

Status remove_object_checkpoint(const std::string& root, const std::string& name) {
  DISTCKPT_RETURN_IF_ERROR(validate_checkpoint_name(name));
  DISTCKPT_ASSIGN_OR_RETURN(std::shared_ptr<ObjectStore> store, internal_storage::object_store_for(root));
  // One removal at a time per root (two jobs' retention passes may pick the same one).
  DISTCKPT_ASSIGN_OR_RETURN(auto lock, ObjectRootLock::acquire(store, root, "remove", 30));
  const std::string index_key = key_in(root, name + "/" + kIndexFileName);
  auto head = store->head(index_key);
  if (!head.ok() && head.status().code() == StatusCode::kNotFound)
    return not_found("remove: '" + root + "/" + name + "' is not a committed checkpoint");
  if (!head.ok()) return head.status();
  // Only the save prefixes its index names: a new save of the name may be writing its own.
  std::set<std::string> save_dirs;
  if (auto bytes = store->get(index_key); bytes.ok())
    if (auto index = internal_format::parse_index(*bytes, root + "/" + name + "/" + kIndexFileName); index.ok())
      for (const auto& f : index->files())
        if (const std::size_t slash = f.name().find('/'); slash != std::string::npos)
          save_dirs.insert(f.name().substr(0, slash));
  DISTCKPT_RETURN_IF_ERROR(lock->still_held());
  DISTCKPT_RETURN_IF_ERROR(store->remove(index_key));  // no longer a checkpoint
  for (const std::string& dir : save_dirs) {
    if (!internal_format::valid_save_dir(dir)) continue;
    DISTCKPT_ASSIGN_OR_RETURN(auto listing, store->list(key_in(root, name + "/" + dir + "/")));
    for (const auto& [key, info] : listing.objects) DISTCKPT_RETURN_IF_ERROR(store->remove(key));
  }
  return Status();
}

}  // namespace distckpt::internal_catalog

namespace distckpt::internal_catalog {

struct ObjectRootLock::State {
  std::shared_ptr<ObjectStore> store;
  std::string key, token, etag;  // etag: of this holder's last write
  uint64_t beats = 0;
  std::atomic<bool> lost{false};
  std::mutex mu;
  std::condition_variable cv;
  bool stopping = false;
  std::thread beater;

  std::string record() const { return "held " + token + " by " + OwnerRecord::self().to_json() + " beat " + std::to_string(beats) + "\n"; }
  // One beat: the record rewritten over this holder's own last version only.
  void beat() {
    ++beats;
    PutCondition mine;
    mine.if_match = etag;
    auto put = store->put(key, record(), mine);
    if (put.ok()) etag = *put;
    else if (put.status().code() == StatusCode::kAborted) lost = true;  // broken by a waiter
  }
};

Result<std::unique_ptr<ObjectRootLock>> ObjectRootLock::acquire(std::shared_ptr<ObjectStore> store,
                                                                 const std::string& root, const std::string& what,
                                                                 double timeout_s, double silence_s) {
  using Clock = std::chrono::steady_clock;
  auto state = std::make_shared<State>();
  state->store = store;
  state->key = key_in(root, std::string(kMetaDir) + "/locks/" + what);
  state->token = make_save_dir();
  const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s);
  std::string seen_etag;  // the holder's version as last seen, and since when (the store's clock)
  int64_t seen_since_ms = 0;
  for (int attempt = 0;; ++attempt) {
    PutCondition create;
    create.create_only = true;
    auto put = store->put(state->key, state->record(), create);
    if (!put.ok() && put.status().code() != StatusCode::kAlreadyExists) return put.status();
    if (!put.ok()) {
      std::string etag;
      auto text = store->get(state->key, &etag, 64 << 10);
      if (!text.ok() && text.status().code() != StatusCode::kNotFound) return text.status();
      if (text.ok()) {
        DISTCKPT_ASSIGN_OR_RETURN(int64_t now_ms, store->now_ms());
        if (etag != seen_etag) seen_etag = etag, seen_since_ms = now_ms;
        const bool free = internal_base::starts_with(*text, "free ");
        // A free record is taken, a silent one broken, both by a replace of the very version
        // judged: of two takers, one wins.
        if (free || static_cast<double>(now_ms - seen_since_ms) >= silence_s * 1000) {
          internal_base::kill_point("object-lock-break");
          PutCondition judged;
          judged.if_match = etag;
          put = store->put(state->key, state->record(), judged);
          if (!put.ok() && put.status().code() != StatusCode::kAborted) return put.status();
          if (put.ok() && !free)
            std::fprintf(stderr, "distckpt: broke the lock '%s' of %s: its holder was silent for %.0f s\n",
                         state->key.c_str(), store->describe().c_str(), silence_s);
        }
      }
    }
    if (put.ok()) {
      state->etag = *put;
      break;
    }
    if (Clock::now() > deadline)
      return aborted("lock '" + state->key + "' of " + store->describe() + ": still held after " +
                     std::to_string(static_cast<int>(timeout_s)) + " s");
    short_pause(attempt + 4);
  }
  state->beater = std::thread([s = state.get()] {
    std::unique_lock<std::mutex> lock(s->mu);
    while (!s->cv.wait_for(lock, std::chrono::duration<double>(kLockBeatSeconds), [s] { return s->stopping; }) &&
           !s->lost)
      s->beat();
  });
  return std::unique_ptr<ObjectRootLock>(new ObjectRootLock(std::move(state)));
}

ObjectRootLock::ObjectRootLock(std::shared_ptr<State> state) : state_(std::move(state)) {}

ObjectRootLock::~ObjectRootLock() {
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->stopping = true;
  }
  state_->cv.notify_all();
  if (state_->beater.joinable()) state_->beater.join();
  if (state_->lost) return;
  PutCondition mine;  // released by a replace of our own version: never a successor's
  mine.if_match = state_->etag;
  (void)state_->store->put(state_->key, "free " + state_->token + "\n", mine);
}

Status ObjectRootLock::still_held() const {
  if (state_->lost) return aborted("lock '" + state_->key + "': broken by another process (this holder was silent)");
  return Status();
}

}  // namespace distckpt::internal_catalog
