"""distckpt.torch at its edges under mpirun (1, 2 and 4 ranks): damaged state trees, names
that collide after a rename, plain values updated in place, per-rank values on another mesh,
a check that fails on one rank only, and the replicas' check turned off."""
import json
import os

import pytest

torch = pytest.importorskip("torch")

import distckpt  # noqa: E402
import distckpt.torch as dt  # noqa: E402


def saved_tree(shared_dir, name):
    with distckpt.open(os.path.join(shared_dir, name)) as r:
        return json.loads(r.info.info[dt.STATE_KEY])


@pytest.mark.parametrize("damage", [
    lambda t: t["tree"]["$dict"][0][1].pop("state"),                      # an object without its state
    lambda t: t["tree"]["$dict"][1].__setitem__(1, {"$list": 5}),         # a list that is not one
    lambda t: t["tree"]["$dict"][1].__setitem__(1, {"$value": {"$bytes": "!!"}}),  # bytes that are not base64
    lambda t: t["tree"]["$dict"][1].__setitem__(1, {"$value": {"$device": "moon:9"}}),
    lambda t: t.__setitem__("version", True),
])
def test_a_damaged_state_tree_is_a_corruption_error(comm, shared_dir, damage):
    torch.manual_seed(0)
    state = {"model": torch.nn.Linear(2, 2), "pos": 3}
    dt.save(comm, state, shared_dir, name="good")
    tree = saved_tree(shared_dir, "good")
    damage(tree)
    # The damaged tree, saved as the info of an otherwise good checkpoint.
    sd = distckpt.StateDict(comm, {"model.weight": state["model"].weight.detach(),
                                   "model.bias": state["model"].bias.detach()})
    sd.set_info(dt.STATE_KEY, json.dumps(tree))
    distckpt.save(comm, sd, shared_dir, "bad")
    before = state["model"].weight.detach().clone()
    with pytest.raises(distckpt.CorruptionError):
        dt.load(comm, state, os.path.join(shared_dir, "bad"))
    assert torch.equal(state["model"].weight, before) and state["pos"] == 3


def test_names_that_collide_after_a_rename_are_refused(comm, shared_dir):
    dt.save(comm, {"a": {"w": torch.ones(2)}, "b": {"w": torch.zeros(2)}}, shared_dir, name="two")
    with pytest.raises(distckpt.MismatchError, match="both map to 'b.w'"):
        dt.load(comm, {"b": {"w": torch.zeros(2)}}, os.path.join(shared_dir, "two"), rename={"a.w": "b.w"})


def test_plain_values_come_back_in_place(comm, shared_dir):
    loader = {"epoch": 2, "position": 17, "order": [3, 1, 2]}
    dt.save(comm, {"loader": loader, "w": torch.ones(2)}, shared_dir, name="values")
    dt.save(comm, {"epoch": 4, "seen": [1, 2]}, shared_dir, name="plain")  # nothing but plain values
    mine = {"epoch": 0, "position": 0, "order": []}
    order = mine["order"]
    dt.load(comm, {"loader": mine, "w": torch.zeros(2)}, os.path.join(shared_dir, "values"))
    assert mine == loader and order is mine["order"]  # the loop's own references see the loaded values
    plain = {"epoch": 0, "seen": []}
    dt.load(comm, plain, os.path.join(shared_dir, "plain"))
    assert plain == {"epoch": 4, "seen": [1, 2]}


def test_per_rank_values_on_another_mesh_are_missing(comm, shared_dir):
    if comm.size < 2:
        pytest.skip("two meshes of one world need 2 ranks or more")
    saved_mesh = dt.Mesh(comm, dp=comm.size, tp=1)
    other_mesh = dt.Mesh(comm, dp=1, tp=comm.size)
    state = {"rng": {"pos": comm.rank}, "step": 3}
    dt.save(comm, state, shared_dir, name="pr", mesh=saved_mesh, placements={"rng": dt.PerRank()})
    target = {"rng": {"pos": -1}, "step": 0}
    with pytest.raises(distckpt.MismatchError, match="rng"):
        dt.load(comm, target, os.path.join(shared_dir, "pr"), mesh=other_mesh, placements={"rng": dt.PerRank()})
    r = dt.load(comm, target, os.path.join(shared_dir, "pr"), strict=False, mesh=other_mesh,
                placements={"rng": dt.PerRank()})
    assert r.missing_keys == ["rng"] and target == {"rng": {"pos": -1}, "step": 3}
    same = {"rng": {"pos": -1}, "step": 0}
    dt.load(comm, same, os.path.join(shared_dir, "pr"), mesh=saved_mesh, placements={"rng": dt.PerRank()})
    assert same == {"rng": {"pos": comm.rank}, "step": 3}


def test_a_check_that_fails_on_one_rank_fails_every_rank(comm, shared_dir):
    if comm.size < 2:
        pytest.skip("needs 2 ranks")
    bad = comm.rank == comm.size - 1
    size = "x" if bad else [2, 3]
    if bad:
        with pytest.raises(TypeError):
            distckpt.TensorLayout.from_local_box(comm, [2 * comm.size, 3], [2 * comm.rank, 0], size)
    else:
        with pytest.raises(distckpt.DistckptError, match=f"rank {comm.size - 1}"):
            distckpt.TensorLayout.from_local_box(comm, [2 * comm.size, 3], [2 * comm.rank, 0], size)
    # A state that cannot be walked on one rank: the manager is not made on any.
    state = {"w": torch.zeros(2), "f": (lambda: 0) if bad else 0}
    with pytest.raises(TypeError if bad else distckpt.DistckptError):
        dt.CheckpointManager(comm, state, directory=shared_dir)


