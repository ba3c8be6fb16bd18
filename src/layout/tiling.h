// The one rule shared by explicit layouts, save plans and index validation: a set of
// distinct boxes must tile a tensor exactly (pairwise disjoint, covering it all).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "distckpt/layout.h"

namespace distckpt::internal_layout {

// Number of elements of `shape`, or nullopt on a negative dim or when the count
// (times 16, the largest item size) would overflow int64.
std::optional<int64_t> checked_num_elements(const Shape& shape);

// Checks that `boxes` (non-empty boxes, duplicates already removed, each inside
// `shape`) tile the tensor. O(n log n) for the grid and slab splits layouts produce
// (see find_overlap). Returns an error message, or "" when they tile.
std::string check_tiling(const std::vector<Box>& boxes, const Shape& shape);

}  // namespace distckpt::internal_layout
