"""Launch decisions without processes: world size, backend, timeout, device, which failure to report."""
import datetime
import os
import subprocess
import threading
import time
import types

import pytest
import torch

from shardtrain.core.errors import ConfigError, DataError, ShardtrainError
from shardtrain.trainer.launch import supervise
from shardtrain.trainer.launch.start import DistributedContext, make_context, resolve_world_size
from shardtrain.trainer.launch.supervise import RankFailedError, describe_exit
from shardtrain.trainer.launch.peer_lost import PeerLostError
from shardtrain.trainer.launch.rendezvous import as_timeout_error, process_group_timeout, resolve_backend
from st_testutils import scaled


@pytest.mark.parametrize("requested, use_cuda, gpus, expected", [
    (None, False, 0, 1), (None, True, 4, 4), (3, False, 0, 3), (2, True, 2, 2), (1, True, 8, 1),
])
def test_world_size(requested, use_cuda, gpus, expected):
    assert resolve_world_size(requested, use_cuda, gpus) == expected


def test_world_size_beyond_the_visible_gpus_is_an_error():
    with pytest.raises(ConfigError) as info:
        resolve_world_size(4, use_cuda=True, gpu_count=2)
    message = str(info.value)
    assert "--distributed-world-size 4" in message and "only 2 GPUs are visible" in message
    assert "--cpu" in message


@pytest.mark.parametrize("requested", [0, -2])
def test_world_size_below_one_is_an_error(requested):
    with pytest.raises(ConfigError, match="--distributed-world-size must be at least 1"):
        resolve_world_size(requested, use_cuda=False, gpu_count=0)


@pytest.mark.flag_effect("--distributed-backend")
def test_backend(monkeypatch):
    assert resolve_backend(None, use_cuda=False) == "gloo"
    assert resolve_backend("gloo", use_cuda=False) == "gloo"
    with pytest.raises(ConfigError, match="--distributed-backend nccl needs CUDA.*--distributed-backend gloo"):
        resolve_backend("nccl", use_cuda=False)
    monkeypatch.setattr(torch.distributed, "is_nccl_available", lambda: True)
    assert resolve_backend(None, use_cuda=True) == "nccl"
    assert resolve_backend("gloo", use_cuda=True) == "gloo"


def test_timeout():
    assert process_group_timeout(-1) == datetime.timedelta(seconds=1800)
    assert process_group_timeout(0) == datetime.timedelta(seconds=1800)
    assert process_group_timeout(20) == datetime.timedelta(seconds=20)


@pytest.mark.parametrize("message, is_timeout", [
    ("[gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 20000ms for recv operation to complete", True),
    ("[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5, OpType=ALLREDUCE) ran for "
     "600000 milliseconds before timing out.", True),
    ("[gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:1234", False),
    ("CUDA out of memory. Tried to allocate 2.00 GiB", False),
])
def test_collective_timeouts_are_named(message, is_timeout):
    error = as_timeout_error(RuntimeError(message), 45)
    assert (error is not None) == is_timeout
    if error:
        assert isinstance(error, ShardtrainError) and "more than 45 s (--heartbeat-timeout)" in str(error)
    assert as_timeout_error(ValueError(message), 45) is None


def test_context_device(monkeypatch):
    assert make_context(1, 1, 2, use_cuda=False, backend="gloo") == DistributedContext(
        1, 1, 2, torch.device("cpu"), "gloo")
    assert not make_context(1, 1, 2, use_cuda=False, backend="gloo").is_master
    assert make_context(0, 0, 1, use_cuda=False, backend=None).is_master
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert make_context(3, 1, 4, use_cuda=True, backend="nccl").device == torch.device("cuda", 1)
    with pytest.raises(ConfigError, match="Rank 2 has local rank 2, but only 2 GPU"):
        make_context(2, 2, 4, use_cuda=True, backend="nccl")


