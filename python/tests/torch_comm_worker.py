"""Processes of a torch.multiprocessing job (gloo, no MPI) that checkpoint through
Comm.from_torch; test_torch_comm.py runs it without MPI's environment:

    python3 torch_comm_worker.py NPROCS ROOT [gone|hung]

NPROCS = 4: save and load (numpy and torch, sharded and replicated), distckpt.torch's
save and load, a CheckpointManager of each layer, async saves (AsyncCheckpointer, and the
manager's async_save), the node-local tier over two pretend nodes (host names rank // 2,
partner copies), Comms over two torch subgroups, and the checkpoints resharded later.
NPROCS = 2: the same on one node, a wrong argument on one rank, and the 4-rank
checkpoints loaded at 2 ranks. "gone", "hung": a peer that leaves, or hangs past the peer
timeout, in the middle of a collective ends the job. Rank 0 prints "time NAME SECONDS" for
each part. Exit status 0 when every process passed; a process that raised fails the job
with its traceback (torch.multiprocessing.spawn's report).
"""
import os
import sys
import time


def split_rows(distckpt, shape, size):
    return distckpt.TensorLayout.from_device_matrix(shape, [size], [0] + [-1] * (len(shape) - 1))


def full(rows, cols, salt):
    import numpy as np
    return ((np.arange(rows * cols, dtype=np.int64) * 7 + salt) % 251).astype(np.float32).reshape(rows, cols)


def save_and_load(distckpt, comm, root):
    """numpy rows and a torch tensor split over the ranks, and a replicated 4 MiB torch
    tensor (its load is read once and sent to the other ranks: transfer())."""
    import numpy as np
    import torch
    rank, size = comm.rank, comm.size
    w_full, b_full = full(4 * size, 5, 1), full(2 * size, 3, 2)
    w = np.ascontiguousarray(w_full[4 * rank:4 * rank + 4])
    b = torch.from_numpy(b_full[2 * rank:2 * rank + 2].copy())
    big = torch.arange(1 << 20, dtype=torch.float32)
    layouts = {"w": split_rows(distckpt, [4 * size, 5], size), "b": split_rows(distckpt, [2 * size, 3], size)}
    state = distckpt.StateDict(comm, {"w": w, "b": b, "big": big}, layouts, info={"launcher": "torch"})
    saved = distckpt.save(comm, state, os.path.join(root, "plain"), "s1", step=1)
    assert saved.bytes_written == w_full.nbytes + b_full.nbytes + big.numel() * 4, saved
    w[...] = -1
    b.zero_()
    big.zero_()
    loaded = distckpt.load(comm, state, os.path.join(root, "plain"))
    assert loaded.step == 1 and loaded.info == {"launcher": "torch"}, loaded
    np.testing.assert_array_equal(w, w_full[4 * rank:4 * rank + 4])
    assert torch.equal(b, torch.from_numpy(b_full[2 * rank:2 * rank + 2]))
    assert torch.equal(big, torch.arange(1 << 20, dtype=torch.float32))
    if rank == 0:
        with distckpt.open(saved.path) as r:
            np.testing.assert_array_equal(r.tensor("w"), w_full)
    # The Comm's own collectives, as distckpt.torch uses them.
    got = comm._native._allgather(bytes([rank]) * (rank + 1))
    assert got == [bytes([r]) * (r + 1) for r in range(size)], got
    comm.barrier()


def model_and_optimizer(seed):
    import torch
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    return model, opt


def train(model, opt, steps):
    import torch
    for _ in range(steps):
        opt.zero_grad()
        model(torch.ones(3, 6)).pow(2).sum().backward()
        opt.step()


