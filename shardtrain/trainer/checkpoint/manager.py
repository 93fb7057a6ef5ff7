"""The run's checkpoints: where they go, their fairseq names, and saving them.

The format (one file, or one sharded directory; see formats.py) is chosen
here once, from the backend; it writes the parts (see contents.py) and prunes.
"""
import os
from typing import Dict, List, Optional

from omegaconf import OmegaConf
from torch.distributed.checkpoint.api import CheckpointException

from shardtrain.core.errors import CheckpointError
from shardtrain.core.fileio import atomic_write_bytes, probe_writable_dir
from shardtrain.trainer.checkpoint.dcp_errors import failed_save_error, out_of_descriptors
from shardtrain.trainer.checkpoint.contents import NO_OPTIMIZER_STATE, without
from shardtrain.trainer.checkpoint.keep_best import best_name
from shardtrain.trainer.checkpoint.choose import format_for_saving
from shardtrain.trainer.checkpoint.formats import both_forms
from shardtrain.trainer.checkpoint.newer import newer
from shardtrain.trainer.checkpoint.save_dir_lock import SaveDirLock

CONFIG_FILE = "config.yaml"  # the resolved config, next to the checkpoints
# --restore-file's default: the one name that means "whichever form is newer" (newer.py); any other name
# (checkpoint_last.pt as a full path included) is the user's own choice and loads as named.
DEFAULT_RESTORE = "checkpoint_last.pt"


