"""distckpt.torch.save and distckpt.torch.load."""
import json as _json
import numbers as _numbers
import time as _time

import distckpt as _dc
from distckpt import _distckpt
from distckpt._args import _agreed_outcome, _exchanged, _name_map_arg, _path_arg

from . import _restore
from ._staging import stage_in, stage_out
from ._mesh import local_facts, resolve
from ._values import ENCODING_VERSION, decode_value
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


def state_dict_for_one_call(comm, tensors, layouts):
    """A StateDict of `tensors` that lives for one call: it refers to the tensors (never to
    storage they had before), as the walk that found them is taken again for the next call."""
    sd = _dc.StateDict(comm, {})
    sd._fill(comm.size, tensors, layouts, {}, follow=False)
    return sd


class Resolved:
    """A walk with its placements resolved: `tensors` (per-rank ones as rank r's row of a
    [world, ...] tensor: the same bytes, one dim more), their `layouts` (the others are
    replicated) and the tree's JSON `text`."""

    def __init__(self, comm, mesh, walk, gathered, check_replicas):
        layouts, per_rank_values = resolve(comm.size, mesh, walk, gathered, check_replicas)
        walk.fill_per_rank(per_rank_values)
        self.walk = walk
        self.layouts = dict(walk.explicit)
        self.layouts.update(layouts)
        self.tensors = {path: t.unsqueeze(0) if path in walk.per_rank_tensors else t
                        for path, t in walk.tensors.items()}
        self._stored = {"version": ENCODING_VERSION, "world_size": comm.size,
                        "mesh": mesh.describe() if mesh is not None else None, "tree": walk.tree}

    @property
    def text(self):
        """The tree as it is stored (only saves need it)."""
        return _json.dumps(self._stored, allow_nan=False)


def walked(comm, state, mesh, placements, layouts, check_replicas, before=None):
    """Collective, one allgather. Runs before() (further local checks, if any), walks `state`
    and tells the other ranks what resolving its placements needs; a failure on one rank fails
    every rank. Returns (before()'s value, the walk, every rank's facts)."""
    check = check_replicas and comm.size > 1

    def local():
        first = before() if before is not None else None
        walk = Walk(state, placements, layouts)
        return (first, walk), local_facts(walk, check)
    (first, walk), gathered = _exchanged(comm._native, local)
    return first, walk, gathered


def state_dict_of(comm, state, mesh, placements, layouts, check_replicas):
    """Collective. Walks `state` and resolves its placements: a Resolved. The manager's
    refill runs it before each save, where the native manager agrees on its outcome (a
    placement that does not fit raises on every rank alike)."""
    _, walk, gathered = walked(comm, state, mesh, placements, layouts, check_replicas)
    return Resolved(comm, mesh, walk, gathered, check_replicas and comm.size > 1)


def save(comm, state, root, name=None, step=-1, epoch=-1, mesh=None, placements=None, layouts=None,
         format="native", key=None, update_latest=True, check_replicas=True):
    """Collective. Saves the application state `state` under `root` as `name` (default
    `step-{step}`); returns a distckpt.SaveResult.

    mesh, placements: where each tensor lives (Mesh, Shard, Replicate, PerRank); a tensor not
    placed is replicated, and ranks holding the same block of a tensor must hold the same
    bytes (MismatchError naming it and two ranks; compared by a sampled hash of each tensor:
    check_replicas=False leaves the check out, for replicas known to drift, such as BatchNorm
    statistics under DDP). An optimizer's state tensor of its
    parameter's shape takes the parameter's placement. layouts: path -> distckpt.TensorLayout
    for a layout given as is. Plain values are rank 0's unless placed PerRank.
    Raises TypeError for a value that is neither a tensor, an object with state_dict(), a
    container nor a plain value, naming its path, and for a placement that does not fit;
    DistckptError as distckpt.save. A failure on one rank fails the call on every rank.
    """
    where = "distckpt.torch.save"
    native = _dc._comm_arg(where, comm)

    def name_of():
        _comm_and_mesh(where, comm, mesh)
        if name is None and (not isinstance(step, _numbers.Integral) or isinstance(step, bool) or step < 0):
            raise TypeError(f"{where}: give name=, or a step >= 0 to name the checkpoint step-{{step}}")
        return name if name is not None else f"step-{int(step)}"
    check = bool(check_replicas) and comm.size > 1
    checkpoint, walk, gathered = walked(comm, state, mesh, placements, layouts, check, before=name_of)

    def state_dict():  # agreed by save's first step
        r = Resolved(comm, mesh, walk, gathered, check)
        sd = state_dict_for_one_call(comm, stage_out(r.tensors), r.layouts)  # device tensors: host copies
        sd._native._set_info(STATE_KEY, r.text)
        return sd
    sd = _dc._agreed(native, state_dict)
    return _dc.save(comm, sd, root, checkpoint, step=step, epoch=epoch, format=format, key=key,
                    update_latest=update_latest)


