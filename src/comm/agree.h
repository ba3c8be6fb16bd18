// Agreement on the outcome of a collective step, and on values every rank must share.
#pragma once

#include <cstdint>
#include <vector>

#include "distckpt/comm.h"
#include "distckpt/status.h"

namespace distckpt::internal_comm {

// Collective. Every rank passes its local outcome; every rank gets back the same
// Status: ok if all were ok, else the error of the lowest failing rank. A rank that
// failed must still call this, so nobody waits forever in a later collective.
Status agree(Comm& comm, const Status& local);

// Collective, one allreduce: did every rank succeed (`local`), and does every rank hold
// the same `words` (the same length on every rank)? Every rank gets the same answer.
// The words are compared whole (min(x) and max(x) = ~min(~x) of each), so any 64-bit
// values work: fingerprints, hashes, options.
struct Compared {
  bool failed = false;  // some rank's `local` was an error
  bool same = false;    // `words` are equal on every rank
};
Compared agree_same(Comm& comm, const Status& local, const std::vector<int64_t>& words);

}  // namespace distckpt::internal_comm
