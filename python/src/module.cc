// distckpt._distckpt: the native half of the Python package (python/distckpt holds the
// Pythonic half). Thin on purpose: tensors stay where Python put them (numpy arrays
// through the buffer protocol, torch tensors by address), Status codes become the
// package's exceptions, and the GIL is released around every collective and every I/O.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <mpi.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "distckpt/distckpt.h"
#include "tools/reader.h"

namespace py = pybind11;

namespace distckpt::python {
namespace {

// ---- errors ----

// The exception classes, made once at import (DistckptError and its subclasses).
struct Errors {
  PyObject* base = nullptr;
  PyObject* corruption = nullptr;
  PyObject* auth = nullptr;
  PyObject* mismatch = nullptr;
  PyObject* not_found = nullptr;
};
Errors errors;

[[noreturn]] void raise(const Status& st) {
  PyObject* type = errors.base;
  switch (st.code()) {
    case StatusCode::kCorruption: type = errors.corruption; break;
    case StatusCode::kAuthFailed: type = errors.auth; break;
    case StatusCode::kMismatch: type = errors.mismatch; break;
    case StatusCode::kNotFound: type = errors.not_found; break;
    default: break;
  }
  PyErr_SetString(type, st.to_string().c_str());
  throw py::error_already_set();
}

template <typename T>
T take(Result<T>&& r) {
  if (!r.ok()) raise(r.status());
  return std::move(r).value();
}
void check(const Status& st) {
  if (!st.ok()) raise(st);
}

[[noreturn]] void type_error(const std::string& message) { throw py::type_error(message); }

// ---- MPI and communicators ----

// Whether this module called MPI_Init_thread (then it calls MPI_Finalize at exit).
bool mpi_initialised_here = false;

class PyComm {
 public:
  explicit PyComm(std::unique_ptr<Comm> comm) : comm_(std::move(comm)) {}
  Comm& get() {
    if (!comm_) throw py::value_error("this Comm was closed");
    return *comm_;
  }
  int rank() { return get().rank(); }
  int size() { return get().size(); }
  void close() {
    py::gil_scoped_release unlocked;
    comm_.reset();  // frees the duplicated communicator: before MPI_Finalize
  }
  bool closed() const { return !comm_; }

 private:
  std::unique_ptr<Comm> comm_;
};

std::unique_ptr<PyComm> wrap(MPI_Comm handle) {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) throw py::value_error("MPI was finalized");
  std::unique_ptr<Comm> comm;
  {
    py::gil_scoped_release unlocked;
    comm = make_mpi_comm(handle);  // collective (MPI_Comm_dup)
  }
  return std::make_unique<PyComm>(std::move(comm));
}

std::unique_ptr<PyComm> comm_world() {
  int initialised = 0;
  MPI_Initialized(&initialised);
  if (!initialised) {
    int provided = 0;
    if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS)
      raise(internal_error("Comm.world: MPI_Init_thread failed"));
    mpi_initialised_here = true;
  }
  return wrap(MPI_COMM_WORLD);
}

// mpi4py gives a communicator's handle as an integer (MPI._handleof): Open MPI's
// MPI_Comm is a pointer, MPICH's an int; both fit.
std::unique_ptr<PyComm> comm_from_handle(uintptr_t handle) {
  int initialised = 0;
  MPI_Initialized(&initialised);
  if (!initialised) throw py::value_error("Comm.from_mpi4py: MPI is not initialised");
  // The handle's low bytes are the MPI_Comm (little-endian, as every platform we build on).
  static_assert(sizeof(MPI_Comm) <= sizeof(uintptr_t));
  MPI_Comm comm;
  std::memcpy(&comm, &handle, sizeof(comm));
  return wrap(comm);
}

void finalize_if_ours() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (mpi_initialised_here && !finalized) MPI_Finalize();
  mpi_initialised_here = false;
}

// ---- layouts ----

Shape to_shape(const std::vector<int64_t>& v) { return Shape(v.begin(), v.end()); }

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

// ---- state dicts ----

