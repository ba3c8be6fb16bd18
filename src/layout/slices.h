// The distinct slices of a device-matrix layout and who holds each, computed from the
// layout alone: O(dims) per slice box and O(replicas) per holder list, so planners never
// compare ranks or boxes pairwise.
#pragma once

#include <cstdint>
#include <vector>

#include "distckpt/layout.h"

namespace distckpt::internal_layout {

class DeviceSlices {
 public:
  // Precondition: `layout` is in device-matrix form and outlives this object.
  explicit DeviceSlices(const TensorLayout& layout);

  int64_t count() const { return count_; }        // distinct slices: product of the split axes
  int64_t replicas() const { return replicas_; }  // holders of each slice
  // The box of slice `slice` (0 <= slice < count(), numbered as TensorLayout::slice_index).
  Box box(int64_t slice) const;
  // Calls fn(group index) for each holder of `slice`, in ascending group index.
  template <class Fn>
  void for_each_holder(int64_t slice, Fn&& fn) const {
    int64_t base = 0;
    for (int i = static_cast<int>(split_dims_.size()) - 1; i >= 0; --i) {
      const int axis = split_axes_[static_cast<std::size_t>(i)];
      base += (slice % dev_mat_[axis]) * stride_[axis];
      slice /= dev_mat_[axis];
    }
    std::vector<int64_t> coord(free_axes_.size(), 0);  // odometer, last free axis fastest
    for (int64_t n = 0; n < replicas_; ++n) {
      int64_t member = base;
      for (std::size_t f = 0; f < free_axes_.size(); ++f) member += coord[f] * stride_[free_axes_[f]];
      fn(static_cast<int>(member));
      for (std::size_t f = free_axes_.size(); f-- > 0;) {
        if (++coord[f] < dev_mat_[free_axes_[f]]) break;
        coord[f] = 0;
      }
    }
  }

 private:
  Shape global_shape_;
  Shape dev_mat_;
  std::vector<int64_t> stride_;   // group-index stride of each device axis (row-major)
  std::vector<int> split_dims_;   // tensor dims that are split, in order
  std::vector<int> split_axes_;   // the device axis splitting each of them
  std::vector<int> free_axes_;    // device axes the tensor map does not name, in order
  int64_t count_ = 1;
  int64_t replicas_ = 1;
};

}  // namespace distckpt::internal_layout
