"""Every byte checked on every read path, from Python under mpirun (1, 2 and 4 ranks): an HDF5
file distckpt writes carries each dataset's CRC32C and a footer over the rest, so a flipped
byte fails verify, load and the MPI-free reader; an HDF5 file h5py wrote loads with a
warning; save's crc_check writes MindSpore's footer on a .ckpt."""
import os

import numpy as np
import pytest

import distckpt


def _model(comm):
    """A [8, 6] weight split over the ranks by rows, and a replicated bias."""
    size, rank = comm.size, comm.rank
    full = np.arange(48, dtype=np.float32).reshape(8, 6)
    rows = 8 // size if 8 % size == 0 else 8
    split = distckpt.TensorLayout.from_device_matrix([8, 6], [size if 8 % size == 0 else 1], [0, -1])
    mine = full[rank * rows:(rank + 1) * rows].copy() if 8 % size == 0 else full.copy()
    bias = np.arange(6, dtype=np.float64)
    state = distckpt.StateDict(comm, {"w": mine, "b": bias.copy()}, {"w": split})
    return state, full, bias


def _flip(path, offset):
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ 0x10]))


def test_a_flipped_byte_of_our_hdf5_file_fails_every_read_path(comm, shared_dir):
    state, full, bias = _model(comm)
    path = distckpt.save(comm, state, shared_dir, "m", format="hdf5").path
    report = distckpt.verify(path)
    assert report.checksums and report.warning == "" and "CRC32C" in report.checked
    with distckpt.open(path) as r:
        np.testing.assert_array_equal(r.tensor("w"), full)
        assert r.info.writer_version == distckpt.__version__  # the version that wrote it
    comm.barrier()
    if comm.rank == 0:
        import h5py
        with h5py.File(path, "r") as f:  # outside readers still read it (the footer lies past HDF5's end)
            np.testing.assert_array_equal(f["w"][...], full)
            data_at = f["w"].id.get_offset()
        _flip(path, data_at + 13)  # one byte of the weight's data
    comm.barrier()
    with pytest.raises(distckpt.CorruptionError, match="crc32c"):
        distckpt.verify(path)
    with pytest.raises(distckpt.CorruptionError):
        with distckpt.open(path) as r:
            r.tensor("w")
    target, _, _ = _model(comm)
    with pytest.raises(distckpt.CorruptionError):
        distckpt.load(comm, target, path)
    comm.barrier()
    if comm.rank == 0:
        _flip(path, data_at + 13)  # restored
        _flip(path, 100)  # a byte of HDF5's own structure
    comm.barrier()
    with pytest.raises(distckpt.CorruptionError):
        distckpt.verify(path)


def test_an_hdf5_file_h5py_wrote_loads_with_a_warning(comm, shared_dir):
    path = os.path.join(shared_dir, "plain.h5")
    full = np.arange(48, dtype=np.float32).reshape(8, 6)
    if comm.rank == 0:
        import h5py
        with h5py.File(path, "w") as f:
            f["w"] = full
    comm.barrier()
    report = distckpt.verify(path)
    assert not report.checksums and "records no checksums" in report.warning
    with pytest.raises(distckpt.DistckptError, match="records no checksums"):
        distckpt.verify(path, allow_unchecked=False)
    mine = np.zeros((8, 6), np.float32)
    out = distckpt.load(comm, distckpt.StateDict(comm, {"w": mine}), path)
    assert (mine == full).all() and "records no checksums" in out.warning
    with pytest.raises(distckpt.DistckptError, match="records no checksums"):
        distckpt.load(comm, distckpt.StateDict(comm, {"w": mine}), path, allow_unchecked=False)


def test_save_crc_check_writes_mindspores_footer(comm, shared_dir):
    state, _, _ = _model(comm)
    plain = distckpt.save(comm, state, shared_dir, "plain", format="ckpt").path
    footed = distckpt.save(comm, state, shared_dir, "footed", format="ckpt", crc_check=True).path
    assert "footer" not in distckpt.verify(plain).checked and distckpt.verify(plain).warning == ""
    assert "CRC-32 footer" in distckpt.verify(footed).checked
    with pytest.raises(TypeError, match="crc_check"):
        distckpt.save(comm, state, shared_dir, "bad", format="ckpt", crc_check="yes")
