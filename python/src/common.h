// The native module's shared pieces: errors as the package's exceptions, the GIL,
// argument agreement, communicators, and conversions of keys, formats and info values.
// Each bind_* function registers one subject's classes and functions (module.cc calls them).
#pragma once

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <mpi.h>

#include <exception>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "comm/agree.h"
#include "distckpt/distckpt.h"
#include "torch_comm.h"

namespace distckpt::python {

namespace py = pybind11;

// ---- errors ----

// The exception classes, made once at import (DistckptError and its subclasses).
struct Errors {
  PyObject* base = nullptr;
  PyObject* corruption = nullptr;
  PyObject* auth = nullptr;
  PyObject* mismatch = nullptr;
  PyObject* not_found = nullptr;
};
extern Errors errors;

// Raises the package's exception for `st` (its code chooses the class).
[[noreturn]] void raise(const Status& st);

template <typename T>
T take(Result<T>&& r) {
  if (!r.ok()) raise(r.status());
  return std::move(r).value();
}
inline void check(const Status& st) {
  if (!st.ok()) raise(st);
}

[[noreturn]] inline void type_error(const std::string& message) { throw py::type_error(message); }

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

// ---- communicators ----

// A Comm the Python side holds: over MPI (Comm.world, Comm.from_mpi4py: `source` is the
// MPI communicator it duplicates) or over torch.distributed (Comm.from_torch: a TorchComm,
// no MPI anywhere). Used from the thread that holds the GIL.
class PyComm {
 public:
  PyComm(std::unique_ptr<Comm> comm, MPI_Comm source) : comm_(std::move(comm)), source_(source) {}
  explicit PyComm(std::unique_ptr<TorchComm> comm) : torch_(comm.get()), comm_(std::move(comm)) {}
  Comm& get() {
    if (!comm_) throw py::value_error("this Comm was closed");
    return *comm_;
  }
  int rank() { return get().rank(); }
  int size() { return get().size(); }
  // Whether it runs over torch.distributed (then nothing may call MPI for it).
  bool over_torch() const { return torch_ != nullptr; }
  // Collective (over the whole torch job for a torch Comm: its duplicates are new groups,
  // see TorchComm::duplicate). An AsyncCheckpointer over two new communicators spanning
  // this one's ranks: MPI duplicates (make_async_checkpointer) or two new gloo groups.
  // The GIL is held by the caller and released here around the native part. Errors as
  // AsyncCheckpointer::create, and the backend's Python errors (raised).
  Result<std::unique_ptr<AsyncCheckpointer>> make_async(const AsyncOptions& options) {
    (void)get();  // a closed Comm raises
    if (torch_ != nullptr) {
      std::unique_ptr<Comm> foreground = torch_->duplicate();
      std::unique_ptr<Comm> background = torch_->duplicate();
      return without_gil(
          [&] { return AsyncCheckpointer::create(std::move(foreground), std::move(background), options); });
    }
    const MPI_Comm source = source_;
    return without_gil([&] { return make_async_checkpointer(source, options); });
  }
  void close() {
    if (users_ > 0)
      throw py::value_error("Comm.close: a CheckpointManager or AsyncCheckpointer still uses this Comm (close it first)");
    py::gil_scoped_release unlocked;
    torch_ = nullptr;
    comm_.reset();  // frees the duplicated communicator (before MPI_Finalize) or drops the gloo group
  }
  bool closed() const { return !comm_; }
  // A manager or an async checkpointer keeps a pointer to the Comm: it may not be closed under it.
  void add_user() { ++users_; }
  void drop_user() { --users_; }

 private:
  TorchComm* torch_ = nullptr;  // comm_ itself, when over torch.distributed
  std::unique_ptr<Comm> comm_;
  MPI_Comm source_ = MPI_COMM_NULL;
  int users_ = 0;
};

// A Python callable kept by a C++ std::function, which may be copied and dropped on any
// thread: the shared pointer is copied without the GIL, the object released under it.
inline std::shared_ptr<py::object> held_under_gil(py::handle callable) {
  return std::shared_ptr<py::object>(new py::object(py::reinterpret_borrow<py::object>(callable)), [](py::object* o) {
    py::gil_scoped_acquire locked;
    delete o;
  });
}

// ---- conversions ----

inline Shape to_shape(const std::vector<int64_t>& v) { return Shape(v.begin(), v.end()); }
// "(2, 3)", as Python writes a shape.
std::string shape_text(const std::vector<int64_t>& shape);
// An info value from Python: bool, int (within int64), float or str; TypeError else.
InfoValue to_info_value(const std::string& key, py::handle value);
py::object info_value(const InfoValue& v);
py::dict info_dict(const std::map<std::string, InfoValue>& info);
// A key: bytes, bytearray or memoryview (anything with the buffer protocol), never str or
// int (bytes(32) would be 32 zero bytes: a key nobody chose). Raises TypeError or, for a
// wrong length, DistckptError. None: no key.
std::shared_ptr<const EncryptionKey> key_from(const py::object& key);
// ValueError for an unknown format name.
Format format_from(const std::string& name);

// ---- the subjects' bindings ----

void bind_comm(py::module_& m);     // common.cc: Comm, MPI's start and end, argument agreement
void bind_state(py::module_& m);    // state.cc: TensorLayout, _StateDict, save, load, the tools
void bind_reader(py::module_& m);   // reader.cc: _Reader
void bind_manager(py::module_& m);  // manager.cc: _Manager, _Async, publish, signals

}  // namespace distckpt::python
