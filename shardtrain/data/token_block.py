"""Language-model blocks over a dataset of lines, as fairseq 0.12 builds them.

``TokenBlockDataset`` is fairseq's ``TokenBlockDataset(include_targets=True)``
and ``MonolingualDataset(targets=["future"])`` in one: item ``i`` is
``{"id": i, "source": LongTensor, "target": LongTensor}`` where ``target`` is
the block's tokens and ``source`` the same tokens shifted right by one. The
block boundaries come from :func:`build_block_index`, which reproduces
fairseq's loops (``token_block_utils_fast.pyx``) with vectorised numpy so that
corpora of millions of lines index in well under a second.
"""
from typing import Optional, Tuple

import numpy as np
import torch

from shardtrain.core.errors import ConfigError, DataError

BREAK_MODES = ("none", "complete", "complete_doc", "eos")


def build_block_index(
    sizes: np.ndarray, block_size: int, break_mode: str, document_sep_len: int = 1
) -> Tuple[np.ndarray, np.ndarray]:
    """Cut the stream of items with lengths ``sizes`` into blocks.

    Returns ``(slices, block_to_item)``: ``slices[b] = (start, end)`` token
    offsets of block ``b`` in the concatenated stream, and
    ``block_to_item[b] = (first_item, offset_in_first_item, last_item)``.
    """
    sizes = np.asarray(sizes, dtype=np.int64)
    _check_block_args(sizes, block_size, break_mode)
    cum = np.zeros(len(sizes) + 1, dtype=np.int64)
    np.cumsum(sizes, out=cum[1:])
    if break_mode == "eos":
        # One block per line; fairseq leaves over-long lines whole and fails
        # later in its size filter, we truncate them to the block size instead.
        slices = np.stack([cum[:-1], cum[:-1] + np.minimum(sizes, block_size)], axis=1)
        items = np.arange(len(sizes), dtype=np.int64)
        return slices, np.stack([items, np.zeros_like(items), items], axis=1)
    if break_mode == "none":
        starts = np.arange(0, cum[-1], block_size, dtype=np.int64)
        slices = np.stack([starts, np.minimum(starts + block_size, cum[-1])], axis=1)
    else:
        is_sep = sizes == document_sep_len if break_mode == "complete_doc" else np.zeros(len(sizes), bool)
        # fairseq keeps only complete_doc blocks longer than one token (a
        # lone EOS is an empty document); complete blocks are never empty.
        slices = _packed_slices(cum, block_size, is_sep, min_len=2 if break_mode == "complete_doc" else 1)
    return slices, _locate_blocks(cum, slices)


def _check_block_args(sizes: np.ndarray, block_size: int, break_mode: str) -> None:
    if break_mode not in BREAK_MODES:
        raise ConfigError(
            f"--sample-break-mode {break_mode!r} is not a known break mode; "
            f"use one of {', '.join(BREAK_MODES)}."
        )
    if not isinstance(block_size, (int, np.integer)) or block_size <= 0:
        raise ConfigError(
            f"--tokens-per-sample must be a positive integer, got {block_size!r}; "
            "set it to the model's context length (e.g. 512 or 1024)."
        )
    if len(sizes) == 0:
        raise DataError(
            "the dataset split has no lines, so there is nothing to cut into blocks; "
            "re-run preprocessing on a non-empty text file or leave this split out."
        )
    empty = np.flatnonzero(sizes <= 0)
    if len(empty):
        raise DataError(
            f"line {int(empty[0])} of the dataset has length {int(sizes[empty[0]])}, but every "
            "preprocessed line ends with EOS and so has at least one token; the .idx file is "
            "corrupt or was not written by preprocessing: re-run preprocessing for this split."
        )


def _first_true_at_or_after(mask: np.ndarray) -> np.ndarray:
    """For each j in [0, n], the smallest i >= j with mask[i], else n."""
    n = len(mask)
    positions = np.where(mask, np.arange(n, dtype=np.int64), n)
    out = np.full(n + 1, n, dtype=np.int64)
    out[:n] = np.minimum.accumulate(positions[::-1])[::-1]
    return out


