"""TensorLayout: how a global tensor is split over ranks."""
from . import _distckpt
from ._args import _exchanged, _ints_arg
from ._comm import _comm_arg


_REPLICATED = {}  # (class, shape, size) -> the replicated layout


class TensorLayout:
    """How a global tensor is split over ranks (MindSpore's device matrix, or boxes)."""

    def __init__(self, native):
        self._native = native

    @classmethod
    def from_device_matrix(cls, shape, dev_mat, tensor_map, ranks=None):
        where = "TensorLayout.from_device_matrix"
        return cls(_distckpt.TensorLayout._from_device_matrix(
            _ints_arg(where, "shape", shape), _ints_arg(where, "dev_mat", dev_mat),
            _ints_arg(where, "tensor_map", tensor_map), _ints_arg(where, "ranks", [] if ranks is None else ranks)))

    @classmethod
    def from_boxes(cls, shape, boxes):
        """boxes[r]: the (offset, shape) pairs rank r holds."""
        where = "TensorLayout.from_boxes"
        try:
            per_rank = [[(_ints_arg(where, "a box's offset", o), _ints_arg(where, "a box's shape", s))
                         for o, s in rank] for rank in boxes]
        except (TypeError, ValueError) as error:
            if isinstance(error, TypeError) and str(error).startswith(where):
                raise
            raise TypeError(f"{where}: boxes must be, for each rank, a list of (offset, shape) pairs") from None
        return cls(_distckpt.TensorLayout._from_boxes(_ints_arg(where, "shape", shape), per_rank))

    @classmethod
    def from_local_box(cls, comm, shape, offset, size):
        """Collective (one allgather over `comm`). The layout of a tensor of global `shape` whose
        rank r holds the box at `offset` of extent `size` that rank r gives: each rank names only
        its own block, as torch's local tensors know it. A rank holding nothing gives a size
        with a 0. Ranks that give another global shape are a ValueError naming two of them (on
        every rank); boxes that overlap or leave a hole are DistckptError, as from_boxes."""
        import json
        where = "TensorLayout.from_local_box"
        native = _comm_arg(where, comm)
        # The checks' failure on one rank travels in the gather: every rank raises.
        _, gathered = _exchanged(native, lambda: (None, json.dumps(
            [_ints_arg(where, "shape", shape), _ints_arg(where, "offset", offset), _ints_arg(where, "size", size)]
        ).encode()))
        everyone = [json.loads(b) for b in gathered]
        for r, (s, _, _) in enumerate(everyone):
            if s != everyone[0][0]:
                raise ValueError(f"{where}: rank 0 gives the global shape {everyone[0][0]}, rank {r} {s}")
        boxes = [[] if 0 in extent else [(o, extent)] for _, o, extent in everyone]
        return cls.from_boxes(everyone[0][0], boxes)

    @classmethod
    def replicated(cls, shape, size):
        """The whole tensor on each of `size` ranks (data-parallel replicas)."""
        key = (cls, tuple(shape), size)
        layout = _REPLICATED.get(key)
        if layout is None:  # a model repeats a few shapes many times; a layout is immutable
            layout = cls.from_device_matrix(shape, [size], [-1] * len(shape))
            if len(_REPLICATED) < 4096:
                _REPLICATED[key] = layout
        return layout

    @property
    def global_shape(self):
        return list(self._native.global_shape)

    def boxes_of(self, rank):
        return self._native.boxes_of(rank)
