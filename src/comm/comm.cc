#include "distckpt/comm.h"

#include <unistd.h>

namespace distckpt {

void Comm::broadcast_string(std::string& s, int root) {
  int64_t n = static_cast<int64_t>(s.size());
  broadcast(&n, sizeof(n), root);
  s.resize(static_cast<std::size_t>(n));
  if (n > 0) broadcast(s.data(), s.size(), root);
}

std::string Comm::node_name(int rank) const {
  (void)rank;
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0) return "localhost";
  return name;
}

namespace {

class DeferredExchange final : public Comm::Exchange {
 public:
  explicit DeferredExchange(Comm& comm) : comm_(comm) {}
  ~DeferredExchange() override { wait(); }
  void post_send(const Comm::Transfer& t) override { sends_.push_back(t); }
  void post_receive(const Comm::Transfer& t) override { receives_.push_back(t); }
  void wait() override {
    if (sends_.empty() && receives_.empty() && waited_) return;
    comm_.transfer(sends_, receives_);
    sends_.clear();
    receives_.clear();
    waited_ = true;
  }

 private:
  Comm& comm_;
  std::vector<Comm::Transfer> sends_, receives_;
  bool waited_ = false;  // transfer() may be collective: called once even with nothing posted
};

}  // namespace

std::unique_ptr<Comm::Exchange> Comm::start_exchange() { return std::make_unique<DeferredExchange>(*this); }

int64_t Comm::allreduce_one(int64_t v, ReduceOp op) {
  std::vector<int64_t> values{v};
  allreduce(values, op);
  return values[0];
}

}  // namespace distckpt
