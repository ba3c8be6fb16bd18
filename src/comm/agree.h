// Agreement on the outcome of a collective step, and on values every rank must share.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "distckpt/comm.h"
#include "distckpt/status.h"

namespace distckpt::internal_comm {

// Collective. Every rank passes its local outcome; every rank gets back the same
// Status: ok if all were ok, else the error of the lowest failing rank. A rank that
// failed must still call this, so nobody waits forever in a later collective.
Status agree(Comm& comm, const Status& local);

// One message for a collective that carries an agreement with its data: a status code
// byte, then the error's message, or the payload when ok (what agree() broadcasts, and
// what a rank that alone decides, such as rank 0 with its plan, sends with its data).
std::string pack_outcome(const Status& outcome, const std::string& payload);
// The Status packed in `message` (an empty message: ok, no payload); *payload gets the
// payload when ok. Local.
Status unpack_outcome(const std::string& message, std::string* payload = nullptr);

// Collective, one allreduce: did every rank succeed (`local`), and does every rank hold
// the same `words` (the same length on every rank)? Every rank gets the same answer.
// The words are compared whole (min(x) and max(x) = ~min(~x) of each), so any 64-bit
// values work: fingerprints, hashes, options.
struct Compared {
  bool failed = false;  // some rank's `local` was an error
  bool same = false;    // `words` are equal on every rank
};
Compared agree_same(Comm& comm, const Status& local, const std::vector<int64_t>& words);

// Collective, one allreduce: agree_same for several questions at once. `same[i]` says
// whether words[i] is equal on every rank (the caller groups them); `maxima` (the same
// length on every rank) come back as their maximum over the ranks. Each extra round
// costs a save a scheduling delay per rank on a loaded node and a network round trip
// between nodes, so the opening of a save asks everything in this one.
struct ComparedWords {
  bool failed = false;
  std::vector<bool> same;
  std::vector<int64_t> maxima;
  // Whether words[begin, end) are all the same on every rank.
  bool all_same(std::size_t begin, std::size_t end) const;
};
ComparedWords agree_words(Comm& comm, const Status& local, const std::vector<int64_t>& words,
                          const std::vector<int64_t>& maxima = {});

}  // namespace distckpt::internal_comm
