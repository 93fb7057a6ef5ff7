"""What a single-file checkpoint without checksums is called before it is read: only a real checkpoint of
torch's older (pre-zip) format is "loaded unverified"; random or empty bytes are refused first, with the
loading paragraph, and never get that notice."""
import logging

import pytest
import torch

from shardtrain.core.errors import CheckpointError
from shardtrain.trainer.checkpoint.integrity import check_checksums
from shardtrain.trainer.checkpoint.single_file import SingleFile

NOTICE = "carries no checksums"


@pytest.mark.parametrize("content", [b"", bytes(range(256)) * 4], ids=["empty", "random"])
def test_bytes_that_are_no_checkpoint_are_refused_before_any_notice(tmp_path, caplog, content):
    path = tmp_path / "checkpoint_1_2.pt"
    path.write_bytes(content)
    with caplog.at_level(logging.WARNING), pytest.raises(CheckpointError) as refused:
        check_checksums(SingleFile(), str(path))
    assert str(path) in str(refused.value)
    assert NOTICE not in caplog.text


def test_an_old_format_checkpoint_is_loaded_unverified_with_the_notice(tmp_path, caplog):
    path = tmp_path / "checkpoint_1_2.pt"
    torch.save({"version": 3, "cfg": {}, "model": {"w": torch.ones(2)}}, path, _use_new_zipfile_serialization=False)
    with caplog.at_level(logging.WARNING):
        found = check_checksums(SingleFile(), str(path))
    assert found.checksums is False
    assert f"notice: {path} {NOTICE}" in caplog.text
