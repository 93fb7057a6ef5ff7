"""Files that are not checkpoints of ours but something else, named for what they are.

A Hugging Face ``model.safetensors`` is an intact file: calling it "truncated, corrupt" (what torch's unpickler
failing on it suggested) sends its owner to look for a damaged download. Its layout is public and simple (8 bytes:
the header's length, little-endian; a JSON header of tensor names, dtypes, shapes and byte ranges; the bytes), so
it is recognised here without the safetensors package, and checked whole: an intact one has exactly the bytes its
header places.
"""
import json
import os
import struct
from typing import Optional

from shardtrain.core.errors import CheckpointError

MAX_HEADER = 100 * 2 ** 20  # safetensors' own limit on the JSON header


class ForeignFileError(CheckpointError):
    """An intact (or recognisably truncated) file of another format: not damaged, not ours."""


def safetensors_summary(path: str) -> Optional[str]:
    """What ``path`` is when it is a safetensors file ("an intact safetensors file of 2 tensors, ..."), else None."""
    try:
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                return None
            (length,) = struct.unpack("<Q", head)
            size = os.fstat(f.fileno()).st_size
            if not 2 <= length <= min(MAX_HEADER, size - 8):
                return None
            header = json.loads(f.read(length).decode("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    tensors = {k: v for k, v in header.items() if k != "__metadata__"} if isinstance(header, dict) else None
    if not tensors or not all(isinstance(v, dict) and "data_offsets" in v for v in tensors.values()):
        return None
    placed = max(v["data_offsets"][1] for v in tensors.values())
    first = sorted(tensors)[0]
    state = "an intact" if placed == size - 8 - length else f"a truncated ({size} of {placed + 8 + length} bytes)"
    return f"{state} safetensors file of {len(tensors)} tensors (e.g. {first!r})"


def refuse_foreign(path: str, shown: str) -> None:
    """Raise ForeignFileError, in one paragraph, when ``path`` (named ``shown``) is a file of another format."""
    what = safetensors_summary(path)
    if what is not None:
        raise ForeignFileError(
            f"{shown!r} is {what}, the format Hugging Face saves model weights in, not a shardtrain checkpoint. "
            "shardtrain loads its own checkpoints (a single .pt file or a sharded directory; fairseq's through "
            "shard-import-fairseq) and has no importer for safetensors weights: pass a checkpoint shard-train wrote.")
