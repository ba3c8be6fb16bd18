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

// More pairwise comparisons than this, and the boxes are refused as too irregular to
// check (a hostile index must not keep a reader busy for hours).
constexpr uint64_t kMaxComparisons = uint64_t{200} << 20;

struct Search {
  const std::vector<Box>& boxes;
  uint64_t comparisons = 0;
  bool gave_up = false;
};

// How boxes[members] split on dim d, sorted by (offset, extent) there: the start of each
// run of equal extents, and whether the runs are disjoint (a grid or slab cut).
struct Split {
  std::vector<std::size_t> sorted;
  std::vector<std::size_t> group_start;  // ends with sorted.size()
  bool clean = true;
};

Split split_on(const std::vector<Box>& boxes, std::vector<std::size_t> members, std::size_t d) {
  std::sort(members.begin(), members.end(), [&](std::size_t a, std::size_t b) {
    const Box &x = boxes[a], &y = boxes[b];
    return x.offset[d] != y.offset[d] ? x.offset[d] < y.offset[d] : x.shape[d] < y.shape[d];
  });
  Split s;
  int64_t reach = 0;  // the furthest end of the groups so far
  for (std::size_t i = 0; i < members.size(); ++i) {
    const Box& cur = boxes[members[i]];
    if (i == 0 || cur.offset[d] != boxes[members[i - 1]].offset[d] || cur.shape[d] != boxes[members[i - 1]].shape[d]) {
      if (i > 0 && cur.offset[d] < reach) s.clean = false;
      s.group_start.push_back(i);
    }
    reach = std::max(reach, cur.offset[d] + cur.shape[d]);
  }
  s.group_start.push_back(members.size());
  s.sorted = std::move(members);
  return s;
}

// Finds two overlapping boxes among boxes[members], which have the same extent on every
// dim not in `dims`. Each level cuts on one dim of `dims`: boxes with the same extent
// there form a group, checked on the remaining dims; groups whose extents overlap
// without being equal are compared pair by pair. The dim is the one whose groups are
// disjoint (a grid or slab cut: no pairs at all), the one with the most groups among
// those; so a grid or slab split costs a sort per level, O(n log n) in all. Depth is at
// most the number of dims (kMaxDims).
Pair find_overlap(Search& search, std::vector<std::size_t> members, std::vector<std::size_t> dims) {
  const std::vector<Box>& boxes = search.boxes;
  if (members.size() < 2 || search.gave_up) return std::nullopt;
  // Dims on which every member has the same extent cannot separate any of them.
  dims.erase(std::remove_if(dims.begin(), dims.end(),
                            [&](std::size_t d) {
                              const Box& first = boxes[members[0]];
                              for (std::size_t m : members)
                                if (boxes[m].offset[d] != first.offset[d] || boxes[m].shape[d] != first.shape[d])
                                  return false;
                              return true;
                            }),
             dims.end());
  // The same extent on every dim: the boxes coincide (duplicates were removed, so this
  // is reached only through a caller's mistake, but it is still an overlap).
  if (dims.empty()) return std::make_pair(members[0], members[1]);
  // The sorts below count against the bound too (a hostile index of many dims).
  search.comparisons += members.size() * dims.size();
  if (search.comparisons > kMaxComparisons) {
    search.gave_up = true;
    return std::nullopt;
  }
  std::optional<Split> best;
  std::size_t best_dim = 0;
  for (std::size_t d : dims) {
    Split s = split_on(boxes, members, d);
    const auto better = [&] {
      if (!best) return true;
      if (s.clean != best->clean) return s.clean;
      return s.group_start.size() > best->group_start.size();
    };
    if (better()) best = std::move(s), best_dim = d;
  }
  const Split& s = *best;
  const std::size_t groups = s.group_start.size() - 1;
  std::vector<std::size_t> rest;
  for (std::size_t d : dims)
    if (d != best_dim) rest.push_back(d);
  for (std::size_t g = 0; g < groups; ++g) {
    std::vector<std::size_t> same(s.sorted.begin() + static_cast<std::ptrdiff_t>(s.group_start[g]),
                                  s.sorted.begin() + static_cast<std::ptrdiff_t>(s.group_start[g + 1]));
    if (Pair p = find_overlap(search, std::move(same), rest)) return p;
  }
  if (s.clean) return std::nullopt;
  for (std::size_t g = 0; g < groups; ++g) {
    const Box& head = boxes[s.sorted[s.group_start[g]]];
    const int64_t end = head.offset[best_dim] + head.shape[best_dim];
    for (std::size_t h = g + 1; h < groups && boxes[s.sorted[s.group_start[h]]].offset[best_dim] < end; ++h) {
      search.comparisons += (s.group_start[g + 1] - s.group_start[g]) * (s.group_start[h + 1] - s.group_start[h]);
      if (search.comparisons > kMaxComparisons) {
        search.gave_up = true;
        return std::nullopt;
      }
      for (std::size_t i = s.group_start[g]; i < s.group_start[g + 1]; ++i)
        for (std::size_t j = s.group_start[h]; j < s.group_start[h + 1]; ++j)
          if (overlap(boxes[s.sorted[i]], boxes[s.sorted[j]])) return std::make_pair(s.sorted[i], s.sorted[j]);
    }
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
  if (shape.size() > kMaxDims) return "more than " + std::to_string(kMaxDims) + " dims";
  int64_t volume = 0;
  bool overflow = false;  // hostile input: the sum must not overflow on the way
  for (const Box& b : boxes) overflow = overflow || __builtin_add_overflow(volume, b.num_elements(), &volume);
  // Less than the whole: a gap, whatever else is wrong. More: some boxes overlap (every
  // box lies inside the tensor), and the search below names two of them.
  if (!overflow && volume < *total)
    return "the boxes cover " + std::to_string(volume) + " of the " + std::to_string(*total) + " elements";
  if (shape.empty() || boxes.size() < 2) return !overflow && volume == *total ? "" : "boxes overlap";
  // Equal volumes: the boxes tile the tensor unless two overlap.
  Search search{boxes};
  std::vector<std::size_t> all(boxes.size()), dims(shape.size());
  for (std::size_t i = 0; i < all.size(); ++i) all[i] = i;
  for (std::size_t d = 0; d < dims.size(); ++d) dims[d] = d;
  if (Pair p = find_overlap(search, std::move(all), std::move(dims)))
    return "boxes " + boxes[p->first].to_string() + " and " + boxes[p->second].to_string() +
           " overlap without being identical";
  if (search.gave_up)
    return std::to_string(boxes.size()) + " boxes are too irregular to check for overlaps (more than " +
           std::to_string(kMaxComparisons) + " pairs)";
  return !overflow && volume == *total ? "" : "boxes overlap";
}

}  // namespace distckpt::internal_layout
