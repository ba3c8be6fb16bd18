"""Strided memory from Python (1, 2 and 4 ranks): numpy arrays with halo cells, column-major
arrays and torch views are saved from and loaded into in place; the stored bytes are those of
a packed save; loads refuse broadcast, reversed and overlapping views, naming the tensor."""
import glob
import os

import numpy as np
import pytest

import distckpt

torch = pytest.importorskip("torch")


def _layout(comm, shape):
    return distckpt.TensorLayout.from_device_matrix([shape[0] * comm.size, shape[1]], [comm.size], [0, -1])


def _values(comm, shape, salt):
    return (np.arange(shape[0] * shape[1], dtype=np.float32).reshape(shape) * 3 + salt + 100 * comm.rank)


def test_a_haloed_array_saves_the_bytes_of_a_packed_one(comm, shared_dir):
    interior = _values(comm, (6, 5), 1)
    haloed = np.full((10, 9), -7.0, dtype=np.float32)
    haloed[2:-2, 2:-2] = interior
    fortran = np.asfortranarray(interior)
    for name, view in (("packed", interior), ("halo", haloed[2:-2, 2:-2]), ("fortran", fortran)):
        state = distckpt.StateDict(comm, {"w": view}, {"w": _layout(comm, (6, 5))})
        distckpt.save(comm, state, os.path.join(shared_dir, name), "c")
    comm.barrier()
    files = glob.glob(os.path.join(shared_dir, "packed", "c", "data*"))
    assert files
    for name in ("halo", "fortran"):
        for packed in files:
            other = os.path.join(shared_dir, name, "c", os.path.basename(packed))
            with open(packed, "rb") as a, open(other, "rb") as b:
                assert a.read() == b.read(), (name, packed)


def test_loads_write_through_the_strides_and_nowhere_else(comm, shared_dir):
    interior = _values(comm, (6, 5), 2)
    state = distckpt.StateDict(comm, {"w": interior}, {"w": _layout(comm, (6, 5))})
    distckpt.save(comm, state, shared_dir, "c")
    haloed = np.full((10, 9), -7.0, dtype=np.float32)
    fortran = np.zeros((6, 5), dtype=np.float32, order="F")
    both = distckpt.StateDict(comm, {"w": haloed[2:-2, 2:-2]}, {"w": _layout(comm, (6, 5))})
    distckpt.load(comm, both, os.path.join(shared_dir, "c"))
    np.testing.assert_array_equal(haloed[2:-2, 2:-2], interior)
    halo = haloed.copy()
    halo[2:-2, 2:-2] = -7.0
    assert (halo == -7.0).all(), "a halo cell was written"
    col = distckpt.StateDict(comm, {"w": fortran}, {"w": _layout(comm, (6, 5))})
    distckpt.load(comm, col, os.path.join(shared_dir, "c"))
    np.testing.assert_array_equal(fortran, interior)
    # torch: a view into a larger tensor is loaded in place, and the tensor sees it.
    big = torch.zeros(8, 7)
    view = big[1:7, 1:6]
    tstate = distckpt.StateDict(comm, {"w": view}, {"w": _layout(comm, (6, 5))})
    distckpt.load(comm, tstate, os.path.join(shared_dir, "c"))
    assert torch.equal(big[1:7, 1:6], torch.from_numpy(interior))
    assert big[0].abs().sum() == 0 and big[:, 0].abs().sum() == 0


def test_loads_refuse_views_that_would_write_an_element_twice(comm, shared_dir):
    interior = _values(comm, (4, 3), 3)
    distckpt.save(comm, distckpt.StateDict(comm, {"w": interior}, {"w": _layout(comm, (4, 3))}), shared_dir, "c")
    path = os.path.join(shared_dir, "c")
    row = np.arange(3, dtype=np.float32)
    cases = {
        "broadcast": (np.broadcast_to(row, (4, 3)), TypeError, "read-only"),  # numpy's are read-only
        "reversed": (np.zeros((4, 3), dtype=np.float32)[::-1], distckpt.DistckptError, "stride -3"),
        "expanded": (torch.zeros(1, 3).expand(4, 3), distckpt.DistckptError, "stride 0"),  # writable in torch
        "overlapping": (torch.zeros(6).as_strided((4, 3), (1, 1)), distckpt.DistckptError, "overlap"),
    }
    for what, (view, error, words) in cases.items():
        state = distckpt.StateDict(comm, {"w": view}, {"w": _layout(comm, (4, 3))})
        with pytest.raises(error, match=rf"'w'.*{words}"):
            distckpt.load(comm, state, path)
    # Saving a reversed view stores the rows in the view's order.
    rows = _values(comm, (4, 3), 4)
    distckpt.save(comm, distckpt.StateDict(comm, {"w": rows[::-1]}, {"w": _layout(comm, (4, 3))}), shared_dir, "r")
    back = np.zeros((4, 3), dtype=np.float32)
    distckpt.load(comm, distckpt.StateDict(comm, {"w": back}, {"w": _layout(comm, (4, 3))}),
                  os.path.join(shared_dir, "r"))
    np.testing.assert_array_equal(back, rows[::-1])
    # Saving them is fine: a broadcast view stores its repeated rows.
    state = distckpt.StateDict(comm, {"w": np.broadcast_to(row, (4, 3))}, {"w": _layout(comm, (4, 3))})
    distckpt.save(comm, state, shared_dir, "b")
    with distckpt.open(os.path.join(shared_dir, "b")) as r:
        np.testing.assert_array_equal(r.tensor("w")[:4], np.broadcast_to(row, (4, 3)))
