"""Argument checks shared by the package's calls.

Each public call checks its arguments' types here and names the argument; pybind11's own
message lists the native function's positional types (arg0 ... arg11) instead.
"""
import operator as _operator
import os as _os

import numpy as _np

from . import _distckpt


def _type_error(where, what, expected, value):
    return TypeError(f"{where}: {what} must be {expected}, not {type(value).__name__}")


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


def _optional_bool_arg(where, what, value):
    """None (the default's meaning, decided later) or a bool."""
    return None if value is None else _bool_arg(where, what, value)


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


def _name_map_arg(where, what, value):
    """None or a mapping of str to str (a rename or a prefix map)."""
    if value is None:
        return {}
    if not hasattr(value, "items"):
        raise _type_error(where, what, "a dict of str to str", value)
    out = {}
    for k, v in value.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise TypeError(f"{where}: {what} must map str to str, and holds {type(k).__name__} -> {type(v).__name__}")
        out[_utf8(where, what, k)] = _utf8(where, what, v)
    return out


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


def _agreed_outcome(comm_native, run):
    """Collective. Runs run() on every rank and agrees on its outcome (one allreduce): a
    rank where it raised raises that exception again; the others raise DistckptError naming
    that rank. For steps after a collective call that may fail on one rank alone (writing
    loaded values back into Python objects), so that no rank goes on while another failed."""
    try:
        value = run()
    except Exception as error:
        _distckpt._agree_outcome(comm_native, f"{type(error).__name__}: {error}" or "failed")
        raise
    message = _distckpt._agree_outcome(comm_native, "")
    if message:
        raise _distckpt.DistckptError(message)
    return value


def _exchanged(comm_native, compute):
    """Collective, one allgather. Runs compute() -> (value, payload bytes) on every rank and
    returns (value, [every rank's payload, in rank order]). A rank where compute raised raises
    that exception again; the others raise DistckptError naming it: the failure travels in the
    gather itself, so this replaces an agreement and a gather with one collective."""
    error = None
    try:
        value, payload = compute()
        mine = b"\x00" + payload
    except Exception as e:  # any failure is told to the others
        error, value = e, None
        mine = b"\x01" + f"rank {comm_native.rank}: {type(e).__name__}: {e}".encode("utf-8", "replace")
    everyone = comm_native._allgather(mine)
    if error is not None:
        raise error
    failed = next((m for m in everyone if m[:1] == b"\x01"), None)
    if failed is not None:
        text = failed[1:].decode("utf-8", "replace")
        # A distckpt error keeps its class on every rank (NotFoundError stays NotFoundError).
        kind = text.split(": ", 2)[1] if text.count(": ") >= 2 else ""
        raise _DISTCKPT_ERRORS.get(kind, _distckpt.DistckptError)(text)
    return value, [m[1:] for m in everyone]


_DISTCKPT_ERRORS = {cls.__name__: cls for cls in (
    _distckpt.DistckptError, _distckpt.NotFoundError, _distckpt.CorruptionError, _distckpt.AuthError,
    _distckpt.MismatchError)}
