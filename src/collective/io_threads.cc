#include "collective/io_threads.h"

#include <algorithm>

#include "base/cores.h"

namespace distckpt::internal_collective {

int io_threads(const Comm& comm, int requested, uint64_t bytes) {
  const auto at_most = [bytes](uint64_t share) { return std::max<uint64_t>(1, bytes / share); };
  if (requested > 0) return static_cast<int>(std::min<uint64_t>(requested, at_most(kIoShareUnit)));
  int ranks_here = 0;
  const int mine = comm.node_of(comm.rank());
  for (int r = 0; r < comm.size(); ++r) ranks_here += comm.node_of(r) == mine ? 1 : 0;
  const int cores = std::min(kMaxAutoIoThreads, internal_base::cores_for_this_rank(ranks_here));
  return static_cast<int>(std::min<uint64_t>(cores, at_most(kAutoShareBytes)));
}

}  // namespace distckpt::internal_collective
