#include "catalog/claims.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <thread>

#include "catalog/listing.h"
#include "catalog/names.h"
#include "catalog/owner.h"
#include "format/native/index_codec.h"

namespace distckpt::internal_catalog {

namespace {

std::string series_dir(const std::string& root) { return root + "/" + kMetaDir + "/series"; }

// How long a save waits for another job's claim or pointer update (both take
// milliseconds; a holder that died is detected before this).
constexpr double kLockTimeout = 30;

// A claim directory with this process's owner record (and the job id) in it; a lock's
// record is not fsynced (it lives for milliseconds).
Status make_claim(FileSystem& fs, const std::string& path, const std::string& job_id, bool durable = true) {
  DISTCKPT_RETURN_IF_ERROR(fs.create_dir(path));
  OwnerRecord me = OwnerRecord::self();
  if (!job_id.empty()) me.slurm_job_id = job_id;
  Status st = write_owner(fs, path, me, durable);
  if (!st.ok()) (void)fs.remove_all(path);
  return st;
}

}  // namespace

Result<uint64_t> claim_commit_seq(FileSystem& fs, const std::string& root) {
  DISTCKPT_ASSIGN_OR_RETURN(auto lock, RootLock::acquire(fs, root, "seq", kLockTimeout));
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
                                                    double timeout_s) {
  DISTCKPT_RETURN_IF_ERROR(fs.create_dirs(root + "/" + kMetaDir));
  const std::string path = root + "/" + kMetaDir + "/" + what + ".lock";
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (true) {
    Status st = make_claim(fs, path, "", /*durable=*/false);
    if (st.ok()) return std::unique_ptr<RootLock>(new RootLock(fs, path));
    if (st.code() != StatusCode::kAlreadyExists) return st;
    // Held: by a live process (wait), or by one that died holding it (break it).
    auto owner = read_owner(fs, path);
    if (owner.ok() && owner->is_local() && owner->local_process_gone()) {
      (void)fs.remove_all(path);
      continue;
    }
    if (std::chrono::steady_clock::now() > deadline) {
      // A remote holder cannot be asked: a lock older than the lease is broken. A holder
      // on this host that still runs is never broken (it may be freeing files).
      auto now = file_system_now_ns(fs, root);
      auto made = fs.modified_time_ns(path);
      const bool live_here = owner.ok() && owner->is_local();
      if (!live_here && now.ok() && made.ok() && static_cast<double>(*now - *made) / 1e9 > kMinLeaseSeconds) {
        (void)fs.remove_all(path);
        continue;
      }
      return aborted("the lock on " + what + " of '" + root + "' (" + path + ") stayed held for " +
                     std::to_string(static_cast<int>(timeout_s)) + " s");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

RootLock::~RootLock() { (void)fs_.remove_all(path_); }

}  // namespace distckpt::internal_catalog
