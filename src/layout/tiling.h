// The one rule shared by explicit layouts, save plans and index validation: a set of
// distinct boxes must tile a tensor exactly (pairwise disjoint, covering it all).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "distckpt/layout.h"

namespace distckpt::internal_layout {

// The most dims a tensor may have (as MindSpore's .ckpt reader): the tiling check's
// depth and every per-dim loop are bounded by it.
inline constexpr std::size_t kMaxDims = 64;

// Number of elements of `shape`, or nullopt on a negative dim or when the count
// (times 16, the largest item size) would overflow int64.
std::optional<int64_t> checked_num_elements(const Shape& shape);

// Checks that `boxes` (non-empty boxes, duplicates already removed, each inside
// `shape`) tile the tensor. O(n log n) for the grid and slab splits layouts produce
// (see find_overlap); irregular splits are compared pair by pair, up to a bound past
// which they are refused. Returns an error message, or "" when they tile.
std::string check_tiling(const std::vector<Box>& boxes, const Shape& shape);

}  // namespace distckpt::internal_layout
