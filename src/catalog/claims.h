// What two jobs saving into one root must not both take: commit sequence numbers, series
// prefixes, and the `latest` pointer while it moves. Claims and locks are directories
// made with mkdir (atomic on local and network file systems alike) under
// <root>/.distckpt/, each holding its maker's owner record (owner.h).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "distckpt/filesystem.h"

namespace distckpt::internal_catalog {

class Heartbeat;  // owner.h

// A fresh commit sequence number for a save into `root`, never handed out before (to
// this job or another): above every committed checkpoint's, `latest`'s target's and
// every number handed out so far (a counter in <root>/.distckpt/seq, moved under the
// root's sequence lock). Rank 0 / a local tool. kCorruption when the next number would
// reach kCommitSeqLimit (index_codec.h), which only a forged checkpoint can bring about.
Result<uint64_t> claim_commit_seq(FileSystem& fs, const std::string& root);

// The series prefix of a run: the prefix already claimed by the same job (a requeued
// Slurm job: same `job_id`), else the first of `base`, "base_1", ... that no run has
// claimed and `has_checkpoints` says is unused; claimed for this job.
Result<std::string> claim_series(FileSystem& fs, const std::string& root, const std::string& base,
                                 const std::string& job_id,
                                 const std::function<bool(const std::string&)>& has_checkpoints);
// Claims `prefix` for this job (resume adopts a series); an existing claim is taken over.
Status adopt_series(FileSystem& fs, const std::string& root, const std::string& prefix, const std::string& job_id);
// Gives a claimed prefix back (a run that adopted another series). Best effort.
void release_series(FileSystem& fs, const std::string& root, const std::string& prefix);

// How often a lock's holder shows it is alive, and how long a waiter on another host
// watches a lock's heartbeat stand still before it breaks the lock. The locks are held
// for a few file operations and fsyncs; a holder whose host died must not block the
// next job's saves for long (a requeued job starts within seconds).
inline constexpr double kLockBeatSeconds = 1;
inline constexpr double kLockSilenceSeconds = 10;

// A short lock on something of a root: "latest" (read and moved under it, so that it
// never goes back), "seq" (the commit counter) or "references". Held by one process at
// a time. While held, a thread of the holder rewrites <lock>/kHeartbeatFile every
// kLockBeatSeconds. A waiter breaks the lock when its owner is provably gone (a dead
// process on this host), or, for an owner on another host, when the heartbeat's text
// has not changed for `silence_s` of the waiter's own clock (no clocks are compared
// across hosts; the file is opened and read each time, which NFS's close-to-open
// consistency keeps fresh; the directory itself is looked up by name, so the root needs
// the metadata ordering the README asks of it: not NFS with attribute or lookup caching).
// A waiter that could not look for a while (stopped, or its reads hung) starts its
// watch again. A live holder on this host is never broken. Holders of an older build do
// not beat: during an upgrade, a lock of theirs held over 10 s may be broken.
class RootLock {
 public:
  // Waits up to `timeout_s` for the lock: kAborted when it stays held. The file system
  // must outlive the lock.
  static Result<std::unique_ptr<RootLock>> acquire(FileSystem& fs, const std::string& root, const std::string& what,
                                                   double timeout_s, double silence_s = kLockSilenceSeconds);
  ~RootLock();
  RootLock(const RootLock&) = delete;
  RootLock& operator=(const RootLock&) = delete;

  // OK while the lock is still this one's: a holder stalled past a waiter's silence
  // (stopped, or its file system hung) may have had it broken. Checked before what the
  // lock protects is made visible (a rename), so that two holders never both publish.
  Status still_held() const;

 private:
  RootLock(FileSystem& fs, std::string path, std::string owner_text);
  FileSystem& fs_;
  std::string path_;
  std::string owner_text_;  // the record this process wrote into the lock
  std::atomic<bool> lost_{false};  // the heartbeat read another's record in it
  std::unique_ptr<Heartbeat> heartbeat_;  // last: stopped first
};

}  // namespace distckpt::internal_catalog
