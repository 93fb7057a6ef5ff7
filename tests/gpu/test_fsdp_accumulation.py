"""--update-freq under fully_sharded --cpu-offload costs no GPU memory (fairseq's 13B-on-one-GPU
recipe): by default every micro-batch reduce-scatters its gradients, which go to the CPU shards,
so no gradient outlives its FSDP unit's backward on the GPU. --fsdp-unsharded-accumulation keeps
the whole model's unsharded fp32 gradients on every GPU until the last micro-batch; it is run too,
to show the measurement sees what the default avoids.

Without --cpu-offload the accumulated sharded gradient (1/world size of the model's) stays on the
GPU between micro-batches, which no accumulation can avoid; benchmarks/accum_memory.py measures that
case on the CPU."""
import math

import pytest

import gpu_runs
from shardtrain.config.run_config import parse_train_args
from shardtrain.trainer.launch.start import call_main
from accum_mains import train_and_measure_cuda
from conftest import needs_gpus

# 8 blocks of 3.2M parameters: their fp32 gradients (100 MB) are a large share of the GPU peak
MODEL = ["--arch", "transformer_lm", "--decoder-layers", "8", "--decoder-embed-dim", "512",
         "--decoder-ffn-embed-dim", "2048", "--decoder-attention-heads", "8", "--tokens-per-sample", "64",
         "--batch-size", "8", "--required-batch-size-multiple", "1"]
UPDATES = 3


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return gpu_runs.data_bin(tmp_path_factory.mktemp("accum"))  # 40,000 tokens: 2 GPUs use 12,288


def measure(data, tmp_path, gpus, *flags):
    cfg = parse_train_args([
        data, *MODEL, "--ddp-backend", "fully_sharded", "--cpu-offload", "--optimizer", "adam", "--lr", "1e-4",
        "--max-update", str(UPDATES), "--no-save", "--disable-validation", "--log-format", "none",
        "--save-dir", str(tmp_path / "unused"), "--distributed-world-size", str(gpus), "--heartbeat-timeout", "120",
        *flags])
    return call_main(cfg, train_and_measure_cuda)


@pytest.mark.parametrize("precision", [[], ["--bf16"]], ids=["fp32", "bf16"])
@pytest.mark.parametrize("gpus", [pytest.param(1, marks=needs_gpus(1)), pytest.param(2, marks=needs_gpus(2))])
def test_update_freq_4_needs_no_more_gpu_memory_than_1(data, tmp_path, gpus, precision):
    one = measure(data, tmp_path, gpus, "--update-freq", "1", *precision)
    four = measure(data, tmp_path, gpus, "--update-freq", "4", *precision)
    unsharded = measure(data, tmp_path, gpus, "--update-freq", "4", "--fsdp-unsharded-accumulation", *precision)
    for losses, _, _ in (one, four, unsharded):
        assert len(losses) == UPDATES and all(math.isfinite(x) for x in losses), losses
    peak_one, peak_four, peak_unsharded = one[1], four[1], unsharded[1]
    grad_bytes = 4 * one[2]  # the model's unsharded fp32 gradients
    ratio = peak_four / peak_one
    print(f"{gpus} GPU(s) {precision}: peak {peak_one / 2**20:.0f} MB (--update-freq 1), {peak_four / 2**20:.0f} MB "
          f"(4, ratio {ratio:.3f}), {peak_unsharded / 2**20:.0f} MB (4, --fsdp-unsharded-accumulation)")
    assert ratio <= 1.05, (peak_one, peak_four)
    # the opt-in holds (nearly) the whole model's gradients on the GPU; the default at most a unit's or two
    assert peak_unsharded - peak_four >= 0.5 * grad_bytes, (peak_four, peak_unsharded, grad_bytes)
