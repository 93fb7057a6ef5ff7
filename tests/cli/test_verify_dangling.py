"""shard-verify on a dangling checkpoint link (issue 37, item 2): checkpoint_last.pt (or a sharded checkpoint_last)
pointing at a checkpoint that was moved or deleted is reported DAMAGED with exit status 1, whether the link is
named itself or found in a save dir, and the intact checkpoints beside it are still checked."""
import os

import pytest
import torch

from st_testutils import shard_verify_output

TESTS_ROOM = "shardtrain.cli"  # it drives the commands: its imports cannot say which room it tests


@pytest.fixture
def save(tmp_path):
    """checkpoint1.pt (a whole zip), checkpoint_last.pt -> checkpoint2.pt and checkpoint_last -> checkpoint_1_2,
    both gone."""
    save = tmp_path / "save"
    save.mkdir()
    torch.save({"model": {"w": torch.ones(2)}, "cfg": {}}, save / "checkpoint1.pt")
    os.symlink("checkpoint2.pt", save / "checkpoint_last.pt")
    os.symlink("checkpoint_1_2", save / "checkpoint_last")
    return save


def test_a_save_dir_with_dangling_links_reports_each_damaged(save, capsys):
    code, out = shard_verify_output(save, capsys)
    lines = out.splitlines()
    assert code == 1 and len(lines) == 3, out
    assert lines[0].startswith(f"{save}/checkpoint1.pt: intact (")
    assert lines[1] == (f"{save}/checkpoint_last: DAMAGED: dangling link to 'checkpoint_1_2', which does not exist "
                        "(moved or deleted); point it at an intact checkpoint or remove it.")
    assert lines[2].startswith(f"{save}/checkpoint_last.pt: DAMAGED: dangling link to 'checkpoint2.pt', ")


@pytest.mark.parametrize("name,target", [("checkpoint_last.pt", "checkpoint2.pt"),
                                         ("checkpoint_last", "checkpoint_1_2")])
def test_a_dangling_link_named_itself_is_damaged_not_a_crash(save, name, target, capsys):
    code, out = shard_verify_output(save / name, capsys)
    assert code == 1 and out.startswith(f"{save}/{name}: DAMAGED: dangling link to '{target}', ") and \
        out.count("\n") == 1, (code, out)
    assert "Traceback" not in capsys.readouterr().err
