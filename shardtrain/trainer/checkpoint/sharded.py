"""Sharded checkpoints (fully_sharded): one directory per checkpoint, written by all ranks.

The format: saving (through ``sharded_saver.py``, which holds the directory's layout and writes it
atomically), pruning by the keep rules, verifying checksums, and loading. DCP reshards on load, so a
checkpoint saved on N ranks resumes on any number of ranks.
"""
import json
import os
import re
import shutil
from typing import Dict, List, Optional

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict, get_optimizer_state_dict, set_model_state_dict, set_optimizer_state_dict,
)

from shardtrain.core.errors import CheckpointError
from shardtrain.core.torch_private import load_dcp_keys
from shardtrain.optim.registry import kernel_choice_kept
from shardtrain.trainer.checkpoint.checksums import MANIFEST, Damaged, read_manifest, verify_directory
from shardtrain.trainer.checkpoint.contained import check_old_checkpoint, check_refers_inside
from shardtrain.trainer.checkpoint.contents import TENSOR_PARTS, state_of, without
from shardtrain.trainer.checkpoint.dcp_errors import reading_shards
from shardtrain.trainer.checkpoint.fit import check_same_model
from shardtrain.trainer.checkpoint.formats import CheckpointFormat, matching
from shardtrain.trainer.checkpoint.keep_best import prune_best
from shardtrain.trainer.checkpoint.safe_loading import SafeFileSystemReader, load_weights_only, torch_reason
from shardtrain.trainer.checkpoint.sharded_saver import COMPLETE, EXTRA, ShardedSaver
from shardtrain.trainer.checkpoint.integrity import Verified


def check_complete(path: str, shown: Optional[str] = None) -> None:
    """``shown``: ``path``'s name for messages, when ``path`` is where it is pinned (formats.Pin)."""
    shown = shown or path
    if not shown.rstrip("/").endswith(".partial") and not any(
            os.path.exists(os.path.join(path, name)) for name in (COMPLETE, EXTRA, ".metadata")):
        raise CheckpointError(f"{shown!r} is a directory but not a checkpoint (sharded checkpoints hold "
                              f"{COMPLETE}, {EXTRA} and .metadata). Pass a checkpoint file or directory.")
    if not os.path.isfile(os.path.join(path, COMPLETE)):
        raise CheckpointError(
            f"Checkpoint directory {shown!r} is incomplete (no {COMPLETE} marker): its save was interrupted. "
            "Resume from an earlier checkpoint (e.g. checkpoint_last, which always points to a complete one).")


def _optimizer_of(parts: Dict):
    return parts["optimizer"].optimizer if "optimizer" in parts else None


class ShardedDirectory(CheckpointFormat):
    """One DCP directory per checkpoint, written by every rank; the other names are links to it."""

    saves_directories = True

    def __init__(self, async_save: bool = False):
        self.saver = ShardedSaver(async_save=async_save)

    def save(self, options, names, header, parts, epoch, updates, is_master, prepare) -> List[str]:
        storage = f"checkpoint_{epoch}_{updates}"
        aliases = [n[:-3] for n in names if n[:-3] != storage]
        if is_master:
            prepare()
        extra = {**header, **state_of(without(parts, TENSOR_PARTS))}  # rng_per_rank: a collective
        path = self.saver.save(options.save_dir, storage, parts["model"].model, _optimizer_of(parts),
                               extra, aliases, interval=f"{storage}.pt" in names, after=lambda: self.prune(options))
        return [path]

    def prune(self, options) -> None:
        """Drop epoch aliases beyond --keep-last-epochs, interval checkpoints beyond
        --keep-interval-updates, best-links beyond --keep-best-checkpoints, and directories no name
        points to any more."""
        c, root = options, options.save_dir
        prune_best(c)  # first: a directory only a dropped best-link named goes below, not at the next save
        if c.keep_last_epochs > 0:
            for link in matching(root, re.compile(r"checkpoint(\d+)"))[c.keep_last_epochs:]:
                os.remove(link)
        referenced = {os.readlink(os.path.join(root, e)) for e in os.listdir(root)
                      if os.path.islink(os.path.join(root, e))}
        directories = matching(root, re.compile(r"checkpoint_\d+_(\d+)"))
        interval = [p for p in directories if marker(p).get("interval")]
        keep = set(interval[:c.keep_interval_updates] if c.keep_interval_updates > 0 else interval)
        for path in directories:
            if os.path.basename(path) not in referenced and path not in keep:
                shutil.rmtree(path, ignore_errors=True)

    def verify(self, path: str) -> Verified:
        where = self.pinned(path)
        check_complete(where, path)
        files = read_manifest(where)
        if files is None:
            if marker(where).get("checksums"):
                raise Damaged(MANIFEST, "is missing (its COMPLETE marker says it was written)")
            check_old_checkpoint(where)
            check_refers_inside(where, path, None)
            return Verified(checksums=False)
        nbytes = verify_directory(where, files)
        check_refers_inside(where, path, files)  # after: the .metadata it parses is the verified one
        return Verified(checksums=True, files=len(files), nbytes=nbytes)

    def read_verified_state(self, path: str, model_only: bool) -> Dict:
        return load_extra(self.pinned(path), path)

    def check_model(self, trainer, state, path, cfg) -> None:
        check_same_model(trainer, state, path, cfg)  # the shapes are only known to DCP: compare the config

    def load_tensors(self, path, state, model_part, optimizer_part=None) -> None:
        load_sharded_into(self.pinned(path), model_part.model,
                          None if optimizer_part is None else optimizer_part.optimizer, shown=path)

    def read_tensors(self, path, state, names) -> Dict:
        with reading_shards(path):  # named keys whole, no model needed (see torch_private)
            return load_dcp_keys(set(names), storage_reader=SafeFileSystemReader(self.pinned(path), path))

    def check_complete(self, path: str) -> None:
        check_complete(path)

    def wait(self) -> None:
        self.saver.wait()

    def close(self) -> None:
        self.saver.close()


def marker(path: str) -> Dict:
    """The COMPLETE marker's contents ({} when there is none)."""
    try:
        with open(os.path.join(path, COMPLETE)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def load_extra(path: str, shown: Optional[str] = None) -> Dict:
    """``shown``: ``path``'s name for messages, when ``path`` is where it is pinned (formats.Pin)."""
    shown = shown or path
    check_complete(path, shown)
    try:
        return load_weights_only(os.path.join(path, EXTRA), os.path.join(shown, EXTRA))
    except CheckpointError:
        raise
    except Exception as e:  # noqa: BLE001 - torch raises many types for bad files
        raise CheckpointError(f"Cannot read {os.path.join(shown, EXTRA)}{torch_reason(e)}. The checkpoint is "
                              "damaged; resume from an earlier one.") from None


def load_sharded_into(path: str, model, optimizer: Optional[torch.optim.Optimizer],
                      shown: Optional[str] = None) -> None:
    """Load model (and optimizer) shards into this run's layout, whatever world size saved them."""
    shown = shown or path
    check_complete(path, shown)
    state = {"model": get_model_state_dict(model)}
    if optimizer is not None:
        state["optimizer"] = get_optimizer_state_dict(model, optimizer)
    with reading_shards(shown):
        dcp.load(state, storage_reader=SafeFileSystemReader(path, shown), no_dist=not dist.is_initialized())
    set_model_state_dict(model, state["model"])
    if optimizer is not None:
        with kernel_choice_kept(optimizer):
            set_optimizer_state_dict(model, optimizer, state["optimizer"])
