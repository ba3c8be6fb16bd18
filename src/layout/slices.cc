#include "layout/slices.h"

namespace distckpt::internal_layout {

DeviceSlices::DeviceSlices(const TensorLayout& layout)
    : global_shape_(layout.global_shape()), dev_mat_(layout.dev_mat()), stride_(dev_mat_.size(), 1) {
  const int naxes = static_cast<int>(dev_mat_.size());
  for (int a = naxes - 2; a >= 0; --a) stride_[a] = stride_[a + 1] * dev_mat_[a + 1];
  std::vector<bool> named(dev_mat_.size(), false);
  const Shape& map = layout.tensor_map();
  for (std::size_t d = 0; d < map.size(); ++d) {
    if (map[d] < 0) continue;
    const int axis = naxes - 1 - static_cast<int>(map[d]);
    named[axis] = true;
    split_dims_.push_back(static_cast<int>(d));
    split_axes_.push_back(axis);
    count_ *= dev_mat_[axis];
  }
  for (int a = 0; a < naxes; ++a)
    if (!named[a]) {
      free_axes_.push_back(a);
      replicas_ *= dev_mat_[a];
    }
}

Box DeviceSlices::box(int64_t slice) const {
  Box b{Shape(global_shape_.size(), 0), global_shape_};
  for (int i = static_cast<int>(split_dims_.size()) - 1; i >= 0; --i) {
    const int d = split_dims_[static_cast<std::size_t>(i)];
    const int64_t parts = dev_mat_[split_axes_[static_cast<std::size_t>(i)]];
    b.shape[d] = global_shape_[d] / parts;
    b.offset[d] = (slice % parts) * b.shape[d];
    slice /= parts;
  }
  return b;
}

}  // namespace distckpt::internal_layout
