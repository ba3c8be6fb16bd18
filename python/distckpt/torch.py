"""distckpt.torch: save and load a PyTorch application state as it is, nested.

    import distckpt, distckpt.torch as dt
    comm = distckpt.Comm.world()
    state = {"model": model, "optim": optimizer, "sched": scheduler, "step": 120}
    dt.save(comm, state, "/ckpt", step=120)            # checkpoint /ckpt/step-120
    result = dt.load(comm, state, "/ckpt")             # the newest, back into the same objects

The state is a tree. A node may be an object with `state_dict()`/`load_state_dict()` (a module,
an optimizer, a scheduler), a tensor, a dict, list or tuple of nodes, or a plain value (int,
float, bool, str, None, bytes, numpy scalars, torch.dtype, torch.device). It is walked again at
every save and every load, so a parameter given new storage between two saves (`p.data = ...`,
`module.double()`) is saved as it is now, never from its old memory.

Names follow the tree: `model.fc1.weight`. An optimizer's state is named by its parameter's
path, found through the modules of the same state (`optim.state.model.fc1.weight.exp_avg`), and
its `param_groups` keep their hyper-parameters with the parameters' paths, so a model built in
another order still gets each group's. Loading into a fresh optimizer whose state is still empty
(Adam before its first `step()`) first makes that state with one step at learning rate 0 and
zero gradients, as torch.distributed.checkpoint does.

Plain values are stored as typed JSON (`encode_value`), never pickled: a tuple comes back a
tuple, an int key an int key. Tensors are saved zero-copy through `distckpt.StateDict`; a tensor
split across ranks is described by `layouts={"model.fc1.weight": TensorLayout}`, and an
optimizer's state tensor of its parameter's shape takes the parameter's layout. Every other
tensor is replicated.
"""
import base64 as _base64
import json as _json
import math as _math
import numbers as _numbers

import numpy as _np

import distckpt as _dc

__all__ = ["save", "load", "LoadResult", "encode_value", "decode_value", "STATE_KEY"]

# The info value that holds the tree's plain values and shape (typed JSON, see encode_value).
STATE_KEY = "distckpt.torch.state"
# The encoding's version, stored in the tree: a reader refuses a newer one.
_ENCODING_VERSION = 1


def _torch():
    import torch
    return torch


