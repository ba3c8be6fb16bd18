#include "layout/strided.h"

#include <algorithm>
#include <cstring>
#include <memory>

#include "layout/region.h"

namespace distckpt::internal_layout {

namespace {

// Copies one element's bytes [from, to) (0 <= from < to <= es) between the packed image
// and the caller's memory, in the direction `out` says. Fixed sizes inline the copy.
template <bool out>
inline void move_bytes(char* user, char* packed, std::size_t n) {
  if constexpr (out) std::memcpy(packed, user, n);
  else std::memcpy(user, packed, n);
}

template <bool out, std::size_t es>
inline void move_elements(char* user, int64_t step_bytes, char* packed, std::size_t count) {
  for (std::size_t k = 0; k < count; ++k, user += step_bytes, packed += es) move_bytes<out>(user, packed, es);
}

// Moves `count` whole elements of one row, `step_bytes` apart in the caller's memory.
template <bool out>
void move_row(char* user, int64_t step_bytes, char* packed, std::size_t count, std::size_t es) {
  switch (es) {
    case 1: return move_elements<out, 1>(user, step_bytes, packed, count);
    case 2: return move_elements<out, 2>(user, step_bytes, packed, count);
    case 4: return move_elements<out, 4>(user, step_bytes, packed, count);
    case 8: return move_elements<out, 8>(user, step_bytes, packed, count);
    default:
      for (std::size_t k = 0; k < count; ++k, user += step_bytes, packed += es) move_bytes<out>(user, packed, es);
  }
}

// The packed image's bytes [offset, offset + n) row by row (a row: the innermost
// dimension), each row's part moved with one memcpy when its elements are adjacent in
// the caller's memory, element by element otherwise (partial elements at the ends).
template <bool out>
void move_range(const TensorEntry& e, std::size_t b, uint64_t offset, std::size_t n, char* packed) {
  const Box& box = e.boxes[b];
  const Strides& st = e.strides[b];
  const std::size_t es = dtype_size(e.dtype);
  const std::size_t dims = box.shape.size();
  char* const base = static_cast<char*>(e.buffers[b]);
  const int64_t inner = box.shape[dims - 1];
  const uint64_t row_bytes = static_cast<uint64_t>(inner) * es;
  const int64_t inner_step = st[dims - 1] * static_cast<int64_t>(es);
  // The first row's index on every outer dimension, and where the row starts.
  uint64_t row = offset / row_bytes;
  std::vector<int64_t> index(dims - 1);
  int64_t row_at = 0;  // bytes from base
  for (std::size_t d = dims - 1, rest = row; d-- > 0;) {
    index[d] = static_cast<int64_t>(rest % static_cast<uint64_t>(box.shape[d]));
    rest /= static_cast<uint64_t>(box.shape[d]);
    row_at += index[d] * st[d] * static_cast<int64_t>(es);
  }
  uint64_t a = offset - row * row_bytes;  // within the row
  for (std::size_t left = n; left > 0;) {
    const uint64_t end = std::min<uint64_t>(row_bytes, a + left);
    char* const user_row = base + row_at;
    if (inner_step == static_cast<int64_t>(es)) {
      move_bytes<out>(user_row + a, packed, end - a);
    } else {
      uint64_t at = a;
      // A partial element first, whole elements, then a partial last one.
      if (at % es != 0) {
        const uint64_t k = at / es, stop = std::min<uint64_t>((k + 1) * es, end);
        move_bytes<out>(user_row + static_cast<int64_t>(k) * inner_step + static_cast<int64_t>(at % es), packed + (at - a), stop - at);
        at = stop;
      }
      const uint64_t whole = (end - at) / es;
      move_row<out>(user_row + static_cast<int64_t>(at / es) * inner_step, inner_step, packed + (at - a), whole, es);
      at += whole * es;
      if (at < end) move_bytes<out>(user_row + static_cast<int64_t>(at / es) * inner_step, packed + (at - a), end - at);
    }
    packed += end - a;
    left -= end - a;
    a = 0;
    // The next row: an odometer over the outer dimensions.
    for (std::size_t d = dims - 1; d-- > 0;) {
      row_at += st[d] * static_cast<int64_t>(es);
      if (++index[d] < box.shape[d]) break;
      row_at -= index[d] * st[d] * static_cast<int64_t>(es);
      index[d] = 0;
    }
  }
}

}  // namespace

void copy_packed_out(const TensorEntry& e, std::size_t b, uint64_t offset, std::size_t n, char* dst) {
  if (n == 0) return;
  if (e.packed(b)) {
    std::memcpy(dst, static_cast<const char*>(e.buffers[b]) + offset, n);
    return;
  }
  move_range<true>(e, b, offset, n, dst);
}

void copy_packed_in(const TensorEntry& e, std::size_t b, uint64_t offset, std::size_t n, const char* src) {
  if (n == 0) return;
  if (e.packed(b)) {
    std::memcpy(static_cast<char*>(e.buffers[b]) + offset, src, n);
    return;
  }
  move_range<false>(e, b, offset, n, const_cast<char*>(src));  // only read from in this direction
}

Status check_writable(const TensorEntry& e) {
  for (std::size_t b = 0; b < e.buffers.size(); ++b) {
    if (e.packed(b)) continue;
    const Box& box = e.boxes[b];
    const Strides& st = e.strides[b];
    std::vector<std::size_t> dims;
    for (std::size_t d = 0; d < box.shape.size(); ++d) {
      if (box.shape[d] <= 1) continue;  // never stepped over
      if (st[d] <= 0)
        return invalid_argument("tensor '" + e.name + "': box " + box.to_string() +
                                " has stride " + std::to_string(st[d]) + " on dimension " + std::to_string(d) +
                                ": a load writes each element once, so strides must be positive (a broadcast or "
                                "reversed view can be saved, not loaded into)");
      dims.push_back(d);
    }
    std::sort(dims.begin(), dims.end(), [&](std::size_t x, std::size_t y) { return st[x] < st[y]; });
    std::string listed;
    for (std::size_t d = 0; d < st.size(); ++d) listed += (d ? ", " : "") + std::to_string(st[d]);
    int64_t span = 0;  // the largest offset the smaller strides reach
    for (std::size_t d : dims) {
      int64_t reach = 0;
      if (st[d] <= span || __builtin_mul_overflow(box.shape[d] - 1, st[d], &reach) ||
          __builtin_add_overflow(span, reach, &span))
        return invalid_argument("tensor '" + e.name + "': box " + box.to_string() + " has strides (" + listed +
                                ") whose elements overlap: dimension " + std::to_string(d) + " steps " +
                                std::to_string(st[d]) + " element(s), within the smaller strides' reach; a load "
                                "would write some element twice");
    }
  }
  return Status();
}

const char* packed_piece(const TensorEntry& e, std::size_t b, uint64_t offset, std::size_t n,
                         std::vector<char>& scratch) {
  if (e.packed(b)) return static_cast<const char*>(e.buffers[b]) + offset;
  if (scratch.size() < n) scratch.resize(n);
  copy_packed_out(e, b, offset, n, scratch.data());
  return scratch.data();
}

void copy_region_out(const TensorEntry& e, std::size_t b, const Box& region, char* dst) {
  const std::size_t es = dtype_size(e.dtype);
  // Runs of the region contiguous in the box's packed image, each copied out of the strides.
  for_each_run(region, e.boxes[b], [&](int64_t outer_at, int64_t inner_at, int64_t count) {
    copy_packed_out(e, b, static_cast<uint64_t>(outer_at) * es, static_cast<std::size_t>(count) * es,
                    dst + inner_at * static_cast<int64_t>(es));
  });
}

bool has_strided(const StateDict& state) {
  for (const TensorEntry& e : state.tensors())
    if (e.strided()) return true;
  return false;
}

Result<std::unique_ptr<PackedState>> pack_strided(const StateDict& source) {
  auto out = std::make_unique<PackedState>(source.rank());
  for (const TensorEntry& e : source.tensors()) {
    if (!e.strided()) {
      DISTCKPT_RETURN_IF_ERROR(out->state.add_view(e));
      continue;
    }
    std::vector<void*> buffers;
    for (std::size_t b = 0; b < e.boxes.size(); ++b) {
      const std::size_t bytes = static_cast<std::size_t>(e.boxes[b].num_elements()) * dtype_size(e.dtype);
      out->storage.emplace_back(std::max<std::size_t>(bytes, 1));
      copy_packed_out(e, b, 0, bytes, out->storage.back().data());
      buffers.push_back(out->storage.back().data());
    }
    DISTCKPT_RETURN_IF_ERROR(out->state.add_tensor(e.name, e.dtype, std::move(buffers), e.layout));
  }
  for (const auto& [k, v] : source.info()) DISTCKPT_RETURN_IF_ERROR(out->state.set_info(k, v));
  return out;
}

}  // namespace distckpt::internal_layout
