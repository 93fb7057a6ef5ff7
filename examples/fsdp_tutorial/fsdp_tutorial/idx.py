"""MNIST's IDX files, read with every header check.

The format (http://yann.lecun.com/exdb/mnist/): a big-endian header, then the
raw values. The magic number's third byte is the value type (0x08: unsigned
byte, the only type MNIST uses) and its fourth the number of dimensions, so
images (N x rows x cols) have magic 2051 (0x00000803) and labels (N) 2049
(0x00000801). Then one big-endian uint32 per dimension, then the bytes.
Gzipped files (``*.gz``, as MNIST is distributed) are read as well.
"""
import gzip
import os
from typing import Optional, Tuple

import numpy as np

from shardtrain.core.errors import DataError

IMAGES_MAGIC = 2051
LABELS_MAGIC = 2049
_KIND = {IMAGES_MAGIC: "images", LABELS_MAGIC: "labels"}
_NDIM = {IMAGES_MAGIC: 3, LABELS_MAGIC: 1}
REGENERATE = ("Regenerate the files with `python examples/fsdp_tutorial/make_mnist_idx.py DIR`, or download "
              "MNIST again and unpack it (gunzip is optional: *.gz files are read as well).")


def find_idx(directory: str, name: str) -> Optional[str]:
    """``directory/name``, or its gzipped form; None if neither exists."""
    for candidate in (name, name + ".gz"):
        path = os.path.join(directory, candidate)
        if os.path.isfile(path):
            return path
    return None


def read_idx_header(path: str, magic: int) -> Tuple[int, ...]:
    """The dimensions stored in ``path``'s header, after checking its magic number."""
    with _open(path) as f:
        head = f.read(4 + 4 * _NDIM[magic])
    return _parse_header(path, head, magic)


def read_idx(path: str, magic: int) -> np.ndarray:
    """The uint8 array stored in ``path`` (memory-mapped unless gzipped), fully checked."""
    if path.endswith(".gz"):
        with gzip.open(path, "rb") as f:
            data = np.frombuffer(f.read(), dtype=np.uint8)
    else:
        data = np.memmap(path, dtype=np.uint8, mode="r") if os.path.getsize(path) else np.zeros(0, np.uint8)
    shape = _parse_header(path, data[:4 + 4 * _NDIM[magic]].tobytes(), magic)
    offset = 4 + 4 * len(shape)
    expected = offset + int(np.prod(shape, dtype=np.int64))
    if data.size != expected:
        raise DataError(f"{path} holds {data.size} bytes, but its header ({_KIND[magic]} of shape {shape}) "
                        f"says {expected}: the file is truncated or has trailing bytes. {REGENERATE}")
    return data[offset:].reshape(shape)


def _parse_header(path: str, head: bytes, magic: int) -> Tuple[int, ...]:
    kind, ndim = _KIND[magic], _NDIM[magic]
    if len(head) < 4:
        raise DataError(f"{path} is {len(head)} bytes long, too short for an IDX header: it is empty or "
                        f"truncated. {REGENERATE}")
    found = int.from_bytes(head[:4], "big")
    if found != magic:
        raise DataError(f"{path} is not an IDX {kind} file: its magic number is {found} (0x{found:08x}), "
                        f"expected {magic} (0x{magic:08x}){_magic_hint(found, magic)}. {REGENERATE}")
    if len(head) < 4 + 4 * ndim:
        raise DataError(f"{path} ends inside its IDX header (the {ndim} dimension sizes). {REGENERATE}")
    return tuple(int.from_bytes(head[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim))


def _magic_hint(found: int, magic: int) -> str:
    other = LABELS_MAGIC if magic == IMAGES_MAGIC else IMAGES_MAGIC
    if found == other:
        return f" (that of a {_KIND[other]} file: are the images and labels files swapped?)"
    if found == int.from_bytes(magic.to_bytes(4, "big"), "little"):
        return " (written little-endian: IDX headers are big-endian)"
    if (found >> 16) == 0x1F8B:
        return " (this is gzip data: name the file *.gz, or gunzip it)"
    return ""


def _open(path: str):
    return gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")

