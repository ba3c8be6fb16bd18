// Bounds the time a rank spends inside a collective: the time it waits for its peers
// once its own work is done. A peer on a host that lost power, or cut off by the
// network, never joins, and MPI's collectives wait forever; the watchdog ends that.
//
// One background thread per watchdog, started at the first collective when a limit is
// set. The communicator marks each collective with a Scope; when one has lasted longer
// than the limit, `expired` runs once on the watchdog's thread (in production it
// aborts the job, so it need not return).
//
// Time this process did not run (stopped by SIGSTOP or `scontrol suspend`, or its
// virtual machine paused) is not counted: the watchdog sees it as a wake-up more than
// half a second late, and a suspended job resumed must not end itself for it.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>

namespace distckpt::internal_comm {

class PeerWatchdog {
 public:
  // `expired(op, waited_s)`: `op` is the name the Scope was opened with.
  using Expired = std::function<void(const char* op, double waited_s)>;

  // timeout_s <= 0: no limit, no thread.
  PeerWatchdog(double timeout_s, Expired expired);
  ~PeerWatchdog();
  PeerWatchdog(const PeerWatchdog&) = delete;
  PeerWatchdog& operator=(const PeerWatchdog&) = delete;

  double timeout_s() const { return timeout_s_; }

  // Marks one collective on the communicator's thread (collectives on one communicator
  // do not overlap: one Scope at a time). `op` must be a string literal.
  class Scope {
   public:
    Scope(PeerWatchdog& dog, const char* op);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    PeerWatchdog& dog_;
  };

 private:
  void watch();

  const double timeout_s_;
  const Expired expired_;
  std::atomic<int64_t> entered_ns_{0};  // steady clock; 0: not in a collective
  std::atomic<const char*> op_{nullptr};
  std::once_flag started_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::thread thread_;
};

// The limit a communicator gets when its options leave it open: DISTCKPT_PEER_TIMEOUT_S
// when set (seconds; 0: none), else 600 s. A value that does not parse is reported on
// stderr and the default kept.
double default_peer_timeout_s();

}  // namespace distckpt::internal_comm
