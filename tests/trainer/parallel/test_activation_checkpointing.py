"""Activation checkpointing on equals off, exactly: gradients, names, training (one process)."""
import copy
import logging
import os

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from shardtrain.config.run_config import parse_train_args
from shardtrain.core.errors import ConfigError
from shardtrain.models.transformer_lm import TransformerLanguageModel, TransformerLanguageModelConfig
from shardtrain.trainer.parallel.activation_checkpointing import apply_activation_checkpointing, checkpointed_indices
from shardtrain.trainer.launch.start import make_context
from shardtrain.trainer.loop import Run, train
from st_testutils import make_space_data_bin

CPU = torch.device("cpu")
VOCAB, PAD, LAYERS = 20, 1, 4


def small_lm() -> TransformerLanguageModel:
    # Every kind of dropout on: exact equality needs the recomputation to redraw the same masks.
    cfg = TransformerLanguageModelConfig(
        decoder_layers=LAYERS, decoder_embed_dim=16, decoder_ffn_embed_dim=32, decoder_attention_heads=2,
        dropout=0.2, attention_dropout=0.2, activation_dropout=0.2, decoder_normalize_before=True)
    torch.manual_seed(0)
    return TransformerLanguageModel(cfg, VOCAB, PAD, max_positions=32)


def tokens() -> torch.Tensor:
    return torch.randint(PAD + 1, VOCAB, (3, 12), generator=torch.Generator().manual_seed(1))


def recording_saved_tensors(saved: list):
    """Appends every tensor autograd keeps for backward to ``saved``, except those that an
    inner hook (a checkpoint, save_on_cpu) takes instead."""
    return torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t)


def loss_and_grads(model: nn.Module, saved=None):
    """One training forward/backward from a fixed RNG state."""
    model.train()
    torch.manual_seed(123)
    x = tokens()
    with recording_saved_tensors([] if saved is None else saved):
        logits = model(x)
    loss = F.cross_entropy(logits.view(-1, VOCAB), x.view(-1), reduction="sum")
    loss.backward()
    after = torch.rand(1)  # checkpointing must leave the global RNG where the plain run leaves it
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}, after


@pytest.mark.parametrize("every,offload", [(1, False), (2, False), (1, True)])
def test_gradients_are_bitwise_identical_with_dropout(every, offload, caplog):
    plain = small_lm()
    checkpointed = copy.deepcopy(plain)
    with caplog.at_level(logging.INFO, logger="shardtrain.trainer.parallel.activation_checkpointing"):
        indices = apply_activation_checkpointing(checkpointed, every, offload, CPU)
    assert indices == ([0, 1, 2, 3] if every == 1 else [1, 3])
    assert f"{len(indices)} of {LAYERS} blocks checkpointed" in caplog.text
    assert ("already computes on the CPU" in caplog.text) == offload  # the offload no-op warning

    saved_plain, saved_ckpt = [], []
    loss, grads, rng_after = loss_and_grads(plain, saved_plain)
    loss_c, grads_c, rng_after_c = loss_and_grads(checkpointed, saved_ckpt)
    assert torch.equal(loss, loss_c) and torch.equal(rng_after, rng_after_c)
    assert grads.keys() == grads_c.keys()
    for name in grads:
        assert torch.equal(grads[name], grads_c[name]), name

    # It really checkpoints: each checkpointed block keeps only its input [3, 12, 16]
    # (or, offloaded, nothing that the outer hook sees: save_on_cpu takes it instead).
    per_block = _saved_by_one_block(plain)
    kept = 0 if offload else 1
    assert len(holding_memory(saved_ckpt)) == len(holding_memory(saved_plain)) - len(indices) * (per_block - kept)


def holding_memory(saved: list) -> list:
    """The saved tensors that hold memory, which is what checkpointing saves. torch 2.11's
    checkpoint also saves a 0-element placeholder per checkpointed call (utils/checkpoint.py's
    ``dummy``, so that a call without tensor inputs has something to save); 2.13 no longer does."""
    return [t for t in saved if t.numel() > 0]


def _saved_by_one_block(model) -> int:
    saved = []
    x = torch.randn(3, 12, 16, requires_grad=True)
    with recording_saved_tensors(saved):
        model.blocks[0](x)
    assert len(holding_memory(saved)) > 3
    return len(holding_memory(saved))


def test_names_and_state_dict_keys_are_unchanged():
    plain = small_lm()
    checkpointed = copy.deepcopy(plain)
    apply_activation_checkpointing(checkpointed, 1, False, CPU)
    assert [n for n, _ in checkpointed.named_parameters()] == [n for n, _ in plain.named_parameters()]
    assert list(checkpointed.state_dict()) == list(plain.state_dict())
    plain.load_state_dict(checkpointed.state_dict())  # strict both ways


