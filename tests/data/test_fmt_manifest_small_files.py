"""Every file of a data-bin, one kind at a time (issue 29: a mutant that stopped checking a small
file other than dict.txt survived). What shard-preprocess writes is listed here by hand, and for each
file what a task must say when it opens a data-bin where that file was changed (same size),
truncated or deleted: the expectations are written down, not read from shardtrain/data/manifest.py.

The small files are checked byte for byte (CRC-32) when a task opens the data-bin: dict.txt,
preprocess.json, spm.model, and the .idx (read whole at start anyway). A .bin only by its size then;
its bytes by ``shard-verify``. manifest.json itself: damaged or truncated is refused, and so is a
deleted one, since preprocess.json records that it was written. shard-preprocess writes no
preprocess.log or args file (fairseq-preprocess writes preprocess.log; nothing reads it)."""
import json
import os
import random
import shutil
import zlib

import pytest

from shardtrain.cli import train
from shardtrain.core.errors import DataError
from shardtrain.data.manifest import NO_MANIFEST, check_at_start, verify_data_bin
from shardtrain.data.preprocess import PreprocessConfig, preprocess
from st_testutils import cli_refusal, tiny_model_flags

# What shard-preprocess --tokenizer spm writes for --trainpref and --validpref (and nothing else).
RECORDED = ["dict.txt", "preprocess.json", "spm.model", "train.bin", "train.idx", "valid.bin", "valid.idx"]
SMALL = ["dict.txt", "preprocess.json", "spm.model", "train.idx", "valid.idx"]  # CRC-32 at start


@pytest.fixture(scope="module")
def spm_bin(tmp_path_factory):
    root = tmp_path_factory.mktemp("small-files")
    rng = random.Random(3)
    words = ["alpha", "beta", "gamma", "delta", "return", "(", ")", ":", "x1", "y22"]
    for split, lines in (("train", 300), ("valid", 40)):
        (root / f"{split}.txt").write_text("".join(" ".join(rng.choice(words) for _ in range(rng.randrange(2, 12)))
                                                   + "\n" for _ in range(lines)))
    dest = str(root / "data-bin")
    preprocess(PreprocessConfig(trainpref=str(root / "train.txt"), validpref=str(root / "valid.txt"), destdir=dest,
                                spm_vocab_size=40, no_progress_bar=True))
    return dest


def copy_of(path, tmp_path):
    dest = str(tmp_path / "bin")
    shutil.copytree(path, dest)
    return dest


