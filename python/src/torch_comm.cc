#include "torch_comm.h"

#include <pybind11/stl.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <utility>

namespace distckpt::python {

namespace py = pybind11;

namespace {

// A writable memoryview over memory the caller owns, which torch.frombuffer wraps without
// copying. Writable even for what is only sent: frombuffer warns on read-only buffers, and
// a send never writes.
py::memoryview view(const void* data, std::size_t bytes) {
  return py::memoryview::from_memory(const_cast<void*>(data), static_cast<py::ssize_t>(bytes), /*readonly=*/false);
}

// The strings of a packed reply (buffer, offsets, lengths): string i is lengths[i]
// bytes at offsets[i] of the buffer. One copy, no Python object per string.
std::vector<std::string> unpack(const py::handle& reply) {
  const auto parts = reply.cast<py::tuple>();
  const py::buffer_info buffer = parts[0].cast<py::buffer>().request();
  const auto offsets = parts[1].cast<std::vector<int64_t>>();
  const auto lengths = parts[2].cast<std::vector<int64_t>>();
  const auto* base = static_cast<const char*>(buffer.ptr);
  std::vector<std::string> out;
  out.reserve(lengths.size());
  for (std::size_t i = 0; i < lengths.size(); ++i)
    out.emplace_back(base + offsets.at(i), static_cast<std::size_t>(lengths[i]));
  return out;
}

}  // namespace

template <typename F>
auto TorchComm::call(const char* op, F&& f) const {
  py::gil_scoped_acquire locked;
  try {
    return f(backend_);
  } catch (py::error_already_set& e) {
    fail(op, e.what());
  } catch (const std::exception& e) {  // a reply of the wrong shape (pybind11's cast_error)
    fail(op, e.what());
  }
}

void TorchComm::fail(const char* op, const std::string& what) const {
  // MPI's default error handler ends the job on a transport failure, and distckpt is
  // written for that: no call returns a transport error. So does this one.
  std::fprintf(stderr, "distckpt: rank %d: torch.distributed failed in %s: %s\n"
               "distckpt: a transport failure is fatal; aborting this process\n", rank_, op, what.c_str());
  std::fflush(stderr);
  std::abort();
}

TorchComm::TorchComm(py::object backend) : backend_(std::move(backend)) {
  rank_ = backend_.attr("rank").cast<int>();
  size_ = backend_.attr("size").cast<int>();
  node_of_ = backend_.attr("node_of").cast<std::vector<int>>();
  node_names_ = backend_.attr("node_names").cast<std::vector<std::string>>();
  if (static_cast<int>(node_of_.size()) != size_ || node_names_.empty())
    throw py::value_error("TorchComm: a node map of " + std::to_string(node_of_.size()) + " ranks for " +
                          std::to_string(size_));
}

TorchComm::~TorchComm() {
  if (!Py_IsInitialized()) {  // past the interpreter's end: nothing may touch the object
    (void)backend_.release();
    return;
  }
  py::gil_scoped_acquire locked;
  backend_ = py::object();
}

void TorchComm::barrier() {
  call("barrier", [](const py::object& b) { b.attr("barrier")(); });
}

void TorchComm::broadcast(void* data, std::size_t bytes, int root) {
  if (bytes == 0) return;  // every rank passes the same size
  call("broadcast", [&](const py::object& b) { b.attr("broadcast")(view(data, bytes), root); });
}

void TorchComm::allreduce(std::vector<int64_t>& values, ReduceOp op) {
  call("allreduce", [&](const py::object& b) {
    values = b.attr("allreduce")(values, static_cast<int>(op)).cast<std::vector<int64_t>>();
  });
}

bool TorchComm::allreduce_within(std::vector<int64_t>& values, ReduceOp op, double timeout_s) {
  return call("allreduce_within", [&](const py::object& b) {
    py::object r = b.attr("allreduce_within")(values, static_cast<int>(op), timeout_s);
    if (r.is_none()) return false;
    values = r.cast<std::vector<int64_t>>();
    return true;
  });
}

std::vector<std::string> TorchComm::gather(const std::string& mine, int root) {
  return call("gather", [&](const py::object& b) {
    py::object r = b.attr("gather")(view(mine.data(), mine.size()), root);
    return rank_ == root ? unpack(r) : std::vector<std::string>{};
  });
}

std::string TorchComm::scatter(const std::vector<std::string>& parts, int root) {
  if (rank_ == root && parts.size() != static_cast<std::size_t>(size_)) {  // a bug in the caller, as in MpiComm
    std::fprintf(stderr, "distckpt: rank %d: scatter of %zu parts over %d ranks\n", rank_, parts.size(), size_);
    std::abort();
  }
  return call("scatter", [&](const py::object& b) {
    py::list views;
    if (rank_ == root)
      for (const std::string& p : parts) views.append(view(p.data(), p.size()));
    py::object r = b.attr("scatter")(views, root);
    return rank_ == root ? parts[static_cast<std::size_t>(root)] : unpack(r).at(0);
  });
}

std::vector<std::string> TorchComm::allgather(const std::string& mine) {
  return call("allgather",
              [&](const py::object& b) { return unpack(b.attr("allgather")(view(mine.data(), mine.size()))); });
}

namespace {

// Messages posted to gloo as they come; those to this rank itself are kept and copied at
// wait(), matched in order as any pair's.
class TorchExchange final : public Comm::Exchange {
 public:
  explicit TorchExchange(TorchComm& comm) : comm_(comm) {}
  TorchExchange(const TorchExchange&) = delete;
  TorchExchange& operator=(const TorchExchange&) = delete;
  ~TorchExchange() override {
    wait();
    if (works_) {
      py::gil_scoped_acquire locked;
      works_ = py::object();
    }
  }
  void post_send(const Comm::Transfer& t) override { post(t, "isend", own_sends_); }
  void post_receive(const Comm::Transfer& t) override { post(t, "irecv", own_receives_); }
  void wait() override {
    if (posted_) {
      comm_.call("transfer", [&](const py::object& b) {
        b.attr("wait")(works_);
        works_ = py::list();
      });
      posted_ = false;
    }
    while (!own_sends_.empty() && !own_receives_.empty()) {
      const Comm::Transfer& s = own_sends_.front();
      const Comm::Transfer& r = own_receives_.front();
      if (s.bytes > 0) std::memcpy(r.data, s.data, std::min(s.bytes, r.bytes));
      own_sends_.pop_front();
      own_receives_.pop_front();
    }
  }

