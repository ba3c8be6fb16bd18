#include "tier/nodes.h"

#include <algorithm>

namespace distckpt::internal_tier {

NodeMap node_map(const Comm& comm) {
  NodeMap map;
  map.count = comm.node_count();
  map.ranks.resize(static_cast<std::size_t>(map.count));
  for (int r = 0; r < comm.size(); ++r) {
    const int n = comm.node_of(r);
    map.node_of.push_back(n);
    map.ranks[static_cast<std::size_t>(n)].push_back(r);
  }
  return map;
}

int NodeMap::peer_on(int node, int rank) const {
  const auto& mine = ranks[static_cast<std::size_t>(node_of[static_cast<std::size_t>(rank)])];
  const auto at = static_cast<std::size_t>(std::find(mine.begin(), mine.end(), rank) - mine.begin());
  const auto& theirs = ranks[static_cast<std::size_t>(node)];
  return theirs[at % theirs.size()];
}

std::string node_dir(const Comm& comm, const std::string& dir, int rank) {
  std::string out = dir;
  const std::string key = "{host}";
  for (auto at = out.find(key); at != std::string::npos; at = out.find(key, at)) {
    const std::string host = comm.node_name(rank);
    out.replace(at, key.size(), host);
    at += host.size();
  }
  return out;
}

}  // namespace distckpt::internal_tier
