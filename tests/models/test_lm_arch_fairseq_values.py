"""Every transformer_lm architecture fairseq 0.12.2 registers resolves to fairseq's values.

Expected values are written out by hand from fairseq/models/transformer_lm.py: each arch
function sets its own values, the Baevski presets then call ``transformer_lm_big``, and
``base_lm_architecture`` fills the rest (and forces ``decoder_normalize_before``).
"""
import dataclasses

import pytest

from shardtrain.models import ARCH_REGISTRY
from shardtrain.models.transformer_lm import TransformerLanguageModelConfig

BASE = dict(  # base_lm_architecture's defaults (plus the dataclass's activation_dropout 0)
    decoder_layers=6, decoder_embed_dim=512, decoder_ffn_embed_dim=2048, decoder_attention_heads=8,
    dropout=0.1, attention_dropout=0.0, activation_dropout=0.0, activation_fn="relu",
    decoder_learned_pos=False, share_decoder_input_output_embed=False, decoder_normalize_before=True,
    no_decoder_final_norm=False, adaptive_input=False, adaptive_input_cutoff=None, adaptive_input_factor=4,
    adaptive_softmax_cutoff=None, adaptive_softmax_dropout=0, adaptive_softmax_factor=4,
    tie_adaptive_weights=False, tie_adaptive_proj=False, decoder_layerdrop=0, no_scale_embedding=False,
    layernorm_embedding=False, no_token_positional_embeddings=False,
)
BIG = dict(decoder_layers=12, decoder_embed_dim=1024, decoder_ffn_embed_dim=4096, decoder_attention_heads=16)
WIKI103 = dict(BIG, decoder_layers=16, decoder_attention_heads=8, dropout=0.3, adaptive_input=True,
               tie_adaptive_weights=True, adaptive_input_cutoff="20000,60000",
               adaptive_softmax_cutoff="20000,60000", adaptive_softmax_dropout=0.2, attention_dropout=0.1,
               activation_dropout=0.1, no_decoder_final_norm=True, tie_adaptive_proj=True)
GBW = dict(BIG, decoder_embed_dim=512, dropout=0.1, attention_dropout=0.1, no_decoder_final_norm=True)


def gpt(embed, ffn, layers, heads):
    return dict(decoder_embed_dim=embed, decoder_ffn_embed_dim=ffn, decoder_layers=layers,
                decoder_attention_heads=heads, dropout=0.1, attention_dropout=0.1, activation_fn="gelu")


def gpt3(layers, embed, heads):
    return dict(decoder_layers=layers, decoder_embed_dim=embed, decoder_attention_heads=heads,
                decoder_ffn_embed_dim=4 * embed, decoder_learned_pos=True, dropout=0.0, attention_dropout=0.0,
                activation_fn="gelu", share_decoder_input_output_embed=True)


FAIRSEQ = {
    "transformer_lm": {},
    "transformer_lm_big": BIG,
    "transformer_lm_wiki103": WIKI103,
    "transformer_lm_baevski_wiki103": WIKI103,
    "transformer_lm_gbw": GBW,
    "transformer_lm_baevski_gbw": GBW,
    "transformer_lm_gpt": gpt(768, 3072, 12, 12),
    "transformer_lm_gpt2_small": gpt(1024, 4096, 24, 16),
    "transformer_lm_gpt2_tiny": gpt(64, 64, 2, 1),
    "transformer_lm_gpt2_medium": gpt(1280, 5120, 36, 20),
    "transformer_lm_gpt2_big": gpt(1600, 6400, 48, 25),
    "transformer_lm_gpt2_big_wide": gpt(2048, 8192, 24, 32),
    "transformer_lm_gpt2_bigger": gpt(2048, 8192, 48, 32),
    "transformer_lm_gpt3_small": gpt3(12, 768, 12),
    "transformer_lm_gpt3_medium": gpt3(24, 1024, 16),
    "transformer_lm_gpt3_large": gpt3(24, 1536, 16),
    "transformer_lm_gpt3_xl": gpt3(24, 2048, 32),
    "transformer_lm_gpt3_2_7": gpt3(32, 2560, 32),
    "transformer_lm_gpt3_6_7": gpt3(32, 4096, 32),
    "transformer_lm_gpt3_13": gpt3(40, 5120, 40),
    "transformer_lm_gpt3_175": gpt3(96, 12288, 96),
}


def test_we_register_exactly_fairseqs_transformer_lm_archs():
    # named transformer_lm*: other tests register architectures of their own for the same model
    ours = {name for name in ARCH_REGISTRY.names()
            if name.startswith("transformer_lm") and ARCH_REGISTRY.get(name).obj.model == "transformer_lm"}
    assert ours == set(FAIRSEQ)


@pytest.mark.parametrize("name", sorted(FAIRSEQ))
def test_resolved_config_equals_fairseqs(name):
    values = ARCH_REGISTRY.get(name).obj.values()
    # the plain model name keeps the dataclass defaults: fairseq's base_lm_architecture forces pre-norm,
    # ours leaves --decoder-normalize-before to the user (see architectures.py)
    expected = dict(BASE, **FAIRSEQ[name]) if name != "transformer_lm" else dict(BASE, decoder_normalize_before=False)
    resolved = dataclasses.asdict(TransformerLanguageModelConfig(**values))
    assert {k: resolved[k] for k in expected} == expected


def test_wiki103_model_has_the_papers_247m_parameters():
    import torch

    from shardtrain.models.transformer_lm import TransformerLanguageModel

    values = ARCH_REGISTRY.get("transformer_lm_wiki103").obj.values()
    with torch.device("meta"):  # fairseq's wiki103 dictionary: 267,744 symbols; 3,072-token samples
        model = TransformerLanguageModel(TransformerLanguageModelConfig(**values), 267744, 1, 3072)
    total = sum(p.numel() for p in model.parameters())  # shared (tied) parameters count once
    # Baevski & Auli (2019), Table 1: adaptive inputs, tied, 247M parameters
    assert all(p.requires_grad for p in model.parameters()) and 246_500_000 < total < 247_500_000
