"""Named meshes and placements: where each tensor of an application state lives.

    mesh = Mesh(comm, dp=2, tp=2)            # rank = dp_index * 2 + tp_index
    placements = {"model.fc1.weight": Shard(0, "tp"),
                  "model.emb.weight": [Shard(0, "dp"), Shard(1, "tp")],
                  "rng": PerRank()}

A tensor not listed is Replicate(): every rank holds all of it, and the save checks that
they hold the same bytes. Shard(dim, axis) splits dimension `dim` over the mesh axis `axis`
as torch.chunk does (chunks of ceil(n / k), the last ones shorter or empty), so the local
tensors of torch's own sharding fit as they are. PerRank() keeps each rank's own value.
"""
import json as _json
import zlib as _zlib
from dataclasses import dataclass

import distckpt as _dc

__all__ = ["Mesh", "Shard", "Replicate", "PerRank"]


class Mesh:
    """A named device mesh over a communicator: Mesh(comm, dp=2, tp=2).

    Axes are taken in the order given, the last varying fastest over the ranks (rank 3 of
    dp=2, tp=2 is dp 1, tp 1), as torch's DeviceMesh over arange(world).reshape(2, 2). The
    sizes' product must be the communicator's size (ValueError); a size is an int >= 1
    (TypeError, ValueError). Local, no communication.
    """

    def __init__(self, comm, **axes):
        _dc._comm_arg("Mesh", comm)
        if not axes:
            raise TypeError("Mesh: name its axes, e.g. Mesh(comm, dp=2, tp=2)")
        for name, size in axes.items():
            if isinstance(size, bool) or not isinstance(size, int):
                raise TypeError(f"Mesh: axis '{name}' must be an int, not {type(size).__name__}")
            if size < 1:
                raise ValueError(f"Mesh: axis '{name}' has size {size}")
        product = 1
        for size in axes.values():
            product *= size
        if product != comm.size:
            raise ValueError(f"Mesh: {dict(axes)} holds {product} ranks, the communicator {comm.size}")
        self.comm = comm
        self.axes = dict(axes)

    @property
    def names(self):
        return tuple(self.axes)

    def size(self, axis):
        """The number of ranks along `axis`; ValueError for an axis the mesh lacks."""
        if axis not in self.axes:
            raise ValueError(f"the mesh has axes {list(self.axes)}, not '{axis}'")
        return self.axes[axis]

    def coordinate(self, rank):
        """{axis: index} of `rank`."""
        out = {}
        for name in reversed(self.names):
            out[name] = rank % self.axes[name]
            rank //= self.axes[name]
        return {name: out[name] for name in self.names}

    def describe(self):
        return {"axes": [[name, size] for name, size in self.axes.items()]}

    def __repr__(self):
        return "Mesh(" + ", ".join(f"{k}={v}" for k, v in self.axes.items()) + ")"


@dataclass(frozen=True)
class Shard:
    """Dimension `dim` of the tensor is split over the mesh axis `axis` (torch.chunk's split)."""
    dim: int
    axis: str


@dataclass(frozen=True)
class Replicate:
    """Every rank holds the whole tensor (the default); the save checks that they agree."""


@dataclass(frozen=True)
class PerRank:
    """Each rank's own tensor or plain value (RNG states, a data loader's position), stored
    per rank and restored to the same rank. Given for a path, it covers all under it. At
    another world size such entries are missing (strict=True refuses)."""


def shards_of(path, placement):
    """The [(dim, axis)] of a placement (a Shard, Replicate, or a list of Shards); TypeError else."""
    if isinstance(placement, Replicate):
        return []
    if isinstance(placement, Shard):
        placement = [placement]
    if isinstance(placement, (list, tuple)) and all(isinstance(p, (Shard, Replicate)) for p in placement):
        shards = [(p.dim, p.axis) for p in placement if isinstance(p, Shard)]
        dims = [d for d, _ in shards]
        axes = [a for _, a in shards]
        if len(set(dims)) != len(dims) or len(set(axes)) != len(axes):
            raise TypeError(f"distckpt.torch: placement of '{path}': one Shard per dimension and per axis")
        return shards
    raise TypeError(f"distckpt.torch: placement of '{path}' must be Shard, Replicate, PerRank or a list of "
                    f"Shards, not {placement!r}")