def test_describe_exit():
    assert describe_exit(0).startswith("exit code 0 before its main returned")
    assert describe_exit(-9) == "killed by signal SIGKILL"
    assert describe_exit(-11) == "killed by signal SIGSEGV"
    assert describe_exit(3).startswith("exit code 3 ")


def test_a_silent_death_names_its_likely_cause(tmp_path):
    """SIGKILL: the out-of-memory killer; SIGABRT: NCCL's watchdog after a collective timeout (on
    a GPU the hung-rank case ends this way, never as Python's CollectiveTimeoutError)."""
    def message(code):
        return str(supervise._failure(str(tmp_path), _processes(0, code), [1]))

    assert "ran out of memory" in message(-9) and "heartbeat" not in message(-9)
    aborted = message(-6)
    assert "killed by signal SIGABRT" in aborted and "--heartbeat-timeout" in aborted
    assert "out of memory" not in aborted
    assert message(-11).endswith("output above.")


def _report(run_dir, rank, error):
    try:
        raise error
    except Exception as e:  # noqa: BLE001 - report_failure records the exception being handled
        supervise.report_failure(run_dir, rank, e)
    time.sleep(0.01)  # reports are ordered by time


def _processes(*exitcodes):
    return [types.SimpleNamespace(pid=100 + i, exitcode=code) for i, code in enumerate(exitcodes)]


def test_user_error_wins_over_the_collective_error_it_caused(tmp_path):
    _report(str(tmp_path), 0, RuntimeError("gloo: connection closed by peer"))  # even when reported first
    _report(str(tmp_path), 1, DataError("bad shard"))
    error = supervise._failure(str(tmp_path), _processes(1, 1), failed=[0, 1])
    assert type(error) is DataError and str(error) == "rank 1: bad shard"


def test_silent_death_wins_over_the_collective_error_it_caused(tmp_path):
    _report(str(tmp_path), 0, RuntimeError("gloo: connection closed by peer"))
    error = supervise._failure(str(tmp_path), _processes(1, -9), failed=[0, 1])
    assert type(error) is ShardtrainError
    assert str(error).startswith("rank 1 (pid 101) stopped without raising an exception: killed by signal SIGKILL")


def test_earliest_bug_is_reported_with_its_traceback(tmp_path):
    _report(str(tmp_path), 1, KeyError("first"))
    _report(str(tmp_path), 0, RuntimeError("second"))
    error = supervise._failure(str(tmp_path), _processes(1, 1), failed=[0, 1])
    assert isinstance(error, RankFailedError) and error.rank == 1
    assert "KeyError: 'first'" in str(error) and "second" not in str(error)


class _TwoArgumentError(ShardtrainError):
    def __init__(self, path, reason):
        super().__init__(f"{path}: {reason}")


def test_user_error_with_another_constructor_falls_back_to_the_base_class(tmp_path):
    _report(str(tmp_path), 1, _TwoArgumentError("data/train.bin", "truncated"))
    error = supervise._failure(str(tmp_path), _processes(1, 1), failed=[1])
    assert type(error) is ShardtrainError and str(error) == "rank 1: data/train.bin: truncated"


def test_clean_exit_counts_only_after_main_returned(tmp_path):
    run_dir = str(tmp_path)
    for rank in (0, 1):
        supervise.atomic_write_bytes(supervise._result_path(run_dir, rank), b"")
    assert supervise._wait_until_failure_or_done(_processes(0, 0), run_dir) == []
    # rank 2 exited 0 without marking that main returned (sys.exit(0), or Ctrl-C swallowed by
    # torch.multiprocessing): a failure, or rank 0 and 1 would wait for it until the timeout
    assert supervise._wait_until_failure_or_done(_processes(0, 0, 0), run_dir) == [2]
    assert supervise._wait_until_failure_or_done(_processes(0, 3, 0), run_dir) == [1, 2]
    error = supervise._failure(run_dir, _processes(0, 0, 0), failed=[2])
    assert str(error).startswith("rank 2 (pid 102) stopped without raising an exception: exit code 0 before")