# ---- typed JSON -------------------------------------------------------------------------------

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
        return [encode_value(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, dict):
        if all(isinstance(k, str) and not k.startswith("$") for k in value):
            return {k: encode_value(v, f"{where}.{k}") for k, v in value.items()}
        return {"$dict": [[encode_value(k, f"{where} key"), encode_value(v, f"{where}.{k}")]
                          for k, v in value.items()]}
    if torch is not None and isinstance(value, torch.dtype):
        return {"$dtype": str(value)}
    if torch is not None and isinstance(value, torch.device):
        return {"$device": str(value)}
    raise TypeError(f"'{where}': a {type(value).__name__} is not a plain value (int, float, bool, str, None, "
                    f"bytes, a tuple, list or dict of them, torch.dtype or torch.device); nothing is pickled")


def decode_value(obj):
    """The plain value of a typed JSON form made by encode_value."""
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
            return float(body)
        if tag == "$bytes":
            return _base64.b64decode(body)
        if tag == "$dtype":
            dtype = getattr(_torch(), str(body).split(".", 1)[-1], None)
            if not isinstance(dtype, _torch().dtype):
                raise _dc.CorruptionError(f"distckpt.torch: '{body}' is not a torch dtype")
            return dtype
        if tag == "$device":
            return _torch().device(body)
        if tag.startswith("$"):
            raise _dc.CorruptionError(f"distckpt.torch: unknown typed value '{tag}' (a newer writer?)")
    return {k: decode_value(v) for k, v in obj.items()}


def _torch_if_loaded():
    import sys
    return sys.modules.get("torch")


# ---- the walk ---------------------------------------------------------------------------------

class _Walk:
    """One walk of an application state: its tensors by path, and its tree in typed JSON with
    tensors as {"$tensor": path}, stateful objects as {"$object": type, "state": tree}, plain
    values (and containers of plain values only) as {"$value": typed JSON}."""

    def __init__(self, state, layouts):
        self.tensors = {}
        self.layouts = dict(layouts or {})
        unknown = [name for name in self.layouts if not isinstance(name, str)]
        if unknown:
            raise TypeError(f"distckpt.torch: layouts must be keyed by tensor path (str), not {unknown[0]!r}")
        self.params = {}  # id(parameter) -> its path, from every module of the state
        self.optimizers = {}  # path -> optimizer
        self.objects = {}  # path -> the dict its state_dict() returned in this walk
        self._find_modules(state, "")
        self.tree = self._node(state, "")
        stray = sorted(set(layouts or {}) - set(self.tensors))
        if stray:
            raise TypeError(f"distckpt.torch: layouts name no tensor of the state: {stray} "
                            f"(tensors are named by path, e.g. 'model.fc1.weight')")

    def _find_modules(self, node, path):
        torch = _torch()
        if isinstance(node, torch.nn.Module):
            for name, p in node.named_parameters():
                self.params.setdefault(id(p), _join(path, name))
        elif isinstance(node, dict):
            for k, v in node.items():
                self._find_modules(v, _join(path, str(k)))
        elif isinstance(node, (list, tuple)):
            for i, v in enumerate(node):
                self._find_modules(v, _join(path, str(i)))

    def _node(self, node, path):
        torch = _torch()
        if isinstance(node, torch.Tensor):
            return self._tensor(node, path)
        if isinstance(node, torch.optim.Optimizer):
            self.optimizers[path] = node
            return {"$object": type(node).__name__, "state": self._optimizer(node, path)}
        if hasattr(node, "state_dict") and hasattr(node, "load_state_dict") and not isinstance(node, type):
            sd = node.state_dict()
            if not isinstance(sd, dict):
                raise TypeError(f"distckpt.torch: '{path}': {type(node).__name__}.state_dict() returned a "
                                f"{type(sd).__name__}, not a dict")
            if type(node).__module__ == "torch.optim.lr_scheduler":
                sd = _without_rebuilt_callables(sd)
            self.objects[path] = sd
            return {"$object": type(node).__name__, "state": self._node(sd, path)}
        if isinstance(node, (dict, list, tuple)) and _is_plain(node):
            # A container of plain values is one value: a tuple of betas, a list of lrs.
            return {"$value": _encode(node, path)}
        if isinstance(node, dict):
            if not all(isinstance(k, str) for k in node):
                # Tensors are named by path: an int key is fine (str(k)), its type is kept.
                return {"$dict": [[_encode(k, path), self._node(v, _join(path, str(k)))] for k, v in node.items()]}
            return {"$dict": [[k, self._node(v, _join(path, k))] for k, v in node.items()]}
        if isinstance(node, tuple):
            return {"$tuple": [self._node(v, _join(path, str(i))) for i, v in enumerate(node)]}
        if isinstance(node, list):
            return {"$list": [self._node(v, _join(path, str(i))) for i, v in enumerate(node)]}
        if callable(node):
            raise TypeError(f"distckpt.torch: '{path}' is a callable ({type(node).__name__}): only tensors, "
                            f"objects with state_dict(), containers and plain values are saved")
        return {"$value": _encode(node, path)}

    def _tensor(self, t, path):
        if not path:
            raise TypeError("distckpt.torch: the state is one tensor: give a dict that names it")
        if path in self.tensors:
            raise TypeError(f"distckpt.torch: two tensors are named '{path}' (a key with a '.' in it?)")
        self.tensors[path] = t
        return {"$tensor": path}

    def _optimizer(self, opt, path):
        sd = opt.state_dict()
        params = [p for group in opt.param_groups for p in group["params"]]
        names = []
        for index, p in enumerate(params):
            name = self.params.get(id(p))
            if name is None:
                raise TypeError(f"distckpt.torch: optimizer '{path}': its parameter {index} belongs to no "
                                f"module of the state: put the model in the same state")
            names.append(name)
        state = {}
        for index, entries in sd["state"].items():
            pname = names[index]
            state[pname] = {}
            for key, value in entries.items():
                tpath = f"{path}.state.{pname}.{key}"
                if hasattr(value, "data_ptr"):
                    state[pname][key] = self._tensor(value, tpath)
                    if pname in self.layouts and list(value.shape) == list(params[index].shape):
                        self.layouts.setdefault(tpath, self.layouts[pname])
                else:
                    state[pname][key] = {"$value": _encode(value, tpath)}
        groups = []
        for i, group in enumerate(sd["param_groups"]):
            g = {k: _encode(v, f"{path}.param_groups.{i}.{k}") for k, v in group.items() if k != "params"}
            g["params"] = [names[index] for index in group["params"]]
            groups.append(g)
        return {"state": state, "param_groups": groups}


# Scheduler entries that a scheduler rebuilds from its constructor and that torch 1.13's
# state_dict() still returns as a callable: OneCycleLR's anneal_func, CyclicLR's
# _scale_fn_ref (a weakref.WeakMethod). Left out at any depth of a scheduler's state
# (SequentialLR and ChainedScheduler nest their schedulers'), never pickled.
_REBUILT_CALLABLES = {"anneal_func", "_scale_fn_ref"}


def _without_rebuilt_callables(value):
    if isinstance(value, dict):
        return {k: _without_rebuilt_callables(v) for k, v in value.items()
                if not (k in _REBUILT_CALLABLES and callable(v))}
    if isinstance(value, list):
        return [_without_rebuilt_callables(v) for v in value]
    return value


def _encode(value, path):
    try:
        return encode_value(value, path)
    except TypeError as e:
        raise TypeError(f"distckpt.torch: {e}") from None


def _is_plain(node):
    """Whether a container holds no tensor and no object with a state_dict(), at any depth."""
    if isinstance(node, dict):
        return all(_is_plain(v) for v in node.values())
    if isinstance(node, (list, tuple)):
        return all(_is_plain(v) for v in node)
    return not (hasattr(node, "data_ptr") or hasattr(node, "state_dict"))


def _join(path, key):
    return f"{path}.{key}" if path else key


def _state_dict(comm, walk, names):
    tensors = {name: walk.tensors[name] for name in names}
    layouts = {name: layout for name, layout in walk.layouts.items() if name in tensors}
    return _dc.StateDict(comm, tensors, layouts)


# ---- save and load ----------------------------------------------------------------------------

def save(comm, state, root, name=None, step=-1, epoch=-1, layouts=None, format="native", key=None,
         update_latest=True):
    """Collective. Saves the application state `state` under `root` as `name` (default
    `step-{step}`); returns distckpt.save's result.

    layouts: tensor path -> distckpt.TensorLayout for tensors split across ranks (an
    optimizer's state tensor of its parameter's shape takes the parameter's); a path that names
    no tensor is a TypeError. Every other tensor, and every plain value, is replicated: the
    checkpoint keeps rank 0's (per-rank values such as RNG states are not kept per rank). The
    tree is stored in the checkpoint's info (STATE_KEY).
    Raises TypeError for a value that is neither a tensor, an object with state_dict(), a
    container nor a plain value, naming its path; DistckptError as distckpt.save. A failure on
    one rank fails the call on every rank.
    """
    native = _dc._comm_arg("distckpt.torch.save", comm)

    def check():
        if name is None and (not isinstance(step, _numbers.Integral) or step < 0):
            raise TypeError("distckpt.torch.save: give name=, or a step >= 0 to name the checkpoint step-{step}")
        walk = _Walk(state, layouts)
        sd = _state_dict(comm, walk, walk.tensors)
        sd._native._set_info(STATE_KEY, _json.dumps({"version": _ENCODING_VERSION, "tree": walk.tree},
                                                    allow_nan=False))
        return sd
    sd = _dc._agreed(native, check)
    return _dc.save(comm, sd, root, name if name is not None else f"step-{int(step)}", step=step, epoch=epoch,
                    format=format, key=key, update_latest=update_latest)


class LoadResult:
    """What distckpt.torch.load did.

    step, epoch: the checkpoint's. path: the path given. missing_keys: entries of the target
    state the checkpoint has no value for; unexpected_keys: stored entries the target has no
    place for (torch's load_state_dict names). info: the checkpoint's other info values.
    """

    def __init__(self, path, native, missing, unexpected):
        self.path = path
        self.step = native["step"]
        self.epoch = native["epoch"]
        self.info = {k: v for k, v in native["info"].items() if k != STATE_KEY}
        self.missing_keys = sorted(missing)
        self.unexpected_keys = sorted(unexpected)
        self.bytes_read = native["bytes_read"]

    def __repr__(self):
        return (f"LoadResult(path={self.path!r}, step={self.step}, missing_keys={self.missing_keys}, "
                f"unexpected_keys={self.unexpected_keys})")


def load(comm, state, path, strict=True, layouts=None, key=None, cast_floats=False):
    """Collective. Loads the checkpoint at `path` (a root: its newest; give a checkpoint's path
    where another job may commit meanwhile) into the application state `state`: tensors in
    place, onto any layout and world size; objects through load_state_dict() where their
    state_dict() is not their own storage; plain values of dicts and lists in place.

    strict=True has load_state_dict's meaning: a target entry the checkpoint lacks (missing) or
    a stored entry the target lacks (unexpected) fails the load on every rank, naming both
    lists, before anything of the state changes. strict=False loads what matches and returns
    the lists. An optimizer whose state is still empty gets the state the checkpoint has for its
    parameters first (one step at learning rate 0 with zero gradients for those parameters, as
    torch.distributed.checkpoint does; LBFGS, whose step needs a closure, is not supported).
    Returns a LoadResult. Raises DistckptError as distckpt.load, MismatchError for a strict
    mismatch, TypeError as save; a failure on one rank fails the call on every rank.
    """
    native = _dc._comm_arg("distckpt.torch.load", comm)
    walk = _dc._agreed(native, lambda: _Walk(state, layouts))
    probe = _dc.load(comm, _dc.StateDict(comm, {}), path, strict=False, key=key)

    def plan():
        stored = _stored_tree(probe, path)
        stored_tensors = set(probe["unexpected_in_checkpoint"])
        stored_values, stored_optimizers = {}, {}
        _values(stored["tree"], "", stored_values, stored_optimizers)
        target_tensors, target_values = set(walk.tensors), {}
        _values(walk.tree, "", target_values, {})
        fresh = _fresh_optimizer_entries(walk, stored_optimizers)
        target_tensors |= fresh["tensors"]
        target_values.update(dict.fromkeys(fresh["values"]))
        missing = (target_tensors - stored_tensors) | (set(target_values) - set(stored_values))
        unexpected = (stored_tensors - target_tensors) | (set(stored_values) - set(target_values))
        if strict and (missing or unexpected):
            raise _dc.MismatchError(f"distckpt.torch.load: {path} does not match the state: missing "
                                    f"{sorted(missing)}, unexpected {sorted(unexpected)}")
        _prepare_optimizers(walk, fresh["params"])
        loaded = _Walk(state, layouts) if fresh["params"] else walk
        return stored, loaded, stored_tensors, missing, unexpected
    stored, loaded, stored_tensors, missing, unexpected = _dc._agreed(native, plan)
    names = [name for name in loaded.tensors if name in stored_tensors]
    result = _dc.load(comm, _state_dict(comm, loaded, names), path, strict=True, key=key, cast_floats=cast_floats)
    with _torch().no_grad():
        _restore(state, "", loaded.tree, stored["tree"], loaded)
    return LoadResult(path, result, missing, unexpected)


def _stored_tree(probe, path):
    text = probe["info"].get(STATE_KEY)
    if text is None:
        raise _dc.MismatchError(f"distckpt.torch.load: {path} was not saved by distckpt.torch "
                                f"(no '{STATE_KEY}'): use distckpt.load with a StateDict")
    stored = _json.loads(text)
    if not isinstance(stored, dict) or not isinstance(stored.get("version"), int) or "tree" not in stored:
        raise _dc.CorruptionError(f"distckpt.torch.load: {path}: '{STATE_KEY}' is not a state tree")
    if stored["version"] > _ENCODING_VERSION:
        raise _dc.MismatchError(f"distckpt.torch.load: {path} holds the state in encoding version "
                                f"{stored['version']}; this distckpt reads up to {_ENCODING_VERSION}")
    return stored


def _values(tree, path, out, optimizers):
    """Every plain value of a tree by path, and every optimizer's stored state by path."""
    if not isinstance(tree, dict):
        return
    if "$value" in tree:
        out[path] = tree["$value"]
    elif "$object" in tree:
        _values(tree["state"], path, out, optimizers)
    elif "$dict" in tree:
        for k, v in tree["$dict"]:
            _values(v, _join(path, str(decode_value(k))), out, optimizers)
    elif "$tuple" in tree or "$list" in tree:
        for i, v in enumerate(tree.get("$tuple", tree.get("$list"))):
            _values(v, _join(path, str(i)), out, optimizers)
    elif "state" in tree and "param_groups" in tree:  # an optimizer
        optimizers[path] = tree
        for pname, entries in tree["state"].items():
            for k, v in entries.items():
                _values(v, f"{path}.state.{pname}.{k}", out, optimizers)
        out[f"{path}.param_groups"] = tree["param_groups"]


def _fresh_optimizer_entries(walk, stored_optimizers):
    """For each optimizer of the target whose state is still empty: the tensors and values its
    state will have once made for the parameters the checkpoint has state for, and those
    parameters."""
    fresh = {"tensors": set(), "values": set(), "params": {}}
    for path, opt in walk.optimizers.items():
        stored = stored_optimizers.get(path)
        if len(opt.state) > 0 or stored is None:
            continue
        by_name = {walk.params[id(p)]: p for group in opt.param_groups for p in group["params"]}
        params = [by_name[pname] for pname in stored["state"] if pname in by_name]
        for pname, entries in stored["state"].items():
            if pname in by_name:
                for k, v in entries.items():
                    (fresh["tensors"] if "$tensor" in v else fresh["values"]).add(f"{path}.state.{pname}.{k}")
        if params:
            fresh["params"][path] = params
    return fresh


def _prepare_optimizers(walk, params_of):
    """Makes the state of each optimizer in `params_of` (path -> parameters): one step at
    learning rate 0 with zero gradients for those parameters only (no parameter moves: weight
    decay is scaled by the learning rate too; the others get no state, as an unused parameter
    has none), so that its state tensors exist to be loaded into."""
    torch = _torch()
    for path, params in params_of.items():
        opt = walk.optimizers[path]
        if isinstance(opt, torch.optim.LBFGS):
            raise TypeError(f"distckpt.torch.load: optimizer '{path}' is LBFGS with an empty state, whose "
                            f"step() needs a closure: load into it after its first step")
        chosen = {id(p) for p in params}
        saved_lr = [g["lr"] for g in opt.param_groups]
        saved_grads = [(p, p.grad) for g in opt.param_groups for p in g["params"]]
        with torch.no_grad():
            try:
                for g in opt.param_groups:
                    g["lr"] = 0.0
                for p, _ in saved_grads:
                    p.grad = torch.zeros_like(p) if id(p) in chosen else None
                opt.step()
            finally:
                for g, lr in zip(opt.param_groups, saved_lr):
                    g["lr"] = lr
                for p, grad in saved_grads:
                    p.grad = grad


def _restore(node, path, target, stored, walk):
    """Writes the stored tree's values back into `node` (whose walk is `target`)."""
    torch = _torch()
    if "$object" in target:
        if "$object" not in stored:
            return
        if isinstance(node, torch.optim.Optimizer):
            _restore_optimizer(node, stored["state"], walk)
            return
        sd = walk.objects[path]  # the dict whose tensors were loaded
        if "$value" in stored["state"]:  # a state of plain values only, stored as one
            value = decode_value(stored["state"]["$value"])
            if isinstance(value, dict):
                sd.update(value)  # entries left out at save (rebuilt callables) stay
        else:
            _restore_container(sd, path, target["state"], stored["state"], walk)
        if isinstance(node, torch.nn.Module):
            _load_module(node, sd)
        else:
            node.load_state_dict(sd)
        return
    _restore_container(node, path, target, stored, walk)


def _load_module(module, sd):
    """A module's loaded state_dict() into the module: its own parameters and buffers were
    loaded in place; entries that are not their storage (a state_dict hook's copies, extra
    state) go through load_state_dict."""
    own = module.state_dict(keep_vars=True)
    pending = {k: v for k, v in sd.items()
               if not (hasattr(v, "data_ptr") and hasattr(own.get(k), "data_ptr")
                       and own[k].data_ptr() == v.data_ptr())}
    if pending:
        module.load_state_dict(pending, strict=False)


def _entries(tree):
    if "$dict" in tree:
        return [(decode_value(k) if not isinstance(k, str) else k, v) for k, v in tree["$dict"]]
    if "$tuple" in tree or "$list" in tree:
        return list(enumerate(tree.get("$tuple", tree.get("$list"))))
    return []


def _restore_container(node, path, target, stored, walk):
    """Plain values into a dict or list in place; nested nodes walked. Tensors are loaded."""
    stored_entries = dict(_entries(stored))
    for k, t in _entries(target):
        if k not in stored_entries:
            continue
        s = stored_entries[k]
        if "$value" in t and "$value" in s:
            if isinstance(node, (dict, list)):
                node[k] = decode_value(s["$value"])
        elif "$tensor" not in t:
            _restore(node[k], _join(path, str(k)), t, s, walk)


def _restore_optimizer(opt, stored, walk):
    """The stored optimizer state into `opt`: its state tensors are already loaded in place
    (their paths name the parameters); the plain values of each parameter's state (a float
    `step` of an older torch) and each group's hyper-parameters are set directly, groups
    matched by their parameters' paths. (load_state_dict would deep-copy every state tensor.)"""
    by_name = {walk.params[id(p)]: p for group in opt.param_groups for p in group["params"]}
    for pname, entries in stored["state"].items():
        p = by_name.get(pname)
        if p is None:
            continue
        for k, v in entries.items():
            if "$value" in v:
                opt.state[p][k] = decode_value(v["$value"])
    stored_groups = {name: g for g in stored["param_groups"] for name in g["params"]}
    for group in opt.param_groups:
        source = next((stored_groups[walk.params[id(p)]] for p in group["params"]
                       if walk.params[id(p)] in stored_groups), None)
        if source is None:
            continue
        for k, v in source.items():
            if k != "params":
                group[k] = decode_value(v)
