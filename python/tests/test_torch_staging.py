"""Staging of device tensors through host buffers (distckpt.torch), run on CPU tensors by the
test-only switch DISTCKPT_TEST_STAGE_CPU=1, which sends them down the staging path: copied out
before a save writes, loaded into host buffers and copied back in place, and, for the manager's
asynchronous saves, copied before step_end returns. CUDA itself runs only where a GPU is."""
import glob
import os

import pytest

import distckpt

torch = pytest.importorskip("torch")
import distckpt.torch as dt  # noqa: E402


@pytest.fixture
def staged(monkeypatch):
    monkeypatch.setenv("DISTCKPT_TEST_STAGE_CPU", "1")
    yield
    dt.release_staging()


def _model(seed):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(6, 4), torch.nn.Linear(4, 2))
    return model, torch.optim.AdamW(model.parameters(), lr=0.01)


def _train(model, opt):
    model(torch.ones(3, 6)).sum().backward()
    opt.step()


def test_a_staged_save_stores_the_same_bytes(comm, shared_dir, monkeypatch):
    model, opt = _model(0)
    _train(model, opt)
    state = {"model": model, "optim": opt}
    dt.save(comm, state, os.path.join(shared_dir, "direct"), name="c")
    monkeypatch.setenv("DISTCKPT_TEST_STAGE_CPU", "1")
    dt.save(comm, state, os.path.join(shared_dir, "staged"), name="c")
    info = dt.staging_info()
    tensor_bytes = sum(p.numel() * p.element_size() for p in model.parameters()) * 3  # weights, exp_avg, exp_avg_sq
    assert info.pinned_bytes == 0 and info.pageable_bytes >= tensor_bytes  # (+ AdamW's step counters)
    comm.barrier()
    files = sorted(glob.glob(os.path.join(shared_dir, "direct", "c", "data*")))
    assert files
    for f in files:
        with open(f, "rb") as a, open(os.path.join(shared_dir, "staged", "c", os.path.basename(f)), "rb") as b:
            assert a.read() == b.read(), f
    dt.release_staging()
    assert dt.staging_info().pageable_bytes == 0


def test_a_staged_load_copies_back_in_place(comm, shared_dir, staged):
    model, opt = _model(1)
    _train(model, opt)
    state = {"model": model, "optim": opt}
    dt.save(comm, state, shared_dir, name="c")
    expected = {n: p.detach().clone() for n, p in model.named_parameters()}
    pointers = {n: p.data_ptr() for n, p in model.named_parameters()}
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(-5.0)
    dt.release_staging()
    dt.load(comm, state, os.path.join(shared_dir, "c"))
    assert dt.staging_info().pageable_bytes > 0  # the load went through host buffers
    for n, p in model.named_parameters():
        assert p.data_ptr() == pointers[n], n  # the model's own memory, not a copy of it
        assert torch.equal(p.detach(), expected[n]), n
    # And the views a tensor may be: a transposed one, loaded back through its strides.
    base = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    dt.save(comm, {"t": base.t()}, shared_dir, name="v")
    base.zero_()
    dt.load(comm, {"t": base.t()}, os.path.join(shared_dir, "v"))
    assert torch.equal(base, torch.arange(6, dtype=torch.float32).reshape(2, 3))


def test_an_async_save_has_its_copy_before_step_end_returns(comm, shared_dir, staged):
    model, opt = _model(2)
    state = {"model": model, "optim": opt}
    saved = {}
    with dt.CheckpointManager(comm, state, directory=shared_dir, save_every_steps=1, async_save=True) as m:
        for step in range(1, 4):
            _train(model, opt)
            out = m.step_end(step)
            assert out.saved
            saved[out.path] = model[0].weight.detach().clone()
            with torch.no_grad():
                model[0].weight.add_(100.0)  # right after the call: the save's copy is already made
        m.end(3)
    for path, weight in saved.items():
        with distckpt.open(path) as r:
            assert torch.equal(r.to_torch("model.0.weight"), weight), path


def test_a_staged_load_refuses_a_view_that_would_write_an_element_twice(comm, shared_dir, staged):
    dt.save(comm, {"t": torch.ones(4, 3)}, shared_dir, name="e")
    target = torch.zeros(1, 3)
    with pytest.raises(TypeError, match=r"'t' has strides \(0, 1\)"):
        dt.load(comm, {"t": target.expand(4, 3)}, os.path.join(shared_dir, "e"))
    assert not target.any()


def test_meta_tensors_and_bad_limits_are_refused(comm, shared_dir):
    with pytest.raises(TypeError, match=r"'model.weight' is a meta tensor"):
        dt.save(comm, {"model": torch.nn.Linear(2, 2, device="meta")}, shared_dir, name="m")
    with pytest.raises(TypeError, match="nbytes"):
        dt.set_pinned_limit(-1)
    with pytest.raises(TypeError, match="nbytes"):
        dt.set_pinned_limit(1.5)
    dt.set_pinned_limit(2 << 30)
    assert dt.staging_info().pinned_limit == 2 << 30
