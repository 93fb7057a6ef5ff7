"""--loss-chunks through the criterions, on both model families: the chunked loss gives the unchunked loss, the
logged nll and every parameter's gradient (within 1e-6 of each tensor's scale, as test_chunked_loss.py says why),
the flag sets how many chunks are projected, the default chunks only past the budget, and what cannot be chunked
is refused or, by default, not chunked. DDP and FSDP2 on one rank here (their hooks, in process); two ranks in
test_chunked_loss_runs.py."""
import dataclasses

import pytest
import torch
import torch.nn.functional as F
from torch.distributed.fsdp import MixedPrecisionPolicy, OffloadPolicy
from torch.nn.parallel import DistributedDataParallel
from torch.utils._python_dispatch import TorchDispatchMode  # torch's hook on every op: what is projected

from shardtrain.config.run_config import parse_train_args
from shardtrain.core.errors import ConfigError
from shardtrain.data.dictionary import Dictionary
from shardtrain.models import capabilities
from shardtrain.models.llama import LlamaConfig, LlamaModel
from shardtrain.models.transformer_lm import TransformerLanguageModel, TransformerLanguageModelConfig
from shardtrain.tasks import chunked_loss
from shardtrain.tasks.language_modeling import LanguageModelingTask
from shardtrain.trainer.parallel.fsdp_wrap import apply_fsdp
from shardtrain.trainer.resolved import Components, build_criterion

V, PAD, B, T = 50, 1, 4, 16  # 64 tokens: 4 chunks of 16 rows; the width 8 keeps [V, D] below a chunk's [16, V]
SMOOTHED = ["--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1", "--ignore-prefix-size", "1"]
CRITERIONS = {"cross_entropy": ["--criterion", "cross_entropy"], "label_smoothed": SMOOTHED}


def transformer_lm(**overrides):
    torch.manual_seed(0)
    cfg = TransformerLanguageModelConfig(decoder_embed_dim=8, decoder_input_dim=8, decoder_output_dim=8,
                                         decoder_ffn_embed_dim=12, decoder_layers=2, decoder_attention_heads=2,
                                         dropout=0.0, **overrides)
    return TransformerLanguageModel(cfg, V, PAD, T)  # its own output projection: untied


def llama():
    torch.manual_seed(0)
    cfg = dataclasses.replace(LlamaConfig(), decoder_embed_dim=8, decoder_layers=2, decoder_attention_heads=2,
                              decoder_kv_heads=1, decoder_ffn_embed_dim=12, share_decoder_input_output_embed=True)
    return LlamaModel(cfg, V, T)  # tied: the embedding is the output weight


FAMILIES = {"transformer_lm": transformer_lm, "llama": llama}


def criterion(*flags):
    cfg = parse_train_args(["data-bin", *flags])
    return build_criterion(cfg, Components.of(cfg), LanguageModelingTask(cfg.task, dictionary=Dictionary()))


def batch(seed=0):
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(PAD + 1, V, (B, T), generator=gen)
    target = torch.randint(PAD + 1, V, (B, T), generator=gen)
    target[1, 10:] = target[3, 3:] = PAD  # padded sequences
    return {"net_input": {"src_tokens": tokens}, "target": target, "ntokens": int(target.ne(PAD).sum())}


def loss_and_grads(model, crit, sample):
    model.zero_grad(set_to_none=True)
    loss, size, log = crit(model, sample)
    loss.backward()
    return loss.detach(), log, {n: p.grad.clone() for n, p in model.named_parameters()}


def within(actual, expected, rel=1e-6):
    scale = float(expected.double().abs().max())
    error = float((actual.double() - expected.double()).abs().max())
    assert error <= rel * scale, f"off by {error:.3g}, more than {rel:g} x the largest element {scale:.3g}"


def assert_same(one, other):
    (loss, log, grads), (loss_1, log_1, grads_1) = one, other
    within(loss, loss_1)
    assert log.keys() == log_1.keys()
    if "nll_loss" in log:
        within(log["nll_loss"], log_1["nll_loss"])
    assert grads.keys() == grads_1.keys()
    for name in grads:
        within(grads[name], grads_1[name])


