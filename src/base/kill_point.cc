#include "base/kill_point.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

namespace distckpt::internal_base {

void kill_point(std::string_view name) {
  const char* at = std::getenv("DISTCKPT_PAUSE_AT");
  if (at == nullptr || name != at) return;
  std::fprintf(stderr, "distckpt: pid %d paused at kill point %.*s\n", static_cast<int>(::getpid()),
               static_cast<int>(name.size()), name.data());
  std::fflush(stderr);
  while (true) std::this_thread::sleep_for(std::chrono::seconds(1));
}

}  // namespace distckpt::internal_base
