"""Sharded checkpoints (fully_sharded): one directory per checkpoint, written by all ranks.

Layout of ``checkpoint_{epoch}_{updates}/``: torch.distributed.checkpoint (DCP)
files holding the model and optimizer, each rank writing its own shards in
parallel (no rank gathers the full model); ``extra.pt`` with everything else
(config, scheduler, data position, meters, every rank's RNG states), written
by rank 0; and ``COMPLETE``, written last.

Atomicity: the directory is written under a hidden ``.NAME.partial`` name and
renamed into place only after ``COMPLETE`` is on disk, so a crash at any
moment leaves no directory under a checkpoint name that is not whole. The
other names (``checkpoint_last``, ``checkpoint_best``, ``checkpoint{epoch}``)
are symlinks to it, swapped atomically with ``os.replace``. DCP reshards on
load, so a checkpoint saved on N ranks resumes on any number of ranks.
"""
import contextlib
import json
import re
import os
import shutil
import threading
import warnings
from typing import Callable, Dict, List, Optional

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict, get_optimizer_state_dict, set_model_state_dict, set_optimizer_state_dict,
)

from shardtrain.core.errors import CheckpointError
from shardtrain.optim.registry import kernel_choice_kept
from shardtrain.core.fileio import atomic_open, atomic_write_bytes, fsync_dir, remove_quietly, temp_sibling
from shardtrain.trainer.checkpoint.safe_loading import SafeFileSystemReader, load_weights_only
from shardtrain.trainer.launch import ranks
from shardtrain.trainer.checkpoint.async_staging import Prestaged, RunStager, StepGate, step_only_storages
from shardtrain.trainer.rng import gather_rng_states

COMPLETE = "COMPLETE"
EXTRA = "extra.pt"
FORMAT = "shardtrain-dcp-1"


def is_sharded(path: str) -> bool:
    return os.path.isdir(path)


def check_complete(path: str) -> None:
    if not path.rstrip("/").endswith(".partial") and not any(
            os.path.exists(os.path.join(path, name)) for name in (COMPLETE, EXTRA, ".metadata")):
        raise CheckpointError(f"{path!r} is a directory but not a checkpoint (sharded checkpoints hold "
                              f"{COMPLETE}, {EXTRA} and .metadata). Pass a checkpoint file or directory.")
    if not os.path.isfile(os.path.join(path, COMPLETE)):
        raise CheckpointError(
            f"Checkpoint directory {path!r} is incomplete (no {COMPLETE} marker): its save was interrupted. "
            "Resume from an earlier checkpoint (e.g. checkpoint_last, which always points to a complete one).")


class ShardedSaver:
    """Writes sharded checkpoints, synchronously or in the background (``--async-save``).

    With async saves, ``save()`` copies what must be copied (GPU tensors, into
    the run's one reused pinned buffer) and returns; the shards are written by a
    background thread, CPU parameters and optimizer state straight from the live
    tensors while the next optimizer step waits for the write (see
    async_staging.py). Rank 0 then writes the marker and renames the directory
    into place, still atomically. One save is in flight at a time; ``wait()``
    finishes it, ``close()`` also frees the buffer.
    """

    def __init__(self, async_save: bool = False, staging: str = "split"):
        """``staging``: "split" (above); "copy": copy every tensor into the reused
        buffer; "dcp": DCP's own stager, a fresh copy per save. The last two are
        the behaviours before, kept for benchmarks/async_save.py to compare against."""
        self.async_save = async_save
        self.stager = RunStager(copy_everything=staging == "copy") if staging != "dcp" else None
        self.gate = StepGate()
        self._pending: Optional[threading.Thread] = None
        self._error: Optional[BaseException] = None
        self._group = None

    def save(self, save_dir: str, name: str, model, optimizer, extra: Dict, aliases: List[str],
             interval: bool = False, after: Optional[Callable[[], None]] = None) -> str:
        """Collective: every rank calls it. ``after`` runs on rank 0 once the checkpoint is in place."""
        self.wait()
        rank = ranks.rank()
        final = os.path.join(save_dir, name)
        partial = os.path.join(save_dir, f".{name}.partial")
        if rank == 0:
            shutil.rmtree(partial, ignore_errors=True)  # left by a crashed save of the same update
            os.makedirs(partial)
        ranks.barrier()
        state = {"model": get_model_state_dict(model), "optimizer": get_optimizer_state_dict(model, optimizer)}
        rngs = gather_rng_states()  # every rank's own generators (see rng.py)
        info = {"format": FORMAT, "world_size": ranks.world_size(), "name": name, "interval": interval}

        def finish():
            if rank == 0:
                _finalize(save_dir, name, partial, final, {**extra, "rng_per_rank": rngs}, info, aliases)
                if after is not None:
                    after()

        if not self.async_save:
            try:
                dcp.save(state, checkpoint_id=partial, no_dist=not dist.is_initialized())
                finish()
            except BaseException:
                if rank == 0:
                    shutil.rmtree(partial, ignore_errors=True)
                raise
            ranks.barrier()
            return final
        # save() began with wait(), so no write still reads the buffer being refilled
        if self.stager is None:
            future = dcp.async_save(state, checkpoint_id=partial, process_group=self._async_group())
        else:
            staged = self.stager.stage(state, step_only_storages(model, state["optimizer"]))
            if self.stager.in_place_bytes:
                self.gate.hold()
            try:
                future = dcp.async_save(staged, checkpoint_id=partial, process_group=self._async_group(),
                                        async_stager=Prestaged())
            except BaseException:
                self.gate.release()
                self.gate.detach()
                raise
        self._pending = threading.Thread(target=self._complete, args=(future, finish), daemon=True)
        self._pending.start()
        return final

    def _complete(self, future, finish) -> None:
        try:
            try:
                future.result()
            finally:
                self.gate.release()  # the live tensors are free to change
            finish()
        except BaseException as e:  # noqa: BLE001 - reported by wait() on the training thread
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
            raise CheckpointError(f"A background checkpoint save failed: {type(error).__name__}: {error}. "
                                  "The previous checkpoints are intact; check --save-dir (space, "
                                  "permissions).") from error

    def close(self) -> None:
        """End of the run: the last save lands, then the staging buffer is freed."""
        try:
            self.wait()
        finally:
            if self.stager is not None:
                self.stager.close()

    def _async_group(self):
        # Background collectives get their own gloo group so they never interleave
        # with the training step's collectives (which may be NCCL on the GPU).
        if self._group is None and dist.is_initialized():
            self._group = dist.new_group(backend="gloo")
        return self._group


