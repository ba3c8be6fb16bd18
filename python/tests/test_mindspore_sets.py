"""Per-rank .ckpt sets as MindSpore merges them, under mpirun (1, 2 and 4 ranks).

The set's strategy.ckpt is read here as MindSpore's build_searched_strategy reads a strategy
file (a ParallelStrategyMap: dev_matrix, tensor_map, field, opt_weight_shard_*), decoded by
hand from the protobuf wire format; the rank files' records are decoded the same way; and the
slices are put together as MindSpore's merge_sliced_parameter does (mindspore/parallel/
_tensor.py: _get_tensor_strategy, _get_tensor_slice_index, _reshape_param_data). The result
is compared with `distckpt convert` of the set into one .ckpt. With remove_redundancy=True the
rank that keeps each replicated slice is the one MindSpore's remove_param_redundancy picks.
"""
import os
import struct

import numpy as np

import distckpt


# ---- the protobuf wire format, by hand (independent of distckpt's encoders) ----

def _varint(buf, at):
    value, shift = 0, 0
    while True:
        byte = buf[at]
        at += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, at


def _fields(buf):
    """(field number, wire type, value) of a message: ints for varints, bytes otherwise."""
    at, out = 0, []
    while at < len(buf):
        key, at = _varint(buf, at)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, at = _varint(buf, at)
        elif wire == 2:
            n, at = _varint(buf, at)
            value, at = bytes(buf[at:at + n]), at + n
        elif wire == 5:
            value, at = bytes(buf[at:at + 4]), at + 4
        elif wire == 1:
            value, at = bytes(buf[at:at + 8]), at + 8
        else:
            raise ValueError(f"wire type {wire}")
        out.append((number, wire, value))
    return out


def _ints(message, number, signed32=False):
    """A repeated integer field, packed or not."""
    values = []
    for n, wire, value in _fields(message):
        if n != number:
            continue
        if wire == 2:  # packed
            at = 0
            while at < len(value):
                v, at = _varint(value, at)
                values.append(v)
        else:
            values.append(value)
    if signed32:  # int32 -1 is written as a 64-bit two's complement varint
        values = [v - (1 << 64) if v >= 1 << 63 else v for v in values]
    return values


def _one(message, number):
    return next(value for n, _, value in _fields(message) if n == number)


def build_searched_strategy(path):
    """As MindSpore's build_searched_strategy: {param name: its ParallelLayouts}."""
    strategy = {}
    with open(path, "rb") as f:
        data = f.read()
    for number, _, item in _fields(data):
        if number != 3:  # parallel_layout_item
            continue
        name = _one(item, 1).decode()
        layouts = _one(item, 2)
        strategy[name] = {
            "dev_matrix": _ints(_one(layouts, 1), 1),
            "tensor_map": _ints(_one(layouts, 2), 1, signed32=True),
            "field": _one(layouts, 5),
            "opt_weight_shard_step": _one(layouts, 6),
            "opt_weight_shard_size": _one(layouts, 7),
        }
    return strategy


_NP = {"Float32": np.float32, "Float64": np.float64, "Int32": np.int32, "Int64": np.int64}


def load_ckpt_records(path):
    """A .ckpt's records as MindSpore's load_checkpoint sees them: {tag: array}."""
    with open(path, "rb") as f:
        data = f.read()
    if data[-17:-10] == b"crc_num":  # the CRC-32 footer, which MindSpore strips before parsing
        data = data[:-17]
    records = {}
    for number, _, value in _fields(data):
        if number != 1:  # Checkpoint.value (distckpt's own fields, 1001+, are skipped)
            continue
        tag = _one(value, 1).decode()
        tensor = _one(value, 2)
        dims = _ints(tensor, 1)
        dtype = _NP[_one(tensor, 2).decode()]
        records[tag] = np.frombuffer(_one(tensor, 3), dtype=dtype).reshape(dims)
    return records


# ---- MindSpore's merge, restated ----

def _tensor_strategy(dev_matrix, tensor_map):
    return [1 if m == -1 else dev_matrix[-m - 1] for m in tensor_map]


def _slice_index(dev_matrix, tensor_strategy, tensor_map, rank):
    coordinate, r = [], rank
    for d in reversed(dev_matrix):  # the rank's coordinate in the device matrix, row-major
        coordinate.insert(0, r % d)
        r //= d
    picked = [0 if m == -1 else coordinate[len(coordinate) - 1 - m] for m in tensor_map]
    index, size = 0, 1
    for c, s in zip(reversed(picked), reversed(tensor_strategy)):
        index += c * size
        size *= s
    return index


