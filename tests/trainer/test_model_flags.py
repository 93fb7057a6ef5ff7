"""Every transformer_lm flag, given on shard-train's command line, changes the model it builds.

Flags parsed by ``parse_train_args``, the model built by the trainer's ``build_model`` for a
language-modeling task whose dictionary has 24 symbols (4 special + 20 words). Shapes, outputs and
computations are checked against numbers and formulas written down here.
"""
import math

import pytest
import torch
import torch.nn.functional as F

from shardtrain.config.run_config import parse_train_args
from shardtrain.core.errors import ConfigError
from shardtrain.data.dictionary import Dictionary
from shardtrain.tasks.language_modeling import LanguageModelingTask
from shardtrain.trainer.resolved import Components, build_model

V, PAD = 24, 1
SMALL = ["--decoder-embed-dim", "16", "--decoder-ffn-embed-dim", "24", "--decoder-layers", "1",
         "--decoder-attention-heads", "4", "--tokens-per-sample", "16"]
# no layers and no dropout: the features are the embedding stage's output alone
EMBEDDING_ONLY = [*SMALL, "--decoder-layers", "0", "--dropout", "0"]


def model(*flags, seed=0):
    cfg = parse_train_args(["data-bin", *flags])
    dictionary = Dictionary()
    for i in range(V - 4):
        dictionary.add_symbol(f"w{i}")
    torch.manual_seed(seed)
    return build_model(cfg, Components.of(cfg), LanguageModelingTask(cfg.task, dictionary=dictionary))


def tokens(length=6, seed=0):
    return torch.randint(PAD + 1, V, (2, length), generator=torch.Generator().manual_seed(seed))


@pytest.mark.flag_effect("--decoder-embed-dim", "--decoder-ffn-embed-dim", "--decoder-layers",
                         "--decoder-input-dim", "--decoder-output-dim")
def test_size_flags_shape_the_parameters():
    m = model(*SMALL, "--decoder-layers", "3", "--decoder-input-dim", "12", "--decoder-output-dim", "20")
    assert m.embed_tokens.weight.shape == (V, 12)
    assert m.project_in_dim.weight.shape == (16, 12)  # input dim -> embed dim
    assert len(m.blocks) == 3
    assert m.blocks[0].fc1.weight.shape == (24, 16) and m.blocks[0].fc2.weight.shape == (16, 24)
    assert m.blocks[0].self_attn.qkv_proj.weight.shape == (48, 16)
    assert m.project_out_dim.weight.shape == (20, 16)  # embed dim -> output dim
    assert m.output_projection.weight.shape == (V, 20)
    assert m(tokens()).shape == (2, 6, V)


def _attention(attn, x, heads):
    """Causal multi-head attention written out: per head softmax(q k^T / sqrt(d)) v, then out_proj."""
    q, k, v = F.linear(x, attn.qkv_proj.weight, attn.qkv_proj.bias).chunk(3, dim=-1)
    length, d = x.size(1), x.size(2) // heads
    outs = []
    for h in range(heads):
        cols = slice(h * d, (h + 1) * d)
        scores = q[..., cols] @ k[..., cols].transpose(1, 2) / math.sqrt(d)
        scores = scores.masked_fill(torch.ones(length, length).triu(1).bool(), float("-inf"))
        outs.append(scores.softmax(-1) @ v[..., cols])
    return F.linear(torch.cat(outs, -1), attn.out_proj.weight, attn.out_proj.bias)


@pytest.mark.flag_effect("--decoder-attention-heads")
def test_attention_heads_split_the_attention():
    attn = model(*SMALL, "--decoder-attention-heads", "2").blocks[0].self_attn.eval()
    x = torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        got = attn(x)
        torch.testing.assert_close(got, _attention(attn, x, heads=2), rtol=1e-5, atol=1e-6)
        assert not torch.allclose(got, _attention(attn, x, heads=4), atol=1e-4)  # the heads matter


@pytest.mark.flag_effect("--activation-fn")
def test_activation_fn_is_the_ffns_nonlinearity():
    x = torch.tensor([-1.0, 1.0])
    relu = model(*SMALL).blocks[0].activation(x)
    gelu = model(*SMALL, "--activation-fn", "gelu").blocks[0].activation(x)
    assert relu.tolist() == [0.0, 1.0]
    assert gelu.tolist() == pytest.approx([-0.158655, 0.841345], abs=1e-6)  # x * Phi(x)


def _sinusoid(position, dim=16):
    half = dim // 2
    freqs = [math.exp(-j * math.log(10000) / (half - 1)) for j in range(half)]
    return torch.tensor([math.sin(position * f) for f in freqs] + [math.cos(position * f) for f in freqs])


