/// The communicator interface distckpt uses for its collectives.
///
/// Production code wraps an MPI communicator (see mpi_comm.h); unit tests use an
/// in-process implementation with one thread per rank. All collectives follow MPI's
/// rules: every rank of the communicator calls them in the same order. A Comm object
/// is used by one thread at a time. Buffers passed in are borrowed for the call only.
/// Transport failures are fatal (MPI's default error handler aborts the job), so
/// these calls return values rather than Status.
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
  /// Number of distinct nodes (shared-memory domains) the ranks run on. Local (known
  /// since the Comm was made), cannot fail.
  virtual int node_count() const { return 1; }
  /// The node (0 .. node_count()-1) that `rank` runs on: ranks of one node share memory,
  /// bytes between nodes cross the network. Not collective; any rank may ask.
  virtual int node_of(int rank) const {
    (void)rank;
    return 0;
  }
  /// The host name of `rank`'s node, for statistics and messages. Not collective.
  /// Default: this process's host name (gethostname) for every rank.
  virtual std::string node_name(int rank) const;

  /// Collective.
  virtual void barrier() = 0;
  /// Collective: root's `bytes` bytes at `data` are copied into every rank's `data`.
  virtual void broadcast(void* data, std::size_t bytes, int root) = 0;
  /// Collective: element-wise reduction of `values` (same length on every rank) in place.
  virtual void allreduce(std::vector<int64_t>& values, ReduceOp op) = 0;
  /// Collective: allreduce() that gives up after `timeout_s` seconds (< 0: never) when
  /// some rank has not joined, returning false. The operation then stays pending and the
  /// communicator must not be used again (the caller is abandoning the job). Ranks must
  /// use allreduce_within, not allreduce, for the matching calls (MPI does not match
  /// blocking with non-blocking collectives). Default: a blocking allreduce (true).
  virtual bool allreduce_within(std::vector<int64_t>& values, ReduceOp op, double timeout_s) {
    (void)timeout_s;
    allreduce(values, op);
    return true;
  }
  /// Collective: root receives every rank's string (index = rank); others get {}.
  virtual std::vector<std::string> gather(const std::string& mine, int root) = 0;
  /// Collective: rank r receives parts[r] from root (`parts` is read on root only).
  virtual std::string scatter(const std::vector<std::string>& parts, int root) = 0;
  /// Collective: every rank receives every rank's string.
  virtual std::vector<std::string> allgather(const std::string& mine) = 0;

  /// One point-to-point message: `bytes` bytes at `data`, to or from rank `peer`.
  struct Transfer {
    int peer;
    void* data;
    std::size_t bytes;
  };
  /// Point-to-point: sends and receives all the listed messages and returns when all are
  /// done. Every message listed as a send on one rank must be listed as a receive, with
  /// the same size, on its peer; messages between the same two ranks are matched in the
  /// order they are listed. Ranks with nothing to exchange need not call it.
  virtual void transfer(const std::vector<Transfer>& sends, const std::vector<Transfer>& receives) = 0;

  /// transfer()'s messages posted one at a time, so that they move while the caller works
  /// (a load sends each box as soon as it is read and checked, while its disk reads go
  /// on). Post, call progress() now and then, and wait() before the memory of any posted
  /// message is used or freed. Matching is transfer()'s: messages between two ranks match
  /// in the order they are posted. At most one exchange or transfer() is in flight on a
  /// communicator at a time (receives may be posted later than asked for, in order).
  /// Thread: the communicator's. The destructor waits for what is still posted.
  class Exchange {
   public:
    virtual ~Exchange() = default;
    virtual void post_send(const Transfer& t) = 0;
    virtual void post_receive(const Transfer& t) = 0;
    /// Lets posted messages move; returns at once.
    virtual void progress() {}
    /// Until every posted message is done. Where transfer() is collective (the in-process
    /// Comm), every rank calls it.
    virtual void wait() = 0;
  };
  /// Local: a new exchange (owned by the caller) whose messages pair with those the
  /// other ranks post; see Exchange. The default keeps what is posted and hands it all
  /// to transfer() in wait().
  virtual std::unique_ptr<Exchange> start_exchange();

  /// Helpers built on the primitives (collective).
  void broadcast_string(std::string& s, int root);
  int64_t allreduce_one(int64_t v, ReduceOp op);
};

}  // namespace distckpt