def merge_sliced_parameter(sliced, layout):
    """As MindSpore's merge_sliced_parameter with a strategy: `sliced` holds one slice per rank."""
    dev_matrix, tensor_map = layout["dev_matrix"], layout["tensor_map"]
    assert layout["field"] == 0 and layout["opt_weight_shard_size"] == 0
    assert len(sliced) == int(np.prod(dev_matrix))
    strategy = _tensor_strategy(dev_matrix, tensor_map)
    pieces = [None] * int(np.prod(strategy))
    for rank, data in enumerate(sliced):
        pieces[_slice_index(dev_matrix, strategy, tensor_map, rank)] = data
    for axis in reversed(range(len(strategy))):  # the last dim first, as MindSpore concatenates
        n = strategy[axis]
        pieces = [np.concatenate(pieces[j * n:(j + 1) * n], axis=axis) for j in range(len(pieces) // n)]
    return pieces[0]


# ---- the model ----

def _model(comm):
    size = comm.size
    tp = 2 if size % 2 == 0 else 1
    dp = size // tp
    dev = [dp, tp]
    specs = {  # name: (shape, tensor_map counted from the right of [dp, tp], dtype)
        "w": ([8, 6], [0, -1], np.float32),   # rows over tp
        "v": ([4, 8], [1, 0], np.float64),    # rows over dp, columns over tp
        "b": ([6], [-1], np.float32),         # replicated
        "steps": ([4], [1], np.int64),        # over dp
        "c": ([3], [-1], np.float64),         # replicated: the second of its holders' list
    }
    arrays, layouts, full = {}, {}, {}
    for i, (name, (shape, tensor_map, dtype)) in enumerate(specs.items()):
        whole = (np.arange(int(np.prod(shape))) * (i + 1)).astype(dtype).reshape(shape)
        layout = distckpt.TensorLayout.from_device_matrix(shape, dev, tensor_map)
        (offset, extent), = layout.boxes_of(comm.rank)
        arrays[name] = whole[tuple(slice(o, o + e) for o, e in zip(offset, extent))].copy()
        layouts[name] = layout
        full[name] = whole
    return distckpt.StateDict(comm, arrays, layouts), full


def _saved_set(comm, shared_dir, remove_redundancy):
    """Collective: the model saved as a per-rank set; its path and the whole arrays."""
    state, full = _model(comm)
    path = distckpt.save(comm, state, shared_dir, "net", format="ckpt", integrated=False,
                         remove_redundancy=remove_redundancy).path
    comm.barrier()
    return path, full


def _read_set(path, world):
    """The set's strategy and each rank file's records, as MindSpore reads them."""
    strategy = build_searched_strategy(os.path.join(path, "strategy.ckpt"))
    ranks = [load_ckpt_records(os.path.join(path, f"rank_{r}", "net.ckpt")) for r in range(world)]
    return strategy, ranks


def test_mindspore_merges_a_set_as_distckpt_converts_it(comm, shared_dir):
    path, full = _saved_set(comm, shared_dir, remove_redundancy=False)
    if comm.rank == 0:
        strategy, ranks = _read_set(path, comm.size)
        assert list(strategy) == ["w", "v", "b", "steps", "c"]
        for r in ranks:  # remove_redundancy=False: every rank file holds every slice its rank has
            assert sorted(r) == ["b", "c", "steps", "v", "w"]
        one = distckpt.convert(path, os.path.join(shared_dir, "one"), "ckpt")
        converted = load_ckpt_records(one)
        for name, layout in strategy.items():
            merged = merge_sliced_parameter([r[name] for r in ranks], layout)
            np.testing.assert_array_equal(merged, converted[name])
            np.testing.assert_array_equal(merged, full[name])
        assert distckpt.verify(path).warning == ""  # the strategy file is checked too
    comm.barrier()


def _mindspore_keeper(strategy, world):
    """MindSpore's remove_param_redundancy: {param: the rank that keeps each slice index}."""
    by_holders = {}
    for name, layout in strategy.items():
        dev, tmap = layout["dev_matrix"], layout["tensor_map"]
        tstrat = _tensor_strategy(dev, tmap)
        holders = {}
        for rank in range(world):
            holders.setdefault(_slice_index(dev, tstrat, tmap, rank), []).append(rank)
        for index, group in sorted(holders.items()):
            by_holders.setdefault(tuple(group), []).append((name, index))
    keeper = {}
    for group, entries in by_holders.items():
        for k, (name, index) in enumerate(entries):
            keeper.setdefault(name, {})[index] = group[k % len(group)]
    return keeper


def test_remove_redundancy_keeps_each_slice_where_mindspore_would(comm, shared_dir):
    path, _ = _saved_set(comm, shared_dir, remove_redundancy=True)
    if comm.rank == 0:
        strategy, ranks = _read_set(path, comm.size)
        keeper = _mindspore_keeper(strategy, comm.size)
        for name, layout in strategy.items():
            dev, tmap = layout["dev_matrix"], layout["tensor_map"]
            tstrat = _tensor_strategy(dev, tmap)
            holding = {r for r in range(comm.size) if name in ranks[r]}
            assert holding == set(keeper[name].values()), (name, holding, keeper[name])
            for r in holding:
                index = _slice_index(dev, tstrat, tmap, r)
                assert keeper[name][index] == r
    comm.barrier()


def test_explicit_boxes_get_no_strategy_file_and_ls_says_so(comm, shared_dir):
    rows = 4 * comm.size
    layout = distckpt.TensorLayout.from_boxes([rows, 3], [[([4 * r, 0], [4, 3])] for r in range(comm.size)])
    mine = np.full((4, 3), comm.rank, np.float32)
    state = distckpt.StateDict(comm, {"x": mine}, {"x": layout})
    path = distckpt.save(comm, state, shared_dir, "boxes", format="ckpt", integrated=False).path
    assert not os.path.exists(os.path.join(path, "strategy.ckpt"))
    entry, = [e for e in distckpt.list_checkpoints(shared_dir) if e.name == "boxes"]
    assert "no MindSpore strategy" in entry.detail and "explicit boxes" in entry.detail
