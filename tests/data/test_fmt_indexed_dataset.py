"""MMIDIDX .bin/.idx: exact bytes, reading, merging, and every corruption -> DataError."""
import os
import pickle
import shutil
import struct

import numpy as np
import pytest

from shardtrain.data.dictionary import Dictionary
from shardtrain.data import indexed_dataset
from shardtrain.data.indexed_dataset import (MMapIndexedDataset, MMapIndexedDatasetBuilder,
                                             best_fitting_int_dtype)
from shardtrain.core.errors import DataError

ITEMS = [[5, 6, 2], [2], []]


def write(prefix, items, dtype):
    with MMapIndexedDatasetBuilder(f"{prefix}.bin", dtype) as builder:
        for item in items:
            builder.add_item(np.array(item))
        builder.finalize(f"{prefix}.idx")


def expected_idx(code, sizes, pointers):
    """The index layout written out by hand: magic, version, dtype code, count, sizes, pointers."""
    n = len(sizes)
    return (b"MMIDIDX\x00\x00" + struct.pack("<Q", 1) + struct.pack("<B", code) + struct.pack("<Q", n)
            + struct.pack(f"<{n}i", *sizes) + struct.pack(f"<{n}q", *pointers))


@pytest.mark.parametrize("dtype, code, fmt, pointers", [
    (np.uint16, 8, "<4H", (0, 6, 8)),
    (np.int32, 4, "<4i", (0, 12, 16)),
    (np.int64, 5, "<4q", (0, 24, 32)),
])
def test_bytes_match_hand_computed_layout(tmp_path, dtype, code, fmt, pointers):
    prefix = str(tmp_path / "tiny")
    write(prefix, ITEMS, dtype)
    assert open(prefix + ".bin", "rb").read() == struct.pack(fmt, 5, 6, 2, 2)
    assert open(prefix + ".idx", "rb").read() == expected_idx(code, (3, 1, 0), pointers)
    assert sorted(os.listdir(tmp_path)) == ["tiny.bin", "tiny.idx"]  # temp files renamed away


def test_add_items_equals_add_item(tmp_path):
    one, batch = str(tmp_path / "one"), str(tmp_path / "batch")
    write(one, ITEMS + [[65535]], np.uint16)
    with MMapIndexedDatasetBuilder(batch + ".bin", np.uint16) as builder:
        builder.add_items(ITEMS)
        builder.add_items([])
        builder.add_items([[65535]])
        builder.finalize(batch + ".idx")
    for ext in (".bin", ".idx"):
        assert open(one + ext, "rb").read() == open(batch + ext, "rb").read()


def test_reader_returns_items(tmp_path):
    prefix = str(tmp_path / "tiny")
    write(prefix, ITEMS, np.uint16)
    ds = MMapIndexedDataset(prefix)
    assert len(ds) == 3 and ds.dtype == np.uint16
    assert ds.sizes.dtype == np.int32 and ds.sizes.tolist() == [3, 1, 0]
    assert [ds[i].tolist() for i in range(3)] == ITEMS and ds[0].dtype == np.int64
    assert ds[-3].tolist() == [5, 6, 2] and [a.tolist() for a in ds[1:]] == ITEMS[1:]
    with pytest.raises(IndexError):
        ds[3]
    clone = pickle.loads(pickle.dumps(ds))  # DataLoader workers pickle datasets
    assert [clone[i].tolist() for i in range(3)] == ITEMS
    assert MMapIndexedDataset.exists(prefix) and not MMapIndexedDataset.exists(prefix + "x")


def test_empty_dataset(tmp_path):
    prefix = str(tmp_path / "empty")
    write(prefix, [], np.uint16)
    assert os.path.getsize(prefix + ".bin") == 0
    assert open(prefix + ".idx", "rb").read() == expected_idx(8, (), ())
    assert len(MMapIndexedDataset(prefix)) == 0


def test_merge_equals_writing_everything_at_once(tmp_path):
    a, b, merged, whole = (str(tmp_path / n) for n in ("a", "b", "merged", "whole"))
    write(a, ITEMS, np.uint16)
    write(b, [[7, 7], [9]], np.uint16)
    with MMapIndexedDatasetBuilder(merged + ".bin", np.uint16) as builder:
        builder.add_item(np.array([1]))
        builder.merge_file_(a)
        builder.merge_file_(b)
        builder.finalize(merged + ".idx")
    write(whole, [[1]] + ITEMS + [[7, 7], [9]], np.uint16)
    for ext in (".bin", ".idx"):
        assert open(merged + ext, "rb").read() == open(whole + ext, "rb").read()
    with MMapIndexedDatasetBuilder(str(tmp_path / "c.bin"), np.int32) as builder:
        with pytest.raises(ValueError, match="cannot merge"):
            builder.merge_file_(a)
        builder.abort()


def test_builder_rejects_ids_that_do_not_fit_and_cleans_up(tmp_path):
    with pytest.raises(ValueError, match="do not fit uint16"):
        with MMapIndexedDatasetBuilder(str(tmp_path / "x.bin"), np.uint16) as builder:
            builder.add_item(np.array([1, 70000]))
    assert os.listdir(tmp_path) == []  # the aborted builder left no temp file


