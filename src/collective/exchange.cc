#include "collective/exchange.h"

namespace distckpt::internal_collective {

void ReadExchange::add_send(int item, const Comm::Transfer& t) {
  by_peer_[t.peer].push_back(sends_.size());
  sends_.push_back(Out{t, item});
}

void ReadExchange::add_receive(const Comm::Transfer& t) { receives_.push_back(t); }

void ReadExchange::start(Comm& comm, std::size_t items) {
  ready_.assign(items, 0);
  of_item_.assign(items, {});
  for (std::size_t o = 0; o < sends_.size(); ++o) of_item_[static_cast<std::size_t>(sends_[o].item)].push_back(o);
  exchange_ = comm.start_exchange();
  for (const Comm::Transfer& r : receives_) exchange_->post_receive(r);
}

void ReadExchange::ready(int item) {
  if (!exchange_) return;
  ready_[static_cast<std::size_t>(item)] = 1;
  for (std::size_t o : of_item_[static_cast<std::size_t>(item)]) post_ready(sends_[o].t.peer);
}

void ReadExchange::post_ready(int peer) {
  const std::vector<std::size_t>& outs = by_peer_[peer];
  std::size_t& next = next_[peer];
  while (next < outs.size() && ready_[static_cast<std::size_t>(sends_[outs[next]].item)])
    exchange_->post_send(sends_[outs[next++]].t);
}

void ReadExchange::progress() {
  if (exchange_ && ++calls_ % 8 == 0) exchange_->progress();
}

void ReadExchange::finish() {
  if (!exchange_) return;
  for (auto& [peer, outs] : by_peer_)
    for (std::size_t& next = next_[peer]; next < outs.size(); ++next) exchange_->post_send(sends_[outs[next]].t);
  exchange_->wait();
  exchange_.reset();
}

}  // namespace distckpt::internal_collective
