"""CheckpointManager (a training loop's policies), AsyncCheckpointer and publish."""
from . import _distckpt
from ._args import _agreed, _bool_arg, _int_arg, _metrics_arg, _names_arg, _path_arg, _str_arg, _type_error
from ._comm import _Closing, _comm_arg, _live_comms
from ._results import ResumeResult, SaveResult, StepOutcome, _from
from ._state import _plain, _state_arg


# CheckpointManager's options: the canonical name, then the names MindSpore's
# CheckpointConfig/ModelCheckpoint and MMEngine's CheckpointHook give it (with how
# their value maps onto ours).
def _keep_all_is_zero(v):  # MMEngine's max_keep_ckpts=-1 keeps every checkpoint: our 0
    return 0 if v is not None and v < 0 else v


def _never_is_zero(v):  # MMEngine's interval=-1 never saves periodically: our 0
    return 0 if v is not None and v < 0 else v


def _none_is_zero(v):  # MindSpore: None or 0 leaves a policy unset (off), never our default
    return 0 if v is None else v


def _as_list(v):
    if v is None:  # MMEngine's default for save_best, rule and the key lists: not set
        return None
    return [v] if isinstance(v, str) else list(v)


def _async_mode(v):  # MindSpore 2.x: async_save=True, "thread" or "process"
    if isinstance(v, str):
        if v == "thread":
            return True
        if v == "process":
            raise ValueError("CheckpointManager: async_save='process' is not supported: distckpt's writer threads "
                             "run in C++ without the GIL, so the thread mode (async_save=True or 'thread') already "
                             "overlaps the write with training; a writer process would copy the state once more")
        raise ValueError(f"CheckpointManager: async_save must be True, False, 'thread' or 'process', not {v!r}")
    return v


def _append_info(v):  # MindSpore's list form: ["epoch_num", "step_num", {"lr": 0.1}]
    if v is None or isinstance(v, dict):
        return v
    if not isinstance(v, (list, tuple)):
        return v  # (refused with the option's type below)
    merged = {}
    for item in v:
        if isinstance(item, dict):
            merged.update(item)
        elif item not in ("epoch_num", "step_num"):  # those two are in every checkpoint's info
            raise ValueError(f"CheckpointManager: append_info's names may be 'epoch_num' and 'step_num' "
                             f"(in every checkpoint anyway), not {item!r}; give other values as a dict")
    return merged


def _published_keys(v):  # MMEngine's published_keys: top-level keys of the state, published at the end
    keys = [v] if isinstance(v, str) else v
    if not isinstance(keys, (list, tuple)) or not all(isinstance(k, str) for k in keys):
        raise TypeError(f"CheckpointManager: published_keys must be a str or a list of str, not {v!r}")
    if len(set(keys)) != len(keys):
        raise ValueError(f"CheckpointManager: published_keys has duplicates: {list(keys)}")
    if not keys:
        raise ValueError("CheckpointManager: published_keys is empty: nothing would be published")
    return [k + "." for k in keys]  # a key's tensors: its dotted names


def _backend_args(v):  # MMEngine's backend_args / file_client_args
    if v is None or (isinstance(v, dict) and not v):
        return None
    raise ValueError(f"CheckpointManager: backend_args {v!r} is not supported: checkpoints are written to file "
                     f"system paths (a mounted store works; upload or upload_command copies each checkpoint "
                     f"elsewhere)")


def _whole_state_only(name):
    def check(v):
        if v is None or v is True:
            return None
        raise ValueError(f"CheckpointManager: {name}=False needs to know which tensors those are, and a StateDict "
                         f"does not say: use save_prefixes (the model's prefixes), or distckpt.torch.CheckpointManager, "
                         f"which leaves out optimizers and LR schedulers by type")
    return check


def _state_dict_native(v):  # MindSpore's saved_network: another StateDict of this rank
    from ._state import StateDict
    if not isinstance(v, StateDict):
        raise TypeError(f"CheckpointManager: saved_network must be a distckpt.StateDict, not {type(v).__name__}")
    return v._native


def _path(v):  # os.PathLike (pathlib.Path) as well as str
    import os
    return os.fspath(v) if isinstance(v, os.PathLike) else v


