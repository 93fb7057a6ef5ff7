"""Convert between sharded (DCP directory) and single-file checkpoints, offline.

No process group and no knowledge of the world size that saved a checkpoint
are needed: DCP's metadata says where every shard of every tensor is.
"""
import contextlib
import importlib.util
import json
import os
import shutil
import warnings
from typing import Dict

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict_loader import _load_state_dict_from_keys

from shardtrain.errors import CheckpointError
from shardtrain.fileio import atomic_open, atomic_write_bytes, fsync_dir
from shardtrain.trainer.checkpoints import load_checkpoint
from shardtrain.trainer.safe_loading import SafeFileSystemReader
from shardtrain.trainer.sharded_checkpoints import COMPLETE, EXTRA, FORMAT, load_extra, reading_shards

MODEL_ONLY_KEYS = ("version", "cfg", "task_fingerprint")


def sharded_to_file(src: str, dst: str, model_only: bool) -> Dict:
    """Write the single-file form of the sharded checkpoint ``src``; returns its model state."""
    extra = load_extra(src)
    keys = {"model"} if model_only else {"model", "optimizer"}
    # The one private helper used: DCP's public API loads only into tensors you
    # already allocated, which needs the model; this reads named keys whole.
    with reading_shards(src):
        loaded = _load_state_dict_from_keys(keys, storage_reader=SafeFileSystemReader(src))
    extra.pop("rng_per_rank", None)
    state = {k: extra[k] for k in MODEL_ONLY_KEYS if k in extra} if model_only else extra
    state.update(loaded)
    with atomic_open(dst) as f:
        torch.save(state, f)
    return state["model"]


def file_to_sharded(src: str, dst: str) -> None:
    """Write the sharded form of the single-file checkpoint ``src`` (one shard; DCP
    reshards it on load to any number of ranks)."""
    state = load_checkpoint(src)
    if os.path.exists(dst):
        raise CheckpointError(f"{dst} exists; choose a new output path (nothing was overwritten).")
    partial = os.path.join(os.path.dirname(os.path.abspath(dst)), f".{os.path.basename(dst)}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    os.makedirs(partial)
    tensors = {k: state.pop(k) for k in ("model", "optimizer") if k in state}
    with _single_process():
        dcp.save(tensors, checkpoint_id=partial, no_dist=True)
    with atomic_open(os.path.join(partial, EXTRA)) as f:
        torch.save(state, f)
    atomic_write_bytes(os.path.join(partial, COMPLETE), json.dumps({"format": FORMAT, "world_size": 1,
                                                                    "name": os.path.basename(dst)}).encode())
    fsync_dir(partial)
    os.replace(partial, dst)


@contextlib.contextmanager
def _single_process():
    """DCP warns that it runs without a process group; offline conversion means to."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is (disabled|unavailable)")
        yield


def export_safetensors(model_state: Dict, path: str) -> None:
    if importlib.util.find_spec("safetensors") is None:
        raise CheckpointError("--export-safetensors needs the safetensors package: pip install safetensors.")
    from safetensors.torch import save_file

    # safetensors refuses shared storage (tied embeddings): store contiguous copies.
    save_file({k: v.detach().contiguous().clone() for k, v in model_state.items()}, path)
