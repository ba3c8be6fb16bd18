"""distckpt.torch.CheckpointManager: the manager's policies over an application state."""
import json as _json
import weakref as _weakref

import distckpt as _dc
from distckpt._args import _name_map_arg

from ._io import STATE_KEY, Resolved, _comm_and_mesh, load, state_dict_of, walked
from ._staging import stage_out


def _is_optimizer(value):
    import torch
    return isinstance(value, torch.optim.Optimizer)


def _is_scheduler(value):
    import torch
    kinds = tuple(k for k in (getattr(torch.optim.lr_scheduler, "LRScheduler", None),
                              getattr(torch.optim.lr_scheduler, "_LRScheduler", None),
                              torch.optim.lr_scheduler.ReduceLROnPlateau) if k is not None)
    return isinstance(value, kinds)


def _nested_kind(value, optimizers, schedulers, depth=0):
    """Whether an optimizer / LR scheduler (as asked) lies inside containers below the top
    level of the state (they are left out by top-level key only)."""
    if depth > 0 and ((optimizers and _is_optimizer(value)) or (schedulers and _is_scheduler(value))):
        return True
    items = value.values() if isinstance(value, dict) else value if isinstance(value, (list, tuple)) else ()
    return any(_nested_kind(v, optimizers, schedulers, depth + 1) for v in items)


def _keys_except(state, optimizers, schedulers):
    """The tensor-name prefixes ("key.", which names a tensor "key" too) of `state`'s
    top-level entries, less its optimizers and/or LR schedulers (by type); None when none
    is there to leave out."""
    if not isinstance(state, dict):
        return None
    left_out = [k for k, v in state.items() if (optimizers and _is_optimizer(v)) or (schedulers and _is_scheduler(v))]
    if not left_out:
        return None
    return [f"{k}." for k in state if k not in left_out]


def _by_type(where, state, config):
    """MMEngine's save_optimizer / save_param_scheduler over an application state: false
    leaves out its top-level optimizers / LR schedulers, found by type, through
    save_prefixes (the stored tree is trimmed alike: see _before_save)."""
    config = dict(config)
    drop = {}
    for name in ("save_optimizer", "save_param_scheduler"):
        value = config.pop(name, None)
        drop[name] = value is not None and not value
    if not drop["save_optimizer"] and not drop["save_param_scheduler"]:
        return config
    opt, sched = drop["save_optimizer"], drop["save_param_scheduler"]
    if config.get("save_prefixes") is not None:
        raise TypeError(f"{where}: save_prefixes and save_optimizer/save_param_scheduler=False both choose what "
                        f"is saved: give one")
    if isinstance(state, dict) and any(_nested_kind(v, opt, sched) for v in state.values()):
        raise ValueError(f"{where}: an optimizer or LR scheduler below the top level of the state cannot be left "
                         f"out: put it at the top level, or choose with save_prefixes")
    prefixes = _keys_except(state, opt, sched)
    if prefixes is None:
        raise ValueError(f"{where}: save_optimizer/save_param_scheduler=False, but the state has no "
                         f"{'optimizer' if opt else 'LR scheduler'} at its top level to leave out")
    if not prefixes:
        raise ValueError(f"{where}: leaving out the optimizers and schedulers leaves nothing to save")
    config["save_prefixes"] = prefixes
    return config


def _trimmed(text, prefixes):
    """The stored tree `text` with only the top-level entries `prefixes` keep ("key."):
    a save that keeps part of the state describes only that part."""
    if not prefixes:
        return text
    stored = _json.loads(text)
    tree = stored["tree"]
    if isinstance(tree, dict) and "$dict" in tree:
        tree["$dict"] = [entry for entry in tree["$dict"] if f"{entry[0]}." in prefixes]
    return _json.dumps(stored, allow_nan=False)


