"""One walk of an application state: its tensors by path, their placements, and its tree.

The tree is typed JSON: tensors as {"$tensor": path} ({"$tensor": path, "per_rank": true}
for a per-rank one), stateful objects as {"$object": type, "state": tree}, plain values (and
containers of plain values only) as {"$value": typed JSON}, per-rank plain values as
{"$per_rank": [typed JSON of rank 0, 1, ...]}, containers as {"$dict": [[key, tree], ...]},
{"$list": [...]}, {"$tuple": [...]}, an optimizer as {"state": {param path: {key: tree}},
"param_groups": [...]}.
"""
from ._mesh import PerRank, shards_of
from ._values import encode

# Scheduler entries that a scheduler rebuilds from its constructor and that torch 1.13's
# state_dict() still returns as a callable: OneCycleLR's anneal_func, CyclicLR's
# _scale_fn_ref (a weakref.WeakMethod). Left out at any depth of a scheduler's state
# (SequentialLR and ChainedScheduler nest their schedulers'), never pickled.
_REBUILT_CALLABLES = {"anneal_func", "_scale_fn_ref"}


def join(path, key):
    return f"{path}.{key}" if path else key


_TORCH = []  # the torch module, imported once (an import statement per node costs)


def _torch():
    if not _TORCH:
        import torch
        _TORCH.append(torch)
    return _TORCH[0]


