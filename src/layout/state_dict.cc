#include <sstream>

#include "distckpt/state_dict.h"
#include "base/text.h"

namespace distckpt {

std::string info_value_to_string(const InfoValue& v) {
  struct Visitor {
    std::string operator()(int64_t x) const { return std::to_string(x); }
    std::string operator()(double x) const {
      std::ostringstream os;
      os.precision(17);
      os << x;
      return os.str();
    }
    std::string operator()(bool x) const { return x ? "true" : "false"; }
    std::string operator()(const std::string& x) const { return x; }
  };
  return std::visit(Visitor{}, v);
}

namespace {

// Empties strides that describe a packed row-major buffer of `box` (dimensions of
// extent 1 may have any stride), so that such buffers take the packed paths.
Strides normalized(const Box& box, Strides strides) {
  if (box.num_elements() == 0) return {};  // nothing to walk
  int64_t expected = 1;
  for (std::size_t d = box.shape.size(); d-- > 0;) {
    const int64_t extent = box.shape[d];
    if (extent != 1 && strides[d] != expected) return strides;
    expected *= extent;
  }
  return {};
}

// Checks buffers (and strides, when given) against the rank's boxes; fills `strides`
// with one normalized list per buffer.
Status check_buffers(const std::string& where, const std::vector<Box>& boxes, const std::vector<void*>& buffers,
                     std::vector<Strides>& strides, bool with_strides) {
  if (buffers.size() != boxes.size())
    return invalid_argument(where + ": the layout gives this rank " + std::to_string(boxes.size()) +
                            " box(es) but " + std::to_string(buffers.size()) + " buffer(s) were passed");
  for (std::size_t i = 0; i < buffers.size(); ++i)
    if (buffers[i] == nullptr && boxes[i].num_elements() > 0)
      return invalid_argument(where + ": null buffer for box " + boxes[i].to_string());
  if (!with_strides) {
    strides.assign(buffers.size(), Strides());
    return Status();
  }
  if (strides.size() != buffers.size())
    return invalid_argument(where + ": " + std::to_string(strides.size()) + " stride list(s) for " +
                            std::to_string(buffers.size()) + " buffer(s)");
  for (std::size_t i = 0; i < strides.size(); ++i) {
    if (strides[i].empty()) continue;  // packed row-major
    if (strides[i].size() != boxes[i].shape.size())
      return invalid_argument(where + ": " + std::to_string(strides[i].size()) + " stride(s) for box " +
                              boxes[i].to_string() + " of " + std::to_string(boxes[i].shape.size()) + " dimension(s)");
    strides[i] = normalized(boxes[i], std::move(strides[i]));
  }
  return Status();
}

}  // namespace

bool TensorEntry::strided() const {
  for (const Strides& s : strides)
    if (!s.empty()) return true;
  return false;
}

Status StateDict::add_tensor(const std::string& name, DType dtype, void* data, const TensorLayout& layout) {
  std::vector<void*> buffers;
  if (data != nullptr) buffers.push_back(data);
  return add_tensor(name, dtype, std::move(buffers), layout);
}

Status StateDict::add_tensor(const std::string& name, DType dtype, void* data, const Strides& strides,
                             const TensorLayout& layout) {
  std::vector<void*> buffers;
  std::vector<Strides> all;
  if (data != nullptr) {
    buffers.push_back(data);
    all.push_back(strides);
  }
  return add_tensor(name, dtype, std::move(buffers), std::move(all), layout);
}

Status StateDict::add_tensor(const std::string& name, DType dtype, std::vector<void*> buffers,
                             const TensorLayout& layout) {
  return add_entry(name, dtype, std::move(buffers), {}, false, layout);
}

Status StateDict::add_tensor(const std::string& name, DType dtype, std::vector<void*> buffers,
                             std::vector<Strides> strides, const TensorLayout& layout) {
  return add_entry(name, dtype, std::move(buffers), std::move(strides), true, layout);
}

Status StateDict::add_view(const TensorEntry& entry) {
  // The strides describe the entry's own boxes: another rank's would be walked out of bounds.
  if (!entry.buffers.empty() && entry.layout.boxes_of(rank_) != entry.boxes)
    return invalid_argument("state dict: rank " + std::to_string(rank_) + ": tensor '" + entry.name +
                            "' was made for another rank (other boxes)");
  return add_entry(entry.name, entry.dtype, entry.buffers, entry.strides, !entry.strides.empty(), entry.layout);
}

Status StateDict::add_entry(const std::string& name, DType dtype, std::vector<void*> buffers,
                            std::vector<Strides> strides, bool with_strides, const TensorLayout& layout) {
  const std::string where = "state dict: rank " + std::to_string(rank_) + ": tensor '" + name + "'";
  if (name.empty()) return invalid_argument("state dict: rank " + std::to_string(rank_) + ": empty tensor name");
  // Names go into the index (protobuf strings), file listings and JSON: UTF-8 only.
  if (!internal_base::is_printable_utf8(name))
    return invalid_argument("state dict: rank " + std::to_string(rank_) + ": tensor name '" +
                            internal_base::printable(name) + "' is not printable UTF-8");
  if (by_name_.count(name)) return invalid_argument(where + " added twice");
  if (dtype_size(dtype) == 0) return invalid_argument(where + ": unknown dtype " + std::to_string(static_cast<int>(dtype)));
  if (layout.group_size() == 0) return invalid_argument(where + " has an empty layout");
  std::vector<Box> boxes = layout.boxes_of(rank_);
  DISTCKPT_RETURN_IF_ERROR(check_buffers(where, boxes, buffers, strides, with_strides));
  by_name_[name] = static_cast<int>(tensors_.size());
  tensors_.push_back(TensorEntry{name, dtype, layout, std::move(buffers), std::move(boxes), std::move(strides)});
  return Status();
}

Status StateDict::set_buffers(const std::string& name, std::vector<void*> buffers) {
  return replace_buffers(name, std::move(buffers), {}, false);
}

Status StateDict::set_buffers(const std::string& name, std::vector<void*> buffers, std::vector<Strides> strides) {
  return replace_buffers(name, std::move(buffers), std::move(strides), true);
}

Status StateDict::replace_buffers(const std::string& name, std::vector<void*> buffers, std::vector<Strides> strides,
                                  bool with_strides) {
  const int i = find(name);
  if (i < 0) return not_found("state dict: rank " + std::to_string(rank_) + ": no tensor '" + name + "'");
  TensorEntry& entry = tensors_[i];
  const std::string where = "state dict: rank " + std::to_string(rank_) + ": tensor '" + name + "'";
  DISTCKPT_RETURN_IF_ERROR(check_buffers(where, entry.boxes, buffers, strides, with_strides));
  entry.buffers = std::move(buffers);
  entry.strides = std::move(strides);
  return Status();
}

Status StateDict::set_info(const std::string& key, InfoValue value) {
  if (key.empty()) return invalid_argument("state dict: empty info key");
  if (!internal_base::is_printable_utf8(key))
    return invalid_argument("state dict: info key '" + internal_base::printable(key) + "' is not printable UTF-8");
  if (const auto* text = std::get_if<std::string>(&value); text && !internal_base::is_valid_utf8(*text))
    return invalid_argument("state dict: info value of '" + key + "' is not valid UTF-8 (store bytes as a tensor)");
  info_[key] = std::move(value);
  return Status();
}

int StateDict::find(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? -1 : it->second;
}

}  // namespace distckpt
