"""One run per --save-dir.

Two runs writing one save dir (a duplicate submission, a SLURM requeue while
the first attempt still runs) overwrite and prune each other's checkpoints and
leave a mix of both. Rank 0 holds an exclusive ``flock`` on
``<save-dir>/.shardtrain.lock`` while it trains; a second run is refused by
name. The lock is taken at start, before the model is built, making the save
dir if it is new, so a second run never trains only to be refused at its first
save. The kernel drops the lock when the holder exits (core/file_lock.py);
the file (holding the owner's pid and host, for the message) stays, except in
a save dir this run made and never saved in (a run that failed to start):
that one is removed again, whole.
"""
import contextlib
import logging
import os
from typing import List, Optional

from shardtrain.core.errors import CheckpointError
from shardtrain.core.file_lock import LockHeld, LocksUnsupported, lock_exclusively

LOCK_NAME = ".shardtrain.lock"
_UNLOCKABLE = -1  # _fd when the filesystem has no locks: warned once, not retried
logger = logging.getLogger(__name__)


class SaveDirLock:
    def __init__(self, save_dir: str):
        self.save_dir = save_dir
        self._fd: Optional[int] = None
        self._made: List[str] = []  # the directories acquire() created, outermost first

    def acquire(self) -> None:
        """Take the lock (once), making the save dir and its missing parents first."""
        if self._fd is not None:
            return
        self._made = _make_dirs(self.save_dir)
        try:
            self._fd = lock_exclusively(os.path.join(self.save_dir, LOCK_NAME))
        except LocksUnsupported as e:
            logger.warning(f"cannot lock --save-dir {self.save_dir!r} ({e}): a second run in it would not be "
                           "detected")
            self._fd = _UNLOCKABLE
        except LockHeld as held:
            raise CheckpointError(
                f"Another run ({held.owner}) is training in --save-dir {self.save_dir!r}: two runs in one save dir "
                "overwrite and delete each other's checkpoints. Wait for it to end or stop it, or pass another "
                "--save-dir (a SLURM job requeued while its first attempt still runs meets this too).") from None

    def release(self) -> None:
        """Drop the lock; a save dir this run made and wrote nothing else into goes too."""
        if self._fd is not None and self._made and _holds_only_the_lock(self.save_dir):
            # unlinked while still held, so a run that opened the old file is refused or retries (acquire)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(self.save_dir, LOCK_NAME))
            for directory in reversed(self._made):
                with contextlib.suppress(OSError):
                    os.rmdir(directory)
        self._made = []
        if self._fd not in (None, _UNLOCKABLE):
            os.close(self._fd)  # drops the flock
        self._fd = None


def _make_dirs(path: str) -> List[str]:
    """``os.makedirs(path)``; returns the directories it created, outermost first."""
    missing, parent = [], os.path.abspath(path)
    while not os.path.lexists(parent):
        missing.append(parent)
        parent = os.path.dirname(parent)
    os.makedirs(path, exist_ok=True)
    return list(reversed(missing))


def _holds_only_the_lock(path: str) -> bool:
    try:
        return os.listdir(path) in ([LOCK_NAME], [])
    except OSError:
        return False

