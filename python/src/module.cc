// distckpt._distckpt: the native half of the Python package (python/distckpt holds the
// Pythonic half). Thin on purpose: tensors stay where Python put them (numpy arrays
// through the buffer protocol, torch tensors by address), Status codes become the
// package's exceptions, and the GIL is released around every collective and every I/O.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <mpi.h>

#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "distckpt/distckpt.h"
#include "comm/agree.h"
#include "format/format.h"  // info_values: the index's info map
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

// Runs `call` (I/O, collectives) with the GIL released and returns what it returned; the
// GIL is held again when the result is handled (a Status holds no Python object).
template <typename F>
auto without_gil(F&& call) {
  py::gil_scoped_release unlocked;
  return call();
}

// Runs `prepare`, the checks and conversions of a collective call's arguments made here
// before the call (a read-only tensor, a key of the wrong length, an unknown format or
// option), and agrees on their outcome over `comm` (one allreduce, and a broadcast of
// the error when a rank failed). A rank whose
// arguments fail alone, say a key read from a file on its node, would otherwise raise
// while the others wait in the call's first collective until the peer watchdog ends the
// job. That rank raises its own exception; the others raise DistckptError naming it.
template <typename F>
void agreed_arguments(Comm& comm, F&& prepare) {
  Status local;
  std::exception_ptr raised;
  try {
    prepare();
  } catch (const std::exception& e) {  // py::error_already_set and pybind11's own errors
    local = invalid_argument("rank " + std::to_string(comm.rank()) + ": " + e.what());
    raised = std::current_exception();
  }
  const Status all = without_gil([&] { return internal_comm::agree(comm, local); });
  if (raised) std::rethrow_exception(raised);
  check(all);
}

// ---- MPI and communicators ----

// Whether this module called MPI_Init_thread (then it calls MPI_Finalize at exit).
bool mpi_initialised_here = false;

class PyComm {
 public:
  explicit PyComm(std::unique_ptr<Comm> comm, MPI_Comm source) : comm_(std::move(comm)), source_(source) {}
  MPI_Comm source() const { return source_; }  // the communicator it duplicates
  Comm& get() {
    if (!comm_) throw py::value_error("this Comm was closed");
    return *comm_;
  }
  int rank() { return get().rank(); }
  int size() { return get().size(); }
  void close() {
    if (users_ > 0)
      throw py::value_error("Comm.close: a CheckpointManager or AsyncCheckpointer still uses this Comm (close it first)");
    py::gil_scoped_release unlocked;
    comm_.reset();  // frees the duplicated communicator: before MPI_Finalize
  }
  bool closed() const { return !comm_; }
  // A manager or an async checkpointer keeps a pointer to the Comm: it may not be closed under it.
  void add_user() { ++users_; }
  void drop_user() { --users_; }

