"""Ctrl-C (issue 31, item 6): the first finishes the update, saves checkpoint_last and says so; a second stops at
once. Real shard-train processes (2 gloo ranks spawned by the launcher, or 1 process) in a session of their own,
so that a signal to the group is what a terminal's Ctrl-C sends (launcher and ranks alike)."""
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from shardtrain.trainer.launch.preemption import FIRST_CTRL_C, STOPPED_AT_ONCE
from st_testutils import group_gone, last_checkpoint_state, make_space_data_bin, scaled


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return make_space_data_bin(str(tmp_path_factory.mktemp("ctrl_c")), train_tokens=20000, valid_tokens=200)


def start(data, save, ranks):
    command = [sys.executable, "-m", "shardtrain.cli.train", data, "--arch", "transformer_lm", "--decoder-layers",
               "2", "--decoder-embed-dim", "32", "--decoder-ffn-embed-dim", "64", "--decoder-attention-heads", "2",
               "--tokens-per-sample", "32", "--batch-size", "4", "--disable-validation", "--max-update", "100000",
               "--cpu", "--threads", "1", "--log-format", "json", "--log-interval", "1", "--save-dir", str(save),
               "--distributed-world-size", str(ranks), "--ddp-backend", "fully_sharded" if ranks > 1 else "c10d"]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    deadline = time.time() + scaled(60)
    for line in proc.stdout:  # wait until training is under way
        if '"num_updates": "3"' in line or time.time() > deadline:
            break
    return proc


@pytest.mark.slow
@pytest.mark.parametrize("ranks,to", [(2, "group"), (2, "launcher"), (1, "group")])
def test_the_first_ctrl_c_finishes_the_update_and_saves(ranks, to, data, tmp_path):
    """``group``: a terminal's Ctrl-C, which every process gets; ``launcher``: only the launcher gets it."""
    proc = start(data, tmp_path / "ck", ranks)
    (os.killpg if to == "group" else os.kill)(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=scaled(60))
    assert proc.returncode == 0, err[-3000:]
    assert FIRST_CTRL_C in err  # said at once, by the launcher or the one process
    stopped = re.search(r"stopping training at update (\d+): (.*) received; saving checkpoint_last", out)
    assert stopped, out[-3000:]
    updates = int(stopped.group(1))
    assert updates >= 3 and last_checkpoint_state(tmp_path / "ck")["train_state"]["num_updates"] == updates
    why = "Ctrl-C" if to == "group" else "SIGTERM/SIGUSR1"  # the launcher passes its Ctrl-C on as SIGTERM
    assert f"stopped by {why} at update {updates} with checkpoint_last saved: the same command resumes" in out
    assert "redo it" not in out + err
    assert group_gone(proc.pid, 10)


@pytest.mark.slow
def test_a_second_ctrl_c_stops_at_once(data, tmp_path):
    proc = start(data, tmp_path / "ck", 2)
    os.killpg(proc.pid, signal.SIGINT)
    time.sleep(0.3)  # a person's second press
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=scaled(30))
    assert proc.returncode == 128 + signal.SIGINT, err[-3000:]
    assert f"shard-train: interrupted (Ctrl-C / SIGINT) before it finished; {STOPPED_AT_ONCE}." in err
    assert "redo it" not in err and "Traceback" not in err, err[-3000:]
    assert group_gone(proc.pid, 10)  # no rank left behind


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


def test_the_last_line_says_what_was_saved():
    from shardtrain.trainer.launch.preemption import stopped_message

    assert stopped_message(True, 7, False, "ck") == ("stopped by Ctrl-C at update 7 with checkpoint_last saved: the "
                                                     "same command resumes from it (in --save-dir ck)")
    assert stopped_message(False, 7, True, "ck") == "stopped by SIGTERM/SIGUSR1 at update 7; nothing was saved (--no-save)"
