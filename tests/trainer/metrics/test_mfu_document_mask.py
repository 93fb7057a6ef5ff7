"""tflops and mfu under ``--attn-mask-type block_causal`` count the model's FLOPs (PaLM's, as MFU is defined):
attention over the whole sample, as without the mask, not the sum over documents the mask needs. On the CPU that
is the work done: SDPA's boolean mask computes every score (torch's FLOP counter says the same count, with and
without document ids). docs/training.md gives the figures below for a llama3_2_1b of 8 documents of 256 tokens
in 2048: the attention term is 9.8% of the count, the mask needs 1/8 of it, so the documents need 8.6% less
work than mfu counts; at 8,192 tokens attention is 30% and they need 29% less."""
import dataclasses

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from shardtrain.models import ARCH_REGISTRY
from shardtrain.models.llama import LlamaConfig, LlamaModel
from shardtrain.models.transformer_lm import TransformerLanguageModel, TransformerLanguageModelConfig
from shardtrain.trainer.metrics.flops import model_flops_per_token

VOCAB, LENGTH = 50, 24


def _counted_per_token(model, **inputs):
    """FLOPs torch counts in one forward and backward of a [2, LENGTH] batch, per token (the math path: the
    flash kernel's op has no formula in the counter)."""
    tokens = torch.randint(4, VOCAB, (2, LENGTH), generator=torch.Generator().manual_seed(0))
    with FlopCounterMode(display=False) as counter, sdpa_kernel(SDPBackend.MATH):
        model(tokens, **inputs).float().logsumexp(-1).sum().backward()
    return counter.get_total_flops() / (2 * LENGTH)


def test_sdpas_mask_computes_what_the_count_says():
    cfg = TransformerLanguageModelConfig(decoder_layers=2, decoder_embed_dim=32, decoder_ffn_embed_dim=80,
                                         decoder_attention_heads=4, dropout=0.0)
    model = TransformerLanguageModel(cfg, VOCAB, padding_idx=1, max_positions=LENGTH)
    documents = torch.tensor([[0] * 6 + [1] * 6 + [2] * 12, [1] * 3 + [2] * 21])  # 3 and 2 documents
    count = model_flops_per_token(model, LENGTH)
    assert count == 6 * (2 * (4 * 32 * 32 + 2 * 32 * 80) + VOCAB * 32) + 12 * 2 * 32 * LENGTH  # by hand
    assert _counted_per_token(model, document_ids=documents) == pytest.approx(count, rel=1e-12)
    assert _counted_per_token(model) == pytest.approx(count, rel=1e-12)


def test_the_docs_figures_for_8_documents_of_256_in_2048():
    entry = ARCH_REGISTRY.get("llama3_2_1b").obj
    with torch.device("meta"):
        model = LlamaModel(dataclasses.replace(LlamaConfig(), **entry.values()), 128256, 2048)
    weights = 16 * (2 * 2048 * 2048 + 2 * 2048 * 512 + 3 * 2048 * 8192) + 128256 * 2048  # q o, k v, SwiGLU, tied
    attention = 12 * 16 * 2048 * 2048  # 12 x layers x (32 heads x 64) x tokens: 0.81e9
    count = model_flops_per_token(model, 2048)
    assert count == 6 * weights + attention == 8_219_787_264
    needed = 12 * 16 * 2048 * (8 * 256 ** 2) / 2048  # each token attends over its document of 256: 1/8
    assert needed == attention / 8
    assert round(attention / count, 3) == 0.098 and round((count - attention + needed) / count, 3) == 0.914
    assert round(count / (count - attention + needed), 3) == 1.094  # mfu reads 9.4% above the needed work
    attention_8k = 12 * 16 * 2048 * 8192  # the same documents of 256, packed 32 to a sample of 8,192
    count_8k = model_flops_per_token(model, 8192)
    assert count_8k == 6 * weights + attention_8k
    needed_8k = 12 * 16 * 2048 * 256
    assert round(attention_8k / count_8k, 3) == 0.303 and round((count_8k - attention_8k + needed_8k) / count_8k,
                                                                 3) == 0.707
