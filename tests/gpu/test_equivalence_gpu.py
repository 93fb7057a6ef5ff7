"""Scenario 2 of the GPU acceptance suite: every backend computes, on GPUs, the training
one GPU computes (8 updates, fp32 and bf16), and a model initialised on a GPU holds
bitwise the weights the CPU init gives (fully_sharded materialises shards on the device).

One GPU with --update-freq 2 sees the batches 2 GPUs see with --update-freq 1 (and 4
GPUs with hybrid_shard: one GPU at --update-freq 4)."""

import numpy as np
import pytest

from conftest import gpu_count, needs_gpus
from shardtrain.config.run_config import parse_train_args
from shardtrain.trainer.launch.start import call_main

from equivalence_mains import initial_weights, train_and_record  # noqa: E402
from st_testutils import make_space_data_bin  # noqa: E402

UPDATES = 8
# fp32 on GPUs: TF32 is off by default for matmuls in torch, and reduction order differs by backend
TOLERANCE = {"fp32": 1e-4, "bf16": 2e-2}


@pytest.fixture(scope="module")
def data_bin(tmp_path_factory):
    return make_space_data_bin(str(tmp_path_factory.mktemp("gpu-equiv")), n_words=8, train_tokens=4000,
                               valid_tokens=200, line_len=40)


def run(data_bin, tmp_path, world_size, precision, *extra, cpu=False, main=train_and_record):
    cfg = parse_train_args([
        data_bin, "--arch", "transformer_lm", "--decoder-layers", "2", "--decoder-embed-dim", "64",
        "--decoder-ffn-embed-dim", "128", "--decoder-attention-heads", "4", "--tokens-per-sample", "32",
        "--batch-size", "4", "--required-batch-size-multiple", "1", "--dropout", "0", "--optimizer", "sgd",
        "--momentum", "0.9", "--lr", "0.1", "--clip-norm", "0", "--max-update", str(UPDATES), "--no-save",
        "--disable-validation", "--log-format", "none", "--save-dir", str(tmp_path / "unused"),
        "--distributed-world-size", str(world_size), "--heartbeat-timeout", "120",
        *([] if precision == "fp32" else [f"--{precision}"]), *(["--cpu"] if cpu else []), *extra])
    return call_main(cfg, main)


def assert_close(result, reference, rtol):
    np.testing.assert_allclose(result[0], reference[0], rtol=rtol)
    for k in reference[1]:
        np.testing.assert_allclose(result[1][k], reference[1][k], rtol=rtol, atol=rtol, err_msg=k)


@needs_gpus(1)
def test_gpu_init_is_bitwise_the_cpu_init(data_bin, tmp_path):
    for backend in ("pytorch_ddp", "fully_sharded"):
        on_cpu = run(data_bin, tmp_path, 1, "fp32", "--ddp-backend", backend, cpu=True, main=initial_weights)
        on_gpu = run(data_bin, tmp_path, 1, "fp32", "--ddp-backend", backend, main=initial_weights)
        assert on_cpu.keys() == on_gpu.keys()
        for k, w in on_cpu.items():
            assert np.array_equal(w, on_gpu[k]), (backend, k)


@needs_gpus(2)
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_backends_on_two_gpus_equal_one_gpu(data_bin, tmp_path, precision):
    reference = run(data_bin, tmp_path, 1, precision, "--update-freq", "2")
    for backend in ("pytorch_ddp", "legacy_ddp", "fully_sharded"):
        assert_close(run(data_bin, tmp_path, 2, precision, "--ddp-backend", backend), reference, TOLERANCE[precision])
    if gpu_count() >= 4:
        reference4 = run(data_bin, tmp_path, 1, precision, "--update-freq", "4")
        hybrid = run(data_bin, tmp_path, 4, precision, "--ddp-backend", "fully_sharded", "--fsdp-sharding-strategy",
                     "hybrid_shard", "--shard-group-size", "2")
        assert_close(hybrid, reference4, TOLERANCE[precision])
