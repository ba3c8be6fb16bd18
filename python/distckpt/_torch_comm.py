"""Comm.from_torch's transport: distckpt's collectives over torch.distributed gloo groups.

The native TorchComm (python/src/torch_comm.cc) calls a _Backend for each collective and
each point-to-point message, holding the GIL, on the thread that uses that Comm (the
training loop's, or an AsyncCheckpointer's background thread for its own Comm). Memory
comes as writable memoryviews over native buffers, wrapped by torch.frombuffer: tensor
data moves between ranks without a copy in Python. An exception here is a transport
failure, which TorchComm turns into an abort of the process (distckpt treats transport
failures as fatal, as MPI's default error handler does).

Groups: torch.distributed.new_group is collective over the whole job (every process of
the default group calls it, in the same order), so every group here is made at a
collective point from the caller's thread: Comm.from_torch, and the duplicates an
AsyncCheckpointer (or a CheckpointManager with async_save) asks for. Each process says
which ranks its Comm spans; the distinct sets are made in order of first appearance on
every process. Never from a background thread.
"""
import datetime as _datetime
import os as _os
import socket as _socket
import time as _time

from . import _distckpt

# Point-to-point tags: a gather's and a scatter's messages never match a transfer's.
_TRANSFER_TAG, _SCATTER_TAG, _GATHER_TAG = 0, 1, 2

# allreduce_within's operations that timed out: kept forever, as gloo may still write into
# their tensors (the caller is abandoning the job; comm.h).
_abandoned = []

# (the default group, the gloo group over the whole job that the exchanges use)
_world = None


def _dist():
    """torch.distributed, or DistckptError when torch or its distributed package is missing."""
    try:
        import torch.distributed as dist
    except ImportError as error:
        raise _distckpt.DistckptError(f"Comm.from_torch: torch cannot be imported ({error})") from None
    if not dist.is_available() or not dist.is_gloo_available():
        raise _distckpt.DistckptError("Comm.from_torch: this torch has no torch.distributed with the gloo backend")
    return dist


def _peer_timeout():
    """The gloo groups' timeout, as make_mpi_comm's peer timeout: DISTCKPT_PEER_TIMEOUT_S
    seconds (0: none), else 600. Past it a collective fails, which aborts the process."""
    text = _os.environ.get("DISTCKPT_PEER_TIMEOUT_S", "")
    seconds = 600.0
    if text:
        try:
            seconds = float(text)
        except ValueError:
            seconds = -1
        if not 0 <= seconds < float("inf"):
            import sys
            print(f"distckpt: DISTCKPT_PEER_TIMEOUT_S={text} is not a number of seconds >= 0; using 600 s",
                  file=sys.stderr)
            seconds = 600.0
    return _datetime.timedelta(days=365 * 100) if seconds == 0 else _datetime.timedelta(seconds=seconds)


def _world_group(dist):
    """The default group when it is gloo, else a gloo group over every process, made once
    (at the first Comm.from_torch, on every process alike). Collective the first time."""
    global _world
    default = dist.group.WORLD
    if _world is None or _world[0] is not default:
        twin = None if str(dist.get_backend()) == "gloo" else dist.new_group(backend="gloo", timeout=_peer_timeout())
        _world = (default, twin or default)
    return _world[1]


def _members(dist, group):
    """The global ranks of `group` (None: the default group), ascending: the Comm's ranks
    in torch's order (a group's rank is its index among them). ValueError when this
    process is not in it."""
    if group is None or group is dist.group.WORLD:
        return list(range(dist.get_world_size()))
    if group is dist.GroupMember.NON_GROUP_MEMBER:
        raise ValueError("this process is not a member of the group it passed")
    if hasattr(dist, "get_process_group_ranks"):
        ranks = dist.get_process_group_ranks(group)
    else:  # torch before 1.13
        ranks = list(dist.distributed_c10d._pg_group_ranks[group])
    return sorted(int(r) for r in ranks)


def _runs(ranks):
    """Ascending ranks as arithmetic runs ((start, stop, step), ...): what the processes
    exchange, a few numbers for the usual groups (a block of ranks, every tp-th rank)
    where the list itself, gathered from every process, grows as the square of the job."""
    runs, i = [], 0
    while i < len(ranks):
        j = i + 1
        step = ranks[j] - ranks[i] if j < len(ranks) else 1
        while j < len(ranks) and ranks[j] - ranks[j - 1] == step:
            j += 1
        runs.append((ranks[i], ranks[j - 1] + step, step))
        i = j
    return tuple(runs)