class Walk:
    """The walk of `state` with `placements` (path -> Shard, [Shard...], Replicate, PerRank;
    PerRank may name a subtree) and `layouts` (path -> distckpt.TensorLayout, given as is).

    tensors: path -> tensor; shards: path -> [(dim, axis)]; explicit: path -> TensorLayout;
    per_rank_tensors: paths; per_rank_values: path -> this rank's typed JSON; tree: as above;
    params: id(parameter) -> path; optimizers: path -> optimizer; objects: path -> the dict
    its state_dict() returned in this walk. TypeError for anything that cannot be saved,
    naming its path, and for a placement or layout that names nothing of the state."""

    def __init__(self, state, placements=None, layouts=None):
        self.tensors, self.shards, self.explicit = {}, {}, {}
        self.per_rank_tensors, self.per_rank_values, self._per_rank_nodes = set(), {}, {}
        self.values = {}  # path -> typed JSON of each plain value that is not per rank (rank 0's is kept)
        self.params, self.optimizers, self.objects = {}, {}, {}
        self.placements = dict(placements or {})
        self.layouts = dict(layouts or {})
        for what, given in (("placements", self.placements), ("layouts", self.layouts)):
            bad = [k for k in given if not isinstance(k, str)]
            if bad:
                raise TypeError(f"distckpt.torch: {what} must be keyed by path (str), not {bad[0]!r}")
        for path, layout in self.layouts.items():
            if not hasattr(layout, "_native"):
                raise TypeError(f"distckpt.torch: layouts['{path}'] must be a distckpt.TensorLayout")
        both = sorted(set(self.placements) & set(self.layouts))
        if both:
            raise TypeError(f"distckpt.torch: {both} have both a placement and a layout")
        self._per_rank_roots = {p for p, v in self.placements.items() if isinstance(v, PerRank)}
        self._seen = set()
        self._find_modules(state, "")
        self.tree = self._node(state, "")
        stray = sorted((set(self.placements) | set(self.layouts)) - self._seen)
        if stray:
            raise TypeError(f"distckpt.torch: placements or layouts name nothing of the state: {stray} "
                            f"(entries are named by path, e.g. 'model.fc1.weight')")

    def fill_per_rank(self, per_rank_values):
        """Puts every rank's per-rank values (resolve's) into the tree."""
        for path, node in self._per_rank_nodes.items():
            node["$per_rank"] = per_rank_values[path]

    def _holds_per_rank_root(self, path):
        """Whether a PerRank placement names a path strictly inside `path` (a container of plain
        values is then walked into, not stored as one value)."""
        return any(root.startswith(path + ".") if path else bool(root) for root in self._per_rank_roots)

    def _is_per_rank(self, path):
        return any(path == root or path.startswith(root + ".") for root in self._per_rank_roots)

    def _find_modules(self, node, path):
        torch = _torch()
        if isinstance(node, torch.nn.Module):
            # named_parameters() hashes every parameter (a Python-level Tensor.__hash__); the
            # modules' own tables give the same names, shared parameters under their first.
            for prefix, module in node.named_modules():
                for name, p in module._parameters.items():
                    if p is not None:
                        self.params.setdefault(id(p), join(path, f"{prefix}.{name}" if prefix else name))
        elif isinstance(node, dict):
            for k, v in node.items():
                self._find_modules(v, join(path, str(k)))
        elif isinstance(node, (list, tuple)):
            for i, v in enumerate(node):
                self._find_modules(v, join(path, str(i)))

    def _node(self, node, path):
        torch = _torch()
        self._seen.add(path)
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
        container = isinstance(node, (dict, list, tuple))
        if container and is_plain(node) and not self._holds_per_rank_root(path) or not container:
            if callable(node) and not isinstance(node, (dict, list, tuple)):
                raise TypeError(f"distckpt.torch: '{path}' is a callable ({type(node).__name__}): only tensors, "
                                f"objects with state_dict(), containers and plain values are saved")
            return self._value(node, path)
        if isinstance(node, dict):
            if not all(isinstance(k, str) for k in node):
                # Tensors are named by path: an int key is fine (str(k)), its type is kept.
                return {"$dict": [[encode(k, path), self._node(v, join(path, str(k)))] for k, v in node.items()]}
            return {"$dict": [[k, self._node(v, join(path, k))] for k, v in node.items()]}
        if isinstance(node, tuple):
            return {"$tuple": [self._node(v, join(path, str(i))) for i, v in enumerate(node)]}
        return {"$list": [self._node(v, join(path, str(i))) for i, v in enumerate(node)]}

    def _value(self, node, path):
        value = encode(node, path)
        if not self._is_per_rank(path):
            self.values[path] = value
            return {"$value": value}
        self.per_rank_values[path] = value
        tree = {"$per_rank": None}  # every rank's, once gathered (fill_per_rank)
        self._per_rank_nodes[path] = tree
        return tree

    def _tensor(self, t, path, like=None):
        """A tensor at `path`; `like`: the parameter path whose placement it takes."""
        if not path:
            raise TypeError("distckpt.torch: the state is one tensor: give a dict that names it")
        if path in self.tensors:
            raise TypeError(f"distckpt.torch: two tensors are named '{path}' (a key with a '.' in it?)")
        if t.device.type == "meta":
            raise TypeError(f"distckpt.torch: tensor '{path}' is a meta tensor: it has no data to save or load into")
        self.tensors[path] = t
        # A placement given for the path itself wins over its parameter's.
        own = path in self.placements or path in self.layouts or self._is_per_rank(path)
        source = like if like is not None and not own else path
        if self._is_per_rank(source):
            self.per_rank_tensors.add(path)
            return {"$tensor": path, "per_rank": True}
        if source in self.layouts:
            self.explicit[path] = self.layouts[source]
        elif source in self.placements:
            shards = shards_of(source, self.placements[source])
            if shards:
                self.shards[path] = shards
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
                self._seen.add(tpath)
                if hasattr(value, "data_ptr"):
                    # A state tensor of its parameter's shape (exp_avg) is placed as the parameter.
                    same = list(value.shape) == list(params[index].shape)
                    state[pname][key] = self._tensor(value, tpath, like=pname if same else None)
                else:
                    state[pname][key] = self._value(value, tpath)
        groups = []
        for i, group in enumerate(sd["param_groups"]):
            g = {k: encode(v, f"{path}.param_groups.{i}.{k}") for k, v in group.items() if k != "params"}
            g["params"] = [names[index] for index in group["params"]]
            groups.append(g)
        self.values[f"{path}.param_groups"] = groups
        return {"state": state, "param_groups": groups}


def _without_rebuilt_callables(value):
    if isinstance(value, dict):
        return {k: _without_rebuilt_callables(v) for k, v in value.items()
                if not (k in _REBUILT_CALLABLES and callable(v))}
    if isinstance(value, list):
        return [_without_rebuilt_callables(v) for v in value]
    return value


def is_plain(node):
    """Whether a container holds no tensor and no object with a state_dict(), at any depth."""
    if isinstance(node, dict):
        return all(is_plain(v) for v in node.values())
    if isinstance(node, (list, tuple)):
        return all(is_plain(v) for v in node)
    return not (hasattr(node, "data_ptr") or hasattr(node, "state_dict"))
