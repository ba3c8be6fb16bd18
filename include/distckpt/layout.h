/// Boxes and tensor layouts: how a global tensor is split over a group of ranks.
///
/// Device-matrix form, with MindSpore's exact semantics:
///   * `dev_mat` lists the device-matrix axes; its product is the group size. A rank's
///     coordinate is its index in the group written in `dev_mat`, row-major (last axis
///     varies fastest).
///   * `tensor_map` has one entry per tensor dimension: -1 = not split; k >= 0 = split
///     across device-matrix axis len(dev_mat)-1-k (counted from the right) into
///     dev_mat[len-1-k] equal parts.
///   * Ranks whose coordinates differ only on axes the tensor map does not name hold
///     identical slices (replicas).
/// Example: shape [32,16], dev_mat [2,4], tensor_map [1,-1]: ranks 0-3 hold rows 0-15,
/// ranks 4-7 rows 16-31.
///
/// Explicit form: any list of boxes per group member, for irregular shards. Members
/// holding an identical box are replicas of each other.
///
/// Every function here is local (not collective), thread-safe on const objects, and
/// allocates only what it returns.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "distckpt/status.h"

namespace distckpt {

using Shape = std::vector<int64_t>;

/// A hyper-rectangle of a global tensor: offset[] + shape[] (same rank, shape >= 0).
struct Box {
  Shape offset;
  Shape shape;

  int64_t num_elements() const;  ///< product of shape (1 for a 0-d box)
  bool empty() const { return num_elements() == 0; }
  bool contains(const Box& inner) const;
  friend bool operator==(const Box& a, const Box& b) {
    return a.offset == b.offset && a.shape == b.shape;
  }
  friend bool operator<(const Box& a, const Box& b) {
    return a.offset != b.offset ? a.offset < b.offset : a.shape < b.shape;
  }
  std::string to_string() const;  ///< "[0:16, 0:16]"
};

/// The whole tensor as a box.
Box full_box(const Shape& global_shape);
/// The intersection of two boxes of the same rank; an empty box (some shape 0) if disjoint.
Box intersect(const Box& a, const Box& b);

/// Copies the elements of `region` from a row-major buffer holding `src_box` into a
/// row-major buffer holding `dst_box`. Precondition: both boxes contain `region`.
void copy_box(const void* src, const Box& src_box, void* dst, const Box& dst_box,
              const Box& region, std::size_t elem_size);

class TensorLayout {
 public:
  /// Device-matrix form. `ranks` maps group index -> global rank; empty means the
  /// identity 0..prod(dev_mat)-1. Fails with kInvalidArgument on: a tensor_map entry
  /// out of range, a device axis used twice, a tensor_map of the wrong length, a
  /// dimension not divisible by its split, prod(dev_mat) != group size, a
  /// non-positive dev_mat entry, duplicate or negative ranks.
  static Result<TensorLayout> from_device_matrix(const Shape& global_shape, const Shape& dev_mat,
                                                 const Shape& tensor_map,
                                                 std::vector<int> ranks = {});

  /// Explicit form: boxes[i] lists the boxes held by group member i (ranks[i], or i
  /// when `ranks` is empty). Fails with kInvalidArgument when a box falls outside the
  /// tensor or has the wrong number of dims, when two distinct boxes overlap (identical
  /// boxes on several members are replicas), or when the boxes leave part of the tensor
  /// uncovered.
  static Result<TensorLayout> from_boxes(const Shape& global_shape,
                                         std::vector<std::vector<Box>> boxes,
                                         std::vector<int> ranks = {});

  const Shape& global_shape() const { return global_shape_; }
  bool is_device_matrix() const { return explicit_boxes_.empty(); }
  const Shape& dev_mat() const { return dev_mat_; }        // empty in explicit form
  const Shape& tensor_map() const { return tensor_map_; }  // empty in explicit form
  const std::vector<int>& ranks() const { return ranks_; }
  int group_size() const { return static_cast<int>(ranks_.size()); }
  /// The first rank when the group is the contiguous run first, first+1, ... (the
  /// identity group, a pipeline stage), else -1.
  int contiguous_first_rank() const { return contiguous_first_; }
  /// The largest global rank in the group.
  int max_rank() const { return max_rank_; }

  /// Position of a global rank in the group, or -1 when it is not a member. O(1) for a
  /// contiguous group, O(log group size) otherwise.
  int group_index(int global_rank) const;

  /// The boxes a global rank holds (one box in device-matrix form; none for a non-member).
  std::vector<Box> boxes_of(int global_rank) const;
  /// Device-matrix form: the one box of a member. Precondition: device-matrix form and
  /// a member (group_index >= 0); otherwise the result is meaningless.
  Box slice_box(int global_rank) const;
  /// Device-matrix form: row-major position of the member's part numbers over the
  /// split dims (0 when nothing is split). Precondition: member.
  int64_t slice_index(int global_rank) const;
  /// Global ranks holding exactly the same box (including the rank itself), ascending;
  /// empty for a non-member. Device-matrix form: O(replicas); explicit form: members
  /// holding an identical list of boxes, O(group size).
  std::vector<int> replica_group(int global_rank) const;

  std::string to_string() const;

 private:
  Shape global_shape_;
  Shape dev_mat_;
  Shape tensor_map_;
  std::vector<int> ranks_;
  std::vector<std::vector<Box>> explicit_boxes_;
  int contiguous_first_ = -1;
  int max_rank_ = -1;
  std::vector<std::pair<int, int>> by_rank_;  ///< (global rank, group index), sorted; non-contiguous groups only

  void index_ranks();
};

}  // namespace distckpt
