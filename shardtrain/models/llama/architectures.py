"""The ``llama`` family's presets: the published shapes (each model's Hugging Face config.json; widths by Meta's
rule where Meta gives the rule, tests/models/test_llama_presets.py holds each to the published width)."""
from typing import Dict

from shardtrain.models.registry import register_model_architecture


def _llama3(dim: int, layers: int, heads: int, multiplier: float, multiple_of: int, rope_factor: float,
            tied: bool) -> Dict:
    return {"decoder_embed_dim": dim, "decoder_layers": layers, "decoder_attention_heads": heads,
            "decoder_kv_heads": 8, "ffn_dim_multiplier": multiplier, "ffn_multiple_of": multiple_of,
            "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "rope_factor": rope_factor, "rope_low_freq_factor": 1.0,
            "rope_high_freq_factor": 4.0, "rope_original_max_positions": 8192,
            "share_decoder_input_output_embed": tied, "max_target_positions": 131072}


def _qwen3(dim: int, layers: int, heads: int, ffn: int, tied: bool) -> Dict:
    return {"decoder_embed_dim": dim, "decoder_layers": layers, "decoder_attention_heads": heads,
            "decoder_kv_heads": 8, "decoder_head_dim": 128, "decoder_ffn_embed_dim": ffn, "rms_norm_eps": 1e-6,
            "rope_theta": 1000000.0, "rope_factor": None, "qk_norm": True, "share_decoder_input_output_embed": tied,
            "max_target_positions": 40960}


@register_model_architecture("llama", "llama3_debug")
def llama3_debug():
    """torchtitan's debug model: width 256, 6 blocks, 16 heads, theta 500000, no scaling (SwiGLU 768)."""
    return {"decoder_embed_dim": 256, "decoder_layers": 6, "decoder_attention_heads": 16, "rope_theta": 500000.0,
            "rms_norm_eps": 1e-5}


@register_model_architecture("llama", "llama3_2_1b")
def llama3_2_1b():  # RoPE factor 32 (Meta's and HF's config; torchtitan's 1B flavour says 8)
    return _llama3(2048, 16, 32, 1.5, 256, 32.0, tied=True)


@register_model_architecture("llama", "llama3_2_3b")
def llama3_2_3b():
    return _llama3(3072, 28, 24, 1.0, 256, 32.0, tied=True)


@register_model_architecture("llama", "llama3_1_8b")
def llama3_1_8b():
    return _llama3(4096, 32, 32, 1.3, 1024, 8.0, tied=False)


@register_model_architecture("llama", "llama3_1_70b")
def llama3_1_70b():
    return _llama3(8192, 80, 64, 1.3, 4096, 8.0, tied=False)


@register_model_architecture("llama", "llama3_1_405b")
def llama3_1_405b():
    return _llama3(16384, 126, 128, 1.2, 4096, 8.0, tied=False)


@register_model_architecture("llama", "qwen3_0_6b")
def qwen3_0_6b():
    return _qwen3(1024, 28, 16, 3072, tied=True)


@register_model_architecture("llama", "qwen3_1_7b")
def qwen3_1_7b():
    return _qwen3(2048, 28, 16, 6144, tied=True)


@register_model_architecture("llama", "qwen3_4b")
def qwen3_4b():
    return _qwen3(2560, 36, 32, 9728, tied=True)


@register_model_architecture("llama", "qwen3_8b")
def qwen3_8b():
    return _qwen3(4096, 36, 32, 12288, tied=False)
