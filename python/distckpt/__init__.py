"""distckpt: distributed checkpoints of tensors split across MPI ranks.

The Python face of the C++ library (libdistckpt), the same files and the same rules:

    import numpy as np, distckpt
    comm = distckpt.Comm.world()                       # or Comm.from_mpi4py(MPI.COMM_WORLD)
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
Comm.world() does (MPI_THREAD_MULTIPLE) when no one did. Every Comm is closed before
MPI_Finalize, also for a script that exits with one still open.
"""
import atexit as _atexit
import numbers as _numbers
import operator as _operator
import os as _os
import weakref as _weakref

import numpy as _np

from . import _distckpt
from ._distckpt import (  # noqa: F401  (re-exported)
    AuthError,
    CorruptionError,
    DistckptError,
    MismatchError,
    NotFoundError,
)

__all__ = [
    "Comm", "TensorLayout", "StateDict", "CheckpointManager", "AsyncCheckpointer", "save", "load", "publish", "list_checkpoints", "remove_checkpoint", "verify", "convert", "open",
    "Reader", "DistckptError", "CorruptionError", "AuthError", "MismatchError", "NotFoundError",
]

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


class Comm(_Closing):
    """A communicator for distckpt's collectives (a duplicate of an MPI communicator)."""

    def __init__(self, native):
        self._native = native
        _live_comms.add(self)

    @classmethod
    def world(cls):
        """MPI_COMM_WORLD; initialises MPI (MPI_THREAD_MULTIPLE) if no one did. Collective."""
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


# ---- Arguments ----
# Each public call checks its arguments' types here and names the argument; pybind11's
# own message lists the native function's positional types (arg0 ... arg11) instead.


def _type_error(where, what, expected, value):
    return TypeError(f"{where}: {what} must be {expected}, not {type(value).__name__}")


def _comm_arg(where, comm):
    if not isinstance(comm, Comm):
        raise _type_error(where, "comm", "a distckpt.Comm (Comm.world() or Comm.from_mpi4py(...))", comm)
    return comm._native


def _state_arg(where, state):
    if not isinstance(state, StateDict):
        raise _type_error(where, "state", "a distckpt.StateDict", state)
    return state._native


def _utf8(where, what, text):
    # The native side takes UTF-8: a lone surrogate (os.fsdecode of bytes that are not
    # UTF-8) would fail there, outside the agreement.
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"{where}: {what} is not valid UTF-8: {text!r}") from None
    return text


def _path_arg(where, what, value, none_is_empty=False):
    """str or os.PathLike (pathlib.Path); bytes paths are decoded as the file system does."""
    if value is None and none_is_empty:
        return ""
    try:
        path = _os.fspath(value)
    except TypeError:
        raise _type_error(where, what, "a path (str or os.PathLike)", value) from None
    return _utf8(where, what, _os.fsdecode(path) if isinstance(path, bytes) else path)


def _str_arg(where, what, value):
    if not isinstance(value, str):
        raise _type_error(where, what, "a str", value)
    return _utf8(where, what, value)


def _int_arg(where, what, value):
    # Anything with __index__ (numpy integers, 0-d integer arrays and tensors); a bool is an
    # int to Python, but never meant as a step.
    if isinstance(value, (bool, _np.bool_)):
        raise _type_error(where, what, "an int", value)
    try:
        number = _operator.index(value)
    except TypeError:
        raise _type_error(where, what, "an int", value) from None
    if not -2 ** 63 <= number < 2 ** 63:
        raise ValueError(f"{where}: {what} {number} is outside int64")
    return number


def _bool_arg(where, what, value):
    # As pybind11 took them before: anything with a truth value that is not text (None is
    # False, as an argparse default gives it).
    if isinstance(value, (str, bytes)):
        raise _type_error(where, what, "a bool", value)
    return bool(value)


def _names_arg(where, what, value):
    """None or an iterable of str (a single str is one name, not its letters)."""
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    try:
        names = list(value)
    except TypeError:
        raise _type_error(where, what, "a list of str", value) from None
    for n in names:
        if not isinstance(n, str):
            raise TypeError(f"{where}: {what} must be a list of str, and holds {type(n).__name__}")
        _utf8(where, what, n)
    return names


