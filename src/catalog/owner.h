// Who owns an entry of a root that is not (yet) a checkpoint: a save in flight, and
// whether its owner is provably gone, so that abandoned saves can be collected safely
// (gc.h). Every temporary entry is a directory holding the owner's record (kOwnerFile),
// and, while the save runs, a heartbeat file its owner rewrites (kHeartbeatFile).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "distckpt/filesystem.h"

namespace distckpt::internal_catalog {

inline constexpr const char* kOwnerFile = ".distckpt-owner.json";
inline constexpr const char* kHeartbeatFile = ".distckpt-heartbeat";
// How often an owner refreshes its heartbeat. A collector waits for several missed
// heartbeats (its lease, at least kMinLeaseSeconds) before calling a remote owner gone.
inline constexpr double kHeartbeatSeconds = 20;
inline constexpr double kMinLeaseSeconds = 120;

struct OwnerRecord {
  std::string hostname;
  std::string boot_id;      // /proc/sys/kernel/random/boot_id: a reboot makes every pid new
  uint64_t pid_namespace = 0;  // inode of /proc/self/ns/pid: pids are per namespace
  int64_t pid = 0;
  uint64_t start_time = 0;  // the process's start, in clock ticks since boot (/proc/<pid>/stat)
  std::string slurm_job_id;  // $SLURM_JOB_ID, when there is one
  int64_t created_unix_ms = 0;

  // This process.
  static OwnerRecord self();
  std::string to_json() const;
  // kCorruption for anything that is not a record.
  static Result<OwnerRecord> from_json(const std::string& text);
  // Same host, same boot and same pid namespace as this process: then whether the owner
  // runs can be asked of the kernel.
  bool is_local() const;
  // Local owners only: the process is gone (no such pid, or another process with it).
  bool local_process_gone() const;
  // 8 hex digits naming the host, its boot and the pid namespace (CRC32C of the three):
  // what a temporary file's name carries (make_owned_tmp_name).
  std::string host_tag() const;
};

// A fresh "<dir>/<name>.tmp-<random hex>.owner-<host tag>-<pid>-<start time>" path: a
// temporary file of the catalog (`latest`'s, the commit counter's, a clock probe) names
// its owner, so that gc removes it once that owner is gone (a file holds no owner record).
std::string make_owned_tmp_name(const std::string& dir, const std::string& name);
// ".owner-<host tag>-<pid>-<start time>" of this process (retirement's trash names end
// with it too).
std::string owner_suffix();
// The owner a temporary entry's name carries (a file of make_owned_tmp_name, a trash
// directory of retirement), or nullopt for a name without one (an older build's).
struct TmpFileOwner {
  std::string host_tag;
  int64_t pid = 0;
  uint64_t start_time = 0;
};
std::optional<TmpFileOwner> tmp_file_owner(const std::string& entry);

// Writes `record` into the entry directory `dir` (kOwnerFile; fsynced unless `sync` is
// false, for short-lived locks whose record need not survive a crash of the host).
Status write_owner(FileSystem& fs, const std::string& dir, const OwnerRecord& record, bool sync = true);
// The record of the entry `dir`; kNotFound when it has none (an older build's entry).
Result<OwnerRecord> read_owner(FileSystem& fs, const std::string& dir);

// Rewrites <dir>/kHeartbeatFile (the time and a count: new text every beat) from a
// thread of its own until stopped (or destroyed): every kHeartbeatSeconds for a save in
// flight, whose collectors on other hosts judge the file's modification time; every
// kLockBeatSeconds for a root lock, whose waiters watch its text (claims.h). Failures
// are ignored: a missed heartbeat only makes the entry look older.
class Heartbeat {
 public:
  Heartbeat(std::shared_ptr<FileSystem> fs, std::string dir);
  // Every `interval_s`, with a file system the caller keeps alive until stop(); a beat
  // is skipped when `keep_beating` (optional; called before each beat, on the beating
  // thread or, for the first, the constructor's) says no.
  Heartbeat(FileSystem& fs, std::string dir, double interval_s, std::function<bool()> keep_beating = {});
  ~Heartbeat();
  Heartbeat(const Heartbeat&) = delete;
  Heartbeat& operator=(const Heartbeat&) = delete;
  // Stops the thread (waits for a beat in progress). Idempotent.
  void stop();

 private:
  void start();
  void beat();
  std::shared_ptr<FileSystem> owned_fs_;
  FileSystem* fs_;
  std::string dir_;
  double interval_s_ = kHeartbeatSeconds;
  std::function<bool()> keep_beating_;
  uint64_t beats_ = 0;  // beat() runs on one thread at a time (the constructor's, then the thread's)
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::thread thread_;
};

// The file system's clock now, in nanoseconds: the modification time of a file written
// in `root` for the purpose (and removed).
Result<int64_t> file_system_now_ns(FileSystem& fs, const std::string& root);

}  // namespace distckpt::internal_catalog
