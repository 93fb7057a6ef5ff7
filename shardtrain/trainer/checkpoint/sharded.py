"""Sharded checkpoints (fully_sharded): one directory per checkpoint, written by all ranks.

Layout of ``checkpoint_{epoch}_{updates}/``: torch.distributed.checkpoint (DCP)
files holding the model and optimizer, each rank writing its own shards in
parallel (no rank gathers the full model); ``extra.pt`` with everything else
(config, scheduler, data position, meters, every rank's RNG states), written
by rank 0; ``CHECKSUMS`` of every file (checksums.py); and ``COMPLETE``, written last.

Atomicity: the directory is written under a hidden ``.NAME.partial`` name and
renamed into place only after ``COMPLETE`` is on disk, so a crash at any
moment leaves no directory under a checkpoint name that is not whole. The
other names (``checkpoint_last``, ``checkpoint_best``, ``checkpoint{epoch}``)
are symlinks to it, swapped atomically with ``os.replace``. DCP reshards on
load, so a checkpoint saved on N ranks resumes on any number of ranks.
"""
import json
import os
import re
import shutil
import threading
from typing import Callable, Dict, List, Optional

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict, get_optimizer_state_dict, set_model_state_dict, set_optimizer_state_dict,
)

from shardtrain.core.errors import CheckpointError
from shardtrain.core.fileio import atomic_open, atomic_write_bytes, fsync_dir, remove_quietly, temp_sibling
from shardtrain.core.torch_private import load_dcp_keys
from shardtrain.optim.registry import kernel_choice_kept
from shardtrain.trainer.checkpoint.async_staging import Prestaged, RunStager, StepGate, on_host, step_only_storages
from shardtrain.trainer.checkpoint.checksums import (
    MANIFEST, Damaged, HashingStream, entry_of_bytes, gather_checksums, manifest_bytes, read_manifest, shard_writer,
    verify_directory,
)
from shardtrain.trainer.checkpoint.contained import check_old_checkpoint, check_refers_inside
from shardtrain.trainer.checkpoint.contents import TENSOR_PARTS, state_of, without
from shardtrain.trainer.checkpoint.dcp_errors import failed_save_error, reading_shards
from shardtrain.trainer.checkpoint.fit import check_same_model
from shardtrain.trainer.checkpoint.formats import CheckpointFormat, matching
from shardtrain.trainer.checkpoint.keep_best import prune_best
from shardtrain.trainer.checkpoint.safe_loading import SafeFileSystemReader, load_weights_only, torch_reason
from shardtrain.trainer.checkpoint.spare_fds import SpareDescriptors
from shardtrain.trainer.checkpoint.integrity import Verified
from shardtrain.trainer.launch import ranks

COMPLETE = "COMPLETE"
EXTRA = "extra.pt"
FORMAT = "shardtrain-dcp-1"


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


