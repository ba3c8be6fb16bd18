"""Plain values as typed JSON: the encoding distckpt.torch stores, never pickle.

The encoding is pinned (docs/guide/python.md, "Plain values: the stored encoding"); ENCODING_VERSION names it, and a
reader refuses a newer one.
"""
import base64 as _base64
import math as _math
import numbers as _numbers
import sys as _sys

import numpy as _np

import distckpt as _dc

# The version of the stored tree and of this encoding: 2 adds per-rank values and the
# saving world's size and mesh. A reader refuses a newer one.
ENCODING_VERSION = 2


def _torch_if_loaded():
    return _sys.modules.get("torch")


def encode_value(value, where="value"):
    """The typed JSON form of a plain value (a JSON-ready object).

    JSON's own types stand for themselves: str, bool, None, int within int64, finite float,
    and a list. Everything else is an object with one "$" key:
    {"$tuple": [...]}, {"$dict": [[key, value], ...]} (a dict whose keys are not all str, or
    that has a key starting with "$"), {"$float": "nan" | "inf" | "-inf"}, {"$bytes": base64},
    {"$dtype": "torch.float32"}, {"$device": "cuda:0"}. A numpy scalar is its Python value. An
    int outside int64 is a TypeError, as is any other type (a callable, an object): nothing is
    pickled. `where` is the value's path, named in the error.
    """
    torch = _torch_if_loaded()
    if isinstance(value, _np.generic):
        value = value.item()
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, _numbers.Integral):
        value = int(value)
        if not -(1 << 63) <= value < (1 << 63):
            raise TypeError(f"'{where}': the int {value} does not fit in int64")
        return value
    if isinstance(value, float):
        if _math.isnan(value):
            return {"$float": "nan"}
        if _math.isinf(value):
            return {"$float": "inf" if value > 0 else "-inf"}
        return value
    if isinstance(value, (bytes, bytearray)):
        return {"$bytes": _base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, tuple):
        return {"$tuple": [encode_value(v, f"{where}[{i}]") for i, v in enumerate(value)]}
    if isinstance(value, list):
        if all(type(v) is str for v in value):  # a param group's parameter paths: long, and as they are
            return list(value)
        return [encode_value(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, dict):
        at = (lambda k: f"{where}.{k}") if where else str  # a top-level key is its own path
        if all(isinstance(k, str) and not k.startswith("$") for k in value):
            return {k: encode_value(v, at(k)) for k, v in value.items()}
        return {"$dict": [[encode_value(k, f"{where} key"), encode_value(v, at(k))]
                          for k, v in value.items()]}
    if torch is not None and isinstance(value, torch.dtype):
        return {"$dtype": str(value)}
    if torch is not None and isinstance(value, torch.device):
        return {"$device": str(value)}
    raise TypeError(f"'{where}': a {type(value).__name__} is not a plain value (int, float, bool, str, None, "
                    f"bytes, a tuple, list or dict of them, torch.dtype or torch.device); nothing is pickled")


def decode_value(obj):
    """The plain value of a typed JSON form made by encode_value. CorruptionError for a form
    it does not know (a damaged tree, or a newer writer)."""
    if isinstance(obj, list):
        return [decode_value(v) for v in obj]
    if not isinstance(obj, dict):
        return obj
    if len(obj) == 1:
        (tag, body), = obj.items()
        if tag == "$tuple":
            return tuple(decode_value(v) for v in body)
        if tag == "$dict":
            return {decode_value(k): decode_value(v) for k, v in body}
        if tag == "$float":
            if body not in ("nan", "inf", "-inf"):
                raise _dc.CorruptionError(f"distckpt.torch: '{body}' is not a stored float")
            return float(body)
        if tag == "$bytes":
            return _base64.b64decode(body, validate=True)
        if tag == "$dtype":
            import torch
            dtype = getattr(torch, str(body).split(".", 1)[-1], None)
            if not isinstance(dtype, torch.dtype):
                raise _dc.CorruptionError(f"distckpt.torch: '{body}' is not a torch dtype")
            return dtype
        if tag == "$device":
            import torch
            try:
                return torch.device(body)
            except (RuntimeError, TypeError):
                raise _dc.CorruptionError(f"distckpt.torch: '{body}' is not a torch device") from None
        if tag.startswith("$"):
            raise _dc.CorruptionError(f"distckpt.torch: unknown typed value '{tag}' (a newer writer?)")
    return {k: decode_value(v) for k, v in obj.items()}


def encode(value, path):
    """encode_value, its TypeError naming distckpt.torch."""
    try:
        return encode_value(value, path)
    except TypeError as e:
        raise TypeError(f"distckpt.torch: {e}") from None
