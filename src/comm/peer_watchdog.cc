#include "comm/peer_watchdog.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace distckpt::internal_comm {
namespace {

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

PeerWatchdog::PeerWatchdog(double timeout_s, Expired expired)
    : timeout_s_(timeout_s > 0 ? timeout_s : 0), expired_(std::move(expired)) {}

PeerWatchdog::~PeerWatchdog() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

PeerWatchdog::Scope::Scope(PeerWatchdog& dog, const char* op) : dog_(dog) {
  if (dog_.timeout_s_ <= 0) return;
  std::call_once(dog_.started_, [this] { dog_.thread_ = std::thread([d = &dog_] { d->watch(); }); });
  dog_.op_.store(op, std::memory_order_relaxed);
  dog_.entered_ns_.store(now_ns(), std::memory_order_release);
}

PeerWatchdog::Scope::~Scope() {
  if (dog_.timeout_s_ > 0) dog_.entered_ns_.store(0, std::memory_order_release);
}

void PeerWatchdog::watch() {
  // Checks a few times per limit (at most every half second): the overshoot is small
  // against the limit, and an idle job wakes this thread rarely.
  const auto period = std::chrono::duration<double>(std::clamp(timeout_s_ / 4, 0.01, 0.5));
  const auto period_ns = static_cast<int64_t>(period.count() * 1e9);
  const auto limit_ns = static_cast<int64_t>(timeout_s_ * 1e9);
  // A wake-up this much later than asked means this process did not run in between:
  // stopped (SIGSTOP, Slurm's `scontrol suspend`), or its machine paused (a VM's host
  // busy elsewhere). The peers could not answer a rank that was not running, and they
  // were most likely paused with it: that time is not counted as waiting for them.
  constexpr int64_t kStalledNs = 500'000'000;
  int64_t last_wake = now_ns();
  int64_t credited_scope = 0;  // the `entered_ns_` the credit belongs to
  int64_t credit_ns = 0;
  std::unique_lock<std::mutex> lock(mu_);
  while (!cv_.wait_for(lock, period, [this] { return stopping_; })) {
    const int64_t now = now_ns();
    const int64_t late = now - last_wake - period_ns;
    last_wake = now;
    const int64_t entered = entered_ns_.load(std::memory_order_acquire);
    if (entered == 0) continue;
    if (credited_scope != entered) credited_scope = entered, credit_ns = 0;
    if (late > kStalledNs) credit_ns += std::min(late, now - entered);
    const int64_t waited = now - entered - credit_ns;
    if (waited < limit_ns) continue;
    const char* op = op_.load(std::memory_order_relaxed);
    lock.unlock();
    expired_(op != nullptr ? op : "a collective", static_cast<double>(waited) / 1e9);
    return;  // once: whatever `expired` decided, this watchdog is done
  }
}

double default_peer_timeout_s() {
  constexpr double kDefault = 600;
  const char* text = std::getenv("DISTCKPT_PEER_TIMEOUT_S");
  if (text == nullptr || *text == '\0') return kDefault;
  char* end = nullptr;
  const double v = std::strtod(text, &end);
  if (end == text || *end != '\0' || !std::isfinite(v) || v < 0) {
    std::fprintf(stderr, "distckpt: DISTCKPT_PEER_TIMEOUT_S=%s is not a number of seconds >= 0; using %g s\n", text,
                 kDefault);
    return kDefault;
  }
  return v;
}

}  // namespace distckpt::internal_comm
