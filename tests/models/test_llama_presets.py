"""The ``llama`` presets have the published shapes (each model's Hugging Face config.json and parameter count,
written out here), Meta's SwiGLU width rule gives the published widths, and flops_per_token counts
grouped-query attention and SwiGLU as its formula says."""
import dataclasses

import pytest
import torch

from shardtrain.models import ARCH_REGISTRY
from shardtrain.models.llama import LlamaConfig, LlamaModel
from shardtrain.models.llama.config import ffn_dim, head_dim, kv_heads

LLAMA3_VOCAB, QWEN3_VOCAB = 128256, 151936

# preset: (width, layers, heads, kv heads, head width, SwiGLU width, tied, rope factor, eps, theta, qk norm,
#          vocabulary, parameters as published)
PUBLISHED = {
    "llama3_2_1b": (2048, 16, 32, 8, 64, 8192, True, 32.0, 1e-5, 500000.0, False, LLAMA3_VOCAB, 1_235_814_400),
    "llama3_2_3b": (3072, 28, 24, 8, 128, 8192, True, 32.0, 1e-5, 500000.0, False, LLAMA3_VOCAB, 3_212_749_824),
    "llama3_1_8b": (4096, 32, 32, 8, 128, 14336, False, 8.0, 1e-5, 500000.0, False, LLAMA3_VOCAB, 8_030_261_248),
    "llama3_1_70b": (8192, 80, 64, 8, 128, 28672, False, 8.0, 1e-5, 500000.0, False, LLAMA3_VOCAB,
                     70_553_706_496),
    "llama3_1_405b": (16384, 126, 128, 8, 128, 53248, False, 8.0, 1e-5, 500000.0, False, LLAMA3_VOCAB,
                      405_853_388_800),
    "qwen3_0_6b": (1024, 28, 16, 8, 128, 3072, True, None, 1e-6, 1e6, True, QWEN3_VOCAB, 596_049_920),
    # the model card: 1.7B, 1.4B without the embedding (the hub lists 2.03B: its files store lm_head apart)
    "qwen3_1_7b": (2048, 28, 16, 8, 128, 6144, True, None, 1e-6, 1e6, True, QWEN3_VOCAB, 1_720_574_976),
    "qwen3_4b": (2560, 36, 32, 8, 128, 9728, True, None, 1e-6, 1e6, True, QWEN3_VOCAB, 4_022_468_096),
    "qwen3_8b": (4096, 36, 32, 8, 128, 12288, False, None, 1e-6, 1e6, True, QWEN3_VOCAB, 8_190_735_360),
}


def _config(arch: str) -> LlamaConfig:
    entry = ARCH_REGISTRY.get(arch).obj
    assert entry.model == "llama"
    return dataclasses.replace(LlamaConfig(), **entry.values())


@pytest.mark.parametrize("arch", sorted(PUBLISHED))
def test_each_preset_has_the_published_shape_and_parameter_count(arch):
    width, layers, heads, kv, head, ffn, tied, factor, eps, theta, qk_norm, vocab, params = PUBLISHED[arch]
    cfg = _config(arch)
    assert (cfg.decoder_embed_dim, cfg.decoder_layers, cfg.decoder_attention_heads, kv_heads(cfg), head_dim(cfg),
            ffn_dim(cfg)) == (width, layers, heads, kv, head, ffn)
    assert (cfg.share_decoder_input_output_embed, cfg.rope_factor, cfg.rms_norm_eps, cfg.rope_theta,
            cfg.qk_norm) == (tied, factor, eps, theta, qk_norm)
    with torch.device("meta"):
        model = LlamaModel(cfg, vocab, cfg.max_target_positions)
    assert sum(p.numel() for p in model.parameters()) == params


def test_the_debug_preset_is_torchtitans():
    cfg = _config("llama3_debug")
    assert (cfg.decoder_embed_dim, cfg.decoder_layers, cfg.decoder_attention_heads, kv_heads(cfg),
            ffn_dim(cfg), cfg.rope_theta, cfg.rope_factor) == (256, 6, 16, 16, 768, 500000.0, None)


def test_a_width_given_outright_wins_over_the_rule():
    cfg = dataclasses.replace(_config("llama3_1_8b"), decoder_ffn_embed_dim=1000)
    assert ffn_dim(cfg) == 1000


def _tiny(**values) -> LlamaModel:
    cfg = dataclasses.replace(LlamaConfig(), decoder_embed_dim=32, decoder_layers=2, decoder_attention_heads=4,
                              decoder_kv_heads=2, decoder_ffn_embed_dim=80, **values)
    return LlamaModel(cfg, 96, 128)


def test_flops_per_token_counts_gqa_swiglu_and_the_query_width():
    # 6 x (weights a token meets) + 12 x layers x (heads x head width) x seq_len (models/flops.py)
    # per block: q 32x32, k and v 32x16 each (2 kv heads of 8), o 32x32, gate/up/down 3 x 32x80 = 10,752;
    # 2 blocks and the 96x32 output projection: 24,576 weights
    assert _tiny().flops_per_token(64) == 6 * 24_576 + 12 * 2 * 32 * 64
    assert _tiny(share_decoder_input_output_embed=True).flops_per_token(64) == 6 * 24_576 + 12 * 2 * 32 * 64
    # head width 16 (Qwen3's way): q 32x64, k and v 32x32, o 64x32, SwiGLU 3 x 32x80 -> 13,824 a block;
    # attention over a query width of 64
    assert _tiny(decoder_head_dim=16).flops_per_token(64) == 6 * (2 * 13_824 + 3072) + 12 * 2 * 64 * 64
