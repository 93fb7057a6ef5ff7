"""transformer_lm: shapes, causality, variants, positions, init, reference math."""
import ast
import dataclasses
import math

import pytest
import torch

from shardtrain.core.errors import ConfigError
from shardtrain.models.positions import make_positions, sinusoidal_table
from shardtrain.models.transformer_lm import TransformerLanguageModel, TransformerLanguageModelConfig

VOCAB, PAD, MAX_POS = 19, 1, 24


def tiny_cfg(**overrides) -> TransformerLanguageModelConfig:
    values = dict(
        decoder_embed_dim=16, decoder_input_dim=16, decoder_output_dim=16,
        decoder_ffn_embed_dim=24, decoder_layers=2, decoder_attention_heads=4,
    )
    values.update(overrides)
    return TransformerLanguageModelConfig(**values)


def tiny_model(seed=0, **overrides) -> TransformerLanguageModel:
    torch.manual_seed(seed)
    return TransformerLanguageModel(tiny_cfg(**overrides), VOCAB, PAD, MAX_POS)


def tokens(batch=2, length=10, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(PAD + 1, VOCAB, (batch, length), generator=gen)


VARIANTS = [
    dict(),
    dict(decoder_normalize_before=True),
    dict(decoder_normalize_before=True, decoder_learned_pos=True, activation_fn="gelu"),
    dict(decoder_learned_pos=True, layernorm_embedding=True, no_scale_embedding=True),
    dict(decoder_normalize_before=True, no_decoder_final_norm=True, activation_fn="gelu_accurate"),
    dict(no_token_positional_embeddings=True, activation_fn="silu"),
    dict(decoder_input_dim=12, decoder_output_dim=20, decoder_normalize_before=True),
    dict(decoder_input_dim=12, decoder_output_dim=12, share_decoder_input_output_embed=True),
    dict(decoder_embed_dim=15, decoder_attention_heads=3, decoder_input_dim=15, decoder_output_dim=15),
]


def test_config_defaults_are_fairseqs():
    cfg = TransformerLanguageModelConfig()
    expected = dict(
        activation_fn="relu", dropout=0.1, attention_dropout=0.0, activation_dropout=0.0, relu_dropout=0.0,
        decoder_embed_dim=512, decoder_output_dim=None, decoder_input_dim=None,  # None: follow embed dim
        decoder_ffn_embed_dim=2048, decoder_layers=6, decoder_attention_heads=8,
        decoder_normalize_before=False, no_decoder_final_norm=False,
        share_decoder_input_output_embed=False, decoder_learned_pos=False,
        no_scale_embedding=False, layernorm_embedding=False,
        no_token_positional_embeddings=False, max_target_positions=None,
        # fairseq's adaptive and layerdrop flags (models/transformer_lm.py, base_lm_architecture)
        adaptive_softmax_cutoff=None, adaptive_softmax_dropout=0.0, adaptive_softmax_factor=4.0,
        adaptive_input=False, adaptive_input_factor=4.0, adaptive_input_cutoff=None,
        tie_adaptive_weights=False, tie_adaptive_proj=False, decoder_layerdrop=0.0,
    )
    assert dataclasses.asdict(cfg) == expected
    for f in dataclasses.fields(cfg):
        assert f.metadata.get("help"), f.name


@pytest.mark.parametrize("overrides", VARIANTS)
def test_variants_shapes_backward_and_causality(overrides):
    model = tiny_model(**overrides)
    x = tokens()
    logits = model(x)
    assert logits.shape == (2, 10, VOCAB) and logits.dtype == torch.float32
    logits.sum().backward()
    for name, param in model.named_parameters():
        assert param.grad is not None and torch.isfinite(param.grad).all(), name

    model.eval()
    changed = x.clone()
    changed[:, 6] = (changed[:, 6] - PAD) % (VOCAB - PAD - 1) + PAD + 1  # another non-pad token
    assert not torch.equal(changed, x)
    before, after = model(x), model(changed)
    torch.testing.assert_close(before[:, :6], after[:, :6], rtol=0, atol=0)
    assert not torch.allclose(before[:, 6:], after[:, 6:])


@pytest.mark.parametrize(
    "normalize_before,no_final,has_final",
    [(False, False, False), (False, True, False), (True, False, True), (True, True, False)],
)
def test_final_layer_norm_only_for_pre_norm(normalize_before, no_final, has_final):
    model = tiny_model(decoder_normalize_before=normalize_before, no_decoder_final_norm=no_final)
    assert (model.layer_norm is not None) == has_final


def test_projections_exist_only_when_dims_differ():
    same = tiny_model()
    assert same.project_in_dim is None and same.project_out_dim is None
    other = tiny_model(decoder_input_dim=12, decoder_output_dim=20)
    default = tiny_model(decoder_input_dim=None, decoder_output_dim=None)
    assert default.project_in_dim is None and default.project_out_dim is None  # follow the embed dim
    assert other.project_in_dim.weight.shape == (16, 12)
    assert other.project_out_dim.weight.shape == (20, 16)
    assert other.output_projection.weight.shape == (VOCAB, 20)


def test_tied_embeddings_share_storage():
    untied, tied = tiny_model(), tiny_model(share_decoder_input_output_embed=True)
    assert tied.output_projection is None
    assert tied.output_weight().data_ptr() == tied.embed_tokens.weight.data_ptr()
    assert sum(p.numel() for p in untied.parameters()) - sum(p.numel() for p in tied.parameters()) == VOCAB * 16
    tied.eval()
    x = tokens()
    torch.testing.assert_close(tied(x), tied.extract_features(x) @ tied.embed_tokens.weight.T)
    # Token 0 never occurs in x, so its row can only get gradient through the
    # output side of the shared matrix.
    assert not (x == 0).any()
    tied(x)[..., 0].sum().backward()
    assert tied.embed_tokens.weight.grad[0].abs().sum() > 0


def test_sinusoidal_table_matches_formula():
    for dim in (8, 9):
        table = sinusoidal_table(6, dim, padding_idx=PAD)
        half = dim // 2
        for pos in range(6):
            for i in range(half):
                freq = math.exp(-i * math.log(10000) / (half - 1))
                want_sin = 0.0 if pos == PAD else math.sin(pos * freq)
                want_cos = 0.0 if pos == PAD else math.cos(pos * freq)
                assert table[pos, i].item() == pytest.approx(want_sin, abs=1e-6)
                assert table[pos, half + i].item() == pytest.approx(want_cos, abs=1e-6)
            if dim % 2:
                assert table[pos, -1].item() == 0.0


def test_positions_skip_padding():
    x = torch.tensor([[5, 6, PAD, 7], [PAD, PAD, 5, 6]])
    assert make_positions(x, PAD).tolist() == [[2, 3, 1, 4], [1, 1, 2, 3]]
    assert make_positions(x, PAD, offset=3).tolist() == [[5, 6, 1, 7], [1, 1, 5, 6]]


def test_sinusoidal_buffer_is_not_persistent():
    model = tiny_model()
    assert not any("embed_positions" in key for key in model.state_dict())
    assert model.embed_positions.weights.shape == (MAX_POS + PAD + 1, 16)
    learned = tiny_model(decoder_learned_pos=True)
    assert learned.state_dict()["embed_positions.weight"].shape == (MAX_POS + PAD + 1, 16)


def _manual_logits(model, cfg, x):
    """The fairseq decoder written out with plain tensor math."""
    def layer_norm(h, norm):
        mean, var = h.mean(-1, keepdim=True), h.var(-1, unbiased=False, keepdim=True)
        return (h - mean) / torch.sqrt(var + 1e-5) * norm.weight + norm.bias

    h = math.sqrt(cfg.decoder_embed_dim) * model.embed_tokens.weight[x]
    positions = torch.tensor([[PAD + 1 + t for t in range(x.size(1))]] * x.size(0))
    if cfg.decoder_learned_pos:
        h = h + model.embed_positions.weight[positions]
    else:
        h = h + sinusoidal_table(MAX_POS + PAD + 1, cfg.decoder_embed_dim, PAD)[positions]
    heads, length, dim = cfg.decoder_attention_heads, x.size(1), cfg.decoder_embed_dim
    head_dim = cfg.decoder_embed_dim // heads
    future = torch.triu(torch.ones(length, length, dtype=torch.bool), diagonal=1)
    for block in model.blocks:
        def attention(a):
            w, b = block.self_attn.qkv_proj.weight, block.self_attn.qkv_proj.bias
            rows = [slice(i * dim, (i + 1) * dim) for i in range(3)]  # q, k, v stacked
            q, k, v = ((a @ w[r].T + b[r]).view(x.size(0), length, heads, head_dim).transpose(1, 2)
                       for r in rows)
            scores = (q * head_dim**-0.5) @ k.transpose(-1, -2)
            probs = torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1)
            out = (probs @ v).transpose(1, 2).reshape(x.size(0), length, -1)
            return out @ block.self_attn.out_proj.weight.T + block.self_attn.out_proj.bias

        def ffn(a):
            a = torch.relu(a @ block.fc1.weight.T + block.fc1.bias)
            return a @ block.fc2.weight.T + block.fc2.bias

        if cfg.decoder_normalize_before:
            h = h + attention(layer_norm(h, block.self_attn_layer_norm))
            h = h + ffn(layer_norm(h, block.final_layer_norm))
        else:
            h = layer_norm(h + attention(h), block.self_attn_layer_norm)
            h = layer_norm(h + ffn(h), block.final_layer_norm)
    if model.layer_norm is not None:
        h = layer_norm(h, model.layer_norm)
    return h @ model.output_projection.weight.T


