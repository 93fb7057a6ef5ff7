"""An exclusive ``flock`` on a file that names its holder: the protocol behind one run per --save-dir
(trainer/checkpoint/save_dir_lock.py) and one shard-preprocess per --destdir (data/destdir_lock.py).

The kernel drops a flock when its holder exits, however it exits, so a killed run never leaves a stale
lock. A holder may unlink the file while it still holds it (to leave no trace); a process that opened
the old file meanwhile sees that it no longer is the path's file and locks the new one.
"""
import errno
import fcntl
import os
import socket


class LockHeld(Exception):
    """Another process holds the lock; ``owner`` is what it wrote ("pid N on HOST")."""

    def __init__(self, owner: str):
        super().__init__(owner)
        self.owner = owner


class LocksUnsupported(Exception):
    """The filesystem has no locks at all (Lustre without -o flock, some NFS): nothing is held."""


def lock_exclusively(path: str) -> int:
    """The open descriptor of ``path`` (created), flocked and holding this process's pid and host.
    Close it to release. Raises LockHeld or LocksUnsupported."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            owner = os.read(fd, 200).decode("utf-8", "replace").strip() or "another process"
            os.close(fd)
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise LocksUnsupported(e.strerror) from None
            raise LockHeld(owner) from None
        if _same_file(fd, path):
            break
        os.close(fd)  # the holder removed the file after we opened it: lock the new one
    os.ftruncate(fd, 0)
    os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}".encode())
    return fd


def _same_file(fd: int, path: str) -> bool:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    return (st.st_dev, st.st_ino) == (os.fstat(fd).st_dev, os.fstat(fd).st_ino)
