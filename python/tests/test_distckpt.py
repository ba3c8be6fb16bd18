"""The Python package under mpirun (1, 2 and 4 ranks): round trips of every dtype from
numpy and torch (zero-copy, checked by address), resharding onto fewer ranks, errors as
exceptions, and the reader on every format without MPI."""
import json
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np
import pytest
from mpi4py import MPI

import distckpt

DTYPES = ["float32", "float16", "float64", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
          "bool"]


def full_tensor(dtype, shape, salt):
    n = int(np.prod(shape))
    values = (np.arange(n, dtype=np.int64) * 7 + salt) % 251
    if dtype == "bool":
        return (values % 3 == 0).reshape(shape)
    if dtype == "bfloat16":  # the bits of bfloat16 values (numpy has no bfloat16)
        return (np.arange(n, dtype=np.float32) * 0.5 + salt).view(np.uint32).__rshift__(16).astype(np.uint16).reshape(shape)
    return values.astype(dtype).reshape(shape)


def rows_of(full, rank, size):
    rows = full.shape[0] // size
    return np.ascontiguousarray(full[rank * rows:(rank + 1) * rows])


def split_rows(shape, size):
    return distckpt.TensorLayout.from_device_matrix(shape, [size], [0] + [-1] * (len(shape) - 1))


def test_every_numpy_dtype_round_trips_in_place(comm, shared_dir):
    size, rank = comm.size, comm.rank
    names = DTYPES + ["bfloat16"]
    shapes = {name: [4 * size, 3 + i % 4] for i, name in enumerate(names)}
    fulls = {name: full_tensor(name, shapes[name], i) for i, name in enumerate(names)}
    tensors = {name: rows_of(fulls[name], rank, size) for name in names}
    layouts = {name: split_rows(shapes[name], size) for name in names}
    state = distckpt.StateDict(comm, tensors, layouts, info={"step": 5, "lr": 0.5, "tag": "x", "ok": True},
                               dtypes={"bfloat16": "bfloat16"})
    saved = distckpt.save(comm, state, shared_dir, "step-5", step=5)
    assert saved.bytes_written == sum(f.nbytes for f in fulls.values())
    addresses = {name: t.__array_interface__["data"][0] for name, t in tensors.items()}
    for t in tensors.values():
        t[...] = 0
    loaded = distckpt.load(comm, state, shared_dir)
    assert loaded.step == 5
    assert loaded.info == {"step": 5, "lr": 0.5, "tag": "x", "ok": True}
    for name in names:
        assert tensors[name].__array_interface__["data"][0] == addresses[name]  # loaded in place
        np.testing.assert_array_equal(tensors[name], rows_of(fulls[name], rank, size), err_msg=name)
    # Everything listed, verified, and readable without MPI on rank 0.
    listed = distckpt.list_checkpoints(shared_dir)
    assert [e.name for e in listed] == ["step-5"] and listed[0].latest
    if rank == 0:
        report = distckpt.verify(os.path.join(shared_dir, "step-5"))
        assert report.tensors == len(names)
        with distckpt.open(os.path.join(shared_dir, "step-5")) as r:
            assert sorted(r.keys()) == sorted(names)
            for name in names:
                np.testing.assert_array_equal(r.tensor(name), fulls[name], err_msg=name)
            assert r.dtype("bfloat16") == "bfloat16" and r.tensor("bfloat16").dtype == np.uint16
            part = r.read("int32", ([1, 1], [2, 2]))
            np.testing.assert_array_equal(part, fulls["int32"][1:3, 1:3])
    comm.barrier()


