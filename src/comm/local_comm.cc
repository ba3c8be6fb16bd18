#include "comm/local_comm.h"

#include <condition_variable>
#include <algorithm>
#include <cstring>
#include <mutex>
#include <thread>

namespace distckpt::internal_comm {
namespace {

// Every collective is an all-to-all exchange of one string per rank: simple, and
// the cost is irrelevant in tests.
struct Shared {
  explicit Shared(int n) : slots(n) {}
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::string> slots;
  std::vector<std::string> result;
  int arrived = 0;
  uint64_t generation = 0;
};

std::string pack(const std::vector<std::string>& parts) {
  std::string out;
  for (const auto& p : parts) {
    uint64_t n = p.size();
    out.append(reinterpret_cast<const char*>(&n), sizeof(n));
    out += p;
  }
  return out;
}

std::vector<std::string> unpack(const std::string& s) {
  std::vector<std::string> parts;
  for (std::size_t pos = 0; pos < s.size();) {
    uint64_t n;
    std::memcpy(&n, s.data() + pos, sizeof(n));
    pos += sizeof(n);
    parts.push_back(s.substr(pos, n));
    pos += n;
  }
  return parts;
}

class LocalComm final : public Comm {
 public:
  LocalComm(std::shared_ptr<Shared> shared, int rank, int size, int ranks_per_node)
      : shared_(std::move(shared)), rank_(rank), size_(size), ranks_per_node_(ranks_per_node) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int node_count() const override { return ranks_per_node_ > 0 ? node_of(size_ - 1) + 1 : 1; }
  int node_of(int rank) const override { return ranks_per_node_ > 0 ? rank / ranks_per_node_ : 0; }
  std::string node_name(int rank) const override {
    return ranks_per_node_ > 0 ? "node" + std::to_string(node_of(rank)) : Comm::node_name(rank);
  }

  void barrier() override { exchange(""); }
  void broadcast(void* data, std::size_t bytes, int root) override {
    // No bytes (an empty vector's null data): the ranks still meet, nothing is copied.
    auto all = exchange(rank_ == root && bytes > 0 ? std::string(static_cast<char*>(data), bytes) : std::string());
    if (rank_ != root && bytes > 0) std::memcpy(data, all[root].data(), bytes);
  }
  void allreduce(std::vector<int64_t>& values, ReduceOp op) override {
    auto all = exchange(std::string(reinterpret_cast<const char*>(values.data()), values.size() * 8));
    for (std::size_t i = 0; i < values.size(); ++i) {
      int64_t acc = 0;
      for (int r = 0; r < size_; ++r) {
        int64_t v;
        std::memcpy(&v, all[r].data() + i * 8, 8);
        if (r == 0) acc = v;
        else if (op == ReduceOp::kSum) acc += v;
        else if (op == ReduceOp::kMin) acc = std::min(acc, v);
        else acc = std::max(acc, v);
      }
      values[i] = acc;
    }
  }
  std::vector<std::string> gather(const std::string& mine, int root) override {
    auto all = exchange(mine);
    return rank_ == root ? all : std::vector<std::string>{};
  }
  std::string scatter(const std::vector<std::string>& parts, int root) override {
    auto all = exchange(rank_ == root ? pack(parts) : std::string());
    return unpack(all[root])[rank_];
  }
  std::vector<std::string> allgather(const std::string& mine) override { return exchange(mine); }

  // In-process emulation, collective over the whole group (unlike MPI's): every rank
  // publishes its sends, then copies out the ones addressed to it, in order per sender.
  // Callers in tests that transfer must therefore call it on every rank.
  void transfer(const std::vector<Transfer>& sends, const std::vector<Transfer>& receives) override {
    std::vector<std::string> mine;
    for (const Transfer& t : sends) {
      std::string m(sizeof(int), '\0');
      std::memcpy(m.data(), &t.peer, sizeof(int));
      m.append(static_cast<const char*>(t.data), t.bytes);
      mine.push_back(std::move(m));
    }
    auto all = exchange(pack(mine));
    std::vector<std::size_t> next(size_, 0);  // next message of each sender to consider
    std::vector<std::vector<std::string>> from(size_);
    for (int r = 0; r < size_; ++r) from[r] = unpack(all[r]);
    for (const Transfer& t : receives) {
      auto& msgs = from[t.peer];
      while (next[t.peer] < msgs.size()) {
        const std::string& m = msgs[next[t.peer]++];
        int dest;
        std::memcpy(&dest, m.data(), sizeof(int));
        if (dest != rank_) continue;
        std::memcpy(t.data, m.data() + sizeof(int), std::min(t.bytes, m.size() - sizeof(int)));
        break;
      }
    }
  }

 private:
  std::vector<std::string> exchange(std::string mine) {
    Shared& s = *shared_;
    std::unique_lock<std::mutex> lock(s.mu);
    s.slots[rank_] = std::move(mine);
    const uint64_t gen = s.generation;
    if (++s.arrived == size_) {
      s.result = s.slots;
      s.arrived = 0;
      ++s.generation;
      s.cv.notify_all();
    } else {
      s.cv.wait(lock, [&] { return s.generation != gen; });
    }
    // Safe: the next generation cannot complete before this rank arrives again.
    return s.result;
  }

  std::shared_ptr<Shared> shared_;
  int rank_;
  int size_;
  int ranks_per_node_;
};

}  // namespace

std::vector<std::unique_ptr<Comm>> make_local_comms(int n, int ranks_per_node) {
  auto shared = std::make_shared<Shared>(n);
  std::vector<std::unique_ptr<Comm>> comms;
  for (int r = 0; r < n; ++r) comms.push_back(std::make_unique<LocalComm>(shared, r, n, ranks_per_node));
  return comms;
}

void run_local_ranks(int n, const std::function<void(Comm&)>& fn, int ranks_per_node) {
  auto comms = make_local_comms(n, ranks_per_node);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back([&, r] { fn(*comms[r]); });
  for (auto& t : threads) t.join();
}

}  // namespace distckpt::internal_comm
