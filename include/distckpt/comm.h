// The communicator interface distckpt uses for its collectives.
//
// Production code wraps an MPI communicator (see mpi_comm.h); unit tests use an
// in-process implementation with one thread per rank. All collectives follow MPI's
// rules: every rank of the communicator calls them in the same order. A Comm object
// is used by one thread at a time. Buffers passed in are borrowed for the call only.
// Transport failures are fatal (MPI's default error handler aborts the job), so
// these calls return values rather than Status.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace distckpt {

enum class ReduceOp { kSum, kMin, kMax };

class Comm {
 public:
  virtual ~Comm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // Collective.
  virtual void barrier() = 0;
  // Collective: root's `bytes` bytes at `data` are copied into every rank's `data`.
  virtual void broadcast(void* data, std::size_t bytes, int root) = 0;
  // Collective: element-wise reduction of `values` (same length on every rank) in place.
  virtual void allreduce(std::vector<int64_t>& values, ReduceOp op) = 0;
  // Collective: root receives every rank's string (index = rank); others get {}.
  virtual std::vector<std::string> gather(const std::string& mine, int root) = 0;
  // Collective: rank r receives parts[r] from root (`parts` is read on root only).
  virtual std::string scatter(const std::vector<std::string>& parts, int root) = 0;
  // Collective: every rank receives every rank's string.
  virtual std::vector<std::string> allgather(const std::string& mine) = 0;

  // Helpers built on the primitives (collective).
  void broadcast_string(std::string& s, int root);
  int64_t allreduce_one(int64_t v, ReduceOp op);
};

}  // namespace distckpt