def test_torch_tensors_round_trip_by_address(comm, shared_dir):
    torch = pytest.importorskip("torch", reason="python3-torch is not installed (scripts/setup.sh installs it)")
    size, rank = comm.size, comm.rank
    dtypes = [torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int64, torch.int8, torch.uint8,
              torch.bool]
    fulls, tensors, layouts = {}, {}, {}
    for i, dt in enumerate(dtypes):
        name = str(dt).replace("torch.", "")
        shape = [2 * size, 5]
        full = torch.arange(10 * size, dtype=torch.float64).reshape(shape) * 0.25 + i
        full = (full > 3) if dt == torch.bool else full.to(dt)
        fulls[name] = full
        tensors[name] = full[2 * rank:2 * rank + 2].clone()
        layouts[name] = split_rows(shape, size)
    state = distckpt.StateDict(comm, tensors, layouts)
    distckpt.save(comm, state, shared_dir, "t")
    pointers = {n: t.data_ptr() for n, t in tensors.items()}
    for t in tensors.values():
        t.zero_()
    distckpt.load(comm, state, os.path.join(shared_dir, "t"))
    for name, t in tensors.items():
        assert t.data_ptr() == pointers[name]
        assert torch.equal(t, fulls[name][2 * rank:2 * rank + 2]), name
    # Refused with the tensor's name: memory that is not the host's (a meta tensor has none).
    with pytest.raises(TypeError, match="'w'"):
        distckpt.StateDict(comm, {"w": torch.zeros(4, 4, device="meta")})
    # The reader into a torch state_dict, without MPI collectives (rank 0).
    if rank == 0:
        r = distckpt.open(os.path.join(shared_dir, "t"))
        assert r.to_torch("bfloat16").dtype == torch.bfloat16
        target = {n: torch.zeros_like(f) for n, f in fulls.items()}
        missing, unexpected = r.load_into(target)
        assert missing == [] and unexpected == []
        for n, f in fulls.items():
            assert torch.equal(target[n], f), n
        with pytest.raises(distckpt.MismatchError, match="'float32'"):  # a shape that differs
            r.load_into({"float32": torch.zeros(3, 3)}, strict=False)
        # torch's strict: missing and unexpected names, both listed, before anything is copied.
        partial = {"float32": torch.zeros_like(fulls["float32"]), "extra": torch.zeros(1)}
        with pytest.raises(distckpt.MismatchError, match=r"missing in the checkpoint: \['extra'\]; unexpected.*'int8'"):
            r.load_into(partial)
        assert not partial["float32"].any()
        assert r.load_into(partial, strict=False)[0] == ["extra"] and torch.equal(partial["float32"], fulls["float32"])
        # Stored names mapped: an exact rename, else the longest prefix (DDP's "module." added here).
        wrapped = {"module." + n: torch.zeros_like(f) for n, f in fulls.items() if n != "int8"}
        wrapped["bytes"] = torch.zeros_like(fulls["int8"])
        assert r.load_into(wrapped, prefix_map={"": "module."}, rename={"int8": "bytes"}) == ([], [])
        assert torch.equal(wrapped["module.float64"], fulls["float64"]) and torch.equal(wrapped["bytes"], fulls["int8"])
    comm.barrier()