_OPTIONS = {
    "directory": [], "out_dir": [], "prefix": [], "name_template": [], "filename_tmpl": [],
    "save_every_steps": ["save_checkpoint_steps", "interval"],
    "save_every_seconds": ["save_checkpoint_seconds"],
    "save_every_epochs": [],
    "by_epoch": [], "save_begin": [], "save_last": [],
    "keep_max": ["keep_checkpoint_max", "max_keep_ckpts"],
    "keep_per_n_minutes": ["keep_checkpoint_per_n_minutes"],
    "best_metric": [], "keep_best": [], "save_best": [], "rule": [], "greater_keys": [], "less_keys": [],
    "format": [], "integrated": ["integrated_save"], "remove_redundancy": [], "fsync": [],
    "ckpt_crc_footer": ["crc_check"], "allow_unchecked": [], "steps_per_epoch": [], "save_at_start": [],
    "publish_at_end": [],
    "save_prefixes": [], "best_prefixes": [], "regular_at_best": [], "saved_network": [],
    "publish_only": ["published_keys"], "publish_format": [], "metadata_handler": [],
    "save_optimizer": [], "save_param_scheduler": [], "backend_args": ["file_client_args"],
    "async_save": [], "incremental": [], "exception_save": [], "job_id": [], "on_failure": [], "enc_key": [], "enc_mode": [],
    "append_info": [], "local_dir": [], "redundancy": [], "local_every_steps": [], "global_every": [],
    "keep_local": [], "keep_global": [], "upload": [], "upload_command": [], "upload_queue": [], "upload_wait_s": [],
    "upload_at_end": [],
}
_CONVERT = {"max_keep_ckpts": _keep_all_is_zero, "interval": _never_is_zero,
            "save_checkpoint_steps": _none_is_zero, "save_checkpoint_seconds": _none_is_zero,
            "keep_checkpoint_max": _none_is_zero, "keep_checkpoint_per_n_minutes": _none_is_zero,
            "save_best": _as_list, "rule": _as_list, "greater_keys": _as_list, "less_keys": _as_list,
            "upload_command": _as_list, "directory": _path, "out_dir": _path, "local_dir": _path,
            "async_save": _async_mode, "append_info": _append_info, "published_keys": _published_keys,
            "backend_args": _backend_args, "file_client_args": _backend_args,
            "save_optimizer": _whole_state_only("save_optimizer"),
            "save_param_scheduler": _whole_state_only("save_param_scheduler"),
            "saved_network": _state_dict_native, "metadata_handler": lambda v: None if v is None else _MetadataAdapter(v),
            "save_prefixes": _as_list, "best_prefixes": _as_list, "publish_only": _as_list}
_ALIAS_OF = {alias: name for name, aliases in _OPTIONS.items() for alias in [name] + aliases}
# The names only one seed uses: a preset refuses the other seed's.
_MINDSPORE_NAMES = {"save_checkpoint_steps", "save_checkpoint_seconds", "keep_checkpoint_max",
                    "keep_checkpoint_per_n_minutes", "integrated_save", "crc_check"}
_MMENGINE_NAMES = {"interval", "max_keep_ckpts", "filename_tmpl", "out_dir", "save_best", "rule", "greater_keys",
                   "less_keys", "save_optimizer", "save_param_scheduler", "published_keys", "backend_args",
                   "file_client_args"}


def _with_defaults(defaults, kwargs):
    """kwargs over `defaults` (canonical names): a default gives way to its option under any
    name, except to None under a name where None means "unset" (ours, MMEngine's: the
    preset's default stays); MindSpore's None means "off" and wins."""
    given = {k: v for k, v in kwargs.items() if v is not None or k in _MINDSPORE_NAMES}
    config = {k: v for k, v in defaults.items() if k not in {_ALIAS_OF.get(key, key) for key in given}}
    config.update(given)
    return config


def _given(kwargs, name, default):
    """The value of option `name` as kwargs give it, under any of its names."""
    for key, value in kwargs.items():
        if _ALIAS_OF.get(key) == name:
            return value
    return default


