// Where a box's elements sit inside a larger row-major box.
#pragma once

#include <cstdint>
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

}  // namespace distckpt::internal_layout

namespace distckpt::internal_layout {

// The box whose elements are exactly the row-major element range [begin, end) of a
// tensor of `shape`, or nullopt when that range is not a box (or is empty or out of
// bounds). A 0-d tensor's only box is [0, 1).
std::optional<Box> flat_range_to_box(const Shape& shape, int64_t begin, int64_t end);

}  // namespace distckpt::internal_layout

namespace distckpt::internal_layout {

// The tensor as consecutive blocks of whole rows of dim 0, each at most `budget` bytes
// (at least one row); a 0-d tensor is one block, an empty tensor none.
std::vector<Box> row_blocks(const Shape& shape, std::size_t item_size, uint64_t budget);

}  // namespace distckpt::internal_layout
