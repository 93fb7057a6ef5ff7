"""Reading a Hugging Face folder's weights into a model, each rank only the rows it holds.

``model.safetensors``, or shards named by ``model.safetensors.index.json``. The whole folder is checked first
(every file named, each header readable, every tensor present with the shape the model has), so a mistake is one
paragraph before any weight is copied (preflight runs the same check on a meta-built model, before any rank
starts). Then each parameter is filled: a sharded one (FSDP2's DTensor, ``Shard(0)`` with torch.chunk's rows
per rank) from its rows of the file, read straight into the shard (no temporary tensor: safetensors' own ``get_slice``
allocates one per tensor, and a rank holding half of a 67 MB model peaked at 62 MB more while loading); so a
rank's host memory while loading is its shard, never the model (tests/trainer/checkpoint/test_hf_ranks.py measures it against its shard + the largest tensor). Only JSON and safetensors are read: nothing from the folder is imported or run."""
import contextlib
import json
import math
import os
import struct
from typing import Dict, Tuple

import torch
from torch import nn

from shardtrain.core.dtensors import is_dtensor
from shardtrain.core.errors import DataError
from shardtrain.models.hf_config import our_name, read_folder_config
from shardtrain.trainer.parallel.choose import unwrap

_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
           "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
           "BOOL": torch.bool}
WEIGHTS = "model.safetensors"
INDEX = "model.safetensors.index.json"


def _safe_open(path: str):
    from safetensors import safe_open  # a runtime dependency; imported when a folder is read
    try:
        return safe_open(path, framework="pt", device="cpu")
    except Exception as e:  # safetensors raises its own SafetensorError (not importable by a public name)
        raise DataError(f"{path} is not a readable safetensors file ({e}); it is truncated or damaged. Download "
                        "it again (compare its size with the published one).") from None


