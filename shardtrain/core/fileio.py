"""Atomic file writes: readers see the old file or the whole new one, never a part.

Write to a unique temporary name in the same directory, fsync, then
``os.replace`` (atomic on POSIX within one filesystem). Temporary names start
with a dot so nothing that lists checkpoints or splits ever picks one up.
"""
import contextlib
import os
import socket
import stat
import tempfile
import uuid


def writer_tag() -> str:
    """``HOST.PID`` of this process, put into temporary names so that a later run can tell a
    killed writer's leftovers (remove them) from a live writer's (keep them), even on a shared
    filesystem written from several machines."""
    return f"{socket.gethostname()}.{os.getpid()}"


def writer_is_dead(tag: str) -> bool:
    """True if ``tag`` (from :func:`writer_tag`) names a process of this machine that no longer
    exists. Another machine's process, or a live one, is never called dead."""
    host, _, pid = tag.rpartition(".")
    if host != socket.gethostname() or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return True
    except PermissionError:  # exists, owned by another user
        return False
    return False


def temp_sibling(path: str) -> str:
    """A unique temporary name in ``path``'s directory, so ``os.replace`` stays atomic."""
    directory, name = os.path.split(os.path.abspath(path))
    return os.path.join(directory, f".{name}.{writer_tag()}.{uuid.uuid4().hex[:8]}.tmp")


def remove_dead_writers_temps(path: str) -> None:
    """Remove the temporary siblings of ``path`` whose writer was killed (SIGKILL, OOM, power loss):
    nothing else ever would, and each can be as large as the file itself."""
    directory, name = os.path.split(os.path.abspath(path))
    head = f".{name}."
    with contextlib.suppress(OSError):
        for entry in os.listdir(directory):
            if entry.startswith(head) and entry.endswith(".tmp"):
                tag = entry[len(head):-len(".tmp")].rpartition(".")[0]  # drop the random part
                if writer_is_dead(tag):
                    remove_quietly(os.path.join(directory, entry))


def open_new(path: str):
    # os.open with 0o666 keeps the user's umask (mkstemp would force 0600).
    return os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), "wb")


@contextlib.contextmanager
def atomic_open(path: str):
    """``with atomic_open(p) as f: f.write(...)``: ``p`` appears only if the block succeeds.
    Temporary files of ``p`` left by killed writers are removed first."""
    remove_dead_writers_temps(path)
    tmp = temp_sibling(path)
    try:
        with open_new(tmp) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        remove_quietly(tmp)
        raise


def atomic_write_bytes(path: str, data: bytes) -> None:
    with atomic_open(path) as f:
        f.write(data)


def fsync_dir(directory: str) -> None:
    """Make renames in ``directory`` durable across a power loss."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def remove_quietly(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


def probe_writable_dir(path: str) -> None:
    """Raise OSError unless files can be created in directory ``path``.

    Creates the missing directories and a file in the last one, then removes
    what it made: only trying tells (root passes every permission check yet
    cannot write to a read-only mount or to /sys), and a run that then fails
    to start leaves nothing behind."""
    made = []
    try:
        missing, parent = [], os.path.abspath(path)
        while not os.path.lexists(parent):
            missing.append(parent)
            parent = os.path.dirname(parent)
        for directory in reversed(missing):
            os.mkdir(directory)
            made.append(directory)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".write-test-"):
            pass
    finally:
        for directory in reversed(made):
            try:
                os.rmdir(directory)
            except OSError:
                pass


@contextlib.contextmanager
def open_regular(path: str):
    """``path`` (a link followed) open for reading if it is a regular file, else None: a FIFO is opened without
    waiting for a writer and never read (a read would wait forever), a device never read (``/dev/zero`` never
    ends). Raises OSError where ``open`` does (a dangling link; a socket: ENXIO)."""
    with os.fdopen(os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC), "rb") as f:
        yield f if stat.S_ISREG(os.fstat(f.fileno()).st_mode) else None


def file_kind(mode: int) -> str:
    """Words for what a ``st_mode`` is, for a refusal."""
    kinds = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
             (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory"))
    return next((words for test, words in kinds if test(mode)), "not a regular file")
