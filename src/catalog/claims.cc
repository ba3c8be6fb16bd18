#include "catalog/claims.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <thread>

#include "base/kill_point.h"
#include "catalog/listing.h"
#include "catalog/names.h"
#include "catalog/owner.h"
#include "format/native/index_codec.h"

namespace distckpt::internal_catalog {

namespace {

std::string series_dir(const std::string& root) { return root + "/" + kMetaDir + "/series"; }

// How long a save waits for another job's claim or pointer update (both take
// milliseconds; a holder that died is seen by its silence, kLockSilenceSeconds, first).
constexpr double kLockTimeout = 30;

// A claim directory with this process's owner record (and the job id) in it; a lock's
// record is not fsynced (it lives for milliseconds). `record` (optional) gets the record.
Status make_claim(FileSystem& fs, const std::string& path, const std::string& job_id, bool durable = true,
                  std::string* record = nullptr) {
  DISTCKPT_RETURN_IF_ERROR(fs.create_dir(path));
  OwnerRecord me = OwnerRecord::self();
  if (!job_id.empty()) me.slurm_job_id = job_id;
  Status st = write_owner(fs, path, me, durable);
  if (!st.ok()) (void)fs.remove_all(path);
  if (st.ok() && record != nullptr) *record = me.to_json();
  return st;
}

// What a waiter watches of a held lock: its owner's record and heartbeat, read afresh.
// Either changes while the holder is alive (a new holder, a new beat).
std::string lock_sign_of_life(FileSystem& fs, const std::string& path) {
  std::string sign;
  if (auto owner = read_whole_file(fs, path + "/" + kOwnerFile, 4096); owner.ok()) sign = *owner;
  sign += '\n';
  if (auto beat = read_whole_file(fs, path + "/" + kHeartbeatFile, 256); beat.ok()) sign += *beat;
  return sign;
}

// Breaks the lock at `path` whose owner wrote `stale_owner`: renamed aside first (one
// waiter wins the rename), then removed. If what was renamed is another owner's (a
// new holder took the lock in between), it is put back; that holder's still_held()
// catches the moment it was away.
void break_lock(FileSystem& fs, const std::string& path, const std::string& stale_owner) {
  const std::string aside = make_tmp_name(path.substr(0, path.rfind('/')), path.substr(path.rfind('/') + 1) + ".broken");
  if (!fs.rename(path, aside).ok()) return;  // gone already, or another waiter's
  auto owner = read_whole_file(fs, aside + "/" + kOwnerFile, 4096);
  if (owner.ok() && *owner != stale_owner && fs.rename(aside, path).ok()) return;
  (void)fs.remove_all(aside);
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
  const std::string tmp = make_tmp_name(root + "/" + kMetaDir, "seq");
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
  Status st = fs.create_dir(path);
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
  // The remote holder's last sign of life as this waiter saw it, and since when.
  std::string seen;
  auto seen_since = Clock::now();
  auto next_look = Clock::now();
  while (true) {
    std::string record;
    Status st = make_claim(fs, path, "", /*durable=*/false, &record);
    if (st.ok()) return std::unique_ptr<RootLock>(new RootLock(fs, path, std::move(record)));
    if (st.code() != StatusCode::kAlreadyExists) return st;
    // Held: by a live process (wait), or by one that died holding it (break it).
    auto owner = read_owner(fs, path);
    if (owner.ok() && owner->is_local() && owner->local_process_gone()) {
      auto dead = read_whole_file(fs, path + "/" + kOwnerFile, 4096);
      break_lock(fs, path, dead.ok() ? *dead : std::string());
      continue;
    }
    const auto now = Clock::now();
    // A holder on this host that still runs is never broken (it may be freeing files).
    // Another host's is watched a few times per heartbeat (reads, not a busy loop).
    const bool live_here = owner.ok() && owner->is_local();
    if (!live_here && now >= next_look) {
      next_look = now + std::chrono::milliseconds(200);
      std::string sign = lock_sign_of_life(fs, path);
      if (sign != seen) {
        seen = std::move(sign);
        seen_since = now;
      } else if (std::chrono::duration<double>(now - seen_since).count() > silence_s) {
        auto stale = read_whole_file(fs, path + "/" + kOwnerFile, 4096);
        std::fprintf(stderr, "distckpt: broke the lock %s: its owner (%s) showed no sign of life for %g s\n",
                     path.c_str(), owner.ok() ? (owner->hostname + " pid " + std::to_string(owner->pid)).c_str() : "unknown",
                     silence_s);
        break_lock(fs, path, stale.ok() ? *stale : std::string());
        seen.clear();
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
  heartbeat_ = std::make_unique<Heartbeat>(fs_, path_, kLockBeatSeconds);
}

RootLock::~RootLock() {
  heartbeat_.reset();  // no beat after the lock is gone (it would recreate nothing, but cost a call)
  // Removed only while it is still ours: a broken lock may be another holder's now.
  if (still_held().ok()) (void)fs_.remove_all(path_);
}

Status RootLock::still_held() const {
  auto owner = read_whole_file(fs_, path_ + "/" + kOwnerFile, 4096);
  if (owner.ok() && *owner == owner_text_) return Status();
  return aborted("the lock " + path_ + " was broken while held: this process showed no sign of life for " +
                 std::to_string(static_cast<int>(kLockSilenceSeconds)) + " s (stopped, or its file system hung)");
}

}  // namespace distckpt::internal_catalog
