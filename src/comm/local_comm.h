// An in-process Comm: N ranks are N threads of one process. Used by unit tests so
// that collective logic (planning, agreement, commit) runs without mpirun.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "distckpt/comm.h"

namespace distckpt::internal_comm {

// Creates the communicators of an n-rank in-process group; comm i has rank i.
// Each must be used by its own thread. With ranks_per_node > 0 the ranks pretend to
// run on nodes "node0", "node1", ... of that many consecutive ranks each (node_of,
// node_count), so that logic that depends on nodes runs in unit tests.
std::vector<std::unique_ptr<Comm>> make_local_comms(int n, int ranks_per_node = 0);

// Runs fn(comm) on n threads, one per rank, and joins them.
void run_local_ranks(int n, const std::function<void(Comm&)>& fn, int ranks_per_node = 0);

}  // namespace distckpt::internal_comm
