#!/usr/bin/env python3
"""A PyTorch training job that checkpoints with distckpt, crashes, and resumes.

A two-layer MLP at DP x TP on dp*tp ranks (mpirun -np dp*tp), as train_mlp does in C++:
fc1 is column-parallel (its weight's rows split over the TP axis), fc2 row-parallel (its
weight's columns split), so that each TP group sums its partial outputs with one
allreduce; data parallelism averages the gradients with an allreduce over the DP group
(both through mpi4py). SGD with momentum, the momentum buffers checkpointed beside the
weights (torch tensors, zero-copy). Every tensor is initialised from its global shape and
every batch from the step and the DP index, so the run is the same at any DP x TP and a
fingerprint of the whole model (gathered on rank 0) can be compared across layouts.

    mpirun -np 4 python3 examples/train_torch.py --dp 2 --tp 2 --steps 30 --dir /tmp/t
    ... --crash-at-step 17     the last rank dies at step 17 (after the step's update)
    ... --resume               resumes from the newest checkpoint (any --dp x --tp)

Rank 0 prints "saved step S fingerprint F" after each checkpoint, "restored step S
fingerprint F" after a resume and "final step S fingerprint F" at the end.
"""
import argparse
import hashlib
import os
import sys

import numpy as np
import torch
from mpi4py import MPI

import distckpt

IN, HIDDEN, OUT, BATCH = 32, 64, 16, 8
LR, MOMENTUM = 0.05, 0.9


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dp", type=int, required=True)
    p.add_argument("--tp", type=int, required=True)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--save-every", type=int, default=5)
    p.add_argument("--dir", required=True)
    p.add_argument("--crash-at-step", type=int, default=-1)
    p.add_argument("--resume", action="store_true")
    return p.parse_args()


def global_init(name, shape):
    """A tensor's initial values from its name and global shape only (any layout)."""
    seed = int.from_bytes(hashlib.sha256(name.encode()).digest()[:4], "little")
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float32) * 0.1


def main():
    a = parse()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    world = MPI.COMM_WORLD
    rank, size = world.rank, world.size
    if a.dp * a.tp != size:
        sys.exit(f"train_torch: {size} ranks is not dp x tp = {a.dp} x {a.tp}")
    if HIDDEN % a.tp:
        sys.exit(f"train_torch: --tp must divide {HIDDEN}")
    dp_idx, tp_idx = rank // a.tp, rank % a.tp  # the device matrix [dp, tp], row-major
    tp_comm = world.Split(dp_idx, tp_idx)
    dp_comm = world.Split(tp_idx, dp_idx)
    comm = distckpt.Comm.from_mpi4py(world)

    # name -> (global shape, tensor_map over the device matrix [dp, tp]; 0 names the TP axis)
    specs = {
        "fc1.weight": ([HIDDEN, IN], [0, -1]),  # column-parallel: rows split
        "fc1.bias": ([HIDDEN], [0]),
        "fc2.weight": ([OUT, HIDDEN], [-1, 0]),  # row-parallel: columns split
        "fc2.bias": ([OUT], [-1]),
    }
    layouts, params, momenta = {}, {}, {}
    for name, (shape, tmap) in specs.items():
        layout = distckpt.TensorLayout.from_device_matrix(shape, [a.dp, a.tp], tmap)
        (offset, extent), = layout.boxes_of(rank)
        full = global_init(name, shape)
        index = tuple(slice(o, o + e) for o, e in zip(offset, extent))
        params[name] = full[index].clone().contiguous()
        momenta[name] = torch.zeros_like(params[name])
        layouts[name] = layout
        layouts["momentum." + name] = layout
    tensors = dict(params)
    tensors.update({"momentum." + n: t for n, t in momenta.items()})
    state = distckpt.StateDict(comm, tensors, layouts)

    def fingerprint():
        """sha256 of every full tensor (params and momenta), in name order, on rank 0."""
        pieces = [(n, layouts[n].boxes_of(rank)[0][0], t.numpy().copy()) for n, t in sorted(tensors.items())]
        gathered = world.gather(pieces, root=0)
        if rank != 0:
            return None
        digest = hashlib.sha256()
        for i, (name, _, _) in enumerate(pieces):
            full = np.zeros(layouts[name].global_shape, np.float32)
            for rank_pieces in gathered:
                _, offset, data = rank_pieces[i]
                full[tuple(slice(o, o + e) for o, e in zip(offset, data.shape))] = data
            digest.update(name.encode())
            digest.update(full.tobytes())
        return digest.hexdigest()[:16]

    def report(what, step):
        fp = fingerprint()
        if rank == 0:
            print(f"{what} step {step} fingerprint {fp}", flush=True)

    manager = distckpt.CheckpointManager(comm, state, directory=a.dir, prefix="torch", name_template="{prefix}-{step}",
                                         save_checkpoint_steps=a.save_every, keep_checkpoint_max=3)
    start = 0
    if a.resume:
        r = manager.resume()
        if r["resumed"]:
            start = r["step"]
            report("restored", start)

    for step in range(start + 1, a.steps + 1):
        g = torch.Generator().manual_seed(step * 1000 + dp_idx)
        x = torch.randn(BATCH, IN, generator=g)
        target = torch.randn(BATCH, OUT, generator=g)
        for t in params.values():
            t.requires_grad_(True)
            t.grad = None
        h = torch.relu(x @ params["fc1.weight"].T + params["fc1.bias"])
        y_partial = h @ params["fc2.weight"].T
        y_sum = y_partial.detach().numpy().copy()
        tp_comm.Allreduce(MPI.IN_PLACE, y_sum, op=MPI.SUM)  # the row-parallel layer's sum
        y = torch.from_numpy(y_sum).requires_grad_(True)
        loss = ((y + params["fc2.bias"] - target) ** 2).mean()
        loss.backward()  # d loss / d y, and fc2.bias
        y_partial.backward(y.grad)  # through the sum: each partial gets d loss / d y
        with torch.no_grad():
            for name, t in params.items():
                grad = t.grad.numpy()
                dp_comm.Allreduce(MPI.IN_PLACE, grad, op=MPI.SUM)
                grad /= a.dp
                momenta[name].mul_(MOMENTUM).add_(t.grad)
                t.sub_(LR * momenta[name])
                t.requires_grad_(False)
        if step == a.crash_at_step and rank == size - 1:
            print(f"rank {rank}: crashing at step {step} (simulated failure)", file=sys.stderr, flush=True)
            os._exit(3)
        out = manager.step_end(step, 0)
        if out["saved"]:
            report("saved", step)
    manager.end(a.steps, 0)
    report("final", a.steps)
    manager.close()
    comm.close()
    tp_comm.Free()
    dp_comm.Free()


if __name__ == "__main__":
    main()