def weight_files(folder: str) -> Dict[str, str]:
    """Hugging Face's tensor name -> the file holding it."""
    index = os.path.join(folder, INDEX)
    if os.path.isfile(index):
        try:
            with open(index) as f:
                weight_map = json.load(f)["weight_map"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise DataError(f"{index} is not a safetensors index ({e!r}). Restore the index that came with the "
                            "weights.") from None
        files = {name: os.path.join(folder, file) for name, file in weight_map.items()
                 if isinstance(file, str) and os.path.basename(file) == file}  # a file of the folder, no path
        if len(files) != len(weight_map):
            raise DataError(f"{index} names files outside the folder; shardtrain reads only the folder's own files.")
        missing = sorted({os.path.basename(p) for p in files.values() if not os.path.isfile(p)})
        if missing:
            raise DataError(f"{index} names {', '.join(missing)}, which {folder} does not hold: the download is "
                            "incomplete. Fetch the missing shard(s) again.")
        return files
    single = os.path.join(folder, WEIGHTS)
    if not os.path.isfile(single):
        raise DataError(f"{folder} holds neither {WEIGHTS} nor {INDEX}. shardtrain reads safetensors weights only "
                        "(no pytorch_model.bin, which unpickling could run code from); convert them first.")
    with _safe_open(single) as f:
        return {name: single for name in f.keys()}


def plan(folder: str, shapes: Dict[str, Tuple[int, ...]]) -> Dict[str, Tuple[str, str]]:
    """Our parameter name -> (file, Hugging Face's name), after checking the folder holds every one of
    ``shapes`` (our names and global shapes) with that shape, and nothing else of the model's."""
    model = read_folder_config(folder).model
    files, found, problems = weight_files(folder), {}, []
    headers = {}
    for hf, path in files.items():
        if path not in headers:
            with _safe_open(path) as f:
                headers[path] = {name: tuple(f.get_slice(name).get_shape()) for name in f.keys()}
        if hf not in headers[path]:
            problems.append(f"the index puts {hf} in {os.path.basename(path)}, which does not hold it")
            continue
        ours = our_name(model, hf)
        if ours in shapes:
            found[ours] = (path, hf)
            if headers[path][hf] != tuple(shapes[ours]):
                problems.append(f"{hf} has shape {list(headers[path][hf])} in the folder, but the model config.json "
                                f"and the data-bin's dictionary describe has {list(shapes[ours])}")
        elif ours is not None and not ours.startswith("output_projection"):  # lm_head beside tied embeddings
            problems.append(f"the folder holds {hf}, which the model config.json describes has not")
    missing = sorted(set(shapes) - set(found))
    if missing:
        problems.append(f"it lacks {', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}")
    if problems:
        raise DataError(f"The weights in {folder} do not fit its config.json: {'; '.join(problems)}. An embedding "
                        "row count that differs is the vocabulary: the data-bin must be made with the folder's "
                        "tokenizer (shard-preprocess --hf-tokenizer). Otherwise the folder is damaged.")
    return found


def global_shapes(model: nn.Module) -> Dict[str, Tuple[int, ...]]:
    return {name: tuple(t.shape) for name, t in unwrap(model).state_dict(keep_vars=True).items()}


def check_folder(folder: str, model: nn.Module) -> None:
    """Preflight: ``model`` (built on the meta device) fits the folder's weights."""
    plan(folder, global_shapes(model))


@torch.no_grad()
def load_folder_into(model: nn.Module, folder: str) -> None:
    """Fill every parameter of ``model`` (wrapped or not, sharded or not) from the folder, file by file."""
    tensors = unwrap(model).state_dict(keep_vars=True)
    where = plan(folder, {name: tuple(t.shape) for name, t in tensors.items()})
    for path in sorted({path for path, _ in where.values()}):
        with _mapped(path) as read:
            for name, (file, hf) in where.items():
                if file == path:
                    _fill(tensors[name], read, hf)


def _fill(target: torch.Tensor, read, hf: str) -> None:
    """Copy this rank's rows of the file's tensor ``hf`` into ``target``."""
    if not is_dtensor(target):
        read(hf, 0, target.shape[0] if target.dim() else 1, target)
        return
    local = target.to_local()
    start, rows = row_range(target.shape[0], target.placements, target.device_mesh)
    if rows != local.shape[0]:
        raise AssertionError(f"rows {start}+{rows} of {tuple(target.shape)} disagree with the local shard "
                             f"{tuple(local.shape)}")
    if rows:
        read(hf, start, rows, local)


@contextlib.contextmanager
def _mapped(path: str):
    """``read(name, start, rows, into)``: rows [start, start + rows) of tensor ``name`` read from the file into
    ``into`` (safetensors: 8 bytes of header length, the JSON header, then each tensor's bytes, row-major).
    Read with pread, not mapped: the kernel maps a file's pages in large folios (2 MB on ext4), so a map would
    bring a rank the neighbours' rows too; a host tensor of the file's dtype is read into directly, anything else
    (another dtype, an accelerator) through one tensor's bytes on the host."""
    with open(path, "rb", buffering=0) as f:
        length = struct.unpack("<Q", f.read(8))[0]
        header, base = json.loads(f.read(length)), 8 + length

        def read(name: str, start: int, rows: int, into: torch.Tensor) -> None:
            info = header[name]
            dtype, shape = _DTYPES[info["dtype"]], info["shape"]
            row = math.prod(shape[1:])
            offset = base + info["data_offsets"][0] + start * row * dtype.itemsize
            direct = into.device.type == "cpu" and into.dtype == dtype and into.is_contiguous()
            buffer = into if direct else torch.empty(rows * row, dtype=dtype)
            data = buffer.view(-1).view(torch.uint8).numpy()
            if os.preadv(f.fileno(), [data], offset) != data.nbytes:
                raise DataError(f"{path} ends inside tensor {name}: the file is truncated. Download it again.")
            if not direct:
                into.copy_(buffer.view(into.shape))

        yield read


def row_range(size: int, placements, mesh) -> Tuple[int, int]:
    """(first row, rows) this rank holds of a dimension-0 tensor of ``size`` rows: torch.chunk's split at
    each mesh dimension that shards dim 0 (ceil(size / n) rows each, the last ranks fewer or none)."""
    from torch.distributed.tensor import Replicate, Shard  # loaded already: placements come from a DTensor
    start, rows = 0, size
    for dim, placement in enumerate(placements):
        if isinstance(placement, Replicate):
            continue
        if not (isinstance(placement, Shard) and placement.dim == 0):
            raise AssertionError(f"a parameter placed {placement}: only dim-0 sharding is read by rows")
        count, coordinate = mesh.size(dim), mesh.get_local_rank(dim)
        chunk = -(-rows // count)
        begin = min(coordinate * chunk, rows)
        start, rows = start + begin, max(0, min(chunk, rows - begin))
    return start, rows
