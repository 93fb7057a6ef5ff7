"""Warm ranks (tests/helpers/warm_ranks.py) keep call_main's contract while reusing their processes."""
import os

import pytest

import warm_mains
from shardtrain.config.run_config import parse_train_args
from shardtrain.core.errors import DataError
from shardtrain.trainer.launch.start import call_main

pytestmark = pytest.mark.slow  # ranks in processes of their own


def _cfg(save_dir, *flags):
    return parse_train_args([str(save_dir), "--batch-size", "1", "--cpu", "--save-dir", str(save_dir),
                             "--distributed-world-size", "2", *flags])


def test_jobs_reuse_the_ranks_and_see_the_tests_surroundings_not_the_last_jobs(tmp_path, monkeypatch, warm_ranks):
    monkeypatch.setenv("WARM_RANKS_PROBE", "first")
    monkeypatch.chdir(tmp_path)
    spawns = warm_ranks.spawns
    first = call_main(_cfg(tmp_path), warm_mains.main_report)
    monkeypatch.setenv("WARM_RANKS_PROBE", "second")
    second = call_main(_cfg(tmp_path), warm_mains.main_report)
    assert [r["sum"] for r in first + second] == [3.0] * 4  # 1 + 2, through a real gloo group each time
    assert [r["world"] for r in first] == [2, 2]
    assert [r["probe"] for r in first] == ["first"] * 2 and [r["probe"] for r in second] == ["second"] * 2
    assert {r["cwd"] for r in first} == {str(tmp_path)}
    pids = [r["pid"] for r in first]
    assert [r["pid"] for r in second] == pids and os.getpid() not in pids and len(set(pids)) == 2
    assert warm_ranks.spawns - spawns <= 2  # at most this test's first job started processes
    state = call_main(_cfg(tmp_path), warm_mains.main_state)  # rank 0's
    assert state == {"left_behind": None, "sigusr1_default": True, "pid": pids[0]}


def test_a_failed_job_raises_the_ranks_error_and_the_next_job_gets_fresh_ranks(tmp_path, warm_ranks):
    before = call_main(_cfg(tmp_path), warm_mains.main_state)["pid"]
    with pytest.raises(DataError) as info:
        call_main(_cfg(tmp_path), warm_mains.main_user_error_on_rank1)
    assert str(info.value) == "rank 1: the shard train.bin is truncated; re-run shard-preprocess"
    with pytest.raises(ProcessLookupError):  # rank 0, stuck in its barrier, was stopped
        os.kill(before, 0)
    assert call_main(_cfg(tmp_path), warm_mains.main_state)["pid"] != before