class LoadResult:
    """What distckpt.torch.load did.

    path: the checkpoint loaded (a root's newest, resolved). step, epoch: its. missing_keys: entries of the target state
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
         rename=None, prefix_map=None, allow_unchecked=None):
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
    state's; an optimizer's parameters are mapped alike. allow_unchecked as distckpt.load.
    An optimizer whose state is still empty gets the state the checkpoint has for its
    parameters first (one step at learning rate 0 with zero gradients for those parameters, as
    torch.distributed.checkpoint does; LBFGS, whose step needs a closure, is not supported).
    Returns a LoadResult. Raises DistckptError as distckpt.load, MismatchError for a strict
    mismatch, TypeError as save; a failure on one rank fails the call on every rank.
    """
    started = _time.perf_counter()
    where = "distckpt.torch.load"
    native = _dc._comm_arg(where, comm)

    def arguments_and_description():
        # The arguments checked on every rank, and rank 0's read of the checkpoint's
        # description, in one exchange: the load below reads this very checkpoint, even if
        # a newer one is committed meanwhile under a root.
        _comm_and_mesh(where, comm, mesh)
        checked = (_name_map_arg(where, "rename", rename), _name_map_arg(where, "prefix_map", prefix_map))
        where_from = _path_arg(where, "path", path)  # checked on every rank: a TypeError everywhere
        text = _distckpt._read_description(where_from, key) if comm.rank == 0 else ""
        return checked, text.encode("utf-8")
    names, texts = _exchanged(native, arguments_and_description)
    described = _json.loads(texts[0].decode("utf-8"))
    path = described["path"]

    # The stored tree, the walk and the plan, every check before anything of the state changes,
    # in one exchange with the facts the layouts need.
    stored, (missing, unexpected, fresh), walk, gathered, anywhere = _plan_and_walk(
        comm, state, mesh, placements, layouts, described, path, names, strict, where)
    if anywhere:
        # An optimizer whose state is still empty gets it now; walked again (new tensors).
        _, walk, gathered = walked(comm, state, mesh, placements, layouts, False,
                                   before=lambda: _restore.prepare_optimizers(walk, fresh["params"]))

    def state_dict():  # agreed by load's first step
        nonlocal missing, unexpected
        if anywhere:  # what the made state holds, which the plan foresaw from the stored keys
            missing, unexpected, _ = _restore.plan(walk, stored, False, where)
            if strict and (missing or unexpected):
                raise _dc.MismatchError(f"{where}: {path} does not match the optimizer state made for it (it holds "
                                        f"that state now, not loaded): missing {sorted(missing)}, unexpected "
                                        f"{sorted(unexpected)}")
        r = Resolved(comm, mesh, walk, gathered, False)
        wanted = {p: t for p, t in r.tensors.items() if p in stored.tensors and p not in missing}
        host, copy_back = stage_in(wanted)  # device tensors: loaded into host buffers, copied after
        return (state_dict_for_one_call(comm, host, {p: lay for p, lay in r.layouts.items() if p in wanted}),
                {stored.tensors[p]: p for p in wanted if stored.tensors[p] != p}, copy_back)
    sd, rename_stored, copy_back = _dc._agreed(native, state_dict)
    result = _dc.load(comm, sd, path, key=key, cast_floats=cast_floats, allow_unexpected=True, rename=rename_stored,
                      allow_unchecked=allow_unchecked)
    import torch

    def finish():
        copy_back()  # in place, finished before load returns
        _restore.restore(state, walk, stored)
    with torch.no_grad():
        _agreed_outcome(native, finish)
    info = {k: v for k, v in result.info.items() if k != STATE_KEY}
    return LoadResult(path, result.step, result.epoch, info, missing, unexpected, result.bytes_read,
                      _time.perf_counter() - started)


