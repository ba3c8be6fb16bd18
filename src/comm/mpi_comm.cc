#include <algorithm>
#include <chrono>
#include <climits>
#include <thread>
#include <cstdio>
#include <deque>
#include <map>
#include <mutex>
#include <memory>
#include <numeric>

#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "distckpt/mpi_comm.h"
#include "comm/mpi_interop.h"
#include "base/bounce.h"
#include "comm/peer_watchdog.h"

namespace distckpt {
namespace {

// The exit status of a rank that gave up waiting for its peers (EX_TEMPFAIL: the job
// can be resumed once the failed host is replaced).
constexpr int kPeerTimeoutExitCode = 75;

// MPI counts are ints: large payloads move in pieces of at most this many bytes.
constexpr std::size_t kMaxMpiCount = std::size_t{1} << 30;
// Where receives bounce, point-to-point messages go in pieces of this size instead.
constexpr std::size_t kBouncePieceBytes = std::size_t{1} << 20;

int checked_count(int64_t n) {
  if (n < 0 || n > INT_MAX) {
    std::fprintf(stderr, "distckpt: collective payload of %lld bytes exceeds MPI's int count\n",
                 static_cast<long long>(n));
    MPI_Abort(MPI_COMM_WORLD, 70);
  }
  return static_cast<int>(n);
}

class MpiComm final : public Comm {
  struct Pending {
    std::vector<int64_t> values;
    MPI_Request request = MPI_REQUEST_NULL;
  };

 public:
  MpiComm(MPI_Comm comm, const MpiCommOptions& options)
      : watchdog_(options.peer_timeout_s < 0 ? internal_comm::default_peer_timeout_s() : options.peer_timeout_s,
                  [this](const char* op, double waited_s) { give_up(op, waited_s); }) {
    MPI_Query_thread(&thread_level_);
    MPI_Comm_dup(comm, &comm_);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    // Nodes: the ranks of one shared-memory domain; each node is named after its lowest
    // rank (its leader), and numbered in the order of the leaders.
    MPI_Comm local;
    MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &local);
    int leader = rank_;
    MPI_Bcast(&leader, 1, MPI_INT, 0, local);  // local rank 0 has the lowest rank (key = rank)
    MPI_Comm_free(&local);
    // Whether any rank bounces its receives (base/bounce.h): then every rank sends in
    // pieces a receiver can bounce. Agreed here, because sender and receiver must cut a
    // message alike.
    int bounce = internal_base::bounce_io() ? 1 : 0;
    MPI_Allreduce(MPI_IN_PLACE, &bounce, 1, MPI_INT, MPI_MAX, comm_);
    piece_bytes_ = bounce != 0 ? kBouncePieceBytes : kMaxMpiCount;
    std::vector<int> leaders(static_cast<std::size_t>(size_));
    MPI_Allgather(&leader, 1, MPI_INT, leaders.data(), 1, MPI_INT, comm_);
    std::vector<int> ordered = leaders;
    std::sort(ordered.begin(), ordered.end());
    ordered.erase(std::unique(ordered.begin(), ordered.end()), ordered.end());
    nodes_ = static_cast<int>(ordered.size());
    node_of_.resize(leaders.size());
    for (std::size_t r = 0; r < leaders.size(); ++r)
      node_of_[r] = static_cast<int>(std::lower_bound(ordered.begin(), ordered.end(), leaders[r]) - ordered.begin());
    char name[MPI_MAX_PROCESSOR_NAME] = {};
    int length = 0;
    MPI_Get_processor_name(name, &length);
    std::vector<char> names(static_cast<std::size_t>(size_) * MPI_MAX_PROCESSOR_NAME);
    MPI_Allgather(name, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, names.data(), MPI_MAX_PROCESSOR_NAME, MPI_CHAR, comm_);
    for (int l : ordered) {
      const char* n = names.data() + static_cast<std::size_t>(l) * MPI_MAX_PROCESSOR_NAME;
      node_names_.emplace_back(n, strnlen(n, MPI_MAX_PROCESSOR_NAME));
    }
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int node_count() const override { return nodes_; }
  int node_of(int rank) const override { return node_of_.at(static_cast<std::size_t>(rank)); }
  std::string node_name(int rank) const override { return node_names_.at(static_cast<std::size_t>(node_of(rank))); }
  MPI_Comm mpi() const { return comm_; }
  void barrier() override {
    Watched watched(watchdog_, "barrier");
    MPI_Barrier(comm_);
  }

