"""Line splitting, byte ranges, counting and binarizing; any worker count gives the same bytes."""
import os
import random
from collections import Counter

import pytest

from shardtrain.data.binarize import binarize_file, count_symbols, find_offsets, iter_lines
from shardtrain.data.dictionary import Dictionary
from shardtrain.data.indexed_dataset import MMapIndexedDataset
from shardtrain.data.tokenizers import tokenize_line
from shardtrain.core.errors import DataError

# Python's universal newlines (fairseq reads text that way): \r\n, \r and \n end lines.
RAW = "a b\r\nc\rd\n\n  \ne f g\n\u00e9t\u00e9 <unk> zz\nlast".encode("utf-8")
LINES = ["a b", "c", "d", "", "  ", "e f g", "\u00e9t\u00e9 <unk> zz", "last"]


@pytest.fixture
def text_file(tmp_path):
    path = tmp_path / "text.txt"
    path.write_bytes(RAW)
    return str(path)


@pytest.fixture
def big_file(tmp_path):
    rng = random.Random(0)
    words = [f"w{i}" for i in range(40)] + ["\u00fcber", "x\r"]
    lines = [" ".join(rng.choice(words) for _ in range(rng.randrange(0, 12))) for _ in range(400)]
    path = tmp_path / "big.txt"
    path.write_bytes("\n".join(lines).encode("utf-8"))  # no final newline
    return str(path)


def test_iter_lines_uses_universal_newlines(text_file):
    assert list(iter_lines(text_file)) == LINES


@pytest.mark.parametrize("chunks", [1, 2, 3, 5, 40])
def test_ranges_start_on_lines_and_cover_the_file(text_file, chunks):
    offsets = find_offsets(text_file, chunks)
    assert offsets[0] == 0 and offsets[-1] == len(RAW) and offsets == sorted(offsets)
    assert all(o == len(RAW) or RAW[o - 1:o] == b"\n" for o in offsets[1:-1])
    lines = [line for a, b in zip(offsets, offsets[1:]) for line in iter_lines(text_file, a, b)]
    assert lines == LINES


def test_invalid_utf8_names_the_byte(tmp_path):
    path = tmp_path / "bad.txt"
    path.write_bytes(b"ok\nbad \xff here\n")
    with pytest.raises(DataError, match=r"not valid UTF-8 .* at byte 7"):
        list(iter_lines(str(path)))


@pytest.mark.slow
def test_count_symbols_counts_one_eos_per_line(text_file):
    expected = Counter(w for line in LINES for w in line.split())
    expected["</s>"] = len(LINES)
    assert count_symbols(text_file, tokenize_line, progress=False) == expected
    assert count_symbols(text_file, tokenize_line, workers=2, progress=False) == expected


def test_binarize_items(tmp_path, text_file):
    d = Dictionary()
    for word in ("a", "b", "c", "e", "g"):
        d.add_symbol(word)  # ids 4..8
    stats = binarize_file(text_file, str(tmp_path / "out"), d, tokenize_line, progress=False)
    ds = MMapIndexedDataset(str(tmp_path / "out"))
    assert [ds[i].tolist() for i in range(len(ds))] == [
        [4, 5, 2], [6, 2], [3, 2], [2], [2], [7, 3, 8, 2], [3, 3, 3, 2], [3, 2]]
    # Unknown words: d, f, été, zz, last; a literal <unk> is not a replacement.
    assert (stats.num_seq, stats.num_tok, stats.num_replaced) == (8, 19, 5)
    assert sorted(os.listdir(tmp_path)) == ["out.bin", "out.idx", "text.txt"]  # worker parts cleaned up


@pytest.mark.slow
def test_output_is_identical_for_any_worker_count(tmp_path, big_file):
    d = Dictionary()
    d.update_counts(count_symbols(big_file, tokenize_line, progress=False))
    d.finalize()
    outputs = []
    for workers in (1, 2, 3):
        assert count_symbols(big_file, tokenize_line, workers=workers, progress=False) == \
            count_symbols(big_file, tokenize_line, progress=False)
        prefix = str(tmp_path / f"w{workers}")
        binarize_file(big_file, prefix, d, tokenize_line, workers=workers, progress=False)
        outputs.append((open(prefix + ".bin", "rb").read(), open(prefix + ".idx", "rb").read()))
    assert outputs[0] == outputs[1] == outputs[2]
    ds = MMapIndexedDataset(str(tmp_path / "w1"))
    with open(big_file, encoding="utf-8") as f:  # universal newlines, independently of iter_lines
        lines = f.read().split("\n")
    assert len(ds) == len(lines) and d.string(ds[17]) == " ".join(lines[17].split())


def test_empty_file_gives_empty_dataset(tmp_path):
    path = tmp_path / "empty.txt"
    path.write_bytes(b"")
    binarize_file(str(path), str(tmp_path / "e"), Dictionary(), tokenize_line, workers=2, progress=False)
    assert len(MMapIndexedDataset(str(tmp_path / "e"))) == 0
