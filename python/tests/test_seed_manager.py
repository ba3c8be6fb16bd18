"""The seeds' manager from Python under mpirun (1, 2 and 4 ranks): Caffe2's metadata
handler, resume's load filters and renames, MMEngine's published_keys, backend_args,
save_optimizer by type (distckpt.torch) and a regular save at each new best."""
import os

import numpy as np
import pytest

import distckpt


class Caffe2Handler:
    """A handler written for Caffe2: write(epoch) only, its own store of epochs."""

    def __init__(self):
        self.epochs, self.calls, self.accessible, self.resume_from = [], [], True, None

    def set_params(self, db_prefix, db_type, node_names, path_prefix, path_type):
        self.calls.append(("set_params", db_prefix, db_type, len(node_names), path_type))

    def write(self, epoch):
        self.epochs.append(epoch)

    def last_epoch(self, user_epoch=None):
        self.calls.append(("last_epoch", user_epoch))
        return user_epoch if user_epoch is not None else self.resume_from

    def cp_accessible(self, epoch=None):
        return self.accessible

    def report(self, action_name, all_stats):
        (db_name, nanoseconds), = all_stats.items()  # Caffe2's {db_name: duration in ns}
        assert isinstance(nanoseconds, int) and nanoseconds >= 0
        self.calls.append((action_name, os.path.basename(db_name)))


def test_a_caffe2_metadata_handler_is_called_as_job_runner_calls_it(comm, shared_dir):
    w = np.full(4, float(comm.rank), np.float32)
    state = distckpt.StateDict(comm, {"w": w}, {"w": distckpt.TensorLayout.from_device_matrix([4 * comm.size], [comm.size], [0])})
    handler = Caffe2Handler()
    opts = dict(directory=shared_dir, save_every_steps=15, save_every_epochs=1, keep_max=0, save_last=False,
                save_at_start=True, metadata_handler=handler if comm.rank == 0 else None)
    with distckpt.CheckpointManager(comm, state, **opts) as m:
        r = m.resume()  # the handler knows no epoch: a fresh start, with Caffe2's epoch-0 save
        assert not r.resumed and r.saved_at_start
        for epoch in (1, 2, 3):
            if epoch == 2:
                assert m.step_end(15, 1).saved  # a save within an epoch: reported, never written
            handler.accessible = epoch != 2  # rank 0's answer decides for every rank
            out = m.step_end(epoch * 10, epoch, epoch_end=True)
            assert out.saved == (epoch != 2) and bool(out.skipped) == (epoch == 2), out
    comm.barrier()
    if comm.rank == 0:
        assert handler.epochs == [0, 1, 3]
        assert handler.calls[:2] == [("set_params", "ckpt", "native", 1, "posix"), ("last_epoch", None)]
        assert ("checkpoint_save", "ckpt-3_30") in handler.calls and ("checkpoint_save", "ckpt-1_15") in handler.calls
    handler.resume_from, handler.calls = 1, []
    w[...] = -1
    with distckpt.CheckpointManager(comm, state, **opts) as m:
        r = m.resume()
    assert r.resumed and r.step == 10 and (w == comm.rank).all()  # the handler's epoch, not the newest
    if comm.rank == 0:
        # set_params again once resume adopts the series it resumes ("ckpt", not the new run's "ckpt_1")
        assert handler.calls == [("set_params", "ckpt_1", "native", 1, "posix"), ("last_epoch", None),
                                 ("set_params", "ckpt", "native", 1, "posix"), ("checkpoint_load", "ckpt-1_10")]


def test_resume_takes_load_filters_and_renames(comm, shared_dir):
    layout = distckpt.TensorLayout.from_device_matrix([2 * comm.size], [comm.size], [0])
    a, b = np.full(2, 1.0 + comm.rank, np.float32), np.full(2, 2.0, np.float32)
    with distckpt.CheckpointManager(comm, distckpt.StateDict(comm, {"net.a": a, "opt.b": b}, {"net.a": layout, "opt.b": layout}),
                                    directory=shared_dir) as m:
        m.end(1)
    x = np.zeros(2, np.float32)
    state = distckpt.StateDict(comm, {"model.a": x}, {"model.a": layout})
    with distckpt.CheckpointManager(comm, state, directory=shared_dir) as m:
        with pytest.raises(distckpt.MismatchError):
            m.resume()
        r = m.resume(specify_prefix=["net."], prefix_map={"net.": "model."})
        assert r.resumed and (x == 1.0 + comm.rank).all()
        x[...] = 0
        r = m.resume(filter_prefix="opt.", choice_func=lambda name: False, strict=False, prefix_map={"net.": "model."})
        assert r.missing_in_checkpoint == ["model.a"] and (x == 0).all()
        with pytest.raises(TypeError, match="choice_func"):
            m.resume(choice_func=3)