@pytest.mark.parametrize("pre_norm,learned", [(False, False), (True, True)])
def test_matches_written_out_fairseq_math(pre_norm, learned):
    cfg = tiny_cfg(decoder_normalize_before=pre_norm, decoder_learned_pos=learned)
    torch.manual_seed(0)
    model = TransformerLanguageModel(cfg, VOCAB, PAD, MAX_POS).eval()
    with torch.no_grad():  # make LayerNorm affine params and biases matter
        for param in model.parameters():
            param.add_(0.1 * torch.randn_like(param))
    x = tokens(length=9)
    torch.testing.assert_close(model(x), _manual_logits(model, cfg, x), rtol=1e-4, atol=1e-5)


def _init_variant_models(overrides):
    cfg = tiny_cfg(**overrides)
    eager = TransformerLanguageModel(cfg, VOCAB, PAD, MAX_POS)
    torch.manual_seed(123)
    eager.init_weights()
    with torch.device("meta"):
        meta = TransformerLanguageModel(cfg, VOCAB, PAD, MAX_POS)
    assert all(p.is_meta for p in meta.parameters())
    meta.to_empty(device="cpu")
    with torch.no_grad():  # whatever init_weights misses stays NaN
        for tensor in list(meta.parameters()) + list(meta.buffers()):
            tensor.fill_(float("nan"))
    torch.manual_seed(123)
    meta.init_weights()
    return eager, meta