def _ranks(runs):
    return [r for start, stop, step in runs for r in range(start, stop, step)]


def _exchange(dist, mine, where):
    """Collective over the whole job: every process's member list (or its argument error,
    an exception) and host name. Raises on every process when one failed (its own error
    there, DistckptError naming the lowest failing rank elsewhere) or when the lists do
    not split the job into disjoint groups; else makes the gloo groups and returns this
    process's (group, members, node_of, node_names)."""
    world = _world_group(dist)
    me = dist.get_rank()
    failed = isinstance(mine, BaseException)
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, (f"{type(mine).__name__}: {mine}" if failed else _runs(mine),
                                      _socket.gethostname()), group=world)
    if failed:
        raise mine
    for rank, (runs, _) in enumerate(everyone):
        if isinstance(runs, str):
            raise _distckpt.DistckptError(f"{where}: rank {rank}: {runs}")
    keys = [runs for runs, _ in everyone]
    groups = {}  # distinct groups, in order of first appearance: runs -> ranks
    for runs in keys:
        if runs not in groups:
            groups[runs] = _ranks(runs)
    for runs, members in groups.items():
        if any(not 0 <= r < len(keys) or keys[r] != runs for r in members):
            rank = keys.index(runs)
            raise _distckpt.DistckptError(
                f"{where}: the processes' groups do not split the job into disjoint groups (rank {rank} passed one "
                f"of ranks {members[:16]}{' ...' if len(members) > 16 else ''})")
    for rank, runs in enumerate(keys):
        if rank not in groups[runs]:  # pragma: no cover - _members checks this first
            raise _distckpt.DistckptError(f"{where}: rank {rank} is not in the group it passed")
    own = None
    for runs, members in groups.items():
        group = dist.new_group(members, backend="gloo", timeout=_peer_timeout())
        if runs == keys[me]:
            own = group
    members = groups[keys[me]]
    # Nodes: the members' host names, numbered by first appearance (the lowest rank's node is
    # 0), as make_mpi_comm numbers them by their lowest rank.
    number = {}
    node_of = [number.setdefault(everyone[r][1], len(number)) for r in members]
    return own, members, node_of, list(number)


