"""One shard-preprocess per --destdir at a time.

Two runs into one destination would each publish a whole data-bin, and the one that finished last
would silently replace the other's (both exiting 0). So a run holds an exclusive ``flock`` on
``<destdir>/.shard-preprocess.lock`` from before it stages anything until its publish and clean-up
are done, and a second run is refused by name (the pid and host written into the file). The file is
removed on release, so a finished data-bin holds no trace of it. The protocol (core/file_lock.py) is
the save dir's, with preprocessing's words.
"""
import contextlib
import logging
import os

from shardtrain.core.errors import DataError
from shardtrain.core.file_lock import LockHeld, LocksUnsupported, lock_exclusively

LOCK_NAME = ".shard-preprocess.lock"  # hidden: never read as a split, never in the manifest
logger = logging.getLogger(__name__)


@contextlib.contextmanager
def destdir_locked(destdir: str):
    """Hold the lock of the existing directory ``destdir`` for the block."""
    path = os.path.join(destdir, LOCK_NAME)
    fd = _acquire(destdir, path)
    try:
        yield
    finally:
        if fd is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            os.close(fd)  # drops the flock


def _acquire(destdir: str, path: str):
    try:
        return lock_exclusively(path)
    except LocksUnsupported as e:
        logger.warning(f"cannot lock --destdir {destdir!r} ({e}): a second shard-preprocess into it would not "
                       "be detected")
        return None
    except LockHeld as held:
        raise DataError(f"Another shard-preprocess ({held.owner}) is writing the data-bin in --destdir {destdir!r}: "
                        "two runs into one destination would each publish a whole data-bin, and the one that "
                        "finished last would replace the other's. Wait for it to end (or stop it), or pass another "
                        "--destdir; nothing was written.") from None
