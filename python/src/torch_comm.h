// A Comm over a torch.distributed process group on the gloo backend, for jobs that
// torchrun or torch.multiprocessing started without an MPI launcher (Comm.from_torch).
//
// The collectives are made by a Python object (distckpt/_torch_comm.py, class _Backend)
// that holds the gloo group; each call here takes the GIL, calls it, and drops the GIL
// again while torch waits (torch releases it in its own collectives). Native calls
// (save, load, the manager) run with the GIL released, and an AsyncCheckpointer's
// background thread takes it like any other thread, so the training loop and the
// background thread share the interpreter but never a group: each TorchComm has a group
// of its own (duplicate() makes another).
//
// Failures: a torch or gloo error in a call is a transport failure. distckpt treats
// those as fatal, as MPI's default error handler does: the rank prints the Python error
// with its rank on stderr and calls std::abort(). The other ranks then fail in their
// own next call to the dead peer (gloo reports a closed connection) or at gloo's timeout.
#pragma once

#include <pybind11/pybind11.h>

#include <memory>
#include <string>
#include <vector>

#include "distckpt/comm.h"

namespace distckpt::python {

class TorchComm final : public Comm {
 public:
  // Local: wraps `backend` (a distckpt._torch_comm._Backend) and reads its rank, size and
  // node map once. Thread: one holding the GIL. Raises (TypeError, AttributeError) for
  // an object without them. The TorchComm owns its reference to `backend`.
  explicit TorchComm(pybind11::object backend);
  // Local: drops the backend under the GIL (any thread); after the interpreter has ended
  // it is leaked instead (nothing can be done with it then).
  ~TorchComm() override;
  TorchComm(const TorchComm&) = delete;
  TorchComm& operator=(const TorchComm&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int node_count() const override { return static_cast<int>(node_names_.size()); }
  int node_of(int rank) const override { return node_of_.at(static_cast<std::size_t>(rank)); }
  std::string node_name(int rank) const override { return node_names_.at(static_cast<std::size_t>(node_of(rank))); }

  // Collectives and point-to-point as Comm's (comm.h); any thread, the GIL taken here.
  // Buffers are borrowed for the call (a posted exchange's until its wait()).
  void barrier() override;
  void broadcast(void* data, std::size_t bytes, int root) override;
  void allreduce(std::vector<int64_t>& values, ReduceOp op) override;
  // A non-blocking allreduce polled until `timeout_s`; on a timeout its tensor and work
  // are kept by the backend forever (the job is being abandoned; see comm.h).
  bool allreduce_within(std::vector<int64_t>& values, ReduceOp op, double timeout_s) override;
  std::vector<std::string> gather(const std::string& mine, int root) override;
  std::string scatter(const std::vector<std::string>& parts, int root) override;
  std::vector<std::string> allgather(const std::string& mine) override;
  void transfer(const std::vector<Transfer>& sends, const std::vector<Transfer>& receives) override;
  // Messages are posted to gloo as they come (isend/irecv), so they move while the caller
  // reads and checks the next ones; messages to this rank itself are copied at wait().
  std::unique_ptr<Exchange> start_exchange() override;

  // Collective over the whole torch job (torch's new_group is: every process of the
  // default group calls it, in the same order, from the thread that made this Comm):
  // a new TorchComm over a new gloo group with the same ranks. Any thread outside a GIL
  // section; takes the GIL. Raises (py::error_already_set) as the backend's dup() does.
  std::unique_ptr<TorchComm> duplicate();

  // Calls `f(backend)` under the GIL (any thread) and returns what it returns; a Python
  // exception is a transport failure: printed with the rank and `op`, then std::abort().
  template <typename F>
  auto call(const char* op, F&& f) const;

 private:
  [[noreturn]] void fail(const char* op, const std::string& what) const;
  pybind11::object backend_;
  int rank_ = 0;
  int size_ = 1;
  std::vector<int> node_of_;             // by rank
  std::vector<std::string> node_names_;  // by node
};

}  // namespace distckpt::python
