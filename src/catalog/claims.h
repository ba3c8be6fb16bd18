// What two jobs saving into one root must not both take: commit sequence numbers, series
// prefixes, and the `latest` pointer while it moves. Claims and locks are directories
// made with mkdir (atomic on local and network file systems alike) under
// <root>/.distckpt/, each holding its maker's owner record (owner.h).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "distckpt/filesystem.h"

namespace distckpt::internal_catalog {

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

// A short lock on something of a root: "latest" (read and moved under it, so that it
// never goes back) or "seq" (the commit counter). Held by one process at a time; a lock
// whose owner is provably gone (a dead local process, or a remote one after
// kMinLeaseSeconds) is broken.
class RootLock {
 public:
  // Waits up to `timeout_s` for the lock: kAborted when it stays held.
  static Result<std::unique_ptr<RootLock>> acquire(FileSystem& fs, const std::string& root, const std::string& what,
                                                   double timeout_s);
  ~RootLock();
  RootLock(const RootLock&) = delete;
  RootLock& operator=(const RootLock&) = delete;

 private:
  RootLock(FileSystem& fs, std::string path) : fs_(fs), path_(std::move(path)) {}
  FileSystem& fs_;
  std::string path_;
};

}  // namespace distckpt::internal_catalog
