// The manager's upload hook (CheckpointConfig::upload / upload_command), as Caffe2's
// UploadTaskGroupBuilder uploads the final model: on rank 0, a thread of its own runs
// one upload at a time, in the order the checkpoints were committed, from a bounded
// queue. A command is spawned with the path as its last argument (no shell). Outcomes
// are collected for the next manager call and stats.jsonl; nothing here is fatal.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "distckpt/status.h"

namespace distckpt::internal_manager {

struct UploadReport {
  std::string path;
  Status status;     // the hook's, or why it did not run
  double seconds = 0;
};

class Uploader {
 public:
  using Hook = std::function<Status(const std::string& path)>;
  // `hook` or `command` (argv before the path), not both; `capacity` >= 1.
  Uploader(Hook hook, std::vector<std::string> command, std::size_t capacity);
  // Stops taking uploads, ends a running command (SIGTERM, then SIGKILL after 5 s) and
  // joins the thread; queued uploads are reported as not run. A callback still running
  // is waited for (it cannot be interrupted).
  ~Uploader();
  Uploader(const Uploader&) = delete;
  Uploader& operator=(const Uploader&) = delete;

  // Queues `path`. With the queue full, waits up to `wait_s` for room; false (and a
  // report saying so) when there was none.
  bool enqueue(const std::string& path, double wait_s);
  // Whether `path` is queued or being uploaded (retention keeps it).
  bool pending(const std::string& path) const;
  // Waits up to `wait_s` for the queue and the running upload to finish; false when
  // some are still pending.
  bool drain(double wait_s);
  bool has_reports() const;
  std::vector<UploadReport> take_reports();

 private:
  void run();
  Status run_command(const std::string& path);

  const Hook hook_;
  const std::vector<std::string> command_;
  const std::size_t capacity_;
  mutable std::mutex mu_;
  std::condition_variable changed_;
  std::deque<std::string> queue_;
  std::string running_;   // "" when idle
  pid_t child_ = -1;      // a running command's process
  bool stopping_ = false;
  std::vector<UploadReport> reports_;
  std::thread thread_;
};

}  // namespace distckpt::internal_manager