class Projections(TorchDispatchMode):
    """The rows of every matmul output as wide as the vocabulary: the logits, whole or a chunk at a time."""

    def __init__(self):
        super().__init__()
        self.rows = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func._overloadpacket in (torch.ops.aten.mm, torch.ops.aten.addmm, torch.ops.aten.bmm) and \
                out.shape[-1] == V:
            self.rows.append(out.numel() // V)
        return out


@pytest.mark.parametrize("flags", CRITERIONS.values(), ids=CRITERIONS)
@pytest.mark.parametrize("family", FAMILIES)
def test_chunked_equals_unchunked_through_the_criterion(family, flags):
    model, sample = FAMILIES[family](), batch()
    plain = loss_and_grads(model, criterion(*flags, "--loss-chunks", "1"), sample)
    for chunks in ("4", "7"):  # 7: chunks of unequal sizes
        assert_same(loss_and_grads(model, criterion(*flags, "--loss-chunks", chunks), sample), plain)
    assert all(float(grad.abs().max()) > 0 for grad in plain[2].values())  # every parameter is compared


@pytest.mark.parametrize("family", FAMILIES)
def test_the_features_path_is_forwards_logits_path(family):
    model, tokens = FAMILIES[family](), batch()["net_input"]["src_tokens"]
    features = model(src_tokens=tokens, features_only=True)
    assert features.shape == (B, T, 8)
    assert torch.equal(F.linear(features, capabilities.output_weight(model)), model(src_tokens=tokens))


@pytest.mark.flag_effect("--loss-chunks")
def test_loss_chunks_sets_how_many_chunks_are_projected_forward_and_backward():
    model, sample = transformer_lm(), batch()
    for flags, rows in ((["--loss-chunks", "4"], [16] * 8), (["--loss-chunks", "1"], [64]), ([], [64]),
                        (SMOOTHED + ["--loss-chunks", "3"], [20] * 6)):  # the prefix cut: 4 x 15 = 60 rows
        with Projections() as seen:
            loss_and_grads(model, criterion(*flags), sample)
        assert seen.rows == rows, flags


def test_by_default_batches_past_the_budget_are_chunked(monkeypatch):
    model, sample = llama(), batch()
    plain = loss_and_grads(model, criterion("--loss-chunks", "1"), sample)
    monkeypatch.setattr(chunked_loss, "LOGITS_BUDGET", 4 * V * 16)  # 16 rows of fp32 logits
    with Projections() as seen:
        auto = loss_and_grads(model, criterion(), sample)
    assert seen.rows == [16] * 8
    assert_same(auto, plain)


def test_refusals_through_the_criterion():
    sample = batch()
    with pytest.raises(ConfigError, match="this run's batches hold at most 64 tokens"):
        criterion("--loss-chunks", "65").check_batch_tokens(64)
    criterion("--loss-chunks", "64").check_batch_tokens(64)
    with Projections() as seen:  # a batch shorter than the chunks asked for (an epoch's last): a chunk a token
        loss_and_grads(transformer_lm(), criterion("--loss-chunks", "65"), sample)
    assert seen.rows == [1] * 128
    with pytest.raises(ConfigError, match="--loss-chunks -2 is not a chunk count"):
        criterion("--loss-chunks", "-2")
    adaptive = transformer_lm(adaptive_softmax_cutoff="20")
    assert capabilities.output_weight(adaptive) is None and adaptive.output_weight() is None
    with pytest.raises(ConfigError, match="--loss-chunks 4 projects the logits chunk by chunk, which this run"):
        criterion("--loss-chunks", "4")(adaptive, sample)
    loss, _, _ = criterion()(adaptive, sample)  # the default: the adaptive softmax's own log-probabilities
    assert torch.isfinite(loss)


def test_ddp_chunks_but_not_where_it_finds_unused_parameters(one_rank_group):
    model, sample = transformer_lm(), batch()
    plain = loss_and_grads(DistributedDataParallel(model), criterion("--loss-chunks", "1"), sample)
    assert_same(loss_and_grads(DistributedDataParallel(model), criterion("--loss-chunks", "4"), sample), plain)
    finding = DistributedDataParallel(model, find_unused_parameters=True)
    assert capabilities.output_weight(finding) is None
    with Projections() as seen:
        assert_same(loss_and_grads(finding, criterion(), sample), plain)  # the default: the whole batch
    assert seen.rows == [64]
    with pytest.raises(ConfigError, match="--find-unused-parameters must be off"):
        criterion("--loss-chunks", "4")(finding, sample)
    # why: DDP marks the output projection unused after forward, then its gradient arrives
    features = finding(src_tokens=sample["net_input"]["src_tokens"], features_only=True)
    with pytest.raises(RuntimeError, match="marked as ready"):
        chunked_loss.chunked_loss(features.reshape(-1, 8), model.output_weight(), sample["target"].reshape(-1),
                                  chunks=4, ignore_index=PAD)[0].backward()


@pytest.mark.parametrize("family", FAMILIES)
def test_fsdp2_gathers_the_output_weight_for_the_chunks(family, one_rank_group):
    sample, flags = batch(), SMOOTHED
    plain = loss_and_grads(FAMILIES[family](), criterion(*flags, "--loss-chunks", "1"), sample)
    sharded = apply_fsdp(FAMILIES[family](), one_rank_group, MixedPrecisionPolicy(), reshard_after_forward=True,
                         offload=OffloadPolicy(), min_params_to_wrap=0)
    loss, log, grads = loss_and_grads(sharded, criterion(*flags, "--loss-chunks", "4"), sample)
    assert_same((loss, log, {n: g.full_tensor() for n, g in grads.items()}), plain)