 private:
  void post(const Comm::Transfer& t, const char* how, std::deque<Comm::Transfer>& own) {
    if (t.bytes == 0) return;  // both sides skip an empty message
    if (t.peer == comm_.rank()) {
      own.push_back(t);
      return;
    }
    comm_.call(how, [&](const py::object& b) {
      if (!works_) works_ = py::list();
      works_.cast<py::list>().append(b.attr(how)(view(t.data, t.bytes), t.peer));
    });
    posted_ = true;
  }
  TorchComm& comm_;
  py::object works_;  // a list of torch Work objects, made and dropped under the GIL
  bool posted_ = false;
  std::deque<Comm::Transfer> own_sends_, own_receives_;
};

}  // namespace

std::unique_ptr<Comm::Exchange> TorchComm::start_exchange() { return std::make_unique<TorchExchange>(*this); }

void TorchComm::transfer(const std::vector<Transfer>& sends, const std::vector<Transfer>& receives) {
  TorchExchange exchange(*this);
  for (const Transfer& t : receives) exchange.post_receive(t);
  for (const Transfer& t : sends) exchange.post_send(t);
  exchange.wait();
}

std::unique_ptr<TorchComm> TorchComm::duplicate() {
  py::gil_scoped_acquire locked;
  return std::make_unique<TorchComm>(backend_.attr("dup")());
}

}  // namespace distckpt::python
