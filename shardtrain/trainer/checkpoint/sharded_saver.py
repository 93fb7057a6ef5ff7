"""Writing a sharded checkpoint: every rank's DCP shards, then rank 0 publishes the directory atomically.

Its own file because writing is a job apart from the format's other duties (``sharded.py``: naming, pruning,
verifying, loading): it runs synchronously or in the background (``--async-save``: staging, the step gate,
its own gloo group, errors reported at the next ``wait()``), and it alone makes a checkpoint appear.
shard-consolidate's file -> directory ends with the same :func:`finalize`.

Layout of ``checkpoint_{epoch}_{updates}/``: torch.distributed.checkpoint (DCP)
files holding the model and optimizer, each rank writing its own shards in
parallel (no rank gathers the full model); ``extra.pt`` with everything else
(config, scheduler, data position, meters, every rank's RNG states), written
by rank 0; ``CHECKSUMS`` of every file (checksums.py); and ``COMPLETE``, written last.

Atomicity: the directory is written under a hidden ``.NAME.partial`` name and
renamed into place only after ``COMPLETE`` is on disk, so a crash at any
moment leaves no directory under a checkpoint name that is not whole. The
other names (``checkpoint_last``, ``checkpoint_best``, ``checkpoint{epoch}``)
are symlinks to it, swapped atomically with ``os.replace``.
"""
import json
import os
import shutil
import threading
from typing import Callable, Dict, List, Optional

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

from shardtrain.core.errors import CheckpointError
from shardtrain.core.fileio import atomic_open, atomic_write_bytes, fsync_dir, remove_quietly, temp_sibling
from shardtrain.trainer.checkpoint.async_staging import Prestaged, RunStager, StepGate, on_host, step_only_storages
from shardtrain.trainer.checkpoint.checksums import (
    MANIFEST, HashingStream, entry_of_bytes, gather_checksums, manifest_bytes, shard_writer,
)
from shardtrain.trainer.checkpoint.dcp_errors import failed_save_error
from shardtrain.trainer.checkpoint.spare_fds import SpareDescriptors
from shardtrain.trainer.launch import ranks

COMPLETE = "COMPLETE"
EXTRA = "extra.pt"
FORMAT = "shardtrain-dcp-1"


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
