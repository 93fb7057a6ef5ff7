"""``llama``: the decoder of Llama 3 and Qwen3 (Hugging Face's ``LlamaForCausalLM`` and ``Qwen3ForCausalLM``,
within 1e-5 in fp32: tests/models/test_llama_vs_hf.py). A pure ``nn.Module``: FSDP2, activation checkpointing
and --compile wrap its ``blocks`` from outside.

``forward(src_tokens [B, T], cache=None, document_ids=None) -> logits [B, T, V]``; with ``document_ids`` [B, T]
(``--attn-mask-type block_causal``) each packed document attends within itself and its rotary positions restart
at its first token (models/document_mask.py). Embedding row i is token i of the task's
dictionary; there is no padding row (Hugging Face's models have none either): pad targets are ignored by the
loss, and causal attention keeps right-padding from reaching real tokens.

``forward(..., features_only=True)``: the hidden states [B, T, width] the output projection takes
(``F.linear(features, output_weight())`` are the logits), for a loss that projects them chunk by chunk.
"""
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from shardtrain.core.errors import ConfigError
from shardtrain.models.document_mask import attention_mask, index_in_document, refuse_cache_with_documents
from shardtrain.models.flops import decoder_flops_per_token
from shardtrain.models.init import init_
from shardtrain.models.kv_cache import KVCache
from shardtrain.models.llama.config import LlamaConfig, check_config, ffn_dim, head_dim, kv_heads
from shardtrain.models.llama.layer import LlamaBlock, RMSNorm, out_std
from shardtrain.models.llama.rope import cos_sin, inverse_frequencies
from shardtrain.models.registry import register_model


@register_model("llama", dataclass=LlamaConfig)
class LlamaModel(nn.Module):
    #: the config field that counts the identical blocks (trainer/memory/layers.py extrapolates from one and two)
    repeated_layers_field = "decoder_layers"

    def __init__(self, cfg, vocab_size: int, max_positions: Optional[int]):
        super().__init__()
        check_config(cfg, vocab_size, max_positions)
        dim, layers = cfg.decoder_embed_dim, cfg.decoder_layers
        self.max_positions = max_positions
        self.embed_dim, self.head_dim = dim, head_dim(cfg)
        self.attention_dim = cfg.decoder_attention_heads * self.head_dim
        self.embed_tokens = nn.Embedding(vocab_size, dim)
        self.blocks = nn.ModuleList(
            LlamaBlock(dim, cfg.decoder_attention_heads, kv_heads(cfg), head_dim(cfg), ffn_dim(cfg),
                       eps=cfg.rms_norm_eps, qk_norm=cfg.qk_norm, out_std=out_std(i, layers, cfg.depth_init))
            for i in range(layers))
        self.norm = RMSNorm(dim, cfg.rms_norm_eps)
        self.output_projection = None if cfg.share_decoder_input_output_embed else nn.Linear(dim, vocab_size,
                                                                                             bias=False)
        self._rope = (head_dim(cfg), cfg.rope_theta, cfg.rope_factor, cfg.rope_low_freq_factor,
                      cfg.rope_high_freq_factor, cfg.rope_original_max_positions)
        self.init_weights()

    @classmethod
    def build_model(cls, cfg, task) -> "LlamaModel":
        max_positions = cfg.max_target_positions if cfg.max_target_positions is not None else task.max_positions()
        return cls(cfg, len(task.dictionary), max_positions)

    @torch.no_grad()
    def init_weights(self) -> None:
        """torchtitan's llama3 init: embeddings N(0, 1); q, k, v and gate N(0, 0.02) truncated at +-2; each
        block's output projections by depth (layer.out_std); the output projection N(0, width^-1/2) truncated at
        +-3 std; norms to ones. Same values however the model is sharded (models/init.py)."""
        init_(self.embed_tokens.weight, nn.init.normal_, mean=0.0, std=1.0)
        for block in self.blocks:
            block.init_weights()
        self.norm.init_weights()
        if self.output_projection is not None:
            std = self.embed_dim ** -0.5
            init_(self.output_projection.weight, nn.init.trunc_normal_, mean=0.0, std=std, a=-3 * std, b=3 * std)

    def output_weight(self) -> torch.Tensor:
        return self.embed_tokens.weight if self.output_projection is None else self.output_projection.weight

    def flops_per_token(self, seq_len: int) -> float:
        """decoder_flops_per_token over every Linear's weight (grouped-query attention's smaller k and v
        projections, SwiGLU's three matrices) plus the tied embedding when it is the output; the attention term
        over the query width (heads x head_dim, which Qwen3 sets apart from the model width)."""
        weights = sum(m.weight.numel() for m in self.modules() if isinstance(m, nn.Linear))
        if self.output_projection is None:
            weights += self.embed_tokens.weight.numel()
        return decoder_flops_per_token(weights, len(self.blocks), self.attention_dim, seq_len)

    def forward(self, src_tokens: torch.Tensor, cache: Optional[KVCache] = None,
                document_ids: Optional[torch.Tensor] = None, *, features_only: bool = False) -> torch.Tensor:
        features = self.extract_features(src_tokens, cache, document_ids)
        # features_only: through forward, so that FSDP2 gathers the output weight (and DDP and --compile wrap it)
        # for a loss that projects the features chunk by chunk (tasks/chunked_loss.py)
        return features if features_only else F.linear(features, self.output_weight())

    def extract_features(self, src_tokens: torch.Tensor, cache: Optional[KVCache] = None,
                         document_ids: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Hidden states [B, T, width] after the final norm; with ``cache``, positions continue from it; with
        ``document_ids``, they restart at each document and attention stays within it."""
        refuse_cache_with_documents(cache, document_ids, type(self).__name__)
        past = 0 if cache is None else cache.length
        if self.max_positions is not None and past + src_tokens.size(1) > self.max_positions:
            raise ConfigError(
                f"The input has {past + src_tokens.size(1)} tokens but the model takes at most "
                f"{self.max_positions}. Use shorter inputs (--tokens-per-sample) or a larger --max-target-positions.")
        x = self.embed_tokens(src_tokens)
        if document_ids is None:
            positions = torch.arange(past, past + src_tokens.size(1), device=src_tokens.device)
        else:
            positions = index_in_document(document_ids)  # [B, T]: cos and sin per row
        # The frequencies are computed here, on the tokens' device, in fp32 (a few hundred values): kept as a
        # buffer they would be built on the meta device, cast by a storage dtype and saved in checkpoints.
        cos, sin = cos_sin(inverse_frequencies(*self._rope, device=src_tokens.device), positions, x.dtype)
        mask = attention_mask(document_ids, self.head_dim)  # once for every block
        for index, block in enumerate(self.blocks):
            x = block(x, cos, sin, mask=mask) if cache is None else block(x, cos, sin, cache.layers[index])
        return self.norm(x)

    def new_kv_cache(self) -> KVCache:
        return KVCache(len(self.blocks))
