"""preprocess(): fairseq byte-for-byte reproduction, spm data-bins, up-front validation, atomicity."""
import dataclasses
import json
import os
import random
from collections import Counter

import pytest

from shardtrain.data.dictionary import Dictionary
from shardtrain.data.indexed_dataset import MMapIndexedDataset
from shardtrain.data.manifest import MANIFEST
from shardtrain.data.preprocess import PreprocessConfig, load_tokenizer, preprocess
from shardtrain.data.tokenizers import SentencePieceTokenizer, SpaceTokenizer
from shardtrain.core.errors import ConfigError, DataError

FAIRSEQ_FILES = ["dict.txt", "train.bin", "train.idx", "valid.bin", "valid.idx"]


def space_cfg(fairseq_dir, destdir, **changes):
    cfg = PreprocessConfig(tokenizer="space", trainpref=str(fairseq_dir / "train.txt"),
                           validpref=str(fairseq_dir / "valid.txt"), destdir=str(destdir), no_progress_bar=True)
    return dataclasses.replace(cfg, **changes)


def listing(path):
    return {n: (path / n).read_bytes() for n in sorted(os.listdir(path))}


@pytest.mark.slow
@pytest.mark.parametrize("workers", [1, 2])
def test_reproduces_fairseq_preprocess_byte_for_byte(tmp_path, fairseq_dir, workers):
    out = tmp_path / "data-bin"
    preprocess(space_cfg(fairseq_dir, out, workers=workers))
    assert sorted(os.listdir(out)) == sorted(FAIRSEQ_FILES + ["preprocess.json", MANIFEST])
    for name in FAIRSEQ_FILES:
        assert (out / name).read_bytes() == (fairseq_dir / name).read_bytes(), name
    assert json.loads((out / "preprocess.json").read_text()) == {"tokenizer": "space", "spm_model": None,
                                                              "manifest": "manifest.json"}
    assert isinstance(load_tokenizer(str(out)), SpaceTokenizer)


def test_threshold_and_nwords_follow_fairseq_ordering(tmp_path, fairseq_dir):
    # Independent expectation: counts from the text, sorted by (-count, word), padded to 8.
    counts = Counter((fairseq_dir / "train.txt").read_text().split())
    kept = [w for w, c in sorted(counts.items(), key=lambda wc: (-wc[1], wc[0])) if c >= 150]
    preprocess(space_cfg(fairseq_dir, tmp_path / "t", thresholdsrc=150, validpref=None))
    d = Dictionary.load(str(tmp_path / "t" / "dict.txt"))
    pads = [f"madeupword{i:04d}" for i in range(-(4 + len(kept)) % 8)]
    assert d.symbols[4:] == kept + pads
    preprocess(space_cfg(fairseq_dir, tmp_path / "n", nwordssrc=10, padding_factor=1, validpref=None))
    assert Dictionary.load(str(tmp_path / "n" / "dict.txt")).symbols[4:] == kept[:6]


def test_srcdict_is_reused(tmp_path, fairseq_dir):
    out = tmp_path / "v"
    preprocess(space_cfg(fairseq_dir, out, trainpref=None, srcdict=str(fairseq_dir / "dict.txt")))
    for name in ("dict.txt", "valid.bin", "valid.idx"):
        assert (out / name).read_bytes() == (fairseq_dir / name).read_bytes()


def spm_corpus(tmp_path):
    rng = random.Random(1)
    words = ["alpha", "beta", "gamma", "delta", "über", "x1", "return", "(", ")", ":"]
    lines = ["    ".join(rng.choice(words) for _ in range(rng.randrange(1, 9))) for _ in range(300)]
    train, valid = tmp_path / "train.txt", tmp_path / "valid.txt"
    train.write_text("\n".join(lines[:250]) + "\n\n")
    valid.write_text("\n".join(lines[250:]) + "\nunseen € chars\n")
    return train, valid, lines


