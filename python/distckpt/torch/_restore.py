"""The load side of distckpt.torch: the stored tree read under the state's names, the
optimizers' state made where it is still empty, and plain values written back."""
import distckpt as _dc

from ._values import decode_value
from ._walk import join


def _key(k):
    """A $dict key as the container holds it (an int key stays an int)."""
    return k if isinstance(k, str) else decode_value(k)


def leaves(tree, path, emit):
    """Calls emit(kind, path, node) for each leaf of a tree: "tensor", "value", "per_rank",
    and "optimizer" (its node whole)."""
    if not isinstance(tree, dict):
        raise _dc.CorruptionError(f"distckpt.torch: the stored tree is damaged at '{path}'")
    if "$tensor" in tree:
        emit("tensor", path, tree)
    elif "$value" in tree:
        emit("value", path, tree)
    elif "$per_rank" in tree:
        emit("per_rank", path, tree)
    elif "$object" in tree:
        leaves(tree["state"], path, emit)
    elif "$dict" in tree:
        for k, v in tree["$dict"]:
            leaves(v, join(path, str(_key(k))), emit)
    elif "$tuple" in tree or "$list" in tree:
        for i, v in enumerate(tree.get("$tuple", tree.get("$list"))):
            leaves(v, join(path, str(i)), emit)
    elif "state" in tree and "param_groups" in tree:
        emit("optimizer", path, tree)
    else:
        raise _dc.CorruptionError(f"distckpt.torch: the stored tree is damaged at '{path}'")


class Stored:
    """A stored tree under the state's names (rename, then the longest prefix of prefix_map,
    for every path and every optimizer's parameter path).

    tensors: name -> stored tensor name; values: name -> typed JSON (this rank's, for
    per-rank values); optimizers: name -> {"state": {param name: {key: tree}},
    "param_groups": [...]}; stored_name: name -> stored name; unusable: names of per-rank
    entries saved at another world size (missing)."""

    def __init__(self, stored, world_size, rank, rename, prefix_map, mesh=None):
        try:
            self._read(stored, world_size, rank, rename, prefix_map, mesh)
        except _dc.DistckptError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError, IndexError, RecursionError) as e:
            raise _dc.CorruptionError(f"distckpt.torch: the stored state tree is damaged ({type(e).__name__}: "
                                      f"{e})") from None

    def _read(self, stored, world_size, rank, rename, prefix_map, mesh):
        self.tensors, self.values, self.optimizers, self.stored_name = {}, {}, {}, {}
        self.unusable = set()
        # Per-rank entries come back to the rank of the same number on the same mesh only: at
        # another world size, or on another mesh of it, rank r plays another part.
        saved_mesh = stored.get("mesh")
        same_world = stored.get("world_size", world_size) == world_size and (
            saved_mesh is None or mesh is None or saved_mesh == mesh.describe())
        to_name = lambda p: _dc.map_name(p, rename, prefix_map)  # noqa: E731

        def emit(kind, path, node, name=None):
            name = name if name is not None else to_name(path)
            if name in self.stored_name:
                raise _dc.MismatchError(f"distckpt.torch.load: stored entries '{self.stored_name[name]}' and "
                                        f"'{path}' both map to '{name}' (rename, prefix_map)")
            self.stored_name[name] = path
            if kind == "tensor":
                if node.get("per_rank") and not same_world:
                    self.unusable.add(name)
                else:
                    self.tensors[name] = node["$tensor"]
            elif kind == "value":
                self.values[name] = node["$value"]
            elif kind == "per_rank":
                if same_world and isinstance(node["$per_rank"], list) and len(node["$per_rank"]) == world_size:
                    self.values[name] = node["$per_rank"][rank]
                else:
                    self.unusable.add(name)
            else:
                self._optimizer(name, path, node, emit, to_name)
        leaves(stored["tree"], "", emit)
        for value in self.values.values():  # every stored value decodes, before anything changes
            decode_value(value)

    def _optimizer(self, name, path, node, emit, to_name):
        state = {}
        for pname, entries in node["state"].items():
            target = to_name(pname)
            state[target] = entries
            for k, v in entries.items():
                kind = "tensor" if "$tensor" in v else "per_rank" if "$per_rank" in v else "value"
                emit(kind, f"{path}.state.{pname}.{k}", v, name=f"{name}.state.{target}.{k}")
        groups = [dict(g, params=[to_name(p) for p in g["params"]]) for g in node["param_groups"]]
        self.optimizers[name] = {"state": state, "param_groups": groups}
        self.values[f"{name}.param_groups"] = groups
        self.stored_name[f"{name}.param_groups"] = f"{path}.param_groups"


def value_paths(tree):
    """The paths of a (target) tree's plain values, per-rank ones and optimizers' included."""
    out = []

    def emit(kind, path, node):
        if kind in ("value", "per_rank"):
            out.append(path)
        elif kind == "optimizer":
            for pname, entries in node["state"].items():
                out.extend(f"{path}.state.{pname}.{k}" for k, v in entries.items() if "$tensor" not in v)
            out.append(f"{path}.param_groups")
    leaves(tree, "", emit)
    return out


def fresh_optimizer_entries(walk, stored):
    """For each optimizer of the target whose state is still empty: the tensors and values its
    state will have once made for the parameters the checkpoint has state for, and those
    parameters."""
    fresh = {"tensors": set(), "values": set(), "params": {}}
    for path, opt in walk.optimizers.items():
        saved = stored.optimizers.get(path)
        if len(opt.state) > 0 or saved is None:
            continue
        by_name = {walk.params[id(p)]: p for group in opt.param_groups for p in group["params"]}
        params = [by_name[pname] for pname in saved["state"] if pname in by_name]
        for pname, entries in saved["state"].items():
            if pname in by_name:
                for k, v in entries.items():
                    (fresh["tensors"] if "$tensor" in v else fresh["values"]).add(f"{path}.state.{pname}.{k}")
        if params:
            fresh["params"][path] = params
    return fresh