def chunk_span(n, k, index):
    """(start, length) of chunk `index` of torch.chunk(range(n), k) (empty past the end)."""
    size = -(-n // k) if n else 0
    start = min(n, index * size)
    return start, max(0, min(n, start + size) - start)


def fingerprints(tensors):
    """Cheap hashes of the tensors' bytes (native: CRC32C of all the bytes up to 4 KiB, else of
    8 spans of 512 bytes spread over the tensor, and its size). Replicas that differ anywhere
    a training step touches (every element, in practice) differ here; a difference confined
    to a few elements between the spans can pass unseen."""
    buffers, keep = [], []
    for t in tensors:
        if t.device.type != "cpu":
            t = _device_sample(t)  # a few KiB cross to the host, not the tensor
            keep.append(t)
        elif not t.is_contiguous():
            t = t.detach().contiguous()
            keep.append(t)
        buffers.append((t.data_ptr(), t.element_size() * t.numel()))
    return _dc._distckpt._fingerprints(buffers)


def _device_sample(t):
    """A device tensor's bytes as a host sample: all of them up to 4 KiB, else 8 spans of 512
    bytes spread over them, then the byte count (replicas are on devices of one kind, so every
    rank samples a tensor alike)."""
    import torch
    flat = t.detach().reshape(-1).contiguous().view(torch.uint8)
    n = flat.numel()
    if n > 4096:
        flat = torch.cat([flat[i * (n - 512) // 7:i * (n - 512) // 7 + 512] for i in range(8)])
    size = torch.tensor([n], dtype=torch.int64).view(torch.uint8)
    return torch.cat([flat.cpu(), size])


def local_facts(walk, check_replicas):
    """Local. What this rank tells the others about the walk's tensors (resolve's input), as
    JSON bytes: the local shapes of split and per-rank tensors, the replicas' fingerprints
    (check_replicas), per-rank values."""
    mine = {"s": {}, "f": {}, "v": walk.per_rank_values}
    for path in list(walk.shards) + list(walk.per_rank_tensors):
        mine["s"][path] = list(walk.tensors[path].shape)
    if check_replicas:
        # By the mesh axes a tensor is split over ("" for none): ranks that agree on those
        # coordinates hold the same blocks, and compare one dict.
        paths = [p for p in walk.tensors if p not in walk.per_rank_tensors and p not in walk.explicit]
        for path, fp in zip(paths, fingerprints([walk.tensors[p] for p in paths])):
            axes = ",".join(axis for _, axis in walk.shards.get(path, []))
            mine["f"].setdefault(axes, {})[path] = fp
        # Plain values are rank 0's unless per rank: every rank must hold the same.
        mine["p"] = {path: _zlib.crc32(_json.dumps(v, sort_keys=True).encode()) for path, v in walk.values.items()}
    return _json.dumps(mine).encode()


def resolve(size, mesh, walk, gathered, check_replicas):
    """Local, from every rank's local_facts (`gathered`, in rank order). The layouts of the
    walk's tensors from their placements, and the per-rank plain values of every rank. Returns
    (layouts, per_rank_values) with layouts: path -> TensorLayout for split and per-rank
    tensors (the others replicated), per_rank_values: path -> [typed JSON of rank 0, 1, ...].
    With check_replicas, ranks that hold the same block of a tensor must hold the same bytes
    (MismatchError naming the tensor and two ranks). Raises TypeError for a placement that does
    not fit its tensor. It depends on gathered facts only: every rank raises alike."""
    everyone = [_json.loads(b) for b in gathered]
    layouts = {}
    for path, shards in walk.shards.items():
        layouts[path] = _sharded_layout(path, [e["s"][path] for e in everyone], shards, mesh)
    for path in walk.per_rank_tensors:
        shapes = [e["s"][path] for e in everyone]
        if any(s != shapes[0] for s in shapes):
            r = next(r for r, s in enumerate(shapes) if s != shapes[0])
            raise TypeError(f"distckpt.torch: per-rank tensor '{path}' has shape {shapes[0]} on rank 0 and "
                            f"{shapes[r]} on rank {r}: per-rank tensors need one shape")
        boxes = [[([r] + [0] * len(shapes[0]), [1] + shapes[0])] for r in range(size)]
        layouts[path] = _dc.TensorLayout.from_boxes([size] + shapes[0], boxes)
    if check_replicas:
        _check_replicas(walk, everyone, mesh)
    per_rank_values = {path: [e["v"][path] for e in everyone] for path in walk.per_rank_values}
    return layouts, per_rank_values


# (local shapes, shards, mesh axes) -> layout: a model repeats a few shapes many times, and a
# layout is immutable. Bounded: a state's distinct shapes are few.
_SHARDED = {}


def _sharded_layout(path, shapes, shards, mesh):
    key = (tuple(map(tuple, shapes)), tuple(shards), tuple(mesh.axes.items()) if mesh is not None else None)
    layout = _SHARDED.get(key)
    if layout is None:
        layout = _new_sharded_layout(path, shapes, shards, mesh)
        if len(_SHARDED) < 4096:
            _SHARDED[key] = layout
    return layout


def _new_sharded_layout(path, shapes, shards, mesh):
    if mesh is None:
        raise TypeError(f"distckpt.torch: '{path}' is placed with Shard: give mesh=Mesh(comm, ...)")
    ndim = len(shapes[0])
    coords = [mesh.coordinate(r) for r in range(len(shapes))]
    global_shape = list(shapes[0])
    for dim, axis in shards:
        if not -ndim <= dim < ndim:
            raise TypeError(f"distckpt.torch: Shard({dim}, '{axis}') of '{path}': the tensor has {ndim} dims")
        mesh.size(axis)
    shards = [(dim % ndim, axis) for dim, axis in shards]
    for dim, axis in shards:
        k = mesh.size(axis)
        # The global extent: the chunks along the axis, the other coordinates at rank 0's.
        along = {coords[r][axis]: shapes[r][dim] for r in range(len(shapes))
                 if all(coords[r][a] == 0 for a in mesh.names if a != axis)}
        global_shape[dim] = sum(along.get(i, 0) for i in range(k))
    boxes = []
    for r, shape in enumerate(shapes):
        offset = [0] * ndim
        expected = list(global_shape)
        for dim, axis in shards:
            offset[dim], expected[dim] = chunk_span(global_shape[dim], mesh.size(axis), coords[r][axis])
        if list(shape) != expected:
            raise TypeError(f"distckpt.torch: '{path}' on rank {r} has shape {list(shape)}; its placement "
                            f"{[f'Shard({d}, {a!r})' for d, a in shards]} on {mesh} gives it {expected} of "
                            f"{global_shape} (torch.chunk's split)")
        boxes.append([] if 0 in expected and 0 not in global_shape else [(offset, expected)])
    return _dc.TensorLayout.from_boxes(global_shape, boxes)


def _check_replicas(walk, everyone, mesh):
    for r, e in enumerate(everyone):
        if e.get("p") != everyone[0].get("p"):
            theirs, ours = e.get("p", {}), everyone[0].get("p", {})
            path = next(p for p in sorted(set(theirs) | set(ours)) if theirs.get(p) != ours.get(p))
            raise _dc.MismatchError(
                f"distckpt.torch: the plain value '{path}' differs between ranks 0 and {r}: the checkpoint keeps "
                f"one value for every rank. Place it PerRank() (a data loader's position, an RNG state), or make "
                f"it equal")
    coords = [mesh.coordinate(r) for r in range(len(everyone))] if mesh is not None else []
    for axes in everyone[0]["f"]:
        shard_axes = axes.split(",") if axes else []
        groups = {}
        for r, e in enumerate(everyone):
            first = groups.setdefault(tuple(coords[r][a] for a in shard_axes), r)
            theirs, ours = e["f"].get(axes, {}), everyone[first]["f"].get(axes, {})
            if theirs == ours:  # the common case, compared in one go
                continue
            path = next(p for p in sorted(set(theirs) | set(ours)) if theirs.get(p) != ours.get(p))
            raise _dc.MismatchError(
                f"distckpt.torch: tensor '{path}' differs between ranks {first} and {r}, which hold the "
                f"same block of it: declare its placement (Shard, PerRank), or make the replicas equal")
