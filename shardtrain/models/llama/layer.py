"""The ``llama`` block: pre-norm RMSNorm, grouped-query self-attention with rotary positions (and Qwen3's
RMSNorm on q and k), and a SwiGLU feed-forward. No biases. Parameter names are Hugging Face's inside a block
(``self_attn.q_proj``, ``mlp.gate_proj``, ``input_layernorm``, ...), so its weights map by a prefix
(``hf_keys.py``)."""
import math
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from shardtrain.models.document_mask import Mask, attend
from shardtrain.models.init import init_
from shardtrain.models.kv_cache import LayerKVCache
from shardtrain.models.llama.rope import apply_rotary

INIT_STD = 0.02  # torchtitan's std for the input projections


class RMSNorm(nn.Module):
    """Hugging Face's LlamaRMSNorm, step for step: normalised in fp32, cast back to the input's dtype, then
    scaled by the weight (torch's fused rms_norm scales before the cast, which rounds differently in bf16)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.to(torch.float32)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)

    def init_weights(self) -> None:
        nn.init.ones_(self.weight)


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int, kv_heads: int, head_dim: int, qk_norm: bool, eps: float):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.q_proj = nn.Linear(dim, heads * head_dim, bias=False)
        self.k_proj = nn.Linear(dim, kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(dim, kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(heads * head_dim, dim, bias=False)
        self.q_norm = RMSNorm(head_dim, eps) if qk_norm else None
        self.k_norm = RMSNorm(head_dim, eps) if qk_norm else None

    def init_weights(self, out_std: float) -> None:
        for proj in (self.q_proj, self.k_proj, self.v_proj):
            init_(proj.weight, nn.init.trunc_normal_, mean=0.0, std=INIT_STD)
        init_(self.o_proj.weight, nn.init.trunc_normal_, mean=0.0, std=out_std)
        for norm in (self.q_norm, self.k_norm):
            if norm is not None:
                norm.init_weights()

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                cache: Optional[LayerKVCache] = None, mask: Mask = None) -> torch.Tensor:
        """``mask``: None (causal) or the packed documents' (models/document_mask.py; never with a cache)."""
        batch, length, _ = x.shape
        q = self.q_proj(x).view(batch, length, self.heads, self.head_dim)
        k = self.k_proj(x).view(batch, length, self.kv_heads, self.head_dim)
        v = self.v_proj(x).view(batch, length, self.kv_heads, self.head_dim).transpose(1, 2)
        if self.q_norm is not None:  # Qwen3: per head, before the rotation
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rotary(q.transpose(1, 2), cos, sin), apply_rotary(k.transpose(1, 2), cos, sin)
        past = 0
        if cache is not None:
            past = cache.length
            k, v = cache.append(k, v)
        gqa = self.kv_heads != self.heads
        if past == 0:
            out = attend(q, k, v, mask, enable_gqa=gqa)
        else:
            # is_causal aligns the mask top-left, wrong with more keys than queries: query i sees keys up to past + i
            allowed = torch.ones(length, past + length, dtype=torch.bool, device=x.device).tril(diagonal=past)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, enable_gqa=gqa)
        return self.o_proj(out.transpose(1, 2).reshape(batch, length, self.heads * self.head_dim))


class FeedForward(nn.Module):
    """SwiGLU (Shazeer 2020): down(silu(gate(x)) * up(x))."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden, bias=False)
        self.up_proj = nn.Linear(dim, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, dim, bias=False)

    def init_weights(self, out_std: float) -> None:
        init_(self.gate_proj.weight, nn.init.trunc_normal_, mean=0.0, std=INIT_STD)
        for proj in (self.up_proj, self.down_proj):  # torchtitan's w3 and w2
            init_(proj.weight, nn.init.trunc_normal_, mean=0.0, std=out_std)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaBlock(nn.Module):
    """x + attention(norm(x)), then + feed_forward(norm(x)): the unit FSDP2, activation checkpointing and
    --compile wrap from outside. ``out_std``: the std of its output projections (torchtitan's init)."""

    def __init__(self, dim: int, heads: int, kv_heads: int, head_dim: int, ffn_dim: int, *, eps: float,
                 qk_norm: bool, out_std: float):
        super().__init__()
        self.out_std = out_std
        self.self_attn = Attention(dim, heads, kv_heads, head_dim, qk_norm, eps)
        self.mlp = FeedForward(dim, ffn_dim)
        self.input_layernorm = RMSNorm(dim, eps)
        self.post_attention_layernorm = RMSNorm(dim, eps)

    def init_weights(self) -> None:
        self.input_layernorm.init_weights()
        self.post_attention_layernorm.init_weights()
        self.self_attn.init_weights(self.out_std)
        self.mlp.init_weights(self.out_std)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                cache: Optional[LayerKVCache] = None, mask: Mask = None) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, cache, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


def out_std(layer: int, layers: int, depth_init: bool) -> float:
    """torchtitan's std for a block's output projections: 0.02 / sqrt(2 (layer + 1)) with depth_init, else
    0.02 / sqrt(2 layers)."""
    return INIT_STD / math.sqrt(2 * (layer + 1) if depth_init else 2 * max(1, layers))
