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

Status StateDict::add_tensor(const std::string& name, DType dtype, void* data, const TensorLayout& layout) {
  std::vector<void*> buffers;
  if (data != nullptr) buffers.push_back(data);
  return add_tensor(name, dtype, std::move(buffers), layout);
}

Status StateDict::add_tensor(const std::string& name, DType dtype, std::vector<void*> buffers,
                             const TensorLayout& layout) {
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
  if (buffers.size() != boxes.size())
    return invalid_argument(where + ": the layout gives this rank " + std::to_string(boxes.size()) +
                            " box(es) but " + std::to_string(buffers.size()) + " buffer(s) were passed");
  for (std::size_t i = 0; i < buffers.size(); ++i)
    if (buffers[i] == nullptr && boxes[i].num_elements() > 0)
      return invalid_argument(where + ": null buffer for box " + boxes[i].to_string());
  by_name_[name] = static_cast<int>(tensors_.size());
  tensors_.push_back(TensorEntry{name, dtype, layout, std::move(buffers), std::move(boxes)});
  return Status();
}

Status StateDict::set_buffers(const std::string& name, std::vector<void*> buffers) {
  const int i = find(name);
  if (i < 0) return not_found("state dict: rank " + std::to_string(rank_) + ": no tensor '" + name + "'");
  TensorEntry& entry = tensors_[i];
  const std::string where = "state dict: rank " + std::to_string(rank_) + ": tensor '" + name + "'";
  if (buffers.size() != entry.boxes.size())
    return invalid_argument(where + ": the layout gives this rank " + std::to_string(entry.boxes.size()) +
                            " box(es) but " + std::to_string(buffers.size()) + " buffer(s) were passed");
  for (std::size_t b = 0; b < buffers.size(); ++b)
    if (buffers[b] == nullptr && entry.boxes[b].num_elements() > 0)
      return invalid_argument(where + ": null buffer for box " + entry.boxes[b].to_string());
  entry.buffers = std::move(buffers);
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
