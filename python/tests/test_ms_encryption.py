"""Encrypted .ckpt files in MindSpore 2.x's framing (mindspore/core/utils/crypto.cc at commit
a64e3b749f2430ea2822675d62a0465dcd9ffddf), checked against a decoder and an encoder written
here from that framing alone, with python3-cryptography: distckpt's files decrypt with it,
and files it encrypts (as MindSpore's save_checkpoint(enc_key=...) does, blocks of any size
up to 64 MiB) load with distckpt. Run under mpirun at 1, 2 and 4 ranks."""
import os
import struct

import numpy as np
import pytest
from cryptography.hazmat.primitives import padding
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

import distckpt
from test_mindspore_files import _record

MAGIC = {"AES-GCM": 0x7F3A5ED8, "AES-CBC": 0x7F3A5ED9, "SM4-CBC": 0x7F3A5EDA}
KEYS = {"AES-GCM": bytes(range(32)), "AES-CBC": bytes(range(100, 124)), "SM4-CBC": bytes(range(50, 66))}


def _cbc(mode, key, iv):
    algorithm = algorithms.SM4(key) if mode == "SM4-CBC" else algorithms.AES(key)
    return Cipher(algorithm, modes.CBC(iv))


def ms_decrypt(data, key, mode):
    """The plaintext of a framed file, and how many blocks it had."""
    out, at, blocks = bytearray(), 0, 0
    while at < len(data):
        (magic,) = struct.unpack_from("<I", data, at)
        assert magic == MAGIC[mode], hex(magic)
        at += 4
        tag = None
        if mode == "AES-GCM":
            tag = data[at:at + 16]
            at += 16
        block_size, iv_len = struct.unpack_from("<iI", data, at)
        assert iv_len == 16
        iv = data[at + 8:at + 24]
        (cipher_len,) = struct.unpack_from("<i", data, at + 24)
        assert block_size == 4 + 16 + 4 + cipher_len
        body = data[at + 28:at + 28 + cipher_len]
        assert len(body) == cipher_len
        at += 28 + cipher_len
        if mode == "AES-GCM":
            assert cipher_len <= 64 << 20
            out += AESGCM(key).decrypt(iv, body + tag, None)
        else:
            d = _cbc(mode, key, iv).decryptor()
            u = padding.PKCS7(128).unpadder()
            out += u.update(d.update(body) + d.finalize()) + u.finalize()
        blocks += 1
    return bytes(out), blocks


def ms_encrypt(plain, key, mode, block=64 << 20):
    out = bytearray()
    for start in range(0, len(plain), block):
        piece, iv = plain[start:start + block], os.urandom(16)
        if mode == "AES-GCM":
            sealed = AESGCM(key).encrypt(iv, piece, None)
            body, tag = sealed[:-16], sealed[-16:]
        else:
            p = padding.PKCS7(128).padder()
            e = _cbc(mode, key, iv).encryptor()
            body, tag = e.update(p.update(piece) + p.finalize()) + e.finalize(), b""
        out += struct.pack("<I", MAGIC[mode]) + tag
        out += struct.pack("<iI", 4 + 16 + 4 + len(body), 16) + iv + struct.pack("<i", len(body)) + body
    return bytes(out)


