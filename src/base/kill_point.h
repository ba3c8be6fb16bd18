// Named points where a test can stop a process for real (kill -9 the process, or the
// whole host it runs on) at a chosen moment: with DISTCKPT_PAUSE_AT=<name> in the
// environment, a process that reaches kill_point("<name>") prints
// "distckpt: pid P paused at kill point <name>" on stderr and waits to be killed.
// Without the variable it costs one getenv per call, at points that are not hot.
#pragma once

#include <string_view>

namespace distckpt::internal_base {

void kill_point(std::string_view name);

}  // namespace distckpt::internal_base
