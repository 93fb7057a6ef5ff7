"""Whitespace tokenizer, sentencepiece training/encode/decode, preprocess.json loading."""
import json
import pickle
import random

import pytest

from shardtrain.data.tokenizers import (SentencePieceTokenizer, SpaceTokenizer, load_tokenizer, tokenize_line,
                                        train_sentencepiece)
from shardtrain.core.errors import ConfigError, DataError


def corpus(n=300, seed=0):
    """Code-like and prose-like lines: indentation, tabs, digits, punctuation, non-ASCII."""
    rng = random.Random(seed)
    names = ["alpha", "beta", "gamma", "delta", "value", "count", "über", "naïve"]
    lines = []
    for i in range(n):
        a, b = rng.choice(names), rng.choice(names)
        lines += [f"def {a}_{i}({b}):", f"    return {b} * {rng.randrange(100)}  # {a} and {b}",
                  f"\tif {a} != {b}: pass", f"The {a} of the {b} is {rng.randrange(10)}."]
    return lines


def test_tokenize_line_is_fairseqs_whitespace_split():
    assert tokenize_line("  a\tb \n c\r\n") == ["a", "b", "c"]
    assert tokenize_line("\u3000x\u00a0y") == ["x", "y"]  # unicode whitespace counts too
    assert tokenize_line("") == [] and tokenize_line(" \t\n") == []
    tok = SpaceTokenizer()
    assert tok.encode("x  y") == ["x", "y"] and tok.decode(["x", "y"]) == "x y"


@pytest.mark.parametrize("model_type", ["unigram", "bpe"])
def test_spm_train_encode_decode_round_trip(tmp_path, model_type):
    lines = corpus()
    path = tmp_path / "m.model"
    train_sentencepiece(lines, str(path), vocab_size=200, model_type=model_type)
    tok = SentencePieceTokenizer(str(path))
    unseen = "    return naïve * 42  # zebra € 漢字\t"
    for line in lines[:40] + [unseen, "", "  two  spaces  "]:
        pieces = tok.encode(line)
        assert all(isinstance(p, str) and p and " " not in p for p in pieces)  # usable as dict.txt symbols
        assert tok.decode(pieces) == line
    assert tok._processor.get_piece_size() <= 200
    # Deterministic: training again gives the same model file, byte for byte.
    again = tmp_path / "again.model"
    train_sentencepiece(lines, str(again), vocab_size=200, model_type=model_type)
    assert again.read_bytes() == path.read_bytes()
    clone = pickle.loads(pickle.dumps(tok))  # worker processes receive the tokenizer pickled
    assert clone.encode(unseen) == tok.encode(unseen)


def test_spm_pieces_are_subwords_not_just_characters(tmp_path):
    path = tmp_path / "m.model"
    train_sentencepiece(corpus(), str(path), vocab_size=300, model_type="bpe")
    pieces = SentencePieceTokenizer(str(path)).encode("return alpha")
    assert len(pieces) < len("return alpha") / 2


def test_spm_training_errors_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="--spm-vocab-size"):
        train_sentencepiece(corpus(20), str(tmp_path / "m.model"), vocab_size=5)
    assert not (tmp_path / "m.model").exists()


def test_bad_spm_model_is_a_data_error(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        SentencePieceTokenizer(str(tmp_path / "missing.model"))
    junk = tmp_path / "junk.model"
    junk.write_bytes(b"not a model")
    with pytest.raises(DataError, match="not a valid sentencepiece model"):
        SentencePieceTokenizer(str(junk))


def test_load_tokenizer_reads_preprocess_json(tmp_path):
    assert isinstance(load_tokenizer(str(tmp_path)), SpaceTokenizer)  # fairseq data-bin: no json
    train_sentencepiece(corpus(50), str(tmp_path / "spm.model"), vocab_size=100)
    (tmp_path / "preprocess.json").write_text(json.dumps({"tokenizer": "spm", "spm_model": "spm.model"}))
    tok = load_tokenizer(str(tmp_path))
    assert isinstance(tok, SentencePieceTokenizer) and tok.decode(tok.encode("beta gamma")) == "beta gamma"
    (tmp_path / "preprocess.json").write_text(json.dumps({"tokenizer": "space", "spm_model": None}))
    assert isinstance(load_tokenizer(str(tmp_path)), SpaceTokenizer)


@pytest.mark.parametrize("content, match", [
    ("{not json", "Cannot read"),
    ('{"tokenizer": "bpe"}', "should hold"),
    ('["spm"]', "should hold"),
    ('{"tokenizer": "spm", "spm_model": null}', "should hold"),
    ('{"tokenizer": "spm", "spm_model": "gone.model"}', "does not exist"),
])
def test_bad_preprocess_json_is_a_data_error(tmp_path, content, match):
    (tmp_path / "preprocess.json").write_text(content)
    with pytest.raises(DataError, match=match):
        load_tokenizer(str(tmp_path))
