// The one way from a Comm to the MPI communicator under it, for libraries that need MPI
// themselves (parallel HDF5) and for duplicating it (asynchronous saves). Only code
// that must call MPI includes this (ADIOS2's CommAsMPI).
#pragma once

#include <mpi.h>

#include <optional>

#include "distckpt/comm.h"

namespace distckpt::internal_comm {

// The MPI communicator of a Comm made by make_mpi_comm (spanning the same ranks in the
// same order; owned by the Comm), or nullopt for any other Comm (in-process tests).
std::optional<MPI_Comm> as_mpi(const Comm& comm);

}  // namespace distckpt::internal_comm
