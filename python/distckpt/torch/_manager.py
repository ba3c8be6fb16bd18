"""distckpt.torch.CheckpointManager: the manager's policies over an application state."""
import distckpt as _dc

from ._io import STATE_KEY, load, state_dict_of


class CheckpointManager(_dc.CheckpointManager):
    """distckpt.CheckpointManager over an application state, as distckpt.torch.save takes it:

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

    def __init__(self, comm, state, mesh=None, placements=None, layouts=None, **config):
        self._torch_state = (comm, state, mesh, placements, layouts)
        self._raised = None
        # The first walk: a state that cannot be saved raises its TypeError here.
        _, tensors, layout_of, text = state_dict_of(comm, state, mesh, placements, layouts, check_replicas=True)
        self._sd = _dc.StateDict(comm, {})
        # Agreed by the native manager's creation, which follows.
        _dc._agreed(_dc._comm_arg("CheckpointManager", comm), lambda: self._refill(tensors, layout_of, text))
        self._key = config.get("enc_key")
        super().__init__(comm, self._sd, **config)
        self._sd._native._reset()

    def _refill(self, tensors, layout_of, text):
        self._sd._native._reset()
        self._sd._fill(self._torch_state[0].size, tensors, layout_of, {}, follow=False)
        self._sd._native._set_info(STATE_KEY, text)

    def _before_save(self):
        def walk_again():
            try:
                comm, state, mesh, placements, layouts = self._torch_state
                _, tensors, layout_of, text = state_dict_of(comm, state, mesh, placements, layouts,
                                                            check_replicas=True)
                self._refill(tensors, layout_of, text)
            except BaseException as error:
                self._raised = error
                raise
        return walk_again

    def _resume_loader(self):
        comm, state, mesh, placements, layouts = self._torch_state

        def load_state(path):
            try:
                r = load(comm, state, path, strict=self._strict, mesh=mesh, placements=placements, layouts=layouts,
                         key=self._key)
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
            if self._raised is not None:  # the walk's own error (a TypeError naming a path)
                raise self._raised from None
            raise
        finally:
            self._sd._native._reset()  # no reference to the state's tensors between saves

    def resume(self, target="", step=-1, epoch=-1, strict=True, fall_back_to_previous=False, verify=True):
        """Collective. As distckpt.CheckpointManager.resume, loading with distckpt.torch.load:
        strict=True fails on missing and on unexpected entries, naming both; strict=False
        lists them in the result's missing_in_checkpoint and unexpected_in_checkpoint."""
        self._strict = bool(strict)
        self._raised = None
        try:
            return super().resume(target, step, epoch, strict=True, fall_back_to_previous=fall_back_to_previous,
                                  verify=verify, allow_unexpected=True)
        except _dc.DistckptError:
            if self._raised is not None:
                raise self._raised from None
            raise
