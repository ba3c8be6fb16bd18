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
  std::sort(boxes.begin(), boxes.end());
  int64_t volume = 0;
  for (std::size_t i = 0; i < boxes.size(); ++i) {
    volume += boxes[i].num_elements();
    for (std::size_t j = i + 1; j < boxes.size(); ++j) {
      // Sorted by offset: once a box starts past the end of box i along dim 0, no later
      // box can overlap it.
      if (!shape.empty() && boxes[j].offset[0] >= boxes[i].offset[0] + boxes[i].shape[0]) break;
      if (!intersect(boxes[i], boxes[j]).empty())
        return "boxes " + boxes[i].to_string() + " and " + boxes[j].to_string() + " overlap without being identical";
    }
  }
  if (volume != *total)
    return "the boxes cover " + std::to_string(volume) + " of the " + std::to_string(*total) + " elements";
  return "";
}

}  // namespace distckpt::internal_layout
