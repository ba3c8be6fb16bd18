// Waits of the benchmarks that leave the CPU to others.
//
// Open MPI's blocking collectives busy-poll: a rank waiting in MPI_Barrier takes a whole
// core. On a machine with fewer cores than ranks that core is taken from whatever the
// benchmark is timing: fio run by rank 0 for the storage's limit, a memcpy reference,
// the slowest rank of a save. Every wait of the harness (not of the library, whose own
// collectives are what a user gets) goes through these instead: the nonblocking
// collective, tested with sleeps that double from 50 us to 2 ms, so that a short wait
// ends within tens of microseconds and a long one costs a wake-up every 2 ms.
//
// Each function is collective over `comm`, called from the thread that owns it; MPI
// errors abort (MPI_ERRORS_ARE_FATAL, the default).
#pragma once

#include <mpi.h>
#include <time.h>

#include <cstdint>

namespace distckpt::bench {

// Waits for `request` with sleeps between tests.
inline void quiet_wait(MPI_Request* request) {
  long pause_ns = 50'000;
  for (int done = 0;;) {
    MPI_Test(request, &done, MPI_STATUS_IGNORE);
    if (done) return;
    const timespec pause{0, pause_ns};
    nanosleep(&pause, nullptr);
    if (pause_ns < 2'000'000) pause_ns *= 2;
  }
}

inline void quiet_barrier(MPI_Comm comm = MPI_COMM_WORLD) {
  MPI_Request request;
  MPI_Ibarrier(comm, &request);
  quiet_wait(&request);
}

// The start of a timed phase: a quiet barrier, then a blocking one. The quiet barrier lets
// ranks leave up to one sleep (2 ms) apart; the blocking barrier, short since every rank is
// already there, lets them leave together, so that no rank's timer runs while it waits for
// a late one inside the phase (a local save of 256 MiB takes 0.03 s).
inline void timed_phase_barrier(MPI_Comm comm = MPI_COMM_WORLD) {
  quiet_barrier(comm);
  MPI_Barrier(comm);
}

// MPI_Bcast of `count` items of `type` from `root`.
inline void quiet_bcast(void* data, int count, MPI_Datatype type, int root, MPI_Comm comm = MPI_COMM_WORLD) {
  MPI_Request request;
  MPI_Ibcast(data, count, type, root, comm, &request);
  quiet_wait(&request);
}

// MPI_Allreduce in place.
inline void quiet_allreduce(void* data, int count, MPI_Datatype type, MPI_Op op, MPI_Comm comm = MPI_COMM_WORLD) {
  MPI_Request request;
  MPI_Iallreduce(MPI_IN_PLACE, data, count, type, op, comm, &request);
  quiet_wait(&request);
}

// The maximum over ranks of this rank's elapsed seconds.
inline double quiet_max(double seconds, MPI_Comm comm = MPI_COMM_WORLD) {
  quiet_allreduce(&seconds, 1, MPI_DOUBLE, MPI_MAX, comm);
  return seconds;
}

}  // namespace distckpt::bench