def test_replicas_may_drift_when_the_check_is_off(comm, shared_dir):
    state = {"bn_mean": torch.full((3,), float(comm.rank))}
    if comm.size > 1:
        with pytest.raises(distckpt.MismatchError, match="bn_mean"):
            dt.save(comm, state, shared_dir, name="drift")
    saved = dt.save(comm, state, shared_dir, name="drift", check_replicas=False)
    with distckpt.open(saved.path) as r:
        assert torch.equal(r.to_torch("bn_mean"), torch.zeros(3))  # rank 0's


@pytest.mark.parametrize("fmt", ["native", "ckpt", "safetensors", "hdf5"])
def test_every_format_carries_the_tree(comm, shared_dir, fmt):
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    saved = dt.save(comm, {"model": model, "optim": opt, "meta": {"t": (1, 2), 3: "x"}}, shared_dir,
                    name=f"f-{fmt}", format=fmt)
    fresh = torch.nn.Linear(3, 2)
    fresh_opt = torch.optim.Adam(fresh.parameters(), lr=0.5)
    target = {"model": fresh, "optim": fresh_opt, "meta": {}}
    dt.load(comm, target, saved.path)
    assert torch.equal(fresh.weight, model.weight) and fresh_opt.param_groups[0]["lr"] == 0.1
    assert target["meta"] == {"t": (1, 2), 3: "x"}
    assert torch.equal(fresh_opt.state[fresh.weight]["exp_avg"], opt.state[model.weight]["exp_avg"])


def test_optimizer_state_takes_its_parameters_placement(comm, shared_dir):
    tp = 2 if comm.size % 2 == 0 else 1
    mesh = dt.Mesh(comm, dp=comm.size // tp, tp=tp)
    index = mesh.coordinate(comm.rank)["tp"]
    full = torch.arange(12, dtype=torch.float32).reshape(4, 3)
    layer = torch.nn.Linear(3, 4 // tp, bias=False)
    with torch.no_grad():
        layer.weight.copy_(torch.chunk(full, tp)[index])
    opt = torch.optim.SGD(layer.parameters(), lr=0.1, momentum=0.9)
    layer.weight.grad = torch.ones_like(layer.weight) * (index + 1)
    opt.step()
    placements = {"model.weight": dt.Shard(0, "tp")}
    saved = dt.save(comm, {"model": layer, "optim": opt}, shared_dir, step=1, mesh=mesh, placements=placements)
    with distckpt.open(saved.path) as r:
        momentum = r.to_torch("optim.state.model.weight.momentum_buffer")
    assert list(momentum.shape) == [4, 3]  # the whole, from every tp rank's part
    want = torch.cat([torch.full((4 // tp, 3), float(i + 1)) for i in range(tp)])
    assert torch.equal(momentum, want)


def test_plain_values_that_differ_across_ranks_are_refused_unless_per_rank(comm, shared_dir):
    if comm.size < 2:
        pytest.skip("needs 2 ranks")
    with pytest.raises(distckpt.MismatchError, match=r"plain value 'pos' differs between ranks 0 and 1.*PerRank"):
        dt.save(comm, {"pos": comm.rank, "w": torch.ones(2)}, shared_dir, name="pos")
    with pytest.raises(TypeError, match=r"'tags': a set is not a plain value"):  # a top-level path, no dot
        dt.save(comm, {"tags": {1}}, shared_dir, name="tags")
    dt.save(comm, {"pos": comm.rank, "w": torch.ones(2)}, shared_dir, name="pos", placements={"pos": dt.PerRank()})


def test_stored_values_reads_the_plain_values_without_mpi(comm, shared_dir):
    model = torch.nn.Linear(2, 2)
    torch.manual_seed(0)
    with torch.no_grad():
        model.weight.zero_()
        model.bias.zero_()
    opt = torch.optim.SGD(model.parameters(), lr=0.25)
    saved = dt.save(comm, {"model": model, "optim": opt, "meta": {"t": (1, 2)}, "pos": comm.rank}, shared_dir,
                    name="values", placements={"pos": dt.PerRank()})
    values = dt.stored_values(saved.path)
    assert values["meta"] == {"t": (1, 2)} and values["pos"] == list(range(comm.size))
    assert values["optim.param_groups"][0]["lr"] == 0.25
    assert values["optim.param_groups"][0]["params"] == ["model.weight", "model.bias"]


def test_a_transposed_view_is_saved_and_loaded_in_place(comm, shared_dir):
    base = torch.arange(12, dtype=torch.float32).reshape(4, 3)
    state = {"t": base.t()}  # a transposed view: strides (1, 3)
    dt.save(comm, state, shared_dir, name="strided")
    with distckpt.open(os.path.join(shared_dir, "strided")) as r:
        assert torch.equal(r.to_torch("t"), base.t().contiguous())
    base.zero_()
    dt.load(comm, state, os.path.join(shared_dir, "strided"))
    assert torch.equal(base, torch.arange(12, dtype=torch.float32).reshape(4, 3))  # the view's memory


def test_a_placement_for_an_optimizer_state_path_wins_over_its_parameters(comm, shared_dir):
    torch.manual_seed(0)
    model = torch.nn.Linear(2, 2, bias=False)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model.weight.grad = torch.full((2, 2), float(comm.rank))  # each rank's own momentum
    opt.step()
    with torch.no_grad():
        model.weight.fill_(1.0)  # the parameter itself is replicated and equal
    placements = {"optim.state.model.weight.momentum_buffer": dt.PerRank()}
    saved = dt.save(comm, {"model": model, "optim": opt}, shared_dir, name="own", placements=placements)
    with distckpt.open(saved.path) as r:
        assert r.shape("optim.state.model.weight.momentum_buffer") == [comm.size, 2, 2]
