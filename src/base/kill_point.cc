#include "base/kill_point.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

namespace distckpt::internal_base {

void kill_point(std::string_view name) {
  const char* at = std::getenv("DISTCKPT_PAUSE_AT");
  if (at == nullptr) return;
  const std::string_view spec(at);
  const std::size_t sep = spec.find('@');
  if (spec.substr(0, sep) != name) return;
  if (const char* host = std::getenv("DISTCKPT_PAUSE_HOST"); host != nullptr && *host != '\0') {
    char mine[256] = {};
    if (::gethostname(mine, sizeof mine - 1) != 0 || std::string_view(mine) != host) return;
  }
  // Passes through the named point by this process (all points share the count: a
  // test names one point at a time).
  static std::atomic<long> passes{0};
  const long pass = ++passes;
  if (sep != std::string_view::npos && std::atol(std::string(spec.substr(sep + 1)).c_str()) != pass) return;
  char host[256] = {};
  (void)::gethostname(host, sizeof host - 1);
  std::fprintf(stderr, "distckpt: pid %d on %s paused at kill point %.*s (pass %ld)\n", static_cast<int>(::getpid()),
               host, static_cast<int>(name.size()), name.data(), pass);
  std::fflush(stderr);
  while (true) std::this_thread::sleep_for(std::chrono::seconds(1));
}

}  // namespace distckpt::internal_base