def test_mmengine_options_that_name_keys_and_backends(comm, shared_dir):
    w = np.ones(4, np.float32)
    state = distckpt.StateDict(comm, {"model.w": w, "optim.m": np.zeros(4, np.float32)})
    with distckpt.CheckpointManager.mmengine(comm, state, shared_dir, by_epoch=False, interval=2,
                                             published_keys=["model"], backend_args={}) as m:
        m.step_end(1)
        m.step_end(2)
        m.end(3)
    comm.barrier()
    published = [e for e in os.listdir(shared_dir) if e.endswith(".safetensors")]
    assert len(published) == 1, published
    with distckpt.open(os.path.join(shared_dir, published[0])) as r:
        assert r.keys() == ["model.w"]  # the key "model"'s tensors only
    with pytest.raises(ValueError, match="backend_args"):
        distckpt.CheckpointManager.mmengine(comm, state, shared_dir, backend_args={"backend": "petrel"})
    with pytest.raises(ValueError, match="duplicates"):
        distckpt.CheckpointManager.mmengine(comm, state, shared_dir, published_keys=["model", "model"])
    with pytest.raises(ValueError, match="empty"):
        distckpt.CheckpointManager.mmengine(comm, state, shared_dir, published_keys=[])
    # A key whose value is one tensor: "w" publishes the tensor "w".
    root = os.path.join(shared_dir, "one")
    with distckpt.CheckpointManager.mmengine(comm, distckpt.StateDict(comm, {"w": w}), root, published_keys="w") as m:
        m.end(1)
    comm.barrier()
    assert any(e.endswith(".safetensors") for e in os.listdir(root))
    with pytest.raises(ValueError, match="save_optimizer=False.*save_prefixes"):
        distckpt.CheckpointManager.mmengine(comm, state, shared_dir, save_optimizer=False)
    with pytest.raises(TypeError, match="save_optimizer are MMEngine's"):
        distckpt.CheckpointManager.mindspore(comm, state, directory=shared_dir, save_optimizer=True)


def test_torch_mmengine_best_leaves_out_optimizers_and_saves_a_regular_checkpoint(comm, shared_dir):
    torch = pytest.importorskip("torch")
    import distckpt.torch as dt
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, 2)
    model(torch.ones(4)).sum().backward()
    opt.step()
    state = {"model": model, "optim": opt, "sched": sched}
    acc = {1: 0.1, 2: 0.2, 3: 0.3, 5: 0.2}
    with dt.CheckpointManager.mmengine(comm, state, shared_dir, by_epoch=False, interval=2, save_best="acc") as m:
        for it in range(1, 6):
            m.step_end(it, metrics={"acc": acc[it]} if it in acc else None)
        m.end(5)  # save_last
    comm.barrier()
    names = sorted(e.name for e in distckpt.list_checkpoints(shared_dir))
    # iter_3: MMEngine's regular save at a new best (iter_2 existed); none at 1 (no regular yet).
    assert names == ["best_acc_iter_3", "iter_2", "iter_3", "iter_4", "iter_5"], names
    with distckpt.open(os.path.join(shared_dir, "best_acc_iter_3")) as r:
        assert all(k.startswith("model.") for k in r.keys()), r.keys()
    with distckpt.open(os.path.join(shared_dir, "iter_3")) as r:
        assert any(k.startswith("optim.") for k in r.keys())
    # The best describes only the model: it loads into the model alone, strictly, and into
    # the whole state with strict=False (the optimizer and scheduler listed as missing).
    fresh = torch.nn.Linear(4, 2)
    dt.load(comm, {"model": fresh}, os.path.join(shared_dir, "best_acc_iter_3"))
    assert torch.equal(fresh.weight, model.weight)
    r = dt.load(comm, state, os.path.join(shared_dir, "best_acc_iter_3"), strict=False)
    assert {k.split(".")[0] for k in r.missing_keys} == {"optim", "sched"}, r.missing_keys
    # save_optimizer=False: the regular saves leave the optimizer out, by type.
    root = os.path.join(shared_dir, "no_opt")
    with dt.CheckpointManager.mmengine(comm, state, root, by_epoch=False, interval=1, save_optimizer=False) as m:
        m.step_end(1)
    with distckpt.open(os.path.join(root, "iter_1")) as r:
        assert not any(k.startswith("optim.") for k in r.keys()), r.keys()
    with dt.CheckpointManager.mmengine(comm, state, root, by_epoch=False, interval=1) as m:
        r = m.resume(strict=False)  # the optimizer is not in it: listed, the model loaded
    assert r.resumed and any(k.startswith("optim") for k in r.missing_in_checkpoint), r
    # A top-level tensor is a key too; an optimizer below the top level cannot be left out.
    step_t = torch.tensor(3)
    with dt.CheckpointManager.mmengine(comm, {"model": model, "optim": opt, "n": step_t}, os.path.join(root, "t"),
                                       by_epoch=False, interval=1, save_optimizer=0) as m:
        m.step_end(1)
    with distckpt.open(os.path.join(root, "t", "iter_1")) as r:
        assert "n" in r.keys() and not any(k.startswith("optim.") for k in r.keys()), r.keys()
    with pytest.raises(ValueError, match="below the top level"):
        dt.CheckpointManager.mmengine(comm, {"model": model, "opts": {"main": opt}}, root, save_optimizer=False)
    with pytest.raises(ValueError, match="no optimizer"):
        dt.CheckpointManager.mmengine(comm, {"model": model}, root, save_optimizer=False)
