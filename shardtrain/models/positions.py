"""Token positions and positional embeddings, computed exactly as fairseq does.

fairseq numbers positions from ``padding_idx + 1``: the first real token gets
position ``padding_idx + 1``, the next ``padding_idx + 2`` and so on, while pad
tokens get position ``padding_idx`` (whose embedding row is zero). Tables are
therefore ``max_positions + padding_idx + 1`` rows long, which is what lets
fairseq checkpoints load unchanged.
"""
import math
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from shardtrain.models.document_mask import first_of_document
from shardtrain.models.init import init_, zero_row_


def make_positions(tokens: torch.Tensor, padding_idx: int, offset: int = 0) -> torch.Tensor:
    """Positions of ``tokens`` [B, T]: non-pad tokens are numbered
    ``padding_idx + 1 + offset``, ... counting only non-pad tokens, pad tokens
    get ``padding_idx``. ``offset`` is the number of (pad-free) tokens that
    came before, for incremental decoding with a KV cache."""
    mask = tokens.ne(padding_idx).long()
    return (torch.cumsum(mask, dim=1) + offset) * mask + padding_idx


def document_positions(tokens: torch.Tensor, padding_idx: int, document_ids: torch.Tensor) -> torch.Tensor:
    """:func:`make_positions` restarted at each document's first token (``document_ids``, models/document_mask.py):
    each document's tokens get the positions the document alone would get."""
    mask = tokens.ne(padding_idx).long()
    counted = torch.cumsum(mask, dim=1)
    first = first_of_document(document_ids)
    before = counted.gather(1, first) - mask.gather(1, first)  # the non-pad tokens before the document
    return (counted - before) * mask + padding_idx


def sinusoidal_table(
    num_embeddings: int,
    embedding_dim: int,
    padding_idx: int,
    device=None,
) -> torch.Tensor:
    """fairseq's ``SinusoidalPositionalEmbedding.get_embedding``: sin and cos
    halves concatenated (not interleaved), frequencies
    ``exp(-i * log(10000) / (half_dim - 1))``, a zero column appended for odd
    dims and a zero row at ``padding_idx``. Always float32, like fairseq."""
    half_dim = embedding_dim // 2
    step = math.log(10000) / (half_dim - 1)
    freqs = torch.exp(torch.arange(half_dim, dtype=torch.float32, device=device) * -step)
    angles = torch.arange(num_embeddings, dtype=torch.float32, device=device)[:, None] * freqs[None, :]
    table = torch.cat([torch.sin(angles), torch.cos(angles)], dim=1)
    if embedding_dim % 2 == 1:
        table = F.pad(table, (0, 1))
    table[padding_idx] = 0
    return table


def init_embedding(weight: torch.Tensor, padding_idx: int) -> None:
    """fairseq's ``Embedding`` init: normal(0, dim**-0.5), zero padding row."""
    # Two steps, not one custom init function, so the normal draw goes blockwise
    # (each rank draws only its rows) and only the rank holding the row zeroes it.
    init_(weight, nn.init.normal_, mean=0.0, std=weight.size(1) ** -0.5)
    zero_row_(weight, padding_idx)


class LearnedPositionalEmbedding(nn.Embedding):
    """A learned table indexed by :func:`make_positions` output (fairseq's
    ``decoder.embed_positions.weight`` loads into ``weight`` unchanged)."""

    def __init__(self, max_positions: int, embedding_dim: int, padding_idx: int):
        super().__init__(max_positions + padding_idx + 1, embedding_dim, padding_idx=padding_idx)
        self.max_positions = max_positions

    def init_weights(self) -> None:
        init_embedding(self.weight, self.padding_idx)

    def forward(self, positions: torch.Tensor, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
        """The embeddings of ``positions``, in ``dtype`` (that of what they are added to) if given."""
        out = super().forward(positions)
        return out if dtype is None else out.to(dtype)


class SinusoidalPositionalEmbedding(nn.Module):
    """A fixed sinusoidal table, indexed by :func:`make_positions` output.

    The table is a non-persistent buffer: it is not in the state dict (as in
    fairseq) and :meth:`init_weights` recomputes it, so a model built on the
    meta device and materialised with ``to_empty`` gets correct values.
    """

    def __init__(self, max_positions: int, embedding_dim: int, padding_idx: int):
        super().__init__()
        self.max_positions = max_positions
        self.embedding_dim = embedding_dim
        self.padding_idx = padding_idx
        num_embeddings = max_positions + padding_idx + 1
        self.register_buffer("weights", torch.empty(num_embeddings, embedding_dim), persistent=False)
        self.init_weights()

    def init_weights(self) -> None:
        table = sinusoidal_table(
            self.weights.size(0), self.embedding_dim, self.padding_idx, device=self.weights.device
        )
        with torch.no_grad():
            self.weights.copy_(table)

    def forward(self, positions: torch.Tensor, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
        """The embeddings of ``positions``, in ``dtype`` (that of what they are added to) if given.

        The table is a buffer, and FSDP's mixed precision casts parameters only: left in fp32 it
        would promote bf16/fp16 activations to fp32 (and crash a low-precision LayerNorm after it).
        """
        # Cast the table rather than the lookup: it is usually the smaller of the two.
        table = self.weights if dtype is None else self.weights.to(dtype)
        return F.embedding(positions, table)

    def extra_repr(self) -> str:
        return f"{self.weights.size(0)}, {self.embedding_dim}, padding_idx={self.padding_idx}"
