#include "state.h"

#include <nlohmann/json.hpp>

#include "transform/crc32c.h"

namespace distckpt::python {

TorchView torch_view(const std::string& name, py::handle t, bool keep_storage) {
  // Kept for the process's life (released: no destructor runs after the interpreter ends).
  static const py::handle strided = py::object(py::module_::import("torch").attr("strided")).release();
  static std::map<PyObject*, std::string>* dtype_names = new std::map<PyObject*, std::string>;  // dtypes live forever
  if (!py::object(t.attr("layout")).is(strided))
    type_error("tensor '" + name + "' is " + std::string(py::str(t.attr("layout"))) +
               ": only dense (strided) tensors are checkpointed");
  const py::object device = t.attr("device");
  // Other devices are staged by the Python layer (distckpt.torch) into host memory first.
  const std::string kind = device.attr("type").cast<std::string>();
  if (kind == "meta") type_error("tensor '" + name + "' is a meta tensor: it has no data to save or load into");
  if (kind != "cpu")
    type_error("tensor '" + name + "' is on " + std::string(py::str(device)) +
               ": this call takes host memory (distckpt.torch stages device tensors through host buffers)");
  const py::object dtype = t.attr("dtype");
  auto known = dtype_names->find(dtype.ptr());
  if (known == dtype_names->end()) {
    std::string text = py::str(dtype);
    if (text.rfind("torch.", 0) == 0) text = text.substr(6);
    if (!dtype_from_name(text)) text.clear();  // refused below, by name
    known = dtype_names->emplace(dtype.inc_ref().ptr(), text).first;
  }
  if (known->second.empty()) type_error("tensor '" + name + "': dtype " + std::string(py::str(dtype)) + " is not supported");
  TorchView view;
  view.dtype = known->second;
  for (py::handle extent : t.attr("shape")) view.shape.push_back(extent.cast<int64_t>());
  view.nbytes = t.attr("element_size")().cast<uint64_t>() * t.attr("numel")().cast<uint64_t>();
  view.address = t.attr("data_ptr")().cast<uintptr_t>();
  view.strides = t.attr("stride")().cast<std::vector<int64_t>>();
  view.owner = py::reinterpret_borrow<py::object>(t);
  if (keep_storage)
    view.owner = py::make_tuple(view.owner, py::hasattr(t, "untyped_storage") ? t.attr("untyped_storage")()
                                                                             : t.attr("storage")());
  return view;
}

void PyStateDict::add_torch(const std::vector<std::string>& names, const py::list& tensors, const py::list& layouts,
                            int world_size, bool follow) {
  if (tensors.size() != names.size() || layouts.size() != names.size())
    type_error("StateDict: names, tensors and layouts differ in length");
  std::map<std::vector<int64_t>, TensorLayout> replicated;
  for (std::size_t i = 0; i < names.size(); ++i) {
    TorchView view = torch_view(names[i], tensors[i], /*keep_storage=*/follow);
    const TensorLayout* layout = nullptr;
    if (!layouts[i].is_none()) {
      layout = &layouts[i].cast<const TensorLayout&>();
    } else {
      auto it = replicated.find(view.shape);
      if (it == replicated.end())
        it = replicated.emplace(view.shape, take(TensorLayout::from_device_matrix(
                                                to_shape(view.shape), {world_size}, Shape(view.shape.size(), -1)))).first;
      layout = &it->second;
    }
    add(names[i], view.dtype, view.address, view.nbytes, view.shape, view.strides, *layout, std::move(view.owner), false,
        follow ? py::reinterpret_borrow<py::object>(tensors[i]) : py::object(py::none()));
  }
}

py::dict save_result_dict(const SaveResult& s) {
  py::dict d;
  d["path"] = s.path;
  d["bytes_unique"] = s.bytes_unique;
  d["bytes_written"] = s.bytes_written;
  d["bytes_referenced"] = s.bytes_referenced;
  d["incremental_base"] = s.incremental_base;
  d["index_bytes"] = s.index_bytes;
  d["plan_s"] = s.plan_s;
  d["write_s"] = s.write_s;
  d["commit_s"] = s.commit_s;
  d["warning"] = s.warning;
  return d;
}

namespace {

TensorLayout layout_from_device_matrix(const std::vector<int64_t>& shape, const std::vector<int64_t>& dev_mat,
                                       const std::vector<int64_t>& tensor_map, const std::vector<int>& ranks) {
  return take(TensorLayout::from_device_matrix(to_shape(shape), to_shape(dev_mat), to_shape(tensor_map), ranks));
}

// boxes[r]: the (offset, shape) pairs rank r holds.
TensorLayout layout_from_boxes(const std::vector<int64_t>& shape,
                               const std::vector<std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>>>& boxes) {
  std::vector<std::vector<Box>> per_rank;
  for (const auto& rank : boxes) {
    per_rank.emplace_back();
    for (const auto& [offset, extent] : rank) per_rank.back().push_back(Box{to_shape(offset), to_shape(extent)});
  }
  return take(TensorLayout::from_boxes(to_shape(shape), per_rank));
}


py::dict save_state(PyComm& comm, PyStateDict& state, const std::string& root, const std::string& name, int64_t step,
                    int64_t epoch, const std::string& format, bool fsync, bool update_latest, const py::object& key,
                    bool incremental, const std::string& incremental_base, bool crc_check, std::optional<bool> integrated,
                    bool remove_redundancy, const std::string& enc_mode) {
  SaveOptions o;
  o.ckpt_crc_footer = crc_check;
  o.integrated = integrated;
  o.remove_redundancy = remove_redundancy;
  o.incremental = incremental;
  o.incremental_base = incremental_base;
  o.name = name;
  o.step = step;
  o.epoch = epoch;
  o.fsync = fsync;
  o.update_latest = update_latest;
  Comm& native = comm.get();
  agreed_arguments(native, [&] {
    state.refresh();
    o.format = format_from(format);
    // The mode was checked by distckpt.save (one of MindSpore's three names).
    if (auto k = key_from(key)) o.encryption = {*encryption_mode_from_name(enc_mode), k};
  });
  Result<SaveResult> r = without_gil([&] { return save(native, state.get(), root, o); });
  SaveResult s = take(std::move(r));
  return save_result_dict(s);
}

// A stored name's name in the state: rename's, else the longest prefix of prefix_map
// replaced (distckpt.load's prefix_map), else itself.
std::string renamed(const std::map<std::string, std::string>& rename, const std::map<std::string, std::string>& prefix_map,
                    const std::string& stored) {
  if (auto it = rename.find(stored); it != rename.end()) return it->second;
  const std::string* best = nullptr;
  for (const auto& [prefix, replacement] : prefix_map)
    if (stored.compare(0, prefix.size(), prefix) == 0 && (best == nullptr || prefix.size() > best->size())) best = &prefix;
  return best == nullptr ? stored : prefix_map.at(*best) + stored.substr(best->size());
}

}  // namespace

void set_name_options(LoadOptions& o, const std::map<std::string, std::string>& rename,
                      const std::map<std::string, std::string>& prefix_map, const std::vector<std::string>& specify_prefix,
                      const std::vector<std::string>& filter_prefix, const py::object& choice_func) {
  o.specify_prefix = specify_prefix;
  o.filter_prefix = filter_prefix;
  if (!choice_func.is_none()) {
    // Called from the load's own code, without the GIL: taken for the call; a Python
    // exception becomes a C++ one (the load's guard turns it into its error), cleared here.
    o.choice_func = [f = held_under_gil(choice_func)](const std::string& stored) -> bool {
      py::gil_scoped_acquire locked;
      try {
        return py::bool_((*f)(stored)).cast<bool>();
      } catch (py::error_already_set& e) {
        const std::string what = e.what();
        e.restore();
        PyErr_Clear();
        throw std::runtime_error("choice_func('" + stored + "') raised " + what);
      }
    };
  }
  if (!prefix_map.empty()) {
    o.rename_func = [rename, prefix_map](const std::string& stored) { return renamed(rename, prefix_map, stored); };
  } else {
    o.rename = rename;
  }
}

namespace {

py::dict load_state(PyComm& comm, PyStateDict& state, const std::string& path, bool strict, const py::object& key,
                    bool cast_floats, bool allow_unexpected, const std::map<std::string, std::string>& rename,
                    const std::map<std::string, std::string>& prefix_map, const std::vector<std::string>& specify_prefix,
                    const std::vector<std::string>& filter_prefix, const py::object& choice_func,
                    std::optional<bool> allow_unchecked) {
  LoadOptions o;
  o.strict = strict;
  o.cast_floats = cast_floats;
  o.allow_unexpected = allow_unexpected;
  o.allow_unchecked = allow_unchecked;
  set_name_options(o, rename, prefix_map, specify_prefix, filter_prefix, choice_func);
  Comm& native = comm.get();
  agreed_arguments(native, [&] {
    state.refresh();
    if (!state.readonly().empty())
      type_error("load: tensor '" + state.readonly().front() + "' is read-only (loads write into every tensor)");
    o.key = key_from(key);
  });
  Result<LoadResult> r = without_gil([&] { return load(native, state.get(), path, o); });
  LoadResult l = take(std::move(r));
  py::dict d;
  d["step"] = l.step;
  d["epoch"] = l.epoch;
  d["info"] = info_dict(l.info);
  d["loaded"] = l.loaded;
  d["missing_in_checkpoint"] = l.missing_in_checkpoint;
  d["unexpected_in_checkpoint"] = l.unexpected_in_checkpoint;
  d["bytes_read"] = l.bytes_read;
  d["bytes_needed"] = l.bytes_needed;
  d["load_s"] = l.load_s;
  d["warning"] = l.warning;
  return d;
}

// ---- tools that need no MPI ----

py::list list_root(const std::string& root) {
  RootListing listing = take(without_gil([&] { return list_checkpoints(root); }));
  py::list out;
  for (const CheckpointEntry& e : listing.entries) {
    if (e.state != EntryState::kCommitted) continue;
    py::dict d;
    d["name"] = e.name;
    d["step"] = e.step;
    d["epoch"] = e.epoch;
    d["bytes"] = e.bytes;
    d["referenced_bytes"] = e.referenced_bytes;
    d["references"] = e.references;
    d["format"] = std::string(format_name(e.format));
    d["latest"] = e.name == listing.latest;
    d["per_rank_files"] = e.per_rank_files;
    d["detail"] = e.detail;
    out.append(d);
  }
  return out;
}

void remove_from_root(const std::string& root, const std::string& name) {
  check(without_gil([&] { return remove_checkpoint(root, name); }));
}

// Collective: rank 0 resolves `path` (a root: its newest committed checkpoint) and reads
// its description; every rank gets it as JSON text {"path", "step", "epoch",
// "world_size", "info"}, or the same error. One read of the index, wherever the ranks run.
// Local (rank 0 of a load calls it, and the result travels in the load's first exchange):
// the checkpoint at `path` (a root: its newest) as JSON: path, step, epoch, world_size and
// every info value. Raises as the other calls (NotFoundError, AuthError, ...).
std::string read_description(const std::string& path, const py::object& key) {
  InspectOptions o;
  o.key = key_from(key);
  std::string text;
  check(without_gil([&]() -> Status {
    DISTCKPT_ASSIGN_OR_RETURN(std::string resolved, resolve_checkpoint(path, o));
    DISTCKPT_ASSIGN_OR_RETURN(CheckpointInfo info, read_checkpoint_info(resolved, o));
    nlohmann::ordered_json j;
    j["path"] = resolved;
    j["step"] = info.step;
    j["epoch"] = info.epoch;
    j["world_size"] = info.world_size;
    j["info"] = nlohmann::ordered_json::object();
    for (const auto& [name, value] : info.info)
      std::visit([&, &name = name](const auto& v) { j["info"][name] = v; }, value);
    text = j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
    return Status();
  }));
  return text;
}

py::dict verify_path(const std::string& path, const py::object& key, bool deep, std::optional<bool> allow_unchecked) {
  VerifyOptions o;
  o.key = key_from(key);
  o.deep = deep;
  o.allow_unchecked = allow_unchecked;
  Result<VerifyReport> r = without_gil([&] { return verify_checkpoint(path, o); });
  VerifyReport v = take(std::move(r));
  py::dict d;
  d["tensors"] = v.tensors;
  d["chunks"] = v.chunks;
  d["files"] = v.files;
  d["bytes_checked"] = v.bytes_checked;
  d["deep"] = v.deep;
  d["checksums"] = v.checksums;
  d["authenticated"] = v.authenticated;
  d["checked"] = v.checked;
  d["warning"] = v.warning;
  return d;
}

std::string convert_path(const std::string& src, const std::string& dst, const std::string& format,
                         const py::object& key) {
  ConvertOptions o;
  o.key = key_from(key);
  const Format to = format_from(format);
  Result<ConvertResult> r = without_gil([&] { return convert_checkpoint(src, dst, to, o); });
  return take(std::move(r)).path;
}

// One checkpoint, any format, read region by region in this process (no MPI).

// Sampled fingerprints of host buffers, one per (address, bytes): CRC32C of all the bytes up
// to 4 KiB, else of 8 spans of 512 bytes spread over the buffer, xor its size. Cheap
// enough to run over a whole model at every save; distckpt.torch compares replicas with it.
std::vector<uint32_t> fingerprints(const std::vector<std::pair<uintptr_t, uint64_t>>& buffers) {
  std::vector<uint32_t> out;
  out.reserve(buffers.size());
  py::gil_scoped_release unlocked;
  for (const auto& [address, bytes] : buffers) {
    const auto* data = reinterpret_cast<const unsigned char*>(address);
    uint32_t state = internal_transform::kCrc32cInit;
    if (bytes <= 4096) {
      if (bytes > 0) state = internal_transform::crc32c_extend(state, data, bytes);
    } else {
      for (uint64_t i = 0; i < 8; ++i) state = internal_transform::crc32c_extend(state, data + (bytes - 512) * i / 7, 512);
    }
    out.push_back(internal_transform::crc32c_finish(state) ^ static_cast<uint32_t>(bytes));
  }
  return out;
}

}  // namespace

void bind_state(py::module_& m) {
  py::class_<TensorLayout>(m, "TensorLayout")
      .def_static("_from_device_matrix", &layout_from_device_matrix)
      .def_static("_from_boxes", &layout_from_boxes)
      .def_property_readonly("global_shape",
                             [](const TensorLayout& l) { return std::vector<int64_t>(l.global_shape().begin(), l.global_shape().end()); })
      .def("boxes_of", [](const TensorLayout& l, int rank) {
        std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>> out;
        for (const Box& b : l.boxes_of(rank))
          out.emplace_back(std::vector<int64_t>(b.offset.begin(), b.offset.end()),
                           std::vector<int64_t>(b.shape.begin(), b.shape.end()));
        return out;
      });

  py::class_<PyStateDict>(m, "_StateDict")
      .def(py::init<int>())
      .def("_add", &PyStateDict::add)
      .def("_refresh", &PyStateDict::refresh)
      .def("_set_info", &PyStateDict::set_info)
      .def("_reset", &PyStateDict::reset)
      .def("_add_torch", &PyStateDict::add_torch)
      .def("keys", &PyStateDict::keys);

  m.def("_save", &save_state);
  m.def("_load", &load_state);
  m.def("_list_checkpoints", &list_root);
  m.def("_remove_checkpoint", &remove_from_root);
  m.def("_verify", &verify_path);
  m.def("_read_description", &read_description);
  m.def("_fingerprints", &fingerprints);
  m.def("_convert", &convert_path);
}

}  // namespace distckpt::python
