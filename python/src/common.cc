#include "common.h"

#include <cstring>

namespace distckpt::python {

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

namespace {

// Whether this module called MPI_Init_thread (then it calls MPI_Finalize at exit).
bool mpi_initialised_here = false;

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

// A Comm over torch.distributed: `backend` is distckpt._torch_comm._Backend, whose making
// (Comm.from_torch) was the collective part. No MPI call.
std::unique_ptr<PyComm> comm_from_torch(py::object backend) {
  return std::make_unique<PyComm>(std::make_unique<TorchComm>(std::move(backend)));
}

void finalize_if_ours() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (mpi_initialised_here && !finalized) MPI_Finalize();
  mpi_initialised_here = false;
}

}  // namespace

void bind_comm(py::module_& m) {
  py::class_<PyComm>(m, "Comm")
      .def_static("_world", &comm_world)
      .def_static("_from_handle", &comm_from_handle)
      .def_static("_from_torch", &comm_from_torch)
      .def_property_readonly("rank", &PyComm::rank)
      .def_property_readonly("size", &PyComm::size)
      .def_property_readonly("closed", &PyComm::closed)
      .def("close", &PyComm::close)
      .def("barrier", [](PyComm& c) {
        py::gil_scoped_release unlocked;
        c.get().barrier();
      })
      // Collective: every rank's bytes, in rank order (distckpt.torch gathers local shapes,
      // per-rank values and replicas' fingerprints with it).
      .def("_allgather", [](PyComm& c, const py::bytes& mine) {
        const std::string own = mine;
        std::vector<std::string> all;
        {
          py::gil_scoped_release unlocked;
          all = c.get().allgather(own);
        }
        py::list out;
        for (const std::string& s : all) out.append(py::bytes(s));
        return out;
      });
  m.def("_finalize_if_ours", &finalize_if_ours);
  // Collective, one allreduce (two after a failure): agrees on an outcome. `message` is
  // this rank's failure ("" for none); returns "" when no rank failed, else the lowest
  // failing rank's message, on every rank.
  m.def("_agree_outcome", [](PyComm& c, const std::string& message) {
    Comm& comm = c.get();
    const Status local =
        message.empty() ? Status() : invalid_argument("rank " + std::to_string(comm.rank()) + ": " + message);
    const Status all = without_gil([&] { return internal_comm::agree(comm, local); });
    return all.ok() ? std::string() : all.message();
  });
  // The Python side's argument checks failed on this rank: it joins the agreement the
  // other ranks' call starts with (agreed_arguments), so that they raise naming this
  // rank; the caller raises its own error after. Collective.
  m.def("_agree_argument_error", [](PyComm& c, const std::string& message) {
    Comm& comm = c.get();
    const Status local = invalid_argument("rank " + std::to_string(comm.rank()) + ": " + message);
    (void)without_gil([&] { return internal_comm::agree(comm, local); });
  });
}

}  // namespace distckpt::python
