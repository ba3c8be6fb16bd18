// Agreement on the outcome of a collective step.
#pragma once

#include "distckpt/comm.h"
#include "distckpt/status.h"

namespace distckpt::internal_comm {

// Collective. Every rank passes its local outcome; every rank gets back the same
// Status: ok if all were ok, else the error of the lowest failing rank. A rank that
// failed must still call this, so nobody waits forever in a later collective.
Status agree(Comm& comm, const Status& local);

}  // namespace distckpt::internal_comm