def _metrics_arg(where, metrics):
    """None or a mapping of str to numbers (numpy and torch scalars too), as floats."""
    if metrics is None:
        return {}
    if not hasattr(metrics, "items"):
        raise _type_error(where, "metrics", "a dict of str to numbers", metrics)
    out = {}
    for k, v in metrics.items():
        if not isinstance(k, str):
            raise TypeError(f"{where}: metrics keys must be str, not {type(k).__name__}")
        _utf8(where, "a metric's name", k)
        if isinstance(v, (str, bytes)) or not hasattr(v, "__float__"):
            raise TypeError(f"{where}: metric '{k}' must be a number, not {type(v).__name__}")
        out[k] = float(v)
    return out


def _ints_arg(where, what, value):
    try:
        items = list(value)
    except TypeError:
        raise _type_error(where, what, "a list of int", value) from None
    return [_int_arg(where, f"{what}[{i}]", v) for i, v in enumerate(items)]


def _agreed(comm_native, check):
    """Runs check(), the type checks of a collective call's arguments, and returns what it
    returned. A failed check (TypeError, ValueError...) is agreed over the communicator before it is raised, as the
    native call agrees on its own checks: the other ranks are in that agreement (the
    first step of save, load, save_async, resume and a manager's creation) and raise
    DistckptError naming this rank, instead of waiting for it in the call."""
    try:
        return check()
    except Exception as error:  # any failed check (OverflowError too) is agreed
        _distckpt._agree_argument_error(comm_native, f"{type(error).__name__}: {error}")
        raise


class TensorLayout:
    """How a global tensor is split over ranks (MindSpore's device matrix, or boxes)."""

    def __init__(self, native):
        self._native = native

    @classmethod
    def from_device_matrix(cls, shape, dev_mat, tensor_map, ranks=None):
        where = "TensorLayout.from_device_matrix"
        return cls(_distckpt.TensorLayout._from_device_matrix(
            _ints_arg(where, "shape", shape), _ints_arg(where, "dev_mat", dev_mat),
            _ints_arg(where, "tensor_map", tensor_map), _ints_arg(where, "ranks", [] if ranks is None else ranks)))

    @classmethod
    def from_boxes(cls, shape, boxes):
        """boxes[r]: the (offset, shape) pairs rank r holds."""
        where = "TensorLayout.from_boxes"
        try:
            per_rank = [[(_ints_arg(where, "a box's offset", o), _ints_arg(where, "a box's shape", s))
                         for o, s in rank] for rank in boxes]
        except (TypeError, ValueError) as error:
            if isinstance(error, TypeError) and str(error).startswith(where):
                raise
            raise TypeError(f"{where}: boxes must be, for each rank, a list of (offset, shape) pairs") from None
        return cls(_distckpt.TensorLayout._from_boxes(_ints_arg(where, "shape", shape), per_rank))

    @classmethod
    def replicated(cls, shape, size):
        """The whole tensor on each of `size` ranks (data-parallel replicas)."""
        return cls.from_device_matrix(shape, [size], [-1] * len(shape))

    @property
    def global_shape(self):
        return list(self._native.global_shape)

    def boxes_of(self, rank):
        return self._native.boxes_of(rank)


_NUMPY_DTYPES = {
    "float32": "float32", "float16": "float16", "float64": "float64",
    "int8": "int8", "int16": "int16", "int32": "int32", "int64": "int64",
    "uint8": "uint8", "uint16": "uint16", "uint32": "uint32", "uint64": "uint64", "bool": "bool",
}


def _torch_view(name, t):
    """(address, nbytes, dtype name, readonly, owner, shape) of a torch tensor, or TypeError.
    The owner is the tensor and its storage: a tensor given new storage later (p.data = ...,
    share_memory_(), set_()) leaves the old one alive until the StateDict follows it."""
    import torch  # a torch tensor was given: torch is there
    if t.layout != torch.strided:
        raise TypeError(f"tensor '{name}' is {t.layout}: only dense (strided) tensors are checkpointed")
    if t.device.type != "cpu":
        raise TypeError(f"tensor '{name}' is on {t.device}: only CPU tensors are checkpointed (call .cpu())")
    # Row-major and dense, from its strides: the bytes at data_ptr() are the tensor.
    expected, step = [], 1
    for extent in reversed(list(t.shape)):
        expected.insert(0, step)
        step *= extent
    if any(n > 1 and s != e for n, s, e in zip(t.shape, t.stride(), expected)):
        raise TypeError(f"tensor '{name}' is not contiguous (strides {tuple(t.stride())}; call .contiguous())")
    dtype = str(t.dtype).replace("torch.", "")
    if dtype not in _NUMPY_DTYPES and dtype != "bfloat16":
        raise TypeError(f"tensor '{name}': dtype {t.dtype} is not supported")
    storage = t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()
    return t.data_ptr(), t.element_size() * t.numel(), dtype, False, (t, storage), list(t.shape)


