"""Ctrl-C (issue 31, item 6): the first finishes the update, saves checkpoint_last and says so; a second stops at
once. Real shard-train processes (2 gloo ranks spawned by the launcher, or 1 process) in a session of their own,
so that a signal to the group is what a terminal's Ctrl-C sends (launcher and ranks alike)."""
import contextlib
import functools
import os
import re
import signal
import time

import pytest

from shardtrain.trainer.launch.preemption import FIRST_CTRL_C, STOPPED_AT_ONCE
from side_by_side import Budget, finish, run_side_by_side, start_under_way, train_command
from st_testutils import group_gone, last_checkpoint_state, make_space_data_bin, spawned_ranks

# (ranks, who gets the first Ctrl-C). "late": the launcher, then each rank its own copy after the launcher's
# pass-on reached it: the order in which a terminal's Ctrl-C once made a rank stop at once under load (its own
# SIGINT after the pass-on read as a second press), forced here.
FIRST = [(2, "group"), (2, "launcher"), (2, "late"), (1, "group")]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Every case's run, side by side (tests/side_by_side.py): {name: Outcome of (proc, out, err, save, gone)}."""
    root = tmp_path_factory.mktemp("ctrl_c")
    data = make_space_data_bin(str(root), train_tokens=20000, valid_tokens=200)
    cases = {f"first-{ranks}-{to}": functools.partial(first_ctrl_c, data, root / f"{ranks}-{to}", ranks, to)
             for ranks, to in FIRST}
    cases["second"] = functools.partial(second_ctrl_c, data, root / "second")
    budget = Budget(len(cases))
    return run_side_by_side({name: functools.partial(case, budget) for name, case in cases.items()})


def start(data, save, ranks, budget):
    # in a session of its own: a signal to the group is what a terminal's Ctrl-C sends
    return start_under_way(train_command(data, save, ranks), budget, start_new_session=True)


def first_ctrl_c(data, save, ranks, to, budget):
    proc = start(data, save, ranks, budget)
    ranks_pids = spawned_ranks(proc.pid)
    (os.killpg if to == "group" else os.kill)(proc.pid, signal.SIGINT)
    if to == "late":
        time.sleep(0.2)  # the launcher's pass-on is handled in each rank by now; the stop and save still run
        reached = 0
        for pid in ranks_pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGINT)
                reached += 1
        assert reached, f"every rank of {ranks_pids} had ended 0.2 s after the Ctrl-C: the late copy tests nothing"
    out, err = finish(proc, budget(60))
    return proc, out, err, save, group_gone(proc.pid, 10 * budget.sharing)


def second_ctrl_c(data, save, budget):
    proc = start(data, save, 2, budget)
    os.killpg(proc.pid, signal.SIGINT)
    time.sleep(0.3)  # a person's second press
    os.killpg(proc.pid, signal.SIGINT)
    out, err = finish(proc, budget(30))
    return proc, out, err, save, group_gone(proc.pid, 10 * budget.sharing)


@pytest.mark.slow
@pytest.mark.parametrize("ranks,to", FIRST)
def test_the_first_ctrl_c_finishes_the_update_and_saves(ranks, to, runs):
    """``group``: a terminal's Ctrl-C, which every process gets; ``launcher``: only the launcher gets it; ``late``:
    the ranks' own copies come after the launcher's pass-on."""
    proc, out, err, save, gone = runs[f"first-{ranks}-{to}"].get()
    assert proc.returncode == 0, err[-3000:]
    assert FIRST_CTRL_C in err  # said at once, by the launcher or the one process
    stopped = re.search(r"stopping training at update (\d+): (.*) received; saving checkpoint_last", out)
    assert stopped, out[-3000:]
    updates = int(stopped.group(1))
    assert updates >= 3 and last_checkpoint_state(save)["train_state"]["num_updates"] == updates
    assert f"stopped by Ctrl-C at update {updates} with checkpoint_last saved: the same command resumes" in out
    assert "redo it" not in out + err
    assert gone


@pytest.mark.slow
def test_a_second_ctrl_c_stops_at_once(runs):
    proc, out, err, save, gone = runs["second"].get()
    assert proc.returncode == 128 + signal.SIGINT, err[-3000:]
    assert f"shard-train: interrupted (Ctrl-C / SIGINT) before it finished; {STOPPED_AT_ONCE}." in err
    assert "redo it" not in err and "Traceback" not in err, err[-3000:]
    assert gone  # no rank left behind


