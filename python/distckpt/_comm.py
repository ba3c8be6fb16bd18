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


def _torch_world_size():
    """The world size of an initialised torch.distributed default group, else 1 (torch is not
    imported for this: a process that never imported it has no such group)."""
    import sys
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            return dist.get_world_size()
    except Exception:  # pragma: no cover - a torch in an odd state: no opinion
        pass
    return 1


def _refuse_a_world_of_one():
    import os
    try:
        launched = int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        launched = 1
    # torch.multiprocessing.spawn sets no WORLD_SIZE: its processes show in their group.
    launched = max(launched, _torch_world_size())
    mpi = any(v in os.environ for v in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"))
    if launched > 1 and not mpi:
        raise _distckpt.DistckptError(
            f"Comm.world: this process was started by a torch.distributed launcher (a world of "
            f"{launched} processes) without MPI, so MPI would make it a world of one rank, racing "
            f"the others on the same checkpoints. Either launch the job with mpirun or srun and use "
            f"Comm.world(), or keep the torch launcher (torchrun, torch.multiprocessing) and use "
            f"Comm.from_torch() after torch.distributed.init_process_group().")


class Comm(_Closing):
    """A communicator for distckpt's collectives: a duplicate of an MPI communicator
    (Comm.world, Comm.from_mpi4py) or a gloo group of torch.distributed (Comm.from_torch).
    Every call that takes a Comm takes either kind."""

    def __init__(self, native):
        self._native = native
        _live_comms.add(self)

    @classmethod
    def world(cls):
        """MPI_COMM_WORLD; initialises MPI (MPI_THREAD_MULTIPLE) if no one did. Collective.

        Refuses (DistckptError) a process that a torch.distributed launcher started
        (torchrun: WORLD_SIZE > 1; torch.multiprocessing: an initialised torch.distributed
        group of more than one process) without an MPI launcher (no
        OMPI_COMM_WORLD_SIZE, PMI_SIZE or PMIX_RANK): MPI would make each such process a world
        of its own, and the processes would race on the same checkpoint names. Such jobs use
        Comm.from_torch()."""
        _refuse_a_world_of_one()
        return cls(_distckpt.Comm._world())

    @classmethod
    def from_mpi4py(cls, comm):
        """A duplicate of an mpi4py communicator (MPI must be initialised). Collective."""
        from mpi4py import MPI
        return cls(_distckpt.Comm._from_handle(MPI._handleof(comm)))

    @classmethod
    def from_torch(cls, group=None):
        """A communicator over torch.distributed, for jobs that torchrun or
        torch.multiprocessing started without MPI (MPI is never initialised for it).

        Collective over the whole torch job: torch's new_group is, so every process of the
        default group calls from_torch at the same point, in the same order as its other
        new_group calls, from the thread that calls torch.distributed. `group`: None (the
        default group) or a torch.distributed process group holding this process; processes
        may pass different groups when these split the job into disjoint groups (a
        DistckptError on every process otherwise). TypeError for anything else; DistckptError
        when torch.distributed is not initialised.

        Groups it makes, all with torch.distributed.new_group(ranks, backend="gloo") over
        the group's ranks: one for this Comm, so that its collectives never meet the
        training's; two more for each AsyncCheckpointer, and for each CheckpointManager with
        async_save (the training loop's side and the background thread's), made when those
        are created, which makes their creation collective over the whole job too.

        The transport is gloo whatever the given group's backend: an NCCL group gets a gloo
        group over the same ranks beside it. Only distckpt's own messages (metadata, and the
        host buffers it exchanges) go over it; a save or load reads and writes host memory as
        with MPI (distckpt.torch stages CUDA tensors through host buffers).

        Nodes: host names (socket.gethostname) are gathered once; ranks with the same name
        share a node, numbered by first appearance (the node-local tier and its redundancy
        go by them).

        Failures: a torch or gloo error inside a collective is a transport failure and
        fatal, as under MPI: the process prints the error with its rank on stderr and
        aborts (std::abort)."""
        from . import _torch_comm
        return cls(_distckpt.Comm._from_torch(_torch_comm.backend(group)))

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
        raise _type_error(where, "comm", "a distckpt.Comm (Comm.world(), Comm.from_mpi4py(...) or Comm.from_torch())",
                          comm)
    return comm._native
