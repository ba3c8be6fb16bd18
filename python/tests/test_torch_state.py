"""distckpt.torch under mpirun (1, 2 and 4 ranks): nested application states with modules,
optimizers and schedulers, saved and loaded as they are; names by path; fresh optimizers;
typed plain values; torch's strictness; storage replaced between saves."""
import math

import pytest

torch = pytest.importorskip("torch")

import distckpt  # noqa: E402
import distckpt.torch as dt  # noqa: E402


def make_model(seed, order="ab"):
    torch.manual_seed(seed)
    layers = {"a": torch.nn.Linear(6, 4), "b": torch.nn.Linear(4, 3)}
    model = torch.nn.Module()
    for name in order:  # the same names, registered in another order
        model.add_module(f"fc_{name}", layers[name])
    model.register_buffer("scale", torch.full((3,), float(seed)))
    return model


def train(model, opt, sched=None, steps=3):
    torch.manual_seed(100)
    for _ in range(steps):
        opt.zero_grad()
        x = torch.randn(5, 6)
        model.fc_b(torch.relu(model.fc_a(x))).pow(2).sum().backward()
        opt.step()
        if sched is not None:
            sched.step()


def two_groups(model, reverse=False):
    groups = [{"params": model.fc_a.parameters(), "lr": 0.01},
              {"params": model.fc_b.parameters(), "lr": 0.003, "weight_decay": 0.1}]
    return groups[::-1] if reverse else groups


OPTIMIZERS = {
    "sgd_momentum": lambda params: torch.optim.SGD(params, lr=0.02, momentum=0.9),
    "adam": lambda params: torch.optim.Adam(params, lr=0.01, betas=(0.8, 0.95)),
    "adamw": lambda params: torch.optim.AdamW(params, lr=0.01),
    "adamw_amsgrad": lambda params: torch.optim.AdamW(params, lr=0.01, amsgrad=True),
}


@pytest.mark.parametrize("kind", sorted(OPTIMIZERS))
def test_model_optimizer_scheduler_into_fresh_objects_built_in_another_order(comm, shared_dir, kind):
    model = make_model(1)
    opt = OPTIMIZERS[kind](two_groups(model))
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    train(model, opt, sched)
    state = {"model": model, "optim": opt, "sched": sched, "step": 3, "meta": {"betas": (0.8, 0.95), 7: "seven"}}
    saved = dt.save(comm, state, shared_dir, step=3)
    assert saved.path.endswith("step-3")

    # A fresh model (other values, modules registered in the other order), a fresh optimizer
    # whose state is still empty, a fresh scheduler, other plain values.
    model2 = make_model(2, order="ba")
    opt2 = OPTIMIZERS[kind](two_groups(model2, reverse=True))  # the groups in the other order too
    sched2 = torch.optim.lr_scheduler.StepLR(opt2, step_size=2, gamma=0.5)
    state2 = {"model": model2, "optim": opt2, "sched": sched2, "step": 0, "meta": {"betas": None, 7: None}}
    result = dt.load(comm, state2, shared_dir)
    assert isinstance(result, dt.LoadResult)
    assert (result.step, result.missing_keys, result.unexpected_keys) == (3, [], [])
    for (n1, t1), (n2, t2) in zip(sorted(model.state_dict().items()), sorted(model2.state_dict().items())):
        assert n1 == n2 and torch.equal(t1, t2), n1
    assert state2["step"] == 3
    assert state2["meta"] == {"betas": (0.8, 0.95), 7: "seven"}  # a tuple stays a tuple, an int key an int
    assert sched2.state_dict() == sched.state_dict()
    # Each group got its own hyper-parameters, matched by its parameters' paths.
    assert [g["lr"] for g in opt2.param_groups] == [g["lr"] for g in opt.param_groups][::-1]
    assert [g["weight_decay"] for g in opt2.param_groups] == [g["weight_decay"] for g in opt.param_groups][::-1]
    assert opt2.param_groups[0]["weight_decay"] == 0.1
    names = {id(p): n for n, p in model.named_parameters()}
    names2 = {n: p for n, p in model2.named_parameters()}
    for p, entries in opt.state.items():
        mine = opt2.state[names2[names[id(p)]]]
        assert sorted(mine) == sorted(entries)
        for k, v in entries.items():
            assert torch.equal(torch.as_tensor(v), torch.as_tensor(mine[k])), k
    # Training goes on identically from both.
    train(model, opt, sched, steps=2)
    train(model2, opt2, sched2, steps=2)
    for (_, t1), (_, t2) in zip(sorted(model.state_dict().items()), sorted(model2.state_dict().items())):
        assert torch.equal(t1, t2)