def test_deepcopy_of_a_checkpointed_model_uses_its_own_weights():
    plain = small_lm()
    checkpointed = copy.deepcopy(plain)
    apply_activation_checkpointing(checkpointed, 1, False, CPU)
    twin_plain, twin_checkpointed = copy.deepcopy(plain), copy.deepcopy(checkpointed)
    with torch.no_grad():
        for model in (twin_plain, twin_checkpointed):
            for p in model.blocks.parameters():
                p.mul_(0.5)
    x = tokens()
    # grad enabled, so the checkpointed forward runs: it must use the copy's weights, not the original's
    expected, got = twin_plain.eval()(x), twin_checkpointed.eval()(x)
    assert torch.equal(got, expected) and not torch.equal(got, checkpointed.eval()(x))


def test_eval_and_kv_cache_decoding_are_unaffected():
    plain, checkpointed = small_lm().eval(), small_lm().eval()
    apply_activation_checkpointing(checkpointed, 1, True, CPU)
    x = tokens()
    with torch.no_grad():
        assert torch.equal(plain(x), checkpointed(x))
        cache = checkpointed.new_kv_cache()
        prefix = checkpointed(x[:, :8], cache)
        step = checkpointed(x[:, 8:9], cache)  # the cache must hold 8 positions, not 16
    assert cache.length == 9
    torch.testing.assert_close(torch.cat([prefix, step], 1), plain(x)[:, :9], rtol=1e-5, atol=1e-5)


def test_model_without_blocks_gets_a_config_error():
    with pytest.raises(ConfigError, match="no `blocks` attribute.*Add one"):
        apply_activation_checkpointing(nn.Sequential(nn.Linear(2, 2)), 1, False, CPU)


def test_checkpointed_indices():
    assert checkpointed_indices(12, 1) == list(range(12))
    assert checkpointed_indices(12, 3) == [2, 5, 8, 11]
    assert checkpointed_indices(2, 3) == []


@pytest.fixture(scope="module")
def data_bin(tmp_path_factory):
    return make_space_data_bin(str(tmp_path_factory.mktemp("ac")), train_tokens=1500, valid_tokens=200)


def flags(data_bin, save_dir, *extra):
    return parse_train_args([
        data_bin, "--arch", "transformer_lm", "--decoder-layers", "3", "--decoder-embed-dim", "16",
        "--decoder-ffn-embed-dim", "32", "--decoder-attention-heads", "2", "--tokens-per-sample", "16",
        "--batch-size", "4", "--dropout", "0.1", "--attention-dropout", "0.1", "--activation-dropout", "0.1",
        "--optimizer", "adam", "--lr", "1e-3", "--max-update", "3", "--disable-validation", "--cpu",
        "--threads", "1", "--log-format", "none", "--save-dir", str(save_dir), *extra])


def train_in_process(cfg):
    run = Run(cfg, make_context(0, 0, 1, use_cuda=False, backend=None))
    try:
        train(run)
        checkpointed = ["forward" in vars(block) for block in run.trainer.model.blocks]
    finally:
        run.close()
    return checkpointed, torch.load(os.path.join(cfg.checkpoint.save_dir, "checkpoint_last.pt"),
                                    weights_only=False)


@pytest.mark.slow
@pytest.mark.flag_effect("--checkpoint-activations", "--offload-activations", "--checkpoint-activations-every")
def test_training_run_and_checkpoint_are_identical(data_bin, tmp_path):
    off, reference = train_in_process(flags(data_bin, tmp_path / "off"))
    on, state = train_in_process(flags(data_bin, tmp_path / "on", "--checkpoint-activations"))
    every2, state2 = train_in_process(flags(data_bin, tmp_path / "every2", "--offload-activations",
                                            "--checkpoint-activations-every", "2"))
    assert off == [False] * 3 and on == [True] * 3 and every2 == [False, True, False]
    assert reference["train_state"]["num_updates"] == 3
    for checkpoint in (state, state2):
        assert list(checkpoint["model"]) == list(reference["model"])
        for key in reference["model"]:
            assert torch.equal(checkpoint["model"][key], reference["model"][key]), key
        _assert_same_tree(checkpoint["optimizer"], reference["optimizer"])  # keyed by parameter name


def _assert_same_tree(a, b, where="optimizer"):
    if isinstance(a, dict):
        assert list(a) == list(b), where
        for key in a:
            _assert_same_tree(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_same_tree(x, y, f"{where}[{i}]")
    elif torch.is_tensor(a):
        assert torch.equal(a, b), where
    else:
        assert a == b, where


def test_checkpoint_activations_every_below_one_is_refused(data_bin, tmp_path):
    with pytest.raises(ConfigError, match="--checkpoint-activations-every must be at least 1"):
        flags(data_bin, tmp_path, "--checkpoint-activations", "--checkpoint-activations-every", "0")
