"""Issue 37: a lock file is written only into a plain file of its own folder. A symlink, a directory, a
FIFO, a socket or a hard link at the lock's name, and a read-only folder, are each one paragraph; the owner line
replaces a stale one whole. The lock function itself, in-process (each command once:
tests/cli/test_lock_file_refusals.py)."""
import fcntl
import os
import socket
import threading

import pytest

from read_only_folder import read_only
from shardtrain.core.file_lock import LockHeld, LockPathError, lock_exclusively

SECRET = "the file a link points to: never truncated, never written\n"


def refusal(path) -> str:
    """lock_exclusively(path) refuses in one paragraph, within a minute; returns it. In a thread: a blocking
    open (a FIFO) or a retry loop (a followed link is never the name's own file) must fail, not hang."""
    outcome = []

    def attempt():
        try:
            outcome.append(lock_exclusively(str(path)))
        except Exception as e:
            outcome.append(e)

    opener = threading.Thread(target=attempt, daemon=True)
    opener.start()
    opener.join(timeout=60)
    assert outcome, f"locking {path} still runs after 60 s"
    assert isinstance(outcome[0], LockPathError), outcome
    text = str(outcome[0])
    assert "\n" not in text and str(path) in text, text
    return text


def test_a_symlink_is_never_followed(tmp_path):
    outside = tmp_path / "outside.txt"
    outside.write_text(SECRET)
    (tmp_path / "run").mkdir()
    lock = tmp_path / "run" / "x.lock"
    lock.symlink_to(outside)
    text = refusal(lock)
    assert f"is a symbolic link (to {outside})" in text and f"remove the link (rm {lock};" in text, text
    assert outside.read_text() == SECRET and lock.is_symlink()  # neither the target nor the link touched


def test_a_dangling_symlink_creates_nothing_where_it_points(tmp_path):
    lock = tmp_path / "x.lock"
    lock.symlink_to(tmp_path / "created-through-the-link")
    assert "is a symbolic link" in refusal(lock)
    assert sorted(os.listdir(tmp_path)) == ["x.lock"]


def test_a_directory_is_refused(tmp_path):
    lock = tmp_path / "x.lock"
    (lock / "inside").mkdir(parents=True)
    text = refusal(lock)
    assert f"{lock} is a directory" in text and f"mv {lock}" in text, text
    assert os.listdir(lock) == ["inside"]


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path):
    lock = tmp_path / "x.lock"
    os.mkfifo(lock)
    text = refusal(lock)  # no writer ever comes: a blocking open would never return
    assert f"{lock} is a FIFO (named pipe)" in text and f"remove it (rm {lock})" in text, text


def test_a_hard_link_to_another_file_is_never_truncated(tmp_path):
    outside = tmp_path / "outside.txt"
    outside.write_text(SECRET)
    lock = tmp_path / "x.lock"
    os.link(outside, lock)
    assert "is a file with 2 names (hard links)" in refusal(lock)
    assert outside.read_text() == SECRET


def test_a_read_only_folder_is_one_paragraph(tmp_path, monkeypatch):
    folder = read_only(tmp_path, monkeypatch)
    text = refusal(folder / "x.lock")
    assert f"its folder {folder} is read-only" in text and "make the folder writable" in text, text
    assert os.listdir(folder) == []


def test_the_owner_line_replaces_a_longer_stale_one_whole_and_names_the_holder(tmp_path):
    lock = tmp_path / "x.lock"
    lock.write_text("pid 4000000 on a-stale-and-much-longer-host-name.cluster.example.org\n")
    fd = lock_exclusively(str(lock))
    try:
        assert lock.read_text() == f"pid {os.getpid()} on {socket.gethostname()}"
        with pytest.raises(LockHeld) as held:  # flock is per open file: a second open is refused
            lock_exclusively(str(lock))
        assert held.value.owner == f"pid {os.getpid()} on {socket.gethostname()}"
    finally:
        os.close(fd)


def test_a_holder_that_has_not_written_its_owner_line_yet_is_another_process(tmp_path):
    lock = tmp_path / "x.lock"
    holder = os.open(lock, os.O_RDWR | os.O_CREAT)  # locked, its owner line not written yet: an empty file
    try:
        fcntl.flock(holder, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(LockHeld) as held:
            lock_exclusively(str(lock))
        assert held.value.owner == "another process"
    finally:
        os.close(holder)


def test_a_socket_is_refused(tmp_path):
    path = tmp_path / "x.lock"
    server = socket.socket(socket.AF_UNIX)
    try:
        server.bind(str(path))
        text = refusal(path)
        assert "is not a regular file" in text and f"remove it (rm {path})" in text, text
    finally:
        server.close()


def test_a_file_its_holder_replaced_after_we_opened_it_is_not_the_lock(tmp_path, monkeypatch):
    """The holder unlinks the file we opened and a newer run locks a new one at the name before our flock:
    our lock on the old file holds nothing, and a second run at once would hold the name's lock too."""
    from shardtrain.core import file_lock

    lock = tmp_path / "x.lock"
    newer = []
    opened = file_lock._open_plain_file

    def open_then_replaced(path):
        fd = opened(path)
        if not newer:  # between our open and our flock: the old file goes, a newer run locks a new one
            os.unlink(path)
            newer.append(os.open(path, os.O_RDWR | os.O_CREAT))
            fcntl.flock(newer[0], fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.write(newer[0], b"pid 7 on newer-host")
        return fd

    monkeypatch.setattr(file_lock, "_open_plain_file", open_then_replaced)
    try:
        with pytest.raises(LockHeld) as held:
            lock_exclusively(str(lock))
        assert held.value.owner == "pid 7 on newer-host"
    finally:
        os.close(newer[0])
