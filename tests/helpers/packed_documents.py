"""A packed batch of documents and tiny models of both families, shared by the document-mask tests on the CPU
(tests/models/test_document_mask.py) and on CUDA (tests/gpu/test_document_mask_gpu.py).

Two rows: row 0 holds documents of 2 (cut at the row's start), 5 and 5 tokens (cut at its end); row 1 of 3, 1,
4 and 2 tokens, then 2 pads, which continue the last document as the task's ids do. Written by hand."""
import dataclasses

import torch
import torch.nn.functional as F

from shardtrain.models.llama import LlamaConfig, LlamaModel
from shardtrain.models.transformer_lm import TransformerLanguageModel, TransformerLanguageModelConfig

VOCAB, PAD, LENGTH = 30, 1, 12
DOCUMENT_IDS = torch.tensor([[0, 0, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2],
                             [1, 1, 1, 2, 3, 3, 3, 3, 4, 4, 4, 4]])
REAL = torch.tensor([[True] * 12, [True] * 10 + [False] * 2])


def batch(device=None):
    """(tokens, target) [2, LENGTH], pad where the rows are padded."""
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(PAD + 1, VOCAB, (2, LENGTH), generator=generator)
    target = torch.randint(PAD + 1, VOCAB, (2, LENGTH), generator=generator)
    return tokens.masked_fill(~REAL, PAD).to(device), target.masked_fill(~REAL, PAD).to(device)


def documents(tokens, target):
    """Each document's (tokens, target) [1, n] alone, without its padding."""
    for row in range(2):
        for doc in DOCUMENT_IDS[row].unique():
            keep = ((DOCUMENT_IDS[row] == doc) & REAL[row]).to(tokens.device)
            yield tokens[row, keep][None], target[row, keep][None]


def loss_and_grads(model, pieces, **inputs):
    """The summed cross entropy (pad ignored) over ``pieces`` and every parameter's gradient of it."""
    model.zero_grad()
    total = 0.0
    for tokens, target in pieces:
        logits = model(tokens, **inputs)
        total = total + F.cross_entropy(logits.reshape(-1, VOCAB).float(), target.reshape(-1), ignore_index=PAD,
                                        reduction="sum")
    total.backward()
    return total.item(), {name: p.grad.clone() for name, p in model.named_parameters()}


@torch.no_grad()
def _sharpened(model):
    """Weights far from their tiny init, so attention is sharp and a token seen that should not be shows."""
    generator = torch.Generator().manual_seed(1)
    for p in model.parameters():
        p.add_(torch.randn(p.shape, generator=generator) * 0.3)
    return model


def llama(dim=32, heads=4, kv_heads=2):
    """Grouped-query attention (4 heads over 2 key/value heads), rotary positions."""
    torch.manual_seed(0)
    cfg = dataclasses.replace(LlamaConfig(), decoder_embed_dim=dim, decoder_ffn_embed_dim=48, decoder_layers=2,
                              decoder_attention_heads=heads, decoder_kv_heads=kv_heads)
    return _sharpened(LlamaModel(cfg, VOCAB, 64))


def transformer_lm(learned: bool, dim=16, heads=4):
    torch.manual_seed(0)
    cfg = TransformerLanguageModelConfig(decoder_embed_dim=dim, decoder_ffn_embed_dim=24, decoder_layers=2,
                                         decoder_attention_heads=heads, decoder_learned_pos=learned,
                                         decoder_normalize_before=True, dropout=0.0)
    return _sharpened(TransformerLanguageModel(cfg, VOCAB, PAD, 24))