def _mindspore_config(prefix, directory, kwargs):
    """MindSpore's CheckpointConfig and ModelCheckpoint defaults under kwargs, with its value
    mappings (C++ CheckpointConfig::mindspore() holds the same defaults)."""
    import os
    foreign = sorted(set(kwargs) & _MMENGINE_NAMES)
    if foreign:
        raise TypeError(f"CheckpointManager.mindspore: {', '.join(foreign)} are MMEngine's options "
                        f"(use CheckpointManager.mmengine, or our names)")
    steps, seconds = _given(kwargs, "save_every_steps", 1), _given(kwargs, "save_every_seconds", 0)
    keep_max, minutes = _given(kwargs, "keep_max", 5), _given(kwargs, "keep_per_n_minutes", 0)
    for name, value in (("save_checkpoint_steps", steps), ("save_checkpoint_seconds", seconds),
                        ("keep_checkpoint_max", keep_max), ("keep_checkpoint_per_n_minutes", minutes)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0):
            raise ValueError(f"CheckpointManager.mindspore: {name} must be a number >= 0 or None, not {value!r}")
    if not steps and not seconds and not keep_max and not minutes:  # as CheckpointConfig
        raise ValueError("CheckpointManager.mindspore: the save and keep policies can't be all None or 0")
    defaults = {"directory": os.getcwd() if directory is None else directory, "prefix": prefix,
                "save_every_steps": 1, "save_every_seconds": 0, "keep_max": 5, "keep_per_n_minutes": 0,
                "name_template": ("{prefix}-{epoch}_{step_in_epoch}" if _given(kwargs, "steps_per_epoch", 0)
                                  else "{prefix}-{epoch}_{step}"),
                "format": "ckpt", "integrated": True, "ckpt_crc_footer": False, "remove_redundancy": False,
                "save_last": True}
    config = _with_defaults(defaults, kwargs)
    if not (keep_max and keep_max > 0) and not minutes:
        # MindSpore keeps one checkpoint when neither keep policy is set (ours would keep all).
        config = _with_defaults({}, {k: v for k, v in config.items() if _ALIAS_OF.get(k) != "keep_max"})
        config["keep_max"] = 1
    return config


def _mmengine_config(work_dir, kwargs):
    """MMEngine's CheckpointHook defaults under kwargs, with its value mappings (C++
    CheckpointConfig::mmengine() holds the same defaults)."""
    foreign = sorted(set(kwargs) & _MINDSPORE_NAMES)
    if foreign:
        raise TypeError(f"CheckpointManager.mmengine: {', '.join(foreign)} are MindSpore's options "
                        f"(use CheckpointManager.mindspore, or our names)")
    by_epoch = _given(kwargs, "by_epoch", True)
    defaults = {"directory": work_dir, "by_epoch": True, "save_every_steps": 0, "keep_max": 0, "save_last": True,
                "format": "native", "regular_at_best": True}
    if _given(kwargs, "name_template", None) is None:
        defaults["filename_tmpl"] = "epoch_{}.pth" if by_epoch else "iter_{}.pth"
    return _with_defaults(defaults, kwargs)


def _canonical_config(kwargs):
    unknown = sorted(k for k in kwargs if k not in _ALIAS_OF)
    if unknown:
        raise TypeError(f"CheckpointManager: unknown option(s): {', '.join(unknown)}")
    config, given_as = {}, {}
    for key, value in kwargs.items():
        name = _ALIAS_OF[key]
        if name in given_as:
            raise TypeError(f"CheckpointManager: '{given_as[name]}' and '{key}' both set the same option ({name})")
        given_as[name] = key
        value = _CONVERT.get(key, _CONVERT.get(name, lambda v: v))(value)
        if name == "append_info" and value is not None:
            value = {k: _plain(v) for k, v in dict(value).items()}
        if key == "published_keys" and value is not None:
            config["publish_at_end"] = True  # MMEngine publishes after training
        if value is not None:
            config[name] = value
    if config.get("enc_key") is not None and config.get("ckpt_crc_footer") and config.get("format", "ckpt") == "ckpt":
        raise ValueError(f"CheckpointManager: '{given_as['ckpt_crc_footer']}' and '{given_as['enc_key']}' are "
                         "mutually exclusive for .ckpt files, as in MindSpore (an encrypted .ckpt is checked by its "
                         "blocks' tags and distckpt's per-record CRC32Cs)")
    return config


