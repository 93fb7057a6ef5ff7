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
import math
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from shardtrain.core.errors import ConfigError
from shardtrain.models.transformer_lm.adaptive import AdaptiveInput, AdaptiveSoftmax, parse_cutoff
from shardtrain.models.document_mask import attention_mask, refuse_cache_with_documents
from shardtrain.models.flops import decoder_flops_per_token
from shardtrain.models.init import init_
from shardtrain.models.layerdrop import LayerDrop
from shardtrain.models.positions import (
    LearnedPositionalEmbedding,
    SinusoidalPositionalEmbedding,
    document_positions,
    init_embedding,
    make_positions,
)
from shardtrain.models.registry import register_model
from shardtrain.models.kv_cache import KVCache
from shardtrain.models.transformer_lm.layer import TransformerDecoderBlock
from shardtrain.models.transformer_lm.config import (
    TransformerLanguageModelConfig,
    check_config,
    io_dims,
)


@register_model("transformer_lm", dataclass=TransformerLanguageModelConfig)
class TransformerLanguageModel(nn.Module):
    """Token embedding, positions, ``blocks`` and an output projection.

    ``forward(src_tokens [B, T], cache=None, document_ids=None) -> logits [B, T, V]``.
    Attention is causal only: fairseq also masks pad keys, which changes nothing
    for the right-padded batches its LM tasks produce (a query never sees a later
    key), so pad-key masking is dropped in exchange for ``is_causal`` kernels.
    With ``document_ids`` [B, T] (``--attn-mask-type block_causal``) each packed
    document attends within itself and its positions restart at its first token
    (models/document_mask.py).

    ``forward(..., features_only=True)``: the hidden states [B, T, output_dim]
    the output projection (or the adaptive softmax) takes.
    """

    #: the config field that counts the identical blocks (trainer/memory/layers.py extrapolates from one and two)
    repeated_layers_field = "decoder_layers"

    def __init__(self, cfg, vocab_size: int, padding_idx: int, max_positions: int):
        super().__init__()
        check_config(cfg, vocab_size, padding_idx, max_positions)
        embed_dim, (input_dim, output_dim) = cfg.decoder_embed_dim, io_dims(cfg)
        self.padding_idx = padding_idx
        self.max_positions = max_positions
        self.embed_dim = embed_dim
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
                activation_dropout=cfg.activation_dropout or cfg.relu_dropout,
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
        # what the attention kernel of a document mask depends on (models/document_mask.py)
        self.head_dim, self.attention_dropout = embed_dim // cfg.decoder_attention_heads, cfg.attention_dropout
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

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token on ``seq_len``-token sequences (decoder_flops_per_token): every
        Linear's weight, plus the tied embedding when it is the output projection. Adaptive bands
        count as if every token passed through each (an upper bound: a token uses one band)."""
        weights = sum(m.weight.numel() for m in self.modules() if isinstance(m, nn.Linear))
        if self.output_projection is None and self.adaptive_softmax is None:
            weights += self.embed_tokens.weight.numel()  # --share-decoder-input-output-embed
        return decoder_flops_per_token(weights, len(self.blocks), self.embed_dim, seq_len)

    def output_weight(self) -> Optional[torch.Tensor]:
        """The [V, output_dim] matrix that maps features to logits; None with an adaptive softmax (which has none)."""
        if self.adaptive_softmax is not None:
            return None
        if self.output_projection is None:
            return self.embed_tokens.weight
        return self.output_projection.weight

    def forward(self, src_tokens: torch.Tensor, cache: Optional[KVCache] = None,
                document_ids: Optional[torch.Tensor] = None, target: Optional[torch.Tensor] = None, *,
                features_only: bool = False):
        """Logits [B, T, V]; with an adaptive softmax, log-probabilities [B, T, V] instead
        (a softmax of either gives the same distribution), or with ``target`` the
        adaptive softmax's (logits, targets) lists that ``adaptive_loss`` sums over.
        The adaptive softmax runs inside forward so FSDP2 and DDP see its parameters used.
        ``features_only``: the features, for a loss that projects them chunk by chunk (tasks/chunked_loss.py)."""
        features = self.extract_features(src_tokens, cache, document_ids)
        if features_only:
            return features
        if self.adaptive_softmax is None:
            if target is not None:
                raise ConfigError("--criterion adaptive_loss needs a model with an adaptive softmax: set "
                                  "--adaptive-softmax-cutoff (like 20000,60000) or use --criterion cross_entropy.")
            return F.linear(features, self.output_weight())
        adaptive_input = self.embed_tokens if isinstance(self.embed_tokens, AdaptiveInput) else None
        if target is not None:
            return self.adaptive_softmax(features, target, adaptive_input)
        return self.adaptive_softmax.get_log_prob(features, adaptive_input)

    def extract_features(self, src_tokens: torch.Tensor, cache: Optional[KVCache] = None,
                         document_ids: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Hidden states [B, T, output_dim] before the output projection.

        With ``cache``, ``src_tokens`` are the tokens after the cached ones and
        their positions continue from ``cache.length`` (as in fairseq's
        incremental decoding, earlier tokens are assumed not to be padding).
        With ``document_ids``, positions restart at each document.
        """
        refuse_cache_with_documents(cache, document_ids, type(self).__name__)
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
            positions = (make_positions(src_tokens, self.padding_idx, offset=past) if document_ids is None
                         else document_positions(src_tokens, self.padding_idx, document_ids))
            x = x + self.embed_positions(positions, x.dtype)
        if self.layernorm_embedding is not None:
            x = self.layernorm_embedding(x)
        x = self.dropout(x)
        keep = self.layerdrop.keep(len(self.blocks), self.training)
        mask = attention_mask(document_ids, self.head_dim, self.attention_dropout if self.training else 0.0)
        for index, block in enumerate(self.blocks):
            if not keep[index]:
                # A dropped block still runs, on no positions: its parameters get zero
                # gradients (DDP needs no find_unused_parameters, the optimizer sees no None
                # grads) and FSDP2's all-gathers stay matched; the block's compute is skipped.
                x = x + block(x[:, :0]).sum()
            elif cache is None:
                x = block(x, mask=mask)
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
