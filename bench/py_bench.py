#!/usr/bin/env python3
"""The Python package against the C++ library on the same workload: what the layer costs.

    python3 bench/py_bench.py --build build [--size 256M] [--dp 2 --tp 2] [--dir /dev/shm/py-bench] [--runs 5]
    python3 bench/py_bench.py --build build --torch --size 1G     # through distckpt.torch
    python3 bench/py_bench.py --build build --launchers           # Comm.from_torch against MPI

A driver (not under MPI) alternates, --runs times, one job of this script's worker under
`mpirun -np dp*tp` (the workload of bench/workload.h generated with vectorised
numpy, outside the timing; one synchronous save through distckpt.save, one load through
distckpt.load into the zeroed arrays, each timed as ckpt_bench times it: after a
barrier, the slowest rank's wall time, with waits that sleep) and one `ckpt_bench --repeat 1` of the same size,
layout and directory. It prints both medians and their ratios (Python / C++), which are
the layer's overhead: the tensors are handed over by address and the GIL is released, so
the bytes move exactly as in C++.

With --launchers the same Python worker runs twice per run instead, under mpirun
(Comm.from_mpi4py) and under torch.multiprocessing with gloo (Comm.from_torch, no MPI), and
the ratios are torch / MPI: what the communicator over torch.distributed costs. There the
timing's barriers and maximum go through each launcher's own transport (mpi4py, or a gloo
group of their own).

With --torch the worker holds the workload as PyTorch holds it: a module tree whose
parameters are the workload's weights (this rank's torch.chunk of each split tensor), and an
AdamW optimizer whose exp_avg and exp_avg_sq are the workload's optimizer tensors. It saves
and loads {"model": model, "optim": optimizer} with distckpt.torch.save / load on a
Mesh(dp, tp) with Shard placements; the walk of state_dict(), the placements' resolution
and the replicas' check are inside the timing.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

HID, FFN, GROUPS = 4096, 1024, 64
LARGE, MEDIUM, SMALL = HID * HID, FFN * HID, GROUPS * (2 * HID + 2 * FFN)
GOLDEN = 0x9E3779B97F4A7C15


def parse_size(text):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(text[:-1]) * units[text[-1].upper()] if text[-1].upper() in units else int(text)


def tensor_list(size):
    """[(name, shape, split_dim)] in WORKLOAD.md's order (split_dim -1: not split)."""
    n = size // 12
    if n < SMALL:
        raise SystemExit(f"py_bench: --size {size} is below the workload's minimum")
    n_large = 2 if n >= 2 * LARGE + SMALL + 4 * MEDIUM else 1 if n >= LARGE + SMALL + 4 * MEDIUM else 0
    rem = n - n_large * LARGE - SMALL
    n_med, rem = rem // MEDIUM, rem % MEDIUM
    fill_rows, fill_small = rem // HID, rem % HID
    params = [(name, [HID, HID]) for name in ["embed.weight", "lm_head.weight"][:n_large]]
    params += [(f"blocks.{j}.weight", [FFN, HID]) for j in range(n_med)]
    if fill_rows:
        params.append(("blocks.fill.weight", [fill_rows, HID]))
    for k in range(GROUPS):
        params += [(f"norms.{k}.weight", [HID]), (f"norms.{k}.bias", [HID]), (f"biases.{k}.in", [FFN]),
                   (f"biases.{k}.out", [FFN])]
    if fill_small:
        params.append(("small.fill", [fill_small]))
    split, two_d = [], 0
    for _, shape in params:
        if len(shape) == 2:
            split.append(two_d % 2)
            two_d += 1
        else:
            split.append(-1)
    out = [(name, shape, s) for (name, shape), s in zip(params, split)]
    for prefix in ("optim.exp_avg.", "optim.exp_avg_sq."):
        out += [(prefix + name, shape, s) for (name, shape), s in zip(params, split)]
    return out


