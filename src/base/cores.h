// How many cores a rank may give its own I/O threads.
#pragma once

namespace distckpt::internal_base {

// The cores this process may use for its own threads: its CPU affinity where that is a
// part of the machine (mpirun --bind-to core/socket, srun --cpus-per-task: launchers give
// each rank its own set), else the machine's online CPUs shared among the
// `ranks_on_node` processes of the job on it. At least 1. Thread-safe; reads the affinity
// at each call (a few microseconds).
int cores_for_this_rank(int ranks_on_node);

}  // namespace distckpt::internal_base
