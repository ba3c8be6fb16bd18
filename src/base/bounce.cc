#include "base/bounce.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string_view>

namespace distckpt::internal_base {
namespace {

double seconds_now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// The probe's memory: 64 pages. Most of a trial's time is user mode's first touch of
// them (about 10 us a page here: 1 MiB made the probe 8 ms, 256 KiB makes it 2 ms),
// while the kernel's first copy still stands out (110 us against 4 us here).
constexpr std::size_t kProbeBytes = 256 << 10;

// One trial: the seconds of the kernel's first copy into kProbeBytes of memory that only
// user mode has touched, and of a second copy into the same pages; {-1, -1} when a step
// fails.
std::pair<double, double> time_first_kernel_touch(int zero_fd) {
  constexpr std::size_t kBytes = kProbeBytes;
  void* m = ::mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) return {-1, -1};
  std::memset(m, 1, kBytes);  // present and writable in user mode, as tensors are
  const double t0 = seconds_now();
  const bool first = ::read(zero_fd, m, kBytes) == static_cast<ssize_t>(kBytes);
  const double t1 = seconds_now();
  const bool again = ::read(zero_fd, m, kBytes) == static_cast<ssize_t>(kBytes);
  const double t2 = seconds_now();
  ::munmap(m, kBytes);
  if (!first || !again) return {-1, -1};
  return {t1 - t0, t2 - t1};
}

struct FreeDeleter {
  void operator()(char* p) const { std::free(p); }
};

std::atomic<int> forced{-1};  // force_bounce_io_for_testing's: -1 none, else 0 or 1

}  // namespace

std::optional<bool> bounce_io_from_env() {
  const char* env = std::getenv("DISTCKPT_BOUNCE");
  if (env == nullptr) return std::nullopt;
  if (std::string_view(env) == "1") return true;
  if (std::string_view(env) == "0") return false;
  return std::nullopt;
}

bool first_kernel_touch_traps() {
  const int fd = ::open("/dev/zero", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  // The least of two trials: a preemption in one of them cannot make the trap appear.
  double first = -1, again = -1;
  for (int trial = 0; trial < 2; ++trial) {
    const auto [f, a] = time_first_kernel_touch(fd);
    if (f < 0) break;
    first = first < 0 ? f : std::min(first, f);
    again = again < 0 ? a : std::min(again, a);
  }
  ::close(fd);
  if (first < 0) return false;
  constexpr double kPages = kProbeBytes / 4096.0;
  return (first - again) / kPages >= 0.5e-6 && first >= 4 * again;
}

bool bounce_io() {
  if (const int f = forced.load(std::memory_order_relaxed); f >= 0) return f == 1;
  static const bool bounce = [] {
    const std::optional<bool> env = bounce_io_from_env();
    return env.has_value() ? *env : first_kernel_touch_traps();  // the probe only when needed
  }();
  return bounce;
}

bool bounce_io_for(std::size_t bytes) { return bytes >= kBounceMinBytes && bounce_io(); }

void force_bounce_io_for_testing(std::optional<bool> force) {
  forced.store(force.has_value() ? (*force ? 1 : 0) : -1, std::memory_order_relaxed);
}

namespace {

std::unique_ptr<char, FreeDeleter>& this_threads_buffer() {
  thread_local std::unique_ptr<char, FreeDeleter> buffer(static_cast<char*>(std::aligned_alloc(4096, kBounceBytes)));
  return buffer;
}

}  // namespace

char* bounce_buffer() { return this_threads_buffer().get(); }

void abandon_bounce_buffer() {
  auto& buffer = this_threads_buffer();
  (void)buffer.release();  // left to whatever may still write into it: never freed
  buffer.reset(static_cast<char*>(std::aligned_alloc(4096, kBounceBytes)));
}

}  // namespace distckpt::internal_base
