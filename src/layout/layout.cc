#include <algorithm>
#include <numeric>
#include <set>
#include <sstream>

#include "distckpt/layout.h"
#include "layout/slices.h"
#include "layout/tiling.h"

namespace distckpt {
namespace {

std::string join(const Shape& v) {
  std::ostringstream os;
  os << '[';
  for (std::size_t i = 0; i < v.size(); ++i) os << (i ? "," : "") << v[i];
  os << ']';
  return os.str();
}

Status check_ranks(std::vector<int>& ranks, int64_t group_size) {
  if (ranks.empty()) {
    ranks.resize(static_cast<std::size_t>(group_size));
    std::iota(ranks.begin(), ranks.end(), 0);
    return Status();
  }
  if (static_cast<int64_t>(ranks.size()) != group_size)
    return invalid_argument("layout: rank list has " + std::to_string(ranks.size()) +
                            " entries but the group has " + std::to_string(group_size) + " members");
  std::set<int> seen;
  for (int r : ranks) {
    if (r < 0) return invalid_argument("layout: negative rank " + std::to_string(r) + " in rank list");
    if (!seen.insert(r).second)
      return invalid_argument("layout: rank " + std::to_string(r) + " appears twice in rank list");
  }
  return Status();
}

Status check_shape(const Shape& shape) {
  if (shape.size() > internal_layout::kMaxDims)
    return invalid_argument("layout: global shape has " + std::to_string(shape.size()) + " dims (at most " +
                            std::to_string(internal_layout::kMaxDims) + ")");
  for (std::size_t i = 0; i < shape.size(); ++i)
    if (shape[i] < 0)
      return invalid_argument("layout: global shape " + join(shape) + " has a negative dimension");
  if (!internal_layout::checked_num_elements(shape))
    return invalid_argument("layout: global shape " + join(shape) + " has too many elements");
  return Status();
}

}  // namespace

Result<TensorLayout> TensorLayout::from_device_matrix(const Shape& global_shape, const Shape& dev_mat,
                                                      const Shape& tensor_map, std::vector<int> ranks) {
  DISTCKPT_RETURN_IF_ERROR(check_shape(global_shape));
  if (dev_mat.empty()) return invalid_argument("layout: dev_mat is empty");
  int64_t group = 1;
  for (int64_t d : dev_mat) {
    if (d <= 0) return invalid_argument("layout: dev_mat " + join(dev_mat) + " has a non-positive entry");
    group *= d;
    if (group > (int64_t{1} << 30)) return invalid_argument("layout: dev_mat " + join(dev_mat) + " is too large");
  }
  if (!ranks.empty() && static_cast<int64_t>(ranks.size()) != group)
    return invalid_argument("layout: product of dev_mat " + join(dev_mat) + " is " + std::to_string(group) +
                            " but the group has " + std::to_string(ranks.size()) + " ranks");
  DISTCKPT_RETURN_IF_ERROR(check_ranks(ranks, group));
  if (tensor_map.size() != global_shape.size())
    return invalid_argument("layout: tensor_map " + join(tensor_map) + " has " + std::to_string(tensor_map.size()) +
                            " entries but the tensor has " + std::to_string(global_shape.size()) + " dims");
  const int64_t naxes = static_cast<int64_t>(dev_mat.size());
  std::vector<bool> used(dev_mat.size(), false);
  for (std::size_t i = 0; i < tensor_map.size(); ++i) {
    const int64_t k = tensor_map[i];
    if (k == -1) continue;
    if (k < -1 || k >= naxes)
      return invalid_argument("layout: tensor_map[" + std::to_string(i) + "] = " + std::to_string(k) +
                              " is out of range for dev_mat " + join(dev_mat) + " (valid: -1.." +
                              std::to_string(naxes - 1) + ")");
    const std::size_t axis = static_cast<std::size_t>(naxes - 1 - k);
    if (used[axis])
      return invalid_argument("layout: tensor_map " + join(tensor_map) + " uses device axis " +
                              std::to_string(k) + " twice");
    used[axis] = true;
    if (global_shape[i] % dev_mat[axis] != 0)
      return invalid_argument("layout: dimension " + std::to_string(i) + " of shape " + join(global_shape) +
                              " (" + std::to_string(global_shape[i]) + ") is not divisible by dev_mat[" +
                              std::to_string(axis) + "] = " + std::to_string(dev_mat[axis]));
  }
  TensorLayout l;
  l.global_shape_ = global_shape;
  l.dev_mat_ = dev_mat;
  l.tensor_map_ = tensor_map;
  l.ranks_ = std::move(ranks);
  l.index_ranks();
  return l;
}

Result<TensorLayout> TensorLayout::from_boxes(const Shape& global_shape, std::vector<std::vector<Box>> boxes,
                                              std::vector<int> ranks) {
  DISTCKPT_RETURN_IF_ERROR(check_shape(global_shape));
  if (boxes.empty()) return invalid_argument("layout: explicit layout with no group members");
  if (!ranks.empty() && ranks.size() != boxes.size())
    return invalid_argument("layout: " + std::to_string(boxes.size()) + " box lists but " +
                            std::to_string(ranks.size()) + " ranks");
  DISTCKPT_RETURN_IF_ERROR(check_ranks(ranks, static_cast<int64_t>(boxes.size())));
  const Box whole = full_box(global_shape);
  std::set<Box> unique;
  for (std::size_t m = 0; m < boxes.size(); ++m) {
    for (const Box& b : boxes[m]) {
      // Built only on failure: a layout may hold 10^5 boxes.
      const auto where = [&] { return "layout: box " + b.to_string() + " of rank " + std::to_string(ranks[m]); };
      if (b.offset.size() != global_shape.size() || b.shape.size() != global_shape.size())
        return invalid_argument(where() + " has the wrong number of dims for shape " + join(global_shape));
      for (std::size_t d = 0; d < b.shape.size(); ++d)
        if (b.shape[d] < 0 || b.offset[d] < 0)
          return invalid_argument(where() + " has a negative offset or extent");
      if (!whole.contains(b)) return invalid_argument(where() + " lies outside shape " + join(global_shape));
      if (b.num_elements() > 0) unique.insert(b);
    }
  }
  const std::string tiling = internal_layout::check_tiling({unique.begin(), unique.end()}, global_shape);
  if (!tiling.empty()) return invalid_argument("layout: shape " + join(global_shape) + ": " + tiling);
  TensorLayout l;
  l.global_shape_ = global_shape;
  l.ranks_ = std::move(ranks);
  l.explicit_boxes_ = std::move(boxes);
  l.index_ranks();
  return l;
}

void TensorLayout::index_ranks() {
  bool contiguous = true;
  for (std::size_t i = 1; i < ranks_.size() && contiguous; ++i) contiguous = int64_t{ranks_[i]} - ranks_[i - 1] == 1;
  contiguous_first_ = contiguous && !ranks_.empty() ? ranks_[0] : -1;
  max_rank_ = ranks_.empty() ? -1 : *std::max_element(ranks_.begin(), ranks_.end());
  if (contiguous) return;
  by_rank_.reserve(ranks_.size());
  for (std::size_t i = 0; i < ranks_.size(); ++i) by_rank_.emplace_back(ranks_[i], static_cast<int>(i));
  std::sort(by_rank_.begin(), by_rank_.end());
}

int TensorLayout::group_index(int global_rank) const {
  if (contiguous_first_ >= 0) {
    const int64_t idx = int64_t{global_rank} - contiguous_first_;
    return idx >= 0 && idx < group_size() ? static_cast<int>(idx) : -1;
  }
  auto it = std::lower_bound(by_rank_.begin(), by_rank_.end(), std::make_pair(global_rank, -1));
  return it != by_rank_.end() && it->first == global_rank ? it->second : -1;
}

std::vector<Box> TensorLayout::boxes_of(int global_rank) const {
  const int idx = group_index(global_rank);
  if (idx < 0) return {};
  if (!is_device_matrix()) return explicit_boxes_[idx];
  return {slice_box(global_rank)};
}

namespace {
// Coordinates of group member `idx` in the device matrix (row-major, last fastest).
Shape coords_of(int64_t idx, const Shape& dev_mat) {
  Shape c(dev_mat.size());
  for (int a = static_cast<int>(dev_mat.size()) - 1; a >= 0; --a) {
    c[a] = idx % dev_mat[a];
    idx /= dev_mat[a];
  }
  return c;
}
}  // namespace

Box TensorLayout::slice_box(int global_rank) const {
  const Shape c = coords_of(group_index(global_rank), dev_mat_);
  const int64_t naxes = static_cast<int64_t>(dev_mat_.size());
  Box b{Shape(global_shape_.size(), 0), global_shape_};
  for (std::size_t i = 0; i < tensor_map_.size(); ++i) {
    if (tensor_map_[i] < 0) continue;
    const std::size_t axis = static_cast<std::size_t>(naxes - 1 - tensor_map_[i]);
    b.shape[i] = global_shape_[i] / dev_mat_[axis];
    b.offset[i] = c[axis] * b.shape[i];
  }
  return b;
}

int64_t TensorLayout::slice_index(int global_rank) const {
  const Shape c = coords_of(group_index(global_rank), dev_mat_);
  const int64_t naxes = static_cast<int64_t>(dev_mat_.size());
  int64_t index = 0;
  for (std::size_t i = 0; i < tensor_map_.size(); ++i) {
    if (tensor_map_[i] < 0) continue;
    const std::size_t axis = static_cast<std::size_t>(naxes - 1 - tensor_map_[i]);
    index = index * dev_mat_[axis] + c[axis];
  }
  return index;
}

std::vector<int> TensorLayout::replica_group(int global_rank) const {
  std::vector<int> group;
  const int idx = group_index(global_rank);
  if (idx < 0) return group;
  if (!is_device_matrix()) {
    for (int m = 0; m < group_size(); ++m)
      if (explicit_boxes_[m] == explicit_boxes_[idx]) group.push_back(ranks_[m]);
  } else {
    const internal_layout::DeviceSlices slices(*this);
    group.reserve(static_cast<std::size_t>(slices.replicas()));
    slices.for_each_holder(slice_index(global_rank), [&](int member) { group.push_back(ranks_[member]); });
  }
  if (!std::is_sorted(group.begin(), group.end())) std::sort(group.begin(), group.end());
  return group;
}

std::string TensorLayout::to_string() const {
  std::ostringstream os;
  os << "shape=" << join(global_shape_);
  if (is_device_matrix()) {
    os << " dev_mat=" << join(dev_mat_) << " tensor_map=" << join(tensor_map_);
  } else {
    os << " explicit boxes for " << explicit_boxes_.size() << " ranks";
  }
  return os.str();
}

}  // namespace distckpt