def torch_layer(distckpt, dt, comm, root):
    """distckpt.torch: save and load (tensor parallel rows of the first layer), and its
    manager with async_save, resumed."""
    import torch
    mesh = dt.Mesh(comm, dp=1, tp=comm.size) if 8 % comm.size == 0 else dt.Mesh(comm, dp=comm.size)
    placements = {"model.0.weight": dt.Shard(0, "tp"), "model.0.bias": dt.Shard(0, "tp")}
    model, opt = model_and_optimizer(0)
    train(model, opt, 2)
    # each rank holds its rows of the layer's weight (torch.chunk of the same full tensor)
    tp = mesh.coordinate(comm.rank)["tp"]
    full_w, full_b = model[0].weight.detach().clone(), model[0].bias.detach().clone()
    model[0].weight = torch.nn.Parameter(torch.chunk(full_w, comm.size)[tp].clone())
    model[0].bias = torch.nn.Parameter(torch.chunk(full_b, comm.size)[tp].clone())
    state = {"model": model, "step": 2}
    dt.save(comm, state, os.path.join(root, "dt"), step=2, mesh=mesh, placements=placements)
    expected = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    state["step"] = 0
    dt.load(comm, state, os.path.join(root, "dt"), mesh=mesh, placements=placements)
    assert state["step"] == 2
    for k, v in model.state_dict().items():
        assert torch.equal(v, expected[k]), k

    model, opt = model_and_optimizer(1)
    state = {"model": model, "optim": opt}
    directory = os.path.join(root, "dt-manager")
    with dt.CheckpointManager(comm, state, directory=directory, save_every_steps=2, async_save=True) as m:
        for step in range(1, 5):
            train(model, opt, 1)
            m.step_end(step)
        m.end(4)
    kept = {k: v.clone() for k, v in model.state_dict().items()}
    fresh, fresh_opt = model_and_optimizer(2)
    with dt.CheckpointManager(comm, {"model": fresh, "optim": fresh_opt}, directory=directory) as m:
        r = m.resume()
    assert r.resumed and r.step == 4, r
    for k, v in fresh.state_dict().items():
        assert torch.equal(v, kept[k]), k


def managers_and_async(distckpt, comm, root):
    """The Python CheckpointManager (periodic saves, retention, resume, an exception save) and an
    AsyncCheckpointer."""
    import numpy as np
    rank, size = comm.rank, comm.size
    mine = np.zeros((2, 3), np.float32)
    state = distckpt.StateDict(comm, {"w": mine}, {"w": split_rows(distckpt, [2 * size, 3], size)})
    directory = os.path.join(root, "manager")
    with distckpt.CheckpointManager(comm, state, directory=directory, name_template="{prefix}-{step}",
                                    save_every_steps=2, keep_max=2) as m:
        for step in range(1, 7):
            mine[...] = step * 10 + rank
            m.step_end(step)
        m.end(6)
    assert [e.name for e in distckpt.list_checkpoints(directory)] == ["ckpt-4", "ckpt-6"]
    mine[...] = 0
    with distckpt.CheckpointManager(comm, state, directory=directory) as m:
        assert m.resume(step=4).step == 4
    assert (mine == 40 + rank).all()

    # An exception on the last rank only, the others already in the manager at the same step
    # (end): saved by all (its allreduce with a timeout meets their blocking ones).
    directory = os.path.join(root, "exception")
    m = distckpt.CheckpointManager(comm, state, directory=directory, exception_save=True, save_every_steps=100)

    def loop():
        for step in range(1, 4):
            m.step_end(step)
        if rank == size - 1:
            raise ValueError("the loss went to NaN")
        out = m.end(3)
        assert out.stop and out.exception_rank == size - 1, out

    try:
        m.run(loop)
    except ValueError:
        assert rank == size - 1
    m.close()
    assert any(e.name.endswith("_exception") for e in distckpt.list_checkpoints(directory))

    with distckpt.AsyncCheckpointer(comm, staging_bytes=1 << 20) as ckpt:
        mine[...] = rank
        ckpt.save_async(state, os.path.join(root, "async"), "a1", step=1)
        mine[...] = -1  # the save has its copy once save_async returned
        assert ckpt.wait().bytes_written == 2 * size * 3 * 4
        ckpt.save_async(state, os.path.join(root, "async"), "a2", step=2)
        ckpt.end()
    if rank == 0:
        with distckpt.open(os.path.join(root, "async", "a1")) as r:
            np.testing.assert_array_equal(r.tensor("w"), np.repeat(np.arange(size, dtype=np.float32), 6).reshape(-1, 3))
        with distckpt.open(os.path.join(root, "async", "a2")) as r:
            assert (r.tensor("w") == -1).all()
    comm.barrier()