 private:
  std::unique_ptr<Comm> comm_;
  MPI_Comm source_;
  int users_ = 0;
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
  return std::make_unique<PyComm>(std::move(comm), handle);
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

// An info value from Python: bool, int, float or str (bool first: it is an int too).
InfoValue to_info_value(const std::string& key, py::handle value) {
  if (py::isinstance<py::bool_>(value)) return value.cast<bool>();
  if (py::isinstance<py::int_>(value)) {
    int overflow = 0;
    const long long v = PyLong_AsLongLongAndOverflow(value.ptr(), &overflow);
    if (overflow != 0) type_error("info '" + key + "': " + std::string(py::str(value)) + " is outside int64");
    if (v == -1 && PyErr_Occurred()) throw py::error_already_set();
    return static_cast<int64_t>(v);
  }
  if (py::isinstance<py::float_>(value)) return value.cast<double>();
  if (py::isinstance<py::str>(value)) return value.cast<std::string>();
  type_error("info '" + key + "': int, float, bool or str, not " + std::string(py::str(value.get_type())));
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string out = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + (shape.size() == 1 ? ",)" : ")");
}

// A StateDict whose buffers belong to Python objects: it holds a reference to each, so
// that they outlive it.
class PyStateDict {
 public:
  explicit PyStateDict(int rank) : state_(rank) {}
  StateDict& get() { return state_; }
  // A tensor by address: `owner` keeps the memory alive; `readonly` refuses loads into it;
  // `shape` must be the rank's box. `movable` (a torch tensor, else None) may be given new
  // storage later: refresh() follows it.
  void add(const std::string& name, const std::string& dtype, uintptr_t address, uint64_t nbytes,
           const std::vector<int64_t>& shape, const TensorLayout& layout, py::object owner, bool readonly,
           py::object movable) {
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
    check(state_.add_tensor(name, *dt, data, layout));
    owners_.push_back(std::move(owner));
    if (readonly) readonly_.push_back(name);
    if (!movable.is_none() && !boxes.empty())
      movable_.push_back(Movable{name, std::move(movable), address, dtype, shape, owners_.size() - 1});
  }
  // Follows torch tensors given new storage since they were added (same shape and
  // dtype); raises TypeError naming one whose shape, dtype or density changed. The
  // GIL is held. Cheap when nothing moved: one data_ptr() per torch tensor.
  void refresh() {
    for (Movable& m : movable_) {
      if (m.tensor.attr("data_ptr")().cast<uintptr_t>() == m.address) continue;
      py::tuple view = py::module_::import("distckpt").attr("_torch_view")(m.name, m.tensor);
      const auto address = view[0].cast<uintptr_t>();
      const auto nbytes = view[1].cast<uint64_t>();
      const auto dtype = view[2].cast<std::string>();
      const auto shape = view[5].cast<std::vector<int64_t>>();
      if (dtype != m.dtype || shape != m.shape)  // the same bytes, then (a dense tensor)
        type_error("tensor '" + m.name + "' changed since the StateDict was made: " + m.dtype + " " +
                   shape_text(m.shape) + ", now " + dtype + " " + shape_text(shape) + " (make a new StateDict)");
      if (address == 0 && nbytes > 0) type_error("tensor '" + m.name + "': null data");
      check(state_.set_buffers(m.name, {reinterpret_cast<void*>(address)}));
      owners_[m.owner] = view[4];  // the new storage lives, the old one may go
      m.address = address;
    }
  }
  void set_info(const std::string& key, py::handle value) { check(state_.set_info(key, to_info_value(key, value))); }
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
    std::size_t owner;  // index into owners_
  };
  std::vector<Movable> movable_;
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

// A key: bytes, bytearray or memoryview (anything with the buffer protocol), never str or
// int (bytes(32) would be 32 zero bytes: a key nobody chose). Raises TypeError or, for a
// wrong length, DistckptError.
std::shared_ptr<const EncryptionKey> key_from(const py::object& key) {
  if (key.is_none()) return nullptr;
  if (!PyObject_CheckBuffer(key.ptr()))
    throw py::type_error(std::string("a key is bytes, bytearray or memoryview, not ") + Py_TYPE(key.ptr())->tp_name);
  auto raw = py::reinterpret_steal<py::object>(PyBytes_FromObject(key.ptr()));
  if (!raw) throw py::error_already_set();
  const std::string bytes = raw.cast<std::string>();
  return std::make_shared<const EncryptionKey>(take(EncryptionKey::from_bytes(bytes)));
}

Format format_from(const std::string& name) {
  auto f = format_from_name(name);
  if (!f) throw py::value_error("unknown format '" + name + "' (native, ckpt, safetensors, hdf5)");
  return *f;
}

// ---- save and load ----

py::dict save_state(PyComm& comm, PyStateDict& state, const std::string& root, const std::string& name, int64_t step,
                    int64_t epoch, const std::string& format, bool fsync, bool update_latest, const py::object& key,
                    bool incremental, const std::string& incremental_base) {
  SaveOptions o;
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
    if (auto k = key_from(key)) o.encryption = {EncryptionMode::kAesGcm, k};
  });
  Result<SaveResult> r = without_gil([&] { return save(native, state.get(), root, o); });
  SaveResult s = take(std::move(r));
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

py::dict load_state(PyComm& comm, PyStateDict& state, const std::string& path, bool strict, const py::object& key,
                    bool cast_floats) {
  LoadOptions o;
  o.strict = strict;
  o.cast_floats = cast_floats;
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
    out.append(d);
  }
  return out;
}

void remove_from_root(const std::string& root, const std::string& name) {
  check(without_gil([&] { return remove_checkpoint(root, name); }));
}

py::dict verify_path(const std::string& path, const py::object& key, bool deep) {
  VerifyOptions o;
  o.key = key_from(key);
  o.deep = deep;
  Result<VerifyReport> r = without_gil([&] { return verify_checkpoint(path, o); });
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
  const Format to = format_from(format);
  Result<ConvertResult> r = without_gil([&] { return convert_checkpoint(src, dst, to, o); });
  return take(std::move(r)).path;
}

