/// StateDict: the named tensors and info values a rank saves or loads.
///
/// A tensor entry borrows the caller's memory: for each box the rank holds (see
/// TensorLayout::boxes_of), a pointer to that box's first element, and the box's element
/// strides (row-major and packed unless given: a view into a larger array, an array with
/// halo cells, a column-major array). Saves read, and loads fill, the box's elements in
/// place, whatever the strides; checksums, content hashes and staging copies always see
/// the packed row-major bytes, so a strided save stores the same bytes as a packed one.
/// The caller keeps the buffers alive and unmodified during save/load. Entries keep
/// insertion order, which is also the order of the checkpoint's index.
/// Every function here is local (building a dict involves no other rank; a save or load
/// then compares the dicts across ranks). Not thread-safe; build it on one thread.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <variant>
#include <vector>

#include "distckpt/dtype.h"
#include "distckpt/layout.h"
#include "distckpt/status.h"

namespace distckpt {

/// Element strides of one buffer, one per dimension of the box (outermost first), in
/// elements, not bytes: element (i0, i1, ...) of the box is at data + sum(i_d * strides[d])
/// elements. Empty: packed row-major. A save accepts any strides, zero (broadcast views)
/// and negative included; a load refuses zero, negative and overlapping ones (it would
/// write one element twice), naming the tensor.
using Strides = std::vector<int64_t>;

/// An info value: int, float, bool or string (epoch_num, step_num, user values).
using InfoValue = std::variant<int64_t, double, bool, std::string>;
/// The value as text (as a .ckpt or safetensors file stores it). Local, any thread,
/// cannot fail.
std::string info_value_to_string(const InfoValue& v);

struct TensorEntry {
  std::string name;
  DType dtype = DType::kFloat32;
  TensorLayout layout;
  /// One buffer per box this rank holds, in the order of layout.boxes_of(rank).
  std::vector<void*> buffers;
  std::vector<Box> boxes;  ///< the rank's boxes (filled by add_tensor)
  /// One per buffer; empty for a packed row-major buffer (add_tensor empties strides that
  /// describe one, so packed data takes the fast paths however it was described).
  std::vector<Strides> strides;
  bool packed(std::size_t box) const { return box >= strides.size() || strides[box].empty(); }
  /// Whether any of the rank's buffers is strided (not packed row-major).
  bool strided() const;
};

class StateDict {
 public:
  /// `rank` is the caller's rank in the communicator that will save or load this dict.
  explicit StateDict(int rank) : rank_(rank) {}

  int rank() const { return rank_; }

  /// Adds a tensor whose layout gives this rank one box (or none: pass nullptr when the
  /// rank is not in the layout's group). kInvalidArgument on a duplicate or empty name,
  /// an empty name, or a missing buffer.
  Status add_tensor(const std::string& name, DType dtype, void* data, const TensorLayout& layout);
  /// Adds a tensor whose layout gives this rank several boxes (explicit form): one
  /// buffer per box, in the order of layout.boxes_of(rank). kInvalidArgument as above,
  /// or for a buffer count other than the rank's box count.
  Status add_tensor(const std::string& name, DType dtype, std::vector<void*> buffers,
                    const TensorLayout& layout);
  /// The same with element strides per buffer (see Strides): one list per buffer, each
  /// with one stride per dimension of its box, or empty (packed row-major).
  /// kInvalidArgument as above, or for a stride list of another length.
  Status add_tensor(const std::string& name, DType dtype, void* data, const Strides& strides,
                    const TensorLayout& layout);
  Status add_tensor(const std::string& name, DType dtype, std::vector<void*> buffers, std::vector<Strides> strides,
                    const TensorLayout& layout);
  /// Adds a tensor that refers to the same memory as `entry` of another state dict (its
  /// name, dtype, layout, buffers and strides). kInvalidArgument on a duplicate name, or
  /// when the dicts' ranks differ.
  Status add_view(const TensorEntry& entry);

  /// Points a tensor at new buffers of the same boxes (its memory was reallocated, say
  /// by a framework moving a parameter to new storage), in the order of
  /// layout.boxes_of(rank). Dtype and layout stay. kNotFound for an unknown name;
  /// kInvalidArgument for a buffer count other than the rank's box count, or a null
  /// buffer for a non-empty box (the entry is then unchanged).
  Status set_buffers(const std::string& name, std::vector<void*> buffers);
  /// The same with new strides (one list per buffer, see Strides). The form without
  /// strides makes the entry packed row-major again.
  Status set_buffers(const std::string& name, std::vector<void*> buffers, std::vector<Strides> strides);

  /// Adds or replaces an info value. kInvalidArgument on an empty key.
  /// One overload per kind, so that a double never silently binds to an integer.
  Status set_info(const std::string& key, InfoValue value);
  Status set_info(const std::string& key, double value) { return set_info(key, InfoValue(value)); }
  Status set_info(const std::string& key, bool value) { return set_info(key, InfoValue(value)); }
  Status set_info(const std::string& key, int64_t value) { return set_info(key, InfoValue(value)); }
  Status set_info(const std::string& key, int value) { return set_info(key, InfoValue(int64_t{value})); }
  Status set_info(const std::string& key, std::string value) { return set_info(key, InfoValue(std::move(value))); }
  Status set_info(const std::string& key, const char* value) { return set_info(key, InfoValue(std::string(value))); }

  const std::vector<TensorEntry>& tensors() const { return tensors_; }
  const std::map<std::string, InfoValue>& info() const { return info_; }
  /// Index into tensors(), or -1.
  int find(const std::string& name) const;

 private:
  Status add_entry(const std::string& name, DType dtype, std::vector<void*> buffers, std::vector<Strides> strides,
                   bool with_strides, const TensorLayout& layout);
  Status replace_buffers(const std::string& name, std::vector<void*> buffers, std::vector<Strides> strides,
                         bool with_strides);

  int rank_;
  std::vector<TensorEntry> tensors_;
  std::map<std::string, int> by_name_;
  std::map<std::string, InfoValue> info_;
};

}  // namespace distckpt