class _MetadataAdapter:
    """Caffe2's metadata_handler as the native manager calls it (rank 0 only): each method
    the handler lacks does what the manager does without one, and each present one is
    called as Caffe2's CheckpointManager and JobRunner call it."""

    def __init__(self, handler):
        for name in ("set_params", "write", "last_epoch", "cp_accessible", "report"):
            method = getattr(handler, name, None)
            if method is not None and not callable(method):
                raise TypeError(f"CheckpointManager: metadata_handler.{name} is not callable")
        self._handler = handler
        self.interrupted = None  # a KeyboardInterrupt (or SystemExit) a method raised

    def _method(self, name):
        method = getattr(self._handler, name, None)
        if method is None:
            return None

        def call(*args, **kwargs):
            try:
                return method(*args, **kwargs)
            except Exception:
                raise
            except BaseException as stop:  # Ctrl-C: kept for the manager call to raise again
                self.interrupted = stop
                raise
        return call

    def set_params(self, directory, prefix, format, hosts):
        method = self._method("set_params")
        if method is not None:  # Caffe2's keywords; path_type names the storage
            method(db_prefix=prefix, db_type=format, node_names=list(hosts), path_prefix=directory,
                   path_type="posix")

    def write(self, epoch, step, path):
        method = self._method("write")
        if method is None:
            return
        import inspect
        extra = {"step": step, "path": path}
        try:
            params = inspect.signature(self._handler.write).parameters
            takes_any = any(p.kind == p.VAR_KEYWORD for p in params.values())
            extra = {k: v for k, v in extra.items() if takes_any or k in params}
        except (TypeError, ValueError):  # no signature (a builtin): Caffe2's call only
            extra = {}
        method(epoch=epoch, **extra)  # Caffe2's write(epoch=epoch), with step and path when it takes them

    def last_epoch(self, user_epoch):
        method = self._method("last_epoch")
        if method is None:
            return user_epoch  # -1: the newest
        epoch = method(user_epoch=None if user_epoch < 0 else user_epoch)
        if epoch is None:
            return None  # no checkpoint to resume from: a fresh start
        if isinstance(epoch, bool) or not hasattr(epoch, "__index__") or epoch.__index__() < 0:
            raise TypeError(f"metadata_handler.last_epoch returned {epoch!r}: an epoch (int >= 0) or None")
        return epoch.__index__()

    def cp_accessible(self):
        method = self._method("cp_accessible")
        return True if method is None else bool(method(None))  # JobRunner asks with epoch=None

    def report(self, action, path, seconds):
        method = self._method("report")
        if method is not None:  # Caffe2's all_stats: {db_name: the operation's time in nanoseconds}
            method(action, {path: int(seconds * 1e9)})


