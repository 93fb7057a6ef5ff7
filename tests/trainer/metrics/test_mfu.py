"""mfu in train records: the model's FLOPs per token against torch's own FLOP counter, and the
record's tokens/s per device, TFLOP/s and mfu against its wps."""
import os

import pytest
import torch
from omegaconf import OmegaConf
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from shardtrain.cli import train
from shardtrain.models.transformer_lm import TransformerLanguageModel
from shardtrain.models.transformer_lm.config import TransformerLanguageModelConfig
from shardtrain.trainer.metrics import flops
from st_testutils import json_records, make_space_data_bin, tiny_model_flags

VOCAB, LENGTH = 50, 24


def _model(vocab=VOCAB, length=LENGTH, **overrides):
    cfg = OmegaConf.merge(OmegaConf.structured(TransformerLanguageModelConfig), {
        "decoder_layers": 3, "decoder_embed_dim": 32, "decoder_ffn_embed_dim": 80, "decoder_attention_heads": 4,
        **overrides})
    return TransformerLanguageModel(cfg, vocab, padding_idx=1, max_positions=length)


def _counted_per_token(model, batch=2, vocab=VOCAB, length=LENGTH):
    """FLOPs torch counts in one forward and backward of a [batch, length] batch, per token."""
    tokens = torch.randint(4, vocab, (batch, length))
    # The counter has no formula for the CPU flash kernel's op; attention's math path makes the same
    # products as bmm calls, which it counts (the whole T x T, the causal mask applied as an addition).
    with FlopCounterMode(display=False) as counter, sdpa_kernel(SDPBackend.MATH):
        model(tokens).float().logsumexp(-1).sum().backward()
    return counter.get_total_flops() / (batch * length)


@pytest.mark.parametrize("overrides", [
    {}, {"share_decoder_input_output_embed": True}, {"decoder_input_dim": 16, "decoder_output_dim": 16},
    {"decoder_layers": 1, "decoder_embed_dim": 64, "decoder_attention_heads": 2}])
def test_the_models_count_is_torchs_count(overrides):
    model = _model(**overrides)
    assert model.flops_per_token(LENGTH) == pytest.approx(_counted_per_token(model), rel=1e-12)


def test_the_formula_by_hand():
    """docs/training.md's formula for the default shape: 6 x (4d^2 + 2 d f per layer + V d) + 12 L d T."""
    d, f, layers = 32, 80, 3
    by_hand = 6 * (layers * (4 * d * d + 2 * d * f) + VOCAB * d) + 12 * layers * d * LENGTH
    assert _model().flops_per_token(LENGTH) == by_hand


def test_a_model_without_a_count_is_six_per_parameter():
    model = torch.nn.Linear(3, 4)
    assert flops.model_flops_per_token(model, 10) == 6 * 16


def test_peaks_from_the_table():
    assert flops.gpu_peak_tflops("NVIDIA H100 80GB HBM3", torch.bfloat16, tf32=False) == 989.4
    assert flops.gpu_peak_tflops("NVIDIA H100 PCIe", torch.bfloat16, tf32=False) == 756.0
    assert flops.gpu_peak_tflops("NVIDIA A100-SXM4-40GB", torch.float32, tf32=True) == 156.0
    assert flops.gpu_peak_tflops("NVIDIA A100-SXM4-40GB", torch.float32, tf32=False) == 19.5
    assert flops.gpu_peak_tflops("Some New GPU", torch.bfloat16, tf32=False) is None
    assert flops.peak_tflops(torch.device("cpu"), torch.float32, given=3.5) == 3.5


def test_a_measured_cpu_peak_is_what_a_matmul_reaches():
    peak = flops.measured_peak_tflops(torch.device("cpu"), torch.float32, seconds=0.05)
    a, b = torch.randn(256, 256), torch.randn(256, 256)
    import time
    start = time.perf_counter()
    for _ in range(20):
        torch.mm(a, b)
    achieved = 20 * 2 * 256 ** 3 / (time.perf_counter() - start) / 1e12
    assert 0 < achieved < 3 * peak  # the same order: a smaller matmul does not beat the peak by far


@pytest.mark.slow
@pytest.mark.flag_effect("--peak-tflops")
def test_train_records_carry_per_device_speed_tflops_and_mfu(tmp_path):
    data = make_space_data_bin(str(tmp_path), n_words=20)
    log = os.path.join(tmp_path, "log.json")
    train.main([data, *tiny_model_flags(), "--max-update", "3", "--save-dir", str(tmp_path / "ck"),
                "--no-save", "--disable-validation", "--log-file", log, "--peak-tflops", "0.5"])
    records = json_records(log, "train_inner")
    records += [{k[len("train_"):]: v for k, v in r.items()} for r in json_records(log, "train")]
    assert len(records) == 4
    with open(os.path.join(data, "dict.txt")) as f:
        vocab = 4 + sum(1 for _ in f)  # fairseq's four specials first
    run_model = _model(vocab, 32, decoder_layers=2, decoder_ffn_embed_dim=64, decoder_attention_heads=2)
    per_token = _counted_per_token(run_model, vocab=vocab, length=32)
    for r in records:
        assert r["wps_per_device"] == pytest.approx(r["wps"], rel=1e-3)  # one rank
        assert r["tflops"] == pytest.approx(r["wps"] * per_token / 1e12, rel=2e-3)
        assert r["mfu"] == pytest.approx(100 * r["tflops"] / 0.5, rel=2e-3)


@pytest.mark.slow
def test_measuring_the_peak_leaves_the_runs_random_numbers_alone(tmp_path):
    """Rank 0 measures a matmul before training: with dropout on, a run that measures and one given
    --peak-tflops (which measures nothing) draw the same masks."""
    data = make_space_data_bin(str(tmp_path), n_words=20)
    losses = []
    for name, extra in (("given", ["--peak-tflops", "0.5"]), ("measured", [])):
        flops._MEASURED.clear()
        log = os.path.join(tmp_path, f"{name}.json")
        train.main([data, *tiny_model_flags(), "--max-update", "3", "--save-dir", str(tmp_path / name), "--no-save",
                    "--disable-validation", "--log-file", log, "--dropout", "0.3", *extra])
        losses.append([r["loss"] for r in json_records(log, "train_inner")])
    assert losses[0] == losses[1] and len(losses[0]) == 3
