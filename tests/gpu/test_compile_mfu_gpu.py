"""Issue 19 on GPUs: --compile trains as eager does (one GPU; two fully_sharded GPUs with
activation checkpointing), and train records carry mfu against the data sheet's peak."""
import pytest
import torch

from conftest import needs_gpus
from gpu_runs import data_bin, train
from st_testutils import last_checkpoint_state
from shardtrain.trainer.checkpoint.consolidate import read_sharded
from shardtrain.trainer.metrics.flops import gpu_peak_tflops

# SGD: see tests/trainer/parallel/test_compile.py (Adam turns rounding noise in zero gradients into steps).
FLAGS = ["--max-update", "10", "--optimizer", "sgd", "--lr", "0.1", "--lr-scheduler", "fixed", "--dropout", "0.1",
         "--disable-validation", "--no-epoch-checkpoints"]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return data_bin(tmp_path_factory.mktemp("compile-gpu"))


def _weights(save_dir, sharded):
    state = read_sharded(str(save_dir / "checkpoint_last"), model_only=True) if sharded else \
        last_checkpoint_state(save_dir)
    return {k: v.float() for k, v in state["model"].items() if torch.is_tensor(v)}


@needs_gpus(1)
@pytest.mark.parametrize("precision", [[], ["--bf16"]])
def test_compiled_equals_eager_on_one_gpu(data, tmp_path, precision):
    eager, _ = train(data, tmp_path / "eager", *FLAGS, *precision)
    compiled, _ = train(data, tmp_path / "compiled", *FLAGS, *precision, "--compile")
    for c, e in zip(compiled, eager):
        assert c["loss"] == pytest.approx(e["loss"], abs=2e-3 if not precision else 2e-2)
    e, c = _weights(tmp_path / "eager", False), _weights(tmp_path / "compiled", False)
    assert max((e[k] - c[k]).abs().max().item() for k in e) <= (1e-5 if not precision else 1e-2)


@needs_gpus(2)
def test_compiled_fully_sharded_checkpointed_equals_eager(data, tmp_path):
    flags = [*FLAGS, "--ddp-backend", "fully_sharded", "--distributed-world-size", "2", "--checkpoint-activations"]
    train(data, tmp_path / "eager", *flags)
    train(data, tmp_path / "compiled", *flags, "--compile")
    e, c = _weights(tmp_path / "eager", True), _weights(tmp_path / "compiled", True)
    assert max((e[k] - c[k]).abs().max().item() for k in e) <= 1e-5


# The FLOPs of gpu_runs.MODEL per trained token, counted here from its config (PaLM's count, as
# models/flops.py documents it): 6 per weight a token is multiplied by (2 forward, 4 backward) plus
# 12 x layers x width x seq_len for attention's scores and weighted sum.
LAYERS, WIDTH, FFN, SEQ = 2, 64, 128, 64
VOCAB = 72  # gpu_runs.data_bin: 64 words + 4 specials, padded to a multiple of 8
MATMUL_WEIGHTS = LAYERS * (3 * WIDTH * WIDTH + WIDTH * WIDTH + 2 * WIDTH * FFN) + VOCAB * WIDTH  # qkv, out, fc1,
FLOPS_PER_TOKEN = 6 * MATMUL_WEIGHTS + 12 * LAYERS * WIDTH * SEQ  # fc2, the untied output projection: 519,168


@needs_gpus(1)
def test_mfu_is_against_the_data_sheet(data, tmp_path):
    records, _ = train(data, tmp_path / "run", *FLAGS, "--bf16")
    assert last_checkpoint_state(tmp_path / "run")["model"]["embed_tokens.weight"].shape == (VOCAB, WIDTH)
    peak = gpu_peak_tflops(torch.cuda.get_device_name(0), torch.bfloat16, tf32=False)
    for r in records[2:]:
        tflops = r["wps"] * FLOPS_PER_TOKEN / 1e12  # one GPU: wps is this device's tokens per second
        assert r["tflops"] == pytest.approx(tflops, rel=2e-3), (r, FLOPS_PER_TOKEN)
        if peak is not None:
            assert r["mfu"] == pytest.approx(100 * tflops / peak, rel=2e-3), (r, peak)
        assert 0 < r["mfu"] < 100
