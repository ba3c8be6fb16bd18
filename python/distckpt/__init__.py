"""distckpt: distributed checkpoints of tensors split across MPI ranks.

The Python face of the C++ library (libdistckpt), the same files and the same rules::

    import numpy as np, distckpt
    comm = distckpt.Comm.world()                       # or Comm.from_mpi4py(MPI.COMM_WORLD);
                                                       # under torchrun: Comm.from_torch()
    w = np.ones((4, 8), np.float32)                    # this rank's rows of a [4*size, 8] tensor
    layout = distckpt.TensorLayout.from_device_matrix([4 * comm.size, 8], [comm.size], [0, -1])
    state = distckpt.StateDict(comm, {"w": w}, layouts={"w": layout}, info={"step": 3})
    distckpt.save(comm, state, "/ckpt", "step-3", step=3)
    distckpt.load(comm, state, "/ckpt")                # the newest checkpoint, into w

    r = distckpt.open("/ckpt/step-3")                  # no MPI needed
    r.tensor("w")                                      # the whole tensor, as numpy

Tensors are never copied into the state dict: numpy arrays are taken through the buffer
protocol, torch tensors by data_ptr(), dtype and strides; the StateDict keeps a reference
to each. Collectives and I/O release the GIL. `import distckpt` does not initialise MPI;
Comm.world() does (MPI_THREAD_MULTIPLE) when no one did, and Comm.from_torch() never does (it
runs over torch.distributed's gloo groups, for jobs torchrun or torch.multiprocessing start).
Every Comm is closed before MPI_Finalize, also for a script that exits with one still open.
"""
from . import _distckpt
from ._distckpt import (  # noqa: F401  (re-exported)
    AuthError,
    CorruptionError,
    DistckptError,
    MismatchError,
    NotFoundError,
)
from ._args import _agreed  # noqa: F401  (distckpt.torch agrees on its checks)
from ._comm import Comm, _comm_arg  # noqa: F401
from ._layout import TensorLayout
from ._manager import AsyncCheckpointer, CheckpointManager, _canonical_config, publish  # noqa: F401
from ._reader import Reader, map_name, open  # noqa: A004, F401  (open: the package's reader)
from ._results import (
    CheckpointEntry,
    CheckpointInfo,
    LoadResult,
    ResumeResult,
    SaveResult,
    StepOutcome,
    VerifyReport,
)
from ._state import StateDict, convert, list_checkpoints, load, remove_checkpoint, save, verify  # noqa: F401

from ._version import __version__  # noqa: E402  (CMake writes it: the project's version)

__all__ = [
    "Comm", "TensorLayout", "StateDict", "CheckpointManager", "AsyncCheckpointer", "save", "load", "publish",
    "list_checkpoints", "remove_checkpoint", "verify", "convert", "open", "Reader",
    "SaveResult", "LoadResult", "ResumeResult", "StepOutcome", "VerifyReport", "CheckpointEntry", "CheckpointInfo",
    "DistckptError", "CorruptionError", "AuthError", "MismatchError", "NotFoundError", "__version__",
]
