"""distckpt.torch.save and distckpt.torch.load."""
import json as _json
import numbers as _numbers
import time as _time

import distckpt as _dc
from distckpt._args import _agreed_outcome, _name_map_arg

from . import _restore
from ._mesh import local_facts, resolve
from ._values import ENCODING_VERSION
from ._walk import Walk

# The info value that holds the tree (typed JSON, see encode_value).
STATE_KEY = "distckpt.torch.state"


def _comm_and_mesh(where, comm, mesh):
    native = _dc._comm_arg(where, comm)
    if mesh is not None:
        from ._mesh import Mesh
        if not isinstance(mesh, Mesh):
            raise TypeError(f"{where}: mesh must be a distckpt.torch.Mesh, not {type(mesh).__name__}")
        if mesh.comm.size != comm.size:
            raise ValueError(f"{where}: the mesh spans {mesh.comm.size} ranks, comm {comm.size}")
    return native


def _walk_and_facts(state, placements, layouts, check_replicas):
    walk = Walk(state, placements, layouts)
    return walk, local_facts(walk, check_replicas)


def state_dict_of(comm, state, mesh, placements, layouts, check_replicas):
    """Collective. Walks `state` and resolves its placements; returns (walk, StateDict-ready
    tensors, their layouts, the tree's JSON text). A failure on one rank fails every rank."""
    native = comm._native
    # Agreed before the allgather: a rank whose walk failed must not leave the others in it.
    walk, mine = _agreed_outcome(native, lambda: _walk_and_facts(state, placements, layouts, check_replicas))
    resolved, per_rank_values = _agreed_outcome(native, lambda: resolve(comm, mesh, walk, mine, check_replicas))
    walk.fill_per_rank(per_rank_values)
    tensors, layout_of = {}, dict(walk.explicit)
    layout_of.update(resolved)
    for path, t in walk.tensors.items():
        # A per-rank tensor is rank r's row of a [world, ...] tensor: the same bytes, one dim more.
        tensors[path] = t.unsqueeze(0) if path in walk.per_rank_tensors else t
    text = _json.dumps({"version": ENCODING_VERSION, "world_size": comm.size,
                        "mesh": mesh.describe() if mesh is not None else None, "tree": walk.tree}, allow_nan=False)
    return walk, tensors, layout_of, text


def save(comm, state, root, name=None, step=-1, epoch=-1, mesh=None, placements=None, layouts=None,
         format="native", key=None, update_latest=True):
    """Collective. Saves the application state `state` under `root` as `name` (default
    `step-{step}`); returns a distckpt.SaveResult.

    mesh, placements: where each tensor lives (Mesh, Shard, Replicate, PerRank); a tensor not
    placed is replicated, and ranks holding the same block of a tensor must hold the same
    bytes (MismatchError naming it and two ranks). An optimizer's state tensor of its
    parameter's shape takes the parameter's placement. layouts: path -> distckpt.TensorLayout
    for a layout given as is. Plain values are rank 0's unless placed PerRank.
    Raises TypeError for a value that is neither a tensor, an object with state_dict(), a
    container nor a plain value, naming its path, and for a placement that does not fit;
    DistckptError as distckpt.save. A failure on one rank fails the call on every rank.
    """
    where = "distckpt.torch.save"
    native = _dc._agreed(_dc._comm_arg(where, comm), lambda: _comm_and_mesh(where, comm, mesh))

    def name_of():
        if name is None and (not isinstance(step, _numbers.Integral) or isinstance(step, bool) or step < 0):
            raise TypeError(f"{where}: give name=, or a step >= 0 to name the checkpoint step-{{step}}")
        return name if name is not None else f"step-{int(step)}"
    checkpoint = _dc._agreed(native, name_of)
    _, tensors, layout_of, text = state_dict_of(comm, state, mesh, placements, layouts, check_replicas=True)
    sd = _dc._agreed(native, lambda: _dc.StateDict(comm, tensors, layout_of))  # save's first step agrees
    sd._native._set_info(STATE_KEY, text)
    return _dc.save(comm, sd, root, checkpoint, step=step, epoch=epoch, format=format, key=key,
                    update_latest=update_latest)


class LoadResult:
    """What distckpt.torch.load did.

    path: the checkpoint loaded. step, epoch: its. missing_keys: entries of the target state
    the checkpoint has no value for (per-rank entries saved at another world size among
    them); unexpected_keys: stored entries the target has no place for (torch's
    load_state_dict names; stored names). info: the checkpoint's other info values.
    bytes_read: read from storage, summed over ranks. load_s: the whole call's time.
    """

    def __init__(self, path, step, epoch, info, missing, unexpected, bytes_read, load_s):
        self.path, self.step, self.epoch, self.info = path, step, epoch, info
        self.missing_keys, self.unexpected_keys = sorted(missing), sorted(unexpected)
        self.bytes_read, self.load_s = bytes_read, load_s

    def __repr__(self):
        return (f"LoadResult(path={self.path!r}, step={self.step}, missing_keys={self.missing_keys}, "
                f"unexpected_keys={self.unexpected_keys})")


