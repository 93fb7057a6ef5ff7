"""``transformer_lm``'s config (fairseq 0.12's flag names and defaults) and its checks."""
import dataclasses
from typing import Optional

from shardtrain.core.errors import ConfigError
from shardtrain.core.fields import field
from shardtrain.models.transformer_lm.adaptive import adaptive_checks
from shardtrain.models.transformer_lm.layer import ACTIVATION_FNS


@dataclasses.dataclass
class TransformerLanguageModelConfig:
    """fairseq 0.12's ``transformer_lm`` flags and defaults (the subset we support)."""

    activation_fn: str = field("relu", help="activation function to use", choices=list(ACTIVATION_FNS))
    dropout: float = field(0.1, help="dropout probability")
    attention_dropout: float = field(0.0, help="dropout probability for attention weights")
    activation_dropout: float = field(0.0, help="dropout probability after activation in FFN")
    # fairseq's older name: used when --activation-dropout is 0 (its TransformerDecoderLayer's rule)
    relu_dropout: float = field(0.0, help="dropout probability after activation in FFN.")
    decoder_embed_dim: int = field(512, help="decoder embedding dimension")
    # fairseq defaults these to 512 whatever --decoder-embed-dim is, so a smaller
    # model silently grows 512-wide projections; None follows the embed dim.
    decoder_output_dim: Optional[int] = field(None, help="decoder output dimension (default: --decoder-embed-dim)")
    decoder_input_dim: Optional[int] = field(None, help="decoder input dimension (default: --decoder-embed-dim)")
    decoder_ffn_embed_dim: int = field(2048, help="decoder embedding dimension for FFN")
    decoder_layers: int = field(6, help="num decoder layers")
    decoder_attention_heads: int = field(8, help="num decoder attention heads")
    decoder_normalize_before: bool = field(False, help="apply layernorm before each decoder block")
    no_decoder_final_norm: bool = field(
        False, help="don't add an extra layernorm after the last decoder block"
    )
    share_decoder_input_output_embed: bool = field(
        False, help="share decoder input and output embeddings"
    )
    decoder_learned_pos: bool = field(False, help="use learned positional embeddings in the decoder")
    no_scale_embedding: bool = field(False, help="if True, dont scale embeddings")
    layernorm_embedding: bool = field(False, help="add layernorm to embedding")
    no_token_positional_embeddings: bool = field(
        False, help="if set, disables positional embeddings (outside self attention)"
    )
    max_target_positions: Optional[int] = field(
        None, help="max number of tokens in the target sequence (default: --tokens-per-sample)"
    )
    adaptive_softmax_cutoff: Optional[str] = field(
        None, help="comma separated list of adaptive softmax cutoff points. "
        "Must be used with adaptive_loss criterion"
    )
    adaptive_softmax_dropout: float = field(0.0, help="sets adaptive softmax dropout for the tail projections")
    adaptive_softmax_factor: float = field(4.0, help="adaptive input factor")
    adaptive_input: bool = field(False, help="if set, uses adaptive input")
    adaptive_input_factor: float = field(4.0, help="adaptive input factor")
    adaptive_input_cutoff: Optional[str] = field(None, help="comma separated list of adaptive input cutoff points.")
    tie_adaptive_weights: bool = field(
        False, help="if set, ties the weights of adaptive softmax and adaptive input"
    )
    tie_adaptive_proj: bool = field(
        False, help="if set, ties the projection weights of adaptive softmax and adaptive input"
    )
    decoder_layerdrop: float = field(0.0, help="LayerDrop probability for decoder")


def io_dims(cfg):
    """(input dim, output dim); unset ones follow --decoder-embed-dim."""
    return cfg.decoder_input_dim or cfg.decoder_embed_dim, cfg.decoder_output_dim or cfg.decoder_embed_dim


def check_config(cfg, vocab_size: int, padding_idx: int, max_positions: int) -> None:
    """Reject invalid or incompatible model flags with a message naming them."""
    embed, heads = cfg.decoder_embed_dim, cfg.decoder_attention_heads
    input_dim, output_dim = io_dims(cfg)
    sinusoidal = not cfg.no_token_positional_embeddings and not cfg.decoder_learned_pos
    checks = [
        (cfg.activation_fn in ACTIVATION_FNS,
         f"--activation-fn {cfg.activation_fn!r} is unknown; choose one of {', '.join(ACTIVATION_FNS)}."),
        (heads > 0 and embed % heads == 0,
         f"--decoder-embed-dim ({embed}) must be a multiple of --decoder-attention-heads ({heads}); "
         "change one of them."),
        (not cfg.share_decoder_input_output_embed or input_dim == output_dim,
         f"--share-decoder-input-output-embed needs --decoder-input-dim ({input_dim}) equal "
         f"to --decoder-output-dim ({output_dim}); make them equal or drop the sharing flag."),
        (not sinusoidal or embed >= 4,
         f"sinusoidal positions need --decoder-embed-dim of at least 4 (got {embed}); use a larger "
         "dimension or --decoder-learned-pos."),
        (max_positions > 0,
         f"--max-target-positions must be positive (got {max_positions}); set it or --tokens-per-sample."),
        (0 <= padding_idx < vocab_size,
         f"the dictionary's padding index {padding_idx} is outside its {vocab_size} symbols; "
         "rebuild the dictionary."),
    ]
    checks.extend(adaptive_checks(cfg, input_dim, output_dim))
    for name in ("dropout", "attention_dropout", "activation_dropout", "relu_dropout", "adaptive_softmax_dropout",
                 "decoder_layerdrop"):
        value = getattr(cfg, name)
        flag = "--" + name.replace("_", "-")
        checks.append((0.0 <= value < 1.0, f"{flag} must be in [0, 1) (got {value})."))
    for name, value in (("decoder_embed_dim", embed), ("decoder_input_dim", input_dim),
                        ("decoder_output_dim", output_dim), ("decoder_ffn_embed_dim", cfg.decoder_ffn_embed_dim)):
        checks.append((value > 0, f"--{name.replace('_', '-')} must be positive (got {value})."))
    checks.append((cfg.decoder_layers >= 0, f"--decoder-layers must be >= 0 (got {cfg.decoder_layers})."))
    problems = [message for ok, message in checks if not ok]
    if problems:
        raise ConfigError("Invalid transformer_lm settings: " + " ".join(problems))
