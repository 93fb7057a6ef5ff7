"""An exclusive ``flock`` on a file that names its holder: the protocol behind one run per --save-dir
(trainer/checkpoint/save_dir_lock.py) and one shard-preprocess per --destdir (data/destdir_lock.py).

The kernel drops a flock when its holder exits, however it exits, so a killed run never leaves a stale
lock. A holder may unlink the file while it still holds it (to leave no trace); a process that opened
the old file meanwhile sees that it no longer is the path's file and locks the new one.

The lock is written only into a regular file of its own folder: a symlink is never followed (it could
point anywhere, and the owner line would overwrite what it points to), a FIFO is never waited on, and a
file with other names (hard links) is never truncated. Each of these, and a folder that cannot be
written, is one paragraph (LockPathError).
"""
import errno
import fcntl
import os
import socket
import stat

from shardtrain.core.errors import ShardtrainError

# O_NOFOLLOW: a symlink as the last component fails (ELOOP) instead of being followed, also with O_CREAT.
# O_NONBLOCK: opening a FIFO returns at once instead of waiting for a writer; regular files ignore it.
_OPEN_FLAGS = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_NOT_WRITABLE = (errno.EACCES, errno.EPERM, errno.EROFS)


class LockHeld(Exception):
    """Another process holds the lock; ``owner`` is what it wrote ("pid N on HOST")."""

    def __init__(self, owner: str):
        super().__init__(owner)
        self.owner = owner


class LocksUnsupported(Exception):
    """The filesystem has no locks at all (Lustre without -o flock, some NFS): nothing is held."""


class LockPathError(ShardtrainError):
    """The lock's name is taken by something that is not a plain file of its own, or its folder is not writable."""


def lock_exclusively(path: str) -> int:
    """The open descriptor of ``path`` (created), flocked and holding this process's pid and host.
    Close it to release. Raises LockHeld, LocksUnsupported or LockPathError."""
    while True:
        fd = _open_plain_file(path)
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
    os.ftruncate(fd, 0)  # a longer stale owner line must not leave its tail behind
    os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}".encode())
    return fd


def _open_plain_file(path: str) -> int:
    """``path`` opened (created) without following a link or waiting on a FIFO; anything but a
    regular file with no other name is refused, closed again."""
    try:
        fd = os.open(path, _OPEN_FLAGS, 0o644)
    except OSError as e:
        refusal = _refusal(path, e)
        if refusal is None:
            raise  # e.g. a full disk: the caller's own paragraph says what to do
        raise LockPathError(refusal) from None
    st = os.fstat(fd)
    if stat.S_ISREG(st.st_mode) and st.st_nlink <= 1:
        return fd
    os.close(fd)
    if stat.S_ISREG(st.st_mode):
        raise LockPathError(_not_its_own(path, f"a file with {st.st_nlink} names (hard links), one of them perhaps "
                                         "outside its folder", f"remove this name (rm {path}; the file's other "
                                         "names keep it)"))
    kind = "a FIFO (named pipe)" if stat.S_ISFIFO(st.st_mode) else "not a regular file"
    raise LockPathError(_not_its_own(path, kind, f"remove it (rm {path})"))


def _refusal(path: str, e: OSError):
    """The paragraph for a failed open of the lock file, or None where the caller's handling applies."""
    if e.errno in (errno.ELOOP, errno.EMLINK) and os.path.islink(path):  # EMLINK: BSD's O_NOFOLLOW
        return _not_its_own(path, f"a symbolic link (to {os.readlink(path)})",
                            f"remove the link (rm {path}; what it points to is left alone)")
    if e.errno == errno.EISDIR or (e.errno in _NOT_WRITABLE and os.path.isdir(path)):
        return _not_its_own(path, "a directory", f"move the directory away (mv {path} SOMEWHERE) or remove it")
    if e.errno == errno.ENXIO:  # a socket
        return _not_its_own(path, "not a regular file", f"remove it (rm {path})")
    if e.errno not in _NOT_WRITABLE:
        return None
    if os.path.lexists(path):
        return (f"Cannot write the lock file {path} ({e.strerror}): it exists but this user may not write it. "
                f"Remove it (rm {path}) or make it writable, and run again; nothing was written.")
    return (f"Cannot create the lock file {path} ({e.strerror}): its folder {os.path.dirname(os.path.abspath(path))} "
            "is read-only (a read-only mount, or no write permission for this user). The lock refuses a second run "
            "into the same folder, so it is never skipped: make the folder writable, or choose another one; nothing "
            "was written.")


def _not_its_own(path: str, what: str, fix: str) -> str:
    return (f"The lock file {path} is {what}: a lock is written only into a plain file of its own folder, never "
            "through a link, into a directory or pipe, or into a file with other names, so that it cannot "
            f"overwrite anything else or hang. To fix it, {fix} and run again: the lock file is made anew. "
            "Nothing was written.")


def _same_file(fd: int, path: str) -> bool:
    try:
        st = os.lstat(path)  # the name's own entry: a link put there since is not our file
    except FileNotFoundError:
        return False
    return (st.st_dev, st.st_ino) == (os.fstat(fd).st_dev, os.fstat(fd).st_ino)