def mix64(z):
    import numpy as np
    with np.errstate(over="ignore"):
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def values(seed, tid, shape, box):
    """The workload's float32 values of `box` (offset, extent) of a tensor, vectorised."""
    import numpy as np
    (offset, extent) = box
    state = int(mix64(np.array([seed ^ (((tid + 1) * GOLDEN) % (1 << 64))], np.uint64))[0])
    if len(shape) == 1:
        index = np.arange(offset[0], offset[0] + extent[0], dtype=np.uint64)
    else:
        rows = np.arange(offset[0], offset[0] + extent[0], dtype=np.uint64)[:, None]
        cols = np.arange(offset[1], offset[1] + extent[1], dtype=np.uint64)[None, :]
        index = rows * np.uint64(shape[1]) + cols
    with np.errstate(over="ignore"):
        z = mix64(np.uint64(state) + (index + np.uint64(1)) * np.uint64(GOLDEN))
    return ((z >> np.uint64(40)).astype(np.float64) * 2.0 ** -23 - 1.0).astype(np.float32)


class MpiWorld:
    """The timing's own collectives over mpi4py's world."""

    def __init__(self):
        from mpi4py import MPI
        self.mpi, self.comm = MPI, MPI.COMM_WORLD

    def wait_all(self):
        quiet_wait(self.comm.Ibarrier())

    def barrier(self):
        self.comm.Barrier()

    def slowest(self, seconds):
        import numpy as np
        elapsed = np.array([seconds])
        quiet_wait(self.comm.Iallreduce(self.mpi.IN_PLACE, elapsed, op=self.mpi.MAX))
        return float(elapsed[0])

    def total(self, n):
        return self.comm.allreduce(n)


class TorchWorld:
    """The same over a gloo group of the timing's own (gloo's waits block, they do not spin)."""

    def __init__(self):
        import torch.distributed as dist
        self.dist, self.group = dist, dist.new_group(backend="gloo")

    def wait_all(self):
        self.dist.barrier(group=self.group)

    barrier = wait_all

    def _reduced(self, value, dtype, op):
        import torch
        t = torch.tensor([value], dtype=dtype)
        self.dist.all_reduce(t, op, group=self.group)
        return t.item()

    def slowest(self, seconds):
        import torch
        return float(self._reduced(seconds, torch.float64, self.dist.ReduceOp.MAX))

    def total(self, n):
        import torch
        return int(self._reduced(n, torch.int64, self.dist.ReduceOp.SUM))


def timer(world):
    """timed(call): call()'s wall time on the slowest rank, started as ckpt_bench starts a phase."""

    def timed(call):
        world.wait_all()
        world.barrier()  # short by now: the ranks leave together, as ckpt_bench's (quiet_mpi.h)
        t0 = time.perf_counter()
        call()
        return world.slowest(time.perf_counter() - t0)
    return timed


def torch_worker(a, world, comm):
    import torch
    import distckpt.torch as dt
    torch.set_num_threads(1)
    state, placements, mesh = torch_state(a, comm)
    timed = timer(world)
    path = os.path.join(a.dir, "py-bench")
    if comm.rank == 0 and os.path.exists(path):
        shutil.rmtree(path)
    world.wait_all()
    save_s = timed(lambda: dt.save(comm, state, a.dir, name="py-bench", mesh=mesh, placements=placements,
                                   update_latest=False))
    tensors = [t for t in state["model"].parameters()] + [v for s in state["optim"].state.values()
                                                           for v in s.values()]
    expected = [t.clone() for t in tensors] if a.verify else None
    with torch.no_grad():
        for t in tensors:
            t.zero_()
    load_s = timed(lambda: dt.load(comm, state, path, mesh=mesh, placements=placements))
    if expected is not None:
        bad = sum(int(not torch.equal(t, e)) for t, e in zip(tensors, expected))
        if world.total(bad) != 0:
            raise SystemExit("py_bench: the load does not match the save")
    world.wait_all()
    if comm.rank == 0:
        shutil.rmtree(path)
        print(json.dumps({"save_s": save_s, "load_s": load_s}), flush=True)
    comm.close()


def quiet_wait(request):
    """Waits for an mpi4py request without taking a core, as ckpt_bench waits (bench/quiet_mpi.h):
    a rank waiting in a blocking collective busy-polls, and on a machine with fewer cores than
    ranks that core is taken from the ranks still saving."""
    pause = 50e-6
    while not request.Test():
        time.sleep(pause)
        pause = min(2 * pause, 2e-3)