def _follow_chain(next_node: np.ndarray, start: int) -> np.ndarray:
    """``[start, next[start], next[next[start]], ...]`` up to the sentinel.

    The sentinel is ``len(next_node) - 1`` and maps to itself. Pointer
    doubling keeps this O(n log(blocks)) in numpy instead of a Python loop
    over blocks; it relies on every chain step moving strictly forward.
    """
    sentinel = len(next_node) - 1
    visited = np.array([start], dtype=np.int64)
    jump = next_node  # jump == next applied 2**k times
    while visited[-1] != sentinel:
        visited = np.concatenate([visited, jump[visited]])
        jump = jump[jump]
    return visited[visited != sentinel]


def _packed_slices(cum: np.ndarray, block_size: int, is_sep: np.ndarray, min_len: int) -> np.ndarray:
    """fairseq's greedy ``complete``/``complete_doc`` packing.

    A block starting at line j takes lines while they fit in block_size (at
    least line j itself) and stops before a document separator; the next
    block starts at the next non-separator line.
    """
    n = len(is_sep)
    starts = np.arange(n, dtype=np.int64)
    fit_end = np.searchsorted(cum, cum[:-1] + block_size, side="right") - 1
    block_end = np.minimum(np.maximum(fit_end, starts + 1), _first_true_at_or_after(is_sep)[:n])
    next_content = _first_true_at_or_after(~is_sep)
    next_start = np.append(next_content[block_end], n)  # index n is the sentinel
    first = _follow_chain(next_start, int(next_content[0]))
    slices = np.stack([cum[first], cum[block_end[first]]], axis=1)
    return slices[slices[:, 1] - slices[:, 0] >= min_len]


def _locate_blocks(cum: np.ndarray, slices: np.ndarray) -> np.ndarray:
    """``(first_item, offset, last_item)`` of each block's token range."""
    first = np.searchsorted(cum, slices[:, 0], side="right") - 1
    last = np.searchsorted(cum, slices[:, 1] - 1, side="right") - 1
    return np.stack([first, slices[:, 0] - cum[first], last], axis=1)


class TokenBlockDataset(torch.utils.data.Dataset):
    """LM blocks of ``block_size`` tokens over ``dataset`` (a list of lines).

    ``dataset[i]`` is line i's token ids (each preprocessed line ends with
    EOS); ``sizes[i]`` its length. Only the lines a block spans are read.
    ``bos``: fairseq's --add-bos-token: this id is put before both source and
    target (as MonolingualDataset does), so a sample is one token longer.
    """

    def __init__(self, dataset, sizes, block_size: int, pad: int, eos: int,
                 break_mode: str, include_targets: bool = True, document_sep_len: int = 1,
                 bos: Optional[int] = None):
        if len(sizes) != len(dataset):
            raise ValueError(f"got {len(sizes)} sizes for a dataset of {len(dataset)} lines")
        self.dataset = dataset
        self.pad = pad
        self.eos = eos
        self.include_targets = include_targets
        self.bos = bos
        self._slices, self._block_to_item = build_block_index(sizes, block_size, break_mode, document_sep_len)
        self._lengths = self._slices[:, 1] - self._slices[:, 0]
        self.sizes = self._lengths + (0 if bos is None else 1)

    def __len__(self) -> int:
        return len(self._slices)

    def num_tokens(self, index: int) -> int:
        return int(self.sizes[index])

    def __getitem__(self, index: int) -> dict:
        first, offset, last = (int(x) for x in self._block_to_item[index])
        lines = [np.asarray(self.dataset[i]) for i in range(first, last + 1)]
        buffer = np.concatenate(lines).astype(np.int64, copy=False)
        end = offset + int(self._lengths[index])
        target = buffer[offset:end].copy()
        if not self.include_targets:
            return {"id": index, "source": self._with_bos(target), "target": None}
        if offset == 0:
            # As fairseq: a block that starts a line is preceded by EOS (the
            # previous line's last token, or a stand-in at the corpus start).
            source = np.concatenate([np.array([self.eos], dtype=np.int64), buffer[: end - 1]])
        else:
            source = buffer[offset - 1: end - 1].copy()  # own storage, apart from target's
        return {"id": index, "source": self._with_bos(source), "target": self._with_bos(target)}

    def _with_bos(self, tokens: np.ndarray) -> torch.Tensor:
        if self.bos is not None:
            tokens = np.concatenate([np.array([self.bos], dtype=np.int64), tokens])
        return torch.from_numpy(tokens)
