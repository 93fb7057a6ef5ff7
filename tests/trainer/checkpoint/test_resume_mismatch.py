"""Resuming with other optimizer settings than the checkpoint's: a message that
names the difference and --reset-optimizer, for single-file and sharded
checkpoints; nothing in the save dir changes."""
import os
import shutil

import pytest

from shardtrain.cli import train
from shardtrain.trainer.checkpoint.save_dir_lock import LOCK_NAME
from st_testutils import cli_refusal, last_checkpoint_state, make_space_data_bin, tiny_model_flags

pytestmark = pytest.mark.slow  # every test here starts a process, a multi-rank group or a training run


@pytest.fixture(scope="module")
def data_bin(tmp_path_factory):
    return make_space_data_bin(str(tmp_path_factory.mktemp("mismatch")), n_words=6, train_tokens=3000,
                               valid_tokens=300, line_len=30, seed=6)


@pytest.fixture(scope="module", params=["pytorch_ddp", "fully_sharded"])
def saved(request, data_bin, tmp_path_factory):
    save = str(tmp_path_factory.mktemp(request.param))
    train.main([data_bin, *tiny_model_flags(), "--cpu", "--ddp-backend", request.param, "--optimizer", "cpu_adam",
                "--max-update", "1", "--save-dir", save])
    return request.param, save


def snapshot(save):
    """Every file and its mtime (but the run lock, which each run rewrites with its pid)."""
    return sorted((p, os.path.getmtime(os.path.join(save, p))) for p in os.listdir(save) if p != LOCK_NAME)


def refused(data_bin, backend, save, flags, capsys) -> str:
    before = snapshot(save)
    _, err = cli_refusal(train.main, [data_bin, *tiny_model_flags(), "--cpu", "--ddp-backend", backend, *flags,
                                      "--max-update", "2", "--save-dir", save], capsys)
    assert "missing or damaged" not in err  # the checkpoint is fine; the flags differ
    assert snapshot(save) == before
    return err


def test_another_optimizer_is_named(saved, data_bin, capsys):
    backend, save = saved
    err = refused(data_bin, backend, save, ["--optimizer", "adam"], capsys)
    assert "was saved with --optimizer cpu_adam, but this run uses --optimizer adam" in err
    assert "--reset-optimizer" in err


def test_fp16_adam_stats_changed_between_save_and_resume(saved, data_bin, tmp_path, capsys):
    backend, save = saved
    flags = ["--optimizer", "cpu_adam", "--fp16-adam-stats"]
    if backend == "pytorch_ddp":  # a single file holds whole moments: cpu_adam converts them
        copy = str(tmp_path / "ck")
        shutil.copytree(save, copy, symlinks=True)
        train.main([data_bin, *tiny_model_flags(), "--cpu", *flags, "--max-update", "2", "--save-dir", copy])
        assert last_checkpoint_state(copy)["train_state"]["num_updates"] == 2
    else:  # DCP loads only the keys this run's state declares, and the layouts differ
        err = refused(data_bin, backend, save, flags, capsys)
        assert "has no optimizer.state." in err and "--fp16-adam-stats" in err and "--reset-optimizer" in err


def test_reset_optimizer_resumes_with_another_optimizer(saved, data_bin, tmp_path):
    backend, save = saved
    copy = str(tmp_path / "ck")
    shutil.copytree(save, copy, symlinks=True)
    train.main([data_bin, *tiny_model_flags(), "--cpu", "--ddp-backend", backend, "--optimizer", "adam",
                "--reset-optimizer", "--max-update", "2", "--save-dir", copy])
    assert last_checkpoint_state(copy)["train_state"]["num_updates"] == 2