class _Backend:
    """One Comm's gloo group and its operations, called by the native TorchComm. rank and
    size are the group's; node_of (by rank) and node_names (by node) its node map."""

    def __init__(self, group, members, node_of, node_names):
        import torch
        self._torch, self._dist = torch, _dist()
        self._group, self._members = group, members
        self.rank, self.size = members.index(self._dist.get_rank()), len(members)
        self.node_of, self.node_names = node_of, node_names
        ops = self._dist.ReduceOp
        self._ops = [ops.SUM, ops.MIN, ops.MAX]  # distckpt::ReduceOp's order

    def dup(self):
        """Collective over the whole job (see the module's note): a backend over a new gloo
        group with the same ranks."""
        group, members, _, _ = _exchange(self._dist, list(self._members), "Comm (a duplicate for asynchronous saves)")
        return _Backend(group, members, self.node_of, self.node_names)

    def _bytes(self, view):
        return self._torch.frombuffer(view, dtype=self._torch.uint8)

    def barrier(self):
        self._dist.barrier(group=self._group)

    def broadcast(self, view, root):
        # Through a tensor of torch's own, never one over the caller's buffer: gloo's worker
        # thread drops a collective's tensors after the caller's wait returned, and a tensor
        # over a Python buffer takes the GIL there to free it, which kills the process when
        # the interpreter is exiting by then. (Point-to-point works are dropped by the caller.)
        data = self._bytes(view)
        t = data.clone() if self.rank == root else self._torch.empty(len(view), dtype=self._torch.uint8)
        self._dist.broadcast(t, self._members[root], group=self._group)
        if self.rank != root:
            data.copy_(t)

    def allreduce(self, values, op):
        if not values:
            return values
        t = self._torch.tensor(values, dtype=self._torch.int64)
        self._dist.all_reduce(t, self._ops[op], group=self._group)
        return t.tolist()

    def allreduce_within(self, values, op, timeout_s):
        """allreduce, or None when it is not done within timeout_s seconds (< 0: no limit):
        polled, as gloo's wait has no timeout of its own that leaves the work pending."""
        t = self._torch.tensor(values, dtype=self._torch.int64)
        work = self._dist.all_reduce(t, self._ops[op], group=self._group, async_op=True)
        if timeout_s >= 0:
            deadline = _time.monotonic() + timeout_s
            while not work.is_completed():
                if _time.monotonic() >= deadline:
                    _abandoned.append((work, t))
                    return None
                _time.sleep(0.001)
        work.wait()  # raises the operation's failure
        return t.tolist()

    def _lengths(self, n):
        """Collective: every rank's n."""
        t = self._torch.zeros(self.size, dtype=self._torch.int64)
        t[self.rank] = n
        self._dist.all_reduce(t, self._dist.ReduceOp.SUM, group=self._group)
        return t.tolist()

    def allgather(self, view):
        """Every rank's bytes, as (buffer, offsets, lengths): padded to the longest."""
        lengths = self._lengths(len(view))
        width = max(lengths)
        out = self._torch.empty((self.size, width), dtype=self._torch.uint8)
        if width > 0:
            mine = self._torch.zeros(width, dtype=self._torch.uint8)
            if len(view):
                mine[:len(view)] = self._bytes(view)
            self._dist.all_gather(list(out.unbind(0)), mine, group=self._group)
        return out.numpy(), [r * width for r in range(self.size)], lengths

    def gather(self, view, root):
        """Root: every rank's bytes, packed, as (buffer, offsets, lengths); others: None."""
        lengths = self._lengths(len(view))
        if self.rank != root:
            if len(view):
                self._dist.send(self._bytes(view), self._members[root], group=self._group, tag=_GATHER_TAG)
            return None
        offsets = [sum(lengths[:r]) for r in range(self.size)]
        out = self._torch.empty(sum(lengths), dtype=self._torch.uint8)
        works = []
        for r, n in enumerate(lengths):
            if n == 0:
                continue
            piece = out.narrow(0, offsets[r], n)
            if r == root:
                piece.copy_(self._bytes(view))
            else:
                works.append(self._dist.irecv(piece, self._members[r], group=self._group, tag=_GATHER_TAG))
        for w in works:
            w.wait()
        return out.numpy(), offsets, lengths

    def scatter(self, views, root):
        """Rank r receives views[r] from root: others get (buffer, [0], [n]); root None."""
        if self.rank == root:
            sizes = self._torch.tensor([len(v) for v in views], dtype=self._torch.int64)
        else:
            sizes = self._torch.empty(self.size, dtype=self._torch.int64)
        self._dist.broadcast(sizes, self._members[root], group=self._group)
        if self.rank == root:
            works = [self._dist.isend(self._bytes(v), self._members[r], group=self._group, tag=_SCATTER_TAG)
                     for r, v in enumerate(views) if r != root and len(v)]
            for w in works:
                w.wait()
            return None
        n = int(sizes[self.rank])
        out = self._torch.empty(n, dtype=self._torch.uint8)
        if n:
            self._dist.recv(out, self._members[root], group=self._group, tag=_SCATTER_TAG)
        return out.numpy(), [0], [n]

    def isend(self, view, peer):
        return self._dist.isend(self._bytes(view), self._members[peer], group=self._group, tag=_TRANSFER_TAG)

    def irecv(self, view, peer):
        return self._dist.irecv(self._bytes(view), self._members[peer], group=self._group, tag=_TRANSFER_TAG)

    def wait(self, works):
        for w in works:
            w.wait()


def backend(group):
    """Collective over the whole job: the _Backend of Comm.from_torch(group)."""
    where = "Comm.from_torch"
    dist = _dist()
    wrong = None
    if not (group is None or isinstance(group, dist.ProcessGroup) or group is dist.GroupMember.NON_GROUP_MEMBER):
        wrong = TypeError(f"{where}: group must be a torch.distributed process group or None, not "
                          f"{type(group).__name__}")
    if not dist.is_initialized():
        raise wrong or _distckpt.DistckptError(
            f"{where}: torch.distributed is not initialised: call torch.distributed.init_process_group first "
            f"(torchrun sets the environment it reads; torch.multiprocessing's processes pass rank and world_size)")
    if wrong is None:
        try:
            mine = _members(dist, group)
        except ValueError as error:
            mine = ValueError(f"{where}: {error}")
    else:
        mine = wrong
    return _Backend(*_exchange(dist, mine, where))
