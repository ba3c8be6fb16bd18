// The job's nodes as the communicator sees them (MPI_Comm_split_type and processor
// names: comm/mpi_comm.cc), never as the user says.
#pragma once

#include <string>
#include <vector>

#include "distckpt/comm.h"

namespace distckpt::internal_tier {

struct NodeMap {
  int count = 0;
  std::vector<int> node_of;              // rank -> node
  std::vector<std::vector<int>> ranks;   // node -> its ranks, ascending
  int leader(int node) const { return ranks[static_cast<std::size_t>(node)][0]; }
  // The rank of `node` that pairs with `rank` of another node (same position, wrapped).
  int peer_on(int node, int rank) const;
};

NodeMap node_map(const Comm& comm);

// `dir` with "{host}" replaced by `rank`'s node name.
std::string node_dir(const Comm& comm, const std::string& dir, int rank);

}  // namespace distckpt::internal_tier