def test_names_follow_the_tree_and_optimizer_state_names_its_parameter(comm, shared_dir):
    model = make_model(1)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    train(model, opt)
    dt.save(comm, {"model": model, "optim": opt}, shared_dir, name="named")
    names = set(distckpt.open(f"{shared_dir}/named").keys())
    assert {"model.fc_a.weight", "model.scale", "optim.state.model.fc_b.bias.exp_avg",
            "optim.state.model.fc_a.weight.exp_avg_sq"} <= names


def test_storage_replaced_between_saves_is_saved_as_it_is_now(comm, shared_dir):
    model = make_model(1)
    state = {"model": model}
    dt.save(comm, state, shared_dir, name="before")
    model.fc_a.weight.data = torch.full((4, 6), 5.0)  # new storage
    dt.save(comm, state, shared_dir, name="after-data")
    model.double()  # every parameter new, in another dtype
    with torch.no_grad():
        model.fc_b.bias.fill_(-2.0)
    dt.save(comm, state, shared_dir, name="after-double")
    fresh = {"model": make_model(9).double()}
    dt.load(comm, fresh, f"{shared_dir}/after-double")
    assert torch.equal(fresh["model"].fc_a.weight, torch.full((4, 6), 5.0, dtype=torch.float64))
    assert torch.equal(fresh["model"].fc_b.bias, torch.full((3,), -2.0, dtype=torch.float64))
    r = distckpt.open(f"{shared_dir}/after-data")
    assert (r.tensor("model.fc_a.weight") == 5.0).all()


def test_strict_has_load_state_dicts_meaning(comm, shared_dir):
    model = make_model(1)
    dt.save(comm, {"model": model, "epoch": 4}, shared_dir, name="s")
    other = {"model": make_model(2), "extra": torch.zeros(2)}
    before = other["model"].fc_a.weight.clone()
    with pytest.raises(distckpt.MismatchError, match=r"missing \['extra'\], unexpected \['epoch'\]"):
        dt.load(comm, other, f"{shared_dir}/s")
    assert torch.equal(other["model"].fc_a.weight, before)  # nothing changed
    result = dt.load(comm, other, f"{shared_dir}/s", strict=False)
    assert (result.missing_keys, result.unexpected_keys) == (["extra"], ["epoch"])
    assert torch.equal(other["model"].fc_a.weight, model.fc_a.weight)


def test_schedulers_round_trip_and_callables_are_refused(comm, shared_dir):
    def make(kind):
        model = make_model(1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        sched = {
            "StepLR": lambda: torch.optim.lr_scheduler.StepLR(opt, step_size=2),
            "CosineAnnealingLR": lambda: torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=10),
            "LambdaLR": lambda: torch.optim.lr_scheduler.LambdaLR(opt, lambda e: 0.9 ** e),
            "OneCycleLR": lambda: torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.5, total_steps=20),
            "CyclicLR": lambda: torch.optim.lr_scheduler.CyclicLR(opt, base_lr=0.01, max_lr=0.1, step_size_up=3,
                                                                 cycle_momentum=False),
            "SequentialLR": lambda: torch.optim.lr_scheduler.SequentialLR(
                opt, [torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.5, total_steps=20),
                      torch.optim.lr_scheduler.StepLR(opt, step_size=2)], milestones=[2]),
        }[kind]()
        return model, opt, sched
    for kind in ("StepLR", "CosineAnnealingLR", "LambdaLR", "OneCycleLR", "CyclicLR", "SequentialLR"):
        model, opt, sched = make(kind)
        train(model, opt, sched, steps=4)
        dt.save(comm, {"model": model, "optim": opt, "sched": sched}, shared_dir, name=kind)
        model2, opt2, sched2 = make(kind)
        dt.load(comm, {"model": model2, "optim": opt2, "sched": sched2}, f"{shared_dir}/{kind}")
        assert sched2.last_epoch == sched.last_epoch == 4, kind
        assert sched2.get_last_lr() == sched.get_last_lr(), kind
        assert [g["lr"] for g in opt2.param_groups] == [g["lr"] for g in opt.param_groups], kind

    class Holder:  # a state_dict() holding a callable nobody rebuilds
        def state_dict(self):
            return {"fn": math.sqrt}

        def load_state_dict(self, sd):
            pass
    with pytest.raises(TypeError, match=r"'holder\.fn'.*not a plain value"):
        dt.save(comm, {"holder": Holder()}, shared_dir, name="refused")