def change(path, offset=None):
    """One byte changed (the middle one by default), the size kept: only a checksum can tell."""
    with open(path, "r+b") as f:
        f.seek(os.path.getsize(path) // 2 if offset is None else offset)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0x20]))


def truncate(path):
    os.truncate(path, os.path.getsize(path) - 3)


DAMAGE = {"changed": change, "truncated": truncate, "missing": os.remove}
# damage -> words the paragraph must hold ({} is the file's name)
WORDS = {"changed": ["{}", "CRC-32", "where manifest.json records"], "truncated": ["{}", "bytes where manifest.json"],
         "missing": ["is missing {}"]}


def refused(check, path, words):
    with pytest.raises(DataError) as info:
        check(path)
    message = str(info.value)
    assert all(w in message for w in words) and "\n" not in message and "shard-preprocess" in message, message
    return message


def test_the_manifest_records_every_file_written_with_its_size_and_crc(spm_bin):
    manifest = json.load(open(os.path.join(spm_bin, "manifest.json")))
    assert manifest["complete"] is True and sorted(manifest["files"]) == RECORDED
    assert sorted(os.listdir(spm_bin)) == sorted(RECORDED + ["manifest.json"])
    for name, entry in manifest["files"].items():
        data = open(os.path.join(spm_bin, name), "rb").read()
        assert entry == {"size": len(data), "crc32": f"{zlib.crc32(data):08x}"}, name
    assert json.load(open(os.path.join(spm_bin, "preprocess.json")))["manifest"] == "manifest.json"
    assert check_at_start(spm_bin).startswith("intact (7 files, ")
    assert verify_data_bin(spm_bin).startswith("intact (7 files, ")


@pytest.mark.parametrize("damage", sorted(DAMAGE))
@pytest.mark.parametrize("name", SMALL)
def test_a_damaged_small_file_is_refused_when_a_task_opens_the_data_bin(name, damage, spm_bin, tmp_path, capsys):
    path = copy_of(spm_bin, tmp_path)
    DAMAGE[damage](os.path.join(path, name))
    words = [w.format(name) for w in WORDS[damage]]
    refused(check_at_start, path, words)
    refused(verify_data_bin, path, words)
    save_dir = str(tmp_path / "save")
    _, err = cli_refusal(train.main, [path, *tiny_model_flags(), "--max-update", "1", "--save-dir", save_dir], capsys)
    # (a missing dict.txt is named by the task's own check, which runs first: "has no dict.txt")
    assert (all(w in err for w in words) or f"has no {name}" in err) and not os.path.exists(save_dir), err


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_bin_is_checked_by_size_at_start_and_by_bytes_in_shard_verify(damage, spm_bin, tmp_path):
    path = copy_of(spm_bin, tmp_path)
    DAMAGE[damage](os.path.join(path, "train.bin"))
    words = [w.format("train.bin") for w in WORDS[damage]]
    refused(verify_data_bin, path, words)
    if damage == "changed":  # reading every .bin on every rank at start would cost minutes on a real corpus
        assert check_at_start(path).startswith("intact (7 files")
    else:
        refused(check_at_start, path, words)


def _edit_manifest(path, edit):
    manifest_path = os.path.join(path, "manifest.json")
    manifest = json.load(open(manifest_path))
    edit(manifest["files"])
    with open(manifest_path, "w") as f:
        json.dump(manifest, f)


MANIFEST_DAMAGE = {
    "its first byte changed": (lambda p: change(p, 0), ["manifest.json is damaged"]),  # "{" -> "["
    "truncated": (truncate, ["manifest.json is damaged"]),
    "deleted": (os.remove, ["has no manifest.json", "its preprocess.json says shard-preprocess wrote one"]),
    "a recorded checksum changed": (lambda p: _edit_manifest(os.path.dirname(p), lambda f: f["spm.model"].update(
        crc32="00000000")), ["spm.model", "CRC-32", "where manifest.json records 00000000"]),
    "a recorded size changed": (lambda p: _edit_manifest(os.path.dirname(p), lambda f: f["valid.idx"].update(
        size=f["valid.idx"]["size"] + 12)), ["valid.idx", "bytes where manifest.json records"]),
}


@pytest.mark.parametrize("what", sorted(MANIFEST_DAMAGE))
def test_a_damaged_or_deleted_manifest_is_refused(what, spm_bin, tmp_path, capsys):
    damage, words = MANIFEST_DAMAGE[what]
    path = copy_of(spm_bin, tmp_path)
    damage(os.path.join(path, "manifest.json"))
    refused(check_at_start, path, words)
    refused(verify_data_bin, path, words)
    _, err = cli_refusal(train.main, [path, *tiny_model_flags(), "--max-update", "1", "--save-dir",
                                      str(tmp_path / "save")], capsys)
    assert all(w in err for w in words), err


@pytest.mark.parametrize("name", ["preprocess.json", "spm.model", "valid.idx", "valid.bin"])
def test_a_read_file_the_manifest_does_not_list_is_refused(name, spm_bin, tmp_path):
    path = copy_of(spm_bin, tmp_path)
    _edit_manifest(path, lambda files: files.pop(name))
    refused(check_at_start, path, [name, "does not list"])
    refused(verify_data_bin, path, [name, "does not list"])


def test_without_the_manifest_record_a_data_bin_loads_as_before_with_a_notice(spm_bin, tmp_path):
    """fairseq's data-bins and those of a shard-preprocess before the manifest (preprocess.json without
    its "manifest" entry) have nothing to be checked against: they load, with a one-line notice."""
    path = copy_of(spm_bin, tmp_path)
    os.remove(os.path.join(path, "manifest.json"))
    spec = json.load(open(os.path.join(path, "preprocess.json")))
    del spec["manifest"]
    with open(os.path.join(path, "preprocess.json"), "w") as f:
        json.dump(spec, f)
    assert check_at_start(path) == verify_data_bin(path) == NO_MANIFEST