// A StateDict whose buffers belong to Python objects: it holds a reference to each, so
// that they outlive it.
class PyStateDict {
 public:
  explicit PyStateDict(int rank) : state_(rank) {}
  StateDict& get() { return state_; }
  // A tensor by address: `owner` keeps the memory alive; `readonly` refuses loads into it.
  void add(const std::string& name, const std::string& dtype, uintptr_t address, uint64_t nbytes,
           const TensorLayout& layout, py::object owner, bool readonly) {
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
    void* data = boxes.empty() ? nullptr : reinterpret_cast<void*>(address);
    if (data == nullptr && want > 0) type_error("tensor '" + name + "': null data");
    // A zero-size box still needs a non-null buffer.
    if (data == nullptr && !boxes.empty()) data = &empty_;
    check(state_.add_tensor(name, *dt, data, layout));
    owners_.push_back(std::move(owner));
    if (readonly) readonly_.push_back(name);
  }
  void set_info(const std::string& key, py::handle value) {
    if (py::isinstance<py::bool_>(value)) check(state_.set_info(key, value.cast<bool>()));
    else if (py::isinstance<py::int_>(value)) check(state_.set_info(key, value.cast<int64_t>()));
    else if (py::isinstance<py::float_>(value)) check(state_.set_info(key, value.cast<double>()));
    else if (py::isinstance<py::str>(value)) check(state_.set_info(key, value.cast<std::string>()));
    else type_error("info '" + key + "': int, float, bool or str, not " + std::string(py::str(value.get_type())));
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
  char empty_ = 0;
};

py::object info_value(const InfoValue& v) {
  return std::visit([](const auto& x) -> py::object { return py::cast(x); }, v);
}
py::dict info_dict(const std::map<std::string, InfoValue>& info) {
  py::dict d;
  for (const auto& [k, v] : info) d[py::str(k)] = info_value(v);
  return d;
}

std::shared_ptr<const EncryptionKey> key_from(const py::object& key) {
  if (key.is_none()) return nullptr;
  const std::string bytes = key.cast<std::string>();
  return std::make_shared<const EncryptionKey>(take(EncryptionKey::from_bytes(bytes)));
}

Format format_from(const std::string& name) {
  auto f = format_from_name(name);
  if (!f) throw py::value_error("unknown format '" + name + "' (native, ckpt, safetensors, hdf5)");
  return *f;
}

// ---- save and load ----

py::dict save_state(PyComm& comm, PyStateDict& state, const std::string& root, const std::string& name, int64_t step,
                    int64_t epoch, const std::string& format, bool fsync, bool update_latest, const py::object& key) {
  SaveOptions o;
  o.name = name;
  o.step = step;
  o.epoch = epoch;
  o.format = format_from(format);
  o.fsync = fsync;
  o.update_latest = update_latest;
  if (auto k = key_from(key)) o.encryption = {EncryptionMode::kAesGcm, k};
  Result<SaveResult> r = internal_error("not run");
  {
    py::gil_scoped_release unlocked;
    r = save(comm.get(), state.get(), root, o);
  }
  SaveResult s = take(std::move(r));
  py::dict d;
  d["path"] = s.path;
  d["bytes_unique"] = s.bytes_unique;
  d["bytes_written"] = s.bytes_written;
  d["index_bytes"] = s.index_bytes;
  d["plan_s"] = s.plan_s;
  d["write_s"] = s.write_s;
  d["commit_s"] = s.commit_s;
  d["warning"] = s.warning;
  return d;
}

py::dict load_state(PyComm& comm, PyStateDict& state, const std::string& path, bool strict, const py::object& key) {
  if (!state.readonly().empty())
    type_error("load: tensor '" + state.readonly().front() + "' is read-only (loads write into every tensor)");
  LoadOptions o;
  o.strict = strict;
  o.key = key_from(key);
  Result<LoadResult> r = internal_error("not run");
  {
    py::gil_scoped_release unlocked;
    r = load(comm.get(), state.get(), path, o);
  }
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
  RootListing listing;
  {
    py::gil_scoped_release unlocked;
    auto r = list_checkpoints(root);
    if (!r.ok()) {
      py::gil_scoped_acquire locked;
      raise(r.status());
    }
    listing = std::move(r).value();
  }
  py::list out;
  for (const CheckpointEntry& e : listing.entries) {
    if (e.state != EntryState::kCommitted) continue;
    py::dict d;
    d["name"] = e.name;
    d["step"] = e.step;
    d["epoch"] = e.epoch;
    d["bytes"] = e.bytes;
    d["format"] = std::string(format_name(e.format));
    d["latest"] = e.name == listing.latest;
    out.append(d);
  }
  return out;
}

py::dict verify_path(const std::string& path, const py::object& key, bool deep) {
  VerifyOptions o;
  o.key = key_from(key);
  o.deep = deep;
  Result<VerifyReport> r = internal_error("not run");
  {
    py::gil_scoped_release unlocked;
    r = verify_checkpoint(path, o);
  }
  VerifyReport v = take(std::move(r));
  py::dict d;
  d["tensors"] = v.tensors;
  d["chunks"] = v.chunks;
  d["files"] = v.files;
  d["bytes_checked"] = v.bytes_checked;
  d["checked"] = v.checked;
  d["authenticated"] = v.authenticated;
  return d;
}

std::string convert_path(const std::string& src, const std::string& dst, const std::string& format,
                         const py::object& key) {
  ConvertOptions o;
  o.key = key_from(key);
  Result<ConvertResult> r = internal_error("not run");
  {
    py::gil_scoped_release unlocked;
    r = convert_checkpoint(src, dst, format_from(format), o);
  }
  return take(std::move(r)).path;
}

// One checkpoint, any format, read region by region in this process (no MPI).
class PyReader {
 public:
  PyReader(const std::string& path, const py::object& key) : key_(key_from(key)) {
    Result<std::unique_ptr<internal_tools::CheckpointReader>> r = internal_error("not run");
    {
      py::gil_scoped_release unlocked;
      r = internal_tools::CheckpointReader::open(posix_filesystem(), path, key_.get());
    }
    reader_ = take(std::move(r));
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
  py::dict meta() const {
    const auto& index = reader_->index();
    py::dict d;
    d["name"] = index.name();
    d["step"] = index.step();
    d["epoch"] = index.epoch();
    d["world_size"] = index.world_size();
    return d;
  }
  // Reads `region` (offset, shape) of tensor `name` into the writable buffer `out`
  // (C-contiguous, exactly the region's bytes). Returns the bytes read from storage.
  uint64_t read_into(const std::string& name, const std::vector<int64_t>& offset, const std::vector<int64_t>& shape,
                     py::buffer out) {
    auto it = by_name_.find(name);
    if (it == by_name_.end()) throw py::key_error("no tensor '" + name + "' in this checkpoint");
    py::buffer_info info = out.request(/*writable=*/true);
    const proto::Tensor& t = reader_->index().tensors(it->second);
    const auto dt = dtype_from_name(t.dtype());
    const Box region{to_shape(offset), to_shape(shape)};
    const uint64_t want = static_cast<uint64_t>(region.num_elements()) * (dt ? dtype_size(*dt) : 0);
    if (static_cast<uint64_t>(info.size * info.itemsize) != want) type_error("read: the output buffer has the wrong size");
    uint64_t bytes_read = 0;
    Status st;
    {
      py::gil_scoped_release unlocked;
      st = reader_->read(it->second, region, info.ptr, &bytes_read);
    }
    check(st);
    return bytes_read;
  }

 private:
  std::shared_ptr<const EncryptionKey> key_;
  std::unique_ptr<internal_tools::CheckpointReader> reader_;
  std::map<std::string, int> by_name_;
};

}  // namespace
}  // namespace distckpt::python

