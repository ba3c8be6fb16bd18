/// Reconstruction of full tensors (or parts of them) from the slices the ranks hold:
/// MindSpore's allgather + device matrix + tensor map, for any layout.
#pragma once

#include <cstdint>
#include <string>

#include "distckpt/comm.h"
#include "distckpt/layout.h"
#include "distckpt/state_dict.h"
#include "distckpt/status.h"

namespace distckpt {

/// Pass as `root` to deliver the result to every rank.
inline constexpr int kAllRanks = -1;

/// Collective over `comm`: every rank calls it with the same `name`, `region` and
/// `root`. Assembles `region` (a box of the tensor's global shape) of tensor `name` from
/// the boxes the ranks hold, into `out`, a row-major buffer of region.num_elements()
/// elements owned by the caller, on `root` (or on every rank with kAllRanks); `out` is
/// not touched (and may be null) elsewhere. Each distinct box is sent once per
/// receiver, by its lowest-ranked holder: replicas are not sent twice.
///
/// Memory: besides `out`, a sender packs each piece it sends that is not contiguous in
/// its own buffer (every piece of a strided buffer), and a receiver stages each piece that is not contiguous in `out`,
/// so the peak is at most twice the region's bytes on a receiver (once when pieces are
/// contiguous, e.g. splits on the first dimension) and the bytes it sends on a sender.
/// Gather a large tensor region by region to bound it (integrated save does).
///
/// Errors, identical on every rank (checked before any data moves): kInvalidArgument
/// when `name` is not in the state dict, when `region` is not inside the tensor, when
/// `root` is out of range, when the layout names ranks outside `comm`, or when the
/// state dict was built for another rank. Call from the thread that owns `comm`.
Status gather_region(Comm& comm, const StateDict& state, const std::string& name, const Box& region, void* out,
                     int root = kAllRanks);

/// gather_region of the whole tensor. `out` holds prod(global_shape) elements.
Status gather_full(Comm& comm, const StateDict& state, const std::string& name, void* out, int root = kAllRanks);

}  // namespace distckpt
