#include "comm/agree.h"

namespace distckpt::internal_comm {

Status agree(Comm& comm, const Status& local) {
  const int64_t first_failed = comm.allreduce_one(local.ok() ? comm.size() : comm.rank(), ReduceOp::kMin);
  if (first_failed == comm.size()) return Status();
  std::string wire;
  if (comm.rank() == first_failed) wire = std::string(1, static_cast<char>(local.code())) + local.message();
  comm.broadcast_string(wire, static_cast<int>(first_failed));
  return Status(static_cast<StatusCode>(static_cast<unsigned char>(wire[0])), wire.substr(1));
}

Compared agree_same(Comm& comm, const Status& local, const std::vector<int64_t>& words) {
  std::vector<int64_t> v{local.ok() ? 0 : -1};
  v.insert(v.end(), words.begin(), words.end());
  for (int64_t x : words) v.push_back(~x);
  comm.allreduce(v, ReduceOp::kMin);
  Compared c;
  c.failed = v[0] < 0;
  c.same = true;
  const std::size_t n = words.size();
  for (std::size_t i = 0; i < n; ++i) c.same = c.same && v[1 + i] == words[i] && ~v[1 + n + i] == words[i];
  return c;
}

}  // namespace distckpt::internal_comm
