"""Random bit flips in small checkpoints: each is detected, or provably outside the bytes read.

"Outside the bytes read" (a single .pt, a torch.save zip) means both of these hold:
- the flipped byte lies in a zip field that neither torch's reader nor our verification takes a value
  from: a local header's fields after its signature up to its name length (both readers take version,
  flags, method, time, CRC and sizes from the central directory), a local extra field (torch's alignment
  padding), a data descriptor after an entry's data (a copy of the central CRC and sizes), a central
  entry's version, flags, time/date, disk number and attributes, the zip64 end record's size and versions,
  and the classic end record (superseded by the zip64 one torch always writes);
- and torch.load of the flipped file gives exactly the original values.
A flip that torch's reader cannot parse counts as detected only if load_checkpoint refuses it with our
paragraph. A sharded directory has no such bytes: CHECKSUMS covers every byte of every file, itself included.
"""
import os
import struct
import zipfile
import zlib

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardtrain.core.errors import CheckpointError
from shardtrain.trainer.checkpoint.checksums import Damaged
from shardtrain.trainer.checkpoint.consolidate import file_to_sharded
from shardtrain.trainer.checkpoint.sharded import ShardedDirectory
from shardtrain.trainer.checkpoint.single_file import SingleFile, load_checkpoint

STATE = {"version": 3, "cfg": {"optimization": {"lr": [0.5]}}, "model": {"w": torch.arange(12.0).reshape(3, 4),
         "b": torch.full((5,), -2.5)}, "optimizer": {"state": {0: {"step": torch.tensor(3.0)}}}}


def same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def unused_zip_bytes(path: str) -> set:
    """The offsets of the zip fields the module docstring lists."""
    data = open(path, "rb").read()
    unused = set()
    with zipfile.ZipFile(path) as archive:
        headers = sorted(i.header_offset for i in archive.infolist())
        sizes = {i.header_offset: i.compress_size for i in archive.infolist()}
    central = data.index(b"PK\x01\x02")
    for h, following in zip(headers, headers[1:] + [central]):
        n, e = struct.unpack("<HH", data[h + 26:h + 30])
        unused |= set(range(h + 4, h + 26)) | set(range(h + 30 + n, h + 30 + n + e))
        unused |= set(range(h + 30 + n + e + sizes[h], following))  # data descriptor
    c = central
    while data[c:c + 4] == b"PK\x01\x02":
        n, e, k = struct.unpack("<HHH", data[c + 28:c + 34])
        unused |= set(range(c + 4, c + 10)) | set(range(c + 12, c + 16)) | set(range(c + 34, c + 42))
        c += 46 + n + e + k
    assert data[c:c + 4] == b"PK\x06\x06"  # torch writes the zip64 end record, then its locator, then the classic
    unused |= set(range(c + 4, c + 16))
    unused |= set(range(len(data) - 18, len(data)))
    return unused


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("flip") / "c.pt")
    torch.save(STATE, path)
    return path, open(path, "rb").read(), unused_zip_bytes(path)


# derandomized: the same 400 flips in every run (CI must not turn red on the day a seed finds a new one);
# a seed that did (2026-11-23: the zip64 locator's offset, now checked) led to the exhaustive test below
@settings(max_examples=400, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(where=st.floats(0, 1, exclude_max=True), bit=st.integers(0, 7))
def test_a_flip_in_a_single_file_is_detected_or_outside_the_bytes_read(single, tmp_path, where, bit):
    path, original, unused = single
    check_flip(original, unused, str(tmp_path / "d.pt"), int(where * len(original)), bit)


def test_every_flip_in_the_end_records_is_detected_or_outside_the_bytes_read(single, tmp_path):
    """Every bit of the zip64 end record, its locator and the classic end record (98 bytes)."""
    path, original, unused = single
    for offset in range(len(original) - 98, len(original)):
        for bit in range(8):
            check_flip(original, unused, str(tmp_path / "d.pt"), offset, bit)


def check_flip(original: bytes, unused: set, damaged: str, offset: int, bit: int) -> None:
    flipped = bytearray(original)
    flipped[offset] ^= 1 << bit
    with open(damaged, "wb") as f:
        f.write(flipped)
    try:
        SingleFile().verify(damaged)
    except Damaged:
        return  # detected
    try:
        loaded = torch.load(damaged, weights_only=True)
    except Exception:  # noqa: BLE001 - torch cannot parse it: the loader must refuse it in one paragraph
        with pytest.raises(CheckpointError, match="Cannot load checkpoint"):
            load_checkpoint(damaged)
        return
    assert offset in unused, f"offset {offset} bit {bit}: not detected, and in a field torch reads"
    assert same(STATE, loaded), f"offset {offset} bit {bit}: not detected, and the loaded values changed"


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    root = tmp_path_factory.mktemp("flipdir")
    torch.save(STATE, root / "c.pt")
    file_to_sharded(str(root / "c.pt"), str(root / "dir"))
    directory = root / "dir"
    return str(directory), {name: (directory / name).read_bytes() for name in sorted(os.listdir(directory))}


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pick=st.floats(0, 1, exclude_max=True), where=st.floats(0, 1, exclude_max=True), bit=st.integers(0, 7))
def test_every_flip_in_a_sharded_directory_is_detected(sharded, pick, where, bit):
    directory, files = sharded
    name = sorted(files)[int(pick * len(files))]
    original = files[name]
    flipped = bytearray(original)
    flipped[int(where * len(original))] ^= 1 << bit
    path = os.path.join(directory, name)
    try:
        with open(path, "wb") as f:
            f.write(flipped)
        with pytest.raises(Damaged):
            ShardedDirectory().verify(directory)
    finally:
        with open(path, "wb") as f:
            f.write(original)
    ShardedDirectory().verify(directory)  # restored: intact again


def test_the_sharded_directory_lists_every_file(sharded):
    directory, files = sharded
    assert sorted(files) == [".metadata", "CHECKSUMS", "COMPLETE", "__0_0.distcp", "extra.pt"]


def test_long_files_are_hashed_and_verified_block_by_block(tmp_path, monkeypatch):
    from shardtrain.trainer.checkpoint import checksums

    monkeypatch.setattr(checksums, "BLOCK", 7)
    data = bytes(range(30))
    sums = checksums.BlockCrcs()
    for piece in (data[:3], data[3:20], data[20:]):  # writes that straddle blocks
        sums.update(memoryview(piece))
    assert sums.entry() == {"crc32": [f"{zlib.crc32(data[i:i + 7]):08x}" for i in range(0, 30, 7)], "size": 30}
    (tmp_path / "f").write_bytes(data)
    assert checksums.verify_directory(str(tmp_path), {"f": sums.entry()}) == 30
    (tmp_path / "f").write_bytes(data[:15] + bytes([data[15] ^ 1]) + data[16:])
    with pytest.raises(checksums.Damaged, match="block at byte 14"):
        checksums.verify_directory(str(tmp_path), {"f": sums.entry()})
