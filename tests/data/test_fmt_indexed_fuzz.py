"""Property tests: round trips, and arbitrary bytes never escape as anything but DataError.

"Never reads out of bounds" is checked on every dataset the reader accepts: its
items, back to back, are exactly the .bin file's tokens, so no item starts or
ends outside the file (numpy would silently shorten a slice past the end, and
a pointer into another item's bytes would break the equality)."""
import os
import struct
import tempfile

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardtrain.data.dictionary import Dictionary
from shardtrain.data.indexed_dataset import MMapIndexedDataset, MMapIndexedDatasetBuilder
from shardtrain.core.errors import DataError

SETTINGS = settings(max_examples=60, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
DTYPES = {np.uint8: 255, np.uint16: 65535, np.int32: 2**31 - 1, np.int64: 2**63 - 1}
HEADER = b"MMIDIDX\x00\x00" + struct.pack("<Q", 1)


def write(prefix, items, dtype):
    with MMapIndexedDatasetBuilder(prefix + ".bin", dtype) as builder:
        for item in items:
            builder.add_item(np.array(item, dtype=np.int64))
        builder.finalize(prefix + ".idx")


def read_all(prefix):
    """Open and read every item; returns them, or None when the reader reports DataError."""
    try:
        ds = MMapIndexedDataset(prefix)
    except DataError:
        return None
    items = [ds[i] for i in range(len(ds))]
    assert [len(a) for a in items] == ds.sizes.tolist()
    on_disk = np.fromfile(prefix + ".bin", dtype=ds.dtype).astype(np.int64)
    assert np.array_equal(np.concatenate(items) if items else np.zeros(0, np.int64), on_disk)
    return items


@st.composite
def datasets(draw):
    dtype = draw(st.sampled_from(sorted(DTYPES, key=str)))
    ids = st.integers(min_value=0, max_value=DTYPES[dtype])
    return dtype, draw(st.lists(st.lists(ids, max_size=20), max_size=20))


@SETTINGS
@given(datasets())
def test_round_trip(data):
    dtype, items = data
    with tempfile.TemporaryDirectory() as tmp:
        prefix = os.path.join(tmp, "x")
        write(prefix, items, dtype)
        assert os.path.getsize(prefix + ".idx") == 26 + 12 * len(items)
        assert os.path.getsize(prefix + ".bin") == sum(map(len, items)) * np.dtype(dtype).itemsize
        ds = MMapIndexedDataset(prefix)
        assert ds.dtype == dtype and ds.sizes.tolist() == [len(i) for i in items]
        assert [ds[i].tolist() for i in range(len(ds))] == items


@st.composite
def consistent_headers(draw):
    """A header whose count matches the file length, so the checks behind it get exercised."""
    code, count = draw(st.integers(0, 12)), draw(st.integers(0, 6))
    arrays = draw(st.binary(min_size=12 * count, max_size=12 * count))
    return HEADER + struct.pack("<BQ", code, count) + arrays


@SETTINGS
@given(st.one_of(st.binary(max_size=200), st.binary(max_size=120).map(lambda b: HEADER + b), consistent_headers()),
       st.binary(max_size=64))
def test_arbitrary_index_bytes_only_raise_data_error(idx_bytes, bin_bytes):
    with tempfile.TemporaryDirectory() as tmp:
        prefix = os.path.join(tmp, "x")
        open(prefix + ".idx", "wb").write(idx_bytes)
        open(prefix + ".bin", "wb").write(bin_bytes)
        read_all(prefix)


@SETTINGS
@given(datasets(), st.sampled_from([".idx", ".bin"]), st.data())
def test_truncation_is_detected(data, ext, draw):
    dtype, items = data
    with tempfile.TemporaryDirectory() as tmp:
        prefix = os.path.join(tmp, "x")
        write(prefix, items, dtype)
        content = open(prefix + ext, "rb").read()
        keep = draw.draw(st.integers(min_value=0, max_value=len(content)))
        open(prefix + ext, "wb").write(content[:keep])
        result = read_all(prefix)
        if keep < len(content):
            assert result is None
        else:
            assert [a.tolist() for a in result] == items


@SETTINGS
@given(datasets(), st.data())
def test_flipped_index_bytes_are_detected_or_harmless(data, draw):
    dtype, items = data
    with tempfile.TemporaryDirectory() as tmp:
        prefix = os.path.join(tmp, "x")
        write(prefix, items, dtype)
        content = bytearray(open(prefix + ".idx", "rb").read())
        pos = draw.draw(st.integers(min_value=0, max_value=len(content) - 1))
        content[pos] ^= draw.draw(st.integers(min_value=1, max_value=255))
        open(prefix + ".idx", "wb").write(content)
        read_all(prefix)  # may succeed (e.g. a flipped dtype code of equal width), never crash


@SETTINGS
@given(st.one_of(st.binary(max_size=200),
                 st.lists(st.tuples(st.text(max_size=6), st.text(alphabet="0123456789 -#x", max_size=6)),
                          max_size=8).map(lambda rows: "\n".join(f"{a} {b}" for a, b in rows).encode())))
def test_arbitrary_dict_txt_only_raises_data_error(content):
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "dict.txt")
        open(path, "wb").write(content)
        try:
            d = Dictionary.load(path)
        except DataError:
            return
        assert len(d) >= 4  # the special symbols, then the file's
