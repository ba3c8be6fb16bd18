// _Reader: one checkpoint, any format, read region by region in this process (no MPI).
#include "common.h"
#include "format/format.h"  // info_values: the index's info map
#include "plan/match.h"
#include "state.h"  // set_name_options
#include "tools/reader.h"

namespace distckpt::python {
namespace {

class PyReader {
 public:
  PyReader(const std::string& path, const py::object& key, bool check_files) : key_(key_from(key)) {
    auto r = without_gil([&] { return internal_tools::CheckpointReader::open(posix_filesystem(), path, key_.get()); });
    reader_ = take(std::move(r));
    if (check_files) check(without_gil([&] { return reader_->check_files(); }));
    for (int t = 0; t < reader_->index().tensors_size(); ++t) by_name_[reader_->index().tensors(t).name()] = t;
  }
  std::vector<std::string> keys() const {
    std::vector<std::string> out;
    for (const auto& t : reader_->index().tensors()) out.push_back(t.name());
    return out;
  }
  // name -> (dtype, shape)
  py::dict tensors() const {
    py::dict d;
    for (const auto& t : reader_->index().tensors())
      d[py::str(t.name())] = py::make_tuple(t.dtype(), std::vector<int64_t>(t.global_shape().begin(), t.global_shape().end()));
    return d;
  }
  std::string unchecked_reason() const { return reader_->unchecked_reason(); }
  py::dict meta() const {
    const auto& index = reader_->index();
    py::dict d;
    d["name"] = index.name();
    d["step"] = index.step();
    d["epoch"] = index.epoch();
    d["world_size"] = index.world_size();
    d["writer_version"] = index.writer_version();
    d["info"] = info_dict(internal_format::info_values(index));  // every stored info value
    return d;
  }
  // Matches a state's tensors (name, shape) to the stored ones as distckpt.load does
  // (internal_plan::match_state: rename, then the longest prefix of prefix_map; shapes
  // equal), without dtypes (load_into's copy converts). Returns ([(state name, stored
  // name)], missing state names, unexpected stored names); MismatchError names a shape
  // that differs, ValueError a rename that gives two stored tensors one name.
  py::tuple match(const std::vector<std::pair<std::string, std::vector<int64_t>>>& entries,
                  const std::map<std::string, std::string>& rename,
                  const std::map<std::string, std::string>& prefix_map) const {
    LoadOptions options;
    options.strict = false;            // both lists are returned, for torch's strict
    options.allow_unexpected = true;
    set_name_options(options, rename, prefix_map, {}, {}, py::none());
    // Matching reads no bytes: every entry's buffer is this address, never written.
    static unsigned char no_bytes;
    StateDict state(0);
    for (const auto& [name, shape] : entries) {
      const Shape global = to_shape(shape);
      auto layout = TensorLayout::from_device_matrix(global, {1}, Shape(global.size(), -1));
      check(layout.status());
      check(state.add_tensor(name, DType::kUInt8, &no_bytes, *layout));
    }
    proto::Index index = reader_->index();
    internal_plan::MatchRules rules;
    rules.checkpoint = index.name();
    rules.reshape_trailing_ones = false;
    rules.check_dtypes = false;
    internal_plan::Matching m = take(internal_plan::match_state(state, index, options, rules));
    std::vector<std::pair<std::string, std::string>> pairs;
    for (const auto& t : m.matched)
      pairs.emplace_back(state.tensors()[static_cast<std::size_t>(t.state)].name, index.tensors(t.stored).name());
    return py::make_tuple(pairs, m.missing_in_checkpoint, m.unexpected_in_checkpoint);
  }
  // Reads `region` (offset, shape) of tensor `name` into the writable buffer `out`
  // (C-contiguous, exactly the region's bytes). Returns the bytes read from storage.
  uint64_t read_into(const std::string& name, const std::vector<int64_t>& offset, const std::vector<int64_t>& shape,
                     py::buffer out, bool check_chunks) {
    auto it = by_name_.find(name);
    if (it == by_name_.end()) throw py::key_error("no tensor '" + name + "' in this checkpoint");
    py::buffer_info info = out.request(/*writable=*/true);
    if (info.ndim > 1 || (info.ndim == 1 && info.strides[0] != info.itemsize))
      type_error("read: the output buffer must be contiguous");
    const proto::Tensor& t = reader_->index().tensors(it->second);
    const auto dt = dtype_from_name(t.dtype());
    const Box region{to_shape(offset), to_shape(shape)};
    const uint64_t want = static_cast<uint64_t>(region.num_elements()) * (dt ? dtype_size(*dt) : 0);
    if (static_cast<uint64_t>(info.size * info.itemsize) != want) type_error("read: the output buffer has the wrong size");
    uint64_t bytes_read = 0;
    check(without_gil([&] { return reader_->read(it->second, region, info.ptr, &bytes_read, check_chunks); }));
    return bytes_read;
  }

 private:
  std::shared_ptr<const EncryptionKey> key_;
  std::unique_ptr<internal_tools::CheckpointReader> reader_;
  std::map<std::string, int> by_name_;
};

}  // namespace

void bind_reader(py::module_& m) {
  py::class_<PyReader>(m, "_Reader")
      .def(py::init<const std::string&, const py::object&, bool>())
      .def("unchecked_reason", &PyReader::unchecked_reason)
      .def("keys", &PyReader::keys)
      .def("tensors", &PyReader::tensors)
      .def("meta", &PyReader::meta)
      .def("read_into", &PyReader::read_into)
      .def("match", &PyReader::match);
}

}  // namespace distckpt::python