def _numpy_view(name, a, dtype):
    """The same for anything with the buffer protocol (numpy arrays)."""
    if not isinstance(a, _np.ndarray):  # its memory is what the StateDict refers to
        raise TypeError(f"tensor '{name}': a numpy array or a torch tensor, not {type(a).__name__}")
    view = memoryview(a)  # the buffer protocol
    if not view.c_contiguous:
        raise TypeError(f"tensor '{name}' is not C-contiguous (use numpy.ascontiguousarray)")
    arr = _np.asarray(a)
    if not arr.dtype.isnative:  # the name ("float32") would hide the byte order
        raise TypeError(f"tensor '{name}': dtype {arr.dtype.str} is not in this machine's byte order "
                        f"(use a.astype(a.dtype.newbyteorder('=')))")
    kind = arr.dtype.name
    if kind not in _NUMPY_DTYPES:
        raise TypeError(f"tensor '{name}': dtype {arr.dtype} is not supported")
    if dtype is not None and dtype != kind:
        # Only the bits of a 2-byte integer array may be declared bfloat16 (numpy has none).
        if dtype != "bfloat16":
            raise TypeError(f"tensor '{name}': dtypes may only declare a uint16 or int16 array 'bfloat16', "
                            f"not {arr.dtype} '{dtype}'")
        if kind not in ("uint16", "int16"):
            raise TypeError(f"tensor '{name}': bfloat16 is declared for the bits in a uint16 or int16 array, "
                            f"not {arr.dtype}")
    address = arr.__array_interface__["data"][0] if arr.size else 0
    return address, arr.nbytes, dtype or kind, view.readonly, a, list(arr.shape)


def _plain(value):
    """A numpy scalar (np.int64(3), np.bool_(True), np.float32(0.5)) as the Python value."""
    return value.item() if isinstance(value, _np.generic) else value


class StateDict:
    """Named tensors of this rank, each with its layout, plus info values.

    tensors: name -> numpy array or torch tensor (this rank's slice, C-contiguous, CPU).
    layouts: name -> TensorLayout; a tensor without one is replicated on every rank.
    dtypes: name -> "bfloat16", to store a numpy uint16 (or int16) array's bits as bfloat16.
    Each array's shape is its box of the layout. A torch tensor given new storage of the
    same shape and dtype (p.data = ..., share_memory_()) is followed at the next save or
    load; one whose shape or dtype changed is refused then.
    info: name -> int, float, bool or str (saved with the checkpoint, rank 0's).
    Zero-copy: the StateDict refers to the tensors' memory and keeps them alive.
    """

    def __init__(self, comm, tensors, layouts=None, info=None, dtypes=None):
        if not (isinstance(getattr(comm, "rank", None), int) and isinstance(getattr(comm, "size", None), int)):
            raise _type_error("StateDict", "comm", "a distckpt.Comm (or a communicator with rank and size)", comm)
        for what, value in (("tensors", tensors), ("layouts", layouts), ("info", info), ("dtypes", dtypes)):
            if value is not None and not hasattr(value, "items"):
                raise _type_error("StateDict", what, "a dict", value)
        if tensors is None:
            raise _type_error("StateDict", "tensors", "a dict", tensors)
        self._native = _distckpt._StateDict(comm.rank)
        layouts = layouts or {}
        dtypes = dtypes or {}
        for name, layout in layouts.items():
            if not isinstance(layout, TensorLayout):
                raise TypeError(f"StateDict: layouts['{name}'] must be a distckpt.TensorLayout, "
                                f"not {type(layout).__name__}")
        for what, names in (("layouts", layouts), ("dtypes", dtypes)):
            unknown = set(names) - set(tensors)
            if unknown:
                raise TypeError(f"{what} name tensors that are not in the state: {sorted(unknown)}")
        for name, value in tensors.items():
            torch_tensor = hasattr(value, "data_ptr") and hasattr(value, "is_contiguous")
            if torch_tensor:
                if name in dtypes:
                    raise TypeError(f"tensor '{name}': dtypes applies to numpy arrays (a torch tensor has its own)")
                address, nbytes, dtype, readonly, owner, shape = _torch_view(name, value)
            else:
                address, nbytes, dtype, readonly, owner, shape = _numpy_view(name, value, dtypes.get(name))
            layout = layouts.get(name)
            if layout is None:
                layout = TensorLayout.replicated(shape, comm.size)
            self._native._add(name, dtype, address, nbytes, shape, layout._native, owner, readonly,
                              value if torch_tensor else None)
        for key, value in (info or {}).items():
            self._native._set_info(key, _plain(value))

    def set_info(self, key, value):
        """Adds or replaces the info value `key` (int, float, bool or str; numpy scalars as their
        value), saved with the checkpoint as rank 0's. Local. TypeError for another type."""
        key = _str_arg("StateDict.set_info", "key", key)
        value = _plain(value)
        if not isinstance(value, (bool, _numbers.Integral, float, str)):
            raise _type_error("StateDict.set_info", "value", "an int, float, bool or str", value)
        self._native._set_info(key, value)

    def keys(self):
        return self._native.keys()