class CheckpointManager:
    def __init__(self, checkpoint, is_master: bool = True, sharded: bool = False):
        """``checkpoint``: the config's checkpoint section. ``sharded``: write one DCP
        directory per checkpoint from all ranks (fully_sharded) instead of one file from rank 0."""
        self.checkpoint = checkpoint
        self.is_master = is_master
        self.sharded = sharded
        self.format = format_for_saving(sharded, checkpoint.async_save)
        self.lock = SaveDirLock(checkpoint.save_dir)
        # The newest checkpoint this run saved ("NAME of update N"), each checked finite first (loop.py), or
        # None: only such a one may a divergence call intact (TrainingDivergedError.naming).
        self.last_checked_save: Optional[str] = None

    def lock_save_dir(self) -> None:
        """Refuse to run beside another run in the same save dir (rank 0; see save_dir_lock),
        at start: a save dir that does not exist yet is made and locked now."""
        if self.is_master and not self.checkpoint.no_save:
            self.lock.acquire()

    # -- where -----------------------------------------------------------------
    def check_writable(self) -> None:
        """Fail before training starts, not at the first save an hour later."""
        if self.checkpoint.no_save or not self.is_master:
            return
        try:
            probe_writable_dir(self.checkpoint.save_dir)
        except OSError as e:
            raise CheckpointError(
                f"Cannot write checkpoints to --save-dir {self.checkpoint.save_dir!r}: {e.strerror or e}. Choose a "
                "writable directory with enough free space, or pass --no-save.") from None

    def restore_path(self) -> Optional[str]:
        """The checkpoint to resume from, or None for a fresh start."""
        name = self.checkpoint.restore_file
        path = name if os.path.isabs(name) else os.path.join(self.checkpoint.save_dir, name)
        found = [p for p in both_forms(path) if os.path.lexists(p)]  # a file, or a sharded directory
        for link in found:
            if os.path.islink(link) and not os.path.exists(link):  # never a silent fresh (or older) start
                raise CheckpointError(
                    f"{link} is a link to {os.readlink(link)!r}, which does not exist: the checkpoint it names was "
                    "moved or deleted. Put it back, pass --restore-file with another checkpoint from --save-dir, "
                    "or start a new --save-dir.")
        if len(found) == 2 and name != DEFAULT_RESTORE:  # X.pt named explicitly: that file, whatever X/ holds
            return found[0]
        if len(found) == 2:  # checkpoint_last.pt and checkpoint_last: not simply the file (see newer.py)
            return newer(*found, prefer_directory=self.sharded)
        if found:
            return found[0]
        if name != "checkpoint_last.pt":
            raise CheckpointError(f"--restore-file {path!r} does not exist. Check the path (relative "
                                  "names are looked up in --save-dir).")
        return None

    # -- save ------------------------------------------------------------------
    def names_for(self, epoch: int, updates: int, end_of_epoch: bool, is_best: bool,
                  valid_value: Optional[float] = None) -> List[str]:
        c = self.checkpoint
        names = []
        if end_of_epoch and not c.no_epoch_checkpoints and epoch % c.save_interval == 0:
            names.append(f"checkpoint{epoch}.pt")
        # fairseq writes these whatever --no-epoch-checkpoints says (its recipes pair the two flags with
        # --keep-interval-updates to keep only the latest update checkpoints)
        if not end_of_epoch and c.save_interval_updates > 0 and updates % c.save_interval_updates == 0:
            names.append(f"checkpoint_{epoch}_{updates}.pt")
        if is_best:
            names.append("checkpoint_best.pt")
        kept_best = best_name(c, epoch, updates, valid_value)
        if kept_best:
            names.append(kept_best)
        if not c.no_last_checkpoints:
            names.append("checkpoint_last.pt")
        return names

    def save(self, header: Dict, parts: Dict, epoch: int, updates: int, names: List[str]) -> List[str]:
        """Write ``header`` and the stateful ``parts`` (contents.py) under ``names``. Called on every rank,
        once check_finite (finite.py) passed on them: the first name becomes the newest checked save."""
        if self.checkpoint.no_save or not names:
            return []
        if self.checkpoint.no_save_optimizer_state:  # fairseq's flag; resume.py starts a fresh optimizer
            header, parts = {**header, NO_OPTIMIZER_STATE: True}, without(parts, ["optimizer"])
        try:
            # the format prunes (--keep-* flags) once the names are in place: with --async-save, in the background
            paths = self.format.save(self.checkpoint, names, header, parts, epoch, updates, self.is_master,
                                     self._prepare)
        except (OSError, CheckpointException) as e:
            raise failed_save_error(f"of update {updates}", self.checkpoint.save_dir, e) from None
        except RuntimeError as e:  # gloo's words for a full descriptor table; any other is a bug: traceback
            if not out_of_descriptors(e):
                raise
            raise failed_save_error(f"of update {updates}", self.checkpoint.save_dir, e) from None
        shown = f"the directory {names[0][:-3]}" if self.format.saves_directories else names[0]
        self.last_checked_save = f"{shown} of update {updates}"  # saved (a failed save raised), on every rank
        return paths

    def _prepare(self) -> None:
        os.makedirs(self.checkpoint.save_dir, exist_ok=True)
        self.lock.acquire()

    def wait(self) -> None:
        """Finish a background save (--async-save); called before exit."""
        self.format.wait()

    def close(self) -> None:
        """End of the run: a background save lands, its staging buffers are freed, the lock released."""
        try:
            self.format.close()
        finally:
            self.lock.release()


def write_config(cfg, save_dir: str) -> None:
    """The resolved config as ``config.yaml`` in the save dir (``build.from_dict``
    of the loaded YAML rebuilds it). Written after a checkpoint rather than at
    start-up, so a run that fails to start leaves no files; rewritten only when
    it changed (a resumed run with other flags), so it describes the latest run."""
    path = os.path.join(save_dir, CONFIG_FILE)
    text = OmegaConf.to_yaml(cfg).encode("utf-8")
    try:
        if os.path.exists(path):
            with open(path, "rb") as f:
                if f.read() == text:
                    return
        atomic_write_bytes(path, text)
    except OSError as e:
        raise CheckpointError(f"Writing {path} failed: {e.strerror or e}. The checkpoint itself was saved; free "
                              "space in --save-dir (or choose another one) and relaunch the same command.") from None
