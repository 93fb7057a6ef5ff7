"""call_main with real processes: 2 gloo ranks spawned on the CPU, and the single-rank path."""
import json
import logging
import os
import tempfile
import time

import pytest
import torch.distributed as dist

import launch_mains
from shardtrain.config.run_config import parse_train_args
from shardtrain.core.errors import CollectiveTimeoutError, DataError, ShardtrainError
from shardtrain.trainer.launch.start import RankFailedError, call_main
from st_testutils import scaled


def _cfg(save_dir, *flags):
    return parse_train_args([str(save_dir), "--batch-size", "1", "--cpu", "--save-dir", str(save_dir), *flags])


def _seen(save_dir, rank):
    with open(os.path.join(save_dir, f"rank{rank}.json")) as f:
        return json.load(f)


def _assert_gone(pid):
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


@pytest.mark.slow
def test_two_spawned_ranks_share_one_group_and_rank0_result_comes_back(tmp_path, monkeypatch):
    spawn_tmp = tmp_path / "tmp"
    spawn_tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(spawn_tmp))  # where the rendezvous dir goes
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)  # an explicit setting would win over the split
    env_before = dict(os.environ)

    result = call_main(_cfg(tmp_path, "--distributed-world-size", "2"), launch_mains.main_all_reduce)

    assert result == {"from_rank": 0, "value": 0.5}
    for rank in (0, 1):
        seen = _seen(tmp_path, rank)
        assert seen["pid"] != os.getpid()
        assert (seen["rank"], seen["local_rank"], seen["world_size"]) == (rank, rank, 2)
        assert (seen["dist_rank"], seen["dist_world_size"]) == (rank, 2)
        assert seen["backend"] == seen["dist_backend"] == "gloo"
        assert seen["device"] == "cpu"
        assert seen["is_master"] == (rank == 0)
        assert seen["rank_sum"] == 1.0
        assert seen["root_log_level"] == (logging.INFO if rank == 0 else logging.WARNING)
        assert seen["threads"] == max(1, len(os.sched_getaffinity(0)) // 2)
        _assert_gone(seen["pid"])
    # the rendezvous directory was removed; what is left is multiprocessing's own folder for the forkserver's socket
    # (CPU ranks are forked from it: start_method.py), which it removes when this process exits
    assert [name for name in os.listdir(spawn_tmp) if not name.startswith("pymp-")] == []
    assert dict(os.environ) == env_before
    assert not dist.is_initialized()


def test_world_size_one_runs_in_this_process_without_a_group(tmp_path):
    result = call_main(_cfg(tmp_path), launch_mains.main_in_process)
    assert result == "ran-in-process"
    seen = _seen(tmp_path, 0)
    assert seen["pid"] == os.getpid()
    assert seen["group_initialized"] is False
    assert (seen["rank"], seen["world_size"], seen["backend"], seen["device"]) == (0, 1, None, "cpu")
    assert not dist.is_initialized()


def test_launcher_world_size_one_runs_in_this_process_without_a_group(tmp_path, monkeypatch):
    for name, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "localhost",
                        "MASTER_PORT": "1"}.items():
        monkeypatch.setenv(name, value)
    assert call_main(_cfg(tmp_path), launch_mains.main_in_process) == "ran-in-process"
    assert _seen(tmp_path, 0)["group_initialized"] is False


@pytest.mark.slow
def test_user_error_on_rank1_is_reraised_with_its_rank_promptly(tmp_path):
    start = time.monotonic()
    with pytest.raises(ShardtrainError) as info:
        call_main(_cfg(tmp_path, "--distributed-world-size", "2", "--heartbeat-timeout", "20"),
                  launch_mains.main_user_error_on_rank1)
    assert time.monotonic() - start < scaled(30)
    assert isinstance(info.value, DataError)  # the child's own class survives
    assert str(info.value) == "rank 1: the shard train.bin is truncated; re-run shard-preprocess"
    _assert_gone(_seen(tmp_path, 0)["pid"])  # rank 0 was stuck in a barrier: it was stopped


@pytest.mark.slow
def test_bug_on_rank1_keeps_its_traceback(tmp_path):
    start = time.monotonic()
    with pytest.raises(RankFailedError) as info:
        call_main(_cfg(tmp_path, "--distributed-world-size", "2", "--heartbeat-timeout", "20"),
                  launch_mains.main_bug_on_rank1)
    assert time.monotonic() - start < scaled(30)
    assert not isinstance(info.value, ShardtrainError)
    assert info.value.rank == 1
    message = str(info.value)
    assert message.startswith("rank 1 failed")
    assert "KeyError: 'no_such_key_in_rank1'" in message and "main_bug_on_rank1" in message
    _assert_gone(_seen(tmp_path, 0)["pid"])


@pytest.mark.slow
def test_rank_dying_without_exception_is_named_promptly(tmp_path):
    start = time.monotonic()
    with pytest.raises(ShardtrainError) as info:
        call_main(_cfg(tmp_path, "--distributed-world-size", "2", "--heartbeat-timeout", "20"),
                  launch_mains.main_exit_on_rank1)
    assert time.monotonic() - start < scaled(60)
    message = str(info.value)
    assert message.startswith(f"rank 1 (pid {_seen(tmp_path, 1)['pid']}) stopped without raising an exception")
    assert "exit code 3" in message
    _assert_gone(_seen(tmp_path, 0)["pid"])


@pytest.mark.slow
def test_heartbeat_timeout_reaches_the_process_group(tmp_path):
    # The timeout also bounds the ranks' connection at start-up: on a loaded machine one rank may
    # start seconds after the other, so the timeout under test grows with the load (2 s when idle).
    heartbeat = max(2, round(scaled(2)))
    with pytest.raises(CollectiveTimeoutError) as info:
        call_main(_cfg(tmp_path, "--distributed-world-size", "2", "--heartbeat-timeout", str(heartbeat)),
                  launch_mains.main_stall_on_rank1)
    waited = time.time() - _seen(tmp_path, 0)["barrier_at"]
    # from rank 0 entering the barrier: the timeout, then the error's way back (the 1800 s default would hang)
    assert heartbeat <= waited < heartbeat + scaled(20), waited
    # a user-facing paragraph (no traceback) naming the rank that gave up and the flag
    assert str(info.value).startswith(
        f"rank 0: A collective operation waited more than {heartbeat} s (--heartbeat-timeout)")
    _assert_gone(_seen(tmp_path, 1)["pid"])
