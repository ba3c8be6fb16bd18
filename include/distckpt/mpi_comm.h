/// A Comm over an MPI communicator. With mpi_async.h (an asynchronous checkpointer over
/// one), the only public headers that include <mpi.h>.
#pragma once

#include <mpi.h>

#include <memory>

#include "distckpt/comm.h"

namespace distckpt {

struct MpiCommOptions {
  /// The peer timeout: the longest a rank waits in one of distckpt's collectives on this
  /// communicator (a barrier, a reduction, the exchange of shared replica reads...),
  /// counted from the moment the rank enters it, that is once its own work for the
  /// step (writing its slices, reading its boxes) is done. A peer on a dead or cut-off
  /// host never joins, and MPI would wait forever: past the limit the rank prints
  /// "distckpt: rank R on HOST waited T s for its peers in OP ..." on stderr and ends
  /// the job (MPI_Abort, or exit status 75 when MPI is not MPI_THREAD_MULTIPLE or the
  /// launcher cannot be reached). Nothing committed is affected: a save cut short this
  /// way leaves only its temporary entry, which garbage collection removes.
  /// < 0: DISTCKPT_PEER_TIMEOUT_S from the environment when set, else 600 s. 0: no limit.
  /// Set it above the longest imbalance a save or load can have between ranks (one
  /// rank's write time when the others have nothing to write, rank 0's commit and its
  /// fsyncs, and the 10 s rank 0 waits to break a root lock a dead host held). Time the
  /// process did not run (SIGSTOP, `scontrol suspend`, a paused VM) is not counted.
  double peer_timeout_s = -1;
};

/// Collective over `comm` (calls MPI_Comm_dup). The returned Comm owns the duplicate,
/// so distckpt's collectives never match messages of the caller's own traffic on
/// `comm`; it frees it on destruction (which must happen before MPI_Finalize).
/// MPI must be initialised. Call from the thread that makes MPI calls. With a peer
/// timeout the Comm runs one watchdog thread (started at its first collective). An MPI
/// error (MPI_Comm_dup's too) is fatal to the job, as MPI's default error handler makes it.
std::unique_ptr<Comm> make_mpi_comm(MPI_Comm comm, const MpiCommOptions& options = {});

}  // namespace distckpt
