"""The Python CheckpointManager and AsyncCheckpointer under mpirun (1, 2 and 4 ranks): the
seeds' options by their own names, exception saves, async saves, uploads, fall-back resumes
and signals."""
import json
import os

import numpy as np
import pytest
from mpi4py import MPI

import distckpt


def split_rows(shape, size):
    return distckpt.TensorLayout.from_device_matrix(shape, [size], [0] + [-1] * (len(shape) - 1))


def test_manager_policies_with_mindspore_and_mmengine_names(comm, shared_dir):
    rank, size = comm.rank, comm.size
    w = np.zeros((2 * size, 3), np.float32)
    mine = np.ascontiguousarray(w[2 * rank:2 * rank + 2])
    state = distckpt.StateDict(comm, {"w": mine}, {"w": split_rows([2 * size, 3], size)})
    with pytest.raises(TypeError, match="keep_checkpoint_maxx"):
        distckpt.CheckpointManager(comm, state, directory=shared_dir, keep_checkpoint_maxx=2)
    with pytest.raises(TypeError, match="'keep_checkpoint_max' and 'max_keep_ckpts'"):
        distckpt.CheckpointManager(comm, state, directory=shared_dir, keep_checkpoint_max=2, max_keep_ckpts=3)
    with pytest.raises(distckpt.DistckptError, match="save_every_steps"):
        distckpt.CheckpointManager(comm, state, directory=shared_dir, save_checkpoint_steps=-1)
    root = os.path.join(shared_dir, "ms")
    with distckpt.CheckpointManager(comm, state, directory=root, prefix="net", name_template="{prefix}-{step}",
                                    save_checkpoint_steps=2, keep_checkpoint_max=2, save_best="acc",
                                    rule="greater") as m:
        for step in range(1, 9):
            mine[...] = step
            m.step_end(step, 0, metrics={"acc": 1.0 - abs(step - 4) / 10})
        m.end(8, 0)
        assert os.path.basename(m.best_checkpoint("acc")).startswith("best_acc")
    names = sorted(e.name for e in distckpt.list_checkpoints(root) if not e.name.startswith("best"))
    assert names == ["net-6", "net-8"]
    # MMEngine's max_keep_ckpts=-1 keeps every one.
    root2 = os.path.join(shared_dir, "mm")
    with distckpt.CheckpointManager(comm, state, directory=root2, interval=1, max_keep_ckpts=-1) as m:
        for step in range(1, 5):
            m.step_end(step, 0)
        m.end(4, 0)
    assert len(distckpt.list_checkpoints(root2)) == 4
    # A Comm a manager uses cannot be closed under it; a resume never writes into a
    # read-only array.
    extra = distckpt.Comm.from_mpi4py(MPI.COMM_WORLD)
    ro = np.zeros((2, 3), np.float32)
    ro.flags.writeable = False
    m = distckpt.CheckpointManager(comm=extra, state=distckpt.StateDict(extra, {"w": ro}, {"w": split_rows([2 * size, 3], size)}),
                                   directory=root)
    with pytest.raises(ValueError, match="CheckpointManager"):
        extra.close()
    with pytest.raises(TypeError, match="'w'.*read-only"):
        m.resume()
    m.close()
    extra.close()
    # A new job resumes the newest.
    mine[...] = 0
    with distckpt.CheckpointManager(comm, state, directory=root, prefix="net", name_template="{prefix}-{step}") as m:
        r = m.resume()
    assert r.resumed and r.step == 8
    assert (mine == 8).all()


def test_run_raises_the_loops_exception_unchanged_after_saving_it(comm, shared_dir):
    rank, size = comm.rank, comm.size
    mine = np.full((2, 3), 5.0, np.float32)
    state = distckpt.StateDict(comm, {"w": mine}, {"w": split_rows([2 * size, 3], size)})
    root = os.path.join(shared_dir, "x")
    m = distckpt.CheckpointManager(comm, state, directory=root, exception_save=True, save_checkpoint_steps=100)
    boom = ValueError("boom at step 3")

    def loop():
        for step in range(1, 4):
            m.step_end(step, 0)
        raise boom

    with pytest.raises(ValueError) as raised:
        m.run(loop)
    assert raised.value is boom
    m.close()
    names = [e.name for e in distckpt.list_checkpoints(root)]
    assert any("_exception" in n for n in names), names


