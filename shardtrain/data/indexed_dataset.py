"""fairseq's mmap indexed dataset (``<prefix>.bin`` + ``<prefix>.idx``), byte for byte.

``.idx``: magic ``MMIDIDX\\0\\0``, ``<Q`` version 1, ``<B`` dtype code, ``<Q``
item count, then the item sizes (int32) and their byte offsets into ``.bin``
(int64). ``.bin``: all items' tokens back to back in that dtype. The reader
validates the whole index before use, so a corrupt or mismatched pair fails
with a :class:`DataError` up front rather than with garbage tokens mid-training.
"""
import itertools
import os
import shutil
import struct
from array import array
from typing import List, Optional, Tuple

import numpy as np
import torch

from shardtrain.core.errors import DataError
from shardtrain.core.fileio import open_new, remove_quietly, temp_sibling

_MAGIC = b"MMIDIDX\x00\x00"
_HEADER = struct.Struct("<9sQBQ")  # magic, version, dtype code, item count
_VERSION = 1
# fairseq's codes; 9 and 10 come from fairseq after 0.12, accepted when reading.
DTYPE_CODES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64,
               6: np.float64, 7: np.double, 8: np.uint16, 9: np.uint32, 10: np.uint64}
_BLOCK = 1 << 20  # items per block when scanning an index, to bound memory
_SCAN_BLOCK = 1 << 24  # tokens per block when scanning the .bin: large for numpy, small next to a corpus
_REBUILD = "Re-run shard-preprocess to rebuild this split."


def index_file_path(prefix: str) -> str:
    return prefix + ".idx"


def data_file_path(prefix: str) -> str:
    return prefix + ".bin"


def best_fitting_int_dtype(vocab_size: int) -> type:
    """The smallest token dtype for ``vocab_size`` (fairseq 0.12's rule)."""
    return np.uint16 if vocab_size < 65500 else np.int32


def dtype_code(dtype) -> int:
    dtype = np.dtype(dtype)
    for code, candidate in DTYPE_CODES.items():
        if np.dtype(candidate) == dtype:
            return code
    raise ValueError(f"dtype {dtype} has no code in the MMIDIDX format; use one of "
                     f"{sorted({np.dtype(d).name for d in DTYPE_CODES.values()})}")


class MMapIndexedDataset(torch.utils.data.Dataset):
    """Read-only view of ``<prefix>.bin/.idx``; tokens stay on disk (memory-mapped)."""

    def __init__(self, prefix: str):
        super().__init__()
        self._open(prefix)

    def _open(self, prefix: str) -> None:
        self._prefix = prefix
        self._dtype, self._sizes, self._pointers, nbytes = read_index(index_file_path(prefix))
        self._data = _map_data(data_file_path(prefix), self._dtype, nbytes)

    # A memmap would pickle as a full in-memory copy; DataLoader workers re-open instead.
    def __getstate__(self):
        return self._prefix

    def __setstate__(self, prefix):
        self._open(prefix)

    @property
    def sizes(self) -> np.ndarray:
        return self._sizes

    @property
    def dtype(self) -> np.dtype:
        return self._dtype

    def __len__(self) -> int:
        return len(self._sizes)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        size = int(self._sizes[i])  # IndexError for a bad i, like any sequence
        start = int(self._pointers[i]) // self._dtype.itemsize
        return np.array(self._data[start:start + size], dtype=np.int64)

    def num_tokens(self, i: int) -> int:
        return int(self._sizes[i])

    def size(self, i: int) -> int:
        return int(self._sizes[i])

    def first_out_of_range(self, limit: int) -> Optional[Tuple[int, int]]:
        """(item, token id) of the first token id outside ``[0, limit)``, or None: one vectorised
        pass over the whole memory map, in blocks so that no copy of the corpus is made."""
        signed = self._dtype.kind == "i"
        for start in range(0, len(self._data), _SCAN_BLOCK):
            block = self._data[start:start + _SCAN_BLOCK]
            if block.max() >= limit or (signed and block.min() < 0):
                offset = start + int(np.argmax((block >= limit) | (block < 0)))
                starts = self._pointers // self._dtype.itemsize
                item = int(np.searchsorted(starts, offset, side="right")) - 1  # empty items share a start
                return item, int(self._data[offset])
        return None

    @staticmethod
    def exists(prefix: str) -> bool:
        return os.path.exists(index_file_path(prefix)) and os.path.exists(data_file_path(prefix))