@pytest.mark.flag_effect("--no-scale-embedding", "--no-token-positional-embeddings")
def test_embedding_scale_and_positions():
    x = tokens(3)
    default = model(*EMBEDDING_ONLY).eval()
    table = default.embed_tokens.weight.detach()
    positions = torch.stack([_sinusoid(p) for p in (2, 3, 4)])  # fairseq counts from padding_idx + 1
    # sqrt(16) = 4 times the token's embedding, plus its position's sinusoid
    torch.testing.assert_close(default.extract_features(x), 4 * table[x] + positions, rtol=1e-5, atol=1e-5)
    no_pos = model(*EMBEDDING_ONLY, "--no-token-positional-embeddings").eval()
    torch.testing.assert_close(no_pos.extract_features(x), 4 * no_pos.embed_tokens.weight[x])
    unscaled = model(*EMBEDDING_ONLY, "--no-token-positional-embeddings", "--no-scale-embedding").eval()
    torch.testing.assert_close(unscaled.extract_features(x), unscaled.embed_tokens.weight[x])


@pytest.mark.flag_effect("--decoder-learned-pos", "--max-target-positions")
def test_learned_positions_and_their_count():
    m = model(*EMBEDDING_ONLY, "--decoder-learned-pos", "--max-target-positions", "8").eval()
    assert m.embed_positions.weight.shape == (8 + PAD + 1, 16)  # fairseq's table: max + padding_idx + 1 rows
    x = tokens(8)
    expected = 4 * m.embed_tokens.weight[x] + m.embed_positions.weight[torch.arange(2, 10)]
    torch.testing.assert_close(m.extract_features(x), expected)
    with pytest.raises(ConfigError, match="has only 8 positions"):
        m(tokens(9))
    assert model(*EMBEDDING_ONLY, "--decoder-learned-pos")(tokens(9)).shape == (2, 9, V)  # 16 by default


@pytest.mark.flag_effect("--layernorm-embedding")
def test_layernorm_embedding_normalises_each_token():
    features = model(*EMBEDDING_ONLY, "--layernorm-embedding").eval().extract_features(tokens())
    torch.testing.assert_close(features.mean(-1), torch.zeros(2, 6), rtol=0, atol=1e-5)
    torch.testing.assert_close(features.var(-1, unbiased=False), torch.ones(2, 6), rtol=0, atol=1e-3)
    assert model(*EMBEDDING_ONLY).eval().extract_features(tokens()).mean(-1).abs().max() > 0.1


@pytest.mark.flag_effect("--decoder-normalize-before", "--no-decoder-final-norm")
def test_pre_norm_adds_a_final_layer_norm_unless_told_not_to():
    x = tokens()
    pre = model(*EMBEDDING_ONLY, "--decoder-normalize-before").eval()
    torch.testing.assert_close(pre.extract_features(x).mean(-1), torch.zeros(2, 6), rtol=0, atol=1e-5)
    bare = model(*EMBEDDING_ONLY, "--decoder-normalize-before", "--no-decoder-final-norm").eval()
    torch.testing.assert_close(bare.extract_features(x), model(*EMBEDDING_ONLY).eval().extract_features(x))
    # in a block: pre-norm adds f(LN(x)) to x, post-norm takes LN(x + f(x)); same weights, other outputs
    post_block, pre_block = model(*SMALL).blocks[0].eval(), model(*SMALL, "--decoder-normalize-before").blocks[0]
    pre_block.load_state_dict(post_block.state_dict())
    h = torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        a = post_block.self_attn(post_block.self_attn_layer_norm(h)) + h
        ffn = pre_block.fc2(F.relu(pre_block.fc1(pre_block.final_layer_norm(a)))) + a
        torch.testing.assert_close(pre_block.eval()(h), ffn)
        assert post_block(h).mean(-1).abs().max() < 1e-5  # post-norm ends with a LayerNorm


@pytest.mark.flag_effect("--share-decoder-input-output-embed")
def test_shared_embeddings_are_the_output_matrix():
    shared, untied = model(*SMALL, "--share-decoder-input-output-embed"), model(*SMALL)
    assert shared.output_projection is None
    assert sum(p.numel() for p in untied.parameters()) - sum(p.numel() for p in shared.parameters()) == V * 16
    x = tokens()
    shared.eval()
    torch.testing.assert_close(shared(x), shared.extract_features(x) @ shared.embed_tokens.weight.T)


@pytest.mark.flag_effect("--dropout", "--attention-dropout", "--activation-dropout", "--relu-dropout",
                         "--decoder-layerdrop")