def save(comm, state, root, name, step=-1, epoch=-1, format="native", fsync=True, update_latest=True, key=None,
         incremental=False, incremental_base=""):
    """Collective. Saves `state` under `root` as `name`; returns a dict (path, bytes_written, ...).

    incremental=True references the chunks unchanged since `incremental_base` (default: the
    checkpoint `latest` names) instead of writing them again (bytes_referenced says how many).
    """
    where = "save"
    native = _comm_arg(where, comm)
    args = _agreed(native, lambda: (
        _state_arg(where, state), _path_arg(where, "root", root), _str_arg(where, "name", name),
        _int_arg(where, "step", step), _int_arg(where, "epoch", epoch), _str_arg(where, "format", format),
        _bool_arg(where, "fsync", fsync), _bool_arg(where, "update_latest", update_latest), key,
        _bool_arg(where, "incremental", incremental), _str_arg(where, "incremental_base", incremental_base)))
    return _distckpt._save(native, *args)


def load(comm, state, path, strict=True, key=None, cast_floats=False):
    """Collective. Loads the checkpoint at `path` (a root: its newest) into `state`, onto any layout.
    cast_floats: a floating tensor stored in another floating dtype is converted (else refused)."""
    where = "load"
    native = _comm_arg(where, comm)
    args = _agreed(native, lambda: (
        _state_arg(where, state), _path_arg(where, "path", path), _bool_arg(where, "strict", strict), key,
        _bool_arg(where, "cast_floats", cast_floats)))
    return _distckpt._load(native, *args)


def remove_checkpoint(root, name):
    """Removes the committed checkpoint `name` of `root` as retention does: files that later
    (incremental) checkpoints reference stay, listed as retired, until nothing does. Never
    `shutil.rmtree` a checkpoint of a root with incremental saves."""
    _distckpt._remove_checkpoint(_path_arg("remove_checkpoint", "root", root), _str_arg("remove_checkpoint", "name", name))


def list_checkpoints(root):
    """The committed checkpoints under `root` (dicts: name, step, epoch, bytes, referenced_bytes, references,
    format, latest)."""
    return _distckpt._list_checkpoints(_path_arg("list_checkpoints", "root", root))


def verify(path, key=None, deep=False):
    """Reads every chunk of the checkpoint at `path` and checks it; raises on the first failure."""
    return _distckpt._verify(_path_arg("verify", "path", path), key, _bool_arg("verify", "deep", deep))


def convert(src, dst, format, key=None):
    """Writes the checkpoint `src` as `dst` in `format` (native, ckpt, safetensors, hdf5); returns the path."""
    return _distckpt._convert(_path_arg("convert", "src", src), _path_arg("convert", "dst", dst),
                              _str_arg("convert", "format", format), key)


# CheckpointManager's options: the canonical name, then the names MindSpore's
# CheckpointConfig/ModelCheckpoint and MMEngine's CheckpointHook give it (with how
# their value maps onto ours).
def _keep_all_is_zero(v):  # MMEngine's max_keep_ckpts=-1 keeps every checkpoint: our 0
    return 0 if v is not None and v < 0 else v


