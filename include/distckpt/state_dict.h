// StateDict: the named tensors and info values a rank saves or loads.
//
// A tensor entry borrows the caller's memory: for each box the rank holds (see
// TensorLayout::boxes_of), a pointer to a row-major buffer of that box's elements.
// The caller keeps the buffers alive and unmodified during save/load. Entries keep
// insertion order, which is also the order of the checkpoint's index.
// Every function here is local (building a dict involves no other rank; a save or load
// then compares the dicts across ranks). Not thread-safe; build it on one thread.
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

// An info value: int, float, bool or string (epoch_num, step_num, user values).
using InfoValue = std::variant<int64_t, double, bool, std::string>;
// The value as text (as a .ckpt or safetensors file stores it). Local, any thread,
// cannot fail.
std::string info_value_to_string(const InfoValue& v);

struct TensorEntry {
  std::string name;
  DType dtype = DType::kFloat32;
  TensorLayout layout;
  // One buffer per box this rank holds, in the order of layout.boxes_of(rank).
  std::vector<void*> buffers;
  std::vector<Box> boxes;  // the rank's boxes (filled by add_tensor)
};

class StateDict {
 public:
  // `rank` is the caller's rank in the communicator that will save or load this dict.
  explicit StateDict(int rank) : rank_(rank) {}

  int rank() const { return rank_; }

  // Adds a tensor whose layout gives this rank one box (or none: pass nullptr when the
  // rank is not in the layout's group). kInvalidArgument on a duplicate or empty name,
  // an empty name, or a missing buffer.
  Status add_tensor(const std::string& name, DType dtype, void* data, const TensorLayout& layout);
  // Adds a tensor whose layout gives this rank several boxes (explicit form): one
  // buffer per box, in the order of layout.boxes_of(rank). kInvalidArgument as above,
  // or for a buffer count other than the rank's box count.
  Status add_tensor(const std::string& name, DType dtype, std::vector<void*> buffers,
                    const TensorLayout& layout);

  // Points a tensor at new buffers of the same boxes (its memory was reallocated, say
  // by a framework moving a parameter to new storage), in the order of
  // layout.boxes_of(rank). Dtype and layout stay. kNotFound for an unknown name;
  // kInvalidArgument for a buffer count other than the rank's box count, or a null
  // buffer for a non-empty box (the entry is then unchanged).
  Status set_buffers(const std::string& name, std::vector<void*> buffers);

  // Adds or replaces an info value. kInvalidArgument on an empty key.
  // One overload per kind, so that a double never silently binds to an integer.
  Status set_info(const std::string& key, InfoValue value);
  Status set_info(const std::string& key, double value) { return set_info(key, InfoValue(value)); }
  Status set_info(const std::string& key, bool value) { return set_info(key, InfoValue(value)); }
  Status set_info(const std::string& key, int64_t value) { return set_info(key, InfoValue(value)); }
  Status set_info(const std::string& key, int value) { return set_info(key, InfoValue(int64_t{value})); }
  Status set_info(const std::string& key, std::string value) { return set_info(key, InfoValue(std::move(value))); }
  Status set_info(const std::string& key, const char* value) { return set_info(key, InfoValue(std::string(value))); }

  const std::vector<TensorEntry>& tensors() const { return tensors_; }
  const std::map<std::string, InfoValue>& info() const { return info_; }
  // Index into tensors(), or -1.
  int find(const std::string& name) const;

 private:
  int rank_;
  std::vector<TensorEntry> tensors_;
  std::map<std::string, int> by_name_;
  std::map<std::string, InfoValue> info_;
};

}  // namespace distckpt