def test_best_fitting_int_dtype():
    assert best_fitting_int_dtype(360) == np.uint16
    assert best_fitting_int_dtype(65499) == np.uint16
    assert best_fitting_int_dtype(65500) == np.int32


def test_reads_fairseq_fixture(fairseq_dir):
    d = Dictionary.load(str(fairseq_dir / "dict.txt"))
    lines = (fairseq_dir / "train.txt").read_text().splitlines()
    ds = MMapIndexedDataset(str(fairseq_dir / "train"))
    assert len(ds) == len(lines) == 3000 and ds.dtype == np.uint16
    for i in (0, 1, 2, 2999):
        assert ds[i][-1] == d.eos() and d.string(ds[i]) == lines[i]
    assert int(ds.sizes.sum()) * 2 == os.path.getsize(fairseq_dir / "train.bin")
    valid = MMapIndexedDataset(str(fairseq_dir / "valid"))
    assert d.string(valid[0]) == (fairseq_dir / "valid.txt").read_text().splitlines()[0]


def _corrupt(field):
    """Functions that damage a valid (prefix.idx, prefix.bin) pair of ITEMS in uint16."""
    def patch(offset, data):
        def apply(prefix):
            with open(prefix + ".idx", "r+b") as f:
                f.seek(offset)
                f.write(data)
        return apply

    def resize(ext, delta):
        def apply(prefix):
            path = prefix + ext
            data = open(path, "rb").read()
            open(path, "wb").write(data[:delta] if delta < 0 else data + b"\0" * delta)
        return apply

    return {
        "missing idx": lambda p: os.remove(p + ".idx"),
        "missing bin": lambda p: os.remove(p + ".bin"),
        "empty idx": resize(".idx", -10**6),
        "wrong magic": patch(0, b"TNTIDX\x00\x00"),
        "wrong version": patch(9, struct.pack("<Q", 2)),
        "unknown dtype code": patch(17, struct.pack("<B", 0)),
        "dtype code too big": patch(17, struct.pack("<B", 11)),
        "count too big": patch(18, struct.pack("<Q", 4)),
        "count huge": patch(18, struct.pack("<Q", 2**63)),
        "truncated idx": resize(".idx", -1),
        "truncated header": resize(".idx", -(12 * 3 + 1)),
        "trailing bytes in idx": resize(".idx", 4),
        "negative size": patch(26, struct.pack("<i", -1)),
        "pointer off": patch(26 + 12 + 8, struct.pack("<q", 7)),
        "first pointer nonzero": patch(26 + 12, struct.pack("<q", 2)),
        "sizes disagree with bin": patch(26, struct.pack("<i", 2)),
        "truncated bin": resize(".bin", -2),
        "longer bin": resize(".bin", 2),
    }[field]


@pytest.mark.parametrize("case", [
    "missing idx", "missing bin", "empty idx", "wrong magic", "wrong version", "unknown dtype code",
    "dtype code too big", "count too big", "count huge", "truncated idx", "truncated header",
    "trailing bytes in idx", "negative size", "pointer off", "first pointer nonzero",
    "sizes disagree with bin", "truncated bin", "longer bin",
])
def test_corruption_raises_data_error(tmp_path, case):
    prefix = str(tmp_path / "train")
    write(prefix, ITEMS, np.uint16)
    MMapIndexedDataset(prefix)  # valid before the damage
    _corrupt(case)(prefix)
    with pytest.raises(DataError) as info:
        MMapIndexedDataset(prefix)
    message = str(info.value)
    assert prefix in message and "shard-preprocess" in message


def test_fixture_with_wrong_bin_is_detected(tmp_path, fairseq_dir):
    shutil.copy(fairseq_dir / "train.idx", tmp_path / "valid.idx")
    shutil.copy(fairseq_dir / "valid.bin", tmp_path / "valid.bin")
    with pytest.raises(DataError, match="do not belong together"):
        MMapIndexedDataset(str(tmp_path / "valid"))


@pytest.mark.parametrize("dtype", [np.uint16, np.int32])
@pytest.mark.parametrize("scan_block", [3, 1 << 24])  # blocks that split items, and one block for all
def test_first_out_of_range_finds_every_item(tmp_path, monkeypatch, dtype, scan_block):
    """Every position is scanned (not a sample of the first items): a bad id in each place, one at a time,
    including an id equal to the limit, an empty item before it, and (signed) a negative id."""
    monkeypatch.setattr(indexed_dataset, "_SCAN_BLOCK", scan_block)
    items = [[4, 5, 6], [], [7], [1, 2, 3, 4, 5], [], [], [9, 9]]
    limit = 10
    bad_ids = [limit, 300] + ([-1] if np.dtype(dtype).kind == "i" else [])
    prefix = str(tmp_path / "d")
    for item_index, item in enumerate(items):
        for position in range(len(item)):
            for bad in bad_ids:
                changed = [list(x) for x in items]
                changed[item_index][position] = bad
                assert _written(prefix, changed, dtype).first_out_of_range(limit) == (item_index, bad)
    assert _written(prefix, items, dtype).first_out_of_range(limit) is None


def _written(prefix, items, dtype):
    with MMapIndexedDatasetBuilder(prefix + ".bin", dtype=dtype) as builder:
        for x in items:
            builder.add_item(np.array(x, dtype=np.int64))
    builder.finalize(prefix + ".idx")
    return MMapIndexedDataset(prefix)
