"""shard-verify's exit status on what is not an intact checkpoint: a random file, an empty file, a checkpoint
whose first byte changed, a file of torch's older format that is no checkpoint, and an old sharded directory
with a damaged marker exit 1 with a paragraph; "no checksums" only for a real checkpoint written before
checksums, and then it says that nothing was verified (exit 0: nothing is known to be damaged)."""
import json
import os
import random
import shutil

import pytest
import torch

from st_testutils import shard_verify_output, small_data_bin, train_both_forms

TESTS_ROOM = "shardtrain.cli"  # it drives the commands: its imports cannot say which room it tests

pytestmark = pytest.mark.slow  # every test here starts a process, a multi-rank group or a training run


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """{"file": checkpoint_last.pt of one update (pytorch_ddp), "dir": checkpoint_last (fully_sharded)}."""
    root = tmp_path_factory.mktemp("verify")
    train_both_forms(small_data_bin(str(root)), root, "--max-update", "1")
    return {"file": root / "pytorch_ddp" / "checkpoint_last.pt", "dir": root / "fully_sharded" / "checkpoint_last"}


def shard_verify(path, capsys):
    """(exit status, what it printed for ``path``)."""
    code, out = shard_verify_output(path, capsys)
    assert out.startswith(f"{path}: ") and out.count("\n") == 1, out  # one paragraph, on one line
    return code, out[len(f"{path}: "):]


def random_bytes(path, saved):
    path.write_bytes(random.Random(0).randbytes(4096))
    return "not a checkpoint at all"


def empty(path, saved):
    path.write_bytes(b"")
    return "(0 bytes; EOFError): it is truncated"


def first_byte_changed(path, saved):
    data = bytearray(saved["file"].read_bytes())
    data[0] ^= 0x01
    path.write_bytes(bytes(data))
    return "has no entry header where its directory places"


def old_format_no_checkpoint(path, saved):
    torch.save({"weights": torch.ones(3)}, path, _use_new_zipfile_serialization=False)
    return "is not a shardtrain checkpoint"


@pytest.mark.parametrize("make", [random_bytes, empty, first_byte_changed, old_format_no_checkpoint])
def test_what_is_no_intact_checkpoint_exits_1_with_a_paragraph(make, saved, tmp_path, capsys):
    path = tmp_path / "checkpoint_last.pt"
    expected = make(path, saved)
    code, said = shard_verify(path, capsys)
    assert code == 1 and said.startswith("DAMAGED: ") and expected in said, (code, said)
    assert "no checksums" not in said and "Traceback" not in said


def test_a_real_checkpoint_of_the_older_format_is_said_to_be_unverified(saved, tmp_path, capsys):
    legacy = tmp_path / "legacy.pt"
    torch.save(torch.load(saved["file"], weights_only=True), legacy, _use_new_zipfile_serialization=False)
    code, said = shard_verify(legacy, capsys)
    assert code == 0 and said.startswith("no checksums (written before shardtrain recorded them): NOTHING WAS "
                                         "VERIFIED"), said
    assert shard_verify(saved["file"], capsys)[1].startswith("intact (")


def test_an_old_sharded_directory_needs_its_marker_and_files(saved, tmp_path, capsys):
    old = tmp_path / "old"
    shutil.copytree(os.path.realpath(saved["dir"]), old)
    os.remove(old / "CHECKSUMS")
    info = json.loads((old / "COMPLETE").read_text())
    del info["checksums"]  # as written before checksums
    (old / "COMPLETE").write_text(json.dumps(info))
    code, said = shard_verify(old, capsys)
    assert code == 0 and "NOTHING WAS VERIFIED" in said, said
    (old / "COMPLETE").write_bytes(b"\x00garbage")
    code, said = shard_verify(old, capsys)
    assert code == 1 and "COMPLETE is not the JSON marker shardtrain writes" in said, said
    (old / "COMPLETE").write_text(json.dumps(info))
    os.remove(old / "extra.pt")
    code, said = shard_verify(old, capsys)
    assert code == 1 and "extra.pt is missing" in said, said
