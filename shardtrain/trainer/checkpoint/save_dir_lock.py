"""One run per --save-dir.

Two runs writing one save dir (a duplicate submission, a SLURM requeue while
the first attempt still runs) overwrite and prune each other's checkpoints and
leave a mix of both. Rank 0 holds an exclusive ``flock`` on
``<save-dir>/.shardtrain.lock`` while it trains; a second run is refused by
name. The kernel drops the lock when the holder exits, however it exits, so a
killed run never leaves a stale lock; the file (holding the owner's pid and
host, for the message) stays.
"""
import errno
import fcntl
import logging
import os
import socket
from typing import Optional

from shardtrain.core.errors import CheckpointError

LOCK_NAME = ".shardtrain.lock"
_UNLOCKABLE = -1  # _fd when the filesystem has no locks: warned once, not retried
logger = logging.getLogger(__name__)


class SaveDirLock:
    def __init__(self, save_dir: str):
        self.save_dir = save_dir
        self._fd: Optional[int] = None

    def acquire(self) -> None:
        """Take the lock (once); the save dir must exist."""
        if self._fd is not None:
            return
        fd = os.open(os.path.join(self.save_dir, LOCK_NAME), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                # some network filesystems (Lustre without -o flock) have no locks at all
                os.close(fd)
                logger.warning(f"cannot lock --save-dir {self.save_dir!r} ({e.strerror}): a second run in it "
                               "would not be detected")
                self._fd = _UNLOCKABLE
                return
            owner = os.read(fd, 200).decode("utf-8", "replace").strip() or "another process"
            os.close(fd)
            raise CheckpointError(
                f"Another run ({owner}) is training in --save-dir {self.save_dir!r}: two runs in one save dir "
                "overwrite and delete each other's checkpoints. Wait for it to end or stop it, or pass another "
                "--save-dir (a SLURM job requeued while its first attempt still runs meets this too).") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}".encode())
        self._fd = fd

    def release(self) -> None:
        if self._fd not in (None, _UNLOCKABLE):
            os.close(self._fd)  # drops the flock
        self._fd = None