// One checkpoint, any format, read region by region in this process (no MPI).
class PyReader {
 public:
  PyReader(const std::string& path, const py::object& key) : key_(key_from(key)) {
    auto r = without_gil([&] { return internal_tools::CheckpointReader::open(posix_filesystem(), path, key_.get()); });
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
    d["info"] = info_dict(internal_format::info_values(index));  // every stored info value
    return d;
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

// ---- the manager ----

// A CheckpointConfig from canonical names (the Python layer resolves MindSpore's and
// MMEngine's aliases and refuses unknown ones); validated by the manager.
CheckpointConfig make_config(const py::dict& kw) {
  CheckpointConfig c;
  for (auto item : kw) {
    const std::string k = item.first.cast<std::string>();
    py::handle v = item.second;
    auto rule_of = [](const std::string& r) {
      if (r == "greater") return CompareRule::kGreater;
      if (r == "less") return CompareRule::kLess;
      if (r == "auto") return CompareRule::kAuto;
      throw py::value_error("rule: 'greater', 'less' or 'auto', not '" + r + "'");
    };
    try {
      if (k == "directory") c.directory = v.cast<std::string>();
      else if (k == "out_dir") c.out_dir = v.cast<std::string>();
      else if (k == "prefix") c.prefix = v.cast<std::string>();
      else if (k == "name_template") c.name_template = v.cast<std::string>();
      else if (k == "filename_tmpl") c.filename_tmpl = v.cast<std::string>();
      else if (k == "save_every_steps") c.save_every_steps = v.cast<int64_t>();
      else if (k == "save_every_seconds") c.save_every_seconds = v.cast<double>();
      else if (k == "save_every_epochs") c.save_every_epochs = v.cast<int64_t>();
      else if (k == "by_epoch") c.by_epoch = v.cast<bool>();
      else if (k == "save_begin") c.save_begin = v.cast<int64_t>();
      else if (k == "save_last") c.save_last = v.cast<bool>();
      else if (k == "keep_max") c.keep_max = v.cast<int>();
      else if (k == "keep_per_n_minutes") c.keep_per_n_minutes = v.cast<double>();
      else if (k == "best_metric") c.best_metric = v.cast<std::string>();
      else if (k == "keep_best") c.keep_best = v.cast<int>();
      else if (k == "save_best") c.save_best = v.cast<std::vector<std::string>>();
      else if (k == "rule") {
        c.save_best_rules.clear();
        for (const auto& r : v.cast<std::vector<std::string>>()) c.save_best_rules.push_back(rule_of(r));
      } else if (k == "greater_keys") c.greater_keys = v.cast<std::vector<std::string>>();
      else if (k == "less_keys") c.less_keys = v.cast<std::vector<std::string>>();
      else if (k == "format") c.format = format_from(v.cast<std::string>());
      else if (k == "integrated") c.integrated = v.cast<bool>();
      else if (k == "remove_redundancy") c.remove_redundancy = v.cast<bool>();
      else if (k == "fsync") c.fsync = v.cast<bool>();
      else if (k == "async_save") c.async_save = v.cast<bool>();
      else if (k == "incremental") c.incremental = v.cast<bool>();
      else if (k == "exception_save") c.exception_save = v.cast<bool>();
      else if (k == "job_id") c.job_id = v.cast<std::string>();
      else if (k == "on_failure") {
        const std::string f = v.cast<std::string>();
        if (f != "stop" && f != "continue") throw py::value_error("on_failure: 'stop' or 'continue', not '" + f + "'");
        c.on_failure = f == "stop" ? OnSaveFailure::kStop : OnSaveFailure::kContinue;
      } else if (k == "enc_key") {
        c.encryption.key = key_from(py::reinterpret_borrow<py::object>(v));
      } else if (k == "enc_mode") {
        auto mode = encryption_mode_from_name(v.cast<std::string>());
        if (!mode) throw py::value_error("enc_mode: 'AES-GCM', 'AES-CBC' or 'SM4-CBC'");
        c.encryption.mode = *mode;
      } else if (k == "append_info") {
        for (auto kv : v.cast<py::dict>()) {
          const std::string key = kv.first.cast<std::string>();
          c.append_info[key] = to_info_value(key, kv.second);
        }
      } else if (k == "local_dir") c.local.dir = v.cast<std::string>();
      else if (k == "redundancy") c.local.redundancy = v.cast<std::string>();
      else if (k == "local_every_steps") c.local_every_steps = v.cast<int64_t>();
      else if (k == "global_every") c.global_every = v.cast<int>();
      else if (k == "keep_local") c.keep_local = v.cast<int>();
      else if (k == "keep_global") c.keep_global = v.cast<int>();
      else if (k == "upload_command") c.upload_command = v.cast<std::vector<std::string>>();
      else if (k == "upload_queue") c.upload_queue = v.cast<int>();
      else if (k == "upload_wait_s") c.upload_wait_s = v.cast<double>();
      else if (k == "upload") {
        // The hook runs on the uploader's thread: it takes the GIL; an exception is printed
        // with its traceback and counts as a failed upload, never raised. The Python
        // object is released under the GIL, whichever thread drops the last copy.
        std::shared_ptr<py::object> hook(new py::object(py::reinterpret_borrow<py::object>(v)), [](py::object* o) {
          py::gil_scoped_acquire locked;
          delete o;
        });
        c.upload = [hook](const std::string& path) -> Status {
          py::gil_scoped_acquire locked;
          try {
            (*hook)(path);
            return Status();
          } catch (py::error_already_set& e) {
            const std::string what = e.what();
            e.restore();
            PyErr_Print();  // the traceback, on stderr
            return io_error("upload hook for '" + path + "' raised: " + what);
          }
        };
      } else throw py::type_error("CheckpointManager: unknown option '" + k + "'");
    } catch (const py::cast_error&) {  // pybind11's own message names neither option nor type
      type_error("CheckpointManager: option '" + k + "': a value of the wrong type (" +
                 std::string(Py_TYPE(v.ptr())->tp_name) + " " + std::string(py::repr(v)).substr(0, 80) + ")");
    }
  }
  return c;
}

py::dict outcome_dict(const StepOutcome& o) {
  py::dict d;
  d["saved"] = o.saved;
  d["path"] = o.path;
  d["in_flight"] = o.in_flight;
  d["committed"] = o.committed;
  d["removed"] = o.removed;
  d["stop"] = o.stop;
  d["save_error"] = o.save_error.ok() ? py::object(py::none()) : py::object(py::str(o.save_error.to_string()));
  d["best"] = o.best;
  d["tier"] = o.tier;
  d["drained"] = o.drained;
  d["exception_rank"] = o.exception_rank;
  return d;
}

class PyManager {
 public:
  PyManager(py::object comm, py::object state, const py::dict& config) : comm_(comm), state_(state) {
    PyComm& pc = comm.cast<PyComm&>();
    PyStateDict& ps = state.cast<PyStateDict&>();
    Comm& native_comm = pc.get();
    CheckpointConfig c;
    agreed_arguments(native_comm, [&] { c = make_config(config); });
    manager_ = take(without_gil([&] { return CheckpointManager::create(native_comm, ps.get(), std::move(c)); }));
    pc.add_user();
  }
  ~PyManager() { close(); }
  CheckpointManager& get() {
    if (!manager_) throw py::value_error("this CheckpointManager was closed");
    return *manager_;
  }
  void refresh_or_abort() {
    try {
      state_.cast<PyStateDict&>().refresh();
    } catch (const std::exception& e) {
      abort_after_error(e.what());
      throw;
    }
  }
  template <typename F>
  py::dict step(F&& call) {
    CheckpointManager& self = get();
    // No agreement of our own here: a rank that threw in the loop meets the others in the
    // manager's step synchronization (save_after_exception). A tensor that cannot be
    // followed on this rank ends the manager on every rank, nothing saved
    // (abort_after_error: the others' call returns stop naming this rank), and raises.
    refresh_or_abort();
    Result<StepOutcome> r = without_gil([&] { return call(self); });
    return outcome_dict(take(std::move(r)));
  }
  py::dict step_end(int64_t step_, int64_t epoch, const std::map<std::string, double>& metrics, bool epoch_end) {
    return step([&](CheckpointManager& m) { return m.step_end(step_, epoch, metrics, epoch_end); });
  }
  py::dict end(int64_t step_, int64_t epoch, const std::map<std::string, double>& metrics, bool epoch_end) {
    return step([&](CheckpointManager& m) { return m.end(step_, epoch, metrics, epoch_end); });
  }
  py::dict save_now(int64_t step_, int64_t epoch, const std::map<std::string, double>& metrics, const std::string& suffix) {
    return step([&](CheckpointManager& m) { return m.save_now(step_, epoch, metrics, suffix); });
  }
  py::dict save_after_exception(const std::string& what) {
    CheckpointManager& self = get();
    // A tensor that cannot be followed any more: its old address may be freed memory, so
    // the exception is met without a save.
    try {
      state_.cast<PyStateDict&>().refresh();
    } catch (const std::exception& e) {
      const std::string why = what + "; and " + e.what() + ": nothing saved";
      Result<StepOutcome> r = without_gil([&] { return self.abort_after_error(why); });
      return outcome_dict(take(std::move(r)));
    }
    Result<StepOutcome> r = without_gil([&] { return self.save_after_exception(what); });
    return outcome_dict(take(std::move(r)));
  }
  py::dict resume(const std::string& target, int64_t step_, int64_t epoch, bool strict, bool fall_back, bool verify,
                  const std::vector<std::string>& only) {
    PyStateDict& ps = state_.cast<PyStateDict&>();
    CheckpointManager* manager = nullptr;
    agreed_arguments(comm_.cast<PyComm&>().get(), [&] {
      manager = &get();  // closed on one rank only: the others must not resume alone
      ps.refresh();
      if (!ps.readonly().empty())
        type_error("resume: tensor '" + ps.readonly().front() + "' is read-only (a resume writes into every tensor)");
    });
    ResumeOptions o;
    o.target = target;
    o.step = step_;
    o.epoch = epoch;
    o.strict = strict;
    o.fall_back_to_previous = fall_back;
    o.verify = verify;
    o.only = only;
    Result<ResumeResult> r = without_gil([&] { return manager->resume(o); });
    ResumeResult rr = take(std::move(r));
    py::dict d;
    d["resumed"] = rr.resumed;
    d["path"] = rr.path;
    d["step"] = rr.step;
    d["epoch"] = rr.epoch;
    d["info"] = info_dict(rr.info);
    d["missing_in_checkpoint"] = rr.missing_in_checkpoint;
    d["unexpected_in_checkpoint"] = rr.unexpected_in_checkpoint;
    d["filtered_out"] = rr.filtered_out;
    d["skipped"] = rr.skipped;
    d["saved_at_start"] = rr.saved_at_start;
    return d;
  }
  std::string best_checkpoint(const std::string& metric) {
    Result<std::string> r = without_gil([&, &self = get()] { return self.best_checkpoint(metric); });
    return take(std::move(r));
  }
  std::string publish(const std::string& target) {
    Result<std::string> r = without_gil([&, &self = get()] { return self.publish(target); });
    return take(std::move(r));
  }
  std::string series_prefix() { return get().series_prefix(); }
  // A step call cannot go on on this rank (a tensor that cannot be followed, or arguments
  // that failed the Python side's checks): the manager ends on every rank; the caller raises.
  void abort_after_error(const std::string& what) {
    CheckpointManager& self = get();
    (void)without_gil([&] { return self.abort_after_error(what); });
  }
  void close() {
    if (!manager_) return;
    {
      // Its destructor waits for a save in flight and for uploads, which may need the GIL.
      py::gil_scoped_release unlocked;
      manager_.reset();
    }
    comm_.cast<PyComm&>().drop_user();
  }
  bool closed() const { return !manager_; }

 private:
  py::object comm_, state_;  // kept alive while the manager uses them
  std::unique_ptr<CheckpointManager> manager_;
};

class PyAsync {
 public:
  // `comm` stays in use (it agrees on save_async's arguments): it may not be closed first.
  PyAsync(py::object comm, std::size_t staging_bytes, bool refuse_when_busy) : comm_(comm) {
    AsyncOptions o;
    o.staging_bytes = staging_bytes;
    o.refuse_when_busy = refuse_when_busy;
    PyComm& pc = comm.cast<PyComm&>();
    // The Python side's checks failed on a rank: that rank joins here (_agree_argument_error)
    // instead of the others waiting for it in make_async_checkpointer's collectives.
    agreed_arguments(pc.get(), [] {});
    const MPI_Comm source = pc.source();
    async_ = take(without_gil([&] { return make_async_checkpointer(source, o); }));  // collective
    pc.add_user();
  }
  ~PyAsync() { close(); }
  AsyncCheckpointer& get() {
    if (!async_) throw py::value_error("this AsyncCheckpointer was closed");
    return *async_;
  }
  void save_async(PyStateDict& state, const std::string& root, const std::string& name, int64_t step, int64_t epoch,
                  const std::string& format, const py::object& key) {
    SaveOptions o;
    o.name = name;
    o.step = step;
    o.epoch = epoch;
    AsyncCheckpointer* async = nullptr;
    agreed_arguments(comm_.cast<PyComm&>().get(), [&] {
      async = &get();
      state.refresh();
      o.format = format_from(format);
      if (auto k = key_from(key)) o.encryption = {EncryptionMode::kAesGcm, k};
    });
    check(without_gil([&] { return async->save_async(state.get(), root, o); }));
  }
  py::dict wait() {
    Result<SaveResult> r = without_gil([&, &self = get()] { return self.wait(); });
    SaveResult s = take(std::move(r));
    py::dict d;
    d["path"] = s.path;
    d["bytes_written"] = s.bytes_written;
    d["write_s"] = s.write_s;
    d["commit_s"] = s.commit_s;
    return d;
  }
  bool in_flight() { return get().in_flight(); }
  void end() {
    AsyncCheckpointer& async = get();
    check(without_gil([&] { return async.end(); }));
  }
  void close() {
    if (!async_) return;
    {
      py::gil_scoped_release unlocked;
      async_.reset();  // waits for a save in flight
    }
    comm_.cast<PyComm&>().drop_user();
  }
  bool closed() const { return !async_; }

 private:
  py::object comm_;
  std::unique_ptr<AsyncCheckpointer> async_;
};

std::string publish_path(const std::string& src, const std::string& format, const std::vector<std::string>& only,
                         const std::string& directory, const py::object& key) {
  PublishOptions o;
  o.format = format_from(format);
  o.only = only;
  o.directory = directory;
  o.key = key_from(key);
  Result<PublishResult> r = without_gil([&] { return publish_checkpoint(src, o); });
  return take(std::move(r)).path;
}

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
  // The Python side's argument checks failed on this rank: it joins the agreement the
  // other ranks' call starts with (agreed_arguments), so that they raise naming this
  // rank; the caller raises its own error after. Collective.
  m.def("_agree_argument_error", [](PyComm& c, const std::string& message) {
    Comm& comm = c.get();
    const Status local = invalid_argument("rank " + std::to_string(comm.rank()) + ": " + message);
    (void)without_gil([&] { return internal_comm::agree(comm, local); });
  });

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
      .def("keys", &PyStateDict::keys);

  m.def("_save", &save_state);
  m.def("_load", &load_state);
  m.def("_install_signal_handlers", [] { check(CheckpointManager::install_signal_handlers()); });
  m.def("_signal_received", [] { return CheckpointManager::signal_received(); });
  m.def("_clear_signal", [] { CheckpointManager::clear_signal(); });
  m.def("_list_checkpoints", &list_root);
  m.def("_remove_checkpoint", &remove_from_root);
  m.def("_verify", &verify_path);
  m.def("_convert", &convert_path);

  py::class_<PyManager>(m, "_Manager")
      .def(py::init<py::object, py::object, const py::dict&>())
      .def("step_end", &PyManager::step_end)
      .def("end", &PyManager::end)
      .def("save_now", &PyManager::save_now)
      .def("save_after_exception", &PyManager::save_after_exception)
      .def("abort_after_error", &PyManager::abort_after_error)
      .def("resume", &PyManager::resume)
      .def("best_checkpoint", &PyManager::best_checkpoint)
      .def("publish", &PyManager::publish)
      .def("series_prefix", &PyManager::series_prefix)
      .def("close", &PyManager::close)
      .def_property_readonly("closed", &PyManager::closed);

  py::class_<PyAsync>(m, "_Async")
      .def(py::init<py::object, std::size_t, bool>())
      .def("save_async", &PyAsync::save_async)
      .def("wait", &PyAsync::wait)
      .def("in_flight", &PyAsync::in_flight)
      .def("end", &PyAsync::end)
      .def("close", &PyAsync::close)
      .def_property_readonly("closed", &PyAsync::closed);
  m.def("_publish", &publish_path);

  py::class_<PyReader>(m, "_Reader")
      .def(py::init<const std::string&, const py::object&>())
      .def("keys", &PyReader::keys)
      .def("tensors", &PyReader::tensors)
      .def("meta", &PyReader::meta)
      .def("read_into", &PyReader::read_into);
}
