"""Communicators, and the closing of every native object before MPI_Finalize."""
import atexit as _atexit
import weakref as _weakref

from . import _distckpt
from ._args import _type_error

_live_comms = _weakref.WeakSet()


class _Closing:
    """close() frees the native object (idempotent); `with` closes it at the end."""

    def close(self):
        if not self._native.closed:
            self._native.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _refuse_a_world_of_one():
    import os
    try:
        launched = int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        launched = 1
    mpi = any(v in os.environ for v in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"))
    if launched > 1 and not mpi:
        raise _distckpt.DistckptError(
            f"Comm.world: this process was started by a torch.distributed launcher (WORLD_SIZE="
            f"{os.environ['WORLD_SIZE']}) without MPI, so MPI would make it a world of one rank, racing "
            f"the others on the same checkpoints. Launch the job with mpirun or srun (MPI); "
            f"communicators over torch.distributed are not supported yet.")


class Comm(_Closing):
    """A communicator for distckpt's collectives (a duplicate of an MPI communicator)."""

    def __init__(self, native):
        self._native = native
        _live_comms.add(self)

    @classmethod
    def world(cls):
        """MPI_COMM_WORLD; initialises MPI (MPI_THREAD_MULTIPLE) if no one did. Collective.

        Refuses (DistckptError) a process that a torch.distributed launcher started
        (torchrun, torch.multiprocessing: WORLD_SIZE > 1) without an MPI launcher (no
        OMPI_COMM_WORLD_SIZE, PMI_SIZE or PMIX_RANK): MPI would make each such process a world
        of its own, and the processes would race on the same checkpoint names."""
        _refuse_a_world_of_one()
        return cls(_distckpt.Comm._world())

    @classmethod
    def from_mpi4py(cls, comm):
        """A duplicate of an mpi4py communicator (MPI must be initialised). Collective."""
        from mpi4py import MPI
        return cls(_distckpt.Comm._from_handle(MPI._handleof(comm)))

    @property
    def rank(self):
        return self._native.rank

    @property
    def size(self):
        return self._native.size

    def barrier(self):
        self._native.barrier()


@_atexit.register
def _close_all():
    # Python's exit handlers run before mpi4py's MPI_Finalize (a C-level one): every
    # communicator is freed while MPI is still up, then MPI is finalized if we started it.
    # Managers and checkpointers first (they use the communicators), then communicators.
    for comm in sorted(_live_comms, key=lambda c: isinstance(c, Comm)):
        try:
            comm.close()
        except Exception:  # pragma: no cover - best effort at exit
            pass
    _distckpt._finalize_if_ours()

def _comm_arg(where, comm):
    if not isinstance(comm, Comm):
        raise _type_error(where, "comm", "a distckpt.Comm (Comm.world() or Comm.from_mpi4py(...))", comm)
    return comm._native
