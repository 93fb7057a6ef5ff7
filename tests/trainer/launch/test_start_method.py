"""CPU ranks are forked from a forkserver that this launch starts and stops (start_method.py); CUDA ranks, or ranks
beside a forkserver someone else runs, are spawned. Two launches from one process, with real ranks: the second's
ranks have the launcher's environment and stdout of that moment, not the first's."""
import contextlib
import json
import multiprocessing
import multiprocessing.forkserver
import os
import signal
import subprocess
import sys
import time

import pytest

import launch_mains
from shardtrain.config.run_config import parse_train_args
from shardtrain.trainer.launch import start_method
from shardtrain.trainer.launch.start import call_main
from shardtrain.trainer.launch.waiting import StartWatch
from st_testutils import (forkserver_children, group_gone, make_space_data_bin, scaled, spawned_ranks,
                          tiny_model_flags)


def _seen(save_dir, rank):
    with open(os.path.join(save_dir, f"rank{rank}.json")) as f:
        return json.load(f)


def _server_pid():
    return multiprocessing.forkserver._forkserver._forkserver_pid


@pytest.mark.slow
def test_two_launches_fork_their_ranks_from_their_own_server_with_the_environment_of_the_moment(
        tmp_path, monkeypatch, capfd):
    assert _server_pid() is None, "a forkserver left running by an earlier test in this pytest worker"
    for mark in ("first", "second"):
        save = tmp_path / mark
        save.mkdir()
        monkeypatch.setenv("ST_LAUNCH_MARK", mark)
        call_main(parse_train_args([str(save), "--cpu", "--save-dir", str(save), "--distributed-world-size", "2"]),
                  launch_mains.main_where_started)
        out, err = capfd.readouterr()
        assert "one process imports torch and the ranks are forked from it" in err, err
        for rank in (0, 1):
            seen = _seen(save, rank)
            assert seen["ppid"] != os.getpid(), seen  # forked by the server, not this process
            assert "multiprocessing.forkserver" in seen["parent"], seen
            assert seen["mark"] == mark, seen
            assert f"rank {rank} says {mark}" in out, out
        assert _seen(save, 0)["ppid"] == _seen(save, 1)["ppid"]
        assert _server_pid() is None  # stopped with its ranks
        assert not os.path.exists(f"/proc/{_seen(save, 0)['ppid']}")  # and reaped


def _main():
    pass


@pytest.mark.slow
def test_a_test_modules_own_server_is_stopped_so_later_launches_in_its_worker_still_fork():
    """CI on 3a0a864: the checkpoint-kill modules' forkserver outlived them, and every later launch in that pytest
    worker spawned its ranks (rank_start leaves a server it did not start alone): three tests here failed."""
    with forkserver_children([]) as children:
        child = children.Process(target=os.getpid)
        child.start()
        child.join(scaled(60))
        assert child.exitcode == 0 and _server_pid() is not None
    assert _server_pid() is None
    with start_method.rank_start(False, _main) as method:
        assert method == "forkserver"


def test_cuda_ranks_are_spawned():
    with start_method.rank_start(True, _main) as method:
        assert method == "spawn"
    assert _server_pid() is None


def test_cpu_ranks_get_a_server_that_preloads_torch_and_mains_module_and_is_stopped_after(monkeypatch):
    asked = []
    monkeypatch.setattr(multiprocessing, "set_forkserver_preload", asked.append)
    stopped = []
    monkeypatch.setattr(multiprocessing.forkserver._forkserver, "_stop", lambda: stopped.append(True))
    with start_method.rank_start(False, launch_mains.main_all_reduce) as method:
        assert method == "forkserver" and not stopped
    assert stopped == [True]
    assert asked == [["torch", "shardtrain.trainer.launch.start", "launch_mains"]]


def test_a_server_someone_else_runs_is_left_alone_and_the_ranks_are_spawned(monkeypatch):
    monkeypatch.setattr(multiprocessing.forkserver._forkserver, "_forkserver_pid", 12345)
    monkeypatch.setattr(multiprocessing.forkserver._forkserver, "_stop", lambda: pytest.fail("stopped theirs"))
    with start_method.rank_start(False, _main) as method:
        assert method == "spawn"


def test_a_python_without_a_way_to_stop_the_server_spawns(monkeypatch):
    monkeypatch.delattr(multiprocessing.forkserver.ForkServer, "_stop")
    with start_method.rank_start(False, _main) as method:
        assert method == "spawn"


def test_the_start_line_says_how_the_ranks_start(tmp_path):
    import io

    lines = {}
    for forked in (False, True):
        out = io.StringIO()
        StartWatch(str(tmp_path), 2, "gloo", stream=out, forked=forked).begin("file:///x")
        lines[forked] = out.getvalue().split(" | ", 3)[3].strip()
    assert lines[True] == ("starting 2 ranks on this machine (gloo): one process imports torch and the ranks are "
                           "forked from it, then they meet through a file in a temporary directory; waiting for them")
    assert lines[False].startswith("starting 2 ranks on this machine (gloo): each process imports torch, then")


@pytest.mark.slow
def test_ranks_end_when_their_launcher_is_killed(tmp_path):
    """SIGKILL (the OOM killer, kill -9) to shard-train mid-training: its server ends with it, and the ranks get
    their parent-death SIGINT and stop, as spawned ranks do. Before the ranks let go of the server's liveness pipe,
    they trained on without a launcher."""
    data = make_space_data_bin(str(tmp_path))
    command = [sys.executable, "-m", "shardtrain.cli.train", data, *tiny_model_flags(), "--max-update", "100000",
               "--cpu", "--threads", "1", "--log-format", "json", "--log-interval", "1", "--disable-validation",
               "--save-dir", str(tmp_path / "ck"), "--distributed-world-size", "2", "--ddp-backend", "fully_sharded"]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + scaled(120)
        for line in proc.stdout:
            if '"num_updates": "3"' in line or time.monotonic() > deadline:
                break
        ranks = spawned_ranks(proc.pid)
        assert len(ranks) == 2, ranks
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        assert group_gone(proc.pid, 60), [p for p in ranks if os.path.exists(f"/proc/{p}")]
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.stdout.close()
