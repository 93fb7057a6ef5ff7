"""Single-file checkpoints with fairseq's names, written atomically.

Every file is written to a temporary name in the save dir, fsynced and then
renamed, so a crash at any moment leaves either the old file or the new one,
never a torn one. Extra names (last/best/epoch) are hard links of the first
file where the filesystem allows it (instant, no extra space), copies
otherwise, and are swapped in with the same rename.
"""
import logging
import os
import re
import shutil
from typing import Dict, List, Optional

import torch
from torch.distributed.checkpoint.api import CheckpointException

from shardtrain.fairseq_import import fairseq_lm, fairseq_pickle
from shardtrain.core.errors import CheckpointError
from shardtrain.core.fileio import atomic_open, fsync_dir, probe_writable_dir, remove_quietly, temp_sibling
from shardtrain.trainer.rng import gather_rng_states
from shardtrain.trainer.checkpoint.save_dir_lock import SaveDirLock
from shardtrain.trainer.checkpoint.sharded import ShardedSaver, marker
from shardtrain.trainer.checkpoint.safe_loading import load_weights_only

logger = logging.getLogger(__name__)
FORMAT_VERSION = 1


class CheckpointManager:
    def __init__(self, cfg, is_master: bool = True, sharded: bool = False):
        """``sharded``: write one DCP directory per checkpoint from all ranks
        (fully_sharded) instead of one file from rank 0."""
        self.cfg = cfg
        self.is_master = is_master
        self.sharded = sharded
        self.sharded_saver = ShardedSaver(async_save=cfg.async_save) if sharded else None
        self.lock = SaveDirLock(cfg.save_dir)

    def lock_save_dir(self) -> None:
        """Refuse to run beside another run in the same save dir (rank 0; see save_dir_lock)."""
        if self.is_master and not self.cfg.no_save and os.path.isdir(self.cfg.save_dir):
            self.lock.acquire()  # a save dir that does not exist yet is locked when the first save makes it

    # -- where -----------------------------------------------------------------
    def check_writable(self) -> None:
        """Fail before training starts, not at the first save an hour later."""
        if self.cfg.no_save or not self.is_master:
            return
        try:
            probe_writable_dir(self.cfg.save_dir)
        except OSError as e:
            raise CheckpointError(
                f"Cannot write checkpoints to --save-dir {self.cfg.save_dir!r}: {e.strerror or e}. Choose a "
                "writable directory with enough free space, or pass --no-save.") from None

    def restore_path(self) -> Optional[str]:
        """The checkpoint to resume from, or None for a fresh start."""
        name = self.cfg.restore_file
        path = name if os.path.isabs(name) else os.path.join(self.cfg.save_dir, name)
        path = resolve_checkpoint_path(path)  # a file, or a sharded directory
        if os.path.exists(path):
            return path
        if os.path.islink(path):  # never a silent fresh start over a run's checkpoints
            raise CheckpointError(
                f"{path} is a link to {os.readlink(path)!r}, which does not exist: the checkpoint it names was "
                "moved or deleted. Put it back, pass --restore-file with another checkpoint from --save-dir, or "
                "start a new --save-dir.")
        if name != "checkpoint_last.pt":
            raise CheckpointError(f"--restore-file {path!r} does not exist. Check the path (relative "
                                  "names are looked up in --save-dir).")
        return None

    # -- save ------------------------------------------------------------------
    def names_for(self, epoch: int, updates: int, end_of_epoch: bool, is_best: bool) -> List[str]:
        c = self.cfg
        names = []
        if end_of_epoch and not c.no_epoch_checkpoints and epoch % c.save_interval == 0:
            names.append(f"checkpoint{epoch}.pt")
        if (not end_of_epoch and c.save_interval_updates > 0 and updates % c.save_interval_updates == 0
                and not c.no_epoch_checkpoints):
            names.append(f"checkpoint_{epoch}_{updates}.pt")
        if is_best:
            names.append("checkpoint_best.pt")
        if not c.no_last_checkpoints:
            names.append("checkpoint_last.pt")
        return names

    def save(self, trainer, extra: Dict, epoch: int, updates: int, names: List[str]) -> List[str]:
        """Write ``trainer``'s state plus ``extra`` under ``names``. Called on every rank."""
        if self.cfg.no_save or not names:
            return []
        try:
            if self.sharded:
                return self._save_sharded(trainer, extra, epoch, updates, names)
            return self._save_file(trainer, extra, names)
        except (OSError, CheckpointException) as e:
            reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e).strip().splitlines()[0][:200]
            raise CheckpointError(
                f"Saving the checkpoint of update {updates} to {self.cfg.save_dir!r} failed: {reason}. The "
                "previous checkpoints are intact and resume as before; free space in --save-dir (or choose "
                "another one) and relaunch the same command.") from None

    def _save_file(self, trainer, extra: Dict, names: List[str]) -> List[str]:
        state = {**extra, **trainer.state_dict(), "rng_per_rank": gather_rng_states()}  # a collective
        if not self.is_master:
            return []
        os.makedirs(self.cfg.save_dir, exist_ok=True)
        self.lock.acquire()
        paths = [os.path.join(self.cfg.save_dir, n) for n in names]
        _atomic_torch_save({"version": FORMAT_VERSION, **state}, paths[0])
        for path in paths[1:]:
            _atomic_link_or_copy(paths[0], path)
        fsync_dir(self.cfg.save_dir)
        self.prune()
        return paths

    def _save_sharded(self, trainer, extra, epoch, updates, names) -> List[str]:
        storage = f"checkpoint_{epoch}_{updates}"
        aliases = [n[:-3] for n in names if n[:-3] != storage]
        if self.is_master:
            os.makedirs(self.cfg.save_dir, exist_ok=True)
            self.lock.acquire()
        path = self.sharded_saver.save(self.cfg.save_dir, storage, trainer.model, trainer.optimizer,
                                       {"version": FORMAT_VERSION, **extra, **trainer.extra_state()}, aliases,
                                       interval=f"{storage}.pt" in names, after=self.prune_sharded)
        return [path]

    def wait(self) -> None:
        """Finish a background save (--async-save); called before exit."""
        if self.sharded_saver is not None:
            self.sharded_saver.wait()

    def close(self) -> None:
        """End of the run: a background save lands, its staging buffers are freed, the lock released."""
        try:
            if self.sharded_saver is not None:
                self.sharded_saver.close()
        finally:
            self.lock.release()

    def prune_sharded(self) -> None:
        """Drop epoch aliases beyond --keep-last-epochs, interval checkpoints beyond
        --keep-interval-updates, and directories no name points to any more."""
        c, root = self.cfg, self.cfg.save_dir
        if c.keep_last_epochs > 0:
            for link in self._matching(re.compile(r"checkpoint(\d+)"))[c.keep_last_epochs:]:
                os.remove(link)
        referenced = {os.readlink(os.path.join(root, e)) for e in os.listdir(root)
                      if os.path.islink(os.path.join(root, e))}
        directories = self._matching(re.compile(r"checkpoint_\d+_(\d+)"))
        interval = [p for p in directories if marker(p).get("interval")]
        keep = set(interval[:c.keep_interval_updates] if c.keep_interval_updates > 0 else interval)
        for path in directories:
            if os.path.basename(path) not in referenced and path not in keep:
                shutil.rmtree(path, ignore_errors=True)

    def prune(self) -> None:
        c = self.cfg
        if c.keep_interval_updates > 0:
            pattern = re.compile(r"checkpoint_\d+_(\d+)\.pt$")
            for path in self._matching(pattern)[c.keep_interval_updates:]:
                os.remove(path)
        if c.keep_last_epochs > 0:
            for path in self._matching(re.compile(r"checkpoint(\d+)\.pt$"))[c.keep_last_epochs:]:
                os.remove(path)

    def _matching(self, pattern) -> List[str]:
        """Paths matching ``pattern``, newest (largest number) first."""
        found = []
        for name in os.listdir(self.cfg.save_dir):
            m = pattern.fullmatch(name)
            if m:
                found.append((int(m.group(1)), os.path.join(self.cfg.save_dir, name)))
        return [p for _, p in sorted(found, reverse=True)]


