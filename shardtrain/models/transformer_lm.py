"""``transformer_lm``: fairseq's decoder-only (GPT-style) language model.

A pure ``nn.Module``: it imports nothing from ``torch.distributed``. FSDP2 and
activation checkpointing are applied from outside, per element of
``model.blocks``. Build on the meta device, materialise with ``to_empty`` and
call :meth:`TransformerLanguageModel.init_weights`.

Loading fairseq checkpoints (keys after stripping fairseq's ``decoder.``)::

    embed_tokens.weight                 -> embed_tokens.weight
    embed_positions.weight (learned)    -> embed_positions.weight
    embed_positions._float_tensor, version  -> dropped (sinusoidal tables are
                                           recomputed, never saved)
    project_in_dim.weight               -> project_in_dim.weight
    layernorm_embedding.{weight,bias}   -> layernorm_embedding.{weight,bias}
    layers.N.self_attn.{q,k,v}_proj.W   -> blocks.N.self_attn.qkv_proj.W
                                           (torch.cat([q, k, v], dim=0), for
                                           W in weight and bias)
    layers.N.self_attn.out_proj.W       -> blocks.N.self_attn.out_proj.W
    layers.N.self_attn_layer_norm.W     -> blocks.N.self_attn_layer_norm.W
    layers.N.fc1.W, layers.N.fc2.W      -> blocks.N.fc1.W, blocks.N.fc2.W
    layers.N.final_layer_norm.W         -> blocks.N.final_layer_norm.W
    layer_norm.{weight,bias}            -> layer_norm.{weight,bias}
    project_out_dim.weight              -> project_out_dim.weight
    output_projection.weight            -> output_projection.weight, or
                                           dropped when embeddings are shared
                                           (fairseq saves a copy of
                                           embed_tokens.weight there)

Shared input/output embeddings are applied as ``F.linear(x,
embed_tokens.weight)`` rather than by tying two ``nn.Parameter`` attributes:
``to_empty`` (and any per-module re-materialisation) silently unties those.
"""
import dataclasses
import math
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from shardtrain.core.fields import field
from shardtrain.core.errors import ConfigError
from shardtrain.models.adaptive import AdaptiveInput, AdaptiveSoftmax, adaptive_checks, parse_cutoff
from shardtrain.models.init import init_
from shardtrain.models.layerdrop import LayerDrop
from shardtrain.models.positions import (
    LearnedPositionalEmbedding,
    SinusoidalPositionalEmbedding,
    init_embedding,
    make_positions,
)
from shardtrain.models.registry import register_model
from shardtrain.models.transformer_layer import ACTIVATION_FNS, KVCache, TransformerDecoderBlock


