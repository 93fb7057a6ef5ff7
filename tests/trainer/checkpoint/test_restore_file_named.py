"""--restore-file X.pt loads X.pt even when a sharded directory X/ beside it looks newer (issue 37, item 1);
only the default name (checkpoint_last.pt) is decided between the two forms (newer.py), and the way out its
warning names is a path that then loads as named, never the same decision again."""
import logging
import os
import time
from types import SimpleNamespace

import pytest

from shardtrain.trainer.checkpoint.manager import CheckpointManager

pytestmark = [pytest.mark.flag_effect("--restore-file")]


def both_forms(save, name):
    """``name``.pt (a file whose update count cannot be read) and a sharded directory ``name`` with a
    future time and no extra.pt (its count cannot be read either): by time, the directory is newer."""
    save.mkdir(exist_ok=True)
    (save / f"{name}.pt").write_bytes(b"not read: the choice is made before loading")
    (save / name).mkdir()
    future = time.time() + 3600
    os.utime(save / name, (future, future))


def restore_path(save, restore_file):
    section = SimpleNamespace(restore_file=restore_file, save_dir=str(save), async_save=False)
    return CheckpointManager(section).restore_path()


def test_an_explicit_name_loads_that_file_whatever_its_sibling_directory(tmp_path):
    save = tmp_path / "save"
    both_forms(save, "checkpoint_3_300")
    assert restore_path(save, "checkpoint_3_300.pt") == f"{save}/checkpoint_3_300.pt"
    assert restore_path(save, str(save / "checkpoint_3_300.pt")) == f"{save}/checkpoint_3_300.pt"  # a full path
    assert restore_path(save, "checkpoint_3_300") == f"{save}/checkpoint_3_300"  # the directory, named as such


def test_the_default_name_takes_the_newer_form_and_its_advice_does_not_loop(tmp_path, caplog):
    save = tmp_path / "save"
    both_forms(save, "checkpoint_last")
    with caplog.at_level(logging.WARNING):
        assert restore_path(save, "checkpoint_last.pt") == f"{save}/checkpoint_last"
    warning = " ".join(r.getMessage() for r in caplog.records)
    way_out = f"to resume from it instead: --restore-file {save}/checkpoint_last.pt)"
    assert way_out in warning, warning
    caplog.clear()
    with caplog.at_level(logging.WARNING):  # following the advice loads the file, with no second decision
        assert restore_path(save, f"{save}/checkpoint_last.pt") == f"{save}/checkpoint_last.pt"
    assert "both forms" not in caplog.text
