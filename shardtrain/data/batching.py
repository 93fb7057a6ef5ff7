"""Size-ordered indices and token-budget batches, as fairseq 0.12 makes them."""
from typing import Callable, List, Optional, Union

import numpy as np

from shardtrain.core.errors import ConfigError


def ordered_indices(sizes: np.ndarray, *, seed: int, shuffle: bool = True) -> np.ndarray:
    """Indices sorted by size; equal sizes in an order drawn from ``seed``.

    This is fairseq's ``MonolingualDataset.ordered_indices`` under
    ``numpy_seed(seed)``: ``lexsort([permutation, sizes])``, so ties are
    broken by a random rank. fairseq's LM task draws it once from the run's
    seed (no epoch): the batches are frozen and only their order changes
    per epoch (see ``EpochBatchIterator``).
    """
    sizes = np.asarray(sizes)
    if shuffle:
        tie_break = np.random.RandomState(seed).permutation(len(sizes))
    else:
        tie_break = np.arange(len(sizes))
    return np.lexsort([tie_break, sizes])


def _tokens_per_index(indices: np.ndarray, num_tokens: Union[Callable[[int], int], np.ndarray]) -> np.ndarray:
    if callable(num_tokens):
        return np.fromiter((num_tokens(int(i)) for i in indices), dtype=np.int64, count=len(indices))
    return np.asarray(num_tokens, dtype=np.int64)[indices]


def _check_limits(lengths: np.ndarray, max_tokens: Optional[int], max_sentences: Optional[int]) -> None:
    if max_tokens is None and max_sentences is None:
        raise ConfigError(
            "no batch size given: set --max-tokens (tokens per batch) or --batch-size "
            "(sentences per batch), or both."
        )
    for flag, value in (("--max-tokens", max_tokens), ("--batch-size", max_sentences)):
        if value is not None and value <= 0:
            raise ConfigError(f"{flag} must be a positive integer, got {value}; raise it or leave it unset.")
    if max_tokens is not None and len(lengths) and lengths.max() > max_tokens:
        raise ConfigError(
            f"a sample has {int(lengths.max())} tokens, more than --max-tokens {max_tokens}, so it "
            "fits in no batch; raise --max-tokens to at least that or lower --tokens-per-sample."
        )


def batch_by_size(
    indices: np.ndarray,
    num_tokens: Union[Callable[[int], int], np.ndarray],
    max_tokens: Optional[int] = None,
    max_sentences: Optional[int] = None,
    required_batch_size_multiple: int = 1,
) -> List[np.ndarray]:
    """Split ``indices`` (in order) into batches, as fairseq's ``batch_by_size``.

    ``num_tokens`` is a function of a dataset index or an array of sizes
    indexed by dataset index. A batch grows while ``len * max(lengths) <=
    max_tokens`` and ``len <= max_sentences``; a batch is only extended to a
    size that is a multiple of ``required_batch_size_multiple`` (or below
    it), and the lines in between are carried into the next batch.
    """
    indices = np.asarray(indices, dtype=np.int64)
    lengths = _tokens_per_index(indices, num_tokens)
    _check_limits(lengths, max_tokens, max_sentences)
    if len(indices) == 0:
        return []
    ends = _batch_ends(lengths, max_tokens or np.iinfo(np.int64).max,
                       max_sentences or np.iinfo(np.int64).max, required_batch_size_multiple)
    return np.split(indices, ends[:-1])


def _batch_ends(lengths: np.ndarray, max_tokens: int, max_sentences: int, mult: int) -> List[int]:
    """End offsets of the batches: a transcription of fairseq's ``batch_by_size_vec``.

    ``ends[-1]`` ends the running batch ``[batch_start, ends[-1])`` whose size
    obeys the multiple rule; ``[ends[-1], pos]`` is the tail not yet added.
    One O(n) pass: the cut points depend on each other, so it is sequential.
    """
    ends = [0]
    batch_start = 0
    batch_max = 0
    tail_max = 0
    for pos, length in enumerate(lengths.tolist()):
        tail_max = max(tail_max, length)
        count = pos + 1 - batch_start
        overflow = count > max_sentences or count * max(batch_max, tail_max) > max_tokens
        if overflow:
            # The running batch is final; the tail plus pos starts the next
            # one, unless the tail alone is already too big: then the tail
            # becomes a batch of its own and pos starts the next one.
            if tail_max * (pos + 1 - ends[-1]) > max_tokens:
                ends.append(pos)
                tail_max = length
            batch_start = ends[-1]
            ends.append(pos + 1)
            batch_max, tail_max = tail_max, 0
        elif count < mult or count % mult == 0:
            ends[-1] = pos + 1
            batch_max, tail_max = max(batch_max, tail_max), 0
    if ends[-1] != len(lengths):
        ends.append(len(lengths))
    return ends