def read_index(path: str):
    """Parse and fully validate an ``.idx``: (dtype, sizes, pointers, total .bin bytes)."""
    try:
        with open(path, "rb") as f:
            file_size = os.fstat(f.fileno()).st_size
            header = f.read(_HEADER.size)
    except FileNotFoundError:
        raise DataError(f"Index file {path} does not exist. {_REBUILD}") from None
    except OSError as e:
        raise DataError(f"Cannot read index file {path}: {e.strerror}. Check its permissions.") from None
    if header[:len(_MAGIC)] != _MAGIC[:len(header)]:
        raise DataError(f"{path} is not an mmap index (MMIDIDX) file: it may come from "
                        f"fairseq-preprocess --dataset-impl lazy/cached/raw, or be damaged. {_REBUILD}")
    if len(header) < _HEADER.size:
        raise DataError(f"Index file {path} is truncated ({file_size} bytes, shorter than the "
                        f"{_HEADER.size}-byte header). {_REBUILD}")
    _, version, code, count = _HEADER.unpack(header)
    if version != _VERSION:
        raise DataError(f"Index file {path} has format version {version}; only version {_VERSION} "
                        f"is supported. {_REBUILD}")
    if code not in DTYPE_CODES:
        raise DataError(f"Index file {path} names unknown token dtype code {code}. {_REBUILD}")
    expected = _HEADER.size + count * 12
    if file_size != expected:
        what = "truncated" if file_size < expected else "longer than its header says"
        raise DataError(f"Index file {path} is {what}: it holds {file_size} bytes but {count} items need "
                        f"{expected}. {_REBUILD}")
    dtype = np.dtype(DTYPE_CODES[code]).newbyteorder("<")
    sizes, pointers = _map_arrays(path, count)
    return dtype, sizes, pointers, _check_pointers(path, sizes, pointers, dtype.itemsize)


def _map_arrays(path: str, count: int):
    if count == 0:
        return np.zeros(0, dtype="<i4"), np.zeros(0, dtype="<i8")
    buffer = np.memmap(path, dtype=np.uint8, mode="r")
    sizes = np.frombuffer(buffer, dtype="<i4", count=count, offset=_HEADER.size)
    pointers = np.frombuffer(buffer, dtype="<i8", count=count, offset=_HEADER.size + 4 * count)
    return sizes, pointers


def _check_pointers(path: str, sizes: np.ndarray, pointers: np.ndarray, itemsize: int) -> int:
    """Every pointer must be the byte sum of the sizes before it; returns the total."""
    total = 0
    for start in range(0, len(sizes), _BLOCK):
        nbytes = sizes[start:start + _BLOCK].astype(np.int64) * itemsize
        if (nbytes < 0).any():
            bad = start + int(np.argmax(nbytes < 0))
            raise DataError(f"Index file {path} is corrupt: item {bad} has negative size {int(sizes[bad])}. "
                            f"{_REBUILD}")
        expect = total + np.cumsum(nbytes) - nbytes
        got = pointers[start:start + _BLOCK]
        if not np.array_equal(got, expect):
            bad = start + int(np.argmax(got != expect))
            raise DataError(f"Index file {path} is corrupt: item {bad} starts at byte {int(pointers[bad])} "
                            f"of the .bin but the sizes before it say {int(expect[bad - start])}. {_REBUILD}")
        total = int(expect[-1] + nbytes[-1])
    return total


def _map_data(path: str, dtype: np.dtype, nbytes: int) -> np.ndarray:
    try:
        file_size = os.path.getsize(path)
    except FileNotFoundError:
        raise DataError(f"Data file {path} does not exist (its .idx does). {_REBUILD}") from None
    except OSError as e:
        raise DataError(f"Cannot read data file {path}: {e.strerror}. Check its permissions.") from None
    if file_size != nbytes:
        what = "shorter" if file_size < nbytes else "longer"
        raise DataError(f"Data file {path} is {what} than its index says ({file_size} bytes, expected "
                        f"{nbytes}): the .bin and .idx do not belong together or one is truncated. {_REBUILD}")
    if nbytes == 0:  # mmap cannot map an empty file
        return np.zeros(0, dtype=dtype)
    try:
        return np.memmap(path, dtype=dtype, mode="r")
    except (OSError, ValueError) as e:
        raise DataError(f"Cannot memory-map data file {path}: {e}. {_REBUILD}") from None


