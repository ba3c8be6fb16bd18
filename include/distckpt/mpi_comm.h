// A Comm over an MPI communicator.
#pragma once

#include <mpi.h>

#include <memory>

#include "distckpt/comm.h"

namespace distckpt {

// Collective over `comm` (calls MPI_Comm_dup). The returned Comm owns the duplicate,
// so distckpt's collectives never match messages of the caller's own traffic on
// `comm`; it frees it on destruction (which must happen before MPI_Finalize).
// MPI must be initialised. Call from the thread that makes MPI calls.
std::unique_ptr<Comm> make_mpi_comm(MPI_Comm comm);

}  // namespace distckpt