def torch_state(a, comm):
    """The workload as a module tree and an AdamW optimizer, and its placements and mesh."""
    import numpy as np
    import torch
    import distckpt.torch as dt
    mesh = dt.Mesh(comm, dp=a.dp, tp=a.tp)
    tp_index = mesh.coordinate(comm.rank)["tp"]
    model, placements, by_name = torch.nn.Module(), {}, {}
    listed = tensor_list(parse_size(a.size))
    for tid, (name, shape, split) in enumerate(listed):
        if name.startswith("optim."):
            continue
        offset, extent = [0] * len(shape), list(shape)
        if split >= 0:  # torch.chunk's part of the split dimension
            size = -(-shape[split] // a.tp)
            offset[split] = min(shape[split], tp_index * size)
            extent[split] = max(0, min(shape[split], offset[split] + size) - offset[split])
            placements[f"model.{name}"] = dt.Shard(split, "tp")
        owner = model
        *path, leaf = name.split(".")
        for part in path:
            if not hasattr(owner, part):
                owner.add_module(part, torch.nn.Module())
            owner = getattr(owner, part)
        local = values(0, tid, shape, (offset, extent)).reshape(extent)
        # Allocated by torch (64-byte aligned, as ckpt_bench places its tensors), not numpy's.
        owner.register_parameter(leaf, torch.nn.Parameter(torch.from_numpy(np.ascontiguousarray(local)).clone()))
        by_name[name] = (getattr(owner, leaf), tid, shape, offset, extent)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    base = len(listed) // 3
    for name, (p, tid, shape, offset, extent) in by_name.items():
        opt.state[p] = {"step": torch.tensor(1.0)}
        for k, key in enumerate(("exp_avg", "exp_avg_sq")):
            local = values(0, tid + (k + 1) * base, shape, (offset, extent)).reshape(extent)
            opt.state[p][key] = torch.from_numpy(np.ascontiguousarray(local)).clone()
    return {"model": model, "optim": opt}, placements, mesh


def spawned(rank, a, init):
    """One process of the worker under torch.multiprocessing (--launchers)."""
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=a.dp * a.tp)
    worker(a)
    dist.destroy_process_group()