def test_typed_values_round_trip_exactly():
    values = {"t": (1, 2.5, "x"), "l": [1, [2, None]], "nan": float("nan"), "inf": float("-inf"), "b": b"\x00\xff",
              "ik": {1: "a", 2: (3,)}, "dollar": {"$tuple": 1}, "dtype": torch.bfloat16, "dev": torch.device("cpu"),
              "np": __import__("numpy").int32(7), "big": 2 ** 63 - 1, "neg": -(2 ** 63)}
    back = dt.decode_value(dt.encode_value(values))
    assert type(back["t"]) is tuple and back["t"] == (1, 2.5, "x")
    assert back["l"] == [1, [2, None]] and math.isnan(back["nan"]) and back["inf"] == float("-inf")
    assert back["b"] == b"\x00\xff" and back["ik"] == {1: "a", 2: (3,)} and back["dollar"] == {"$tuple": 1}
    assert back["dtype"] is torch.bfloat16 and back["dev"] == torch.device("cpu")
    assert back["np"] == 7 and type(back["np"]) is int and back["big"] == 2 ** 63 - 1
    with pytest.raises(TypeError, match="does not fit in int64"):
        dt.encode_value({"x": 2 ** 63}, "v")
    with pytest.raises(TypeError, match="not a plain value"):
        dt.encode_value(object())


def test_a_parameter_of_no_module_is_named(comm, shared_dir):
    stray = torch.nn.Parameter(torch.zeros(3))
    opt = torch.optim.SGD([stray], lr=0.1, momentum=0.9)
    with pytest.raises(TypeError, match=r"optimizer 'optim': its parameter 0 belongs to no module"):
        dt.save(comm, {"optim": opt}, shared_dir, name="stray")


def test_split_parameters_and_their_optimizer_state_take_the_layout(comm, shared_dir):
    size, rank = comm.size, comm.rank
    torch.manual_seed(0)
    full = torch.randn(4 * size, 5)
    model = torch.nn.Linear(5, 4 * size, bias=False)
    with torch.no_grad():
        model.weight.copy_(full)
    mine = torch.nn.Linear(5, 4, bias=False)  # this rank's rows
    with torch.no_grad():
        mine.weight.copy_(full[4 * rank:4 * rank + 4])
    layout = distckpt.TensorLayout.from_device_matrix([4 * size, 5], [size], [0, -1])
    opt = torch.optim.Adam(mine.parameters(), lr=0.01)
    mine.weight.grad = torch.ones_like(mine.weight)
    opt.step()
    dt.save(comm, {"model": mine, "optim": opt}, shared_dir, name="split", layouts={"model.weight": layout})
    r = distckpt.open(f"{shared_dir}/split")
    assert r.shape("model.weight") == [4 * size, 5] and r.shape("optim.state.model.weight.exp_avg") == [4 * size, 5]
    # Onto one process, whole.
    whole = torch.nn.Linear(5, 4 * size, bias=False)
    whole_opt = torch.optim.Adam(whole.parameters(), lr=0.01)
    dt.load(comm, {"model": whole, "optim": whole_opt}, f"{shared_dir}/split")
    with torch.no_grad():
        expected = full.clone()
        expected -= 0.01  # Adam's first step moves every element by lr (gradient of ones)
    assert torch.allclose(whole.weight, expected)
    assert torch.equal(whole_opt.state[whole.weight]["exp_avg"], torch.full((4 * size, 5), 0.1))