def _plan_and_walk(comm, state, mesh, placements, layouts, described, path, names, strict, where):
    """Collective, one exchange: the stored tree under the state's names, the walk, and the
    load's plan (missing, unexpected, optimizers to prepare), checked on every rank. Returns
    (stored, plan, walk, every rank's facts, whether any rank has an optimizer to prepare)."""
    def local():
        stored = _restore.Stored(_stored_tree(described["info"], path), comm.size, comm.rank, *names, mesh=mesh)
        walk = Walk(state, placements, layouts)
        plan = _restore.plan(walk, stored, strict, f"{where}: {path}")
        return (stored, plan, walk), (b"1" if plan[2]["params"] else b"0") + local_facts(walk, False)
    (stored, plan, walk), gathered = _exchanged(comm._native, local)
    return stored, plan, walk, [g[1:] for g in gathered], any(g[:1] == b"1" for g in gathered)


def _stored_tree(info, path):
    text = info.get(STATE_KEY)
    if text is None:
        raise _dc.MismatchError(f"distckpt.torch.load: {path} was not saved by distckpt.torch "
                                f"(no '{STATE_KEY}'): use distckpt.load with a StateDict")
    try:
        stored = _json.loads(text)
    except (ValueError, TypeError, RecursionError):  # not JSON, not text, nested beyond reason
        stored = None
    if (not isinstance(stored, dict) or not isinstance(stored.get("version"), int)
            or isinstance(stored.get("version"), bool) or "tree" not in stored):
        raise _dc.CorruptionError(f"distckpt.torch.load: {path}: '{STATE_KEY}' is not a state tree")
    if stored["version"] > ENCODING_VERSION:
        raise _dc.MismatchError(f"distckpt.torch.load: {path} holds the state in encoding version "
                                f"{stored['version']}; this distckpt reads up to {ENCODING_VERSION}")
    return stored


def stored_values(path, key=None):
    """Local, no MPI. The plain values a distckpt.torch checkpoint holds, by path, decoded
    (`optim.param_groups`, `sched.last_epoch`, ...); a per-rank value as a list, rank 0's
    first. `path`: a checkpoint, or a root (its newest). CorruptionError for a damaged tree,
    MismatchError for a checkpoint distckpt.torch did not save."""
    with _dc.open(path, key=key) as reader:
        tree = _stored_tree(reader.info.info, path)
    out = {}

    def emit(kind, where, node):
        if kind == "value":
            out[where] = decode_value(node["$value"])
        elif kind == "per_rank":
            out[where] = [decode_value(v) for v in node["$per_rank"]]
        elif kind == "optimizer":
            out[f"{where}.param_groups"] = [{k: decode_value(v) for k, v in g.items()} for g in node["param_groups"]]
            for pname, entries in node["state"].items():
                for k, v in entries.items():
                    if "$value" in v:
                        out[f"{where}.state.{pname}.{k}"] = decode_value(v["$value"])
    try:
        _restore.leaves(tree["tree"], "", emit)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError, RecursionError) as e:
        raise _dc.CorruptionError(f"distckpt.torch: the stored state tree of {path} is damaged ({e})") from None
    return out