class CheckpointManager(_Closing):
    """The training loop's policies (when to save, what to keep, resume), as the C++
    CheckpointManager. Options take our names and, where they exist, MindSpore's
    (save_checkpoint_steps, keep_checkpoint_max, ...) and MMEngine's (interval,
    max_keep_ckpts, save_best, rule, ...). Collective calls, on every rank alike. With
    async_save on a Comm.from_torch() Comm, creating it makes two gloo groups (collective
    over the whole torch job)."""

    def __init__(self, comm, state, **config):
        where = "CheckpointManager"
        native = _comm_arg(where, comm)
        _agreed(native, lambda: _state_arg(where, state))
        canonical = _agreed(native, lambda: _canonical_config(config))
        self._exception_save = bool(canonical.get("exception_save", False))
        self._handler = canonical.get("metadata_handler")  # its adapter: holds a Ctrl-C it saw
        self._native = _distckpt._Manager(native, state._native, canonical, self._before_save())
        self._comm_native = native  # agrees on resume's arguments
        _live_comms.add(self)  # closed before MPI_Finalize too

    @classmethod
    def mindspore(cls, comm, state, prefix="CKP", directory=None, **config):
        """Collective. A manager with the defaults of MindSpore's CheckpointConfig and
        ModelCheckpoint: a save every step (save_checkpoint_steps=1), keep the newest 5
        (keep_checkpoint_max=5), one integrated .ckpt per save without the CRC footer
        (crc_check=False), remove_redundancy=False, named "CKP-{epoch}_{step_in_epoch}.ckpt"
        when steps_per_epoch (MindSpore's batch_num) is given, else "CKP-{epoch}_{step}.ckpt";
        directory None is the current directory. Options take MindSpore's names and ours; a
        name only MMEngine uses is a TypeError. MindSpore's mappings hold: every save and
        keep policy at 0 (or None) is a ValueError, and neither keep policy set keeps 1."""
        return cls(comm, state, **_mindspore_config(prefix, directory, dict(config)))

    @classmethod
    def mmengine(cls, comm, state, work_dir, **config):
        """Collective. A manager with the defaults of MMEngine's CheckpointHook: interval=-1
        (no periodic save), by_epoch=True, max_keep_ckpts=-1 (keep all), save_last=True,
        names epoch_{} (iter_{} with by_epoch=False), and a regular checkpoint of the step at
        each new best once one exists (regular_at_best). Options take MMEngine's names and
        ours; a name only MindSpore uses is a TypeError. save_optimizer /
        save_param_scheduler=False need distckpt.torch.CheckpointManager (which finds them by
        type; a StateDict does not say which tensors are an optimizer's); published_keys are
        the state's top-level keys (tensor-name prefixes "key."), published at end();
        backend_args may be None or {} only (file system paths)."""
        return cls(comm, state, **_mmengine_config(work_dir, dict(config)))

    def _before_save(self):
        """A callable the native manager runs before each save (None: none); distckpt.torch's
        manager walks its application state there."""
        return None

    def _resume_loader(self):
        """A callable load(path) -> dict that resume uses instead of loading the StateDict
        (None: the StateDict's load); distckpt.torch's manager loads its state there."""
        return None

    def _step_call(self, name, step, epoch, metrics, last_arg):
        # A step call has no agreement of its own (save_after_exception meets a rank that
        # threw in the loop): a wrong argument on one rank ends the manager on every rank,
        # as a tensor that cannot be followed does, and raises here.
        w = f"CheckpointManager.{name}"
        try:
            args = (_int_arg(w, "step", step), _int_arg(w, "epoch", epoch), _metrics_arg(w, metrics), last_arg(w))
        except Exception as error:  # any failed check (OverflowError too)
            self._native.abort_after_error(f"{type(error).__name__}: {error}")
            raise
        # In the caller's order: save_best "auto" takes the first reported.
        args = (args[0], args[1], list(args[2].items()), args[3])
        outcome = getattr(self._native, name)(*args)
        self._raise_handler_interrupt()
        return _from(StepOutcome, outcome)

    def _raise_handler_interrupt(self):
        """A KeyboardInterrupt (or SystemExit) raised in the metadata handler: the native call
        took it for a failed handler call and went on; it is raised here, after the call."""
        handler = getattr(self, "_handler", None)
        if handler is not None and handler.interrupted is not None:
            stop, handler.interrupted = handler.interrupted, None
            raise stop

    def step_end(self, step, epoch=0, metrics=None, epoch_end=False):
        return self._step_call("step_end", step, epoch, metrics, lambda w: _bool_arg(w, "epoch_end", epoch_end))

    def end(self, step, epoch=0, metrics=None, epoch_end=False):
        return self._step_call("end", step, epoch, metrics, lambda w: _bool_arg(w, "epoch_end", epoch_end))

    def save_now(self, step, epoch=0, metrics=None, suffix=""):
        return self._step_call("save_now", step, epoch, metrics, lambda w: _str_arg(w, "suffix", suffix))

    def resume(self, target="", step=-1, epoch=-1, strict=True, fall_back_to_previous=False, verify=True, only=None,
               allow_unexpected=False, rename=None, prefix_map=None, specify_prefix=None, filter_prefix=None,
               choice_func=None, allow_unchecked=None):
        """Collective. Loads the newest committed checkpoint (or `target`, or the newest of
        `step` / ending `epoch`) into the state, verified first; returns a ResumeResult
        (resumed=False on a fresh start). A damaged one raises CorruptionError unless
        fall_back_to_previous, which takes the newest undamaged older one (the passed-over
        paths in `skipped`). `only`: tensor names. strict, allow_unexpected, rename,
        prefix_map, specify_prefix, filter_prefix, choice_func and allow_unchecked as
        distckpt.load (MindSpore's load_checkpoint arguments). With a metadata_handler, its
        last_epoch(user_epoch=epoch) chooses the epoch unless target or step is given (None:
        a fresh start)."""
        return self._resume(target, step, epoch, strict, fall_back_to_previous, verify, only, allow_unexpected,
                            rename, prefix_map, specify_prefix, filter_prefix, choice_func, allow_unchecked)

    def _resume(self, target, step, epoch, strict, fall_back_to_previous, verify, only, allow_unexpected, rename,
                prefix_map, specify_prefix, filter_prefix, choice_func, allow_unchecked):
        from ._args import _name_map_arg, _optional_bool_arg
        from ._state import _callable_arg
        w = "CheckpointManager.resume"
        args = _agreed(self._comm_native, lambda: (
            _path_arg(w, "target", target, none_is_empty=True), _int_arg(w, "step", step), _int_arg(w, "epoch", epoch),
            _bool_arg(w, "strict", strict), _bool_arg(w, "fall_back_to_previous", fall_back_to_previous),
            _bool_arg(w, "verify", verify), _names_arg(w, "only", only),
            _bool_arg(w, "allow_unexpected", allow_unexpected)))
        names = _agreed(self._comm_native, lambda: (
            _name_map_arg(w, "rename", rename), _name_map_arg(w, "prefix_map", prefix_map),
            _names_arg(w, "specify_prefix", specify_prefix), _names_arg(w, "filter_prefix", filter_prefix),
            _callable_arg(w, "choice_func", choice_func), _optional_bool_arg(w, "allow_unchecked", allow_unchecked)))
        result = self._native.resume(*args, self._resume_loader(), *names)
        self._raise_handler_interrupt()
        return _from(ResumeResult, result)

    def best_checkpoint(self, metric=""):
        """Collective (every rank calls it): the path of the best checkpoint of `metric`, one of
        save_best's ("": the first). NotFoundError when there is none yet."""
        return self._native.best_checkpoint(_str_arg("CheckpointManager.best_checkpoint", "metric", metric))

    def publish(self, target=""):
        return self._native.publish(_path_arg("CheckpointManager.publish", "target", target, none_is_empty=True))

    @property
    def series_prefix(self):
        return self._native.series_prefix()

    @staticmethod
    def install_signal_handlers():
        """Local, once per process: SIGUSR1 and SIGTERM (what Slurm and mpirun send before
        killing a job) set a flag that the next step_end sees on any rank and turns into a
        breakpoint save on every rank; its result then has "stop": True. Replaces Python's
        handlers of those two signals."""
        _distckpt._install_signal_handlers()

    @staticmethod
    def signal_received():
        return _distckpt._signal_received()

    @staticmethod
    def clear_signal():
        _distckpt._clear_signal()

    def run(self, loop):
        """Runs loop(); with exception_save, an exception escaping it is saved as a
        checkpoint first (CheckpointManager::run's rules), then raised again, unchanged."""
        try:
            loop()
        except BaseException as error:
            if self._exception_save:
                try:
                    self._native.save_after_exception(f"{type(error).__name__}: {error}")
                except Exception as failed:  # the exception save's own failure: reported, never raised
                    import sys
                    print(f"distckpt: exception save failed: {failed}", file=sys.stderr)
            raise