def test_async_saves_and_publish(comm, shared_dir):
    rank, size = comm.rank, comm.size
    mine = np.full((2, 4), float(rank), np.float32)
    state = distckpt.StateDict(comm, {"w": mine}, {"w": split_rows([2 * size, 4], size)})
    with distckpt.AsyncCheckpointer(comm, staging_bytes=1 << 20) as ckpt:
        ckpt.save_async(state, shared_dir, "a1", step=1)
        mine[...] = -1  # the tensors may change once save_async returned
        result = ckpt.wait()
        assert result.bytes_written == 2 * size * 4 * 4
        ckpt.save_async(state, shared_dir, "a2", step=2)
        ckpt.end()
        with pytest.raises(distckpt.DistckptError, match="already exists"):
            ckpt.save_async(state, shared_dir, "a1", step=3)
    if rank == 0:
        r = distckpt.open(os.path.join(shared_dir, "a1"))
        np.testing.assert_array_equal(r.tensor("w"), np.repeat(np.arange(size, dtype=np.float32), 8).reshape(2 * size, 4))
        np.testing.assert_array_equal(distckpt.open(os.path.join(shared_dir, "a2")).tensor("w"), -1)
        published = distckpt.publish(os.path.join(shared_dir, "a1"))
        assert published.endswith(".safetensors")
        np.testing.assert_array_equal(distckpt.open(published).tensor("w"), r.tensor("w"))
    comm.barrier()


def test_upload_hook_failures_are_reported_not_raised(comm, shared_dir):
    rank, size = comm.rank, comm.size
    mine = np.zeros((1, 2), np.float32)
    state = distckpt.StateDict(comm, {"w": mine}, {"w": split_rows([size, 2], size)})
    uploaded = []

    def upload(path):
        uploaded.append(os.path.basename(path))
        if path.endswith("-2"):
            raise RuntimeError("the object store said no")

    root = os.path.join(shared_dir, "u")
    with distckpt.CheckpointManager(comm, state, directory=root, name_template="{prefix}-{step}", interval=1,
                                    upload=upload) as m:
        for step in range(1, 4):
            m.step_end(step, 0)
        m.end(3, 0)
    if rank == 0:
        assert uploaded == ["ckpt-1", "ckpt-2", "ckpt-3"]
        with open(os.path.join(root, "stats.jsonl")) as f:
            events = [json.loads(line) for line in f if '"upload"' in line]
        failed = [e for e in events if not e.get("ok", True)]
        assert len(failed) == 1 and "the object store said no" in json.dumps(failed[0])
    comm.barrier()


def test_seed_option_values_mean_what_they_mean_in_the_seeds():
    canonical = distckpt._canonical_config
    # MindSpore: None (or 0) leaves a policy off, so seconds decide and minutes keep.
    assert canonical(dict(save_checkpoint_steps=None, save_checkpoint_seconds=60)) == \
        {"save_every_steps": 0, "save_every_seconds": 60}
    assert canonical(dict(keep_checkpoint_max=None, keep_checkpoint_per_n_minutes=5)) == \
        {"keep_max": 0, "keep_per_n_minutes": 5}
    # MMEngine: interval=-1 never saves periodically, max_keep_ckpts=-1 keeps all, and
    # save_best, rule and the key lists default to None.
    assert canonical(dict(interval=-1, max_keep_ckpts=-1, save_best=None, rule=None, greater_keys=None,
                          less_keys=None)) == {"save_every_steps": 0, "keep_max": 0}
    # MindSpore 2.x: async_save "thread" is ours; "process" is refused, saying why.
    assert canonical(dict(async_save="thread")) == {"async_save": True}
    with pytest.raises(ValueError, match="'process' is not supported.*without the GIL"):
        canonical(dict(async_save="process"))
    # MindSpore's list form of append_info: the counters (in every checkpoint) and dicts of values.
    assert canonical(dict(append_info=["epoch_num", "step_num", {"lr": 0.1}])) == {"append_info": {"lr": 0.1}}
    with pytest.raises(ValueError, match="'loss'"):
        canonical(dict(append_info=["loss"]))