class _ExitingProcess:
    """A rank that is still running at the first look and has exited (code 1) at every later one."""

    def __init__(self, pid):
        self.pid, self.looks = pid, 0
        read_end, write_end = os.pipe()
        os.close(write_end)  # its sentinel is ready: the process is exiting
        self.sentinel = read_end

    @property
    def exitcode(self):
        self.looks += 1
        return None if self.looks == 1 else 1

    def join(self, timeout=None):
        pass


def test_a_rank_exiting_while_we_look_is_not_missed(tmp_path):
    exiting = _ExitingProcess(pid=100)
    read_end, write_end = os.pipe()  # the other rank: running until released
    blocked = types.SimpleNamespace(pid=101, exitcode=None, sentinel=read_end, join=lambda timeout=None: None)
    lock, open_ends = threading.Lock(), [write_end]

    def release():  # ends the wait if the exiting rank was missed, so the test fails instead of hanging
        with lock:
            while open_ends:
                os.close(open_ends.pop())

    timer = threading.Timer(10.0, release)
    timer.start()
    try:
        start = time.monotonic()
        assert supervise._wait_until_failure_or_done([exiting, blocked], str(tmp_path)) == [0]
        assert time.monotonic() - start < 5  # not stuck waiting for the healthy rank
    finally:
        timer.cancel()
        release()
        os.close(exiting.sentinel)
        os.close(read_end)


LOST = "Rank 0 of 2 lost its connection to another rank in a collective"


def test_a_lost_peer_is_never_blamed_over_the_rank_that_stopped(tmp_path):
    """Issue 37 item 6: a rank that fails first (a bug, a timeout, a kill) made the other lose its peer; the
    lost peer is a user error (no traceback), and was chosen over the bug's traceback and the silent death."""
    bug, killed = str(tmp_path / "bug"), str(tmp_path / "killed")
    for run_dir in (bug, killed):
        os.makedirs(run_dir)
        _report(run_dir, 0, PeerLostError(LOST))  # reported first, as a loaded machine may order them
    _report(bug, 1, KeyError("the cause"))
    error = supervise._failure(bug, _processes(2, 1), failed=[0, 1])
    assert isinstance(error, supervise.RankFailedError) and error.rank == 1 and "KeyError: 'the cause'" in str(error)
    assert str(supervise._failure(killed, _processes(2, -9), failed=[0, 1])).startswith(
        "rank 1 (pid 101) stopped without raising an exception: killed by signal SIGKILL")
    alone = supervise._failure(killed, _processes(2, None), failed=[0])  # nothing else known: the lost peer it is
    assert isinstance(alone, PeerLostError) and str(alone) == f"rank 0: {LOST}"


@pytest.mark.slow
def test_a_lost_peer_waits_a_moment_for_the_rank_that_stopped(tmp_path):
    run_dir = str(tmp_path)
    _report(run_dir, 0, PeerLostError(LOST))
    dying = subprocess.Popen(["sh", "-c", "sleep 1; kill -9 $$"])  # the cause, still on its way out
    sentinel = os.pidfd_open(dying.pid)  # readable once it has ended, as a process's sentinel
    try:
        processes = [types.SimpleNamespace(pid=1, exitcode=2), _Polled(dying, sentinel)]
        assert supervise._after_lost_peers(processes, run_dir, [0], grace_s=scaled(30)) == [0, 1]
        assert str(supervise._failure(run_dir, processes, [0, 1])).startswith(f"rank 1 (pid {dying.pid}) stopped "
                                                                           "without raising an exception")
    finally:
        os.close(sentinel)
        dying.wait()


class _Polled:
    def __init__(self, popen, sentinel):
        self.popen, self.pid, self.sentinel = popen, popen.pid, sentinel

    @property
    def exitcode(self):
        return self.popen.poll()

    def join(self, timeout=None):
        self.popen.poll()
