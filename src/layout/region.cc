#include "layout/region.h"

#include <algorithm>

namespace distckpt::internal_layout {

int64_t first_element_offset(const Box& inner, const Box& outer) {
  int64_t offset = 0;
  for (std::size_t d = 0; d < outer.shape.size(); ++d)
    offset = offset * outer.shape[d] + (inner.offset[d] - outer.offset[d]);
  return offset;
}

std::optional<int64_t> contiguous_offset(const Box& inner, const Box& outer) {
  if (inner.num_elements() == 0) return 0;
  // Contiguous iff, past the first dimension where `inner` spans more than one index,
  // it spans `outer` entirely.
  const std::size_t n = inner.shape.size();
  std::size_t d = 0;
  while (d < n && inner.shape[d] == 1) ++d;
  for (std::size_t k = d + 1; k < n; ++k)
    if (inner.shape[k] != outer.shape[k]) return std::nullopt;
  return first_element_offset(inner, outer);
}

}  // namespace distckpt::internal_layout

namespace distckpt::internal_layout {

std::vector<Box> flat_range_to_boxes(const Shape& shape, int64_t begin, int64_t end) {
  const Box all = full_box(shape);
  if (begin < 0 || end <= begin || end > all.num_elements()) return {};
  const std::size_t n = shape.size();
  if (n == 0) return {all};
  std::vector<int64_t> stride(n);  // elements per index of dim d
  int64_t s = 1;
  for (std::size_t d = n; d-- > 0;) {
    stride[d] = s;
    s *= shape[d];
  }
  std::vector<Box> boxes;
  for (int64_t at = begin; at < end;) {
    // The coarsest dim d at whose boundary `at` sits and of which at least one whole
    // index fits before `end`, without wrapping into the next index of dim d-1.
    for (std::size_t d = 0; d < n; ++d) {
      if (at % stride[d] != 0) continue;
      const int64_t index = (at / stride[d]) % shape[d];
      const int64_t count = std::min((end - at) / stride[d], shape[d] - index);
      if (count < 1) continue;
      Box box = all;
      int64_t rest = at;
      for (std::size_t k = 0; k < n; ++k) {
        box.offset[k] = k <= d ? rest / stride[k] : 0;
        if (k <= d) rest %= stride[k];
        if (k < d) box.shape[k] = 1;
      }
      box.shape[d] = count;
      boxes.push_back(box);
      at += count * stride[d];
      break;
    }
  }
  return boxes;
}

}  // namespace distckpt::internal_layout

namespace distckpt::internal_layout {

std::vector<Box> row_blocks(const Shape& shape, std::size_t item_size, uint64_t budget) {
  const Box all = full_box(shape);
  if (shape.empty()) return {all};
  if (all.num_elements() == 0) return {};
  const uint64_t row_bytes = static_cast<uint64_t>(all.num_elements() / shape[0]) * item_size;
  const auto rows_per = static_cast<int64_t>(std::max<uint64_t>(1, budget / row_bytes));
  std::vector<Box> blocks;
  for (int64_t r = 0; r < shape[0]; r += rows_per) {
    Box b = all;
    b.offset[0] = r;
    b.shape[0] = std::min(rows_per, shape[0] - r);
    blocks.push_back(b);
  }
  return blocks;
}

void for_each_run(const Box& inner, const Box& outer,
                  const std::function<void(int64_t outer_at, int64_t inner_at, int64_t count)>& fn) {
  const std::size_t n = inner.shape.size();
  if (inner.num_elements() == 0) return;
  if (n == 0) return fn(0, 0, 1);
  // Dims k.. are whole in `outer` past k: a run covers them.
  std::size_t k = n - 1;
  while (k > 0 && inner.shape[k] == outer.shape[k]) --k;
  int64_t run = 1;
  for (std::size_t d = k; d < n; ++d) run *= inner.shape[d];
  std::vector<int64_t> stride(n, 1);
  for (std::size_t d = n - 1; d > 0; --d) stride[d - 1] = stride[d] * outer.shape[d];
  std::vector<int64_t> index(k, 0);  // an odometer over dims < k
  for (int64_t inner_at = 0;; inner_at += run) {
    int64_t outer_at = 0;
    for (std::size_t d = 0; d < n; ++d)
      outer_at += (inner.offset[d] - outer.offset[d] + (d < k ? index[d] : 0)) * stride[d];
    fn(outer_at, inner_at, run);
    std::size_t d = k;
    for (; d > 0; --d) {
      if (++index[d - 1] < inner.shape[d - 1]) break;
      index[d - 1] = 0;
    }
    if (d == 0) return;
  }
}

}  // namespace distckpt::internal_layout
