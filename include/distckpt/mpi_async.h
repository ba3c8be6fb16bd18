/// An asynchronous checkpointer over an MPI communicator: make_async_checkpointer, and
/// AsyncCheckpointer::create(MPI_Comm, ...) wherever this header (or distckpt.h) is
/// included. A header of its own because the checkpointer (async.h) sits a floor above
/// the communicator (mpi_comm.h).
#pragma once

#include <mpi.h>

#include <memory>

#include "distckpt/async.h"
#include "distckpt/mpi_comm.h"

namespace distckpt {

/// Collective over `comm` (duplicated twice: the loop's side and the background
/// thread's). Fails on every rank with kUnsupported when MPI provides less than
/// MPI_THREAD_MULTIPLE, kIoError when the staging memory cannot be allocated. Call from
/// the thread that makes MPI calls; the checkpointer's own thread uses its duplicate.
Result<std::unique_ptr<AsyncCheckpointer>> make_async_checkpointer(MPI_Comm comm, const AsyncOptions& options = {});

template <>
inline Result<std::unique_ptr<AsyncCheckpointer>> AsyncCheckpointer::create<MPI_Comm>(MPI_Comm comm,
                                                                                      const AsyncOptions& options) {
  return make_async_checkpointer(comm, options);
}

}  // namespace distckpt
