"""Adaptive input/softmax and ``adaptive_loss`` (fairseq 0.12's modules/adaptive_input.py,
modules/adaptive_softmax.py and criterions/adaptive_loss.py)."""
import math

import pytest
import torch
import torch.nn.functional as F

from shardtrain.core.errors import ConfigError
from shardtrain.models.transformer_lm.adaptive import AdaptiveInput
from shardtrain.models.transformer_lm import TransformerLanguageModel, TransformerLanguageModelConfig
from shardtrain.tasks.criterions import AdaptiveLossCriterion

VOCAB, PAD = 23, 1
SMALL = dict(decoder_embed_dim=16, decoder_ffn_embed_dim=32, decoder_layers=2, decoder_attention_heads=2,
             dropout=0.0, adaptive_softmax_cutoff="6,14")
TIED = dict(SMALL, adaptive_input=True, adaptive_input_cutoff="6,14", tie_adaptive_weights=True)
KINDS = {"untied": SMALL, "adaptive_input": dict(SMALL, adaptive_input=True, adaptive_input_cutoff="6,14"),
         "tied": TIED, "tied_proj": dict(TIED, tie_adaptive_proj=True)}


def build(seed=0, **values):
    torch.manual_seed(seed)
    return TransformerLanguageModel(TransformerLanguageModelConfig(**values), VOCAB, PAD, 32)


class _Task:
    class source_dictionary:  # noqa: N801 - the attribute the criterion reads
        @staticmethod
        def pad():
            return PAD


def sample_of(tokens):
    target = tokens.roll(-1, dims=1)
    target[:, -1] = PAD  # padding targets are ignored
    return {"net_input": {"src_tokens": tokens}, "target": target, "ntokens": int(target.ne(PAD).sum())}


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_log_probs_sum_to_one_and_loss_is_their_cross_entropy(kind):
    model = build(**KINDS[kind]).eval()
    tokens = torch.randint(2, VOCAB, (3, 9), generator=torch.Generator().manual_seed(1))
    log_probs = model(tokens)
    assert log_probs.shape == (3, 9, VOCAB)
    torch.testing.assert_close(log_probs.exp().sum(-1), torch.ones(3, 9))
    sample = sample_of(tokens)
    loss, sample_size, logs = AdaptiveLossCriterion(None, _Task)(model, sample)
    expected = F.nll_loss(log_probs.view(-1, VOCAB), sample["target"].view(-1), ignore_index=PAD,
                          reduction="sum")
    torch.testing.assert_close(loss, expected)
    assert sample_size == logs["ntokens"] == sample["ntokens"]


def test_every_cluster_gets_a_gradient_even_when_absent():
    model = build(**KINDS["untied"])
    tokens = torch.randint(2, 6, (2, 8))  # head words only: no target in either tail
    loss, _, _ = AdaptiveLossCriterion(None, _Task)(model, sample_of(tokens))
    loss.backward()
    for name, param in model.named_parameters():
        assert param.grad is not None, name  # DDP needs no find_unused_parameters
    assert model.adaptive_softmax.tail_out[1].weight.grad.abs().sum() == 0


@pytest.mark.parametrize("kind", ["tied", "tied_proj"])
def test_tied_weights_are_the_adaptive_inputs(kind):
    with torch.device("meta"):
        model = build(**KINDS[kind])
    model.to_empty(device="cpu")  # rematerialising would untie two references to one Parameter
    torch.manual_seed(3)
    model.init_weights()
    names = {name for name, _ in model.named_parameters()}
    softmax_names = {n for n in names if n.startswith("adaptive_softmax.")}
    owned = {"adaptive_softmax.class_proj.weight"}
    if kind == "tied":
        owned |= {f"adaptive_softmax.tail_proj.{i}.weight" for i in range(2)}
    assert softmax_names == owned
    model.eval()
    tokens = torch.randint(2, VOCAB, (2, 5))
    before = model(tokens)
    with torch.no_grad():  # band 2 (ids 14..22) is both an input table and the last tail's output
        model.embed_tokens.embeddings[2][0].weight.mul_(3.0)
        if kind == "tied_proj":
            model.embed_tokens.embeddings[1][1].weight.mul_(2.0)
    after = model(tokens)
    assert not torch.allclose(before[..., 14:], after[..., 14:])
    # the head's word rows come from band 0 untouched: only head columns of unchanged rows agree up to
    # the cluster normaliser, so compare the differences between head words instead
    head_before, head_after = before[..., :6], after[..., :6]
    assert not torch.allclose(head_before, head_after)  # the inputs changed the hidden states too
    loss, _, _ = AdaptiveLossCriterion(None, _Task)(model.train(), sample_of(tokens))
    loss.backward()
    assert model.embed_tokens.embeddings[2][0].weight.grad.abs().sum() > 0


