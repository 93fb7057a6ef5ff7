"""The ``llama`` family's config: Llama 3 and Qwen3 decoders (RMSNorm, rotary positions, SwiGLU, grouped-query
attention; Qwen3's RMSNorm on q and k). Flag names follow fairseq's where the idea is fairseq's
(``--decoder-layers``, ``--decoder-embed-dim``, ``--share-decoder-input-output-embed``), so a user of both
families types the same flag for the same thing; the rest are named as Meta's and Hugging Face's configs name
them."""
import dataclasses
from typing import Optional

from shardtrain.core.errors import ConfigError
from shardtrain.core.fields import field


@dataclasses.dataclass
class LlamaConfig:
    decoder_embed_dim: int = field(4096, help="model width (Hugging Face's hidden_size)")
    decoder_layers: int = field(32, help="number of decoder blocks")
    decoder_attention_heads: int = field(32, help="query heads")
    decoder_kv_heads: Optional[int] = field(
        None, help="key/value heads for grouped-query attention; must divide the query heads (default: as many)")
    decoder_head_dim: Optional[int] = field(
        None, help="width of one head (Qwen3 sets it; default: --decoder-embed-dim / --decoder-attention-heads)")
    decoder_ffn_embed_dim: Optional[int] = field(
        None, help="SwiGLU hidden width, given outright (default: Meta's rule from --ffn-multiple-of and "
                   "--ffn-dim-multiplier)")
    ffn_multiple_of: int = field(256, help="Meta's rule: the SwiGLU width is rounded up to a multiple of this")
    ffn_dim_multiplier: Optional[float] = field(None, help="Meta's rule: scales the SwiGLU width (2/3 x 4 x width)")
    rms_norm_eps: float = field(1e-5, help="RMSNorm epsilon (Llama 3: 1e-5; Qwen3 and Hugging Face's default: 1e-6)")
    rope_theta: float = field(500000.0, help="rotary base frequency")
    rope_factor: Optional[float] = field(
        None, help="Llama 3 frequency scaling factor (8 for Llama 3.1, 32 for Llama 3.2); none when unset")
    rope_low_freq_factor: float = field(1.0, help="Llama 3 scaling: low-frequency factor")
    rope_high_freq_factor: float = field(4.0, help="Llama 3 scaling: high-frequency factor")
    rope_original_max_positions: int = field(8192, help="Llama 3 scaling: the context length trained before it")
    qk_norm: bool = field(False, help="RMSNorm on each head's queries and keys before the rotation (Qwen3)")
    share_decoder_input_output_embed: bool = field(False, help="share decoder input and output embeddings")
    max_target_positions: Optional[int] = field(
        None, help="longest sequence the model takes (default: --tokens-per-sample)")
    depth_init: bool = field(
        True, help="torchtitan's init: output projections of block k drawn with std 0.02/sqrt(2(k+1)) (else "
                   "0.02/sqrt(2 x layers) for all)")


def kv_heads(cfg) -> int:
    return cfg.decoder_kv_heads or cfg.decoder_attention_heads


def head_dim(cfg) -> int:
    return cfg.decoder_head_dim or cfg.decoder_embed_dim // cfg.decoder_attention_heads


def ffn_dim(cfg) -> int:
    """The SwiGLU width: given outright, else Meta's rule (llama/model.py of Llama 3): 2/3 of 4 x width, times
    the multiplier, rounded up to a multiple of ``ffn_multiple_of``."""
    if cfg.decoder_ffn_embed_dim is not None:
        return cfg.decoder_ffn_embed_dim
    hidden = int(2 * 4 * cfg.decoder_embed_dim / 3)
    if cfg.ffn_dim_multiplier is not None:
        hidden = int(cfg.ffn_dim_multiplier * hidden)
    multiple = cfg.ffn_multiple_of
    return multiple * ((hidden + multiple - 1) // multiple)


def check_config(cfg, vocab_size: int, max_positions: Optional[int]) -> None:
    """Refuse settings the model cannot be built with, naming the flags (all at once)."""
    heads, kv = cfg.decoder_attention_heads, kv_heads(cfg)
    checks = [
        (cfg.decoder_embed_dim > 0, f"--decoder-embed-dim must be positive (got {cfg.decoder_embed_dim})."),
        (cfg.decoder_layers >= 0, f"--decoder-layers must be >= 0 (got {cfg.decoder_layers})."),
        (heads > 0 and kv > 0, f"--decoder-attention-heads ({heads}) and --decoder-kv-heads ({kv}) must be "
                               "positive."),
        (kv <= 0 or heads % kv == 0,
         f"--decoder-attention-heads ({heads}) must be a multiple of --decoder-kv-heads ({kv}): each key/value "
         "head serves a whole group of query heads. Change one of them."),
        (cfg.decoder_head_dim is not None or heads <= 0 or cfg.decoder_embed_dim % heads == 0,
         f"--decoder-embed-dim ({cfg.decoder_embed_dim}) is not a multiple of --decoder-attention-heads ({heads}); "
         "change one of them or give --decoder-head-dim."),
        (heads <= 0 or head_dim(cfg) > 0 and head_dim(cfg) % 2 == 0,
         f"the head width ({head_dim(cfg) if heads > 0 else '?'}) must be even and positive: rotary positions "
         "turn pairs of its dimensions. Give an even --decoder-head-dim."),
        (cfg.rope_factor is None or cfg.rope_factor >= 1,
         f"--rope-factor must be at least 1 (got {cfg.rope_factor}): it stretches the context, never shrinks it."),
        (cfg.rope_factor is None or cfg.rope_high_freq_factor > cfg.rope_low_freq_factor,
         f"--rope-high-freq-factor ({cfg.rope_high_freq_factor}) must exceed --rope-low-freq-factor "
         f"({cfg.rope_low_freq_factor})."),
        (cfg.rope_theta > 0, f"--rope-theta must be positive (got {cfg.rope_theta})."),
        (cfg.rms_norm_eps > 0, f"--rms-norm-eps must be positive (got {cfg.rms_norm_eps})."),
        (cfg.ffn_multiple_of > 0, f"--ffn-multiple-of must be positive (got {cfg.ffn_multiple_of})."),
        (ffn_dim(cfg) > 0, f"the SwiGLU width must be positive (got {ffn_dim(cfg)}); set --decoder-ffn-embed-dim."),
        (max_positions is None or max_positions > 0,
         f"--max-target-positions must be positive (got {max_positions}); set it or --tokens-per-sample."),
        (vocab_size > 0, "the dictionary is empty; rebuild the data-bin."),
    ]
    problems = [message for ok, message in checks if not ok]
    if problems:
        raise ConfigError("Invalid llama settings: " + " ".join(problems))