def resolve_checkpoint_path(path: str) -> str:
    """``path`` itself, or the sharded directory of that name without ``.pt``."""
    if not os.path.lexists(path) and path.endswith(".pt") and (
            os.path.isdir(path[:-3]) or os.path.islink(path[:-3])):  # a link even when dangling
        return path[:-3]
    return path


def load_checkpoint(path: str, model_only: bool = False) -> Dict:
    """Load one of our checkpoints without unpickling arbitrary objects.

    ``model_only``: the caller needs only the model and its config
    (inference, --finetune-from-model), so a fairseq transformer_lm checkpoint
    that loads as safely as ours is converted in memory; otherwise it is
    refused with a pointer to ``shard-import-fairseq``.
    """
    if not os.path.isfile(path):
        raise CheckpointError(f"Checkpoint {path!r} does not exist. Check --path / --restore-file.")
    try:
        state = load_weights_only(path, path)
    except Exception as e:  # noqa: BLE001 - torch raises many types for bad files
        found = fairseq_pickle.fairseq_globals(path)
        if found:
            raise CheckpointError(
                f"{path} is a fairseq checkpoint that pickles Python objects ({', '.join(sorted(found)[:3])}), "
                "so loading it can run code, and shardtrain loads checkpoints only with torch.load("
                f"weights_only=True). If you trust its source, convert it once: `shard-import-fairseq {path} "
                "OUT.pt --data DATA_BIN --trust-checkpoint`, then pass OUT.pt.") from None
        if isinstance(e, CheckpointError):  # a pickled object outside the safe types
            raise
        raise CheckpointError(
            f"Cannot load checkpoint {path!r} ({os.path.getsize(path)} bytes{_reason(e)}): it is truncated (a full "
            "disk or an interrupted copy), corrupt, or not a checkpoint at all. Pass another checkpoint (fairseq "
            "checkpoints need `shard-import-fairseq`).") from None
    if fairseq_pickle.looks_like_fairseq(state):
        if model_only:
            return {"version": FORMAT_VERSION, **fairseq_lm.to_shardtrain(state, path)}
        raise CheckpointError(
            f"{path} is a fairseq checkpoint: shardtrain resumes only its own checkpoints (fairseq's optimizer "
            f"and data state do not carry over). Start from its weights with --finetune-from-model {path}, or "
            f"convert it once with `shard-import-fairseq {path} OUT.pt --data DATA_BIN`.")
    if not isinstance(state, dict) or "model" not in state or "cfg" not in state:
        raise CheckpointError(f"{path!r} is not a shardtrain checkpoint (it has no model/cfg entries).")
    return state