def worker(a):
    import numpy as np
    import distckpt
    if a.worker == "torch":
        world, comm = TorchWorld(), distckpt.Comm.from_torch()
    else:
        world = MpiWorld()
        comm = distckpt.Comm.from_mpi4py(world.comm)
    if a.torch:
        return torch_worker(a, world, comm)
    rank, tp, dp = comm.rank, a.tp, a.dp
    tensors, layouts = {}, {}
    for tid, (name, shape, split) in enumerate(tensor_list(parse_size(a.size))):
        if split < 0:
            layout = distckpt.TensorLayout.from_device_matrix(shape, [dp, tp], [-1])
        elif shape[split] % tp == 0:
            layout = distckpt.TensorLayout.from_device_matrix(shape, [dp, tp], [0, -1] if split == 0 else [-1, 0])
        else:  # an irregular split: part i is [i*d/TP, (i+1)*d/TP)
            boxes = []
            for r in range(dp * tp):
                i, d = r % tp, shape[split]
                offset, extent = [0, 0], list(shape)
                offset[split], extent[split] = i * d // tp, (i + 1) * d // tp - i * d // tp
                boxes.append([(offset, extent)])
            layout = distckpt.TensorLayout.from_boxes(shape, boxes)
        box = layout.boxes_of(rank)[0]
        tensors[name] = np.ascontiguousarray(values(0, tid, shape, box).reshape(box[1]))
        layouts[name] = layout
    state = distckpt.StateDict(comm, tensors, layouts)

    timed = timer(world)
    path = os.path.join(a.dir, "py-bench")
    if rank == 0 and os.path.exists(path):
        shutil.rmtree(path)
    world.wait_all()
    save_s = timed(lambda: distckpt.save(comm, state, a.dir, "py-bench", step=0, update_latest=False))
    expected = {n: t.copy() for n, t in tensors.items()} if a.verify else None
    for t in tensors.values():
        t[...] = 0
    load_s = timed(lambda: distckpt.load(comm, state, path))
    if expected is not None:
        bad = sum(int(not np.array_equal(tensors[n], expected[n])) for n in tensors)
        if world.total(bad) != 0:
            raise SystemExit("py_bench: the load does not match the save")
    world.wait_all()
    if rank == 0:
        shutil.rmtree(path)
        print(json.dumps({"save_s": save_s, "load_s": load_s}), flush=True)
    comm.close()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--build", default="build")
    p.add_argument("--size", default="256M")
    p.add_argument("--dp", type=int, default=2)
    p.add_argument("--tp", type=int, default=2)
    p.add_argument("--dir", default="/dev/shm/py-bench")
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--verify", action="store_true", help="check every loaded element (outside the timing)")
    p.add_argument("--torch", action="store_true", help="save and load a module and AdamW through distckpt.torch")
    p.add_argument("--json", action="store_true", help="end with one JSON line: every run's times, medians, ratios")
    p.add_argument("--launchers", action="store_true",
                   help="compare the worker under torch.multiprocessing (Comm.from_torch) with it under mpirun")
    p.add_argument("--worker", choices=["mpi", "torch"], help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker == "mpi":
        return worker(a)
    if a.worker == "torch":  # the processes meet in a file
        import tempfile
        import torch.multiprocessing as mp
        with tempfile.TemporaryDirectory(prefix="py-bench-") as where:
            mp.spawn(spawned, args=(a, f"file://{where}/init"), nprocs=a.dp * a.tp)
        return None
    build = os.path.abspath(a.build)
    env = dict(os.environ, PYTHONPATH=os.path.join(build, "python") + os.pathsep + os.environ.get("PYTHONPATH", ""))
    mpirun = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", str(a.dp * a.tp)]
    args = (["--size", a.size, "--dp", str(a.dp), "--tp", str(a.tp), "--dir", a.dir]
            + (["--verify"] if a.verify else []) + (["--torch"] if a.torch else []))
    me = [sys.executable, os.path.abspath(__file__)]
    if a.launchers:  # the same worker: under torch.multiprocessing, and under mpirun
        names = ("torch", "MPI")
        jobs = (me + ["--worker", "torch"] + args, mpirun + me + ["--worker", "mpi"] + args)
    else:
        names = ("python", "C++")
        jobs = (mpirun + me + ["--worker", "mpi"] + args,
                mpirun + [os.path.join(build, "ckpt_bench"), "--size", a.size, "--dp", str(a.dp), "--tp", str(a.tp),
                          "--dir", os.path.join(a.dir, "cc"), "--repeat", "1", "--json"])
    os.makedirs(a.dir, exist_ok=True)
    times = ({"save_s": [], "load_s": []}, {"save_s": [], "load_s": []})
    for run in range(a.runs):
        got = []
        for job, t in zip(jobs, times):
            out = subprocess.run(job, env=env, capture_output=True, text=True, check=True)
            got.append(json.loads(out.stdout.strip().splitlines()[-1]))
            for k in t:
                t[k].append(got[-1][k])
        print(f"run {run + 1}: " + " | ".join(f"{n} save {g['save_s']:.3f} s load {g['load_s']:.3f} s"
                                              for n, g in zip(names, got)), flush=True)
    shutil.rmtree(os.path.join(a.dir, "cc"), ignore_errors=True)
    med = {k: (statistics.median(times[0][k]), statistics.median(times[1][k])) for k in times[0]}
    what = "distckpt.torch (module + AdamW)" if a.torch else "distckpt (numpy StateDict)"
    print(f"py_bench: {what}, {a.size} at DP{a.dp} x TP{a.tp} in {a.dir}, medians of {a.runs}:")
    for k, (first, second) in med.items():
        print(f"  {k[:-2]}: {names[0]} {first:.3f} s, {names[1]} {second:.3f} s, ratio {first / second:.3f}")
    if a.json:
        keys = ("torch", "mpi") if a.launchers else ("python", "cpp")
        print(json.dumps({"layer": "torch" if a.torch else "numpy", "size": a.size, "dp": a.dp, "tp": a.tp,
                          "dir": a.dir, "runs": a.runs, keys[0]: times[0], keys[1]: times[1],
                          "median_s": {k: {keys[0]: v[0], keys[1]: v[1]} for k, v in med.items()},
                          "ratio": {k[:-2]: v[0] / v[1] for k, v in med.items()}}), flush=True)


if __name__ == "__main__":
    main()