  void broadcast(void* data, std::size_t bytes, int root) override {
    Watched watched(watchdog_, "broadcast");
    auto* p = static_cast<char*>(data);
    for (std::size_t done = 0; done < bytes;) {
      const std::size_t n = std::min(kMaxMpiCount, bytes - done);
      MPI_Bcast(p + done, static_cast<int>(n), MPI_BYTE, root, comm_);
      done += n;
    }
  }

  void allreduce(std::vector<int64_t>& values, ReduceOp op) override {
    Watched watched(watchdog_, "allreduce");
    MPI_Op mop = op == ReduceOp::kSum ? MPI_SUM : op == ReduceOp::kMin ? MPI_MIN : MPI_MAX;
    MPI_Allreduce(MPI_IN_PLACE, values.data(), checked_count(static_cast<int64_t>(values.size())), MPI_INT64_T,
                  mop, comm_);
  }

  bool allreduce_within(std::vector<int64_t>& values, ReduceOp op, double timeout_s) override {
    MPI_Op mop = op == ReduceOp::kSum ? MPI_SUM : op == ReduceOp::kMin ? MPI_MIN : MPI_MAX;
    // The operation may outlive this call (timeout): its buffer and request live on the
    // heap and are deliberately leaked then, so MPI never writes into freed memory.
    auto pending = std::make_unique<Pending>();
    pending->values = values;
    MPI_Iallreduce(MPI_IN_PLACE, pending->values.data(), checked_count(static_cast<int64_t>(values.size())),
                   MPI_INT64_T, mop, comm_, &pending->request);
    if (timeout_s < 0) {
      Watched watched(watchdog_, "allreduce");
      MPI_Wait(&pending->request, MPI_STATUS_IGNORE);
      values = pending->values;
      return true;
    }
    // Polling with a short sleep: the ranks that never come are blocked elsewhere, and
    // the caller gives up on the job after the timeout anyway.
    const double deadline = MPI_Wtime() + timeout_s;
    for (int done = 0;;) {
      MPI_Test(&pending->request, &done, MPI_STATUS_IGNORE);
      if (done) {
        values = pending->values;
        return true;
      }
      if (MPI_Wtime() >= deadline) {
        (void)pending.release();  // still in use by MPI; the job is being abandoned
        return false;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }

  std::vector<std::string> gather(const std::string& mine, int root) override {
    Watched watched(watchdog_, "gather");
    int mysize = checked_count(static_cast<int64_t>(mine.size()));
    std::vector<int> sizes(rank_ == root ? size_ : 0);
    MPI_Gather(&mysize, 1, MPI_INT, sizes.data(), 1, MPI_INT, root, comm_);
    std::vector<int> displs;
    std::string all;
    if (rank_ == root) displs = prefix(sizes, &all);
    MPI_Gatherv(mine.data(), mysize, MPI_BYTE, all.data(), sizes.data(), displs.data(), MPI_BYTE, root, comm_);
    return rank_ == root ? split(all, sizes, displs) : std::vector<std::string>{};
  }

  std::string scatter(const std::vector<std::string>& parts, int root) override {
    Watched watched(watchdog_, "scatter");
    std::vector<int> sizes;
    if (rank_ == root && parts.size() != static_cast<std::size_t>(size_)) {  // a bug in the caller
      std::fprintf(stderr, "distckpt: scatter of %zu parts over %d ranks\n", parts.size(), size_);
      MPI_Abort(MPI_COMM_WORLD, 70);
    }
    if (rank_ == root)
      for (const auto& p : parts) sizes.push_back(checked_count(static_cast<int64_t>(p.size())));
    int mysize = 0;
    MPI_Scatter(sizes.data(), 1, MPI_INT, &mysize, 1, MPI_INT, root, comm_);
    // The parts go point to point, all posted at once. MPI_Scatterv's linear algorithm
    // sends them one after another, and a part over the eager limit waits for its
    // receiver's handshake before the next one starts: on a node with more ranks than
    // cores, one scheduling delay per rank (a save's write lists: 4-5 ms each here).
    if (rank_ != root) {
      std::string mine(static_cast<std::size_t>(mysize), '\0');
      if (mysize > 0) MPI_Recv(mine.data(), mysize, MPI_BYTE, root, kScatterTag, comm_, MPI_STATUS_IGNORE);
      return mine;
    }
    std::vector<MPI_Request> requests;
    requests.reserve(static_cast<std::size_t>(size_));
    for (int r = 0; r < size_; ++r) {
      if (r == root || sizes[static_cast<std::size_t>(r)] == 0) continue;
      requests.emplace_back();
      MPI_Isend(parts[static_cast<std::size_t>(r)].data(), sizes[static_cast<std::size_t>(r)], MPI_BYTE, r,
                kScatterTag, comm_, &requests.back());
    }
    MPI_Waitall(static_cast<int>(requests.size()), requests.data(), MPI_STATUSES_IGNORE);
    return parts[static_cast<std::size_t>(root)];
  }

  void transfer(const std::vector<Transfer>& sends, const std::vector<Transfer>& receives) override {
    MpiExchange exchange(*this);
    for (const Transfer& t : receives) exchange.post_receive(t);
    for (const Transfer& t : sends) exchange.post_send(t);
    exchange.wait();
  }

  std::unique_ptr<Exchange> start_exchange() override { return std::make_unique<MpiExchange>(*this); }

  std::vector<std::string> allgather(const std::string& mine) override {
    Watched watched(watchdog_, "allgather");
    int mysize = checked_count(static_cast<int64_t>(mine.size()));
    std::vector<int> sizes(size_);
    MPI_Allgather(&mysize, 1, MPI_INT, sizes.data(), 1, MPI_INT, comm_);
    std::string all;
    std::vector<int> displs = prefix(sizes, &all);
    MPI_Allgatherv(mine.data(), mysize, MPI_BYTE, all.data(), sizes.data(), displs.data(), MPI_BYTE, comm_);
    return split(all, sizes, displs);
  }

 private:
  using Watched = internal_comm::PeerWatchdog::Scope;

  // Non-blocking sends and receives. Messages go in pieces of at most piece_bytes_, the
  // same on every rank; pieces between two ranks are matched in order (MPI's
  // non-overtaking rule), like whole messages.
  //
  // Where the kernel's first touch of a page traps (base/bounce.h), a large receive lands
  // piece by piece in a few warm buffers kept by the process, and is copied from there in
  // user mode: Open MPI moves bytes between ranks of a node with process_vm_readv and
  // between nodes with sockets, both the kernel writing into the receiver's memory. A fresh
  // process's restore from disk at DP2 x TP2 spent 0.54-0.78 s in its replica exchange
  // this way, against 0.06 s once the tensors were warm. Receives from each peer are
  // posted in the order they were asked for, so that matching stays the same; only how
  // many bounced pieces are in flight is bounded (kBounceSlots).
  class MpiExchange final : public Exchange {
   public:
    explicit MpiExchange(MpiComm& comm) : comm_(comm) {}
    MpiExchange(const MpiExchange&) = delete;
    MpiExchange& operator=(const MpiExchange&) = delete;
    ~MpiExchange() override {
      wait();
      if (slots_ != nullptr) SlotPool::instance().give(slots_);
    }
    void post_send(const Transfer& t) override {
      for_each_piece(t, [&](char* p, int n) {
        requests_.emplace_back();
        posted_.push_back(Piece{p, n, t.peer, -1});
        MPI_Isend(p, n, MPI_BYTE, t.peer, kTag, comm_.comm_, &requests_.back());
      });
    }
    void post_receive(const Transfer& t) override {
      // Only where every rank cuts messages into bounce-sized pieces (piece_bytes_).
      const bool may_bounce = comm_.piece_bytes_ == kBouncePieceBytes && internal_base::bounce_io_for(t.bytes);
      if (may_bounce && slots_ == nullptr) slots_ = SlotPool::instance().take();
      const bool bounce = may_bounce && slots_ != nullptr;
      std::deque<Piece>& queue = queued_[t.peer];
      for_each_piece(t, [&](char* p, int n) { queue.push_back(Piece{p, n, t.peer, bounce ? 0 : -1}); });
      post_queued();
    }
    void progress() override { (void)step(/*block=*/false); }
    void wait() override {
      if (requests_.empty() && queued_.empty()) return;
      Watched watched(comm_.watchdog_, "transfer");
      while (step(/*block=*/true)) {
      }
    }

   private:
    static constexpr int kTag = 7411;
    static constexpr int kBounceSlots = 4;
    struct Piece {
      char* data;
      int bytes;
      int peer;
      int slot;  // receives: -1 straight into `data`; else a bounce slot (queued: 0, to be chosen)
    };
    // Sets of bounce slots (kBounceSlots x kBouncePieceBytes each), one per exchange that
    // bounces, kept by the process once returned so that the next exchange finds them warm
    // (at most kKept sets). take() gives nullptr when memory cannot be allocated: the
    // exchange then receives in place. Thread-safe.
    class SlotPool {
     public:
      static SlotPool& instance() {
        static SlotPool* pool = new SlotPool;  // never destroyed: exchanges may end at exit
        return *pool;
      }
      char* take() {
        {
          std::lock_guard<std::mutex> lock(mu_);
          if (!free_.empty()) {
            char* p = free_.back();
            free_.pop_back();
            return p;
          }
        }
        return static_cast<char*>(std::aligned_alloc(4096, kBounceSlots * kBouncePieceBytes));
      }
      void give(char* p) {
        std::lock_guard<std::mutex> lock(mu_);
        if (free_.size() < kKept) free_.push_back(p);
        else std::free(p);
      }

     private:
      static constexpr std::size_t kKept = 2;
      std::mutex mu_;
      std::vector<char*> free_;
    };
    char* slot(int i) const { return slots_ + static_cast<std::size_t>(i) * kBouncePieceBytes; }
    template <typename F>
    void for_each_piece(const Transfer& t, F&& f) const {  // empty messages: nothing on either side
      auto* p = static_cast<char*>(t.data);
      for (std::size_t done = 0; done < t.bytes;) {
        const std::size_t n = std::min(comm_.piece_bytes_, t.bytes - done);
        f(p + done, static_cast<int>(n));
        done += n;
      }
    }
    // Posts what may be posted, then retires what is done (`block`: waits for at least
    // one). False when nothing is in flight, which means nothing is queued either: with
    // no receive in flight every slot is free, so post_queued() posts at least one.
    bool step(bool block) {
      post_queued();
      if (requests_.empty()) return false;
      int done = 0;
      finished_.resize(requests_.size());
      const int count = static_cast<int>(requests_.size());
      if (block) MPI_Waitsome(count, requests_.data(), &done, finished_.data(), MPI_STATUSES_IGNORE);
      else MPI_Testsome(count, requests_.data(), &done, finished_.data(), MPI_STATUSES_IGNORE);
      if (done != MPI_UNDEFINED && done > 0) retire(done);
      return true;
    }
    // Posts each peer's queued receives in order, as long as each bounced one finds a
    // free slot; a peer whose next piece waits for a slot holds up only its own.
    void post_queued() {
      for (auto it = queued_.begin(); it != queued_.end();) {
        std::deque<Piece>& queue = it->second;
        while (!queue.empty()) {
          Piece piece = queue.front();
          char* into = piece.data;
          if (piece.slot >= 0) {
            int free_slot = 0;
            while (free_slot < kBounceSlots && (slots_used_ >> free_slot & 1u)) ++free_slot;
            if (free_slot == kBounceSlots) break;
            slots_used_ |= 1u << free_slot;
            piece.slot = free_slot;
            into = slot(free_slot);
          }
          queue.pop_front();
          requests_.emplace_back();
          posted_.push_back(piece);
          MPI_Irecv(into, piece.bytes, MPI_BYTE, piece.peer, kTag, comm_.comm_, &requests_.back());
        }
        it = queue.empty() ? queued_.erase(it) : std::next(it);
      }
    }
    // The `done` requests MPI_Waitsome/Testsome listed in finished_ are complete: bounced
    // receives are copied into place and give their slot back; all are dropped.
    void retire(int done) {
      for (int i = 0; i < done; ++i) {
        const Piece& piece = posted_[static_cast<std::size_t>(finished_[static_cast<std::size_t>(i)])];
        if (piece.slot >= 0) {
          std::memcpy(piece.data, slot(piece.slot), static_cast<std::size_t>(piece.bytes));
          slots_used_ &= ~(1u << piece.slot);
        }
      }
      // Finished requests are MPI_REQUEST_NULL now: keep only what is still moving.
      std::size_t kept = 0;
      for (std::size_t i = 0; i < requests_.size(); ++i) {
        if (requests_[i] == MPI_REQUEST_NULL) continue;
        requests_[kept] = requests_[i];
        posted_[kept] = posted_[i];
        ++kept;
      }
      requests_.resize(kept);
      posted_.resize(kept);
    }
    MpiComm& comm_;
    std::vector<MPI_Request> requests_;  // in flight, with posted_ alike
    std::vector<Piece> posted_;
    std::map<int, std::deque<Piece>> queued_;  // by peer: receives not posted yet, in the order asked for
    char* slots_ = nullptr;      // from SlotPool, at the first receive that bounces
    unsigned slots_used_ = 0;    // a bit per bounce slot
    std::vector<int> finished_;  // MPI_Waitsome's indices
  };

  // The watchdog's verdict: a peer did not join within the limit. Runs on the
  // watchdog's thread while this rank's own thread is blocked in MPI.
  [[noreturn]] void give_up(const char* op, double waited_s) const {
    char host[256] = {};
    (void)::gethostname(host, sizeof host - 1);
    std::fprintf(stderr,
                 "distckpt: rank %d on %s waited %.0f s for its peers in %s (peer timeout %g s): a peer's host is "
                 "down, cut off or hung; aborting the job\n",
                 rank_, host, waited_s, op, watchdog_.timeout_s());
    std::fflush(stderr);
    // MPI_Abort may only be called from this thread when MPI is fully thread-safe; and
    // it waits for mpirun, which a partition or a dead first host makes unreachable: if
    // it has not ended the process in 5 s, the process ends itself (the launcher's
    // daemon then sees a rank gone without MPI_Finalize and ends the rest).
    if (thread_level_ == MPI_THREAD_MULTIPLE) {
      std::thread([] {
        std::this_thread::sleep_for(std::chrono::seconds(5));
        std::_Exit(kPeerTimeoutExitCode);
      }).detach();
      MPI_Abort(comm_, kPeerTimeoutExitCode);
    }
    std::_Exit(kPeerTimeoutExitCode);
  }

  // Displacements for `sizes`; sizes `all` to hold them all.
  static std::vector<int> prefix(const std::vector<int>& sizes, std::string* all) {
    std::vector<int> displs(sizes.size());
    int64_t total = 0;
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      displs[i] = checked_count(total);
      total += sizes[i];
    }
    all->assign(static_cast<std::size_t>(checked_count(total)), '\0');
    return displs;
  }
  static std::vector<std::string> split(const std::string& all, const std::vector<int>& sizes,
                                        const std::vector<int>& displs) {
    std::vector<std::string> out(sizes.size());
    for (std::size_t i = 0; i < sizes.size(); ++i) out[i] = all.substr(displs[i], sizes[i]);
    return out;
  }

  static constexpr int kScatterTag = 7412;  // not the exchanges' (7411)

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
  int nodes_ = 1;
  int thread_level_ = MPI_THREAD_SINGLE;
  std::size_t piece_bytes_ = kMaxMpiCount;  // how every rank cuts point-to-point messages
  std::vector<int> node_of_;             // by rank
  std::vector<std::string> node_names_;  // by node
  internal_comm::PeerWatchdog watchdog_;  // last: its thread may use the members above
};

}  // namespace

std::unique_ptr<Comm> make_mpi_comm(MPI_Comm comm, const MpiCommOptions& options) {
  return std::make_unique<MpiComm>(comm, options);
}

namespace internal_comm {
std::optional<MPI_Comm> as_mpi(const Comm& comm) {
  if (const auto* m = dynamic_cast<const MpiComm*>(&comm)) return m->mpi();
  return std::nullopt;
}
}  // namespace internal_comm

}  // namespace distckpt
