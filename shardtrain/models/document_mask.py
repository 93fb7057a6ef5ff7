"""Packed documents that do not see each other (``--attn-mask-type block_causal``), for every family.

A row of a batch may hold several documents; the task numbers them in ``document_ids`` [B, T] (a document is a
run of equal ids; data/collate.py). Then a token attends to the earlier tokens of its own document only, and its
position restarts at its document's first token: each document is computed as if it were alone in its row
(tests/models/test_document_mask.py: loss and gradients of a packed batch equal those of its documents run one
by one).

A model builds the mask once per forward (:func:`attention_mask`) and hands it to every block's attention, which
calls :func:`attend`. The mask is None without document ids (plain causal attention, the fused ``is_causal``
kernels), a boolean [B, 1, T, T] (True: attend) for SDPA, or on CUDA a FlexAttention ``BlockMask``, whose
kernel skips the blocks no query of a document needs instead of computing and masking them. FlexAttention has
no backward on the CPU, no dropout and no CUDA kernel for heads narrower than 16: those take SDPA's mask.
"""
import functools
from typing import Optional, Union

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import BlockMask, create_block_mask, flex_attention

from shardtrain.core.errors import ConfigError

Mask = Optional[Union[torch.Tensor, BlockMask]]
FLEX_MIN_HEAD_DIM = 16  # its CUDA kernel's tl.dot needs at least 16 (torch/_inductor/kernel/flex)


def _starts(document_ids: torch.Tensor) -> torch.Tensor:
    """[B, T] bool: True at each document's first token (a document: a run of equal ids)."""
    starts = torch.ones_like(document_ids, dtype=torch.bool)
    starts[:, 1:] = document_ids[:, 1:] != document_ids[:, :-1]
    return starts


def first_of_document(document_ids: torch.Tensor) -> torch.Tensor:
    """[B, T]: the index of the first token of each token's document."""
    index = torch.arange(document_ids.size(1), device=document_ids.device).expand_as(document_ids)
    return torch.where(_starts(document_ids), index, torch.zeros_like(index)).cummax(dim=1).values


def index_in_document(document_ids: torch.Tensor) -> torch.Tensor:
    """[B, T]: 0 at each document's first token, then 1, 2, ...: the positions the document alone would have."""
    index = torch.arange(document_ids.size(1), device=document_ids.device).expand_as(document_ids)
    return index - first_of_document(document_ids)


def use_flex(device: torch.device, head_dim: int, dropout: float) -> bool:
    """FlexAttention where it has a fused kernel and a backward (CUDA) for these heads, and no dropout is asked."""
    return device.type == "cuda" and head_dim >= FLEX_MIN_HEAD_DIM and dropout == 0.0


def attention_mask(document_ids: Optional[torch.Tensor], head_dim: int, dropout: float = 0.0) -> Mask:
    """What :func:`attend` takes for ``document_ids`` (None: causal attention), for heads of ``head_dim`` and
    the attention dropout the forward applies."""
    if document_ids is None:
        return None
    # Runs numbered anew (not the ids compared): a document is a run of equal ids, for the mask as for positions.
    runs = torch.cumsum(_starts(document_ids), dim=1)
    if use_flex(document_ids.device, head_dim, dropout):
        return _block_mask(runs)
    length = runs.size(1)
    causal = torch.ones(length, length, dtype=torch.bool, device=runs.device).tril()
    return ((runs[:, :, None] == runs[:, None, :]) & causal)[:, None]


def _block_mask(runs: torch.Tensor) -> "BlockMask":
    def same_document_causal(b, h, q, kv):
        return (q >= kv) & (runs[b, q] == runs[b, kv])

    batch, length = runs.shape
    return create_block_mask(same_document_causal, batch, None, length, length, device=runs.device)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Mask, dropout_p: float = 0.0,
           enable_gqa: bool = False) -> torch.Tensor:
    """Causal self-attention of q [B, H, T, D] over k, v [B, H_kv, T, D], within documents when ``mask`` says."""
    if mask is None:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True, enable_gqa=enable_gqa)
    if isinstance(mask, BlockMask):
        # Inside --compile's graph it is compiled with the block; the CPU has its forward only, run eager
        eager = torch.compiler.is_compiling() or q.device.type != "cuda"
        kernel = flex_attention if eager else _compiled_flex()
        return kernel(q, k, v, block_mask=mask, enable_gqa=enable_gqa)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, enable_gqa=enable_gqa)


@functools.lru_cache(maxsize=None)
def _compiled_flex():
    """Compiled once, at its first call: eager FlexAttention computes every score, as a dense mask does."""
    return torch.compile(flex_attention)


def refuse_cache_with_documents(cache, document_ids: Optional[torch.Tensor], model: str) -> None:
    """A KV cache decodes one sequence token by token; document ids are a training batch's."""
    if cache is not None and document_ids is not None:
        raise ConfigError(
            f"{model} was given document_ids and a KV cache together: the document mask (--attn-mask-type "
            "block_causal) is for packed training batches, while a cache decodes one sequence, one document. "
            "Call the model with a cache and without document_ids (as shard-generate does).")
