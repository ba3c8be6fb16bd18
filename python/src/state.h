// PyStateDict: a StateDict whose buffers belong to Python objects, and the result
// conversions that the manager's bindings share with save and load.
#pragma once

#include "common.h"

namespace distckpt::python {

// A torch tensor's memory as the StateDict takes it. owner: the tensor, and with keep_storage
// its storage too (a tensor given new storage later, p.data = ..., leaves the old one alive
// until the StateDict follows it).
struct TorchView {
  uintptr_t address = 0;
  uint64_t nbytes = 0;
  std::string dtype;  // our name: "float32", "bfloat16"
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;  // torch's, in elements (the core tells packed ones)
  py::object owner;
};
// The checks every torch tensor passes: dense (strided layout), on the CPU, a dtype we
// store. Any strides (views, transposes, expanded tensors: the core packs them). TypeError
// naming the tensor. GIL held.
TorchView torch_view(const std::string& name, py::handle t, bool keep_storage);

// A StateDict whose buffers belong to Python objects: it holds a reference to each, so
// that they outlive it.
class PyStateDict {
 public:
  explicit PyStateDict(int rank) : state_(rank) {}
  StateDict& get() { return state_; }
  // A tensor by address: `owner` keeps the memory alive; `readonly` refuses loads into it;
  // `shape` must be the rank's box; `strides` in elements (empty: packed row-major).
  // `movable` (a torch tensor, else None) may be given new storage later: refresh() follows it.
  void add(const std::string& name, const std::string& dtype, uintptr_t address, uint64_t nbytes,
           const std::vector<int64_t>& shape, const std::vector<int64_t>& strides, const TensorLayout& layout,
           py::object owner, bool readonly, py::object movable) {
    const auto dt = dtype_from_name(dtype);
    if (!dt) type_error("tensor '" + name + "': unknown dtype '" + dtype + "'");
    const std::vector<Box> boxes = layout.boxes_of(state_.rank());
    if (boxes.size() > 1)
      type_error("tensor '" + name + "': the layout gives rank " + std::to_string(state_.rank()) + " " +
                 std::to_string(boxes.size()) + " boxes; pass one array per box (not supported yet)");
    const uint64_t want = boxes.empty() ? 0 : static_cast<uint64_t>(boxes[0].num_elements()) * dtype_size(*dt);
    if (nbytes != want)
      type_error("tensor '" + name + "': " + std::to_string(nbytes) + " bytes on rank " + std::to_string(state_.rank()) +
                 ", but its layout gives this rank " + (boxes.empty() ? std::string("no box") : boxes[0].to_string()) +
                 " of " + std::string(dtype_name(*dt)) + " (" + std::to_string(want) + " bytes)");
    // The same bytes in another shape (a transposed weight, a flat array) would be saved
    // and loaded scrambled: the array's shape is the box's.
    if (!boxes.empty() && Shape(shape.begin(), shape.end()) != boxes[0].shape)
      type_error("tensor '" + name + "': shape " + shape_text(shape) + " on rank " + std::to_string(state_.rank()) +
                 ", but its layout gives this rank the box " + boxes[0].to_string());
    void* data = boxes.empty() ? nullptr : reinterpret_cast<void*>(address);
    if (data == nullptr && want > 0) type_error("tensor '" + name + "': null data");
    // A zero-size box still needs a non-null buffer.
    if (data == nullptr && !boxes.empty()) data = &empty_;
    check(boxes.empty() ? state_.add_tensor(name, *dt, data, layout)
                        : state_.add_tensor(name, *dt, data, Strides(strides), layout));
    owners_.push_back(std::move(owner));
    if (readonly) readonly_.push_back(name);
    if (!movable.is_none() && !boxes.empty())
      movable_.push_back(Movable{name, std::move(movable), address, dtype, shape, strides, owners_.size() - 1});
  }
  // Adds torch tensors in one call, each checked by torch_view. `layouts[i]` is a TensorLayout
  // or None (replicated over `world_size` ranks). `follow` (StateDict's rule): the StateDict
  // keeps each tensor's storage alive and follows new storage at refresh(); without it
  // (distckpt.torch's state dicts, which live for one call) each tensor is its own owner.
  // TypeError naming the tensor. GIL held.
  void add_torch(const std::vector<std::string>& names, const py::list& tensors, const py::list& layouts,
                 int world_size, bool follow);
  // Follows torch tensors given new storage since they were added (same shape and
  // dtype); raises TypeError naming one whose shape, dtype or density changed. The
  // GIL is held. Cheap when nothing moved: one data_ptr() and one stride() per torch tensor.
  void refresh() {
    for (Movable& m : movable_) {
      // In place (t.t_(), as_strided_) keeps the address but not the strides.
      if (m.tensor.attr("data_ptr")().cast<uintptr_t>() == m.address &&
          m.tensor.attr("stride")().cast<std::vector<int64_t>>() == m.strides)
        continue;
      TorchView view = torch_view(m.name, m.tensor, /*keep_storage=*/true);
      if (view.dtype != m.dtype || view.shape != m.shape)  // the same bytes, then (a dense tensor)
        type_error("tensor '" + m.name + "' changed since the StateDict was made: " + m.dtype + " " +
                   shape_text(m.shape) + ", now " + view.dtype + " " + shape_text(view.shape) +
                   " (make a new StateDict)");
      if (view.address == 0 && view.nbytes > 0) type_error("tensor '" + m.name + "': null data");
      check(state_.set_buffers(m.name, {reinterpret_cast<void*>(view.address)}, {Strides(view.strides)}));
      owners_[m.owner] = std::move(view.owner);  // the new storage lives, the old one may go
      m.address = view.address;
      m.strides = view.strides;
    }
  }
  void set_info(const std::string& key, py::handle value) { check(state_.set_info(key, to_info_value(key, value))); }
  // Empties it (tensors, info, the references it held), keeping the object: a manager
  // borrows it, and distckpt.torch refills it before each save (before_save).
  void reset() {
    state_ = StateDict(state_.rank());
    owners_.clear();
    readonly_.clear();
    movable_.clear();
  }
  const std::vector<std::string>& readonly() const { return readonly_; }
  std::vector<std::string> keys() const {
    std::vector<std::string> out;
    for (const TensorEntry& e : state_.tensors()) out.push_back(e.name);
    return out;
  }

 private:
  StateDict state_;
  std::vector<py::object> owners_;
  std::vector<std::string> readonly_;
  struct Movable {
    std::string name;
    py::object tensor;
    uintptr_t address;
    std::string dtype;
    std::vector<int64_t> shape;
    std::vector<int64_t> strides;
    std::size_t owner;  // index into owners_
  };
  std::vector<Movable> movable_;
  char empty_ = 0;
};

// Fills `o`'s filters and renames as distckpt.load's arguments give them (prefix_map
// through a rename_func; choice_func called with the GIL taken, its exception a C++ one).
void set_name_options(LoadOptions& o, const std::map<std::string, std::string>& rename,
                      const std::map<std::string, std::string>& prefix_map, const std::vector<std::string>& specify_prefix,
                      const std::vector<std::string>& filter_prefix, const py::object& choice_func);

// A SaveResult as the dict distckpt.SaveResult is made from.
py::dict save_result_dict(const SaveResult& s);

}  // namespace distckpt::python