class AsyncCheckpointer(_Closing):
    """Saves in the background: save_async() returns once this rank's share is staged
    (the tensors may change from then on); wait() reports the commit. Needs MPI with
    MPI_THREAD_MULTIPLE (mpi4py's default, and Comm.world()'s), or a Comm.from_torch() Comm,
    for which it makes two gloo groups (collective over the whole torch job then).
    Collective."""

    def __init__(self, comm, staging_bytes=1 << 30, refuse_when_busy=False):
        where = "AsyncCheckpointer"
        self._comm_native = _comm_arg(where, comm)  # agrees on save_async's arguments

        def checked():
            try:  # as before: 1e9, 2**30 / 2, a number read from the environment
                size = int(staging_bytes)
            except (TypeError, ValueError):
                raise _type_error(where, "staging_bytes", "a number of bytes", staging_bytes) from None
            return (_int_arg(where, "staging_bytes", size), _bool_arg(where, "refuse_when_busy", refuse_when_busy))
        self._native = _distckpt._Async(self._comm_native, *_agreed(self._comm_native, checked))
        _live_comms.add(self)

    def save_async(self, state, root, name, step=-1, epoch=-1, format="native", key=None):
        w = "AsyncCheckpointer.save_async"
        args = _agreed(self._comm_native, lambda: (
            _state_arg(w, state), _path_arg(w, "root", root), _str_arg(w, "name", name), _int_arg(w, "step", step),
            _int_arg(w, "epoch", epoch), _str_arg(w, "format", format), key))
        self._native.save_async(*args)

    def wait(self):
        """The save in flight's SaveResult, once committed; raises its failure."""
        return _from(SaveResult, self._native.wait())

    @property
    def in_flight(self):
        return self._native.in_flight()

    def end(self):
        self._native.end()


def publish(src, format="safetensors", only=None, directory="", key=None):
    """Writes the checkpoint `src` as one shareable file (MMEngine's publish_model); returns its path."""
    return _distckpt._publish(_path_arg("publish", "src", src), _str_arg("publish", "format", format),
                              _names_arg("publish", "only", only),
                              _path_arg("publish", "directory", directory, none_is_empty=True), key)
