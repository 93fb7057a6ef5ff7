"""Issue 37: signals while the launcher starts its ranks, and CPU ranks far beyond the cores.

Ctrl-C or SIGTERM before every rank has joined: nothing can be saved yet, so the ranks are stopped and the
command answers the signal itself (one line, exit 128 + signal), not "rank 0 ... killed by signal SIGTERM,
look for the cause in rank 0's output" (the SIGTERM the launcher had sent it). One real launch per signal,
whose ranks are stopped while they import torch; the rest in-process."""
import os
import signal
import subprocess
import sys

import pytest

from shardtrain.config.run_config import parse_train_args
from shardtrain.trainer.launch import start, threads
from shardtrain.trainer.launch.preemption import FIRST_CTRL_C, STOPPED_AT_ONCE
from st_testutils import group_gone, make_space_data_bin, scaled, tiny_model_flags

WAITING = "waiting for them"  # the launcher's line once it has started the ranks (waiting.py)


@pytest.mark.parametrize("signum,status,answer", [
    (signal.SIGINT, 130, "shard-train: interrupted (Ctrl-C / SIGINT) before it finished"),
    (signal.SIGTERM, 143, "shard-train: terminated by SIGTERM before it finished"),
], ids=["SIGINT", "SIGTERM"])
@pytest.mark.slow
def test_a_signal_while_the_ranks_start_is_answered_as_that_signal(signum, status, answer, tmp_path):
    data = make_space_data_bin(str(tmp_path), train_tokens=2000, valid_tokens=200)
    proc = subprocess.Popen(
        [sys.executable, "-m", "shardtrain.cli.train", data, *tiny_model_flags(), "--max-update", "5", "--cpu",
         "--distributed-world-size", "2", "--save-dir", str(tmp_path / "ck")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        before = []
        for line in proc.stderr:  # the ranks were started a moment ago: they are importing torch
            before.append(line)
            if WAITING in line:
                break
        assert WAITING in before[-1], "".join(before)[-3000:]
        proc.send_signal(signum)  # to the launcher only
        out, err = proc.communicate(timeout=scaled(120))
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == status, err[-3000:]
    answers = [line for line in err.splitlines() if line.startswith("shard-train:")]
    assert answers == [f"{answer}; {STOPPED_AT_ONCE}."], err[-3000:]  # one line, and only that
    assert "killed by signal" not in err and "Traceback" not in err and FIRST_CTRL_C not in err, err[-3000:]
    assert not (tmp_path / "ck" / "checkpoint_last.pt").exists()
    assert group_gone(proc.pid, 20)  # no rank left behind


class _Sleeper:
    """A started rank as torch.multiprocessing gives it (a real process that would never end by itself)."""

    def __init__(self):
        self.popen = subprocess.Popen(["sleep", "600"])
        self.pid, self.sentinel = self.popen.pid, None

    @property
    def exitcode(self):
        return self.popen.poll()

    def is_alive(self):
        return self.popen.poll() is None

    def terminate(self):
        self.popen.terminate()

    def kill(self):
        self.popen.kill()

    def join(self, timeout=None):
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            pass


def _cfg(tmp_path, ranks: int):
    return parse_train_args([str(tmp_path), "--batch-size", "1", "--cpu", "--save-dir", str(tmp_path),
                             "--distributed-world-size", str(ranks)])


@pytest.mark.slow
def test_a_ctrl_c_while_the_ranks_are_being_started_is_kept_and_stops_them(tmp_path, monkeypatch, capfd):
    """The launcher's handlers are in place before the first rank starts: a Ctrl-C that comes while
    torch.multiprocessing is still starting them is answered once they exist, not lost nor left to kill them."""
    started = []

    class Context:
        error_files = []

    def start_processes(fn, args, nprocs, join, start_method):
        os.kill(os.getpid(), signal.SIGINT)  # during the start: no rank to stop yet
        started.extend(_Sleeper() for _ in range(nprocs))
        Context.processes = started
        return Context

    monkeypatch.setattr(start.mp, "start_processes", start_processes)
    with pytest.raises(KeyboardInterrupt):  # the command's answer: one line, exit 130 (cli/errors.py)
        start.call_main(_cfg(tmp_path, 2), main=None)
    assert [p.exitcode for p in started] == [-signal.SIGTERM, -signal.SIGTERM]
    assert FIRST_CTRL_C not in capfd.readouterr().err  # nothing is finished nor saved while they start


class _NotStarted(Exception):
    pass


@pytest.mark.parametrize("ranks,warned", [(64, True), (5, True), (4, False)])
def test_cpu_ranks_far_beyond_the_cores_are_warned_before_any_starts(ranks, warned, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(threads, "usable_cores", lambda: 2)

    def start_processes(*args, **kwargs):
        raise _NotStarted()

    monkeypatch.setattr(start.mp, "start_processes", start_processes)
    with pytest.raises(_NotStarted):
        start.call_main(_cfg(tmp_path, ranks), main=None)
    err = capsys.readouterr().err
    assert (f"starting {ranks} CPU ranks on 2 usable cores" in err) == warned, err
    if ranks == 64:
        assert "(32 per core)" in err and "pass --distributed-world-size 2 (one rank per core) or less" in err
        assert err.count("\n") == 1 and " | WARNING | " in err  # one line, before a single rank started


def test_the_oversubscription_rule():
    assert threads.oversubscription_warning(2, 1) is None  # two ranks on one core: the usual CI test
    assert threads.oversubscription_warning(3, 1).startswith("starting 3 CPU ranks on 1 usable core (3 per core)")
    assert threads.oversubscription_warning(16, 8) is None
    assert threads.oversubscription_warning(17, 8) is not None
