import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardtrain.data.batching import batch_by_size, ordered_indices
from shardtrain.core.errors import ConfigError


def as_lists(batches):
    return [b.tolist() for b in batches]


def test_batches_grow_while_longest_times_count_fits():
    sizes = np.array([2, 2, 3, 3, 4, 4, 5])
    batches = batch_by_size(np.arange(7), sizes, max_tokens=8)
    assert as_lists(batches) == [[0, 1], [2, 3], [4, 5], [6]]
    assert all(b.dtype == np.int64 for b in batches)


def test_num_tokens_may_be_a_function_and_indices_any_order():
    sizes = {10: 3, 11: 1, 12: 3, 13: 2}
    batches = batch_by_size([11, 13, 10, 12], sizes.__getitem__, max_tokens=6)
    assert as_lists(batches) == [[11, 13], [10, 12]]


def test_max_sentences_with_a_multiple_carries_the_remainder():
    batches = batch_by_size(np.arange(10), np.ones(10, int), max_sentences=5, required_batch_size_multiple=2)
    assert as_lists(batches) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    batches = batch_by_size(np.arange(7), np.ones(7, int), max_sentences=4, required_batch_size_multiple=3)
    assert as_lists(batches) == [[0, 1, 2], [3, 4, 5], [6]]


def test_a_tail_that_overflows_on_its_own_becomes_a_batch():
    # After [0..3] (a multiple of 4), 4 and 5 wait for a multiple; 6 overflows
    # both the batch and that tail, so [4, 5] is cut on its own.
    sizes = np.array([1, 1, 1, 1, 1, 2, 6, 6])
    batches = batch_by_size(np.arange(8), sizes, max_tokens=12, required_batch_size_multiple=4)
    assert as_lists(batches) == [[0, 1, 2, 3], [4, 5], [6, 7]]


def test_empty_indices_give_no_batches():
    assert batch_by_size(np.arange(0), np.arange(0), max_tokens=10) == []


def test_a_sample_longer_than_max_tokens_is_a_config_error():
    with pytest.raises(ConfigError, match=r"17 tokens.*--max-tokens 16.*--tokens-per-sample"):
        batch_by_size(np.arange(3), np.array([4, 17, 3]), max_tokens=16)


def test_a_batch_size_limit_is_required():
    with pytest.raises(ConfigError, match="--max-tokens.*--batch-size"):
        batch_by_size(np.arange(3), np.ones(3, int))
    with pytest.raises(ConfigError, match="--batch-size"):
        batch_by_size(np.arange(3), np.ones(3, int), max_sentences=0)


def greedy(lengths, max_tokens, max_sentences):
    """Plain greedy batching: the required_batch_size_multiple=1 oracle."""
    out, cur = [], []
    for i, n in enumerate(lengths):
        cand = cur + [i]
        if cur and (len(cand) > max_sentences or len(cand) * max(lengths[j] for j in cand) > max_tokens):
            out.append(cur)
            cand = [i]
        cur = cand
    return out + ([cur] if cur else [])


@settings(max_examples=200, deadline=None, database=None)
@given(
    lengths=st.lists(st.integers(1, 20), max_size=60),
    max_tokens=st.integers(20, 80),
    max_sentences=st.integers(1, 9),
    mult=st.integers(1, 4),
)
def test_batches_respect_limits_and_keep_order(lengths, max_tokens, max_sentences, mult):
    sizes = np.array(lengths, dtype=np.int64)
    batches = batch_by_size(np.arange(len(sizes)), sizes, max_tokens, max_sentences, mult)
    assert np.concatenate(batches or [np.arange(0)]).tolist() == list(range(len(sizes)))
    for b in batches:
        assert 0 < len(b) <= max_sentences
        assert len(b) * sizes[b].max() <= max_tokens
    if mult == 1:
        assert as_lists(batches) == greedy(lengths, max_tokens, max_sentences)
    elif len(set(lengths)) == 1 and min(max_sentences, max_tokens // lengths[0]) % mult == 0:
        # Uniform lengths and a size cap that is a multiple of mult: every
        # batch but the last is a multiple of mult.
        assert all(len(b) % mult == 0 for b in batches[:-1])


def test_ordered_indices_sort_by_size_with_ties_in_seeded_order():
    sizes = np.array([3, 1, 3, 2, 3, 1, 3, 3])
    perm = np.random.RandomState(5).permutation(len(sizes))
    expected = sorted(range(len(sizes)), key=lambda i: (sizes[i], perm[i]))
    assert ordered_indices(sizes, seed=5).tolist() == expected
    assert ordered_indices(sizes, seed=5, shuffle=False).tolist() == [1, 5, 3, 0, 2, 4, 6, 7]


def test_ordered_indices_depend_on_the_seed_only():
    sizes = np.repeat([4, 8], 50)
    a = ordered_indices(sizes, seed=1)
    assert (ordered_indices(sizes, seed=1) == a).all()
    assert not (ordered_indices(sizes, seed=2) == a).all()
    assert sorted(a[:50].tolist()) == list(range(50))
