"""Scenario 8: ``--cpu`` on a GPU machine trains on the CPU and never creates a CUDA
context, even with --ddp-backend fully_sharded --cpu-offload (whose shards were once
pinned whenever a GPU was visible). tests/trainer/test_fsdp_offload_device.py tests
the decision on a CPU machine."""
import json
import os
import subprocess
import sys

import gpu_runs

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))


def test_cpu_flag_creates_no_cuda_context_on_any_rank(tmp_path):
    save_dir = tmp_path / "ckpt"
    argv = [gpu_runs.data_bin(tmp_path / "data"), *gpu_runs.MODEL, "--save-dir", str(save_dir), "--cpu",
            "--ddp-backend", "fully_sharded", "--cpu-offload", "--distributed-world-size", "2",
            "--max-update", "4", "--validate-interval-updates", "2", "--save-interval-updates", "2",
            "--log-format", "json", "--log-interval", "1"]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [HERE, REPO, os.environ.get("PYTHONPATH")])))
    code = f"import no_cuda_main; no_cuda_main.run({argv!r})"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    seen = {name: json.loads((save_dir / f"cuda-{name}.json").read_text()) for name in ("rank0", "rank1", "launcher")}
    assert all(not s["cuda_initialized"] for s in seen.values()), seen
    assert seen["rank0"]["device"] == seen["rank1"]["device"] == "cpu"
