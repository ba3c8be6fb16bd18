// The MPI entry points: a Comm over an MPI communicator, and an asynchronous
// checkpointer over one. The only public header that includes <mpi.h>.
#pragma once

#include <mpi.h>

#include <memory>

#include "distckpt/async.h"
#include "distckpt/comm.h"

namespace distckpt {

// Collective over `comm` (calls MPI_Comm_dup). The returned Comm owns the duplicate,
// so distckpt's collectives never match messages of the caller's own traffic on
// `comm`; it frees it on destruction (which must happen before MPI_Finalize).
// MPI must be initialised. Call from the thread that makes MPI calls.
std::unique_ptr<Comm> make_mpi_comm(MPI_Comm comm);

// Collective over `comm` (duplicated twice: the loop's side and the background
// thread's). Fails on every rank with kUnsupported when MPI provides less than
// MPI_THREAD_MULTIPLE, kIoError when the staging memory cannot be allocated.
Result<std::unique_ptr<AsyncCheckpointer>> make_async_checkpointer(MPI_Comm comm, const AsyncOptions& options = {});

template <>
inline Result<std::unique_ptr<AsyncCheckpointer>> AsyncCheckpointer::create<MPI_Comm>(MPI_Comm comm,
                                                                                      const AsyncOptions& options) {
  return make_async_checkpointer(comm, options);
}

}  // namespace distckpt
