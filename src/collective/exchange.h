// The exchange of bytes one rank reads for others, written once for every loop that
// reads and sends: load()'s shared replica reads (a box is sent as soon as it is read and
// checked, while the reads go on) and the local tier's restore rounds (pieces are sent
// once the ranks agreed on which copies failed their checks).
//
// Receives are posted first. A send is posted once the item it carries (a box, a copy)
// is ready and every earlier send to that peer is posted: messages between two ranks
// match in the order they are posted, and each side lists a pair's messages in the same
// order. After the reads, or a failure, every send not posted yet is posted as it is, so
// that no peer waits for a message that never comes (the caller's agreement then fails
// the operation everywhere).
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <vector>

#include "distckpt/comm.h"

namespace distckpt::internal_collective {

class ReadExchange {
 public:
  // Before start(), in the order the peers list them: a send of item `item` (0 ..
  // items - 1), a receive.
  void add_send(int item, const Comm::Transfer& t);
  void add_receive(const Comm::Transfer& t);

  // Starts the exchange on `comm` (Comm::start_exchange) for `items` items and posts
  // every receive. Local; the messages pair with those the other ranks post.
  void start(Comm& comm, std::size_t items);
  // Item `item` is read and checked: its sends go, in each peer's order. A no-op before
  // start().
  void ready(int item);
  // Lets posted messages move, every 8th call (each call looks at every outstanding
  // request). A no-op before start().
  void progress();
  // Posts every send not posted yet and waits for every message. Where the Comm's
  // exchange is collective (the in-process Comm), every rank calls it. A no-op before
  // start().
  void finish();

 private:
  void post_ready(int peer);
  struct Out {
    Comm::Transfer t;
    int item;
  };
  std::vector<Out> sends_;
  std::vector<Comm::Transfer> receives_;
  std::map<int, std::vector<std::size_t>> by_peer_;  // indexes into sends_, in order
  std::map<int, std::size_t> next_;                  // per peer: the first not posted
  std::vector<std::vector<std::size_t>> of_item_;
  std::vector<char> ready_;
  std::unique_ptr<Comm::Exchange> exchange_;
  unsigned calls_ = 0;
};

}  // namespace distckpt::internal_collective
