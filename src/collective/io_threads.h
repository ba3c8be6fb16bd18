// How many threads a rank writes (or reads) its data with: SaveSettings::io_threads.
#pragma once

#include <cstdint>

#include "distckpt/comm.h"

namespace distckpt::internal_collective {

// Auto (requested 0) takes no more than this many threads, and gives each at least
// kAutoShareBytes: past 4 a memory file system's copy is bound by memory bandwidth, and
// under 16 MiB a thread's start costs more than it brings.
inline constexpr int kMaxAutoIoThreads = 4;
inline constexpr uint64_t kAutoShareBytes = 16 << 20;
// Each thread writes whole MiB of the file (the last one what is left).
inline constexpr uint64_t kIoShareUnit = 1 << 20;

// Local, any thread. `requested` > 0: that many, but no more than one per kIoShareUnit
// of `bytes`. 0: one per core this rank has to itself (base/cores.h; the ranks on its
// node come from `comm`), at most kMaxAutoIoThreads, and no more than one per
// kAutoShareBytes. At least 1. Negative `requested` is the caller's to refuse.
int io_threads(const Comm& comm, int requested, uint64_t bytes);

}  // namespace distckpt::internal_collective
