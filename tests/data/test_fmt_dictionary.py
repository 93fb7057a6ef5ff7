"""Dictionary: fairseq's ids, finalize ordering/padding, dict.txt reading and writing."""
import os
from collections import Counter

import pytest
import torch

from shardtrain.data.dictionary import Dictionary, post_process
from shardtrain.core.errors import DataError

SPECIALS = ["<s>", "<pad>", "</s>", "<unk>"]


def make(counts):
    d = Dictionary()
    for word, n in counts:
        d.add_symbol(word, n)
    return d


def test_specials_have_fairseq_ids():
    d = Dictionary()
    assert (d.bos(), d.pad(), d.eos(), d.unk()) == (0, 1, 2, 3)
    assert d.symbols == SPECIALS and len(d) == 4 and d.nspecial == 4
    assert d.index("never-seen") == 3 and d[99] == "<unk>"


def test_finalize_orders_by_count_then_symbol_and_pads():
    # Insertion order deliberately differs from the expected order.
    d = make([("e", 3), ("d", 1), ("b", 3), ("c", 5), ("a", 3)])
    d.finalize()
    pads = [f"madeupword{i:04d}" for i in range(7)]  # 9 symbols -> padded to 16
    assert d.symbols == SPECIALS + ["c", "a", "b", "e", "d"] + pads
    assert d.count == [1, 1, 1, 1, 5, 3, 3, 3, 1] + [0] * 7
    assert [d.index(s) for s in ("c", "a", "b", "e", "d")] == [4, 5, 6, 7, 8]
    assert d.index("madeupword0006") == 15


def test_finalize_threshold_nwords_and_padding_factor():
    counts = [("e", 3), ("d", 1), ("b", 3), ("c", 5), ("a", 3)]
    d = make(counts)
    d.finalize(threshold=3)  # drops d; 8 symbols is already a multiple of 8
    assert d.symbols == SPECIALS + ["c", "a", "b", "e"]
    d = make(counts)
    d.finalize(nwords=6)  # nwords counts the specials: keeps 2 words, pads 6 -> 8
    assert d.symbols == SPECIALS + ["c", "a", "madeupword0000", "madeupword0001"]
    d = make(counts)
    d.finalize(padding_factor=1)
    assert len(d) == 9


def test_update_counts_adds_eos_to_the_special():
    d = Dictionary()
    d.update_counts(Counter({"x": 2, "</s>": 5}))
    d.finalize(padding_factor=1)
    assert d.symbols == SPECIALS + ["x"] and d.count[d.eos()] == 6


def test_save_writes_fairseq_format_atomically(tmp_path):
    d = make([("b", 2), ("a", 2), ("zz", 7)])
    d.finalize(padding_factor=4)
    path = tmp_path / "dict.txt"
    path.write_text("old contents\n")
    d.save(str(path))
    assert path.read_bytes() == b"zz 7\na 2\nb 2\nmadeupword0000 0\n"
    assert sorted(os.listdir(tmp_path)) == ["dict.txt"]  # no temp file left over
    loaded = Dictionary.load(str(path))
    assert loaded == d and loaded.symbols == d.symbols and loaded.count == d.count


def test_encode_line_and_string():
    d = make([("c", 5), ("a", 3)])
    d.finalize()
    ids = d.encode_line("c  x\ta\n")
    assert ids.dtype == torch.int32 and ids.tolist() == [4, 3, 5, 2]
    assert d.encode_line("c", append_eos=False).tolist() == [4]
    assert d.encode_line("   ").tolist() == [2]
    assert len(d) == 8  # encoding never grew the dictionary
    assert d.string(ids) == "c <unk> a"
    assert d.string(ids, include_eos=True, escape_unk=True) == "c <<unk>> a </s>"
    assert d.string(torch.tensor([[0, 4], [5, 2]])) == "c\na"
    replaced = []
    d.encode_line("x c", consumer=lambda w, i: replaced.append((w, i)))
    assert replaced == [("x", 3), ("c", 4)]


def test_post_process_sentencepiece():
    assert post_process("\u2581he llo \u2581wor ld", "sentencepiece") == "hello world"
    assert post_process("he@@ llo world", "subword_nmt") == "hello world"
    assert post_process("a b", None) == "a b"


def test_overwrite_flag_is_accepted(tmp_path):
    path = tmp_path / "dict.txt"
    path.write_text("a 1\nb 4\na 2 #fairseq:overwrite\n")
    d = Dictionary.load(str(path))
    assert d.symbols == SPECIALS + ["a", "b", "a"] and d.index("a") == 6 and d.count[6] == 2


def test_fairseq_dict_loads(fairseq_dir):
    d = Dictionary.load(str(fairseq_dir / "dict.txt"))
    assert len(d) == 360
    assert d[4] == "vomidi" and d.count[4] == 244
    assert d[359] == "madeupword0006" and d.index("zz-not-a-word") == d.unk()


@pytest.mark.parametrize("content, line", [
    ("a 1\nb\n", 2),                # no count
    ("a 1\nb two\n", 2),            # count not an integer
    ("a 1\n\nb 2\n", 2),            # blank line
    ("a 1\nb 2\na 3\n", 3),         # duplicate symbol
    ("x 1\n<unk> 5\n", 2),          # clashes with a special
    ("a 1 #fairseq:overwrite\nb 1.5\n", 2),
])
def test_malformed_dict_names_file_and_line(tmp_path, content, line):
    path = tmp_path / "dict.txt"
    path.write_text(content)
    with pytest.raises(DataError) as info:
        Dictionary.load(str(path))
    message = str(info.value)
    assert str(path) in message and f"line {line}" in message
    assert "shard-preprocess" in message or "#fairseq:overwrite" in message  # says how to fix it


def test_missing_and_undecodable_dict(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        Dictionary.load(str(tmp_path / "nope.txt"))
    bad = tmp_path / "latin1.txt"
    bad.write_bytes(b"caf\xe9 3\n")
    with pytest.raises(DataError, match="not valid UTF-8"):
        Dictionary.load(str(bad))
