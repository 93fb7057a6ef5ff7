"""Convert between sharded (DCP directory) and single-file checkpoints, offline.

No process group and no knowledge of the world size that saved a checkpoint
are needed: DCP's metadata says where every shard of every tensor is.
"""
import contextlib
import importlib.util
import os
import shutil
import warnings
from typing import Dict

import torch
import torch.distributed.checkpoint as dcp

from shardtrain.core.errors import CheckpointError
from shardtrain.core.user_dir import HEADER_KEY
from shardtrain.core.fileio import atomic_open, atomic_write_bytes, probe_writable_dir
from shardtrain.trainer.checkpoint.async_staging import on_host
from shardtrain.trainer.checkpoint.checksums import shard_writer
from shardtrain.trainer.checkpoint.contents import TENSOR_PARTS
from shardtrain.trainer.checkpoint.sharded import ShardedDirectory
from shardtrain.trainer.checkpoint.sharded_saver import COMPLETE, FORMAT, finalize
from shardtrain.trainer.checkpoint.single_file import SingleFile

MODEL_ONLY_KEYS = ("version", "cfg", "task_fingerprint", HEADER_KEY)  # the header (contents.header)


def check_output(path: str, overwrite: bool, directory: bool) -> None:
    """Refuse an output path that cannot be written, or that exists (unless
    ``overwrite``), before anything is read or written: an offline converter
    must neither replace a file silently nor die half-way with a traceback.
    ``directory``: the output is a sharded checkpoint directory, else one file."""
    if not directory and path.endswith(os.sep):
        raise CheckpointError(f"The output {path} ends with '{os.sep}', which names a directory, but the output "
                              "here is one file; pass a file path such as model.pt.")
    _check_parent(path)
    if os.path.lexists(path):
        _check_existing(path, overwrite, directory)


def _check_parent(path: str) -> None:
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise CheckpointError(f"The directory {parent} of the output {path} does not exist; create it first "
                              f"(mkdir -p {parent}) or choose another output path.")
    try:
        probe_writable_dir(parent)  # only trying tells (read-only mounts, root)
    except OSError as e:
        raise CheckpointError(f"Cannot write the output {path}: {parent} is not writable ({e.strerror}). "
                              "Choose an output path in a directory you can write to.") from None


def _check_existing(path: str, overwrite: bool, directory: bool) -> None:
    if os.path.isdir(path) and not directory:
        raise CheckpointError(f"The output {path} is a directory, but the output here is one file; pass a file "
                              f"path such as {os.path.join(path, 'model.pt')} (nothing was overwritten).")
    if directory and not os.path.isdir(path):
        raise CheckpointError(f"The output {path} exists and is not a directory, but the output here is a sharded "
                              "checkpoint directory; choose a new output path (nothing was overwritten).")
    if not overwrite:
        raise CheckpointError(f"The output {path} exists; choose a new output path, or pass --overwrite to "
                              "replace it (nothing was overwritten).")
    # --overwrite never deletes a directory that is not a checkpoint (a typo must not cost a home directory),
    # nor the target of a link such as checkpoint_last.
    if directory and (os.path.islink(path) or not os.path.isfile(os.path.join(path, COMPLETE))):
        raise CheckpointError(f"The output {path} exists and is not a sharded checkpoint directory (or is a link "
                              "to one); --overwrite replaces only those. Choose a new output path (nothing was "
                              "overwritten).")


def require_safetensors() -> None:
    """Checked before anything is written, so a missing package leaves no half-done export."""
    if importlib.util.find_spec("safetensors") is None:
        raise CheckpointError("--export-safetensors needs the safetensors package: pip install safetensors "
                              "(nothing was written).")


def read_sharded(src: str, model_only: bool) -> Dict:
    """The single-file form of the sharded checkpoint ``src``, in memory."""
    sharded = ShardedDirectory()
    extra = sharded.read_state(src)
    keys = {"model"} if model_only else {"model", "optimizer"}
    loaded = sharded.read_tensors(src, extra, sorted(keys))
    # a full-state file keeps rng_per_rank: it resumes on as many ranks bit for bit, like the directory
    state = {k: extra[k] for k in MODEL_ONLY_KEYS if k in extra} if model_only else extra
    state.update(loaded)
    return state


def read_file_model_only(src: str) -> Dict:
    """The model-only form of the single-file checkpoint ``src``, as read_sharded(model_only=True) makes it
    from a directory: the same top-level keys whichever form the input has."""
    state = SingleFile().read_state(src, model_only=True)  # the tensors stay in the mapped file until saved
    return {**{k: state[k] for k in MODEL_ONLY_KEYS if k in state}, "model": state["model"]}


def write_file(state: Dict, dst: str) -> None:
    with atomic_open(dst) as f:
        torch.save(state, f)


def describe(state: Dict) -> str:
    """What a converted checkpoint holds, for the log: a directory made from a
    model-only file has no optimizer, whatever flags the conversion had."""
    if "optimizer" in state and "train_state" in state:
        return "full training state"
    return "model and config only; no optimizer or training state, so it cannot resume training"


def file_to_sharded(src: str, dst: str, overwrite: bool = False) -> Dict:
    """Write the sharded form of the single-file checkpoint ``src`` (one shard; DCP
    reshards it on load to any number of ranks); returns what was written."""
    check_output(dst, overwrite, directory=True)
    state = SingleFile().read_state(src)
    written = dict(state)
    final = os.path.abspath(dst)  # also drops a trailing "/"
    partial = os.path.join(os.path.dirname(final), f".{os.path.basename(final)}.partial")
    shutil.rmtree(partial, ignore_errors=True)  # left by a crashed conversion to the same path
    os.mkdir(partial)
    try:
        _save_sharded(state, partial, final)  # swaps out an old checkpoint (--overwrite) only once the new one is whole
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return written


def _save_sharded(state: Dict, partial: str, final: str) -> None:
    """One process writes every shard, then the marker, extra.pt and the rename as a run's save does."""
    tensors = {k: state.pop(k) for k in TENSOR_PARTS if k in state}
    writer, hashing = shard_writer(partial, state_on_host=on_host(tensors))
    with _single_process():
        dcp.save(tensors, storage_writer=writer, no_dist=True)
    name = os.path.basename(final)
    finalize(os.path.dirname(final), name, partial, final, state, {"format": FORMAT, "world_size": 1, "name": name},
             aliases=[], written=hashing.written)


@contextlib.contextmanager
def _single_process():
    """DCP warns that it runs without a process group; offline conversion means to."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is (disabled|unavailable)")
        yield


def safetensors_bytes(model_state: Dict) -> bytes:
    """The model weights in safetensors form, built in memory so the file is written whole or not at all."""
    require_safetensors()
    from safetensors.torch import save

    # safetensors refuses shared storage (tied embeddings): store contiguous copies.
    return save({k: v.detach().contiguous().clone() for k, v in model_state.items()})


def export_safetensors(model_state: Dict, path: str) -> None:
    atomic_write_bytes(path, safetensors_bytes(model_state))
