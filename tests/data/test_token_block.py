import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from shardtrain.data.token_block import TokenBlockDataset, build_block_index
from shardtrain.core.errors import ConfigError, DataError

from fakes import EOS, PAD, FakeIndexedDataset, lines_with_sizes

# Stream: 10 11 12 2 | 13 2 | 2 | 14 15 16 17 18 2 | 19 2   (line starts 0 4 6 7 13, total 15)
LINES = [[10, 11, 12, 2], [13, 2], [2], [14, 15, 16, 17, 18, 2], [19, 2]]


def blocks(break_mode, block_size, lines=LINES, include_targets=True):
    data = FakeIndexedDataset(lines)
    ds = TokenBlockDataset(data, data.sizes, block_size, PAD, EOS, break_mode, include_targets)
    return ds, data


def as_lists(ds):
    return [(ds[i]["source"].tolist(), ds[i]["target"].tolist()) for i in range(len(ds))]


def test_none_mode_cuts_the_stream_and_shifts_source():
    ds, _ = blocks("none", 4)
    assert ds.sizes.tolist() == [4, 4, 4, 3]
    assert as_lists(ds) == [
        ([2, 10, 11, 12], [10, 11, 12, 2]),
        ([2, 13, 2, 2], [13, 2, 2, 14]),  # starts a line: EOS before it
        ([14, 15, 16, 17], [15, 16, 17, 18]),  # mid-line: the previous token
        ([18, 2, 19], [2, 19, 2]),  # the last block is shorter
    ]


def test_complete_mode_packs_whole_lines():
    ds, _ = blocks("complete", 6)
    assert ds.sizes.tolist() == [6, 1, 6, 2]
    assert as_lists(ds) == [
        ([2, 10, 11, 12, 2, 13], [10, 11, 12, 2, 13, 2]),
        ([2], [2]),
        ([2, 14, 15, 16, 17, 18], [14, 15, 16, 17, 18, 2]),
        ([2, 19], [19, 2]),
    ]


def test_complete_mode_gives_a_long_line_its_own_block():
    ds, _ = blocks("complete", 3)
    assert ds.sizes.tolist() == [4, 3, 6, 2]
    assert ds[2]["target"].tolist() == [14, 15, 16, 17, 18, 2]


def test_complete_doc_never_crosses_an_empty_line():
    ds, _ = blocks("complete_doc", 6)
    assert ds.sizes.tolist() == [6, 6, 2]
    ds, _ = blocks("complete_doc", 20)
    assert as_lists(ds) == [
        ([2, 10, 11, 12, 2, 13], [10, 11, 12, 2, 13, 2]),
        ([2, 14, 15, 16, 17, 18, 2, 19], [14, 15, 16, 17, 18, 2, 19, 2]),
    ]


def test_complete_doc_drops_empty_documents():
    lines = [[2], [2], [5, 2], [2], [2], [6, 7, 2], [2]]
    ds, _ = blocks("complete_doc", 8, lines)
    assert [t for _, t in as_lists(ds)] == [[5, 2], [6, 7, 2]]


def test_eos_mode_is_one_line_per_block_truncated():
    ds, _ = blocks("eos", 4)
    assert ds.sizes.tolist() == [4, 2, 1, 4, 2]
    assert ds[3]["target"].tolist() == [14, 15, 16, 17]
    assert ds[3]["source"].tolist() == [2, 14, 15, 16]
    assert ds[2]["source"].tolist() == [2] and ds[2]["target"].tolist() == [2]


def test_item_format_and_dtype():
    ds, _ = blocks("none", 4)
    item = ds[1]
    assert item["id"] == 1
    assert item["source"].dtype == torch.long and item["target"].dtype == torch.long
    assert len(ds) == 4


def test_without_targets_source_is_the_block():
    ds, _ = blocks("none", 4, include_targets=False)
    assert ds[2]["source"].tolist() == [15, 16, 17, 18]
    assert ds[2]["target"] is None


def test_reads_only_the_lines_a_block_spans():
    ds, data = blocks("none", 4)
    data.reads.clear()
    ds[2]  # tokens 8..12 lie inside line 3
    assert data.reads == [3]
    data.reads.clear()
    ds[1]  # tokens 4..8 span lines 1, 2 and 3
    assert data.reads == [1, 2, 3]


def test_bad_arguments_raise_user_errors():
    with pytest.raises(ConfigError, match="--sample-break-mode"):
        blocks("sentence", 4)
    with pytest.raises(ConfigError, match="--tokens-per-sample"):
        blocks("none", 0)
    with pytest.raises(DataError, match="no lines"):
        blocks("none", 4, lines=[])
    with pytest.raises(DataError, match="line 1"):
        build_block_index(np.array([3, 0, 2]), 4, "complete")


# fairseq 0.12's loops (token_block_utils_fast.pyx), transcribed as the oracle.
def fairseq_slices(sizes, mode, block_size, sep_len=1):
    if mode == "none":
        total = sum(sizes)
        return [(s, min(s + block_size, total)) for s in range(0, total, block_size)]
    if mode == "eos":  # plus our truncation
        starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
        return [(s, s + min(n, block_size)) for s, n in zip(starts.tolist(), sizes)]
    out, tok, i, cur = [], 0, 0, 0
    doc = mode == "complete_doc"
    while i < len(sizes):
        if (cur + sizes[i] <= block_size or cur == 0) and not (doc and sizes[i] == sep_len):
            cur += sizes[i]
            i += 1
        else:
            if not doc or cur > 1:
                out.append((tok, tok + cur))
            tok += cur
            cur = 0
            if doc and sizes[i] == sep_len:
                tok += sizes[i]
                i += 1
    if cur > (1 if doc else 0):
        out.append((tok, tok + cur))
    return out


@settings(max_examples=150, deadline=None, database=None)
@given(
    sizes=st.lists(st.integers(1, 9), min_size=1, max_size=40),
    mode=st.sampled_from(["none", "complete", "complete_doc", "eos"]),
    block_size=st.integers(1, 12),
    sep_len=st.sampled_from([1, 2]),
)
def test_matches_fairseq_loops_and_stream_shift(sizes, mode, block_size, sep_len):
    lines = lines_with_sizes(sizes, seed=len(sizes))
    data = FakeIndexedDataset(lines)
    ds = TokenBlockDataset(data, data.sizes, block_size, PAD, EOS, mode, document_sep_len=sep_len)
    slices, _ = build_block_index(np.array(sizes), block_size, mode, document_sep_len=sep_len)
    assert [tuple(s) for s in slices.tolist()] == fairseq_slices(sizes, mode, block_size, sep_len)
    assert ds.sizes.tolist() == [e - s for s, e in slices.tolist()]
    stream = [t for line in lines for t in line]
    line_starts = set(np.concatenate([[0], np.cumsum(sizes)]).tolist())
    for i, (s, e) in enumerate(slices.tolist()):
        item = ds[i]
        assert item["target"].tolist() == stream[s:e]
        first = [EOS] if s in line_starts else [stream[s - 1]]
        assert item["source"].tolist() == first + stream[s:e - 1]


def test_large_corpus_indexes_quickly():
    # Two million lines: a Python loop per line would take many seconds.
    sizes = np.random.RandomState(0).randint(1, 60, size=2_000_000)
    for mode in ("complete", "complete_doc"):
        slices, block_to_item = build_block_index(sizes, 512, mode)
        assert slices[-1, 1] == sizes.sum() or mode == "complete_doc"
        assert (slices[:, 1] - slices[:, 0]).max() <= 512
        assert (block_to_item[:, 1] == 0).all()
