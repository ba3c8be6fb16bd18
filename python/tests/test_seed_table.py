"""Every row of seed_rows.py holds (under mpirun, 1, 2 and 4 ranks): each seed parameter has
a row, each row's check passes, and docs/seeds.md is what the rows render."""
import inspect
import os
import re

import numpy as np
import pytest

import distckpt
import seed_rows

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_every_seed_parameter_has_a_row():
    named = {(r[0], r[1]) for r in seed_rows.ROWS}
    missing = [(seed, p) for seed, params in seed_rows.SEED_PARAMETERS.items() for p in params if (seed, p) not in named]
    assert not missing, missing
    assert all(r[3] in seed_rows.STATES for r in seed_rows.ROWS)
    assert all(r[4] or r[3] == "exact" for r in seed_rows.ROWS), "a difference or refusal says why"


def _manager(comm, preset, directory, kwargs, state):
    kwargs = {k: (state if v == "STATE" else os.path.join(directory, v) if k == "out_dir" else v)
              for k, v in kwargs.items()}
    if preset == "mindspore":
        return distckpt.CheckpointManager.mindspore(comm, state, directory=directory, **kwargs)
    if preset == "mmengine":
        return distckpt.CheckpointManager.mmengine(comm, state, directory, **kwargs)
    if preset == "plain":
        return distckpt.CheckpointManager(comm, state, directory=directory, **kwargs)
    torch = pytest.importorskip("torch")
    import distckpt.torch as dt
    torch.manual_seed(0)  # replicas equal on every rank
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    app = {"model": model, "optim": opt, "sched": torch.optim.lr_scheduler.StepLR(opt, 1)}
    return dt.CheckpointManager.mmengine(comm, app, directory, **kwargs)


@pytest.mark.parametrize("row", seed_rows.ROWS, ids=[f"{r[0].split()[0]}-{r[1]}" for r in seed_rows.ROWS])
def test_row_holds(row, comm, shared_dir):
    check = row[5]
    kind = check[0]
    if kind == "load":
        for fn in (distckpt.load, distckpt.CheckpointManager.resume):
            params = inspect.signature(fn).parameters
            wanted = [n for n in check[1] if not (fn is distckpt.CheckpointManager.resume and n in ("path", "state",
                                                                                                   "key"))]
            assert all(n in params for n in wanted), (fn.__name__, wanted)
    elif kind == "load_lacks":
        assert check[1] not in inspect.signature(distckpt.load).parameters
    elif kind == "test":
        with open(os.path.join(ROOT, check[1])) as f:
            source = f.read()
        pattern = (r"^TEST(_P|_F)?\(\w+, " + re.escape(check[2]) + r"\)" if check[1].endswith(".cc")
                   else r"^def " + re.escape(check[2]) + r"\(")
        assert re.search(pattern, source, re.M), check
    else:
        state = distckpt.StateDict(comm, {"w": np.ones(4, np.float32)})
        if kind == "accepts":
            _manager(comm, check[1], shared_dir, check[2], state).close()
        else:
            with pytest.raises(check[3], match=check[4]):
                _manager(comm, check[1], shared_dir, check[2], state)


def test_the_committed_table_is_what_the_rows_render():
    with open(os.path.join(ROOT, "docs", "seeds.md")) as f:
        committed = f.read()
    assert committed == seed_rows.render(), ("docs/seeds.md differs from python/tests/seed_rows.py: regenerate it "
                                             "with python3 python/tests/seed_rows.py > docs/seeds.md")