def _never_is_zero(v):  # MMEngine's interval=-1 never saves periodically: our 0
    return 0 if v is not None and v < 0 else v


def _none_is_zero(v):  # MindSpore: None or 0 leaves a policy unset (off), never our default
    return 0 if v is None else v


def _as_list(v):
    if v is None:  # MMEngine's default for save_best, rule and the key lists: not set
        return None
    return [v] if isinstance(v, str) else list(v)


def _path(v):  # os.PathLike (pathlib.Path) as well as str
    import os
    return os.fspath(v) if isinstance(v, os.PathLike) else v


_OPTIONS = {
    "directory": [], "out_dir": [], "prefix": [], "name_template": [], "filename_tmpl": [],
    "save_every_steps": ["save_checkpoint_steps", "interval"],
    "save_every_seconds": ["save_checkpoint_seconds"],
    "save_every_epochs": [],
    "by_epoch": [], "save_begin": [], "save_last": [],
    "keep_max": ["keep_checkpoint_max", "max_keep_ckpts"],
    "keep_per_n_minutes": ["keep_checkpoint_per_n_minutes"],
    "best_metric": [], "keep_best": [], "save_best": [], "rule": [], "greater_keys": [], "less_keys": [],
    "format": [], "integrated": ["integrated_save"], "remove_redundancy": [], "fsync": [],
    "async_save": [], "incremental": [], "exception_save": [], "job_id": [], "on_failure": [], "enc_key": [], "enc_mode": [],
    "append_info": [], "local_dir": [], "redundancy": [], "local_every_steps": [], "global_every": [],
    "keep_local": [], "keep_global": [], "upload": [], "upload_command": [], "upload_queue": [], "upload_wait_s": [],
}
_CONVERT = {"max_keep_ckpts": _keep_all_is_zero, "interval": _never_is_zero,
            "save_checkpoint_steps": _none_is_zero, "save_checkpoint_seconds": _none_is_zero,
            "keep_checkpoint_max": _none_is_zero, "keep_checkpoint_per_n_minutes": _none_is_zero,
            "save_best": _as_list, "rule": _as_list, "greater_keys": _as_list, "less_keys": _as_list,
            "upload_command": _as_list, "directory": _path, "out_dir": _path, "local_dir": _path}
_ALIAS_OF = {alias: name for name, aliases in _OPTIONS.items() for alias in [name] + aliases}


def _canonical_config(kwargs):
    unknown = sorted(k for k in kwargs if k not in _ALIAS_OF)
    if unknown:
        raise TypeError(f"CheckpointManager: unknown option(s): {', '.join(unknown)}")
    config, given_as = {}, {}
    for key, value in kwargs.items():
        name = _ALIAS_OF[key]
        if name in given_as:
            raise TypeError(f"CheckpointManager: '{given_as[name]}' and '{key}' both set the same option ({name})")
        given_as[name] = key
        value = _CONVERT.get(key, _CONVERT.get(name, lambda v: v))(value)
        if name == "append_info" and value is not None:
            value = {k: _plain(v) for k, v in dict(value).items()}
        if value is not None:
            config[name] = value
    return config


