"""shard-validate --bf16/--fp16 on the GPU (issue 13, item 5): a model trained on
the GPU is validated with its weights loaded straight into bf16/fp16 on cuda.
The losses are within 1% of fp32's (the tolerance of
tests/cli/test_inference_low_precision.py: a few roundings of bf16's 8
significant bits), and the GPU peak the loader logs is about half of fp32's:
no full fp32 copy was ever on the GPU. Single-file and sharded checkpoints.
"""
import os
import re
import subprocess
import sys

import pytest

from conftest import needs_gpus
from gpu_runs import data_bin, train

# ~12.6M parameters (50 MB in fp32): large enough that the parameters dominate the GPU peak
WIDE = ["--decoder-layers", "4", "--decoder-embed-dim", "512", "--decoder-ffn-embed-dim", "2048",
        "--decoder-attention-heads", "8"]
UNITS = {"GiB": 2 ** 30, "MiB": 2 ** 20}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    d = tmp_path_factory.mktemp("lowp-gpu")
    data = data_bin(d)
    common = [*WIDE, "--max-update", "30", "--optimizer", "adam", "--lr", "0.002", "--bf16"]
    train(data, d / "file", *common)
    train(data, d / "sharded", *common, "--ddp-backend", "fully_sharded")
    return data, str(d / "file" / "checkpoint_last.pt"), str(d / "sharded" / "checkpoint_last")


def validate(data, path, *flags):
    """-> (valid loss, logged GPU peak bytes of the load), from a fresh process."""
    argv = [sys.executable, "-m", "shardtrain.cli.validate", data, "--path", path, *flags]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600, env=dict(os.environ))
    assert done.returncode == 0, f"{' '.join(argv)}\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    peak = re.search(r"loaded .* on cuda:\d+ in .* GPU peak ([\d.]+) (GiB|MiB)\)", done.stdout)
    loss = re.search(r"valid on 'valid' subset \| loss ([\d.]+)", done.stdout)
    assert peak and loss, done.stdout[-4000:]
    return float(loss.group(1)), float(peak.group(1)) * UNITS[peak.group(2)]


@needs_gpus(1)
@pytest.mark.parametrize("which", [1, 2], ids=["file", "sharded"])
def test_low_precision_loss_close_and_half_the_gpu_peak(trained, which):
    data, path = trained[0], trained[which]
    loss32, peak32 = validate(data, path)
    assert peak32 > 40 * 2 ** 20, peak32  # the fp32 parameters alone are ~50 MB
    for flag in ("--bf16", "--fp16"):
        loss, peak = validate(data, path, flag)
        assert abs(loss - loss32) <= 0.01 * loss32, (flag, loss, loss32)
        assert 0.4 <= peak / peak32 <= 0.6, (flag, peak, peak32)
