#include "manager/upload.h"

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "base/timer.h"

extern char** environ;

namespace distckpt::internal_manager {

Uploader::Uploader(Hook hook, std::vector<std::string> command, std::size_t capacity)
    : hook_(std::move(hook)), command_(std::move(command)), capacity_(capacity == 0 ? 1 : capacity) {
  thread_ = std::thread([this] { run(); });
}

Uploader::~Uploader() {
  pid_t child = -1;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    for (const auto& path : queue_) reports_.push_back({path, aborted("upload of '" + path + "' not run: the manager ended"), 0});
    queue_.clear();
    child = child_;
  }
  changed_.notify_all();
  if (child > 0) {
    ::kill(child, SIGTERM);
    // run() reaps it; SIGKILL if it ignores SIGTERM.
    std::unique_lock<std::mutex> lock(mu_);
    if (!changed_.wait_for(lock, std::chrono::seconds(5), [&] { return child_ != child; })) ::kill(child, SIGKILL);
  }
  thread_.join();
}

bool Uploader::enqueue(const std::string& path, double wait_s) {
  std::unique_lock<std::mutex> lock(mu_);
  const bool room = changed_.wait_for(lock, std::chrono::duration<double>(wait_s < 0 ? 0 : wait_s),
                                      [&] { return stopping_ || queue_.size() < capacity_; });
  if (!room || stopping_) {
    reports_.push_back({path, aborted("upload of '" + path + "' skipped: " + std::to_string(queue_.size()) +
                                          " uploads were still queued"), 0});
    return false;
  }
  queue_.push_back(path);
  changed_.notify_all();
  return true;
}

bool Uploader::pending(const std::string& path) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (running_ == path) return true;
  for (const auto& p : queue_)
    if (p == path) return true;
  return false;
}

bool Uploader::drain(double wait_s) {
  std::unique_lock<std::mutex> lock(mu_);
  return changed_.wait_for(lock, std::chrono::duration<double>(wait_s < 0 ? 0 : wait_s),
                           [&] { return queue_.empty() && running_.empty(); });
}

bool Uploader::has_reports() const {
  std::lock_guard<std::mutex> lock(mu_);
  return !reports_.empty();
}

std::vector<UploadReport> Uploader::take_reports() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<UploadReport> out;
  out.swap(reports_);
  return out;
}

void Uploader::run() {
  for (;;) {
    std::string path;
    {
      std::unique_lock<std::mutex> lock(mu_);
      changed_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping
      path = queue_.front();
      queue_.pop_front();
      running_ = path;
    }
    changed_.notify_all();  // room in the queue
    internal_base::Timer timer;
    Status st;
    try {
      st = hook_ ? hook_(path) : run_command(path);
    } catch (const std::exception& e) {
      st = internal_error(std::string("upload hook threw: ") + e.what());
    } catch (...) {
      st = internal_error("upload hook threw");
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      reports_.push_back({path, st.with_context("upload of '" + path + "'"), timer.seconds()});
      running_.clear();
    }
    changed_.notify_all();
  }
}

Status Uploader::run_command(const std::string& path) {
  std::vector<std::string> args = command_;
  args.push_back(path);
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = -1;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return aborted("the manager ended");
    const int err = ::posix_spawnp(&pid, argv[0], nullptr, nullptr, argv.data(), environ);
    if (err != 0) return io_error("upload command '" + command_[0] + "': " + std::strerror(err));
    child_ = pid;
  }
  // Wait without reaping first, so that the pid the destructor may signal is never one
  // the system has handed to another process; reaped once child_ is cleared.
  siginfo_t info{};
  int waited;
  do waited = ::waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOWAIT);
  while (waited < 0 && errno == EINTR);
  const int wait_errno = errno;
  {
    std::lock_guard<std::mutex> lock(mu_);
    child_ = -1;
  }
  changed_.notify_all();
  int status = 0;
  pid_t reaped;
  do reaped = ::waitpid(pid, &status, 0);
  while (reaped < 0 && errno == EINTR);
  if (waited < 0 || reaped < 0)  // ECHILD: the process ignores SIGCHLD, nothing to wait for
    return io_error("upload command '" + command_[0] + "': its exit status is unknown (wait: " +
                    std::strerror(waited < 0 ? wait_errno : errno) + ")");
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return Status();
  if (WIFEXITED(status))
    return io_error("upload command '" + command_[0] + "' exited with status " + std::to_string(WEXITSTATUS(status)));
  return io_error("upload command '" + command_[0] + "' was killed by signal " + std::to_string(WTERMSIG(status)));
}

}  // namespace distckpt::internal_manager
