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
import os
import pickle
import pickletools
import re
import zipfile
from typing import IO, Optional, Set, Union

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta

from shardtrain.core.errors import CheckpointError
from shardtrain.core.torch_private import dcp_metadata_path
from shardtrain.trainer.checkpoint.checksums import Outside, check_inside

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
_UNSAFE_HINT = ("Unpickling it could run arbitrary code, so shardtrain refused to: nothing in it was run. shardtrain "
                "never writes such objects: the file was made by another program or altered. Use a checkpoint from "
                "a source you trust (fairseq checkpoints older than 0.12: `shard-import-fairseq --trust-checkpoint`).")


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
        found = refused_global(str(e)) or _first_foreign_global(source)
        if not found:
            raise
        raise CheckpointError(f"{what} contains a pickled {found}, which is not tensor data. " + _UNSAFE_HINT) from None


def refused_global(message: str) -> Optional[str]:
    """The global torch's weights-only unpickler refused, from its message. torch names a builtin without its
    module ("GLOBAL eval was not an allowed global"): reading only dotted names called an eval payload
    "missing or damaged". Identifier syntax and torch's own phrase: garbage read as a pickle names neither."""
    found = re.search(r"GLOBAL ([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*) (?:was not an allowed global|whose module)", message)
    if found is None:
        found = re.search(r"GLOBAL ([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)", message)  # other wordings: dotted only
    if found is None:
        return None
    return found.group(1) if "." in found.group(1) else f"builtins.{found.group(1)}"


_DOTTED = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+")


def _first_foreign_global(source) -> Optional[str]:
    """A global outside torch's own that the pickle in ``source`` refers to, read with pickletools (nothing is
    run): torch stops at the first opcode it does not support ("Unsupported operand"), before naming what a
    protocol-0 payload (INST, GLOBAL with text strings) would have called. None: garbage, or torch's only."""
    try:
        if isinstance(source, (str, os.PathLike)):
            with open(source, "rb") as f:
                data = f.read()
        else:
            data = source.getvalue() if hasattr(source, "getvalue") else b""
        if zipfile.is_zipfile(io.BytesIO(data)):
            with zipfile.ZipFile(io.BytesIO(data)) as archive:
                data = archive.read(next(n for n in archive.namelist() if n.endswith("data.pkl")))
    except (OSError, ValueError, KeyError, StopIteration, zipfile.BadZipFile):
        return None
    strings = []
    try:
        for op, arg, _ in pickletools.genops(data):
            if op.name in ("GLOBAL", "INST"):
                name = arg.replace(" ", ".")
            elif op.name == "STACK_GLOBAL" and len(strings) >= 2:
                name = f"{strings[-2]}.{strings[-1]}"
            else:
                if isinstance(arg, str):
                    strings.append(arg)
                continue
            if not _DOTTED.fullmatch(name):  # text read as a pickle: garbage, no payload
                return None
            if not name.startswith(("torch.", "collections.OrderedDict", "_codecs.encode")):
                return name
    except Exception:  # noqa: BLE001 - damaged bytes: no payload to name
        return None
    return None


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


def read_metadata(path: str, shown: str) -> Metadata:
    """DCP's ``.metadata`` at ``path`` (``shown`` in messages), unpickled through the allow-list."""
    with open(path, "rb") as f:
        try:
            metadata = _MetadataUnpickler(f).load()
        except UnsafeGlobal as e:
            raise CheckpointError(f"The sharded checkpoint's {shown} contains a pickled {e}, which is not "
                                  "checkpoint metadata. " + _UNSAFE_HINT) from None
    if not isinstance(metadata, Metadata):
        raise CheckpointError(f"{shown} is not DCP checkpoint metadata (it holds a {type(metadata).__name__}). "
                              "The checkpoint is damaged; resume from an earlier one.")
    return metadata


def storage_files(metadata: Metadata, shown: str) -> Set:
    """The files ``metadata`` says hold the checkpoint's values (relative to its directory)."""
    try:
        return {info.relative_path for info in (metadata.storage_data or {}).values()}
    except (AttributeError, TypeError):
        raise CheckpointError(f"{shown}/.metadata does not say in which files the values are (it is not the "
                              "metadata DCP's FileSystemWriter writes). The checkpoint is damaged; resume from an "
                              "earlier one.") from None


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

    def __init__(self, path: str, shown: Optional[str] = None):
        """``shown``: the checkpoint's name for messages when ``path`` is where it is pinned (formats.Pin)."""
        super().__init__(path)
        self._checkpoint = shown or str(path)
        self._metadata = read_metadata(dcp_metadata_path(self), os.path.join(self._checkpoint, ".metadata"))
        for name in storage_files(self._metadata, self._checkpoint):  # what read_data will open
            try:
                check_inside(str(path), name, ".metadata")
            except Outside as e:
                raise CheckpointError(f"The sharded checkpoint {self._checkpoint} is refused: {e.file} {e.detail}. "
                                      "shardtrain never writes such a checkpoint (it was made by another program or "
                                      "altered); nothing was loaded from it.") from None

    def read_metadata(self, *args, **kwargs) -> Metadata:
        # what FileSystemReader.read_metadata does after unpickling
        if getattr(self._metadata, "storage_meta", None) is None:
            self._metadata.storage_meta = StorageMeta()
        self._metadata.storage_meta.load_id = self.load_id
        return self._metadata

    def read_data(self, plan, planner):
        return super().read_data(plan, _CheckedBytes(planner, self._checkpoint))
