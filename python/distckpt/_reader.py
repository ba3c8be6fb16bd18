"""Reader: one checkpoint in any format, read in this process without MPI."""
import numpy as _np

from . import _distckpt
from ._args import _bool_arg, _name_map_arg, _path_arg
from ._results import CheckpointInfo, _from
from ._state import _NUMPY_DTYPES
from ._distckpt import MismatchError


def map_name(stored_name, rename, prefix_map):
    """The state's name of a stored tensor: rename[stored_name], else the longest prefix of
    prefix_map replaced, else the stored name (distckpt.load's rule, in Python)."""
    if stored_name in rename:
        return rename[stored_name]
    best = None
    for prefix in prefix_map:
        if stored_name.startswith(prefix) and (best is None or len(prefix) > len(best)):
            best = prefix
    return stored_name if best is None else prefix_map[best] + stored_name[len(best):]


def _numpy_dtype(name):
    # numpy has no bfloat16: such tensors come back as uint16 views of the bits.
    return _np.dtype("uint16") if name == "bfloat16" else _np.dtype(_NUMPY_DTYPES[name])


class Reader:
    """One checkpoint in any format (native, .ckpt, safetensors, .h5), read in this process."""

    def __init__(self, path, key=None, check=False):
        self._native = _distckpt._Reader(_path_arg("Reader", "path", path), key, _bool_arg("Reader", "check", check))
        self._tensors = self._native.tensors()
        self._warned = False
        self.bytes_read = 0

    def keys(self):
        return list(self._open().keys())

    @property
    def info(self):
        """The checkpoint's name, step, epoch and world_size, and under "info" every info value
        stored with it (epoch_num, step_num, the user's)."""
        return _from(CheckpointInfo, self._open().meta())

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
        if not self._warned:  # once per reader: what reads of this checkpoint cannot check
            self._warned = True
            reason = self._open().unchecked_reason()
            if reason:
                import warnings
                warnings.warn(f"distckpt.open: {reason}", stacklevel=3)
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

    def load_into(self, state_dict, strict=True, rename=None, prefix_map=None):
        """Copies the checkpoint's tensors into a torch state_dict (a module's, or an
        optimizer's flattened one) by name, in place; returns the names left unmatched as
        (missing_in_checkpoint, unexpected_in_checkpoint), in the state dict's names and the
        stored names. Stored names map to the state dict's as distckpt.load maps them:
        `rename` (stored name -> name) first, else `prefix_map` (stored prefix -> prefix,
        the longest that matches: {"module.": ""} strips DDP's). strict has torch's meaning:
        a missing or an unexpected name raises MismatchError listing both, before anything
        is copied; a shape that differs always does (names and shapes are matched as
        distckpt.load matches them; dtypes convert as torch's ``Tensor.copy_`` converts). A value that
        is not a torch tensor is a TypeError; a rename that gives two stored tensors one
        name, a ValueError."""
        where = "load_into"
        rename = _name_map_arg(where, "rename", rename)
        prefix_map = _name_map_arg(where, "prefix_map", prefix_map)
        import torch

        for name, target in state_dict.items():
            if not isinstance(target, torch.Tensor):
                raise TypeError(f"load_into: state_dict['{name}'] is a {type(target).__name__}, not a torch.Tensor")
        # distckpt.load's matcher (names through rename and prefix_map, shapes equal).
        try:
            pairs, missing, unexpected = self._open().match(
                [(name, list(target.shape)) for name, target in state_dict.items()], rename, prefix_map)
        except MismatchError as e:
            raise MismatchError(f"load_into: {e}") from None
        unexpected = sorted(unexpected)
        if strict and (missing or unexpected):
            raise MismatchError(f"load_into: missing in the checkpoint: {missing}; unexpected in it: {unexpected}")
        by_target = dict(pairs)
        for name, target in state_dict.items():
            if name in by_target:
                target.copy_(self.to_torch(by_target[name]))
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


def open(path, key=None, check=False):  # noqa: A001 - the package's reader, as h5py.File / safetensors.safe_open
    """Opens a checkpoint for reading without MPI. Whole chunks read are checked against their
    checksums; a file whose only checksum covers it whole (a .ckpt MindSpore wrote with its
    footer) is read unchecked, with a warning at the first read, unless `check`, which reads
    each file once now and checks its CRC-32 (CorruptionError on a mismatch)."""
    return Reader(path, key, check)