def _reason(e: Exception) -> str:
    """torch's own words, when they are short and not its advice to load unsafely."""
    lines = str(e).strip().splitlines()
    if not lines or lines[0].startswith("Weights only load failed"):
        return f"; {type(e).__name__}"
    return f"; {type(e).__name__}: {lines[0][:200]}"


def _atomic_torch_save(obj, path: str) -> None:
    with atomic_open(path) as f:
        writer = _WriteErrors(f)
        try:
            torch.save(obj, writer)
        except RuntimeError:
            # torch's zip writer turns a failed write (a full disk) into "unexpected pos N vs M";
            # the OSError it swallowed says what happened.
            if writer.error is not None:
                raise writer.error from None
            raise


class _WriteErrors:
    """A file's ``write``, remembering the OSError a write raised."""

    def __init__(self, f):
        self.f, self.error = f, None

    def write(self, data) -> int:
        try:
            return self.f.write(data)
        except OSError as e:
            self.error = e
            raise

    def flush(self) -> None:
        self.f.flush()


def _atomic_link_or_copy(src: str, dst: str) -> None:
    tmp = temp_sibling(dst)
    try:
        try:
            os.link(src, tmp)
        except OSError:
            shutil.copyfile(src, tmp)
        os.replace(tmp, dst)
    except BaseException:
        remove_quietly(tmp)
        raise
