// gather_region: each distinct box is sent once per receiver by its lowest-ranked
// holder, straight from (or into) the caller's buffers when the piece is contiguous (a
// strided box's piece is packed into a copy first).
#include "distckpt/gather.h"

#include <algorithm>
#include <map>
#include <memory>
#include <vector>

#include "comm/agree.h"
#include "layout/region.h"
#include "layout/strided.h"
#include "base/guard.h"

namespace distckpt {

namespace {

Status check_gather_args(const Comm& comm, const StateDict& state, const std::string& name, const Box& region,
                         int root) {
  if (state.rank() != comm.rank())
    return invalid_argument("the state dict was built for rank " + std::to_string(state.rank()));
  if (root != kAllRanks && (root < 0 || root >= comm.size()))
    return invalid_argument("root " + std::to_string(root) + " is not a rank of a communicator of " +
                            std::to_string(comm.size()));
  const int i = state.find(name);
  if (i < 0) return invalid_argument("tensor '" + name + "' is not in the state dict");
  const TensorEntry& e = state.tensors()[i];
  const Shape& shape = e.layout.global_shape();
  if (region.offset.size() != shape.size() || region.shape.size() != shape.size())
    return invalid_argument("tensor '" + name + "': region " + region.to_string() + " has the wrong number of dims");
  for (std::size_t d = 0; d < shape.size(); ++d)
    if (region.offset[d] < 0 || region.shape[d] < 0 || region.offset[d] > shape[d] - region.shape[d])
      return invalid_argument("tensor '" + name + "': region " + region.to_string() + " is outside " +
                              full_box(shape).to_string());
  for (int r : e.layout.ranks())
    if (r >= comm.size())
      return invalid_argument("tensor '" + name + "': the layout names rank " + std::to_string(r) +
                              ", outside a communicator of " + std::to_string(comm.size()));
  return Status();
}

}  // namespace

Status gather_region(Comm& comm, const StateDict& state, const std::string& name, const Box& region, void* out,
                     int root) {
  const std::string where = "gather: rank " + std::to_string(comm.rank()) + ": tensor '" + name + "'";
  DISTCKPT_RETURN_IF_ERROR(internal_comm::agree(comm, check_gather_args(comm, state, name, region, root)));
  const TensorEntry& e = state.tensors()[state.find(name)];
  const std::size_t item = dtype_size(e.dtype);
  const bool receiving = root == kAllRanks || root == comm.rank();

  // Distinct boxes overlapping the region, each with its lowest-ranked holder. The map
  // order is the same on every rank, which matches sends with receives.
  std::map<Box, int> owner;
  for (int r : e.layout.ranks())
    for (const Box& b : e.layout.boxes_of(r))
      if (intersect(b, region).num_elements() > 0) {
        auto [it, inserted] = owner.emplace(b, r);
        if (!inserted) it->second = std::min(it->second, r);
      }

  std::vector<Comm::Transfer> sends, receives;
  std::vector<std::unique_ptr<char[]>> packed;                  // keeps packed sends alive
  std::vector<std::pair<Box, std::unique_ptr<char[]>>> staged;  // received pieces to place
  auto* dst = static_cast<char*>(out);
  // Staging is allocated, and agreed on, before any message moves: a rank that runs
  // out of memory reports it instead of leaving its peers blocked in the transfer.
  Status local = internal_base::guarded(where, [&]() -> Status {
  for (const auto& [box, holder] : owner) {
    const Box piece = intersect(box, region);
    const std::size_t bytes = static_cast<std::size_t>(piece.num_elements()) * item;
    if (holder == comm.rank()) {
      const auto mine = static_cast<std::size_t>(std::find(e.boxes.begin(), e.boxes.end(), box) - e.boxes.begin());
      const void* src = e.buffers[mine];
      if (!e.packed(mine)) {  // strided: the piece packed (only what the region needs)
        packed.emplace_back(new char[bytes]);
        internal_layout::copy_region_out(e, mine, piece, packed.back().get());
        if (receiving) copy_box(packed.back().get(), piece, dst, region, piece, item);
        for (int d = 0; d < comm.size(); ++d)
          if (d != comm.rank() && (root == kAllRanks || d == root)) sends.push_back({d, packed.back().get(), bytes});
        continue;
      }
      if (receiving) copy_box(src, box, dst, region, piece, item);
      char* payload = nullptr;
      for (int d = 0; d < comm.size(); ++d) {
        if (d == comm.rank() || (root != kAllRanks && d != root)) continue;
        if (payload == nullptr) {
          if (auto off = internal_layout::contiguous_offset(piece, box)) {
            payload = const_cast<char*>(static_cast<const char*>(src)) + *off * static_cast<int64_t>(item);
          } else {
            packed.emplace_back(new char[bytes]);
            payload = packed.back().get();
            copy_box(src, box, payload, piece, piece, item);
          }
        }
        sends.push_back({d, payload, bytes});
      }
    } else if (receiving) {
      if (auto off = internal_layout::contiguous_offset(piece, region)) {
        receives.push_back({holder, dst + *off * static_cast<int64_t>(item), bytes});
      } else {
        staged.emplace_back(piece, std::unique_ptr<char[]>(new char[bytes]));
        receives.push_back({holder, staged.back().second.get(), bytes});
      }
    }
  }
  return Status();
  });
  DISTCKPT_RETURN_IF_ERROR(internal_comm::agree(comm, local));
  comm.transfer(sends, receives);  // every rank: the in-process Comm needs all of them
  for (const auto& [piece, data] : staged) copy_box(data.get(), piece, dst, region, piece, item);
  return Status();
}

Status gather_full(Comm& comm, const StateDict& state, const std::string& name, void* out, int root) {
  const int i = state.find(name);
  // An unknown name still goes through gather_region, so every rank reports it alike.
  const Box region = i < 0 ? Box{} : full_box(state.tensors()[i].layout.global_shape());
  return gather_region(comm, state, name, region, out, root);
}

}  // namespace distckpt