class CheckpointManager(_dc.CheckpointManager):
    """distckpt.CheckpointManager over an application state, as distckpt.torch.save takes it::

        manager = dt.CheckpointManager(comm, {"model": model, "optim": opt, "step": 0},
                                       mesh=mesh, placements=placements,
                                       directory="/ckpt", save_every_steps=100, keep_max=3)
        start = manager.resume().step + 1          # -1 + 1 on a fresh start
        ...  manager.step_end(step, metrics={"loss": loss})

    Every option of distckpt.CheckpointManager applies. The state is walked again before
    each save the manager makes (never at the steps it does not save), so storage that
    changed since is followed; between saves the manager holds no reference to its tensors.
    resume() loads with distckpt.torch.load (strict has torch's meaning; a fresh optimizer's
    state is made). Not with a local tier (local_dir): resume raises DistckptError there.
    Collective calls, on every rank alike.
    """

    def __init__(self, comm, state, mesh=None, placements=None, layouts=None, check_replicas=True, **config):
        where = "distckpt.torch.CheckpointManager"
        _dc._comm_arg(where, comm)
        config = _by_type(where, state, config)
        self._torch_state = (comm, state, mesh, placements, layouts)
        self._check = bool(check_replicas) and comm.size > 1
        self._raised = None

        def settings():
            _comm_and_mesh(where, comm, mesh)
            if config.get("local_dir"):
                raise TypeError(f"{where}: a local tier (local_dir) is not supported with a torch state yet")
        # The first walk: a state that cannot be saved raises its TypeError here.
        _, walk, gathered = walked(comm, state, mesh, placements, layouts, self._check, before=settings)
        self._sd = _dc.StateDict(comm, {})
        # Agreed by the native manager's creation, which follows.
        _dc._agreed(_dc._comm_arg(where, comm),
                    lambda: self._refill(Resolved(comm, mesh, walk, gathered, self._check)))
        self._key = config.get("enc_key")
        super().__init__(comm, self._sd, **config)
        self._sd._native._reset()

    @classmethod
    def mmengine(cls, comm, state, work_dir, **config):
        """Collective. As distckpt.CheckpointManager.mmengine, and a best checkpoint holds
        what MMEngine's _save_best_checkpoint saves: the state's top-level entries that are
        neither an optimizer nor an LR scheduler (best_prefixes, unless given)."""
        given = dict(config)
        if given.get("best_prefixes") is None:
            given["best_prefixes"] = _keys_except(state, optimizers=True, schedulers=True)
        return super().mmengine(comm, state, work_dir, **given)

    def _refill(self, resolved, prefixes=()):
        self._sd._native._reset()
        # Device tensors: host copies, finished before the save (or save_async) writes them.
        self._sd._fill(self._torch_state[0].size, stage_out(resolved.tensors), resolved.layouts, {}, follow=False)
        self._sd._native._set_info(STATE_KEY, _trimmed(resolved.text, prefixes))

    # The hooks hold the manager weakly: the native manager holds the hooks, and a cycle
    # through C++ would keep the model and its optimizer alive after the manager is dropped.
    def _before_save(self):
        manager = _weakref.ref(self)

        def walk_again(prefixes):
            self = manager()
            try:
                comm, state, mesh, placements, layouts = self._torch_state
                self._refill(state_dict_of(comm, state, mesh, placements, layouts, check_replicas=self._check),
                             prefixes)
            except BaseException as error:
                self._raised = error
                raise
        return walk_again

    def _resume_loader(self):
        comm, state, mesh, placements, layouts = self._torch_state
        manager = _weakref.ref(self)

        def load_state(path):
            self = manager()
            try:
                rename, prefix_map = self._names
                r = load(comm, state, path, strict=self._strict, mesh=mesh, placements=placements, layouts=layouts,
                         key=self._key, rename=rename, prefix_map=prefix_map, allow_unchecked=self._allow_unchecked)
            except BaseException as error:
                self._raised = error
                raise
            return {"step": r.step, "epoch": r.epoch, "info": r.info, "missing": r.missing_keys,
                    "unexpected": r.unexpected_keys, "bytes_read": r.bytes_read, "load_s": r.load_s}
        return load_state

    def _step_call(self, name, step, epoch, metrics, last_arg):
        self._raised = None
        try:
            return super()._step_call(name, step, epoch, metrics, last_arg)
        except _dc.DistckptError:
            raised, self._raised = self._raised, None
            if raised is not None:  # the walk's own error (a TypeError naming a path)
                raise raised from None
            raise
        finally:
            self._sd._native._reset()  # no reference to the state's tensors between saves

    def resume(self, target="", step=-1, epoch=-1, strict=True, fall_back_to_previous=False, verify=True,
               rename=None, prefix_map=None, allow_unchecked=None):
        """Collective. As distckpt.CheckpointManager.resume, loading with distckpt.torch.load:
        strict=True fails on missing and on unexpected entries, naming both; strict=False
        lists them in the result's missing_in_checkpoint and unexpected_in_checkpoint.
        rename and prefix_map as distckpt.torch.load's."""
        w = "distckpt.torch.CheckpointManager.resume"
        self._strict = bool(strict)
        # Checked before a checkpoint is chosen (the load that uses them comes later).
        self._names = _dc._agreed(self._comm_native, lambda: (_name_map_arg(w, "rename", rename),
                                                              _name_map_arg(w, "prefix_map", prefix_map)))
        self._allow_unchecked = allow_unchecked
        self._raised = None
        try:
            return super().resume(target, step, epoch, strict=True, fall_back_to_previous=fall_back_to_previous,
                                  verify=verify, allow_unexpected=True, allow_unchecked=allow_unchecked)
        except _dc.DistckptError:
            raised, self._raised = self._raised, None
            if raised is not None:
                raise raised from None
            raise

    def run(self, loop):
        """As distckpt.CheckpointManager.run: with exception_save, an exception escaping loop()
        is saved (the state walked again first), then raised again, unchanged."""
        try:
            super().run(loop)
        finally:
            self._raised = None
            self._sd._native._reset()