def local_tier(distckpt, comm, root):
    """The node-local tier: local saves every step, every second one drained; at two
    pretend nodes their partner copies; a resume from the local tier."""
    import numpy as np
    rank, size = comm.rank, comm.size
    mine = np.zeros((2, 4), np.float32)
    state = distckpt.StateDict(comm, {"w": mine}, {"w": split_rows(distckpt, [2 * size, 4], size)})
    directory = os.path.join(root, "tiered")
    local = os.path.join(root, "local-{host}")
    redundancy = "partner" if size == 4 else "auto"
    with distckpt.CheckpointManager(comm, state, directory=directory, local_dir=local, redundancy=redundancy,
                                    local_every_steps=1, global_every=2, keep_local=2) as m:
        for step in range(1, 6):
            mine[...] = step * 100 + rank
            out = m.step_end(step)
            assert out.saved and out.tier == "local", out
        m.end(5)
    # One local directory per node (its host name): two pretend nodes at 4 ranks.
    hosts = [d for d in os.listdir(root) if d.startswith("local-")]
    assert len(hosts) == (2 if size == 4 else 1), hosts
    mine[...] = 0
    with distckpt.CheckpointManager(comm, state, directory=directory, local_dir=local, redundancy=redundancy,
                                    local_every_steps=1) as m:
        r = m.resume()
    assert r.resumed and r.step == 5, r
    assert (mine == 500 + rank).all()
    comm.barrier()