@pytest.mark.slow
def test_spm_data_bin_round_trips_and_is_worker_independent(tmp_path):
    train, valid, lines = spm_corpus(tmp_path)
    outputs = []
    for workers in (1, 2):
        out = tmp_path / f"spm{workers}"
        preprocess(PreprocessConfig(trainpref=str(train), validpref=str(valid), destdir=str(out), workers=workers,
                                    spm_vocab_size=60, spm_model_type="bpe", no_progress_bar=True))
        outputs.append(listing(out))
    assert outputs[0] == outputs[1]
    out = tmp_path / "spm1"
    assert json.loads((out / "preprocess.json").read_text()) == {"tokenizer": "spm", "spm_model": "spm.model",
                                                              "manifest": "manifest.json"}
    tok, d = load_tokenizer(str(out)), Dictionary.load(str(out / "dict.txt"))
    assert isinstance(tok, SentencePieceTokenizer)
    ds = MMapIndexedDataset(str(out / "train"))
    assert len(ds) == 251 and ds[250].tolist() == [d.eos()]  # the empty last line
    for i in (0, 7, 249):
        assert tok.decode(d.string(ds[i]).split(" ")) == lines[i]
    valid_ds = MMapIndexedDataset(str(out / "valid"))
    assert d.unk() in valid_ds[len(valid_ds) - 1].tolist()  # € never seen in training
    # Reusing the trained model and dictionary gives the same data-bin.
    again = tmp_path / "again"
    preprocess(PreprocessConfig(trainpref=str(train), validpref=str(valid), destdir=str(again),
                                spm_model=str(out / "spm.model"), srcdict=str(out / "dict.txt"),
                                no_progress_bar=True))
    assert listing(again) == outputs[0]


def bad(tmp_path, fairseq_dir, **changes):
    return space_cfg(fairseq_dir, **{"destdir": tmp_path / "out", **changes})


@pytest.mark.parametrize("changes, error, words", [
    (dict(trainpref="/nonexistent/train.txt"), DataError, ["--trainpref", "no such file"]),
    (dict(validpref="/nonexistent/valid.txt"), DataError, ["--validpref", "no such file"]),
    (dict(tokenizer="spm", spm_model="m.model", spm_vocab_size=100), ConfigError, ["--spm-vocab-size", "--spm-model"]),
    (dict(spm_model="m.model"), ConfigError, ["--spm-model", "--tokenizer spm"]),
    (dict(tokenizer="spm", srcdict="d.txt"), ConfigError, ["--srcdict", "--spm-model"]),
    (dict(trainpref=None, validpref=None), ConfigError, ["--trainpref", "--validpref"]),
    (dict(trainpref=None), ConfigError, ["--trainpref", "--srcdict"]),
    (dict(workers=0), ConfigError, ["--workers"]),
    (dict(tokenizer="bpe"), ConfigError, ["--tokenizer", "spm, space"]),
    (dict(spm_model_type="char"), ConfigError, ["--spm-model-type"]),
    (dict(padding_factor=0), ConfigError, ["--padding-factor"]),
    (dict(srcdict="/nonexistent/dict.txt"), DataError, ["--srcdict", "no such file"]),
])
def test_bad_flags_fail_up_front(tmp_path, fairseq_dir, changes, error, words):
    with pytest.raises(error) as info:
        preprocess(bad(tmp_path, fairseq_dir, **changes))
    assert all(w in str(info.value) for w in words), str(info.value)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("content", [b"", b"  \n\n\t\n"])
@pytest.mark.parametrize("split", ["train", "valid", "test"])
def test_empty_input_file(tmp_path, fairseq_dir, content, split):
    (tmp_path / "empty.txt").write_bytes(content)
    with pytest.raises(DataError, match=f"--{split}pref .* is empty"):
        preprocess(bad(tmp_path, fairseq_dir, **{f"{split}pref": str(tmp_path / "empty.txt")}))
    assert not (tmp_path / "out").exists()


