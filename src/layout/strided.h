// Strided buffers (StateDict's Strides): moving a byte range of a box's packed
// row-major image out of, or into, the caller's strided memory, and the checks a load
// makes before it writes there. Everything that hashes, checksums, encrypts or stages
// a box sees the packed bytes these produce.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "distckpt/state_dict.h"
#include "distckpt/status.h"

namespace distckpt::internal_layout {

// Copies bytes [offset, offset + n) of box `b`'s packed row-major image from the
// entry's (strided) buffer to `dst`. Any strides, zero and negative included. Local,
// any thread; the range must lie within the box (precondition).
void copy_packed_out(const TensorEntry& e, std::size_t b, uint64_t offset, std::size_t n, char* dst);

// The reverse: bytes [offset, offset + n) of the packed image from `src` into the
// entry's buffer. The strides must have passed check_writable (precondition). Local,
// any thread (one writer per box); cannot fail.
void copy_packed_in(const TensorEntry& e, std::size_t b, uint64_t offset, std::size_t n, const char* src);

// kInvalidArgument, naming the tensor (callers add the rank), when a buffer of `e` has a zero or
// negative stride on a dimension of extent > 1, or strides whose elements may overlap
// (a load would write one element twice). Accepted: strides that, sorted, each step
// over everything the smaller ones span. Local.
Status check_writable(const TensorEntry& e);

// Bytes [offset, offset + n) of box `b`'s packed image as one contiguous pointer: the
// caller's memory for a packed buffer, else `scratch` (grown to n) filled by
// copy_packed_out, valid until `scratch` is used again. For pieces of a chunk streamed to
// a file, a hash or a cipher. Local, any thread; std::bad_alloc when scratch cannot grow.
const char* packed_piece(const TensorEntry& e, std::size_t b, uint64_t offset, std::size_t n,
                         std::vector<char>& scratch);

// A state dict whose strided tensors are packed copies (owned here) and whose other
// tensors refer to the source's memory, for the paths that read whole boxes (single
// files, .ckpt sets, gathers): made with pack_strided, read-only.
struct PackedState {
  StateDict state;
  std::vector<std::vector<char>> storage;
  explicit PackedState(int rank) : state(rank) {}
};
// Local. kInvalidArgument from StateDict; std::bad_alloc is left to the caller's guard.
Result<std::unique_ptr<PackedState>> pack_strided(const StateDict& source);

// `region` (inside box `b`) of the entry, packed row-major into `dst`, whatever the
// strides. Local, any thread; cannot fail.
void copy_region_out(const TensorEntry& e, std::size_t b, const Box& region, char* dst);

// Whether any tensor of `state` has a strided buffer. Local, cannot fail.
bool has_strided(const StateDict& state);

}  // namespace distckpt::internal_layout