def reshard_save(distckpt, dt, comm, root):
    """At 4 ranks: the checkpoints the 2-rank run loads."""
    import numpy as np
    import torch
    size, rank = comm.size, comm.rank
    w_full = full(8, 6, 3)
    w = np.ascontiguousarray(w_full[rank * 8 // size:(rank + 1) * 8 // size])
    state = distckpt.StateDict(comm, {"w": w}, {"w": split_rows(distckpt, [8, 6], size)})
    distckpt.save(comm, state, os.path.join(root, "reshard"), "r4", step=4)
    mesh = dt.Mesh(comm, dp=2, tp=2)
    torch.manual_seed(5)
    full_w = torch.randn(8, 4)
    tp = mesh.coordinate(rank)["tp"]
    dt.save(comm, {"w": torch.chunk(full_w, 2)[tp].clone()}, os.path.join(root, "reshard-dt"), step=4, mesh=mesh,
            placements={"w": dt.Shard(0, "tp")})


def reshard_load(distckpt, dt, comm, root):
    """At 2 ranks: the 4-rank checkpoints, onto 2 ranks."""
    import numpy as np
    import torch
    size, rank = comm.size, comm.rank
    w_full = full(8, 6, 3)
    w = np.zeros((8 // size, 6), np.float32)
    state = distckpt.StateDict(comm, {"w": w}, {"w": split_rows(distckpt, [8, 6], size)})
    assert distckpt.load(comm, state, os.path.join(root, "reshard")).step == 4
    np.testing.assert_array_equal(w, w_full[rank * 8 // size:(rank + 1) * 8 // size])
    torch.manual_seed(5)
    full_w = torch.randn(8, 4)
    mesh = dt.Mesh(comm, tp=size)
    state = {"w": torch.zeros(8 // size, 4)}
    dt.load(comm, state, os.path.join(root, "reshard-dt"), mesh=mesh, placements={"w": dt.Shard(0, "tp")})
    assert torch.equal(state["w"], torch.chunk(full_w, size)[rank])


def subgroups(distckpt, comm, root):
    """Comms over torch groups that split the job: ranks {0, 1} and {2, 3}, each pair saving
    and loading on its own (from_torch is called by every process, each with its pair)."""
    import numpy as np
    import torch.distributed as dist
    pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])]  # torch: every process makes every group
    rank = comm.rank
    pair = distckpt.Comm.from_torch(pairs[rank // 2])
    assert (pair.rank, pair.size) == (rank % 2, 2)
    mine = np.full((1, 3), float(rank), np.float32)
    state = distckpt.StateDict(pair, {"w": mine}, {"w": split_rows(distckpt, [2, 3], 2)})
    where = os.path.join(root, f"pair{rank // 2}")
    distckpt.save(pair, state, where, "p", step=1)
    mine[...] = 0
    distckpt.load(pair, state, where)
    assert (mine == rank).all()
    with distckpt.AsyncCheckpointer(pair, staging_bytes=1 << 20) as ckpt:  # its duplicates: every process again
        ckpt.save_async(state, where, "q", step=2)
        ckpt.end()
    pair.close()
    # Groups that overlap without being the same: refused on every process, none left waiting.
    try:
        distckpt.Comm.from_torch(pairs[0] if rank < 2 else None)
    except distckpt.DistckptError as error:
        assert "do not split the job into disjoint groups" in str(error), error
    else:
        raise AssertionError("Comm.from_torch took groups {0, 1} and {0, 1, 2, 3}")
    comm.barrier()


def argument_errors(distckpt, comm):
    """A wrong group on one rank: that rank raises TypeError, the others DistckptError naming
    it, and no process is left waiting."""
    bad = comm.size - 1
    try:
        distckpt.Comm.from_torch("the world" if comm.rank == bad else None)
    except TypeError as error:
        assert comm.rank == bad and "group must be" in str(error), error
    except distckpt.DistckptError as error:
        assert comm.rank != bad and f"rank {bad}" in str(error), error
    else:
        raise AssertionError("Comm.from_torch took a str for a group")
    comm.barrier()


def mpi_initialised():
    """Whether MPI was initialised in this process (MPI_Initialized may be called before MPI_Init)."""
    import ctypes
    import ctypes.util
    name = ctypes.util.find_library("mpi")
    if name is None:
        return False
    flag = ctypes.c_int(0)
    ctypes.CDLL(name).MPI_Initialized(ctypes.byref(flag))
    return bool(flag.value)


def fatal(rank, nprocs, root, how):
    """A peer gone ("gone") or hung ("hung", past a peer timeout of 2 s) in the middle of a
    collective: a transport failure, which ends the survivor (std::abort) after it printed
    its rank and the collective."""
    import resource
    import torch.distributed as dist
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # the abort is expected: no core file
    os.environ["DISTCKPT_PEER_TIMEOUT_S"] = "2"
    dist.init_process_group("gloo", init_method=f"file://{root}/init-{how}", rank=rank, world_size=nprocs)
    import distckpt
    comm = distckpt.Comm.from_torch()
    if rank == 1:
        if how == "hung":
            time.sleep(60)  # ended by spawn once rank 0 failed
        os._exit(0)  # no goodbye
    comm.barrier()
    raise AssertionError("the barrier returned without its peer")


def child(rank, nprocs, root):
    import socket
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    if nprocs == 4:  # two pretend nodes of two ranks each: the node-local tier's partners cross them
        real = socket.gethostname()
        socket.gethostname = lambda: f"{real}-node{rank // 2}"
    dist.init_process_group("gloo", init_method=f"file://{root}/init-{nprocs}", rank=rank, world_size=nprocs)
    import distckpt
    import distckpt.torch as dt
    shared, root = root, os.path.join(root, f"np{nprocs}")  # the reshard's checkpoints are shared
    times = {}
    start = time.perf_counter()
    comm = distckpt.Comm.from_torch()
    times["from_torch"] = time.perf_counter() - start
    assert (comm.rank, comm.size) == (rank, nprocs)
    parts = [("save_and_load", lambda: save_and_load(distckpt, comm, root)),
             ("torch_layer", lambda: torch_layer(distckpt, dt, comm, root)),
             ("managers_and_async", lambda: managers_and_async(distckpt, comm, root)),
             ("local_tier", lambda: local_tier(distckpt, comm, root))]
    if nprocs == 4:
        parts += [("subgroups", lambda: subgroups(distckpt, comm, root)),
                  ("reshard_save", lambda: reshard_save(distckpt, dt, comm, shared))]
    else:
        parts += [("argument_errors", lambda: argument_errors(distckpt, comm)),
                  ("reshard_load", lambda: reshard_load(distckpt, dt, comm, shared))]
    for name, run in parts:
        start = time.perf_counter()
        run()
        times[name] = time.perf_counter() - start
    assert "mpi4py" not in sys.modules and not mpi_initialised(), "MPI was initialised in a torch-launched process"
    comm.close()
    dist.destroy_process_group()
    if rank == 0:
        for name, seconds in times.items():
            print(f"time {name} {seconds:.3f}", flush=True)


def main():
    nprocs, root = int(sys.argv[1]), sys.argv[2]
    import torch.multiprocessing as mp
    os.makedirs(root, exist_ok=True)
    start = time.perf_counter()
    if sys.argv[3:]:
        mp.spawn(fatal, args=(nprocs, root, sys.argv[3]), nprocs=nprocs, join=True)
    else:
        mp.spawn(child, args=(nprocs, root), nprocs=nprocs, join=True)
    print(f"time job {time.perf_counter() - start:.3f}", flush=True)


if __name__ == "__main__":
    main()
