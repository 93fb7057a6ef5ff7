"""The repeated decoder block of ``transformer_lm`` and its KV cache.

:class:`TransformerDecoderBlock` is the unit that FSDP2 and activation
checkpointing wrap from outside, so it takes explicit sizes (not the config)
and its ``forward(x)`` needs nothing but the hidden states. The layout follows
fairseq's ``TransformerDecoderLayer`` (without encoder attention); the only
structural change is a fused ``qkv_proj`` in place of ``q_proj``/``k_proj``/
``v_proj`` (concatenate fairseq's three weights along dim 0, in that order).
"""
import math
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from shardtrain.models.document_mask import Mask, attend
from shardtrain.models.init import init_
from shardtrain.models.kv_cache import LayerKVCache

# fairseq's --activation-fn names. gelu_fast is fairseq's deprecated alias of
# gelu_accurate (the tanh approximation); swish is fairseq's name for silu.
ACTIVATION_FNS = {
    "relu": nn.ReLU,
    "gelu": nn.GELU,
    "gelu_accurate": lambda: nn.GELU(approximate="tanh"),
    "gelu_fast": lambda: nn.GELU(approximate="tanh"),
    "tanh": nn.Tanh,
    "linear": nn.Identity,
    "swish": nn.SiLU,
    "silu": nn.SiLU,
}


class SelfAttention(nn.Module):
    """Causal multi-head self-attention with a fused qkv projection, computed
    by ``F.scaled_dot_product_attention`` (flash/efficient kernels on CUDA)."""

    def __init__(self, embed_dim: int, num_heads: int, attention_dropout: float):
        super().__init__()
        assert embed_dim % num_heads == 0, "checked by the model config"
        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.attention_dropout = attention_dropout
        self.qkv_proj = nn.Linear(embed_dim, 3 * embed_dim)
        self.out_proj = nn.Linear(embed_dim, embed_dim)

    def init_weights(self) -> None:
        # fairseq initialises q, k and v as separate [E, E] matrices with
        # xavier_uniform(gain=1/sqrt(2)). All three have the same fans, so one
        # uniform draw over the fused matrix with that bound has the same
        # distribution, without slicing (awkward on sharded parameters).
        gain = 1 / math.sqrt(2)
        bound = gain * math.sqrt(6.0 / (self.embed_dim + self.embed_dim))
        init_(self.qkv_proj.weight, nn.init.uniform_, -bound, bound)
        nn.init.zeros_(self.qkv_proj.bias)
        init_(self.out_proj.weight, nn.init.xavier_uniform_)
        nn.init.zeros_(self.out_proj.bias)

    def forward(self, x: torch.Tensor, cache: Optional[LayerKVCache] = None, mask: Mask = None) -> torch.Tensor:
        """``mask``: None (causal) or the packed documents' (models/document_mask.py; never with a cache)."""
        batch, length, _ = x.shape
        heads, head_dim = self.num_heads, self.embed_dim // self.num_heads
        q, k, v = (
            t.view(batch, length, heads, head_dim).transpose(1, 2)
            for t in self.qkv_proj(x).split(self.embed_dim, dim=-1)
        )
        past = 0
        if cache is not None:
            past = cache.length
            k, v = cache.append(k, v)
        dropout_p = self.attention_dropout if self.training else 0.0
        if past == 0:
            out = attend(q, k, v, mask, dropout_p=dropout_p)
        elif length == 1:
            # A single new query may attend to every cached position.
            out = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p)
        else:
            # is_causal aligns the mask top-left, which is wrong when there are
            # more keys than queries; query i sees keys up to past + i.
            allowed = torch.ones(length, past + length, dtype=torch.bool, device=x.device)
            allowed = allowed.tril(diagonal=past)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, dropout_p=dropout_p)
        out = out.transpose(1, 2).reshape(batch, length, self.embed_dim)
        return self.out_proj(out)


class TransformerDecoderBlock(nn.Module):
    """Self-attention then feed-forward, each with a residual connection.

    ``normalize_before`` puts each LayerNorm before its sublayer (pre-norm,
    what every fairseq LM preset uses); otherwise after the residual add
    (post-norm, the original Transformer). Dropout sits where fairseq puts it:
    on the attention output, after the activation (``activation_dropout``)
    and on the feed-forward output.
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        ffn_embed_dim: int,
        *,
        dropout: float,
        attention_dropout: float,
        activation_dropout: float,
        activation_fn: str,
        normalize_before: bool,
    ):
        super().__init__()
        self.normalize_before = normalize_before
        self.self_attn = SelfAttention(embed_dim, num_heads, attention_dropout)
        self.self_attn_layer_norm = nn.LayerNorm(embed_dim)
        self.fc1 = nn.Linear(embed_dim, ffn_embed_dim)
        self.fc2 = nn.Linear(ffn_embed_dim, embed_dim)
        self.final_layer_norm = nn.LayerNorm(embed_dim)
        self.activation = ACTIVATION_FNS[activation_fn]()
        self.dropout = nn.Dropout(dropout)
        self.activation_dropout = nn.Dropout(activation_dropout)

    def init_weights(self) -> None:
        self.self_attn.init_weights()
        for norm in (self.self_attn_layer_norm, self.final_layer_norm):
            nn.init.ones_(norm.weight)
            nn.init.zeros_(norm.bias)
        for fc in (self.fc1, self.fc2):
            # fairseq's fc1/fc2 are plain nn.Linear, so their weights get
            # PyTorch's default (kaiming_uniform with a=sqrt(5)); biases zero.
            init_(fc.weight, nn.init.kaiming_uniform_, a=math.sqrt(5))
            nn.init.zeros_(fc.bias)

    def forward(self, x: torch.Tensor, cache: Optional[LayerKVCache] = None, mask: Mask = None) -> torch.Tensor:
        residual = x
        if self.normalize_before:
            x = self.self_attn_layer_norm(x)
        x = residual + self.dropout(self.self_attn(x, cache, mask))
        if not self.normalize_before:
            x = self.self_attn_layer_norm(x)

        residual = x
        if self.normalize_before:
            x = self.final_layer_norm(x)
        x = self.activation_dropout(self.activation(self.fc1(x)))
        x = residual + self.dropout(self.fc2(x))
        if not self.normalize_before:
            x = self.final_layer_norm(x)
        return x
