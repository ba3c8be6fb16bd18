"""MindSpore's own .ckpt files from Python under mpirun (1, 2 and 4 ranks): a file MindSpore
wrote with its default crc_check=False loads with a warning (refused with
allow_unchecked=False), and its numeric scalar records (epoch_num, step_num, append_info's
floats) are info values as well as tensors."""
import os
import struct

import numpy as np
import pytest

import distckpt


def _varint(n):
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number, payload):  # a length-delimited field
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _record(tag, dims, dtype, content):
    """One Checkpoint.value record, as MindSpore's save_checkpoint writes it."""
    tensor = b"".join(_varint(1 << 3) + _varint(d) for d in dims) + _field(2, dtype.encode()) + _field(3, content)
    return _field(1, _field(1, tag.encode()) + _field(2, tensor))


def test_a_mindspore_file_without_its_footer_loads_and_reports_its_scalars(comm, shared_dir):
    path = os.path.join(shared_dir, "net.ckpt")
    w = np.arange(8, dtype=np.float32).reshape(4, 2)
    if comm.rank == 0:
        with open(path, "wb") as f:  # MindSpore's default: no CRC footer
            f.write(_record("w", [4, 2], "Float32", w.tobytes()) + _record("lr", [0], "Float32", struct.pack("<f", 0.5))
                    + _record("epoch_num", [0], "Int64", struct.pack("<q", 3))
                    + _record("step_num", [0], "Int64", struct.pack("<q", 30)))
    comm.barrier()
    with distckpt.open(path) as r:
        info = r.info
        assert info.epoch == 3 and info.step == 30 and info.info["lr"] == 0.5 and info.info["epoch_num"] == 3
        assert "lr" in r.keys()  # still a tensor
    layout = distckpt.TensorLayout.from_device_matrix([4, 2], [comm.size], [-1, -1])
    mine = np.zeros((4, 2), np.float32)
    state = distckpt.StateDict(comm, {"w": mine}, {"w": layout})
    out = distckpt.load(comm, state, path)  # strict: lr, epoch_num and step_num are not "unexpected"
    assert (mine == w).all() and "records no checksums" in out.warning
    assert out.info["lr"] == 0.5 and out.unexpected_in_checkpoint == []
    lr = np.zeros((), np.float32)
    distckpt.load(comm, distckpt.StateDict(comm, {"w": mine, "lr": lr}, {"w": layout}), path)
    assert lr == 0.5  # where the state has one, it loads as a tensor
    with pytest.raises(distckpt.DistckptError, match="records no checksums"):
        distckpt.load(comm, state, path, allow_unchecked=False)  # MindSpore's crc_check=True


def test_the_reader_checks_what_it_can_and_says_what_it_cannot(comm, shared_dir):
    import zlib
    path = os.path.join(shared_dir, f"footer-{comm.rank}.ckpt")
    w = np.arange(6, dtype=np.float32)
    body = _record("w", [6], "Float32", w.tobytes())
    crc = zlib.crc32(body)
    with open(path, "wb") as f:  # MindSpore's crc_check=True: the footer covers the whole file
        f.write(body + b"crc_num" + crc.to_bytes(10, "big"))
    with distckpt.open(path) as r, pytest.warns(UserWarning, match="whole-file CRC-32"):
        assert (r.tensor("w") == w).all()
    with distckpt.open(path, check=True) as r:  # read once, checked: no warning
        import warnings
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert (r.tensor("w") == w).all()
    flipped = bytearray(body)
    flipped[-5] ^= 0x40  # a byte of w's data
    with open(path, "wb") as f:
        f.write(bytes(flipped) + b"crc_num" + crc.to_bytes(10, "big"))
    with pytest.raises(distckpt.CorruptionError, match="CRC-32"):
        distckpt.open(path, check=True)
    # Our own .ckpt: every chunk's CRC32C, checked on each whole-tensor read, with no warning.
    state = distckpt.StateDict(comm, {"w": w.copy()})
    saved = distckpt.save(comm, state, os.path.join(shared_dir, "ours"), "ours", format="ckpt")
    comm.barrier()
    with distckpt.open(saved.path) as r:
        import warnings
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert (r.tensor("w") == w).all()