class MMapIndexedDatasetBuilder:
    """Writes ``.bin``/``.idx`` under temporary names; ``finalize`` renames them into place.

    Use as a context manager so an exception removes the temporary file.
    """

    def __init__(self, bin_path: str, dtype=np.int64):
        self._dtype = np.dtype(dtype).newbyteorder("<")
        dtype_code(self._dtype)  # fail now, not after writing the whole corpus
        self._bin_path = bin_path
        self._tmp_bin = temp_sibling(bin_path)
        self._file = open_new(self._tmp_bin)
        self._sizes = array("q")
        info = np.iinfo(self._dtype) if self._dtype.kind in "iu" else None
        self._bounds = (int(info.min), int(info.max)) if info else None

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None:
            self.abort()

    def add_item(self, item) -> None:
        arr = np.asarray(item.numpy() if torch.is_tensor(item) else item).reshape(-1)
        self._write(arr)
        self._sizes.append(arr.size)

    def add_items(self, items: List[List[int]]) -> None:
        """Same as ``add_item`` for each list of ids, with one write (binarizing calls this)."""
        self._write(np.fromiter(itertools.chain.from_iterable(items), dtype=np.int64))
        self._sizes.extend(map(len, items))

    def _write(self, arr: np.ndarray) -> None:
        if self._bounds is not None and arr.size:
            low, high = arr.min(), arr.max()
            if low < self._bounds[0] or high > self._bounds[1]:
                raise ValueError(f"token ids {low}..{high} do not fit {self._dtype.name}; "
                                 "pick the dtype with best_fitting_int_dtype(len(dictionary))")
        self._file.write(arr.astype(self._dtype, copy=False).tobytes())

    def merge_file_(self, other_prefix: str) -> None:
        """Append a finished dataset (e.g. one worker's part) after the items added so far."""
        other = MMapIndexedDataset(other_prefix)
        if other.dtype != self._dtype:
            raise ValueError(f"cannot merge {other_prefix} ({other.dtype}) into a {self._dtype} dataset")
        self._sizes.frombytes(other.sizes.astype(np.int64).tobytes())
        with open(data_file_path(other_prefix), "rb") as f:
            shutil.copyfileobj(f, self._file)

    def finalize(self, idx_path: str) -> None:
        _fsync_close(self._file)
        tmp_idx = temp_sibling(idx_path)
        try:
            with open_new(tmp_idx) as f:
                write_index(f, self._dtype, np.frombuffer(self._sizes, dtype=np.int64))
                f.flush()
                os.fsync(f.fileno())
            os.replace(self._tmp_bin, self._bin_path)
            os.replace(tmp_idx, idx_path)
        except BaseException:
            remove_quietly(tmp_idx)
            self.abort()
            raise

    def abort(self) -> None:
        self._file.close()
        remove_quietly(self._tmp_bin)


def write_index(f, dtype, sizes: np.ndarray) -> None:
    """Write an ``.idx`` for items of ``sizes`` tokens to the binary file ``f``."""
    if len(sizes) and sizes.max() > np.iinfo(np.int32).max:
        raise ValueError(f"an item of {int(sizes.max())} tokens is too long for the index (int32 sizes)")
    f.write(_HEADER.pack(_MAGIC, _VERSION, dtype_code(dtype), len(sizes)))
    for start in range(0, len(sizes), _BLOCK):
        f.write(sizes[start:start + _BLOCK].astype("<i4").tobytes())
    total, itemsize = 0, np.dtype(dtype).itemsize
    for start in range(0, len(sizes), _BLOCK):
        nbytes = sizes[start:start + _BLOCK].astype(np.int64) * itemsize
        f.write((total + np.cumsum(nbytes) - nbytes).astype("<i8").tobytes())
        total += int(nbytes.sum())


def _fsync_close(f) -> None:
    f.flush()
    os.fsync(f.fileno())
    f.close()