def load(comm, state, path, strict=True, mesh=None, placements=None, layouts=None, key=None, cast_floats=False,
         rename=None, prefix_map=None):
    """Collective. Loads the checkpoint at `path` (a root: its newest; give a checkpoint's path
    where another job may commit meanwhile) into the application state `state`: tensors in
    place, onto any mesh, placement and world size; objects through load_state_dict() where
    their state_dict() is not their own storage; plain values of dicts and lists in place.

    strict=True has load_state_dict's meaning: a target entry the checkpoint lacks (missing) or
    a stored entry the target lacks (unexpected) fails the load on every rank, naming both
    lists, before anything of the state changes. strict=False loads what matches and returns
    the lists. Per-rank entries saved at another world size are missing.
    rename (stored path -> path) and prefix_map (stored prefix -> prefix, the longest that
    matches; {"model.module.": "model."} for a model saved inside DDP) map stored names to the
    state's; an optimizer's parameters are mapped alike.
    An optimizer whose state is still empty gets the state the checkpoint has for its
    parameters first (one step at learning rate 0 with zero gradients for those parameters, as
    torch.distributed.checkpoint does; LBFGS, whose step needs a closure, is not supported).
    Returns a LoadResult. Raises DistckptError as distckpt.load, MismatchError for a strict
    mismatch, TypeError as save; a failure on one rank fails the call on every rank.
    """
    started = _time.perf_counter()
    where = "distckpt.torch.load"
    native = _dc._agreed(_dc._comm_arg(where, comm), lambda: (
        _comm_and_mesh(where, comm, mesh), _name_map_arg(where, "rename", rename),
        _name_map_arg(where, "prefix_map", prefix_map)))[0]
    names = (_name_map_arg(where, "rename", rename), _name_map_arg(where, "prefix_map", prefix_map))
    probe = _dc.load(comm, _dc.StateDict(comm, {}), path, key=key, allow_unexpected=True)
    stored = _agreed_outcome(native, lambda: _restore.Stored(_stored_tree(probe, path), comm.size, comm.rank, *names))
    walk = _agreed_outcome(native, lambda: Walk(state, placements, layouts))

    def plan():
        fresh = _restore.fresh_optimizer_entries(walk, stored)
        target_tensors = (set(walk.tensors) | fresh["tensors"])
        target_values = set(_restore.value_paths(walk.tree)) | fresh["values"]
        missing = (target_tensors - set(stored.tensors)) | (target_values - set(stored.values))
        missing |= (target_tensors | target_values) & stored.unusable
        unexpected = {stored.stored_name[t] for t in (set(stored.tensors) - target_tensors)}
        unexpected |= {stored.stored_name[v] for v in (set(stored.values) - target_values)}
        if strict and (missing or unexpected):
            raise _dc.MismatchError(f"{where}: {path} does not match the state: missing {sorted(missing)}, "
                                    f"unexpected {sorted(unexpected)}")
        _restore.prepare_optimizers(walk, fresh["params"])
        return missing, unexpected
    missing, unexpected = _agreed_outcome(native, plan)
    # Walked again: an optimizer whose state was just made has new tensors.
    loaded_walk, tensors, layout_of, _ = state_dict_of(comm, state, mesh, placements, layouts, check_replicas=False)
    wanted = {p: t for p, t in tensors.items() if p in stored.tensors and p not in missing}
    rename_stored = {stored.tensors[p]: p for p in wanted if stored.tensors[p] != p}
    sd = _dc._agreed(native, lambda: _dc.StateDict(comm, wanted, {p: l for p, l in layout_of.items() if p in wanted}))
    result = _dc.load(comm, sd, path, key=key, cast_floats=cast_floats, allow_unexpected=True, rename=rename_stored)
    import torch
    with torch.no_grad():
        _agreed_outcome(native, lambda: _restore.restore(state, loaded_walk, stored))
    info = {k: v for k, v in result.info.items() if k != STATE_KEY}
    return LoadResult(path, result.step, result.epoch, info, missing, unexpected, result.bytes_read,
                      _time.perf_counter() - started)


def _stored_tree(probe, path):
    text = probe.info.get(STATE_KEY)
    if text is None:
        raise _dc.MismatchError(f"distckpt.torch.load: {path} was not saved by distckpt.torch "
                                f"(no '{STATE_KEY}'): use distckpt.load with a StateDict")
    try:
        stored = _json.loads(text)
    except ValueError:
        stored = None
    if not isinstance(stored, dict) or not isinstance(stored.get("version"), int) or "tree" not in stored:
        raise _dc.CorruptionError(f"distckpt.torch.load: {path}: '{STATE_KEY}' is not a state tree")
    if stored["version"] > ENCODING_VERSION:
        raise _dc.MismatchError(f"distckpt.torch.load: {path} holds the state in encoding version "
                                f"{stored['version']}; this distckpt reads up to {ENCODING_VERSION}")
    return stored