def test_reshard_onto_fewer_ranks(comm, shared_dir):
    size, rank = comm.size, comm.rank
    shape = [12, 8]
    full = np.arange(96, dtype=np.float32).reshape(shape)
    # Saved split over columns on every rank (TP = size when it divides 8, else replicated).
    tp = size if 8 % size == 0 else 1
    layout = distckpt.TensorLayout.from_device_matrix(shape, [size // tp, tp], [-1, 0])
    (offset, extent), = layout.boxes_of(rank)
    mine = np.ascontiguousarray(full[offset[0]:offset[0] + extent[0], offset[1]:offset[1] + extent[1]])
    distckpt.save(comm, distckpt.StateDict(comm, {"w": mine}, {"w": layout}), shared_dir, "r")
    # Loaded on the first 2 ranks as 2 row blocks, then on rank 0 alone, whole.
    for ranks in ([0, 1], [0]):
        if len(ranks) > size:
            continue
        sub_mpi = MPI.COMM_WORLD.Split(0 if rank in ranks else MPI.UNDEFINED, rank)
        if sub_mpi != MPI.COMM_NULL:
            with distckpt.Comm.from_mpi4py(sub_mpi) as sub:
                n = sub.size
                rows = np.zeros((12 // n, 8), np.float32)
                st = distckpt.StateDict(sub, {"w": rows}, {"w": split_rows(shape, n)})
                result = distckpt.load(sub, st, os.path.join(shared_dir, "r"))
                np.testing.assert_array_equal(rows, full[sub.rank * 12 // n:(sub.rank + 1) * 12 // n])
                assert result.bytes_read == result.bytes_needed
            sub_mpi.Free()
        comm.barrier()


def test_errors_are_exceptions(comm, shared_dir):
    size, rank = comm.size, comm.rank
    w = np.ones((2, 3), np.float32)
    state = distckpt.StateDict(comm, {"w": w})
    with pytest.raises(distckpt.NotFoundError):
        distckpt.load(comm, state, os.path.join(shared_dir, "missing"))
    distckpt.save(comm, state, shared_dir, "e", key=b"k" * 32)
    with pytest.raises(distckpt.DistckptError, match="already exists"):
        distckpt.save(comm, state, shared_dir, "e")
    wrong = distckpt.StateDict(comm, {"w": np.ones((2, 3), np.float64)})
    with pytest.raises(distckpt.MismatchError, match="'w'"):
        distckpt.load(comm, wrong, os.path.join(shared_dir, "e"), key=b"k" * 32)
    with pytest.raises(distckpt.AuthError):
        distckpt.load(comm, state, os.path.join(shared_dir, "e"), key=b"x" * 32)
    if rank == 0:  # the reader takes the key too
        np.testing.assert_array_equal(distckpt.open(os.path.join(shared_dir, "e"), key=b"k" * 32).tensor("w"), w)
        with pytest.raises(distckpt.AuthError):
            distckpt.open(os.path.join(shared_dir, "e"), key=b"x" * 32)
    assert issubclass(distckpt.CorruptionError, distckpt.DistckptError)
    with pytest.raises(TypeError, match="'v'"):
        # A field of a packed record array: 5-byte steps between 4-byte floats.
        distckpt.StateDict(comm, {"v": np.zeros(4, dtype=[("a", "<f4"), ("b", "u1")])["a"]})
    ro = np.ones((2, 3), np.float32)
    ro.flags.writeable = False
    with pytest.raises(TypeError, match="'w'.*read-only"):
        distckpt.load(comm, distckpt.StateDict(comm, {"w": ro}), os.path.join(shared_dir, "e"), key=b"k" * 32)
    with pytest.raises(TypeError, match="'s'"):
        distckpt.StateDict(comm, {"s": "not a tensor"})
    # A damaged file is corruption, named.
    comm.barrier()
    if rank == 0:
        distckpt.save(distckpt.Comm.from_mpi4py(MPI.COMM_SELF), distckpt.StateDict(
            distckpt.Comm.from_mpi4py(MPI.COMM_SELF), {"w": w}), shared_dir, "c")
        data = os.path.join(shared_dir, "c", "data-00000.bin")
        with open(data, "r+b") as f:
            f.seek(2)
            b = f.read(1)
            f.seek(2)
            f.write(bytes([b[0] ^ 0xFF]))
        with pytest.raises(distckpt.CorruptionError, match="data-00000.bin"):
            distckpt.verify(os.path.join(shared_dir, "c"))
    comm.barrier()


def test_arguments_that_fail_on_one_rank_fail_the_call_on_every_rank(comm, shared_dir):
    # A key read per node, a read-only array or an unknown format on the last rank alone:
    # that rank raises its own error, the others an error naming it, and nobody waits.
    size, rank = comm.size, comm.rank
    odd = rank == size - 1
    w = np.ones((2, 3), np.float32)
    state = distckpt.StateDict(comm, {"w": w})
    key = b"k" * (31 if odd else 32)
    own, named = (distckpt.DistckptError, "key"), (distckpt.DistckptError, f"rank {size - 1}")
    with pytest.raises(own[0] if odd else named[0], match=own[1] if odd else named[1]):
        distckpt.save(comm, state, shared_dir, "k1", key=key)
    distckpt.save(comm, state, shared_dir, "k2")
    ro = np.ones((2, 3), np.float32)
    ro.flags.writeable = not odd
    with pytest.raises(TypeError if odd else distckpt.DistckptError, match="read-only" if odd else named[1]):
        distckpt.load(comm, distckpt.StateDict(comm, {"w": ro}), os.path.join(shared_dir, "k2"))
    with pytest.raises(distckpt.DistckptError, match=own[1] if odd else named[1]):
        distckpt.CheckpointManager(comm, state, directory=shared_dir, enc_key=key)
    # A key is bytes: text or a number (bytes(32) would be 32 zero bytes) is refused.
    for wrong in ("k" * 32, 32):
        with pytest.raises(TypeError if odd else distckpt.DistckptError, match="bytes" if odd else named[1]):
            distckpt.save(comm, state, shared_dir, "k5", key=wrong if odd else b"k" * 32)
    with distckpt.CheckpointManager(comm, distckpt.StateDict(comm, {"w": ro}), directory=shared_dir,
                                    prefix="ro") as manager:
        with pytest.raises(TypeError if odd else distckpt.DistckptError, match="read-only" if odd else named[1]):
            manager.resume()
    with distckpt.AsyncCheckpointer(comm, staging_bytes=1 << 20) as ckpt:
        with pytest.raises(ValueError if odd else distckpt.DistckptError, match="format" if odd else named[1]):
            ckpt.save_async(state, shared_dir, "k3", format="zip" if odd else "native")
        ckpt.save_async(state, shared_dir, "k4")
        assert ckpt.wait().bytes_written == w.nbytes
    with pytest.raises(ValueError, match="AsyncCheckpointer still uses"):
        with distckpt.AsyncCheckpointer(comm, staging_bytes=1 << 20):
            comm._native.close()
    comm.barrier()


def plain_safetensors(path, tensors):
    """A safetensors file written by hand, as any writer of the format would."""
    header, offset, blobs = {}, 0, []
    for name, a in tensors.items():
        header[name] = {"dtype": {"float32": "F32", "int64": "I64"}[a.dtype.name], "shape": list(a.shape),
                        "data_offsets": [offset, offset + a.nbytes]}
        offset += a.nbytes
        blobs.append(a.tobytes())
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def test_reader_on_every_format_without_mpi(comm, shared_dir):
    if comm.rank != 0:
        return
    full = np.arange(24, dtype=np.float32).reshape(4, 6)
    self_comm = distckpt.Comm.from_mpi4py(MPI.COMM_SELF)
    state = distckpt.StateDict(self_comm, {"w": full.copy(), "b": np.arange(3, dtype=np.int64)})
    distckpt.save(self_comm, state, shared_dir, "n")
    paths = [os.path.join(shared_dir, "n")]
    for fmt in ("ckpt", "safetensors", "hdf5"):
        paths.append(distckpt.convert(os.path.join(shared_dir, "n"), os.path.join(shared_dir, "as_" + fmt), fmt))
    plain = os.path.join(shared_dir, "plain.safetensors")
    plain_safetensors(plain, {"w": full, "b": np.arange(3, dtype=np.int64)})
    paths.append(plain)
    import h5py  # an HDF5 file as h5py writes one, not by us
    with h5py.File(os.path.join(shared_dir, "plain.h5"), "w") as f:
        f["w"] = full
        f["b"] = np.arange(3, dtype=np.int64)
    paths.append(os.path.join(shared_dir, "plain.h5"))
    self_comm.close()
    # A fresh interpreter, no mpirun, no MPI environment: import and read only.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX_", "OPAL_"))}
    script = (
        "import sys, numpy as np, distckpt\n"
        "for p in sys.argv[1:]:\n"
        "    r = distckpt.open(p)\n"
        "    assert sorted(r.keys()) == ['b', 'w'], (p, r.keys())\n"
        "    np.testing.assert_array_equal(r.tensor('w'), np.arange(24, dtype=np.float32).reshape(4, 6))\n"
        "    np.testing.assert_array_equal(r.read('w', ([1, 2], [2, 3])), np.arange(24).reshape(4, 6)[1:3, 2:5])\n"
        "    np.testing.assert_array_equal(r.tensor('b'), np.arange(3))\n"
        "print('read', len(sys.argv) - 1)\n")
    out = subprocess.run([sys.executable, "-c", script] + paths, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"read {len(paths)}"
    # import distckpt leaves MPI alone: mpi4py, told not to, finds it uninitialised.
    script = ("import mpi4py\nmpi4py.rc.initialize = False\nimport distckpt\nfrom mpi4py import MPI\n"
              "assert not MPI.Is_initialized()\nprint('untouched')\n")
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "untouched", out.stderr


def test_a_script_that_leaves_a_comm_open_exits_zero(comm):
    if comm.rank != 0:
        return
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX_", "OPAL_"))}
    script = ("import sys, numpy as np, distckpt\nc = distckpt.Comm.world()\nassert c.size == 1\n"
              "c2 = distckpt.Comm.world()\na = distckpt.AsyncCheckpointer(c2)\n"
              "s = distckpt.StateDict(c, {'w': np.zeros(4, np.float32)})\n"
              "m = distckpt.CheckpointManager(c, s, directory=sys.argv[1])\n"
              "a.save_async(s, sys.argv[1], 'left-in-flight')\n")
    out = subprocess.run([sys.executable, "-c", script, tempfile.mkdtemp(prefix="distckpt-exit-")], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr


def test_reader_reads_only_the_region_unless_asked_to_check(comm, shared_dir):
    if comm.rank != 0:
        return
    self_comm = distckpt.Comm.from_mpi4py(MPI.COMM_SELF)
    full = np.arange(64 * 64, dtype=np.float32).reshape(64, 64)
    distckpt.save(self_comm, distckpt.StateDict(self_comm, {"w": full}), shared_dir, "p")
    self_comm.close()
    # Damage the last row: outside the region read below, inside its chunk.
    data = os.path.join(shared_dir, "p", "data-00000.bin")
    with open(data, "r+b") as f:
        f.seek(63 * 64 * 4)
        f.write(b"\xff\xff\xff\xff")
    r = distckpt.open(os.path.join(shared_dir, "p"))
    part = r.read("w", ([2, 3], [4, 5]))
    np.testing.assert_array_equal(part, full[2:6, 3:8])
    assert r.bytes_read == 4 * 5 * 4  # read amplification 1.0
    with pytest.raises(distckpt.CorruptionError, match="data-00000.bin"):
        r.read("w", ([2, 3], [4, 5]), check=True)
    with pytest.raises(distckpt.CorruptionError):
        r.tensor("w")  # a whole chunk is always checked
    for bad in (([0], [4, 8]), ([0, 0], [65, 1]), ([-1, 0], [1, 1])):
        with pytest.raises(distckpt.DistckptError, match="not inside"):
            r.read("w", bad)
    with pytest.raises(TypeError, match="'b'"):
        distckpt.StateDict(distckpt.Comm.from_mpi4py(MPI.COMM_SELF), {"b": bytearray(8)})


def test_incremental_saves_reference_unchanged_tensors(comm, shared_dir):
    size, rank = comm.size, comm.rank
    shape = [4 * size, 256]
    frozen = rows_of(full_tensor("float32", shape, 1), rank, size)
    head = rows_of(full_tensor("float32", shape, 2), rank, size)
    layouts = {"frozen": split_rows(shape, size), "head": split_rows(shape, size)}
    state = distckpt.StateDict(comm, {"frozen": frozen, "head": head}, layouts)
    first = distckpt.save(comm, state, shared_dir, "step-1", step=1, incremental=True)
    assert first.bytes_written == 2 * frozen.nbytes * size and first.bytes_referenced == 0
    head += 1  # only the head trains
    second = distckpt.save(comm, state, shared_dir, "step-2", step=2, incremental=True)
    assert second.bytes_written == head.nbytes * size
    assert second.bytes_referenced == frozen.nbytes * size
    assert second.incremental_base == "step-1"
    expected = head.copy()
    head[...] = 0
    frozen[...] = 0
    distckpt.load(comm, state, shared_dir)
    np.testing.assert_array_equal(head, expected)
    np.testing.assert_array_equal(frozen, rows_of(full_tensor("float32", shape, 1), rank, size))
    if rank == 0:
        listed = {e.name: e for e in distckpt.list_checkpoints(shared_dir)}
        assert listed["step-2"].references == ["step-1"]
        assert listed["step-2"].referenced_bytes > 0
        assert distckpt.verify(os.path.join(shared_dir, "step-2"), deep=True).bytes_checked >= 2 * frozen.nbytes * size
        # Removed as retention would: step-2 still reads the frozen tensor from step-1's files.
        distckpt.remove_checkpoint(shared_dir, "step-1")
        assert "step-1" not in {e.name for e in distckpt.list_checkpoints(shared_dir)}
        distckpt.verify(os.path.join(shared_dir, "step-2"), deep=True)
        with pytest.raises(distckpt.NotFoundError):
            distckpt.remove_checkpoint(shared_dir, "step-1")
    comm.barrier()
    # The manager takes it as a config option, and refuses it with encryption.
    with pytest.raises(distckpt.DistckptError, match="incremental"):
        distckpt.CheckpointManager(comm, state, directory=os.path.join(shared_dir, "m"), incremental=True,
                                   enc_key=b"k" * 32)
    manager = distckpt.CheckpointManager(comm, state, directory=os.path.join(shared_dir, "m"), incremental=True,
                                         save_every_steps=1, keep_max=1)
    for step in (1, 2, 3):
        head += 1
        manager.step_end(step)
    manager.close()
    if rank == 0:
        stats = [json.loads(line) for line in open(os.path.join(shared_dir, "m", "stats.jsonl"))]
        assert [s["bytes_written"] for s in stats[1:]] == [head.nbytes * size] * 2
        assert all(s["bytes_logical"] == 2 * head.nbytes * size for s in stats)
    comm.barrier()


def test_state_dicts_refuse_bytes_they_would_store_wrong(comm, shared_dir):
    size, rank = comm.size, comm.rank
    layout = split_rows([2 * size, 3], size)
    # Another byte order: the dtype's name ("float32") would hide it.
    with pytest.raises(TypeError, match="'w'.*byte order"):
        distckpt.StateDict(comm, {"w": np.zeros((2, 3), ">f4")}, {"w": layout})
    # The array's shape is its box, not only its byte count (a transposed or flat array).
    with pytest.raises(TypeError, match=r"'w': shape \(3, 2\).*box"):
        distckpt.StateDict(comm, {"w": np.zeros((3, 2), np.float32)}, {"w": layout})
    with pytest.raises(TypeError, match=r"'w': shape \(6,\)"):
        distckpt.StateDict(comm, {"w": np.zeros(6, np.float32)}, {"w": layout})
    # dtypes only declares the bits of a 2-byte integer array bfloat16, for tensors that exist.
    with pytest.raises(TypeError, match="not in the state"):
        distckpt.StateDict(comm, {"w": np.zeros((2, 3), np.uint16)}, {"w": layout}, dtypes={"x": "bfloat16"})
    for wrong, declared in ((np.int32, "float32"), (np.float16, "bfloat16"), (np.float32, "bfloat16")):
        with pytest.raises(TypeError, match="'w'"):
            distckpt.StateDict(comm, {"w": np.zeros((2, 3), wrong)}, {"w": layout}, dtypes={"w": declared})
    with pytest.raises(TypeError, match="not supported"):
        distckpt.StateDict(comm, {"w": np.zeros((2, 3), object)}, {"w": layout}, dtypes={"w": "float64"})
    distckpt.StateDict(comm, {"w": np.zeros((2, 3), np.int16)}, {"w": layout}, dtypes={"w": "bfloat16"})
    # numpy scalars are info values; an int past int64 is refused by key.
    w = np.full((2, 3), rank, np.float32)
    state = distckpt.StateDict(comm, {"w": w}, {"w": layout},
                               info={"seed": np.int64(3), "flag": np.bool_(True), "lr": np.float32(0.5)})
    saved = distckpt.save(comm, state, shared_dir, "a")
    info = distckpt.load(comm, state, saved.path).info
    assert info["seed"] == 3 and info["flag"] is True and info["lr"] == 0.5
    with pytest.raises(TypeError, match="info 'big'.*int64"):
        distckpt.StateDict(comm, {"w": w}, {"w": layout}, info={"big": 2 ** 64 - 1})
    # A manager option of the wrong type names the option; paths may be pathlib.Path.
    with pytest.raises(TypeError, match="option 'keep_max'.*str"):
        distckpt.CheckpointManager(comm, state, directory=shared_dir, keep_max="3")
    with pytest.raises(TypeError, match="option 'save_every_steps'.*float"):
        distckpt.CheckpointManager(comm, state, directory=shared_dir, save_every_steps=2.0)
    import pathlib
    with distckpt.CheckpointManager(comm, state, directory=pathlib.Path(shared_dir) / "p") as m:
        assert m.step_end(1).saved
    # A closed reader has let go of its files.
    r = distckpt.open(pathlib.Path(saved.path))
    with r:
        assert r.keys() == ["w"]
    with pytest.raises(ValueError, match="closed"):
        r.tensor("w")


def test_torch_tensors_given_new_storage_are_followed(comm, shared_dir):
    torch = pytest.importorskip("torch", reason="python3-torch is not installed (scripts/setup.sh installs it)")
    size = comm.size
    p = torch.zeros(2, 3)
    state = distckpt.StateDict(comm, {"p": p}, {"p": split_rows([2 * size, 3], size)})
    p.data = torch.full((2, 3), 7.0)  # a framework reallocating a parameter
    distckpt.save(comm, state, shared_dir, "a")
    assert (distckpt.open(os.path.join(shared_dir, "a")).tensor("p") == 7.0).all()
    p.set_(torch.zeros(2, 3))
    distckpt.load(comm, state, os.path.join(shared_dir, "a"))
    assert (p == 7.0).all()  # loaded into the new storage
    with distckpt.CheckpointManager(comm, state, directory=os.path.join(shared_dir, "m")) as m:
        p.data = torch.full((2, 3), 9.0)
        saved = m.step_end(1)
        assert (distckpt.open(saved.path).tensor("p") == 9.0).all()
        # A new shape is refused: by the rank itself in a manager step (as an exception of
        # the loop), and on every rank in a save, the others naming it.
        p.data = torch.zeros(3, 2)
        with pytest.raises(TypeError, match="'p' changed since the StateDict was made"):
            m.step_end(2)
        p.data = torch.zeros(2, 3)
    # On one rank only: that rank raises and the others' call ends the manager (stop,
    # naming it) instead of waiting for it; nothing is saved.
    with distckpt.CheckpointManager(comm, state, directory=os.path.join(shared_dir, "one"), exception_save=True) as m:
        m.step_end(1)
        if comm.rank == 0:
            p.data = torch.zeros(3, 2)
            with pytest.raises(TypeError, match="'p' changed"):
                m.step_end(2)
            p.data = torch.zeros(2, 3)
        else:
            out = m.step_end(2)
            assert out.stop and out.exception_rank == 0 and not out.saved, out
    if comm.rank == 0:
        p.data = torch.zeros(6)
    with pytest.raises(TypeError if comm.rank == 0 else distckpt.DistckptError, match="rank 0|'p' changed"):
        distckpt.save(comm, state, shared_dir, "b")


def test_arguments_of_the_wrong_type_are_named(comm, shared_dir):
    # Each wrong type is a TypeError naming the call and the argument (pybind11 listed the
    # native function's arg0 ... arg11); an int is not taken for a path (str(123) saved
    # into ./123 before).
    w = np.ones((2, 3), np.float32)
    state = distckpt.StateDict(comm, {"w": w})
    cases = [
        (lambda: distckpt.save(comm, state, 123, "a"), "save: root must be a path"),
        (lambda: distckpt.save(comm, {"w": w}, shared_dir, "a"), "save: state must be a distckpt.StateDict, not dict"),
        (lambda: distckpt.save(None, state, shared_dir, "a"), "save: comm must be a distckpt.Comm"),
        (lambda: distckpt.save(comm, state, shared_dir, "a", "3"), "save: step must be an int, not str"),
        (lambda: distckpt.save(comm, state, shared_dir, "a", fsync="no"), "save: fsync must be a bool"),
        (lambda: distckpt.save(comm, state, shared_dir, "a", 2 ** 63), ValueError, "step 9223372036854775808 is outside int64"),
        (lambda: distckpt.save(comm, state, shared_dir, "a\udc80"), ValueError, "save: name is not valid UTF-8"),
        (lambda: distckpt.load(comm, state, 5), "load: path must be a path"),
        (lambda: distckpt.verify(5), "verify: path must be a path"),
        (lambda: distckpt.list_checkpoints(None), "list_checkpoints: root must be a path"),
        (lambda: distckpt.convert(shared_dir, shared_dir + "/x", 3), "convert: format must be a str, not int"),
        (lambda: distckpt.open(7), "Reader: path must be a path"),
        (lambda: distckpt.StateDict(comm, [w]), "StateDict: tensors must be a dict, not list"),
        (lambda: distckpt.StateDict(comm, {"w": w}, layouts={"w": [2, 3]}), r"layouts\['w'\] must be a distckpt.TensorLayout"),
        (lambda: distckpt.TensorLayout.from_device_matrix("ab", [1], [0]), r"shape\[0\] must be an int, not str"),
        (lambda: distckpt.TensorLayout.from_boxes([4], [[4]]), "from_boxes: boxes must be"),
        (lambda: distckpt.CheckpointManager(comm, {"w": w}, directory=shared_dir), "state must be a distckpt.StateDict"),
        (lambda: distckpt.publish(shared_dir, only=[1]), "publish: only must be a list of str"),
    ]
    for call, *expected in cases:
        error, message = expected if len(expected) == 2 else (TypeError, expected[0])
        with pytest.raises(error, match=message):
            call()
    # numpy integers and pathlib paths are what they look like.
    import pathlib
    out = distckpt.save(comm, state, pathlib.Path(shared_dir), "n", step=np.array(4), fsync=None)  # as pybind11 took them
    assert distckpt.load(comm, state, pathlib.Path(out.path)).step == 4
    with distckpt.CheckpointManager(comm, state, directory=os.path.join(shared_dir, "m")) as m:
        assert m.step_end(np.int32(1), metrics={"loss": np.float32(0.5)}).saved
        # In a step call, as an exception of the loop: the manager ends (on every rank).
        with pytest.raises(TypeError, match="step_end: metric 'loss' must be a number, not str"):
            m.step_end(2, metrics={"loss": "low"})
        with pytest.raises(distckpt.DistckptError, match="finished after an exception"):
            m.step_end(3)


def test_a_wrong_argument_on_one_rank_fails_the_call_on_every_rank(comm, shared_dir):
    # The type checks of a collective call's arguments are agreed as the native checks are:
    # the last rank raises its TypeError, the others a DistckptError naming it, nobody waits.
    size, rank = comm.size, comm.rank
    odd = rank == size - 1
    named = f"rank {size - 1}: TypeError: "
    w = np.ones((2, 3), np.float32)
    state = distckpt.StateDict(comm, {"w": w})
    expect = (TypeError, "root must be a path") if odd else (distckpt.DistckptError, named + "save: root")
    with pytest.raises(expect[0], match=expect[1]):
        distckpt.save(comm, state, 5 if odd else shared_dir, "a")
    saved = distckpt.save(comm, state, shared_dir, "b")
    expect = (TypeError, "strict must be a bool") if odd else (distckpt.DistckptError, named + "load: strict")
    with pytest.raises(expect[0], match=expect[1]):
        distckpt.load(comm, state, saved.path, strict="yes" if odd else True)
    expect = (TypeError, "unknown option") if odd else (distckpt.DistckptError, named + "CheckpointManager: unknown")
    with pytest.raises(expect[0], match=expect[1]):
        distckpt.CheckpointManager(comm, state, directory=shared_dir, **({"keep_maxx": 1} if odd else {}))
    with distckpt.CheckpointManager(comm, state, directory=os.path.join(shared_dir, "m")) as m:
        expect = (TypeError, "resume: only must be a list of str") if odd else (distckpt.DistckptError, named)
        with pytest.raises(expect[0], match=expect[1]):
            m.resume(only=[3] if odd else None)
        # A step call: the rank raises, the others' call ends the manager naming it.
        if odd:
            with pytest.raises(TypeError, match="step_end: epoch must be an int"):
                m.step_end(1, epoch="first")
        else:
            out = m.step_end(1)
            assert out.stop and out.exception_rank == size - 1 and not out.saved, out
    expect = (TypeError, "staging_bytes must be a number") if odd else (distckpt.DistckptError, named)
    with pytest.raises(expect[0], match=expect[1]):
        distckpt.AsyncCheckpointer(comm, staging_bytes="lots" if odd else 1 << 20)
    with distckpt.AsyncCheckpointer(comm, staging_bytes=float(1 << 20)) as ckpt:
        expect = (TypeError, "name must be a str") if odd else (distckpt.DistckptError, named)
        with pytest.raises(expect[0], match=expect[1]):
            ckpt.save_async(state, shared_dir, 4 if odd else "c")
        ckpt.save_async(state, shared_dir, "d")
        assert ckpt.wait().path.endswith("d")


def test_load_refuses_unexpected_tensors_unless_allowed_and_maps_names(comm, shared_dir):
    rank, size = comm.rank, comm.size
    w, b = np.full((2, 3), rank, np.float32), np.arange(4, dtype=np.int64)
    state = distckpt.StateDict(comm, {"net.w": w, "net.b": b}, {"net.w": split_rows([2 * size, 3], size)})
    saved = distckpt.save(comm, state, shared_dir, "c", step=1)
    assert isinstance(saved, distckpt.SaveResult) and saved.bytes_written == (2 * size * 3 * 4 + 4 * 8)
    only_w = distckpt.StateDict(comm, {"net.w": np.zeros((2, 3), np.float32)}, {"net.w": split_rows([2 * size, 3], size)})
    with pytest.raises(distckpt.MismatchError, match="no place for: 'net.b'"):
        distckpt.load(comm, only_w, saved.path)
    loaded = distckpt.load(comm, only_w, saved.path, allow_unexpected=True)
    assert isinstance(loaded, distckpt.LoadResult) and loaded.unexpected_in_checkpoint == ["net.b"]
    # Stored names mapped: "net." stripped by a prefix map, "net.b" renamed outright.
    bare = {"w": np.zeros((2, 3), np.float32), "bias": np.zeros(4, np.int64)}
    target = distckpt.StateDict(comm, bare, {"w": split_rows([2 * size, 3], size)})
    distckpt.load(comm, target, saved.path, prefix_map={"net.": ""}, rename={"net.b": "bias"})
    assert (bare["w"] == rank).all() and (bare["bias"] == b).all()
    listed = distckpt.list_checkpoints(shared_dir)
    assert isinstance(listed[0], distckpt.CheckpointEntry) and listed[0].name == "c"
    with pytest.raises(TypeError, match="prefix_map must map str to str"):
        distckpt.load(comm, target, saved.path, prefix_map={"net.": 1})


def test_comm_world_refuses_a_process_a_torch_launcher_started_without_mpi(comm):
    if comm.rank != 0:
        return
    # What torchrun sets, without what mpirun and srun set: each process would be a world of one.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX_", "PMI_"))}
    env.update(WORLD_SIZE="2", RANK="0", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT="29500")
    out = subprocess.run([sys.executable, "-c", "import distckpt; distckpt.Comm.world()"], env=env,
                         capture_output=True, text=True, timeout=60)
    # Both ways in are named: an MPI launcher, or Comm.from_torch under the torch launcher.
    assert out.returncode != 0 and "torch.distributed launcher" in out.stderr, out.stderr
    assert "mpirun" in out.stderr and "Comm.world()" in out.stderr and "Comm.from_torch()" in out.stderr, out.stderr
    # torch.multiprocessing.spawn sets no WORLD_SIZE: the initialised group tells.
    pytest.importorskip("torch")
    script = """
import sys, tempfile, torch.distributed as dist, torch.multiprocessing as mp
def child(rank, init):
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    import distckpt
    try:
        distckpt.Comm.world()
        sys.exit("Comm.world() made a world of one")
    except distckpt.DistckptError as e:
        assert "a world of 2 processes" in str(e), e
if __name__ == "__main__":
    mp.spawn(child, args=("file://" + tempfile.mktemp(),), nprocs=2)
"""
    env.pop("WORLD_SIZE")
    with tempfile.TemporaryDirectory() as work:
        path = os.path.join(work, "spawned.py")  # spawn's children import the script by path
        with open(path, "w") as f:
            f.write(script)
        out = subprocess.run([sys.executable, path], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