PYBIND11_MODULE(_distckpt, m) {
  using namespace distckpt;
  using namespace distckpt::python;
  m.doc() = "distckpt's native module (use the distckpt package)";

  errors.base = PyErr_NewException("distckpt.DistckptError", PyExc_RuntimeError, nullptr);
  errors.corruption = PyErr_NewException("distckpt.CorruptionError", errors.base, nullptr);
  errors.auth = PyErr_NewException("distckpt.AuthError", errors.base, nullptr);
  errors.mismatch = PyErr_NewException("distckpt.MismatchError", errors.base, nullptr);
  errors.not_found = PyErr_NewException("distckpt.NotFoundError", errors.base, nullptr);
  m.attr("DistckptError") = py::handle(errors.base);
  m.attr("CorruptionError") = py::handle(errors.corruption);
  m.attr("AuthError") = py::handle(errors.auth);
  m.attr("MismatchError") = py::handle(errors.mismatch);
  m.attr("NotFoundError") = py::handle(errors.not_found);

  py::class_<PyComm>(m, "Comm")
      .def_static("_world", &comm_world)
      .def_static("_from_handle", &comm_from_handle)
      .def_property_readonly("rank", &PyComm::rank)
      .def_property_readonly("size", &PyComm::size)
      .def_property_readonly("closed", &PyComm::closed)
      .def("close", &PyComm::close)
      .def("barrier", [](PyComm& c) {
        py::gil_scoped_release unlocked;
        c.get().barrier();
      });
  m.def("_finalize_if_ours", &finalize_if_ours);

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
      .def("_set_info", &PyStateDict::set_info)
      .def("keys", &PyStateDict::keys);

  m.def("_save", &save_state);
  m.def("_load", &load_state);
  m.def("_list_checkpoints", &list_root);
  m.def("_verify", &verify_path);
  m.def("_convert", &convert_path);

  py::class_<PyReader>(m, "_Reader")
      .def(py::init<const std::string&, const py::object&>())
      .def("keys", &PyReader::keys)
      .def("tensors", &PyReader::tensors)
      .def("meta", &PyReader::meta)
      .def("read_into", &PyReader::read_into);
}
