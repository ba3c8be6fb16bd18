#include "layout/tiling.h"

#include <algorithm>
#include <limits>
#include <utility>

namespace distckpt::internal_layout {

namespace {

// Whether two boxes of the same rank share an element; no allocation (the check runs
// per pair, possibly millions of times).
bool overlap(const Box& a, const Box& b) {
  for (std::size_t d = 0; d < a.offset.size(); ++d)
    if (a.offset[d] >= b.offset[d] + b.shape[d] || b.offset[d] >= a.offset[d] + a.shape[d]) return false;
  return true;
}

using Pair = std::optional<std::pair<std::size_t, std::size_t>>;

// Finds two overlapping boxes among boxes[members], all of which have the same extent
// on dims < d. Boxes with the same extent on dim d form a group checked on the next
// dims; groups with different extents are compared pair by pair only where their
// extents on d overlap. A grid or slab split has identical-or-disjoint extents on
// every dim, so the work is a sort per level: O(n log n) instead of O(n^2).
Pair find_overlap(const std::vector<Box>& boxes, std::vector<std::size_t> members, std::size_t d) {
  if (members.size() < 2) return std::nullopt;
  // Same extent on every dim: the boxes coincide (duplicates were removed, so this is
  // reached only through a caller's mistake, but it is still an overlap).
  if (d == boxes[members[0]].offset.size()) return std::make_pair(members[0], members[1]);
  std::sort(members.begin(), members.end(), [&](std::size_t a, std::size_t b) {
    const Box &x = boxes[a], &y = boxes[b];
    return x.offset[d] != y.offset[d] ? x.offset[d] < y.offset[d] : x.shape[d] < y.shape[d];
  });
  std::vector<std::size_t> group_start;
  for (std::size_t i = 0; i < members.size(); ++i) {
    const Box &cur = boxes[members[i]];
    if (i == 0 || cur.offset[d] != boxes[members[i - 1]].offset[d] || cur.shape[d] != boxes[members[i - 1]].shape[d])
      group_start.push_back(i);
  }
  group_start.push_back(members.size());
  const std::size_t groups = group_start.size() - 1;
  for (std::size_t g = 0; g < groups; ++g) {
    std::vector<std::size_t> same(members.begin() + static_cast<std::ptrdiff_t>(group_start[g]),
                                  members.begin() + static_cast<std::ptrdiff_t>(group_start[g + 1]));
    if (Pair p = find_overlap(boxes, std::move(same), d + 1)) return p;
  }
  for (std::size_t g = 0; g < groups; ++g) {
    const Box& head = boxes[members[group_start[g]]];
    const int64_t end = head.offset[d] + head.shape[d];
    for (std::size_t h = g + 1; h < groups && boxes[members[group_start[h]]].offset[d] < end; ++h)
      for (std::size_t i = group_start[g]; i < group_start[g + 1]; ++i)
        for (std::size_t j = group_start[h]; j < group_start[h + 1]; ++j)
          if (overlap(boxes[members[i]], boxes[members[j]])) return std::make_pair(members[i], members[j]);
  }
  return std::nullopt;
}

}  // namespace


std::optional<int64_t> checked_num_elements(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) return std::nullopt;
    if (d != 0 && n > std::numeric_limits<int64_t>::max() / 16 / d) return std::nullopt;
    n *= d;
  }
  return n;
}

std::string check_tiling(const std::vector<Box>& boxes, const Shape& shape) {
  const auto total = checked_num_elements(shape);
  if (!total) return "shape has a negative or overflowing dimension";
  int64_t volume = 0;
  for (const Box& b : boxes) volume += b.num_elements();
  // Less than the whole: a gap, whatever else is wrong. More: some boxes overlap, and
  // the sweep below names two of them.
  if (volume < *total)
    return "the boxes cover " + std::to_string(volume) + " of the " + std::to_string(*total) + " elements";
  if (shape.empty() || boxes.size() < 2) return volume == *total ? "" : "boxes overlap";
  std::vector<std::size_t> all(boxes.size());
  for (std::size_t i = 0; i < all.size(); ++i) all[i] = i;
  if (Pair p = find_overlap(boxes, std::move(all), 0))
    return "boxes " + boxes[p->first].to_string() + " and " + boxes[p->second].to_string() +
           " overlap without being identical";
  // Disjoint boxes inside the tensor whose volumes add up to the whole cover it.
  return volume == *total ? "" : "boxes overlap";
}

}  // namespace distckpt::internal_layout