def plan(walk, stored, strict, where):
    """The load's plan, local: (missing, unexpected, the optimizers' fresh entries). With
    strict, a missing or unexpected entry is a MismatchError naming both lists."""
    fresh = fresh_optimizer_entries(walk, stored)
    target_tensors = set(walk.tensors) | fresh["tensors"]
    target_values = set(value_paths(walk.tree)) | fresh["values"]
    missing = (target_tensors - set(stored.tensors)) | (target_values - set(stored.values))
    missing |= (target_tensors | target_values) & stored.unusable
    unexpected = {stored.stored_name[t] for t in (set(stored.tensors) - target_tensors)}
    unexpected |= {stored.stored_name[v] for v in (set(stored.values) - target_values)}
    if strict and (missing or unexpected):
        per_rank = sorted(missing & stored.unusable)
        hint = (f" ({per_rank} are per rank, saved on another world size or mesh: load with strict=False to "
                f"leave them out)" if per_rank else "")
        raise _dc.MismatchError(f"{where} does not match the state: missing {sorted(missing)}, "
                                f"unexpected {sorted(unexpected)}{hint}")
    return missing, unexpected, fresh


def prepare_optimizers(walk, params_of):
    """Makes the state of each optimizer in `params_of` (path -> parameters): one step at
    learning rate 0 with zero gradients for those parameters only (no parameter moves: weight
    decay is scaled by the learning rate too; the others get no state, as an unused parameter
    has none), so that its state tensors exist to be loaded into."""
    import torch
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


def restore(state, walk, stored):
    """Writes the stored plain values into the state (whose walk is `walk`); its tensors are
    loaded already. Objects whose state_dict() is a copy get theirs through load_state_dict.
    Dicts and lists of plain values are updated in place (a loop's own reference to its data
    loader's position sees the loaded one)."""
    if "$value" in walk.tree or "$per_rank" in walk.tree:  # the state is one plain container
        if "" in stored.values:
            _update_in_place(state, decode_value(stored.values[""]))
        return
    _restore_node(state, "", walk.tree, walk, stored)


def _update_in_place(old, new):
    """Whether `old` (a dict or list) took `new`'s contents in place, its own dicts and lists
    among them at any depth."""
    if isinstance(old, dict) and isinstance(new, dict):
        for k in [k for k in old if k not in new]:
            del old[k]
        for k, v in new.items():
            if k not in old or not _update_in_place(old[k], v):
                old[k] = v
        return True
    if isinstance(old, list) and isinstance(new, list):
        if len(old) != len(new):
            old[:] = new
            return True
        for i, v in enumerate(new):
            if not _update_in_place(old[i], v):
                old[i] = v
        return True
    return False


def _restore_node(node, path, target, walk, stored):
    import torch
    if "$object" not in target:
        _restore_container(node, path, target, walk, stored)
        return
    if isinstance(node, torch.optim.Optimizer):
        _restore_optimizer(node, path, walk, stored)
        return
    sd = walk.objects[path]  # the dict whose tensors were loaded
    if "$value" in target["state"] or "$per_rank" in target["state"]:  # a state of plain values only
        if path in stored.values:
            value = decode_value(stored.values[path])
            if isinstance(value, dict):
                sd.update(value)  # entries left out at save (rebuilt callables) stay
    else:
        _restore_container(sd, path, target["state"], walk, stored)
    if isinstance(node, torch.nn.Module):
        _load_module(node, sd)
    else:
        node.load_state_dict(sd)


def _children(tree):
    if "$dict" in tree:
        return [(_key(k), v) for k, v in tree["$dict"]]
    if "$tuple" in tree or "$list" in tree:
        return list(enumerate(tree.get("$tuple", tree.get("$list"))))
    return []


def _restore_container(node, path, target, walk, stored):
    """Plain values into a dict or list in place (by path); nested nodes walked."""
    for key, child in _children(target):
        p = join(path, str(key))
        if "$value" in child or "$per_rank" in child:
            if p in stored.values and isinstance(node, (dict, list)):
                value = decode_value(stored.values[p])
                if not _update_in_place(node[key], value):
                    node[key] = value
        elif "$tensor" not in child:
            _restore_node(node[key], p, child, walk, stored)


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


def _restore_optimizer(opt, path, walk, stored):
    """The stored optimizer state into `opt`: its state tensors are already loaded in place
    (their paths name the parameters); the plain values of each parameter's state (a float
    `step` of an older torch) and each group's hyper-parameters are set directly, groups
    matched by their parameters' paths. (load_state_dict would deep-copy every state tensor.)"""
    saved = stored.optimizers.get(path)
    if saved is None:
        return
    by_name = {walk.params[id(p)]: p for group in opt.param_groups for p in group["params"]}
    for pname, entries in saved["state"].items():
        p = by_name.get(pname)
        if p is None:
            continue
        for k, v in entries.items():
            name = f"{path}.state.{pname}.{k}"
            if "$tensor" not in v and name in stored.values:
                opt.state[p][k] = decode_value(stored.values[name])
    stored_groups = {name: g for g in saved["param_groups"] for name in g["params"]}
    for group in opt.param_groups:
        source = next((stored_groups[walk.params[id(p)]] for p in group["params"]
                       if walk.params[id(p)] in stored_groups), None)
        if source is None:
            continue
        for k, v in source.items():
            if k != "params":
                group[k] = decode_value(v)