class CheckpointManager(_Closing):
    """The training loop's policies (when to save, what to keep, resume), as the C++
    CheckpointManager. Options take our names and, where they exist, MindSpore's
    (save_checkpoint_steps, keep_checkpoint_max, ...) and MMEngine's (interval,
    max_keep_ckpts, save_best, rule, ...). Collective calls, on every rank alike."""

    def __init__(self, comm, state, **config):
        where = "CheckpointManager"
        native = _comm_arg(where, comm)
        _agreed(native, lambda: _state_arg(where, state))
        canonical = _agreed(native, lambda: _canonical_config(config))
        self._exception_save = bool(canonical.get("exception_save", False))
        self._native = _distckpt._Manager(native, state._native, canonical)
        self._comm_native = native  # agrees on resume's arguments
        _live_comms.add(self)  # closed before MPI_Finalize too

    def _step_call(self, name, step, epoch, metrics, last_arg):
        # A step call has no agreement of its own (save_after_exception meets a rank that
        # threw in the loop): a wrong argument on one rank ends the manager on every rank,
        # as a tensor that cannot be followed does, and raises here.
        w = f"CheckpointManager.{name}"
        try:
            args = (_int_arg(w, "step", step), _int_arg(w, "epoch", epoch), _metrics_arg(w, metrics), last_arg(w))
        except Exception as error:  # any failed check (OverflowError too)
            self._native.abort_after_error(f"{type(error).__name__}: {error}")
            raise
        return getattr(self._native, name)(*args)

    def step_end(self, step, epoch=0, metrics=None, epoch_end=False):
        return self._step_call("step_end", step, epoch, metrics, lambda w: _bool_arg(w, "epoch_end", epoch_end))

    def end(self, step, epoch=0, metrics=None, epoch_end=False):
        return self._step_call("end", step, epoch, metrics, lambda w: _bool_arg(w, "epoch_end", epoch_end))

    def save_now(self, step, epoch=0, metrics=None, suffix=""):
        return self._step_call("save_now", step, epoch, metrics, lambda w: _str_arg(w, "suffix", suffix))

    def resume(self, target="", step=-1, epoch=-1, strict=True, fall_back_to_previous=False, verify=True, only=None):
        """Collective. Loads the newest committed checkpoint (or `target`, or the newest of
        `step` / ending `epoch`) into the state, verified first. A damaged one raises
        CorruptionError unless fall_back_to_previous, which takes the newest undamaged older
        one (the passed-over paths in the result's "skipped"). `only`: tensor names."""
        w = "CheckpointManager.resume"
        args = _agreed(self._comm_native, lambda: (
            _path_arg(w, "target", target, none_is_empty=True), _int_arg(w, "step", step), _int_arg(w, "epoch", epoch),
            _bool_arg(w, "strict", strict), _bool_arg(w, "fall_back_to_previous", fall_back_to_previous),
            _bool_arg(w, "verify", verify), _names_arg(w, "only", only)))
        return self._native.resume(*args)

    def best_checkpoint(self, metric=""):
        return self._native.best_checkpoint(_str_arg("CheckpointManager.best_checkpoint", "metric", metric))

    def publish(self, target=""):
        return self._native.publish(_path_arg("CheckpointManager.publish", "target", target, none_is_empty=True))

    @property
    def series_prefix(self):
        return self._native.series_prefix()

    @staticmethod
    def install_signal_handlers():
        """Local, once per process: SIGUSR1 and SIGTERM (what Slurm and mpirun send before
        killing a job) set a flag that the next step_end sees on any rank and turns into a
        breakpoint save on every rank; its result then has "stop": True. Replaces Python's
        handlers of those two signals."""
        _distckpt._install_signal_handlers()

    @staticmethod
    def signal_received():
        return _distckpt._signal_received()

    @staticmethod
    def clear_signal():
        _distckpt._clear_signal()

    def run(self, loop):
        """Runs loop(); with exception_save, an exception escaping it is saved as a
        checkpoint first (CheckpointManager::run's rules), then raised again, unchanged."""
        try:
            loop()
        except BaseException as error:
            if self._exception_save:
                try:
                    self._native.save_after_exception(f"{type(error).__name__}: {error}")
                except Exception as failed:  # the exception save's own failure: reported, never raised
                    import sys
                    print(f"distckpt: exception save failed: {failed}", file=sys.stderr)
            raise



class AsyncCheckpointer(_Closing):
    """Saves in the background: save_async() returns once this rank's share is staged
    (the tensors may change from then on); wait() reports the commit. Needs MPI with
    MPI_THREAD_MULTIPLE (mpi4py's default, and Comm.world()'s). Collective."""

    def __init__(self, comm, staging_bytes=1 << 30, refuse_when_busy=False):
        where = "AsyncCheckpointer"
        self._comm_native = _comm_arg(where, comm)  # agrees on save_async's arguments

        def checked():
            try:  # as before: 1e9, 2**30 / 2, a number read from the environment
                size = int(staging_bytes)
            except (TypeError, ValueError):
                raise _type_error(where, "staging_bytes", "a number of bytes", staging_bytes) from None
            return (_int_arg(where, "staging_bytes", size), _bool_arg(where, "refuse_when_busy", refuse_when_busy))
        self._native = _distckpt._Async(self._comm_native, *_agreed(self._comm_native, checked))
        _live_comms.add(self)

    def save_async(self, state, root, name, step=-1, epoch=-1, format="native", key=None):
        w = "AsyncCheckpointer.save_async"
        args = _agreed(self._comm_native, lambda: (
            _state_arg(w, state), _path_arg(w, "root", root), _str_arg(w, "name", name), _int_arg(w, "step", step),
            _int_arg(w, "epoch", epoch), _str_arg(w, "format", format), key))
        self._native.save_async(*args)

    def wait(self):
        """The save in flight's result (a dict), once committed; raises its failure."""
        return self._native.wait()

    @property
    def in_flight(self):
        return self._native.in_flight()

    def end(self):
        self._native.end()


