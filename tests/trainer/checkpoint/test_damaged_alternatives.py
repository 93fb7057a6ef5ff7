"""The damaged-checkpoint paragraph offers the other checkpoints, newest first, and never the damaged one under
another name (issue 37, item 3): checkpoint_last.pt is a hard link of its checkpoint, which realpath does not see;
the same file is the same (st_dev, st_ino). The way out it names is the newest of the others."""
import os

import pytest
import torch

from shardtrain.core.errors import CheckpointError
from shardtrain.trainer.checkpoint.choose import verify_checkpoint

SEVEN = torch.tensor(7.0).numpy().tobytes() * 16  # 16 float32 7.0s in a row: the tensor's bytes in the zip


def checkpoint(path, written, damaged=False):
    """A torch.save zip (whole: intact), written at time ``written``; ``damaged``: one byte of its tensor flipped,
    which the zip's CRC-32 catches."""
    torch.save({"model": {"w": torch.full((64,), 7.0)}, "cfg": {}}, path)
    if damaged:
        data = bytearray(path.read_bytes())
        at = data.index(SEVEN) + 5
        data[at] ^= 0x01
        path.write_bytes(bytes(data))
    os.utime(path, (written, written))


def paragraph(path):
    with pytest.raises(CheckpointError) as e:
        verify_checkpoint(str(path))
    return str(e.value)


def test_the_hard_linked_last_is_not_offered_as_the_way_out(tmp_path):
    checkpoint(tmp_path / "checkpoint1.pt", 1000)
    checkpoint(tmp_path / "checkpoint2.pt", 2000, damaged=True)
    os.link(tmp_path / "checkpoint2.pt", tmp_path / "checkpoint_last.pt")  # as a single-file save names the last
    for named in ("checkpoint_last.pt", "checkpoint2.pt"):
        said = paragraph(tmp_path / named)
        assert f"Checkpoint {tmp_path}/{named} is damaged" in said, said
        assert f"the other checkpoints in {tmp_path}, newest first, are: checkpoint1.pt. " in said, said
        assert "(to resume from the newest: --restore-file checkpoint1.pt)" in said, said


def test_the_newest_other_checkpoint_is_the_one_offered(tmp_path):
    checkpoint(tmp_path / "checkpoint1.pt", 1000)
    checkpoint(tmp_path / "checkpoint_1_30.pt", 2000)
    checkpoint(tmp_path / "checkpoint2.pt", 3000)
    os.link(tmp_path / "checkpoint2.pt", tmp_path / "checkpoint_best.pt")  # offered once, by its own name
    checkpoint(tmp_path / "checkpoint_2_60.pt", 4000, damaged=True)
    os.link(tmp_path / "checkpoint_2_60.pt", tmp_path / "checkpoint_last.pt")
    os.symlink("checkpoint_2_60.pt", tmp_path / "checkpoint_last")  # a symbolic alias of the damaged one too
    os.symlink("checkpoint9.pt", tmp_path / "checkpoint_9_90.pt")  # dangling: no way out
    said = paragraph(tmp_path / "checkpoint_last.pt")
    assert (f"the other checkpoints in {tmp_path}, newest first, are: checkpoint2.pt, checkpoint_1_30.pt, "
            "checkpoint1.pt. ") in said, said
    assert "(to resume from the newest: --restore-file checkpoint2.pt)" in said, said


def test_no_other_checkpoint(tmp_path):
    checkpoint(tmp_path / "checkpoint1.pt", 1000, damaged=True)
    os.link(tmp_path / "checkpoint1.pt", tmp_path / "checkpoint_last.pt")
    said = paragraph(tmp_path / "checkpoint_last.pt")
    assert f"there is no other checkpoint in {tmp_path}. " in said and "--restore-file NAME" in said, said
