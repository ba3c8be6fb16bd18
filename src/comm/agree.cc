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

}  // namespace distckpt::internal_comm