def publish(src, format="safetensors", only=None, directory="", key=None):
    """Writes the checkpoint `src` as one shareable file (MMEngine's publish_model); returns its path."""
    return _distckpt._publish(_path_arg("publish", "src", src), _str_arg("publish", "format", format),
                              _names_arg("publish", "only", only),
                              _path_arg("publish", "directory", directory, none_is_empty=True), key)


def _numpy_dtype(name):
    # numpy has no bfloat16: such tensors come back as uint16 views of the bits.
    return _np.dtype("uint16") if name == "bfloat16" else _np.dtype(_NUMPY_DTYPES[name])


class Reader:
    """One checkpoint in any format (native, .ckpt, safetensors, .h5), read in this process."""

    def __init__(self, path, key=None):
        self._native = _distckpt._Reader(_path_arg("Reader", "path", path), key)
        self._tensors = self._native.tensors()
        self.bytes_read = 0

    def keys(self):
        return list(self._open().keys())

    @property
    def info(self):
        """The checkpoint's name, step, epoch and world_size, and under "info" every info value
        stored with it (epoch_num, step_num, the user's)."""
        return self._open().meta()

    def dtype(self, name):
        return self._tensors[name][0]

    def shape(self, name):
        return list(self._tensors[name][1])

    def read(self, name, box, check=False):
        """The region box = (offset, shape) of tensor `name`, as a numpy array (bfloat16:
        uint16). Only those bytes are read; with `check`, every chunk the region touches is
        read whole and its checksum checked. Chunks read whole are always checked.
        `bytes_read` counts what the reader read from storage."""
        if name not in self._tensors:
            raise KeyError(f"no tensor '{name}' in this checkpoint")
        offset, shape = (list(box[0]), list(box[1]))
        out = _np.empty(shape, dtype=_numpy_dtype(self._tensors[name][0]))
        self.bytes_read += self._open().read_into(name, offset, shape, out.reshape(-1).view(_np.uint8), bool(check))
        return out

    def tensor(self, name):
        """The whole tensor `name`, as a numpy array."""
        if name not in self._tensors:
            raise KeyError(f"no tensor '{name}' in this checkpoint")
        shape = self.shape(name)
        return self.read(name, ([0] * len(shape), shape))

    def to_torch(self, name):
        """The whole tensor `name` as a torch tensor (bfloat16 as torch.bfloat16)."""
        import torch
        a = self.tensor(name)
        if self.dtype(name) == "bfloat16":  # torch 1.13 takes no uint16 array: the bits as int16
            return torch.from_numpy(a.view(_np.int16)).view(torch.bfloat16)
        return torch.from_numpy(a)

    def load_into(self, state_dict, strict=True):
        """Copies the checkpoint's tensors into a torch state_dict (a module's, or an
        optimizer's flattened one) by name, in place; returns the names left unmatched as
        (missing_in_checkpoint, unexpected_in_checkpoint). With `strict`, a missing name
        or a shape that differs raises MismatchError."""
        stored = set(self.keys())
        missing = [k for k in state_dict if k not in stored]
        unexpected = sorted(stored - set(state_dict))
        if strict and missing:
            raise MismatchError(f"load_into: not in the checkpoint: {missing}")
        for name, target in state_dict.items():
            if name not in stored:
                continue
            if list(target.shape) != self.shape(name):
                raise MismatchError(f"load_into: tensor '{name}': shape {list(target.shape)} in the state dict, "
                                    f"{self.shape(name)} in the checkpoint")
            target.copy_(self.to_torch(name))
        return missing, unexpected

    def _open(self):
        if self._native is None:
            raise ValueError("this Reader was closed")
        return self._native

    def close(self):
        """Releases the checkpoint's files (idempotent); later reads raise ValueError."""
        self._native = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def open(path, key=None):  # noqa: A001 - the package's reader, as h5py.File / safetensors.safe_open
    """Opens a checkpoint for reading without MPI."""
    return Reader(path, key)