def test_unwritable_destdir(tmp_path, fairseq_dir):
    (tmp_path / "file").write_text("x")
    with pytest.raises(DataError, match="Cannot write to --destdir"):
        preprocess(bad(tmp_path, fairseq_dir, destdir=str(tmp_path / "file" / "sub")))
    with pytest.raises(DataError, match="not a directory"):
        preprocess(bad(tmp_path, fairseq_dir, destdir=str(tmp_path / "file")))


def test_failure_midway_leaves_destdir_untouched(tmp_path, fairseq_dir):
    (tmp_path / "valid.txt").write_bytes(b"fine\nbroken \xff\n")  # fails after train is binarized
    fresh = tmp_path / "fresh"
    with pytest.raises(DataError, match="not valid UTF-8"):
        preprocess(bad(tmp_path, fairseq_dir, destdir=str(fresh), validpref=str(tmp_path / "valid.txt")))
    assert not fresh.exists()
    existing = tmp_path / "existing"
    preprocess(space_cfg(fairseq_dir, existing))
    before = listing(existing)
    with pytest.raises(DataError):
        preprocess(bad(tmp_path, fairseq_dir, destdir=str(existing), validpref=str(tmp_path / "valid.txt"),
                       thresholdsrc=100))
    assert listing(existing) == before and sorted(os.listdir(existing)) == sorted(before)


def test_failure_removes_the_parents_it_created(tmp_path, fairseq_dir):
    (tmp_path / "valid.txt").write_bytes(b"broken \xff\n")
    with pytest.raises(DataError, match="not valid UTF-8"):
        preprocess(bad(tmp_path, fairseq_dir, destdir=str(tmp_path / "a" / "b" / "bin"),
                       validpref=str(tmp_path / "valid.txt")))
    assert not (tmp_path / "a").exists()


@pytest.mark.slow
def test_huge_worker_count_is_capped_and_logged(tmp_path, fairseq_dir, caplog):
    # Uncapped, this would start 100000 processes for a 300-line file (fairseq does).
    caplog.set_level("INFO", logger="shardtrain.data.preprocess")
    preprocess(space_cfg(fairseq_dir, tmp_path / "out", workers=100_000))
    cap = 2 * len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 2 * os.cpu_count()
    assert f"--workers 100000 capped at {cap}" in caplog.text
    for name in FAIRSEQ_FILES:
        assert (tmp_path / "out" / name).read_bytes() == (fairseq_dir / name).read_bytes(), name


def test_pool_never_exceeds_the_work(tmp_path):
    from shardtrain.data.binarize import _plan, usable_workers
    path = tmp_path / "two.txt"
    path.write_text("a b\nc d\n")
    assert usable_workers(10**9) <= 2 * (os.cpu_count() or 1) and usable_workers(3) <= 3
    ranges, workers = _plan(str(path), 10**9)
    assert workers <= 2 and all(end > start for start, end in ranges)
    assert _plan(str(tmp_path / "two.txt"), 1) == ([(0, 8)], 1)


def test_splits_of_another_dictionary_are_not_left_beside_a_new_one(tmp_path, fairseq_dir):
    dest = tmp_path / "bin"
    preprocess(space_cfg(fairseq_dir, dest))  # train + valid
    before = listing(dest)
    # the same corpus again, train only: the same dict.txt, so the old valid split still fits
    preprocess(space_cfg(fairseq_dir, dest, validpref=None))
    assert listing(dest) == before
    # another corpus, train only: valid.* would be read with the new dict.txt's ids
    (tmp_path / "other.txt").write_text("completely different words here\n" * 20)
    with pytest.raises(DataError, match=r"holds valid.bin, valid.idx from an earlier run.*nothing was changed"):
        preprocess(space_cfg(fairseq_dir, dest, trainpref=str(tmp_path / "other.txt"), validpref=None))
    assert listing(dest) == before
