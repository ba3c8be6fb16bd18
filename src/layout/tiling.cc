#include "layout/tiling.h"

#include <algorithm>
#include <limits>

namespace distckpt::internal_layout {

std::optional<int64_t> checked_num_elements(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) return std::nullopt;
    if (d != 0 && n > std::numeric_limits<int64_t>::max() / 16 / d) return std::nullopt;
    n *= d;
  }
  return n;
}

std::string check_tiling(std::vector<Box> boxes, const Shape& shape) {
  const auto total = checked_num_elements(shape);
  if (!total) return "shape has a negative or overflowing dimension";
  int64_t volume = 0;
  for (const Box& b : boxes) volume += b.num_elements();
  // Less than the whole: a gap, whatever else is wrong. More: some boxes overlap, and
  // the sweep below names two of them.
  if (volume < *total)
    return "the boxes cover " + std::to_string(volume) + " of the " + std::to_string(*total) + " elements";
  if (shape.empty() || boxes.size() < 2) return volume == *total ? "" : "boxes overlap";
  // Sweep along the dimension split into the most parts: sorted by offset on it, box i
  // can only overlap the boxes that start before it ends there. For the slab and grid
  // splits layouts produce this is near-linear (a 1 x N split sweeps along N).
  std::size_t sweep = 0, best = 0;
  for (std::size_t d = 0; d < shape.size(); ++d) {
    std::vector<int64_t> starts;
    for (const Box& b : boxes) starts.push_back(b.offset[d]);
    std::sort(starts.begin(), starts.end());
    const std::size_t distinct = static_cast<std::size_t>(std::unique(starts.begin(), starts.end()) - starts.begin());
    if (distinct > best) best = distinct, sweep = d;
  }
  std::sort(boxes.begin(), boxes.end(), [sweep](const Box& a, const Box& b) {
    return a.offset[sweep] != b.offset[sweep] ? a.offset[sweep] < b.offset[sweep] : a < b;
  });
  for (std::size_t i = 0; i < boxes.size(); ++i) {
    const int64_t end = boxes[i].offset[sweep] + boxes[i].shape[sweep];
    for (std::size_t j = i + 1; j < boxes.size() && boxes[j].offset[sweep] < end; ++j)
      if (!intersect(boxes[i], boxes[j]).empty())
        return "boxes " + boxes[i].to_string() + " and " + boxes[j].to_string() + " overlap without being identical";
  }
  // Disjoint boxes inside the tensor whose volumes add up to the whole cover it.
  return volume == *total ? "" : "boxes overlap";
}

}  // namespace distckpt::internal_layout