@pytest.mark.parametrize("overrides", [
    dict(),
    dict(decoder_learned_pos=True, decoder_normalize_before=True, layernorm_embedding=True),
    dict(decoder_input_dim=12, decoder_output_dim=20, decoder_normalize_before=True),
    dict(decoder_learned_pos=True, share_decoder_input_output_embed=True),
])
def test_meta_build_then_init_weights_equals_eager(overrides):
    eager, meta = _init_variant_models(overrides)
    eager_tensors = dict(eager.named_parameters()) | dict(eager.named_buffers())
    meta_tensors = dict(meta.named_parameters()) | dict(meta.named_buffers())
    assert eager_tensors.keys() == meta_tensors.keys()
    for name, tensor in meta_tensors.items():
        assert torch.isfinite(tensor).all(), f"{name} left uninitialised"
        torch.testing.assert_close(tensor, eager_tensors[name], rtol=0, atol=0, msg=name)
    assert meta.output_weight().data_ptr() == (
        meta.embed_tokens.weight.data_ptr() if meta.output_projection is None
        else meta.output_projection.weight.data_ptr()
    )


def test_init_weights_follows_fairseq_recipe():
    torch.manual_seed(0)
    model = TransformerLanguageModel(
        tiny_cfg(decoder_embed_dim=64, decoder_input_dim=64, decoder_output_dim=64,
                 decoder_learned_pos=True, decoder_normalize_before=True),
        500, PAD, 200,
    )
    emb = model.embed_tokens.weight
    assert emb[PAD].abs().sum() == 0 and model.embed_positions.weight[PAD].abs().sum() == 0
    assert emb.std().item() == pytest.approx(64**-0.5, rel=0.05)
    qkv = model.blocks[0].self_attn.qkv_proj.weight
    bound = math.sqrt(6 / 128) / math.sqrt(2)
    assert qkv.abs().max() <= bound and qkv.abs().max() > 0.95 * bound
    for block in model.blocks:
        for bias in (block.self_attn.qkv_proj.bias, block.self_attn.out_proj.bias, block.fc1.bias):
            assert bias.abs().sum() == 0
        assert torch.equal(block.final_layer_norm.weight, torch.ones(64))


def test_config_errors_name_the_flags():
    with pytest.raises(ConfigError, match="--decoder-attention-heads"):
        tiny_model(decoder_attention_heads=5)
    with pytest.raises(ConfigError, match="--decoder-output-dim"):
        tiny_model(decoder_input_dim=12, share_decoder_input_output_embed=True)
    with pytest.raises(ConfigError, match="--dropout"):
        tiny_model(dropout=1.5)
    with pytest.raises(ConfigError, match="--max-target-positions"):
        tiny_model()(tokens(length=MAX_POS + 1))


class _Dictionary:
    def __len__(self):
        return 23

    def pad(self):
        return 3


class _Task:
    dictionary = _Dictionary()

    def max_positions(self):
        return 40


def test_build_model_reads_the_task():
    model = TransformerLanguageModel.build_model(tiny_cfg(), _Task())
    assert model.embed_tokens.weight.shape == (23, 16) and model.padding_idx == 3
    assert model.max_positions == 40
    assert model.embed_positions.weights.shape == (40 + 3 + 1, 16)
    explicit = TransformerLanguageModel.build_model(tiny_cfg(max_target_positions=8), _Task())
    assert explicit.max_positions == 8


def test_model_files_import_nothing_distributed():
    import shardtrain.models.positions as positions
    import shardtrain.models.transformer_lm.layer as layer
    import shardtrain.models.transformer_lm.model as lm

    for module in (lm, layer, positions):
        with open(module.__file__) as source:
            tree = ast.parse(source.read())
        imported = [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
                    for alias in node.names]
        imported += [node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]
        assert imported and not any("distributed" in name for name in imported), module.__name__