def _finalize(save_dir, name, partial, final, extra, info, aliases) -> None:
    """Rank 0, after every shard is written: extra state, marker, rename, aliases."""
    with atomic_open(os.path.join(partial, EXTRA)) as f:
        torch.save(extra, f)
    atomic_write_bytes(os.path.join(partial, COMPLETE), json.dumps(info).encode())
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


def load_extra(path: str) -> Dict:
    check_complete(path)
    try:
        return load_weights_only(os.path.join(path, EXTRA), os.path.join(path, EXTRA))
    except CheckpointError:
        raise
    except Exception as e:  # noqa: BLE001 - torch raises many types for bad files
        raise CheckpointError(f"Cannot read {os.path.join(path, EXTRA)}: {type(e).__name__}: {e}. The "
                              "checkpoint is damaged; resume from an earlier one.") from None


def load_sharded_into(path: str, model, optimizer: Optional[torch.optim.Optimizer]) -> None:
    """Load model (and optimizer) shards into this run's layout, whatever world size saved them."""
    check_complete(path)
    state = {"model": get_model_state_dict(model)}
    if optimizer is not None:
        state["optimizer"] = get_optimizer_state_dict(model, optimizer)
    with reading_shards(path):
        dcp.load(state, storage_reader=SafeFileSystemReader(path), no_dist=not dist.is_initialized())
    set_model_state_dict(model, state["model"])
    if optimizer is not None:
        with kernel_choice_kept(optimizer):
            set_optimizer_state_dict(model, optimizer, state["optimizer"])


@contextlib.contextmanager
def reading_shards(path: str):
    """DCP reads ``path`` inside: its failures become one CheckpointError (ours,
    e.g. an unsafe global, when DCP wrapped one)."""
    try:
        with warnings.catch_warnings():  # loading in one process without a group is intended here
            warnings.filterwarnings("ignore", message="torch.distributed is (disabled|unavailable)")
            yield
    except (Exception, CheckpointException) as e:  # noqa: BLE001 - DCP's exception is a BaseException
        refused = _refusal(e)
        if refused:
            raise refused from None
        cause = _cause(e)
        first = str(cause).strip().splitlines()[0][:300] if str(cause).strip() else type(cause).__name__
        missing = re.match(r"Missing key in checkpoint state_dict: (optimizer|model)\.(\S+?)\.?$", first)
        if missing and missing.group(1) == "optimizer":
            raise CheckpointError(
                f"The sharded checkpoint {path!r} has no optimizer.{missing.group(2)}, which this run's optimizer "
                "needs: it was saved with other optimizer settings (such as --fp16-adam-stats). Resume with the "
                "settings it was saved with (config.yaml in --save-dir lists them), or pass --reset-optimizer to "
                "keep only the weights.") from None
        if missing:
            raise CheckpointError(f"The sharded checkpoint {path!r} has no model.{missing.group(2)}: it was saved "
                                  "with another model. Use the size flags it was saved with, or start a new "
                                  "--save-dir.") from None
        raise CheckpointError(f"Cannot load the sharded checkpoint {path!r}: {first}. A shard file is missing "
                              "or damaged; resume from an earlier checkpoint.") from None


def _cause(e: BaseException) -> BaseException:
    """The first rank's own exception inside DCP's CheckpointException."""
    for failure in getattr(e, "failures", {}).values():
        return _cause(failure[0] if isinstance(failure, tuple) else failure)
    return e


def _refusal(e: BaseException) -> Optional[CheckpointError]:
    if isinstance(e, CheckpointError):
        return e
    for failure in getattr(e, "failures", {}).values():  # CheckpointException: rank -> (exception, trace)
        found = _refusal(failure[0] if isinstance(failure, tuple) else failure)
        if found:
            return found
    return None


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
