#include "collective/load_checks.h"

#include <algorithm>
#include <cstring>

#include "base/guard.h"
#include "comm/agree.h"
#include "format/format.h"
#include "transform/crc32c.h"

namespace distckpt::internal_collective {

using internal_base::guarded;
using internal_comm::agree;
using internal_format::FileCache;

Status check_file_crc32(Comm& comm, FileCache& files, const proto::Index& index, const std::string& where) {
  Status local;
  for (int f = 0; f < index.files_size(); ++f) {
    const auto& meta = index.files(f);
    if (meta.crc32_covered() == 0) continue;
    const uint64_t total = meta.crc32_covered(), P = static_cast<uint64_t>(comm.size());
    const uint64_t begin = total * static_cast<uint64_t>(comm.rank()) / P,
                   end = total * static_cast<uint64_t>(comm.rank() + 1) / P;
    uint32_t crc = 0;
    if (local.ok())
      local = guarded(where, [&]() -> Status {
        DISTCKPT_ASSIGN_OR_RETURN(const ReadableFile* file, files.get(static_cast<uint32_t>(f)));
        DISTCKPT_ASSIGN_OR_RETURN(crc, internal_format::file_crc32(*file, begin, end));
        return Status();
      });
    const std::string share(reinterpret_cast<const char*>(&crc), sizeof(crc));
    std::vector<std::string> shares = comm.gather(share, 0);
    if (comm.rank() == 0 && local.ok()) {
      uint32_t all = 0;
      for (uint64_t r = 0; r < P; ++r) {
        uint32_t part;
        std::memcpy(&part, shares[r].data(), sizeof(part));
        const uint64_t len = total * (r + 1) / P - total * r / P;
        all = r == 0 ? part : internal_transform::crc32_zlib_combine(all, part, len);
      }
      if (all != meta.crc32())
        local = corruption("'" + files.path(static_cast<uint32_t>(f)) + "': CRC-32 " +
                           internal_transform::crc32c_hex(all) + " != footer " +
                           internal_transform::crc32c_hex(meta.crc32()) + " (the file was modified or damaged)");
    }
  }
  return agree(comm, local);
}

Status check_unread_chunks(Comm& comm, FileCache& files, const proto::Index& index, const StateDict& state,
                           const std::vector<std::pair<int, int>>& plan, const std::string& where) {
  // Per index tensor: 0 not loaded here, 1 loaded in part, 2 some box of it read whole.
  std::vector<int64_t> use(static_cast<std::size_t>(index.tensors_size()), 0);
  for (const auto& [i, t] : plan) {
    const TensorEntry& e = state.tensors()[static_cast<std::size_t>(i)];
    const proto::Tensor& stored = index.tensors(t);
    const Shape global(stored.global_shape().begin(), stored.global_shape().end());
    // A box of all the tensor's elements (its shape may differ by trailing 1s) is read whole.
    const int64_t all = full_box(global).num_elements();
    int64_t mark = 1;
    for (const Box& box : e.boxes)
      if (box.num_elements() == all) mark = 2;
    use[static_cast<std::size_t>(t)] = std::max(use[static_cast<std::size_t>(t)], mark);
  }
  comm.allreduce(use, ReduceOp::kMax);
  // The tensors to check, largest first, each to the rank with the fewest bytes so far
  // (the same choice on every rank).
  std::vector<int> todo;
  for (int t = 0; t < index.tensors_size(); ++t)
    if (use[static_cast<std::size_t>(t)] == 1 && index.tensors(t).chunks_size() == 1) todo.push_back(t);
  std::stable_sort(todo.begin(), todo.end(), [&](int a, int b) {
    return index.tensors(a).chunks(0).length() > index.tensors(b).chunks(0).length();
  });
  std::vector<uint64_t> load(static_cast<std::size_t>(comm.size()), 0);
  Status local;
  std::vector<char> scratch;
  for (int t : todo) {
    const proto::Tensor& stored = index.tensors(t);
    const auto least = std::min_element(load.begin(), load.end());
    *least += stored.chunks(0).length();
    if (least - load.begin() != comm.rank() || !local.ok()) continue;
    local = guarded(where, [&]() -> Status {
      DISTCKPT_ASSIGN_OR_RETURN(const ReadableFile* file, files.get(stored.chunks(0).file_id()));
      internal_format::ChunkCheck check;
      check.where = where + ": tensor '" + stored.name() + "' in " + files.path(stored.chunks(0).file_id());
      return internal_format::read_chunk(*file, stored, 0, nullptr, check, scratch);
    });
  }
  return agree(comm, local);
}

}  // namespace distckpt::internal_collective
