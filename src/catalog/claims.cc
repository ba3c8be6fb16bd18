#include "catalog/claims.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <thread>

#include "catalog/listing.h"
#include "catalog/names.h"
#include "catalog/owner.h"

namespace distckpt::internal_catalog {

namespace {

std::string seq_dir(const std::string& root) { return root + "/" + kMetaDir + "/seq"; }
std::string series_dir(const std::string& root) { return root + "/" + kMetaDir + "/series"; }

std::string seq_name(uint64_t n) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%020llu", static_cast<unsigned long long>(n));
  return buf;
}

// The claimed numbers under `dir` (names of 20 digits).
std::vector<uint64_t> claimed_numbers(FileSystem& fs, const std::string& dir) {
  std::vector<uint64_t> out;
  auto entries = fs.list_dir(dir);
  if (!entries.ok()) return out;
  for (const auto& e : *entries) {
    if (e.name.size() != 20 || e.name.find_first_not_of("0123456789") != std::string::npos) continue;
    out.push_back(std::stoull(e.name));
  }
  return out;
}

// A claim directory with this process's owner record (and the job id) in it.
Status make_claim(FileSystem& fs, const std::string& path, const std::string& job_id) {
  DISTCKPT_RETURN_IF_ERROR(fs.create_dir(path));
  OwnerRecord me = OwnerRecord::self();
  if (!job_id.empty()) me.slurm_job_id = job_id;
  Status st = write_owner(fs, path, me);
  if (!st.ok()) (void)fs.remove_all(path);
  return st;
}

}  // namespace

Result<uint64_t> claim_commit_seq(FileSystem& fs, const std::string& root) {
  DISTCKPT_RETURN_IF_ERROR(fs.create_dirs(seq_dir(root)));
  uint64_t next = next_commit_seq(fs, root);
  for (uint64_t n : claimed_numbers(fs, seq_dir(root))) next = std::max(next, n + 1);
  for (int attempt = 0; attempt < 10000; ++attempt, ++next) {
    Status st = fs.create_dir(seq_dir(root) + "/" + seq_name(next));
    if (st.code() == StatusCode::kAlreadyExists) continue;  // another job's, just now
    DISTCKPT_RETURN_IF_ERROR(st);
    // Claims below ours are spent: later claims start above the highest left.
    for (uint64_t n : claimed_numbers(fs, seq_dir(root)))
      if (n < next) (void)fs.remove_all(seq_dir(root) + "/" + seq_name(n));
    return next;
  }
  return aborted("claim a commit sequence number in '" + root + "': too many concurrent claims");
}

void release_commit_seq(FileSystem& fs, const std::string& root, uint64_t seq) {
  (void)fs.remove_all(seq_dir(root) + "/" + seq_name(seq));
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

Result<std::unique_ptr<LatestLock>> LatestLock::acquire(FileSystem& fs, const std::string& root, double timeout_s) {
  DISTCKPT_RETURN_IF_ERROR(fs.create_dirs(root + "/" + kMetaDir));
  const std::string path = root + "/" + kMetaDir + "/latest.lock";
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (true) {
    Status st = make_claim(fs, path, "");
    if (st.ok()) return std::unique_ptr<LatestLock>(new LatestLock(fs, path));
    if (st.code() != StatusCode::kAlreadyExists) return st;
    // Held: by a live process (wait), or by one that died holding it (break it).
    auto owner = read_owner(fs, path);
    if (owner.ok() && owner->is_local() && owner->local_process_gone()) {
      (void)fs.remove_all(path);
      continue;
    }
    if (std::chrono::steady_clock::now() > deadline) {
      // A remote holder cannot be asked: a lock older than the lease is broken.
      auto now = file_system_now_ns(fs, root);
      auto made = fs.modified_time_ns(path);
      if (now.ok() && made.ok() && static_cast<double>(*now - *made) / 1e9 > kMinLeaseSeconds) {
        (void)fs.remove_all(path);
        continue;
      }
      return aborted("the lock on '" + root + "/latest' (" + path + ") stayed held for " +
                     std::to_string(static_cast<int>(timeout_s)) + " s");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

LatestLock::~LatestLock() { (void)fs_.remove_all(path_); }

}  // namespace distckpt::internal_catalog
