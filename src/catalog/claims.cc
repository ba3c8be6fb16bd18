#include "catalog/claims.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <optional>
#include <thread>

#include "base/kill_point.h"
#include "catalog/listing.h"
#include "catalog/names.h"
#include "catalog/object_root.h"
#include "catalog/owner.h"
#include "format/native/index_codec.h"

namespace distckpt::internal_catalog {

namespace {

std::string series_dir(const std::string& root) { return root + "/" + kMetaDir + "/series"; }

// How long a save waits for another job's claim or pointer update (both take
// milliseconds; a holder that died is seen by its silence, kLockSilenceSeconds, first).
constexpr double kLockTimeout = 30;

// A claim directory with this process's owner record (and the job id) in it.
Status make_claim(FileSystem& fs, const std::string& path, const std::string& job_id) {
  OwnerRecord me = OwnerRecord::self();
  if (!job_id.empty()) me.slurm_job_id = job_id;
  // An object root: the record's create (If-None-Match: *) is the claim.
  if (is_object_root(path)) return create_object(path + "/" + kOwnerFile, me.to_json());
  DISTCKPT_RETURN_IF_ERROR(fs.create_dir(path));
  Status st = write_owner(fs, path, me);
  if (!st.ok()) (void)fs.remove_all(path);
  return st;
}

// A lock directory with this process's owner record, not fsynced (a lock lives for a
// few file operations); `*record` gets the record's text. kAlreadyExists when held, or
// when the new directory was moved aside before its record was in (a waiter judged it
// abandoned): then it is not this process's to remove, and the caller tries again.
Status make_lock(FileSystem& fs, const std::string& path, std::string* record) {
  DISTCKPT_RETURN_IF_ERROR(fs.create_dir(path));
  const OwnerRecord me = OwnerRecord::self();
  Status st = write_owner(fs, path, me, /*sync=*/false);
  if (st.ok()) {
    *record = me.to_json();
    return st;
  }
  if (!fs.exists(path)) return already_exists("lock '" + path + "' was moved aside as it was made");
  // Not removed: the directory at `path` may be a new holder's by now. Without a record
  // or a heartbeat it is broken by the next waiter after the silence.
  return st;
}

// A lock's owner record as written (compared as text: the holder knows its own).
Result<std::string> read_owner_text(FileSystem& fs, const std::string& lock) {
  return read_whole_file(fs, lock + "/" + kOwnerFile, 4096);
}

// What a waiter watches of a held lock, read afresh: its owner's record and heartbeat.
// Either changes while the holder is alive (a new holder, a new beat).
struct LockSign {
  std::string owner;  // "" when there is no record (yet)
  std::string beat;
  bool operator==(const LockSign&) const = default;
};
LockSign read_lock_sign(FileSystem& fs, const std::string& path) {
  LockSign sign;
  if (auto owner = read_owner_text(fs, path); owner.ok()) sign.owner = *owner;
  if (auto beat = read_whole_file(fs, path + "/" + kHeartbeatFile, 256); beat.ok()) sign.beat = *beat;
  return sign;
}

// Breaks the lock at `path` whose owner record was `stale_owner` when it was judged
// abandoned: renamed aside first (one waiter wins the rename), then removed, but only
// if what was renamed is that lock. Another (a new holder took the lock in between) is
// put back when nothing took its place, else left aside: never removed, and that
// holder's still_held() fails before it publishes anything.
void break_lock(FileSystem& fs, const std::string& path, const std::string& stale_owner) {
  const std::string aside = make_tmp_name(path.substr(0, path.rfind('/')), path.substr(path.rfind('/') + 1) + ".broken");
  if (!fs.rename_no_replace(path, aside).ok()) return;  // gone already, or another waiter's
  auto owner = read_owner_text(fs, aside);
  const std::string found = owner.ok() ? *owner : std::string();
  if (found == stale_owner) {
    (void)fs.remove_all(aside);
    return;
  }
  (void)fs.rename_no_replace(aside, path);
}

}  // namespace

Result<uint64_t> claim_commit_seq(FileSystem& fs, const std::string& root) {
  DISTCKPT_ASSIGN_OR_RETURN(auto lock, RootLock::acquire(fs, root, "seq", kLockTimeout));
  internal_base::kill_point("seq-locked");  // a host dying here leaves the lock to the next job
  const std::string counter = root + "/" + kMetaDir + "/seq";
  uint64_t next = next_commit_seq(fs, root);
  if (auto text = read_whole_file(fs, counter, 64); text.ok()) {
    try {
      // A damaged counter (or one at the last number, or past it): the checkpoints
      // themselves say how far the numbers went, so that only a checkpoint can exhaust them.
      const uint64_t counted = std::stoull(*text);
      if (counted < internal_format::kCommitSeqLimit - 1) next = std::max<uint64_t>(next, counted + 1);
    } catch (const std::exception&) {
    }
  }
  // Only where a checkpoint holds the highest number a reader accepts (a forged one): no
  // save may take a number its own checks would refuse.
  if (next >= internal_format::kCommitSeqLimit)
    return corruption("root '" + root + "': commit numbers are exhausted (a checkpoint holds " +
                      std::to_string(next - 1) + ")");
  const std::string tmp = make_owned_tmp_name(root + "/" + kMetaDir, "seq");
  Status st = write_file_synced(fs, tmp, std::to_string(next) + "\n");
  if (st.ok()) st = lock->still_held();
  if (st.ok()) st = fs.rename(tmp, counter);
  if (!st.ok()) {
    (void)fs.remove_file(tmp);
    return st;
  }
  return next;
}

Result<std::string> claim_series(FileSystem& fs, const std::string& root, const std::string& base,
                                 const std::string& job_id,
                                 const std::function<bool(const std::string&)>& has_checkpoints) {
  DISTCKPT_RETURN_IF_ERROR(fs.create_dirs(series_dir(root)));
  auto prefix_n = [&](int n) { return n == 0 ? base : base + "_" + std::to_string(n); };
  if (!job_id.empty()) {
    for (int n = 0; n < 1000; ++n) {
      auto owner = read_owner(fs, series_dir(root) + "/" + prefix_n(n));
      if (owner.ok() && owner->slurm_job_id == job_id) return prefix_n(n);
    }
  }
  for (int n = 0; n < 100000; ++n) {
    const std::string prefix = prefix_n(n);
    if (has_checkpoints(prefix)) continue;
    Status st = make_claim(fs, series_dir(root) + "/" + prefix, job_id);
    if (st.code() == StatusCode::kAlreadyExists) continue;
    DISTCKPT_RETURN_IF_ERROR(st);
    return prefix;
  }
  return aborted("claim a series prefix in '" + root + "': every candidate of '" + base + "' is taken");
}

Status adopt_series(FileSystem& fs, const std::string& root, const std::string& prefix, const std::string& job_id) {
  DISTCKPT_RETURN_IF_ERROR(fs.create_dirs(series_dir(root)));
  const std::string path = series_dir(root) + "/" + prefix;
  OwnerRecord me = OwnerRecord::self();
  if (!job_id.empty()) me.slurm_job_id = job_id;
  Status st = is_object_root(path) ? Status() : fs.create_dir(path);
  if (!st.ok() && st.code() != StatusCode::kAlreadyExists) return st;
  return write_owner(fs, path, me);
}

void release_series(FileSystem& fs, const std::string& root, const std::string& prefix) {
  (void)fs.remove_all(series_dir(root) + "/" + prefix);
}

Result<std::unique_ptr<RootLock>> RootLock::acquire(FileSystem& fs, const std::string& root, const std::string& what,
                                                    double timeout_s, double silence_s) {
  using Clock = std::chrono::steady_clock;
  DISTCKPT_RETURN_IF_ERROR(fs.create_dirs(root + "/" + kMetaDir));
  const std::string path = root + "/" + kMetaDir + "/" + what + ".lock";
  const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s);
  // The remote holder's last sign of life as this waiter saw it, since when, and when
  // the waiter last looked: silence counts only while the waiter itself was looking.
  std::optional<LockSign> seen;
  auto seen_since = Clock::now();
  auto looked = Clock::now();
  auto next_look = Clock::now();
  const auto look_gap = std::chrono::duration<double>(2 * kLockBeatSeconds);
  while (true) {
    std::string record;
    Status st = make_lock(fs, path, &record);
    if (st.ok()) return std::unique_ptr<RootLock>(new RootLock(fs, path, std::move(record)));
    if (st.code() != StatusCode::kAlreadyExists) return st;
    // Held: by a live process (wait), or by one that died holding it (break it).
    // (One read: the record judged is the record broken, never a later holder's.)
    auto owner_text = read_owner_text(fs, path);
    auto owner = owner_text.ok() ? OwnerRecord::from_json(*owner_text) : Result<OwnerRecord>(owner_text.status());
    if (owner.ok() && owner->is_local() && owner->local_process_gone()) {
      break_lock(fs, path, *owner_text);
      continue;
    }
    const auto now = Clock::now();
    // A holder on this host that still runs is never broken (it may be freeing files).
    // Another host's is watched a few times per heartbeat (reads, not a busy loop).
    const bool live_here = owner.ok() && owner->is_local();
    if (!live_here && now >= next_look) {
      LockSign sign = read_lock_sign(fs, path);
      const auto after = Clock::now();
      next_look = after + std::chrono::milliseconds(200);
      // This waiter stopped, or its reads hung (the holder's beats may be stuck behind
      // the same file system): the time it could not look is no one's silence.
      const bool blind = after - looked > look_gap || after - now > look_gap;
      looked = after;
      if (!seen || sign != *seen || blind) {
        seen = std::move(sign);
        seen_since = after;
      } else if (std::chrono::duration<double>(after - seen_since).count() > silence_s) {
        std::fprintf(stderr, "distckpt: broke the lock %s: its owner (%s) showed no sign of life for %g s\n",
                     path.c_str(), owner.ok() ? (owner->hostname + " pid " + std::to_string(owner->pid)).c_str() : "unknown",
                     silence_s);
        break_lock(fs, path, seen->owner);
        seen.reset();
        continue;
      }
    }
    if (now > deadline)
      return aborted("the lock on " + what + " of '" + root + "' (" + path + ") stayed held for " +
                     std::to_string(static_cast<int>(timeout_s)) + " s" +
                     (live_here ? " by a live process on this host (pid " + std::to_string(owner->pid) + ")" : ""));
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

RootLock::RootLock(FileSystem& fs, std::string path, std::string owner_text)
    : fs_(fs), path_(std::move(path)), owner_text_(std::move(owner_text)) {
  // It beats while the lock is its own, never into a successor's: a record that cannot
  // be read skips one beat; another's record ends the beating for good.
  heartbeat_ = std::make_unique<Heartbeat>(fs_, path_, kLockBeatSeconds, [this] {
    if (lost_.load()) return false;
    auto owner = read_owner_text(fs_, path_);
    if (!owner.ok()) return false;  // this beat only
    if (*owner != owner_text_) lost_.store(true);
    return !lost_.load();
  });
}

RootLock::~RootLock() {
  heartbeat_.reset();
  // Removed only while it is still ours: a broken lock may be another holder's now. A
  // record that cannot be read is tried again; still unreadable, the lock is left (its
  // beats have stopped: any waiter, on this host too, breaks it after the silence).
  if (lost_.load()) return;
  for (int attempt = 0; attempt < 3; ++attempt) {
    if (attempt > 0) std::this_thread::sleep_for(std::chrono::milliseconds(50 * attempt));
    auto owner = read_owner_text(fs_, path_);
    if (owner.ok()) {
      if (*owner == owner_text_) (void)fs_.remove_all(path_);
      return;
    }
    if (!fs_.exists(path_ + "/" + kOwnerFile)) return;  // gone, or a new holder's in the making
  }
  std::fprintf(stderr, "distckpt: lock %s: its record could not be read; left for the next waiter to break\n",
               path_.c_str());
}

Status RootLock::still_held() const {
  auto owner = read_owner_text(fs_, path_);
  if (owner.ok() && *owner == owner_text_) return Status();
  if (!owner.ok() && fs_.exists(path_ + "/" + kOwnerFile)) return owner.status().with_context("lock " + path_);
  return aborted("the lock " + path_ + " was broken while held: this process showed no sign of life for " +
                 std::to_string(static_cast<int>(kLockSilenceSeconds)) + " s (stopped, or its file system hung)");
}

}  // namespace distckpt::internal_catalog
