#include "plan/load_staging.h"

#include <algorithm>

#include "layout/strided.h"
#include "transform/float_cast.h"

namespace distckpt::internal_plan {

void write_back(const TensorEntry& e, std::size_t b, const void* staged, DType from) {
  const std::size_t count = static_cast<std::size_t>(e.boxes[b].num_elements());
  const std::size_t size = dtype_size(e.dtype);
  if (from == e.dtype) {
    internal_layout::copy_packed_in(e, b, 0, count * size, static_cast<const char*>(staged));
    return;
  }
  if (e.packed(b)) {
    internal_transform::cast_floats(staged, from, e.buffers[b], e.dtype, count);
    return;
  }
  // Cast and strided: converted a piece at a time through a buffer on the stack (it runs
  // after the ranks agreed that the load succeeded: nothing here may fail), then scattered.
  constexpr std::size_t kPieceBytes = 64 << 10;
  alignas(16) char piece[kPieceBytes];
  const std::size_t per_piece = kPieceBytes / size;
  const auto* src = static_cast<const char*>(staged);
  for (std::size_t done = 0; done < count;) {
    const std::size_t n = std::min(per_piece, count - done);
    internal_transform::cast_floats(src + done * dtype_size(from), from, piece, e.dtype, n);
    internal_layout::copy_packed_in(e, b, done * size, n * size, piece);
    done += n;
  }
}

}  // namespace distckpt::internal_plan
