// distckpt._distckpt: the native half of the Python package (python/distckpt holds the
// Pythonic half). Thin on purpose: tensors stay where Python put them (numpy arrays
// through the buffer protocol, torch tensors by address), Status codes become the
// package's exceptions, and the GIL is released around every collective and every I/O.
// One file per subject: common.cc (errors, communicators), state.cc (layouts, state
// dicts, save, load, the tools), reader.cc, manager.cc.
#include "common.h"

PYBIND11_MODULE(_distckpt, m) {
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

  bind_comm(m);
  bind_state(m);
  bind_reader(m);
  bind_manager(m);
}
