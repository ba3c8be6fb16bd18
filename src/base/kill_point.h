// Named points where a test can stop a process for real (kill -9 the process, or the
// whole host it runs on) at a chosen moment: with DISTCKPT_PAUSE_AT=<name> in the
// environment, a process that reaches kill_point("<name>") prints
// "distckpt: pid P on HOST paused at kill point <name>" on stderr and waits to be
// killed. DISTCKPT_PAUSE_AT=<name>@<n> pauses at the n-th time the process gets there
// (earlier passes go on), and DISTCKPT_PAUSE_HOST=<hostname> only in processes of that
// host (the others go on: their peers are the ones that stop). Without the variable it
// costs one getenv per call, at points that are not hot.
#pragma once

#include <string_view>

namespace distckpt::internal_base {

void kill_point(std::string_view name);

}  // namespace distckpt::internal_base
