"""Scenario 8: ``--cpu`` on a GPU machine trains on the CPU and never creates a CUDA
context, even with --ddp-backend fully_sharded --cpu-offload (whose shards were once
pinned whenever a GPU was visible) and its sharded checkpoints, written in the
foreground or in the background (DCP's writer once asked for the current CUDA stream
whenever CUDA was available). And on 2 GPUs, no rank opens a context on another
rank's device (an --async-save's writer thread once synchronized device 0 from every
rank). tests/trainer/parallel/test_fsdp_offload_device.py and test_checkpoint_cuda_free.py
test the same on a CPU machine."""
import json
import os
import subprocess
import sys

import pytest

import gpu_runs
from conftest import needs_gpus

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))


def _train_and_report(tmp_path, *flags):
    """Train 4 updates on 2 ranks, saving sharded checkpoints at updates 2 and 4; -> {who: report}."""
    save_dir = tmp_path / "ckpt"
    argv = [gpu_runs.data_bin(tmp_path / "data"), *gpu_runs.MODEL, "--save-dir", str(save_dir),
            "--ddp-backend", "fully_sharded", "--distributed-world-size", "2", "--max-update", "4",
            "--validate-interval-updates", "2", "--save-interval-updates", "2", "--log-format", "json",
            "--log-interval", "1", *flags]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [HERE, REPO, os.environ.get("PYTHONPATH")])))
    code = f"import no_cuda_main; no_cuda_main.run({argv!r})"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert (save_dir / "checkpoint_1_2" / "COMPLETE").exists() and (save_dir / "checkpoint_1_4" / "COMPLETE").exists()
    return {name: json.loads((save_dir / f"cuda-{name}.json").read_text()) for name in ("rank0", "rank1", "launcher")}


@pytest.mark.parametrize("saving", [[], ["--async-save"]], ids=["sync_save", "async_save"])
def test_cpu_flag_creates_no_cuda_context_on_any_rank(tmp_path, saving):
    seen = _train_and_report(tmp_path, "--cpu", "--cpu-offload", *saving)
    assert all(not s["cuda_initialized"] for s in seen.values()), seen
    assert seen["rank0"]["contexts"] == seen["rank1"]["contexts"] == [], seen
    assert seen["rank0"]["device"] == seen["rank1"]["device"] == "cpu"


@needs_gpus(2)
@pytest.mark.parametrize("offload", [[], ["--cpu-offload"]], ids=["on_gpu", "cpu_offload"])
def test_no_rank_opens_a_context_on_another_ranks_gpu(tmp_path, offload):
    """--async-save on 2 GPUs: each rank holds a context on its own device only."""
    seen = _train_and_report(tmp_path, "--async-save", *offload)
    assert seen["rank0"]["contexts"] == [0] and seen["rank1"]["contexts"] == [1], seen
    assert seen["rank0"]["device"] == "cuda:0" and seen["rank1"]["device"] == "cuda:1"
