#include "base/cores.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>

namespace distckpt::internal_base {

int cores_for_this_rank(int ranks_on_node) {
  const long online = ::sysconf(_SC_NPROCESSORS_ONLN);
  cpu_set_t set;
  CPU_ZERO(&set);
  const int mine = ::sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 0;
  if (mine > 0 && online > 0 && mine < online) return mine;  // bound: the set is this rank's
  const long all = mine > 0 ? mine : std::max(1L, online);
  return static_cast<int>(std::max(1L, all / std::max(1, ranks_on_node)));
}

}  // namespace distckpt::internal_base
