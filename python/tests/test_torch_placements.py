"""distckpt.torch's placements under mpirun (1, 2 and 4 ranks): named meshes, Shard split as
torch.chunk splits, replicas checked at save, per-rank values, layouts from local boxes,
renames, and the manager over an application state."""
import json
import os

import pytest

torch = pytest.importorskip("torch")
from mpi4py import MPI  # noqa: E402

import distckpt  # noqa: E402
import distckpt.torch as dt  # noqa: E402


def tp_of(size):
    return 2 if size % 2 == 0 else 1


def full_weight(rows=5, cols=3):
    return torch.arange(rows * cols, dtype=torch.float32).reshape(rows, cols)


def local_chunk(full, dim, parts, index):
    chunks = torch.chunk(full, parts, dim=dim)
    if index < len(chunks):
        return chunks[index].clone()
    shape = list(full.shape)
    shape[dim] = 0
    return torch.empty(shape, dtype=full.dtype)


def test_shard_splits_as_torch_chunk_and_loads_onto_another_mesh(comm, shared_dir):
    tp = tp_of(comm.size)
    mesh = dt.Mesh(comm, dp=comm.size // tp, tp=tp)
    me = mesh.coordinate(comm.rank)
    rows = full_weight(5, 3)  # 5 rows over tp=2: chunks of 3 and 2
    cols = full_weight(3, 3)
    state = {"w": local_chunk(rows, 0, tp, me["tp"]), "v": local_chunk(cols, 1, tp, me["tp"]), "bias": torch.ones(3)}
    placements = {"w": dt.Shard(0, "tp"), "v": dt.Shard(1, "tp")}
    dt.save(comm, state, shared_dir, step=1, mesh=mesh, placements=placements)
    with distckpt.open(os.path.join(shared_dir, "step-1")) as r:
        assert r.shape("w") == [5, 3] and r.shape("v") == [3, 3]
        assert torch.equal(r.to_torch("w"), rows) and torch.equal(r.to_torch("v"), cols)

    # Every rank its own row of the whole: Shard(0) over a one-axis mesh of all ranks.
    flat = dt.Mesh(comm, all=comm.size)
    target = {"w": local_chunk(rows, 0, comm.size, comm.rank), "v": torch.zeros(3, 3), "bias": torch.zeros(3)}
    dt.load(comm, target, shared_dir, mesh=flat, placements={"w": dt.Shard(0, "all")})
    assert torch.equal(target["w"], local_chunk(rows, 0, comm.size, comm.rank))
    assert torch.equal(target["v"], cols) and torch.equal(target["bias"], torch.ones(3))


def test_a_local_shape_that_is_not_torch_chunks_is_refused(comm, shared_dir):
    if comm.size < 2:
        pytest.skip("a split needs 2 ranks or more")
    mesh = dt.Mesh(comm, tp=comm.size)
    # torch.chunk(6 rows, 2) gives 3 and 3; a 4 + 2 split is not what Shard means.
    local = torch.zeros(4 if comm.rank == 0 else 2, 2) if comm.size == 2 else torch.zeros(1 + (comm.rank == 0), 2)
    with pytest.raises(TypeError, match="torch.chunk"):
        dt.save(comm, {"w": local}, shared_dir, step=1, mesh=mesh, placements={"w": dt.Shard(0, "tp")})


def test_replicas_that_differ_are_refused_naming_the_tensor_and_two_ranks(comm, shared_dir):
    if comm.size < 2:
        pytest.skip("replicas need 2 ranks or more")
    state = {"same": torch.ones(64), "rng": torch.full((5000,), float(comm.rank))}
    with pytest.raises(distckpt.MismatchError, match=r"'rng' differs between ranks 0 and 1"):
        dt.save(comm, state, shared_dir, step=1)
    assert not os.path.exists(os.path.join(shared_dir, "step-1"))
    # Declared per rank, each rank's own is kept.
    dt.save(comm, state, shared_dir, step=1, placements={"rng": dt.PerRank()})


def test_per_rank_tensors_and_values_come_back_to_their_rank(comm, shared_dir):
    torch.manual_seed(comm.rank)
    rng = torch.get_rng_state()
    state = {"rng": {"torch": rng, "loader": {"epoch": 3, "position": 100 + comm.rank, "order": (comm.rank, 1)}},
             "step": 7}
    dt.save(comm, state, shared_dir, step=7, placements={"rng": dt.PerRank()})
    back = {"rng": {"torch": torch.zeros_like(rng), "loader": {"epoch": 0, "position": 0, "order": (0, 0)}}, "step": 0}
    result = dt.load(comm, back, shared_dir, placements={"rng": dt.PerRank()})
    assert result.missing_keys == [] and result.unexpected_keys == []
    assert torch.equal(back["rng"]["torch"], rng)
    assert back["rng"]["loader"] == {"epoch": 3, "position": 100 + comm.rank, "order": (comm.rank, 1)}
    assert back["step"] == 7

    # At another world size the per-rank entries are missing: strict refuses, lenient lists them.
    if comm.size < 2:
        return
    sub = MPI.COMM_WORLD.Split(comm.rank % 2, comm.rank)
    with distckpt.Comm.from_mpi4py(sub) as half:
        fresh = {"rng": {"torch": torch.zeros_like(rng), "loader": {"epoch": 0, "position": 0, "order": (0, 0)}},
                 "step": 0}
        with pytest.raises(distckpt.MismatchError, match="rng.torch"):
            dt.load(half, fresh, shared_dir, placements={"rng": dt.PerRank()})
        lenient = dt.load(half, fresh, shared_dir, strict=False, placements={"rng": dt.PerRank()})
        assert "rng.torch" in lenient.missing_keys and "rng.loader" in lenient.missing_keys
        assert fresh["step"] == 7 and torch.equal(fresh["rng"]["torch"], torch.zeros_like(rng))
    sub.Free()


def test_layout_from_local_boxes(comm):
    # Rank r holds rows [2r, 2r + 2) of a [2 * size, 3] tensor; the library gathers the rest.
    layout = distckpt.TensorLayout.from_local_box(comm, [2 * comm.size, 3], [2 * comm.rank, 0], [2, 3])
    assert layout.global_shape == [2 * comm.size, 3]
    for r in range(comm.size):
        assert layout.boxes_of(r) == [([2 * r, 0], [2, 3])]
    if comm.size > 1:
        with pytest.raises(ValueError, match="global shape"):
            distckpt.TensorLayout.from_local_box(comm, [2 * comm.size + (comm.rank == comm.size - 1), 3],
                                                 [2 * comm.rank, 0], [2, 3])


class Wrapped(torch.nn.Module):
    """A model inside a wrapper, as DistributedDataParallel holds it (names start "module.")."""

    def __init__(self, inner):
        super().__init__()
        self.module = inner


def test_prefix_map_and_renames_map_stored_names_optimizers_included(comm, shared_dir):
    torch.manual_seed(0)
    inner = torch.nn.Linear(4, 2)
    opt = torch.optim.Adam(inner.parameters(), lr=0.1)
    inner(torch.ones(3, 4)).sum().backward()
    opt.step()
    dt.save(comm, {"model": Wrapped(inner), "optim": opt, "tag": "x"}, shared_dir, step=1)

    bare = torch.nn.Linear(4, 2)
    bare_opt = torch.optim.Adam(bare.parameters(), lr=0.5)
    state = {"model": bare, "optim": bare_opt, "label": ""}
    with pytest.raises(distckpt.MismatchError, match="model.module.weight"):
        dt.load(comm, state, shared_dir)
    dt.load(comm, state, shared_dir, prefix_map={"model.module.": "model."}, rename={"tag": "label"})
    assert torch.equal(bare.weight, inner.weight) and state["label"] == "x"
    assert bare_opt.param_groups[0]["lr"] == 0.1
    assert torch.equal(bare_opt.state[bare.weight]["exp_avg"], opt.state[inner.weight]["exp_avg"])


def test_the_manager_walks_the_state_at_each_save_and_resumes_it(comm, shared_dir):
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    state = {"model": model, "optim": opt, "step": 0}
    with dt.CheckpointManager(comm, state, directory=shared_dir, save_every_steps=2, keep_max=5) as m:
        assert not m.resume().resumed
        for step in range(1, 5):
            model(torch.ones(1, 3)).sum().backward()
            opt.step()
            state["step"] = step
            if step == 3:
                model.weight.data = model.weight.data.clone()  # new storage: followed at the next save
            out = m.step_end(step, metrics={"loss": 1.0 / step})
            assert isinstance(out, distckpt.StepOutcome) and out.saved == (step % 2 == 0)
    with distckpt.open(out.path) as r:
        assert torch.equal(r.to_torch("model.weight"), model.weight.detach())
    if comm.rank == 0:  # every step's metrics, saved or not
        with open(os.path.join(shared_dir, "stats.jsonl")) as f:
            lines = [json.loads(line) for line in f]
        assert [ln["step"] for ln in lines if ln.get("event") == "metrics"] == [1, 2, 3, 4]

    fresh_model = torch.nn.Linear(3, 2)
    fresh_opt = torch.optim.AdamW(fresh_model.parameters(), lr=0.5)
    fresh = {"model": fresh_model, "optim": fresh_opt, "step": 0}
    with dt.CheckpointManager(comm, fresh, directory=shared_dir, save_every_steps=2) as m:
        r = m.resume()
        assert r.resumed and r.step == 4 and fresh["step"] == 4
        assert torch.equal(fresh_model.weight, model.weight)
        assert torch.equal(fresh_opt.state[fresh_model.weight]["exp_avg"], opt.state[model.weight]["exp_avg"])
        assert fresh_opt.param_groups[0]["lr"] == 0.01
    extra = {"model": torch.nn.Linear(3, 2), "step": 0}
    with dt.CheckpointManager(comm, extra, directory=shared_dir, save_every_steps=2) as m:
        with pytest.raises(distckpt.MismatchError, match="unexpected"):
            m.resume()
        r = m.resume(strict=False)
        assert any(k.startswith("optim.") for k in r.unexpected_in_checkpoint)


def test_layout_picture(comm, tmp_path):
    if comm.rank != 0:
        return
    import subprocess
    if "DISTCKPT_BUILD_DIR" not in os.environ:
        pytest.skip("DISTCKPT_BUILD_DIR (set by CTest) names no build with the distckpt tool")
    tool = os.path.join(os.environ["DISTCKPT_BUILD_DIR"], "distckpt")
    svg = tmp_path / "layout.svg"
    subprocess.run([tool, "layout", "--shape", "8,6", "--dev-mat", "2,2", "--tensor-map", "1,-1",
                    "--picture", str(svg)], check=True, capture_output=True)
    text = svg.read_text()
    assert text.startswith("<svg") and "rank 0,1" in text and "dev_mat[0]" in text


def test_the_manager_saves_a_torch_state_in_the_background(comm, shared_dir):
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    state = {"model": model, "optim": opt}
    saved_weights = {}
    with dt.CheckpointManager(comm, state, directory=shared_dir, save_every_steps=2, async_save=True) as m:
        for step in range(1, 5):
            model(torch.ones(1, 3)).sum().backward()
            opt.step()
            out = m.step_end(step)
            if out.saved:
                saved_weights[out.path] = model.weight.detach().clone()
            with torch.no_grad():
                model.weight.add_(100.0)  # changed right after the call returned: the save has its copy
        m.end(4)
    assert len(saved_weights) == 2
    for path, weight in saved_weights.items():
        with distckpt.open(path) as r:
            assert torch.equal(r.to_torch("model.weight"), weight)


def test_an_exception_in_the_loop_is_saved_with_the_state_walked_again(comm, shared_dir):
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    state = {"model": model, "step": 0}
    with dt.CheckpointManager(comm, state, directory=shared_dir, save_every_steps=10, exception_save=True) as m:
        def loop():
            for step in range(1, 4):
                state["step"] = step
                m.step_end(step)
            model.weight.data = torch.full((2, 3), 7.0)  # new storage, after the last step_end
            raise ValueError("the loss went to NaN")
        with pytest.raises(ValueError, match="NaN"):
            m.run(loop)
    saved = [e.name for e in distckpt.list_checkpoints(shared_dir)]
    exception = [n for n in os.listdir(shared_dir) if n.endswith("_exception")]
    assert exception, (saved, os.listdir(shared_dir))
    with distckpt.open(os.path.join(shared_dir, exception[0])) as r:
        assert torch.equal(r.to_torch("model.weight"), torch.full((2, 3), 7.0))
    assert dt.stored_values(os.path.join(shared_dir, exception[0]))["step"] == 3