class ShardedSaver:
    """Writes sharded checkpoints, synchronously or in the background (``--async-save``).

    With async saves, ``save()`` copies what must be copied (GPU tensors, into
    the run's reused host buffers, pinned) and returns; the shards are written by a
    background thread, CPU parameters and optimizer state straight from the live
    tensors while the next optimizer step waits for the write (see
    async_staging.py). Rank 0 then writes the marker and renames the directory
    into place, still atomically. One save is in flight at a time; ``wait()``
    finishes it, ``close()`` also frees the buffers.
    """

    def __init__(self, async_save: bool = False):
        self.async_save = async_save
        self.stager = RunStager()
        self.gate = StepGate()
        self._pending: Optional[threading.Thread] = None
        self._error: Optional[BaseException] = None
        self._group = None
        self._in_flight = ("", "")  # (save dir, name) of the background save, for its error

    def save(self, save_dir: str, name: str, model, optimizer, extra: Dict, aliases: List[str],
             interval: bool = False, after: Optional[Callable[[], None]] = None) -> str:
        """Collective: every rank calls it. ``after`` runs on rank 0 once the checkpoint is in place."""
        self.wait()
        rank = ranks.rank()
        final = os.path.join(save_dir, name)
        partial = os.path.join(save_dir, f".{name}.partial")
        spare = make_partial(partial)
        state = {"model": get_model_state_dict(model)}
        if optimizer is not None:  # None: --no-save-optimizer-state
            state["optimizer"] = get_optimizer_state_dict(model, optimizer)
        info = {"format": FORMAT, "world_size": ranks.world_size(), "name": name, "interval": interval}
        if self.async_save:
            state = self._stage(state, model)
        writer, hashing = shard_writer(partial, on_host(state))

        def finish():
            written = gather_checksums(hashing, self._gloo_group())  # collective
            if rank == 0:
                spare.release()
                finalize(save_dir, name, partial, final, extra, info, aliases, written)
                if after is not None:
                    after()

        def discard():  # a failed save leaves nothing behind (every rank's write has ended: DCP agreed on failure)
            if rank == 0:
                spare.remove_tree(partial)

        if not self.async_save:
            try:
                dcp.save(state, storage_writer=writer, no_dist=not dist.is_initialized())
                finish()
            except BaseException:
                discard()
                raise
            ranks.barrier()
            return final
        future = self._write_in_background(state, writer)
        self._in_flight = (save_dir, name)
        self._pending = threading.Thread(target=self._complete, args=(future, finish, discard), daemon=True)
        self._pending.start()
        return final

    def _stage(self, state: Dict, model) -> Dict:
        """An async save's state: copies of what must be copied, the live CPU state left in place
        (async_staging.py). save() began with wait(), so no write still reads the buffers being refilled."""
        return self.stager.stage(state, step_only_storages(model, state.get("optimizer", {})))

    def _write_in_background(self, state: Dict, writer):
        """-> DCP's future of the write of the staged ``state``; while it writes live tensors, the
        optimizer steps wait for it."""
        if self.stager.in_place_bytes:
            self.gate.hold()
        try:
            return dcp.async_save(state, storage_writer=writer, process_group=self._gloo_group(),
                                  async_stager=Prestaged())
        except BaseException:
            self.gate.release()
            self.gate.detach()
            raise

    def _complete(self, future, finish, discard) -> None:
        try:
            try:
                future.result()
            finally:
                self.gate.release()  # the live tensors are free to change
            finish()
        except BaseException as e:  # noqa: BLE001 - reported by wait() on the training thread
            discard()
            self._error = e

    def wait(self) -> None:
        """Block until the background save (if any) is on disk under its name."""
        if self._pending is not None:
            self._pending.join()
            self._pending = None
            self.gate.detach()
            ranks.barrier()
        if self._error is not None:
            error, self._error = self._error, None
            save_dir, name = self._in_flight
            raise failed_save_error(f"{name} (in the background, --async-save)", save_dir, error) from None

    def close(self) -> None:
        """End of the run: the last save lands, then the staging buffers are freed."""
        try:
            self.wait()
        finally:
            self.stager.close()

    def _gloo_group(self):
        # Background collectives get their own gloo group so they never interleave
        # with the training step's collectives (which may be NCCL on the GPU); the
        # checksums are gathered on it too, as Python objects.
        if self._group is None and dist.is_initialized():
            self._group = dist.new_group(backend="gloo")
        return self._group


def make_partial(partial: str) -> Optional[SpareDescriptors]:
    """Collective: rank 0 makes the empty directory ``partial`` -> rank 0's spare descriptors (None elsewhere)."""
    spare = None
    if ranks.rank() == 0:
        spare = SpareDescriptors()  # before anything is written: a failed save can always clean up
        shutil.rmtree(partial, ignore_errors=True)  # left by a crashed save of the same update
        try:
            os.makedirs(partial)
        except BaseException:
            spare.release()
            raise
    ranks.barrier()
    return spare


def finalize(save_dir, name, partial, final, extra, info, aliases, written: Dict) -> None:
    """Rank 0, after every shard is written: extra state, checksums, marker, rename, aliases
    (also the last steps of shard-consolidate's file -> directory). ``written``: the shard files' checksums."""
    with atomic_open(os.path.join(partial, EXTRA)) as f:
        hashing = HashingStream(f)
        torch.save(extra, hashing)
    complete = json.dumps({**info, "checksums": True}).encode()
    files = {**written, EXTRA: hashing.entry(), COMPLETE: entry_of_bytes(complete)}
    atomic_write_bytes(os.path.join(partial, MANIFEST), manifest_bytes(files))  # before COMPLETE: never half
    publish(save_dir, name, partial, final, complete, aliases)


def publish(save_dir, name, partial, final, complete: bytes, aliases) -> None:
    """The ``COMPLETE`` marker, then the rename into place and the aliases: no checkpoint name
    shows the directory before it is whole."""
    atomic_write_bytes(os.path.join(partial, COMPLETE), complete)
    fsync_dir(partial)
    replace_dir(partial, final)
    for alias in aliases:
        _point(os.path.join(save_dir, alias), name)
    fsync_dir(save_dir)


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


def replace_dir(src: str, dst: str) -> None:
    if os.path.lexists(dst):  # saving the same update twice (a rerun): swap the old one out
        old = temp_sibling(dst)
        os.replace(dst, old)
        os.replace(src, dst)
        shutil.rmtree(old, ignore_errors=True) if os.path.isdir(old) else remove_quietly(old)
    else:
        os.replace(src, dst)


def _point(link: str, target_name: str) -> None:
    """Atomically make ``link`` a relative symlink to ``target_name``."""
    if os.path.isdir(link) and not os.path.islink(link):
        raise CheckpointError(f"{link} is a directory, not a checkpoint alias; move it out of --save-dir.")
    tmp = temp_sibling(link)
    os.symlink(target_name, tmp)
    os.replace(tmp, link)
