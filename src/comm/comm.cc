#include "distckpt/comm.h"

#include <unistd.h>

namespace distckpt {

void Comm::broadcast_string(std::string& s, int root) {
  int64_t n = static_cast<int64_t>(s.size());
  broadcast(&n, sizeof(n), root);
  s.resize(static_cast<std::size_t>(n));
  if (n > 0) broadcast(s.data(), s.size(), root);
}

std::string Comm::node_name(int rank) const {
  (void)rank;
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0) return "localhost";
  return name;
}

int64_t Comm::allreduce_one(int64_t v, ReduceOp op) {
  std::vector<int64_t> values{v};
  allreduce(values, op);
  return values[0];
}

}  // namespace distckpt
