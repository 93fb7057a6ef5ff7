"""Loading checkpoints without running code from them.

Every file shardtrain reads from a checkpoint goes through one of two gates:

- ``torch.load(weights_only=True)`` (:func:`load_weights_only`) for ``.pt``
  files, ``extra.pt`` and the small non-tensor values inside DCP shards. It
  rebuilds tensors, ``torch.Size``, dtypes, devices, layouts, memory formats
  and plain Python data (dict, OrderedDict, list, tuple, set, str, bytes, int,
  float, complex, bool, None) and refuses every other global. shardtrain's own
  checkpoints hold nothing else (it never registers extra safe globals).
- :class:`SafeFileSystemReader` for sharded (DCP) checkpoints. torch 2.13's
  ``FileSystemReader`` unpickles the ``.metadata`` file with plain
  ``pickle.load`` and DCP's planners ``torch.load(weights_only=False)`` the
  non-tensor values (pytorch/pytorch#189308), so a crafted checkpoint
  directory could run code on load. This reader, written here because torch
  has none, unpickles the metadata with :data:`METADATA_GLOBALS` as the
  allow-list and passes every non-tensor value through the weights-only
  loader before DCP's planner sees it.

A checkpoint that needs anything more is refused with a :class:`CheckpointError`
naming the offending global. The one legitimate case, fairseq checkpoints
older than 0.12 (argparse/omegaconf objects), is loaded only by
``shard-import-fairseq --trust-checkpoint`` through its own allow-list
(``shardtrain/fairseq_import/fairseq_pickle.py``).
"""
import io
import pickle
import re
from typing import IO, Union

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta

from shardtrain.core.errors import CheckpointError
from shardtrain.core.torch_private import dcp_metadata_path

_DCP_METADATA = "torch.distributed.checkpoint.metadata"
# Everything torch.distributed.checkpoint's FileSystemWriter pickles into ``.metadata``.
METADATA_GLOBALS = frozenset({
    *((_DCP_METADATA, name) for name in (
        "Metadata", "MetadataIndex", "StorageMeta", "TensorStorageMetadata", "ChunkStorageMetadata",
        "TensorProperties", "BytesStorageMetadata", "_MEM_FORMAT_ENCODING")),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),  # a lookup of torch.strided & co by name
    ("collections", "OrderedDict"),
    *(("pathlib", name) for name in ("PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath")),
})
_BUILTINS = {"dict", "list", "tuple", "set", "frozenset", "str", "bytes", "int", "float", "bool", "complex"}
_UNSAFE_HINT = ("Unpickling it could run arbitrary code, so shardtrain refuses to. shardtrain never writes such "
                "objects: the file was made by another program or altered. Use a checkpoint from a source you "
                "trust (fairseq checkpoints older than 0.12: `shard-import-fairseq --trust-checkpoint`).")


class UnsafeGlobal(pickle.UnpicklingError):
    """A pickle refers to a global outside the allow-list."""


def load_weights_only(source: Union[str, IO[bytes]], what: str, mmap: bool = False):
    """``torch.load(source, weights_only=True)``; a refused global becomes a
    :class:`CheckpointError` that names it. Other failures propagate.

    ``mmap``: the tensors stay in the file (paged in as they are read), so a
    loader that converts them one by one never holds all of them in RAM."""
    try:
        return torch.load(source, map_location="cpu", weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as e:
        # a dotted name: a text file read as a pickle yields garbage "globals"
        found = re.search(r"GLOBAL ([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)", str(e))
        if not found:
            raise
        raise CheckpointError(f"{what} contains a pickled {found.group(1)}, which is not tensor data. "
                              + _UNSAFE_HINT) from None


def torch_reason(e: Exception) -> str:
    """torch's own words, when they are short and not its advice to load unsafely."""
    lines = str(e).strip().splitlines()
    if not lines or lines[0].startswith("Weights only load failed"):
        return f"; {type(e).__name__}"
    return f"; {type(e).__name__}: {lines[0][:200]}"


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        if (module, name) in METADATA_GLOBALS or (module == "builtins" and name in _BUILTINS):
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise UnsafeGlobal(f"{module}.{name}")


class _CheckedBytes:
    """A DCP load planner whose non-tensor values are first read by the
    weights-only loader; only values it accepts reach the real planner (which
    would otherwise ``torch.load(weights_only=False)`` them)."""

    def __init__(self, planner, path: str):
        self._planner, self._path = planner, path

    def load_bytes(self, read_item, value: io.BytesIO) -> None:
        load_weights_only(value, f"The value {read_item.dest_index.fqn!r} in the sharded checkpoint {self._path}")
        value.seek(0)
        self._planner.load_bytes(read_item, value)

    def __getattr__(self, name):
        return getattr(self._planner, name)


class SafeFileSystemReader(FileSystemReader):
    """``FileSystemReader`` that never unpickles anything outside the allow-lists above.

    The metadata is read when the reader is made, so a refusal is raised at
    the caller rather than inside DCP (which would log it and retry with
    rank-local metadata files)."""

    def __init__(self, path: str):
        super().__init__(path)
        self._checkpoint = str(path)
        self._metadata = self._read_metadata_safely()

    def _read_metadata_safely(self) -> Metadata:
        path = dcp_metadata_path(self)
        with open(path, "rb") as f:
            try:
                metadata = _MetadataUnpickler(f).load()
            except UnsafeGlobal as e:
                raise CheckpointError(f"The sharded checkpoint's {path} contains a pickled {e}, which is not "
                                      "checkpoint metadata. " + _UNSAFE_HINT) from None
        if not isinstance(metadata, Metadata):
            raise CheckpointError(f"{path} is not DCP checkpoint metadata (it holds a {type(metadata).__name__}). "
                                  "The checkpoint is damaged; resume from an earlier one.")
        return metadata

    def read_metadata(self, *args, **kwargs) -> Metadata:
        # what FileSystemReader.read_metadata does after unpickling
        if getattr(self._metadata, "storage_meta", None) is None:
            self._metadata.storage_meta = StorageMeta()
        self._metadata.storage_meta.load_id = self.load_id
        return self._metadata

    def read_data(self, plan, planner):
        return super().read_data(plan, _CheckedBytes(planner, self._checkpoint))
