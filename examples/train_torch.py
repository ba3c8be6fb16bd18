#!/usr/bin/env python3
"""A small GPT trained at DP x TP that checkpoints with distckpt.torch, dies, and resumes.

Megatron-style tensor parallelism over the TP axis: the attention's q, k, v projections and
the MLP's first layer are column-parallel (their output features, and so the attention
heads, split over TP), the attention's output projection and the MLP's second layer are
row-parallel (their input features split), each block summing its partial outputs with one
allreduce. Data parallelism averages the gradients over the DP axis. AdamW, a cosine
learning-rate schedule, each rank's RNG state, no dropout. Every parameter is initialised
from its global shape and every batch from the step, so the run is the same model at any
DP x TP.

Two launchers: under mpirun (or srun) the ranks talk through mpi4py and checkpoint through
Comm.from_mpi4py; under torch's launchers (torchrun, or --spawn N here, which starts N
processes with torch.multiprocessing) they talk through torch.distributed with gloo and
checkpoint through Comm.from_torch, with no MPI. At DP2 x TP2 every sum is over two ranks,
which both add alike, so a run resumed under the other launcher continues bit for bit.

    mpirun -np 4 python3 examples/train_torch.py --dp 2 --tp 2 --steps 30 --dir /tmp/gpt
    python3 examples/train_torch.py --spawn 4 --dp 2 --tp 2 --steps 30 --dir /tmp/gpt
    torchrun --nproc_per_node 4 examples/train_torch.py --dp 2 --tp 2 --steps 30 --dir /tmp/gpt
    ... --crash-at-step 17   the last rank kills itself (SIGKILL) after step 17's update
    ... --resume             resumes from the newest checkpoint, at any --dp x --tp
    ... --resume --reshard   the same on another DP x TP (the RNG states, per rank, are left out)

Rank 0 prints "step S loss L" for every step (L as Python's repr: exact), and "resumed
step S" after a resume.
"""
import argparse
import os
import signal
import tempfile

import torch
import torch.nn.functional as F

VOCAB, HIDDEN, HEADS, SEQ, LAYERS, BATCH = 64, 32, 4, 16, 2, 8


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dp", type=int, required=True)
    p.add_argument("--tp", type=int, required=True)
    p.add_argument("--steps", type=int, default=30, help="train up to this step")
    p.add_argument("--save-every", type=int, default=5)
    p.add_argument("--dir", required=True)
    p.add_argument("--resume", action="store_true")
    p.add_argument("--reshard", action="store_true",
                   help="the checkpoint was saved on another mesh: its per-rank RNG states are left out")
    p.add_argument("--crash-at-step", type=int, default=0)
    p.add_argument("--spawn", type=int, default=0, metavar="N",
                   help="start N processes with torch.multiprocessing (gloo, no MPI) instead of running under mpirun")
    return p.parse_args()


class MpiGroup:
    """A group of ranks over mpi4py."""

    def __init__(self, comm, mpi):
        self.comm, self.size, self.mpi = comm, comm.size, mpi

    def sum_(self, t):  # in place
        self.comm.Allreduce(self.mpi.IN_PLACE, t.numpy())

    def sum(self, x):
        return self.comm.allreduce(x)


class TorchGroup:
    """A group of ranks over torch.distributed."""

    def __init__(self, group, size):
        self.group, self.size = group, size

    def sum_(self, t):
        import torch.distributed as dist
        dist.all_reduce(t, group=self.group)

    def sum(self, x):
        import torch.distributed as dist
        t = torch.tensor([x], dtype=torch.float64)
        dist.all_reduce(t, group=self.group)
        return t.item()


