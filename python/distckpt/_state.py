"""StateDict, and the calls that save, load, list, verify and convert checkpoints."""
import numbers as _numbers

import numpy as _np

from . import _distckpt
from ._args import (_agreed, _bool_arg, _int_arg, _name_map_arg, _names_arg, _optional_bool_arg, _path_arg, _str_arg,
                    _type_error)
from ._comm import _comm_arg
from ._layout import TensorLayout
from ._results import CheckpointEntry, LoadResult, SaveResult, VerifyReport, _from

_NUMPY_DTYPES = {
    "float32": "float32", "float16": "float16", "float64": "float64",
    "int8": "int8", "int16": "int16", "int32": "int32", "int64": "int64",
    "uint8": "uint8", "uint16": "uint16", "uint32": "uint32", "uint64": "uint64", "bool": "bool",
}


def _is_torch(value):
    return hasattr(value, "data_ptr") and hasattr(value, "is_contiguous")


def _numpy_view(name, a, dtype):
    """The same for anything with the buffer protocol (numpy arrays)."""
    if not isinstance(a, _np.ndarray):  # its memory is what the StateDict refers to
        raise TypeError(f"tensor '{name}': a numpy array or a torch tensor, not {type(a).__name__}")
    arr = a
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
    # numpy's strides are bytes: distckpt's are elements (a view of a structured array's
    # field, say, may step by a non-multiple: refused rather than copied).
    strides = []
    for step in arr.strides:
        if step % arr.itemsize:
            raise TypeError(f"tensor '{name}': stride {step} bytes is not a whole number of "
                            f"{arr.itemsize}-byte elements")
        strides.append(step // arr.itemsize)
    address = arr.__array_interface__["data"][0] if arr.size else 0
    return address, arr.nbytes, dtype or kind, not arr.flags.writeable, a, list(arr.shape), strides


def _plain(value):
    """A numpy scalar (np.int64(3), np.bool_(True), np.float32(0.5)) as the Python value."""
    return value.item() if isinstance(value, _np.generic) else value


class StateDict:
    """Named tensors of this rank, each with its layout, plus info values.

    tensors: name -> numpy array or torch tensor (this rank's slice, in host memory, any
    strides: views, arrays with halo cells and column-major arrays are saved from and loaded
    into in place; a load refuses zero, negative and overlapping strides).
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
        self._fill(comm.size, tensors, layouts or {}, dtypes or {}, follow=True)
        for key, value in (info or {}).items():
            self._native._set_info(key, _plain(value))

    def _fill(self, world_size, tensors, layouts, dtypes, follow):
        """Adds `tensors`; `follow`: torch tensors given new storage are followed at the next
        save or load (StateDict's rule) rather than walked again (distckpt.torch's, whose
        tensors go to the native side in one call)."""
        if not follow and not dtypes and all(_is_torch(v) for v in tensors.values()):
            names = list(tensors)
            self._native._add_torch(names, [tensors[n] for n in names],
                                    [layouts[n]._native if n in layouts else None for n in names], world_size, False)
            return
        for name, layout in layouts.items():
            if not isinstance(layout, TensorLayout):
                raise TypeError(f"StateDict: layouts['{name}'] must be a distckpt.TensorLayout, "
                                f"not {type(layout).__name__}")
        for what, names in (("layouts", layouts), ("dtypes", dtypes)):
            unknown = set(names) - set(tensors)
            if unknown:
                raise TypeError(f"{what} name tensors that are not in the state: {sorted(unknown)}")
        for name, value in tensors.items():
            layout = layouts.get(name)
            if _is_torch(value):  # checked and viewed natively (state.cc torch_view)
                if name in dtypes:
                    raise TypeError(f"tensor '{name}': dtypes applies to numpy arrays (a torch tensor has its own)")
                self._native._add_torch([name], [value], [layout._native if layout is not None else None],
                                        world_size, follow)
                continue
            address, nbytes, dtype, readonly, owner, shape, strides = _numpy_view(name, value, dtypes.get(name))
            if layout is None:
                layout = TensorLayout.replicated(shape, world_size)
            self._native._add(name, dtype, address, nbytes, shape, strides, layout._native, owner, readonly, None)

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


_ENC_MODES = ("AES-GCM", "AES-CBC", "SM4-CBC")


def _enc_mode_arg(where, enc_mode, key, crc_check, format):
    if key is not None and crc_check and str(format).lower() == "ckpt":
        raise ValueError(f"{where}: crc_check and an encryption key are mutually exclusive for a .ckpt, as in "
                         "MindSpore's save_checkpoint (an encrypted .ckpt is checked by its blocks' tags and "
                         "distckpt's per-record CRC32Cs)")
    if enc_mode is None:
        return "AES-GCM"
    if key is None:
        raise ValueError(f"{where}: enc_mode {enc_mode!r} without a key: nothing would be encrypted")
    enc_mode = _str_arg(where, "enc_mode", enc_mode)
    if enc_mode.upper() not in _ENC_MODES:
        raise ValueError(f"{where}: enc_mode {enc_mode!r}: expected one of {', '.join(_ENC_MODES)}")
    return enc_mode.upper()


def save(comm, state, root, name, step=-1, epoch=-1, format="native", fsync=True, update_latest=True, key=None,
         incremental=False, incremental_base="", crc_check=False, integrated=None, remove_redundancy=True,
         enc_mode=None):
    """Collective. Saves `state` under `root` as `name`; returns a SaveResult (path,
    bytes_written, ...).

    format: "native" (a directory of sharded data files), "ckpt" (MindSpore), "safetensors"
    or "hdf5" (one file each). incremental=True references the chunks unchanged since
    `incremental_base` (default: the checkpoint `latest` names) instead of writing them again
    (bytes_referenced says how many).
    MindSpore's save_checkpoint options: crc_check=True appends MindSpore's CRC-32 footer to a
    .ckpt (every .ckpt distckpt writes carries per-record CRC32C either way). integrated:
    None is the format's own way (native: sharded files; ckpt, safetensors: one file; hdf5:
    one file every rank writes into); True with native writes whole tensors into one data
    file; False with ckpt writes a per-rank set, a directory of rank_<r>/<name>.ckpt files
    with MindSpore's strategy.ckpt. remove_redundancy=True writes each distinct slice once
    (in a per-rank set, in the file of the rank MindSpore's rule picks); False: every rank
    writes every slice it holds.
    key (bytes of 16, 24 or 32) encrypts the checkpoint with enc_mode ("AES-GCM", the default,
    "AES-CBC" or "SM4-CBC", MindSpore's names; enc_mode without a key is a ValueError): a native checkpoint chunk by chunk, a .ckpt whole in
    MindSpore 2.x's framing, which MindSpore's load_checkpoint(dec_key=..., dec_mode=...)
    reads (names, step and info values included: nothing is readable without the key).
    AES-CBC and SM4-CBC authenticate nothing in that framing: loads warn.
    Raises TypeError for a wrong argument, ValueError for an unknown enc_mode or crc_check with
    a key on a .ckpt, DistckptError (an existing name, a full disk, an
    option the format refuses); a failure on one rank fails the call on every rank.
    """
    where = "save"
    native = _comm_arg(where, comm)
    args = _agreed(native, lambda: (
        _state_arg(where, state), _path_arg(where, "root", root), _str_arg(where, "name", name),
        _int_arg(where, "step", step), _int_arg(where, "epoch", epoch), _str_arg(where, "format", format),
        _bool_arg(where, "fsync", fsync), _bool_arg(where, "update_latest", update_latest), key,
        _bool_arg(where, "incremental", incremental), _str_arg(where, "incremental_base", incremental_base),
        _bool_arg(where, "crc_check", crc_check), _optional_bool_arg(where, "integrated", integrated),
        _bool_arg(where, "remove_redundancy", remove_redundancy),
        _enc_mode_arg(where, enc_mode, key, crc_check, format)))
    return _from(SaveResult, _distckpt._save(native, *args))


def load(comm, state, path, strict=True, key=None, cast_floats=False, allow_unexpected=False, rename=None,
         prefix_map=None, specify_prefix=None, filter_prefix=None, choice_func=None, allow_unchecked=None):
    """Collective. Loads the checkpoint at `path` (a root: its newest) into `state`, onto any
    layout; returns a LoadResult.

    strict: every tensor of `state` must be in the checkpoint (else MismatchError naming it);
    strict=False skips those and lists them in missing_in_checkpoint. allow_unexpected: a
    stored tensor the state has no place for is refused (MismatchError naming it) unless this
    is set; then it is listed in unexpected_in_checkpoint. (distckpt.torch.load's `strict`
    has torch's meaning, both at once.)
    Names, as C++ LoadOptions: specify_prefix / filter_prefix (lists) keep or leave out stored
    tensors by the prefix of their stored name; rename maps a stored name to the state's;
    prefix_map maps a stored prefix to the state's ({"module.": ""} strips DDP's prefix,
    {"": "model."} adds one; the longest matching prefix wins; an exact rename wins over it).
    choice_func(stored_name) -> bool: after the prefixes, only the stored tensors it accepts
    (MindSpore's choice_func; called on every rank, it must answer alike everywhere).
    allow_unchecked: checkpoints whose data nothing checks (a save made without checksums,
    another writer's safetensors, a .ckpt MindSpore wrote without its CRC-32 footer, its
    default): None loads such a .ckpt with a warning (the result's `warning`), as
    MindSpore's load_checkpoint does, and refuses the others; True loads them all with the
    warning; False refuses them all (MindSpore's crc_check=True). Every .ckpt and HDF5 file
    distckpt writes carries checksums; an HDF5 file from another writer (h5py) loads with a
    warning, as such a .ckpt does.
    cast_floats: a floating tensor stored in another floating dtype is converted (else refused).
    Raises MismatchError, CorruptionError, AuthError, NotFoundError, TypeError for a wrong
    argument; a failure on one rank fails the call on every rank.
    """
    where = "load"
    native = _comm_arg(where, comm)
    args = _agreed(native, lambda: (
        _state_arg(where, state), _path_arg(where, "path", path), _bool_arg(where, "strict", strict), key,
        _bool_arg(where, "cast_floats", cast_floats), _bool_arg(where, "allow_unexpected", allow_unexpected),
        _name_map_arg(where, "rename", rename), _name_map_arg(where, "prefix_map", prefix_map),
        _names_arg(where, "specify_prefix", specify_prefix), _names_arg(where, "filter_prefix", filter_prefix),
        _callable_arg(where, "choice_func", choice_func),
        _optional_bool_arg(where, "allow_unchecked", allow_unchecked)))
    return _from(LoadResult, _distckpt._load(native, *args))


def _callable_arg(where, name, value):
    if value is not None and not callable(value):
        raise _type_error(where, name, "a callable or None", value)
    return value


def remove_checkpoint(root, name):
    """Removes the committed checkpoint `name` of `root` as retention does: files that later
    (incremental) checkpoints reference stay, listed as retired, until nothing does. Never
    `shutil.rmtree` a checkpoint of a root with incremental saves."""
    _distckpt._remove_checkpoint(_path_arg("remove_checkpoint", "root", root), _str_arg("remove_checkpoint", "name", name))


def list_checkpoints(root):
    """The committed checkpoints under `root`, oldest first, as CheckpointEntry records."""
    return [_from(CheckpointEntry, e) for e in _distckpt._list_checkpoints(_path_arg("list_checkpoints", "root", root))]


def verify(path, key=None, deep=False, allow_unchecked=None):
    """Reads every byte of the checkpoint at `path` and checks it; returns a VerifyReport and
    raises CorruptionError (AuthError for a wrong key) on the first failure. Not collective.

    deep=True drops each file from the page cache first, so that the bytes come from storage.
    allow_unchecked as load's: data that records no checksums (a .ckpt MindSpore wrote
    without its footer, an HDF5 file from h5py) passes with the report's `warning` when None
    (other formats are refused) or True, and is refused (DistckptError) when False.
    """
    where = "verify"
    return _from(VerifyReport, _distckpt._verify(_path_arg(where, "path", path), key, _bool_arg(where, "deep", deep),
                                                 _optional_bool_arg(where, "allow_unchecked", allow_unchecked)))


def convert(src, dst, format, key=None):
    """Writes the checkpoint `src` as `dst` in `format` (native, ckpt, safetensors, hdf5); returns the path."""
    return _distckpt._convert(_path_arg("convert", "src", src), _path_arg("convert", "dst", dst),
                              _str_arg("convert", "format", format), key)

def _state_arg(where, state):
    if not isinstance(state, StateDict):
        raise _type_error(where, "state", "a distckpt.StateDict", state)
    return state._native