@dataclasses.dataclass
class TransformerLanguageModelConfig:
    """fairseq 0.12's ``transformer_lm`` flags and defaults (the subset we support)."""

    activation_fn: str = field("relu", help="activation function to use", choices=list(ACTIVATION_FNS))
    dropout: float = field(0.1, help="dropout probability")
    attention_dropout: float = field(0.0, help="dropout probability for attention weights")
    activation_dropout: float = field(0.0, help="dropout probability after activation in FFN")
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
    for name in ("dropout", "attention_dropout", "activation_dropout", "adaptive_softmax_dropout",
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


@register_model("transformer_lm", dataclass=TransformerLanguageModelConfig)
class TransformerLanguageModel(nn.Module):
    """Token embedding, positions, ``blocks`` and an output projection.

    ``forward(src_tokens [B, T], cache=None) -> logits [B, T, V]``. Attention
    is causal only: fairseq also masks pad keys, which changes nothing for
    the right-padded batches its LM tasks produce (a query never sees a later
    key), so pad-key masking is dropped in exchange for ``is_causal`` kernels.
    """

    #: the config field that counts the identical blocks (memory_fit extrapolates from one and two)
    repeated_layers_field = "decoder_layers"

    def __init__(self, cfg, vocab_size: int, padding_idx: int, max_positions: int):
        super().__init__()
        check_config(cfg, vocab_size, padding_idx, max_positions)
        embed_dim, (input_dim, output_dim) = cfg.decoder_embed_dim, io_dims(cfg)
        self.padding_idx = padding_idx
        self.max_positions = max_positions
        self.embed_scale = 1.0 if cfg.no_scale_embedding else math.sqrt(embed_dim)
        if cfg.adaptive_input:
            # fairseq: bands start at --decoder-input-dim and project to --decoder-embed-dim.
            cutoff = parse_cutoff(cfg.adaptive_input_cutoff, "--adaptive-input-cutoff", vocab_size)
            self.embed_tokens = AdaptiveInput(vocab_size, padding_idx, input_dim, cfg.adaptive_input_factor,
                                              embed_dim, cutoff)
            input_dim = embed_dim
        else:
            self.embed_tokens = nn.Embedding(vocab_size, input_dim, padding_idx=padding_idx)
        self.project_in_dim = nn.Linear(input_dim, embed_dim, bias=False) if input_dim != embed_dim else None
        self.embed_positions = _build_positions(cfg, max_positions, padding_idx)
        self.layernorm_embedding = nn.LayerNorm(embed_dim) if cfg.layernorm_embedding else None
        self.dropout = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(
            TransformerDecoderBlock(
                embed_dim,
                cfg.decoder_attention_heads,
                cfg.decoder_ffn_embed_dim,
                dropout=cfg.dropout,
                attention_dropout=cfg.attention_dropout,
                activation_dropout=cfg.activation_dropout,
                activation_fn=cfg.activation_fn,
                normalize_before=cfg.decoder_normalize_before,
            )
            for _ in range(cfg.decoder_layers)
        )
        # fairseq's rule: a final LayerNorm only for pre-norm models.
        final_norm = cfg.decoder_normalize_before and not cfg.no_decoder_final_norm
        self.layer_norm = nn.LayerNorm(embed_dim) if final_norm else None
        self.project_out_dim = nn.Linear(embed_dim, output_dim, bias=False) if output_dim != embed_dim else None
        self.adaptive_softmax = None
        if cfg.adaptive_softmax_cutoff is not None:
            cutoff = parse_cutoff(cfg.adaptive_softmax_cutoff, "--adaptive-softmax-cutoff", vocab_size)
            self.adaptive_softmax = AdaptiveSoftmax(
                vocab_size, output_dim, cutoff, cfg.adaptive_softmax_dropout, cfg.adaptive_softmax_factor,
                tie_weights=cfg.tie_adaptive_weights, tie_proj=cfg.tie_adaptive_proj)
        no_projection = cfg.share_decoder_input_output_embed or self.adaptive_softmax is not None
        self.output_projection = None if no_projection else nn.Linear(output_dim, vocab_size, bias=False)
        self.layerdrop = LayerDrop(cfg.decoder_layerdrop)
        self.init_weights()

    @classmethod
    def build_model(cls, cfg, task) -> "TransformerLanguageModel":
        max_positions = cfg.max_target_positions
        if max_positions is None:
            max_positions = task.max_positions()
        return cls(cfg, len(task.dictionary), task.dictionary.pad(), max_positions)

    @torch.no_grad()
    def init_weights(self) -> None:
        """(Re)initialise every parameter and buffer explicitly, fairseq-style.

        Works on materialised meta-device models; consumes the RNG in a fixed
        order so the same seed gives the same weights however it was built.
        """
        if isinstance(self.embed_tokens, AdaptiveInput):
            self.embed_tokens.init_weights()
        else:
            init_embedding(self.embed_tokens.weight, self.padding_idx)
        if self.project_in_dim is not None:
            init_(self.project_in_dim.weight, nn.init.xavier_uniform_)
        if self.embed_positions is not None:
            self.embed_positions.init_weights()
        for norm in (self.layernorm_embedding, self.layer_norm):
            if norm is not None:
                nn.init.ones_(norm.weight)
                nn.init.zeros_(norm.bias)
        for block in self.blocks:
            block.init_weights()
        if self.project_out_dim is not None:
            init_(self.project_out_dim.weight, nn.init.xavier_uniform_)
        if self.adaptive_softmax is not None:
            self.adaptive_softmax.init_weights()
        if self.output_projection is not None:
            weight = self.output_projection.weight
            init_(weight, nn.init.normal_, mean=0.0, std=weight.size(1) ** -0.5)

    def output_weight(self) -> torch.Tensor:
        """The [V, output_dim] matrix that maps features to logits."""
        if self.output_projection is None:
            return self.embed_tokens.weight
        return self.output_projection.weight

    def forward(self, src_tokens: torch.Tensor, cache: Optional[KVCache] = None,
                target: Optional[torch.Tensor] = None):
        """Logits [B, T, V]; with an adaptive softmax, log-probabilities [B, T, V] instead
        (a softmax of either gives the same distribution), or with ``target`` the
        adaptive softmax's (logits, targets) lists that ``adaptive_loss`` sums over.
        The adaptive softmax runs inside forward so FSDP2 and DDP see its parameters used."""
        features = self.extract_features(src_tokens, cache)
        if self.adaptive_softmax is None:
            if target is not None:
                raise ConfigError("target= is for models with an adaptive softmax (--adaptive-softmax-cutoff).")
            return F.linear(features, self.output_weight())
        adaptive_input = self.embed_tokens if isinstance(self.embed_tokens, AdaptiveInput) else None
        if target is not None:
            return self.adaptive_softmax(features, target, adaptive_input)
        return self.adaptive_softmax.get_log_prob(features, adaptive_input)

    def extract_features(self, src_tokens: torch.Tensor, cache: Optional[KVCache] = None) -> torch.Tensor:
        """Hidden states [B, T, output_dim] before the output projection.

        With ``cache``, ``src_tokens`` are the tokens after the cached ones and
        their positions continue from ``cache.length`` (as in fairseq's
        incremental decoding, earlier tokens are assumed not to be padding).
        """
        past = 0 if cache is None else cache.length
        if past + src_tokens.size(1) > self.max_positions:
            raise ConfigError(
                f"The input has {past + src_tokens.size(1)} tokens but the model has only "
                f"{self.max_positions} positions. Use shorter inputs (--tokens-per-sample) or "
                "build the model with a larger --max-target-positions."
            )
        x = self.embed_scale * self.embed_tokens(src_tokens)
        if self.project_in_dim is not None:
            x = self.project_in_dim(x)
        if self.embed_positions is not None:
            # In x's dtype: an fp32 table (a buffer, which FSDP's mixed precision does not
            # cast) would promote bf16/fp16 activations to fp32.
            x = x + self.embed_positions(make_positions(src_tokens, self.padding_idx, offset=past), x.dtype)
        if self.layernorm_embedding is not None:
            x = self.layernorm_embedding(x)
        x = self.dropout(x)
        keep = self.layerdrop.keep(len(self.blocks), self.training)
        for index, block in enumerate(self.blocks):
            if not keep[index]:
                # A dropped block still runs, on no positions: its parameters get zero
                # gradients (DDP needs no find_unused_parameters, the optimizer sees no None
                # grads) and FSDP2's all-gathers stay matched; the block's compute is skipped.
                x = x + block(x[:, :0]).sum()
            elif cache is None:
                x = block(x)
            else:
                x = block(x, cache.layers[index])
        if self.layer_norm is not None:
            x = self.layer_norm(x)
        if self.project_out_dim is not None:
            x = self.project_out_dim(x)
        return x

    def new_kv_cache(self) -> KVCache:
        return KVCache(len(self.blocks))


def _build_positions(cfg, max_positions: int, padding_idx: int) -> Optional[nn.Module]:
    if cfg.no_token_positional_embeddings:
        return None
    kind = LearnedPositionalEmbedding if cfg.decoder_learned_pos else SinusoidalPositionalEmbedding
    return kind(max_positions, cfg.decoder_embed_dim, padding_idx)