@pytest.mark.parametrize("flags", [["--dropout", "0.3"], ["--attention-dropout", "0.3"],
                                   ["--activation-dropout", "0.3"], ["--relu-dropout", "0.3"],
                                   ["--decoder-layers", "6", "--decoder-layerdrop", "0.5"]])
def test_dropout_flags_change_training_forwards_only(flags):
    x = tokens()
    none = model(*SMALL, "--dropout", "0")  # the default --dropout is 0.1, the others 0
    torch.manual_seed(5)
    torch.testing.assert_close(none.train()(x), none.eval()(x))  # no dropout: training equals evaluation
    m = model(*SMALL, "--dropout", "0", *flags)
    torch.manual_seed(5)
    assert not torch.allclose(m.train()(x), m.eval()(x))


ADAPTIVE = [*SMALL, "--dropout", "0", "--adaptive-softmax-cutoff", "8,16"]


def _shapes(module):
    return {name: tuple(p.shape) for name, p in module.named_parameters()}


@pytest.mark.flag_effect("--adaptive-softmax-cutoff", "--adaptive-softmax-factor")
def test_adaptive_softmax_bands():
    # head: 8 words + 2 clusters; tail i projects 16 -> 16 // factor**(i+1), then to its 8 words
    assert _shapes(model(*ADAPTIVE).adaptive_softmax) == {
        "head.weight": (10, 16), "tail_proj.0.weight": (4, 16), "tail_proj.1.weight": (1, 16),
        "tail_out.0.weight": (8, 4), "tail_out.1.weight": (8, 1)}
    m = model(*ADAPTIVE, "--adaptive-softmax-factor", "2")
    assert [p.weight.shape[0] for p in m.adaptive_softmax.tail_proj] == [8, 4]
    assert m.output_projection is None
    log_probs = m.eval()(tokens())
    assert log_probs.shape == (2, 6, V)
    torch.testing.assert_close(log_probs.exp().sum(-1), torch.ones(2, 6))


@pytest.mark.flag_effect("--adaptive-softmax-dropout")
def test_adaptive_softmax_dropout_changes_training_forwards_only():
    x, target = tokens(), tokens(seed=1)
    for flags, differs in (((), False), (("--adaptive-softmax-dropout", "0.3"), True)):
        m = model(*ADAPTIVE, *flags)
        torch.manual_seed(5)
        train_head = m.train()(x, target=target)[0][0]
        assert torch.allclose(train_head, m.eval()(x, target=target)[0][0]) != differs


@pytest.mark.flag_effect("--adaptive-input", "--adaptive-input-cutoff", "--adaptive-input-factor")
def test_adaptive_input_bands():
    m = model(*SMALL, "--adaptive-input", "--adaptive-input-cutoff", "8,16", "--adaptive-input-factor", "2")
    # band i: Embedding(8 words, 16 // 2**i), then Linear to the embed dim 16
    assert _shapes(m.embed_tokens) == {
        "embeddings.0.0.weight": (8, 16), "embeddings.0.1.weight": (16, 16),
        "embeddings.1.0.weight": (8, 8), "embeddings.1.1.weight": (16, 8),
        "embeddings.2.0.weight": (8, 4), "embeddings.2.1.weight": (16, 4)}
    x = torch.tensor([[2, 9, 17]])  # one word of each band
    band = m.embed_tokens.embeddings
    expected = torch.stack([band[0](torch.tensor(2)), band[1](torch.tensor(1)), band[2](torch.tensor(1))])
    torch.testing.assert_close(m.embed_tokens(x)[0], expected)


@pytest.mark.flag_effect("--tie-adaptive-weights", "--tie-adaptive-proj")
def test_tied_adaptive_softmax_owns_only_what_is_not_tied():
    tied = [*ADAPTIVE, "--adaptive-input", "--adaptive-input-cutoff", "8,16", "--tie-adaptive-weights"]
    # tied: the word matrices are the input bands; only the cluster rows and tail projections are its own
    assert set(_shapes(model(*tied).adaptive_softmax)) == {
        "class_proj.weight", "tail_proj.0.weight", "tail_proj.1.weight"}
    m = model(*tied, "--tie-adaptive-proj")
    assert set(_shapes(m.adaptive_softmax)) == {"class_proj.weight"}
    m.eval()
    x = tokens()
    before = m(x)
    with torch.no_grad():
        m.embed_tokens.embeddings[2][1].weight.mul_(2.0)  # band 2's projection is also the last tail's
    assert not torch.allclose(before[..., 16:], m(x)[..., 16:])