def test_the_watcher_stops_at_once_on_a_second_ctrl_c_and_once_only(capfd):
    """Decided without processes: the first SIGINT asks for a stop (and says so when it announces), the
    second raises KeyboardInterrupt at once, a third (the launcher passing on the second) is ignored."""
    from shardtrain.trainer.launch.preemption import PreemptionWatcher

    watcher = PreemptionWatcher(announce=True)
    try:
        os.kill(os.getpid(), signal.SIGINT)
        assert watcher.requested and FIRST_CTRL_C in capfd.readouterr().err
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGINT)  # no KeyboardInterrupt during the clean-up the first one started
    finally:
        watcher.close()
    with pytest.raises(KeyboardInterrupt):  # closed: Python's own Ctrl-C again
        os.kill(os.getpid(), signal.SIGINT)


def test_a_spawned_ranks_watcher_counts_its_launchers_presses_never_its_own(capfd, monkeypatch):
    """A rank of shard-train's launcher: its own SIGINT, before or after the launcher's pass-on of the same press,
    changes nothing; the first press passed on stops after the update (as a Ctrl-C), the second at once, a third
    is ignored. Once its parent has ended, its own SIGINT (torch's parent-death signal) is a Ctrl-C again."""
    from shardtrain.trainer.launch.preemption import PASSED_ON, PreemptionWatcher

    assert PASSED_ON == signal.SIGUSR2  # docs/checkpoints.md names it
    watcher = PreemptionWatcher(led=True)
    try:
        os.kill(os.getpid(), signal.SIGINT)  # a terminal's Ctrl-C, reaching the rank before the pass-on
        assert not watcher.requested
        os.kill(os.getpid(), PASSED_ON)
        assert watcher.requested and watcher.received == {signal.SIGINT}
        assert FIRST_CTRL_C not in capfd.readouterr().err  # the launcher says it
        os.kill(os.getpid(), signal.SIGINT)  # the same press's own copy, after the pass-on: not a second press
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), PASSED_ON)  # the second press
        os.kill(os.getpid(), PASSED_ON)  # a third, during the clean-up: ignored
    finally:
        watcher.close()
    assert signal.getsignal(PASSED_ON) is signal.SIG_DFL

    orphan = PreemptionWatcher(led=True)
    try:
        monkeypatch.setattr(os, "getppid", lambda: 1)  # the parent ended: this process was handed to init
        os.kill(os.getpid(), signal.SIGINT)
        assert orphan.requested and orphan.received == {signal.SIGINT}
    finally:
        orphan.close()


def test_the_launcher_passes_every_press_on_to_its_ranks(capfd):
    """The launcher's side (forwarding_signals): each Ctrl-C reaches every live rank as PASSED_ON, the first is
    announced, the second ends the launcher's wait (KeyboardInterrupt)."""
    from shardtrain.trainer.launch.preemption import PASSED_ON, forwarding_signals

    class Rank:  # this process stands in for the rank; a dead one is passed over
        def __init__(self, alive):
            self.pid, self.alive = os.getpid(), alive

        def is_alive(self):
            return self.alive

    got = []
    previous = signal.signal(PASSED_ON, lambda signum, frame: got.append(signum))
    try:
        with forwarding_signals([Rank(True), Rank(False)]):
            os.kill(os.getpid(), signal.SIGINT)
            assert got == [PASSED_ON] and FIRST_CTRL_C in capfd.readouterr().err
            with pytest.raises(KeyboardInterrupt):
                os.kill(os.getpid(), signal.SIGINT)
            assert got == [PASSED_ON, PASSED_ON]
    finally:
        signal.signal(PASSED_ON, previous)


def test_the_last_line_says_what_was_saved():
    from shardtrain.trainer.launch.preemption import stopped_message

    assert stopped_message(True, 7, False, "ck") == ("stopped by Ctrl-C at update 7 with checkpoint_last saved: the "
                                                     "same command resumes from it (in --save-dir ck)")
    assert stopped_message(False, 7, True, "ck") == "stopped by SIGTERM/SIGUSR1 at update 7; nothing was saved (--no-save)"