def test_reader_info_and_set_info_carry_every_value(comm, shared_dir):
    state = distckpt.StateDict(comm, {"w": torch.zeros(2)}, info={"a": 1})
    state.set_info("lr", 0.5)
    state.set_info("tag", "x")
    with pytest.raises(TypeError, match="StateDict.set_info: value must be an int, float, bool or str, not list"):
        state.set_info("bad", [1])
    distckpt.save(comm, state, shared_dir, "info", step=2)
    info = distckpt.open(f"{shared_dir}/info").info
    assert isinstance(info, distckpt.CheckpointInfo)
    assert info.step == 2 and info.info == {"a": 1, "lr": 0.5, "tag": "x"}
    with pytest.raises(distckpt.DistckptError, match="'step_num' = 7 contradicts the save's step 2"):
        distckpt.save(comm, distckpt.StateDict(comm, {}, info={"step_num": 7}), shared_dir, "two-steps", step=2)
    model = make_model(1)
    dt.save(comm, {"model": model}, shared_dir, name="torch-info")
    assert dt.STATE_KEY in distckpt.open(f"{shared_dir}/torch-info").info.info


def test_a_load_that_fails_leaves_a_fresh_optimizer_empty_and_unused_parameters_stateless(comm, shared_dir):
    model = make_model(1)
    model.unused = torch.nn.Linear(2, 2)  # never in the loss: no gradient, no state
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    fresh = torch.optim.Adam(model.parameters(), lr=0.01)
    with pytest.raises(distckpt.NotFoundError):
        dt.load(comm, {"model": model, "optim": fresh}, f"{shared_dir}/nothing-here")
    assert len(fresh.state) == 0
    train(model, opt)
    dt.save(comm, {"model": model, "optim": opt}, shared_dir, name="unused")
    model2 = make_model(1)
    model2.unused = torch.nn.Linear(2, 2)
    opt2 = torch.optim.Adam(model2.parameters(), lr=0.01)
    result = dt.load(comm, {"model": model2, "optim": opt2}, f"{shared_dir}/unused")
    assert (result.missing_keys, result.unexpected_keys) == ([], [])
    assert model2.unused.weight not in opt2.state and len(opt2.state) == len(opt.state) == 4


def test_a_layout_that_names_no_tensor_is_refused(comm, shared_dir):
    layout = distckpt.TensorLayout.replicated([4, 6], comm.size)
    with pytest.raises(TypeError, match=r"name nothing of the state: \['fc_a.weight'\]"):
        dt.save(comm, {"model": make_model(1)}, shared_dir, name="badlayout", layouts={"fc_a.weight": layout})


def test_an_object_whose_state_dict_is_a_copy_gets_the_loaded_values(comm, shared_dir):
    class Ema:  # state_dict() returns clones, as EMA helpers and torch.get_rng_state() do
        def __init__(self, value):
            self.shadow = torch.full((3,), value)

        def state_dict(self):
            return {"shadow": self.shadow.clone(), "decay": 0.9}

        def load_state_dict(self, sd):
            self.shadow = sd["shadow"].clone()
    dt.save(comm, {"ema": Ema(4.0)}, shared_dir, name="ema")
    ema = Ema(0.0)
    dt.load(comm, {"ema": ema}, f"{shared_dir}/ema")
    assert torch.equal(ema.shadow, torch.full((3,), 4.0))


def test_a_state_that_differs_on_one_rank_fails_on_every_rank(comm, shared_dir):
    if comm.size == 1:
        pytest.skip("needs two ranks")
    state = {"w": torch.zeros(2), "odd": (lambda: 0) if comm.rank == 1 else 0}
    if comm.rank == 1:
        with pytest.raises(TypeError, match="'odd' is a callable"):
            dt.save(comm, state, shared_dir, name="differs")
    else:
        with pytest.raises(distckpt.DistckptError, match="rank 1"):
            dt.save(comm, state, shared_dir, name="differs")
    dt.save(comm, {"w": torch.zeros(2), "extra": 1}, shared_dir, name="plain")
    target = {"w": torch.zeros(2)} if comm.rank == 1 else {"w": torch.zeros(2), "extra": 0}
    if comm.rank == 1:
        with pytest.raises(distckpt.MismatchError, match=r"unexpected \['extra'\]"):
            dt.load(comm, target, f"{shared_dir}/plain")
    else:
        with pytest.raises(distckpt.DistckptError, match="rank 1"):
            dt.load(comm, target, f"{shared_dir}/plain")
