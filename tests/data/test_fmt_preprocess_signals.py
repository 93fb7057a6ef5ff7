"""shard-preprocess under Ctrl-C and SIGTERM, in a real subprocess with real workers: it exits at once
with one line and no traceback, and leaves no staging directory, no new --destdir and no worker behind."""
import os
import random
import signal
import subprocess
import sys
import time

import pytest

from shardtrain.data.binarize import count_symbols
from shardtrain.core.errors import DataError

pytestmark = pytest.mark.slow  # every test here starts a process, a multi-rank group or a training run

WORKERS = 2  # a real pool, within any machine's cap
STARTUP_TIMEOUT_S = 60
EXIT_TIMEOUT_S = 30


@pytest.fixture(scope="module")
def big_text(tmp_path_factory):
    """A few MB: long enough that the run is still counting or binarizing when the signal arrives."""
    rng = random.Random(0)
    words = [f"w{i}" for i in range(200)]
    path = tmp_path_factory.mktemp("text") / "train.txt"
    with open(path, "w") as f:
        for _ in range(200_000):
            f.write(" ".join(rng.choice(words) for _ in range(8)) + "\n")
    return str(path)


def start(text, destdir):
    cmd = [sys.executable, "-m", "shardtrain.cli.preprocess", "--tokenizer", "space", "--trainpref", text,
           "--destdir", str(destdir), "--workers", str(WORKERS), "--no-progress-bar"]
    # Its own process group, as a shell gives a foreground job: Ctrl-C signals the whole group.
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def wait_for_staging(proc, destdir):
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline and proc.poll() is None:
        if destdir.is_dir() and any(n.startswith(".preprocess-") for n in os.listdir(destdir)):
            time.sleep(0.3)  # into the counting or binarizing, workers running
            return
        time.sleep(0.02)
    proc.kill()
    pytest.fail(f"no staging directory appeared: {proc.communicate()[1]}")


def live_group_members(pgid):
    members = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # exited meanwhile
        if int(fields[2]) == pgid and fields[0] != "Z":  # a zombie has already exited
            members.append(int(pid))
    return members


def signal_and_wait(proc, signum, whole_group):
    if whole_group:
        os.killpg(proc.pid, signum)
    else:
        os.kill(proc.pid, signum)
    try:
        _, stderr = proc.communicate(timeout=EXIT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail(f"still running {EXIT_TIMEOUT_S}s after the signal: {proc.communicate()[1][-2000:]}")
    deadline = time.monotonic() + 5
    while live_group_members(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    leftover = live_group_members(proc.pid)
    if leftover:
        os.killpg(proc.pid, signal.SIGKILL)
    return proc.returncode, stderr, leftover


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="finds leftover processes through /proc")
@pytest.mark.parametrize("signum, whole_group, status, message", [
    (signal.SIGINT, True, 130, "interrupted"),  # Ctrl-C in a terminal
    (signal.SIGTERM, True, 143, "terminated by SIGTERM"),  # a scheduler signalling every process
    (signal.SIGTERM, False, 143, "terminated by SIGTERM"),  # kill PID
])
def test_signal_stops_cleanly(tmp_path, big_text, signum, whole_group, status, message):
    destdir = tmp_path / "new" / "data-bin"  # parents made by this run go too
    proc = start(big_text, destdir)
    wait_for_staging(proc, destdir)
    returncode, stderr, leftover = signal_and_wait(proc, signum, whole_group)
    assert returncode == status, stderr
    assert "Traceback" not in stderr and message in stderr, stderr
    assert len(stderr.strip().splitlines()) == 1, stderr
    assert not leftover, f"processes outlived shard-preprocess: {leftover}"
    assert not (tmp_path / "new").exists()


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="finds leftover processes through /proc")
def test_sigterm_leaves_an_existing_data_bin_as_it_was(tmp_path, big_text):
    destdir = tmp_path / "data-bin"
    destdir.mkdir()
    (destdir / "dict.txt").write_text("old 1\n")
    proc = start(big_text, destdir)
    wait_for_staging(proc, destdir)
    returncode, stderr, leftover = signal_and_wait(proc, signal.SIGTERM, whole_group=True)
    assert returncode == 143 and "Traceback" not in stderr and not leftover, stderr
    assert os.listdir(destdir) == ["dict.txt"] and (destdir / "dict.txt").read_text() == "old 1\n"


def _die(line):
    os._exit(3)  # as if the OOM killer took the worker


def test_a_dead_worker_is_an_error_not_a_hang(tmp_path):
    path = tmp_path / "t.txt"
    path.write_text("a b\n" * 100)
    with pytest.raises(DataError, match=r"worker process died \(exit status 3\).*fewer --workers"):
        count_symbols(str(path), _die, workers=2, progress=False)
