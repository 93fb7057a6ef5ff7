"""Interrupted commands (issue 16, red-team item 9), with real processes and real signals: Ctrl-C and
SIGTERM are answered with one line and exit 130 / 143, no traceback and no temporary file left, also
while the console script is still importing; what a SIGKILL leaves is removed by the next run, and
a live writer's temporary file is not. (shard-preprocess: tests/data/test_fmt_preprocess_signals.py
and test_fmt_manifest.py; shard-train's preemption: tests/trainer/launch/test_preemption.py.)"""
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from shardtrain.cli import consolidate, train
from shardtrain.cli import entry
from shardtrain.cli.entry import COMMANDS
from st_testutils import make_space_data_bin, tiny_model_flags

# As the installed console script runs it (pyproject.toml): the handlers go in before the heavy imports.
CONSOLE_SCRIPT = "import sys; from shardtrain.cli.entry import shard_consolidate; sys.exit(shard_consolidate())"
# ~150 MB of checkpoint, as the red-team's 100-550 MB: writing it takes long enough to be caught at it.
BIG_MODEL = ["--decoder-layers", "4", "--decoder-embed-dim", "512", "--decoder-ffn-embed-dim", "2048",
             "--decoder-attention-heads", "8"]
TIMEOUT_S = 120


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    root = tmp_path_factory.mktemp("interrupted")
    data = make_space_data_bin(str(root), n_words=8, train_tokens=2000, valid_tokens=200, line_len=40)
    train.main([data, *tiny_model_flags(), *BIG_MODEL, "--max-update", "1", "--disable-validation",
                "--no-epoch-checkpoints", "--save-dir", str(root / "ck")])
    consolidate.main([str(root / "ck" / "checkpoint_last.pt"), str(root / "sharded")])
    return str(root / "sharded")


def start_consolidate(sharded, out_dir):
    out_dir.mkdir(exist_ok=True)
    return subprocess.Popen([sys.executable, "-c", CONSOLE_SCRIPT, sharded, str(out_dir / "out.pt")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def wait_until(proc, ready, what):
    deadline = time.monotonic() + TIMEOUT_S
    while not ready():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"never {what}: {proc.communicate()[1][-2000:]}")
        time.sleep(0.001)


def temp_files(out_dir):
    return [n for n in os.listdir(out_dir) if n.endswith(".tmp")]


def writing(out_dir):
    """A temporary file with bytes in it: the command is in the middle of its write."""
    sizes = []
    for name in temp_files(out_dir):
        try:
            sizes.append(os.path.getsize(out_dir / name))
        except FileNotFoundError:  # renamed into place meanwhile
            pass
    return any(sizes)


def importing_torch(pid) -> bool:
    """Whether torch's library is mapped into the process yet (/proc/PID/maps): from then on it spends
    a second or more importing torch's Python modules, long before the command's main() starts."""
    with open(f"/proc/{pid}/maps") as f:
        return "libtorch" in f.read()


def assert_one_line(proc, signum):
    err = proc.communicate(timeout=TIMEOUT_S)[1]
    # The line a slow import prints after a second (cli/entry.py) may come first; the answer is one line.
    err = "".join(line for line in err.splitlines(keepends=True) if not line.startswith("shard-consolidate: starting"))
    status, words = {signal.SIGINT: (130, "interrupted"), signal.SIGTERM: (143, "terminated by SIGTERM")}[signum]
    assert proc.returncode == status, err[-2000:]
    assert err.startswith(f"shard-consolidate: {words}") and "no half-written file" in err, err
    assert err.count("\n") == 1 and "Traceback" not in err, err


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_signal_while_writing_is_one_line_and_leaves_nothing(signum, sharded, tmp_path):
    out_dir = tmp_path / "out"
    proc = start_consolidate(sharded, out_dir)
    wait_until(proc, lambda: writing(out_dir), "started writing")
    proc.send_signal(signum)
    assert_one_line(proc, signum)
    assert os.listdir(out_dir) == []


@pytest.mark.slow
@pytest.mark.skipif(not os.path.isdir("/proc"), reason="sees torch being imported through /proc")
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_signal_while_importing_is_one_line(signum, sharded, tmp_path):
    out_dir = tmp_path / "out"
    proc = start_consolidate(sharded, out_dir)
    wait_until(proc, lambda: importing_torch(proc.pid), "started importing torch")
    proc.send_signal(signum)
    assert_one_line(proc, signum)
    assert os.listdir(out_dir) == []


@pytest.mark.slow
def test_sigkill_leftovers_are_removed_by_the_next_run(sharded, tmp_path):
    out_dir = tmp_path / "out"
    proc = start_consolidate(sharded, out_dir)
    wait_until(proc, lambda: writing(out_dir), "started writing")
    proc.kill()
    proc.communicate(timeout=TIMEOUT_S)
    killed = temp_files(out_dir)
    assert len(killed) == 1 and os.path.getsize(out_dir / killed[0]) > 0  # what the red-team found
    live = f".out.pt.{socket.gethostname()}.{os.getpid()}.0123abcd.tmp"  # a live writer's: this test's
    (out_dir / live).write_bytes(b"")
    consolidate.main([sharded, str(out_dir / "out.pt")])
    assert sorted(os.listdir(out_dir)) == sorted([live, "out.pt"])


def test_every_console_script_starts_through_entry():
    with open(os.path.join(os.path.dirname(__file__), "..", "..", "pyproject.toml")) as f:
        project = f.read()
    for prog in COMMANDS:
        assert f'{prog} = "shardtrain.cli.entry:{prog.replace("-", "_")}"' in project, prog
        assert callable(getattr(entry, prog.replace("-", "_")))
    assert project.count("shardtrain.cli.") == len(COMMANDS)
