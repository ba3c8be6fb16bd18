// Where a box's elements sit inside a larger row-major box.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "distckpt/layout.h"

namespace distckpt::internal_layout {

// If the elements of `inner` (a box inside `outer`) form one contiguous run of
// `outer`'s row-major buffer, the element offset where the run starts; else nullopt.
// An empty `inner` gives 0.
std::optional<int64_t> contiguous_offset(const Box& inner, const Box& outer);

// Element offset of `inner`'s first element in `outer`'s row-major buffer.
int64_t first_element_offset(const Box& inner, const Box& outer);

// The elements of `inner` (a box inside `outer`) as maximal contiguous runs of `outer`'s
// row-major order, in `inner`'s row-major order: fn(offset in outer, offset in inner,
// elements), offsets in elements. One run when `inner` is contiguous; none when empty.
void for_each_run(const Box& inner, const Box& outer,
                  const std::function<void(int64_t outer_at, int64_t inner_at, int64_t count)>& fn);

}  // namespace distckpt::internal_layout

namespace distckpt::internal_layout {

// The row-major element range [begin, end) of a tensor of `shape` as boxes, in element
// order: at most 2 x dims - 1 of them (a partial leading row, whole rows, a partial
// trailing row, recursively). Empty for an empty or out-of-bounds range. A 0-d
// tensor's only range is [0, 1).
std::vector<Box> flat_range_to_boxes(const Shape& shape, int64_t begin, int64_t end);

}  // namespace distckpt::internal_layout

namespace distckpt::internal_layout {

// The tensor as consecutive blocks of whole rows of dim 0, each at most `budget` bytes
// (at least one row); a 0-d tensor is one block, an empty tensor none.
std::vector<Box> row_blocks(const Shape& shape, std::size_t item_size, uint64_t budget);

}  // namespace distckpt::internal_layout
