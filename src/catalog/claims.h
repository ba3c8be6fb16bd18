// What two jobs saving into one root must not both take: commit sequence numbers, series
// prefixes, and the `latest` pointer while it moves. Each is claimed atomically with
// mkdir (atomic on local and network file systems alike) under <root>/.distckpt/.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "distckpt/filesystem.h"

namespace distckpt::internal_catalog {

// A fresh commit sequence number for a save into `root`, never handed out before (to
// this job or another): above every committed checkpoint's, `latest`'s target's and
// every number claimed so far. Rank 0 / a local tool.
Result<uint64_t> claim_commit_seq(FileSystem& fs, const std::string& root);
// Gives back the number of a save that will not be committed (best effort).
void release_commit_seq(FileSystem& fs, const std::string& root, uint64_t seq);

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

// The lock under which `latest` is read and moved, so that it never goes back. Held by
// one process at a time; a lock whose owner is provably gone (owner.h) is broken.
class LatestLock {
 public:
  // Waits up to `timeout_s` for the lock: kAborted when it stays held.
  static Result<std::unique_ptr<LatestLock>> acquire(FileSystem& fs, const std::string& root, double timeout_s);
  ~LatestLock();
  LatestLock(const LatestLock&) = delete;
  LatestLock& operator=(const LatestLock&) = delete;

 private:
  LatestLock(FileSystem& fs, std::string path) : fs_(fs), path_(std::move(path)) {}
  FileSystem& fs_;
  std::string path_;
};

}  // namespace distckpt::internal_catalog