def groups(args):
    """(world rank, world size, this rank's TP group, its DP group, mpi4py's world or None)."""
    under_mpi = any(v in os.environ for v in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"))
    if args.spawn or ("WORLD_SIZE" in os.environ and not under_mpi):
        import torch.distributed as dist
        if not dist.is_initialized():  # torchrun: its environment says where
            dist.init_process_group("gloo")
        rank, size = dist.get_rank(), dist.get_world_size()
        if size != args.dp * args.tp:
            raise SystemExit(f"run {args.dp * args.tp} processes (dp {args.dp} x tp {args.tp}), not {size}")
        # torch: every process makes every group, in the same order
        tp = [dist.new_group([d * args.tp + t for t in range(args.tp)]) for d in range(size // args.tp)]
        dp = [dist.new_group([d * args.tp + t for d in range(size // args.tp)]) for t in range(args.tp)]
        tp_group, dp_group = TorchGroup(tp[rank // args.tp], args.tp), TorchGroup(dp[rank % args.tp], size // args.tp)
        return rank, size, tp_group, dp_group, None
    from mpi4py import MPI  # initialises MPI: only under an MPI launcher
    world = MPI.COMM_WORLD
    if world.size != args.dp * args.tp:
        raise SystemExit(f"run with mpirun -np {args.dp * args.tp} (dp {args.dp} x tp {args.tp})")
    dp_index, tp_index = divmod(world.rank, args.tp)
    tp_group, dp_group = MpiGroup(world.Split(dp_index, tp_index), MPI), MpiGroup(world.Split(tp_index, dp_index), MPI)
    return world.rank, world.size, tp_group, dp_group, world


class Reduce(torch.autograd.Function):
    """Sums over a group in the forward pass (after a row-parallel layer), identity backward."""

    @staticmethod
    def forward(ctx, x, group):
        out = x.contiguous().clone()
        if group.size > 1:
            group.sum_(out)
        return out

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class Gather(torch.autograd.Function):
    """Identity forward (before column-parallel layers), sums the input's gradient backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous().clone()
        if ctx.group.size > 1:
            ctx.group.sum_(grad)
        return grad, None


def init(shape, seed, scale=0.02):
    """A global tensor from its shape and a seed: the same at any layout."""
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale


def split(full, dim, tp, index):
    return torch.chunk(full, tp, dim=dim)[index].clone()


class Block(torch.nn.Module):
    """A transformer block whose heads and MLP columns are split over the TP group."""

    def __init__(self, layer, tp, tp_index, group):
        super().__init__()
        self.group, self.heads = group, HEADS // tp
        self.ln1, self.ln2 = torch.nn.LayerNorm(HIDDEN), torch.nn.LayerNorm(HIDDEN)
        seed = 100 * (layer + 1)
        for i, name in enumerate(["q", "k", "v"]):  # column-parallel: output features split
            self.register_parameter(f"{name}_weight", torch.nn.Parameter(split(init([HIDDEN, HIDDEN], seed + i), 0, tp, tp_index)))
        self.o_weight = torch.nn.Parameter(split(init([HIDDEN, HIDDEN], seed + 3), 1, tp, tp_index))  # row-parallel
        self.o_bias = torch.nn.Parameter(torch.zeros(HIDDEN))
        self.fc1_weight = torch.nn.Parameter(split(init([4 * HIDDEN, HIDDEN], seed + 4), 0, tp, tp_index))
        self.fc1_bias = torch.nn.Parameter(split(torch.zeros(4 * HIDDEN), 0, tp, tp_index))
        self.fc2_weight = torch.nn.Parameter(split(init([HIDDEN, 4 * HIDDEN], seed + 5), 1, tp, tp_index))
        self.fc2_bias = torch.nn.Parameter(torch.zeros(HIDDEN))

    def forward(self, x):
        b, t, _ = x.shape
        h = Gather.apply(self.ln1(x), self.group)
        q, k, v = (F.linear(h, w).view(b, t, self.heads, -1).transpose(1, 2)
                   for w in (self.q_weight, self.k_weight, self.v_weight))
        scores = (q @ k.transpose(-1, -2)) / (q.shape[-1] ** 0.5)
        scores = scores.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
        attn = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, t, -1)
        x = x + Reduce.apply(F.linear(attn, self.o_weight), self.group) + self.o_bias
        h = Gather.apply(self.ln2(x), self.group)
        h = F.gelu(F.linear(h, self.fc1_weight, self.fc1_bias))
        return x + Reduce.apply(F.linear(h, self.fc2_weight), self.group) + self.fc2_bias


class GPT(torch.nn.Module):
    def __init__(self, tp, tp_index, group):
        super().__init__()
        self.tok = torch.nn.Parameter(init([VOCAB, HIDDEN], 1))
        self.pos = torch.nn.Parameter(init([SEQ, HIDDEN], 2))
        self.blocks = torch.nn.ModuleList(Block(i, tp, tp_index, group) for i in range(LAYERS))
        self.ln = torch.nn.LayerNorm(HIDDEN)
        self.head = torch.nn.Parameter(init([VOCAB, HIDDEN], 3))

    def forward(self, tokens):
        x = self.tok[tokens] + self.pos[: tokens.shape[1]]
        for block in self.blocks:
            x = block(x)
        return F.linear(self.ln(x), self.head)

    @staticmethod
    def split_dims():
        """Parameter name -> the dimension split over TP (the rest is replicated)."""
        dims = {}
        for i in range(LAYERS):
            for name, dim in [("q_weight", 0), ("k_weight", 0), ("v_weight", 0), ("o_weight", 1),
                              ("fc1_weight", 0), ("fc1_bias", 0), ("fc2_weight", 1)]:
                dims[f"blocks.{i}.{name}"] = dim
        return dims


class RNGState:
    """This rank's torch RNG state, as a stateful object (state_dict / load_state_dict)."""

    def state_dict(self):
        return {"torch": torch.get_rng_state()}

    def load_state_dict(self, sd):
        torch.set_rng_state(sd["torch"])


def batch(step, dp, dp_index):
    """The step's global batch (the same at any layout), this DP rank's rows of it: sequences
    counting from a random start by a random stride, which the model learns to continue."""
    g = torch.Generator().manual_seed(10_000 + step)
    start, stride = torch.randint(VOCAB, (BATCH, 1), generator=g), torch.randint(1, 4, (BATCH, 1), generator=g)
    tokens = (start + stride * torch.arange(SEQ + 1)) % VOCAB
    rows = torch.chunk(tokens, dp)[dp_index]
    return rows[:, :-1], rows[:, 1:]


def train(args):
    torch.set_num_threads(1)
    rank, size, tp_group, dp_group, world = groups(args)
    dp_index, tp_index = divmod(rank, args.tp)  # rank = dp_index * tp + tp_index
    torch.manual_seed(rank)
    model = GPT(args.tp, tp_index, tp_group)
    optim = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(optim, T_max=100)

    # checkpoint: begin
    import distckpt
    import distckpt.torch as dt
    comm = distckpt.Comm.from_mpi4py(world) if world is not None else distckpt.Comm.from_torch()
    mesh = dt.Mesh(comm, dp=args.dp, tp=args.tp)
    placements = {f"model.{name}": dt.Shard(dim, "tp") for name, dim in GPT.split_dims().items()}
    placements["rng"] = dt.PerRank()
    state = {"model": model, "optim": optim, "sched": sched, "rng": RNGState()}
    manager = dt.CheckpointManager(comm, state, mesh=mesh, placements=placements, directory=args.dir,
                                   save_every_steps=args.save_every, keep_max=3)
    start = manager.resume(strict=not args.reshard).step + 1 if args.resume else 1
    # checkpoint: end
    if args.resume and rank == 0:
        print(f"resumed step {start - 1}", flush=True)

    for step in range(start, args.steps + 1):
        inputs, targets = batch(step, args.dp, dp_index)
        optim.zero_grad()
        loss = F.cross_entropy(model(inputs).reshape(-1, VOCAB), targets.reshape(-1))
        loss.backward()
        for p in model.parameters():  # the DP mean of the gradients
            if args.dp > 1:
                dp_group.sum_(p.grad)
                p.grad /= args.dp
        optim.step()
        sched.step()
        mean = dp_group.sum(loss.item()) / args.dp
        if rank == 0:
            print(f"step {step} loss {mean!r}", flush=True)
        # checkpoint: begin
        manager.step_end(step, metrics={"loss": mean})
        # checkpoint: end
        if step == args.crash_at_step and rank == size - 1:
            os.kill(os.getpid(), signal.SIGKILL)  # a node dies: no cleanup, no goodbye
    # checkpoint: begin
    manager.end(args.steps)
    manager.close()
    # checkpoint: end


def spawned(rank, args, init):
    """One of --spawn's processes."""
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=args.spawn)
    train(args)
    dist.destroy_process_group()


def main():
    args = parse()
    if not args.spawn:
        train(args)
        return
    import torch.multiprocessing as mp
    with tempfile.TemporaryDirectory(prefix="train-torch-") as where:  # the processes meet in a file
        mp.spawn(spawned, args=(args, f"file://{where}/init"), nprocs=args.spawn)


if __name__ == "__main__":
    main()