def test_resume_falls_back_past_a_damaged_newest_when_asked(comm, shared_dir):
    size = comm.size
    w = np.zeros((2, 3), np.float32)
    state = distckpt.StateDict(comm, {"w": w}, {"w": split_rows([2 * size, 3], size)})
    config = dict(directory=shared_dir, prefix="run", name_template="{prefix}-{step}", format="safetensors",
                  keep_max=0)
    with distckpt.CheckpointManager(comm, state, **config) as m:
        for step in (1, 2, 3):
            w[...] = step
            m.step_end(step)
    newest = os.path.join(shared_dir, "run-3.safetensors")
    comm.barrier()
    if comm.rank == 0:
        os.truncate(newest, os.path.getsize(newest) // 2)
    comm.barrier()
    with distckpt.CheckpointManager(comm, state, **config) as m:
        with pytest.raises(distckpt.CorruptionError, match="fall_back_to_previous"):
            m.resume()
        resumed = m.resume(fall_back_to_previous=True)
        assert resumed.step == 2 and resumed.skipped == [newest]
        assert (w == 2).all()


def test_a_signal_to_one_rank_is_a_breakpoint_save_on_every_rank(comm, shared_dir):
    import signal
    size = comm.size
    w = np.full((2, 3), comm.rank, np.float32)
    state = distckpt.StateDict(comm, {"w": w}, {"w": split_rows([2 * size, 3], size)})
    previous = {s: signal.getsignal(s) for s in (signal.SIGUSR1, signal.SIGTERM)}
    distckpt.CheckpointManager.install_signal_handlers()
    try:
        with distckpt.CheckpointManager(comm, state, directory=shared_dir, prefix="run", save_every_steps=100) as m:
            assert not m.step_end(1).stop
            if comm.rank == size - 1:
                os.kill(os.getpid(), signal.SIGUSR1)
                assert distckpt.CheckpointManager.signal_received()
            out = m.step_end(2)
            assert out.stop and out.saved and out.path.endswith("_breakpoint")
    finally:
        distckpt.CheckpointManager.clear_signal()
        for s, handler in previous.items():  # the rest of the run keeps its own handlers
            signal.signal(s, handler if handler is not None else signal.SIG_DFL)


def test_metrics_land_in_the_statistics_whatever_the_policies(comm, shared_dir):
    size = comm.size
    state = distckpt.StateDict(comm, {"w": np.zeros((2, 3), np.float32)}, {"w": split_rows([2 * size, 3], size)})
    with distckpt.CheckpointManager(comm, state, directory=shared_dir, save_every_steps=3) as m:
        for step in range(1, 5):
            m.step_end(step, metrics={"loss": 1.0 / step, "bad": float("nan")})
        with pytest.raises(distckpt.DistckptError, match="'step_num' = 9 contradicts the save's step 5"):
            state.set_info("step_num", 9)
            m.save_now(5)
    if comm.rank == 0:
        with open(os.path.join(shared_dir, "stats.jsonl")) as f:
            lines = [json.loads(line) for line in f]
        metrics = [ln for ln in lines if ln.get("event") == "metrics"]
        assert [ln["step"] for ln in metrics] == [1, 2, 3, 4]  # save_now(5) had none
        assert metrics[1]["metrics"] == {"bad": None, "loss": 0.5}
        saves = [ln for ln in lines if "event" not in ln]
        assert saves[0]["step"] == 3 and saves[0]["metrics"]["loss"] == 1.0 / 3


def test_presets_start_from_each_seeds_defaults(comm, shared_dir):
    mindspore, mmengine = distckpt._manager._mindspore_config, distckpt._manager._mmengine_config
    ms = distckpt._canonical_config(mindspore("CKP", shared_dir, {}))
    assert ms == {"directory": shared_dir, "prefix": "CKP", "save_every_steps": 1, "save_every_seconds": 0,
                  "keep_max": 5, "keep_per_n_minutes": 0, "name_template": "{prefix}-{epoch}_{step}", "format": "ckpt",
                  "integrated": True, "ckpt_crc_footer": False, "remove_redundancy": False, "save_last": True}
    named = distckpt._canonical_config(mindspore("CKP", shared_dir, {"steps_per_epoch": 4, "crc_check": True}))
    assert named["name_template"] == "{prefix}-{epoch}_{step_in_epoch}" and named["ckpt_crc_footer"] is True
    # MindSpore's mappings: neither keep policy keeps one; every policy at 0 or None raises.
    assert distckpt._canonical_config(mindspore("CKP", shared_dir, {"keep_checkpoint_max": 0}))["keep_max"] == 1
    with pytest.raises(ValueError, match="can't be all None or 0"):
        mindspore("CKP", shared_dir, {"save_checkpoint_steps": None, "keep_checkpoint_max": 0})
    with pytest.raises(TypeError, match="max_keep_ckpts are MMEngine's"):
        mindspore("CKP", shared_dir, {"max_keep_ckpts": 3})
    mm = distckpt._canonical_config(mmengine(shared_dir, {}))
    assert mm == {"directory": shared_dir, "by_epoch": True, "save_every_steps": 0, "keep_max": 0, "save_last": True,
                  "format": "native", "filename_tmpl": "epoch_{}.pth", "regular_at_best": True}
    iters = distckpt._canonical_config(mmengine(shared_dir, {"by_epoch": False, "interval": 2, "max_keep_ckpts": -1}))
    assert iters["filename_tmpl"] == "iter_{}.pth" and iters["save_every_steps"] == 2 and iters["keep_max"] == 0
    with pytest.raises(TypeError, match="keep_checkpoint_max are MindSpore's"):
        mmengine(shared_dir, {"keep_checkpoint_max": 3})
    # None is MMEngine's "unset": the preset's default stays; MindSpore's None is "off".
    assert distckpt._canonical_config(mmengine(shared_dir, {"filename_tmpl": None}))["filename_tmpl"] == "epoch_{}.pth"
    with pytest.raises(ValueError, match="keep_checkpoint_max must be a number >= 0"):
        mindspore("CKP", shared_dir, {"keep_checkpoint_max": -1})


def test_a_mindspore_preset_names_and_keeps_as_mindspore(comm, shared_dir):
    w = np.full((2, 3), float(comm.rank), np.float32)
    layout = distckpt.TensorLayout.from_device_matrix([2 * comm.size, 3], [comm.size], [0, -1])
    state = distckpt.StateDict(comm, {"w": w}, {"w": layout})
    with distckpt.CheckpointManager.mindspore(comm, state, directory=shared_dir, steps_per_epoch=4) as m:
        for step in range(1, 9):
            m.step_end(step, epoch=(step - 1) // 4 + 1)
        m.end(8, epoch=2)
    comm.barrier()
    names = sorted(e.name for e in distckpt.list_checkpoints(shared_dir))
    assert names == ["CKP-1_4.ckpt", "CKP-2_1.ckpt", "CKP-2_2.ckpt", "CKP-2_3.ckpt", "CKP-2_4.ckpt"], names
    with distckpt.open(os.path.join(shared_dir, "CKP-2_4.ckpt")) as r:  # one integrated file, no CRC footer
        assert r.shape("w") == [2 * comm.size, 3]
    w[...] = -1
    with distckpt.CheckpointManager.mindspore(comm, state, directory=shared_dir, steps_per_epoch=4) as m:
        assert m.resume().step == 8 and (w == comm.rank).all()  # its footer-less files resume
    # choice_func, as MindSpore's load_checkpoint takes it: here it declines the only tensor.
    w[...] = -1
    out = distckpt.load(comm, state, os.path.join(shared_dir, "CKP-2_4.ckpt"), strict=False, allow_unchecked=True,
                        choice_func=lambda name: name != "w")
    assert out.missing_in_checkpoint == ["w"] and (w == -1).all()
    # Without MindSpore's footer our file still carries each chunk's CRC32C: it loads checked.
    out = distckpt.load(comm, state, os.path.join(shared_dir, "CKP-2_4.ckpt"))
    assert not out.warning and (w == comm.rank).all()


def test_step_end_twice_for_one_step_saves_once(comm, shared_dir):
    w = np.ones(4, np.float32)
    state = distckpt.StateDict(comm, {"w": w})
    with distckpt.CheckpointManager(comm, state, directory=shared_dir, save_every_steps=1, keep_max=0) as m:
        assert m.step_end(5).saved and not m.step_end(5).saved  # as MindSpore's and MMEngine's hooks
        assert m.step_end(6).saved
        m.end(6)
    comm.barrier()
    assert sorted(e.name for e in distckpt.list_checkpoints(shared_dir)) == ["ckpt-0_5", "ckpt-0_6"]


def test_save_best_auto_takes_the_first_metric_reported(comm, shared_dir):
    w = np.ones(4, np.float32)
    state = distckpt.StateDict(comm, {"w": w})
    with distckpt.CheckpointManager(comm, state, directory=shared_dir, save_every_steps=0, save_best="auto") as m:
        # "val_loss" comes first here, though "acc" sorts first: MMEngine's auto takes val_loss.
        m.step_end(1, metrics={"val_loss": 0.5, "acc": 0.1})
        m.step_end(2, metrics={"val_loss": 0.4, "acc": 0.0})
        m.end(2)
    comm.barrier()
    best = sorted(e.name for e in distckpt.list_checkpoints(shared_dir) if e.name.startswith("best_"))
    assert best and all(n.startswith("best_val_loss_") for n in best), best
    root = os.path.join(shared_dir, "now")  # save_now keeps the caller's order too
    with distckpt.CheckpointManager(comm, state, directory=root, save_every_steps=0, save_best="auto") as m:
        m.save_now(1, metrics={"val_loss": 0.5, "acc": 0.1})
        m.end(1)
    comm.barrier()
    assert any(e.name.startswith("best_val_loss_") for e in distckpt.list_checkpoints(root))