def test_adaptive_input_bands_and_init():
    torch.manual_seed(0)
    layer = AdaptiveInput(VOCAB, PAD, 16, 4.0, 12, [6, 14, VOCAB])
    layer.init_weights()
    dims = [band[0].weight.shape for band in layer.embeddings]
    assert dims == [(6, 16), (8, 4), (9, 1)]  # fairseq: int(16 // 4**i)
    assert all(band[0].weight[PAD].abs().sum() == 0 for band in layer.embeddings)  # fairseq zeroes each band's row
    tokens = torch.tensor([[0, 5, 6, 13, 14, 22]])
    out = layer(tokens)
    expected = torch.stack([layer.embeddings[b](torch.tensor(t - s))
                            for t, b, s in zip([0, 5, 6, 13, 14, 22], [0, 0, 1, 1, 2, 2], [0, 0, 6, 6, 14, 14])])
    torch.testing.assert_close(out[0], expected)


@pytest.mark.parametrize("values,match", [
    (dict(SMALL, adaptive_softmax_cutoff="6,30"), "past the dictionary's 23 symbols"),
    (dict(SMALL, adaptive_softmax_cutoff="6,6"), "strictly increasing"),
    (dict(SMALL, adaptive_softmax_cutoff="6,x"), "comma separated list of integers"),
    (dict(TIED, adaptive_input_cutoff="6,15"), "--adaptive-input-cutoff .* equal to --adaptive-softmax-cutoff"),
    (dict(TIED, adaptive_input_factor=2.0), "--adaptive-input-factor"),
    (dict(TIED, decoder_output_dim=8), "--tie-adaptive-weights needs --decoder-input-dim"),
    (dict(SMALL, tie_adaptive_weights=True), "needs both --adaptive-input"),
    (dict(SMALL, share_decoder_input_output_embed=True), "use --tie-adaptive-weights"),
    (dict(SMALL, adaptive_input=True), "--adaptive-input needs --adaptive-input-cutoff"),
])
def test_bad_adaptive_settings_are_refused(values, match):
    with pytest.raises(ConfigError, match=match):
        build(**values)


def test_last_cutoff_may_equal_the_vocabulary():
    model = build(**dict(SMALL, adaptive_softmax_cutoff=f"6,{VOCAB}"))  # fairseq accepts it
    assert model.adaptive_softmax.cutoff == [6, VOCAB]


def test_wiki103_preset_trains_with_small_cutoffs():
    from shardtrain.models import ARCH_REGISTRY
    values = {**ARCH_REGISTRY.get("transformer_lm_wiki103").obj.values(), **SMALL, **TIED,
              "tie_adaptive_proj": True}
    with pytest.raises(ConfigError, match="20000,60000"):
        build(**{**values, "adaptive_input_cutoff": "20000,60000", "adaptive_softmax_cutoff": "20000,60000"})
    model = build(**values)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    tokens = torch.arange(2, 22).repeat(4, 1)  # a learnable sequence
    criterion, losses = AdaptiveLossCriterion(None, _Task), []
    for _ in range(30):
        loss, size, _ = criterion(model, sample_of(tokens))
        optimizer.zero_grad()
        (loss / size).backward()
        optimizer.step()
        losses.append(loss.item() / size / math.log(2))
    assert losses[-1] < 0.5 * losses[0]


def test_adaptive_loss_without_an_adaptive_softmax_names_the_fix():
    model = build(**{k: v for k, v in SMALL.items() if k != "adaptive_softmax_cutoff"})
    with pytest.raises(ConfigError, match="--criterion adaptive_loss needs .* --adaptive-softmax-cutoff"):
        AdaptiveLossCriterion(None, _Task)(model, sample_of(torch.randint(2, VOCAB, (2, 5))))
