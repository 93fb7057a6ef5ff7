"""Scenarios 6 and 7 of the GPU acceptance suite: checkpoints written on GPUs are used where
fewer (or no) GPUs are visible, and a hung rank on NCCL ends the job with shardtrain's message.
"""
import os
import re
import subprocess
import sys

import pytest
import torch

import gpu_runs
from conftest import needs_gpus
from exact_resume import differences, flat
from shardtrain.trainer.checkpoint.consolidate import read_sharded

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "trainer", "checkpoint"))
from test_faults import stop_rank_1  # noqa: E402

HEARTBEAT_TIMEOUT_S = 30


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return gpu_runs.data_bin(tmp_path_factory.mktemp("gpu-faults"))


def _env(**changes):
    env = dict(os.environ)
    env.update(changes)
    return env


@needs_gpus(2)
def test_ddp_checkpoint_from_two_gpus_resumes_on_one(data, tmp_path):
    save = tmp_path / "ck"
    gpu_runs.train(data, save, "--distributed-world-size", "2", "--max-update", "4", "--save-interval-updates", "2")
    argv = [sys.executable, "-m", "shardtrain.cli.train", data, *gpu_runs.MODEL, "--save-dir", str(save),
            "--max-update", "6", "--log-format", "json", "--log-interval", "1"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600, env=_env(CUDA_VISIBLE_DEVICES="0"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert '"num_updates": "6"' in done.stdout
    assert "re-seeded" in done.stdout + done.stderr  # 2 ranks' RNG states, 1 rank now: said, not an IndexError


@needs_gpus(1)
def test_consolidate_a_gpu_checkpoint_without_gpus(data, tmp_path):
    save = tmp_path / "ck"
    gpu_runs.train(data, save, "--ddp-backend", "fully_sharded", "--distributed-world-size", "1", "--max-update", "2")
    out = tmp_path / "consolidated.pt"
    done = subprocess.run([sys.executable, "-m", "shardtrain.cli.consolidate", str(save / "checkpoint_last"), str(out)],
                          capture_output=True, text=True, timeout=600, env=_env(CUDA_VISIBLE_DEVICES=""))
    assert done.returncode == 0, done.stderr[-3000:]
    # No map_location: each tensor comes back on the device the file records, and this process sees a
    # GPU, so a tensor saved from cuda would load onto it. The file must load on a GPU-less machine.
    state = torch.load(out, weights_only=True)
    written = {k: v for k, v in flat({"model": state["model"], "optimizer": state["optimizer"]})
               if torch.is_tensor(v)}
    assert len(written) > len(state["model"]), sorted(written)[:10]  # the optimizer's moments too
    on = {k: t.device.type for k, t in written.items() if t.device.type != "cpu"}
    assert on == {}, f"the consolidated file records tensors on {on}"
    # ... and they are the GPU run's values (read from its shards here, onto the CPU)
    source = dict(flat({k: v for k, v in read_sharded(str(save / "checkpoint_last"), model_only=False).items()
                        if k in ("model", "optimizer")}))
    assert differences(dict(flat({"model": state["model"], "optimizer": state["optimizer"]})), source) == []


@needs_gpus(2)
def test_hung_rank_on_nccl_ends_the_job_naming_the_timeout(data, tmp_path):
    argv = [sys.executable, "-m", "shardtrain.cli.train", data, *gpu_runs.MODEL, "--save-dir", str(tmp_path / "ck"),
            "--distributed-world-size", "2", "--ddp-backend", "fully_sharded", "--max-update", "100000",
            "--disable-validation", "--log-format", "json", "--log-interval", "1",
            "--heartbeat-timeout", str(HEARTBEAT_TIMEOUT_S)]
    returncode, err, elapsed, left_behind = stop_rank_1(argv, tmp_path / "stderr.txt", reach_s=300,
                                                        end_s=2 * HEARTBEAT_TIMEOUT_S + 60)
    assert returncode == 2, err[-3000:]
    assert elapsed < 2 * HEARTBEAT_TIMEOUT_S + 60, elapsed
    assert not left_behind
    assert re.search(r"--heartbeat-timeout", err), err[-3000:]  # named, whether Python saw it or NCCL aborted
    assert "out of memory" not in err, err[-3000:]