def _state(comm, rows=8, cols=6):
    layout = distckpt.TensorLayout.from_device_matrix([rows, cols], [comm.size], [0, -1]) if rows % comm.size == 0 \
        else None
    full = np.arange(rows * cols, dtype=np.float32).reshape(rows, cols)
    mine = full if layout is None else full[comm.rank * rows // comm.size:(comm.rank + 1) * rows // comm.size].copy()
    bias = np.arange(5, dtype=np.int64)
    layouts = {} if layout is None else {"w": layout}
    return full, bias, mine, layouts


@pytest.mark.parametrize("mode", ["AES-GCM", "AES-CBC", "SM4-CBC"])
def test_our_encrypted_ckpt_decrypts_with_an_independent_decoder(comm, shared_dir, mode):
    full, bias, mine, layouts = _state(comm)
    state = distckpt.StateDict(comm, {"layer.weight": mine, "b": bias},
                               {"layer.weight": layouts["w"]} if layouts else {}, info={"learning_rate": 0.25})
    out = distckpt.save(comm, state, shared_dir, "enc", step=7, epoch=2, format="ckpt", key=KEYS[mode], enc_mode=mode)
    with open(out.path, "rb") as f:
        data = f.read()
    assert b"layer.weight" not in data and b"learning_rate" not in data and b"step_num" not in data  # names hidden
    plain, blocks = ms_decrypt(data, KEYS[mode], mode)
    assert blocks == 1 and b"step_num" in plain and b"Float32" in plain  # MindSpore's records
    # The plaintext is a .ckpt distckpt reads without a key, every record's CRC32C checked.
    copy = os.path.join(shared_dir, f"plain-{mode}-{comm.rank}.ckpt")
    with open(copy, "wb") as f:
        f.write(plain)
    with distckpt.open(copy) as r:
        assert (r.tensor("layer.weight") == full).all() and (r.tensor("b") == bias).all() and r.info.step == 7
    assert distckpt.verify(copy).checksums
    # Loaded back with the key, on every rank's layout; without it, nothing.
    got, got_b = np.zeros_like(mine), np.zeros_like(bias)
    named = {"layer.weight": layouts["w"]} if layouts else {}
    loaded = distckpt.load(comm, distckpt.StateDict(comm, {"layer.weight": got, "b": got_b}, named), out.path,
                           key=KEYS[mode])
    assert (got == mine).all() and (got_b == bias).all() and loaded.step == 7 and loaded.info["learning_rate"] == 0.25
    if mode == "AES-GCM":
        assert loaded.warning == ""
    else:
        assert "authenticates nothing" in loaded.warning
    with pytest.raises(distckpt.AuthError, match="its key is needed"):
        distckpt.load(comm, distckpt.StateDict(comm, {"layer.weight": got}, named), out.path)


def test_a_file_encrypted_as_mindspore_does_loads_in_any_mode_and_block_size(comm, shared_dir):
    w = np.arange(300, dtype=np.float32).reshape(30, 10)
    plain = _record("w", [30, 10], "Float32", w.tobytes()) + _record("step_num", [0], "Int64", struct.pack("<q", 5))
    for mode in MAGIC:
        for block in (len(plain), 100, 16):  # one block, several, and block-aligned pieces
            path = os.path.join(shared_dir, f"ms-{mode}-{block}-{comm.rank}.ckpt")
            with open(path, "wb") as f:
                f.write(ms_encrypt(plain, KEYS[mode], mode, block))
            with distckpt.open(path, key=KEYS[mode]) as r:
                if mode == "AES-GCM":  # every block read is authenticated
                    assert (r.tensor("w") == w).all() and r.info.step == 5
                else:
                    with pytest.warns(UserWarning, match="authenticates nothing"):
                        assert (r.tensor("w") == w).all() and r.info.step == 5
            assert ms_decrypt(open(path, "rb").read(), KEYS[mode], mode)[0] == plain
    # A wrong key fails authentication; one changed byte past the first block is damage,
    # since other blocks authenticate with the key (the manager's resume falls back past it).
    path = os.path.join(shared_dir, f"ms-tamper-{comm.rank}.ckpt")
    sealed = bytearray(ms_encrypt(plain, KEYS["AES-GCM"], "AES-GCM", 100))
    with open(path, "wb") as f:
        f.write(sealed)
    with pytest.raises(distckpt.AuthError):
        distckpt.open(path, key=bytes(32))
    sealed[len(sealed) // 2] ^= 1
    with open(path, "wb") as f:
        f.write(sealed)
    with pytest.raises(distckpt.CorruptionError):
        with distckpt.open(path, key=KEYS["AES-GCM"]) as r:
            r.tensor("w")
    sealed[len(sealed) // 2] ^= 1
    sealed[30] ^= 4  # in the first block's IV: nothing proves the key, so it fails as a wrong key would
    with open(path, "wb") as f:
        f.write(sealed)
    with pytest.raises(distckpt.AuthError, match="tag does not match"):
        with distckpt.open(path, key=KEYS["AES-GCM"]) as r:
            r.tensor("w")


def test_a_tensor_over_one_block_spans_blocks_that_reshard(comm, shared_dir):
    rows, cols = 4 * 1100, 4096  # 68.75 MiB of float32: two blocks
    full, bias, mine, layouts = _state(comm, rows, cols)
    state = distckpt.StateDict(comm, {"w": mine}, layouts)
    out = distckpt.save(comm, state, shared_dir, "big", format="ckpt", key=KEYS["AES-GCM"])
    if comm.rank == 0:
        plain, blocks = ms_decrypt(open(out.path, "rb").read(), KEYS["AES-GCM"], "AES-GCM")
        assert blocks == 2 and full.tobytes() in plain
    # Loaded column-split instead of row-split: each rank decrypts the blocks it touches.
    split = distckpt.TensorLayout.from_device_matrix([rows, cols], [comm.size], [-1, 0])
    part = np.zeros((rows, cols // comm.size), np.float32)
    distckpt.load(comm, distckpt.StateDict(comm, {"w": part}, {"w": split}), out.path, key=KEYS["AES-GCM"])
    width = cols // comm.size
    assert (part == full[:, comm.rank * width:(comm.rank + 1) * width]).all()


def test_crc_check_and_a_key_exclude_each_other_and_modes_are_named(comm, shared_dir):
    state = distckpt.StateDict(comm, {"b": np.arange(3, dtype=np.int64)})
    with pytest.raises(ValueError, match="mutually exclusive"):
        distckpt.save(comm, state, shared_dir, "x", format="ckpt", key=KEYS["AES-GCM"], crc_check=True)
    with pytest.raises(ValueError, match="enc_mode"):
        distckpt.save(comm, state, shared_dir, "x", format="ckpt", key=KEYS["AES-GCM"], enc_mode="AES-XTS")
    with pytest.raises(distckpt.DistckptError, match="16-byte key"):
        distckpt.save(comm, state, shared_dir, "x", format="ckpt", key=bytes(32), enc_mode="SM4-CBC")
    with pytest.raises(ValueError, match="without a key"):
        distckpt.save(comm, state, shared_dir, "x", format="ckpt", enc_mode="AES-CBC")
    # A wrong key on a CBC file fails as such (bad padding), by the file's path or its root's;
    # about once in 256 keys the padding happens to pass and the plaintext's structure fails.
    out = distckpt.save(comm, state, shared_dir, "c", format="ckpt", key=KEYS["AES-CBC"], enc_mode="AES-CBC")
    for path in (out.path, shared_dir):
        with pytest.raises((distckpt.AuthError, distckpt.CorruptionError)):
            distckpt.open(path, key=bytes(range(7, 31)))


def test_files_encrypted_chunk_by_chunk_still_load(comm):
    here = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "data")
    for name in ("legacy_chunk_gcm.ckpt", "legacy_chunk_cbc.ckpt"):
        with distckpt.open(os.path.join(here, name), key=bytes(range(32))) as r:
            assert (r.tensor("layer.weight") == np.arange(12, dtype=np.float32).reshape(3, 4)).all()
            assert (r.tensor("layer.bias") == np.array([1, 2, 3])).all() and r.info.step == 3
