"""The loop's steps after an update, without processes: which updates validate and save (validation.due,
fairseq_cli/train.py's validate_and_save decision), and which checkpoint a divergence may call intact
(the checkpoint manager keeps it; the loop hands it to the error). The runs that show the same
schedules end to end are in tests/trainer/checkpoint/."""
import errno
import types

import pytest
import torch

from shardtrain.config.run_config import parse_train_args
from shardtrain.core.errors import CheckpointError
from shardtrain.data.batch_windows import BatchWindows
from shardtrain.trainer import loop
from shardtrain.trainer.checkpoint.formats import CheckpointFormat
from shardtrain.trainer.checkpoint.manager import CheckpointManager
from shardtrain.trainer.precision.component import Precision
from shardtrain.trainer.precision.diverged import TrainingDivergedError
from shardtrain.trainer.validation import Due, due

NEITHER, VALIDATE, SAVE, BOTH = Due(False, False), Due(True, False), Due(False, True), Due(True, True)


def _sections(*flags):
    cfg = parse_train_args(["data-bin", *flags])
    return cfg.checkpoint, cfg.dataset


# (flags, [(update, epoch, end_of_epoch, stopping, expected)]), the expected values read off fairseq's rules
SCHEDULES = {
    "interval saves wait for --validate-after-updates": (
        ("--save-interval-updates", "3", "--validate-after-updates", "4"),
        [(3, 1, False, False, NEITHER), (4, 1, False, False, NEITHER), (6, 1, False, False, BOTH),
         (5, 1, True, False, BOTH), (3, 1, True, False, SAVE), (2, 1, False, True, SAVE)]),
    "epoch saves and validations every second epoch": (
        ("--save-interval", "2", "--validate-interval", "2"),
        [(3, 1, True, False, NEITHER), (6, 2, True, False, BOTH), (4, 1, True, True, BOTH),
         (4, 2, False, False, NEITHER)]),
    "validation every second update": (
        ("--validate-interval-updates", "2", "--validate-interval", "2"),
        [(2, 1, False, False, VALIDATE), (3, 1, False, False, NEITHER), (3, 1, True, False, SAVE),
         (4, 2, True, False, BOTH)]),
    "--validate-after-updates holds back validations up to its update": (
        ("--validate-interval-updates", "1", "--validate-after-updates", "4"),
        [(3, 1, False, False, NEITHER), (4, 1, False, False, VALIDATE), (3, 1, True, False, SAVE)]),
    "an epoch with no update is no multiple of an interval": (
        ("--save-interval-updates", "3", "--validate-interval-updates", "1", "--save-interval", "2",
         "--validate-interval", "2"),
        [(0, 1, True, False, NEITHER), (3, 1, True, False, BOTH)]),
    "--disable-validation still saves": (
        ("--disable-validation", "--save-interval-updates", "2"),
        [(2, 1, False, False, SAVE), (3, 1, True, False, SAVE), (1, 1, False, True, SAVE)]),
}


@pytest.mark.parametrize("name", list(SCHEDULES))
def test_due_validates_and_saves_where_fairseq_does(name):
    flags, cases = SCHEDULES[name]
    ck, ds = _sections(*flags)
    got = [due(updates, epoch, end, stopping, ck, ds) for updates, epoch, end, stopping, _ in cases]
    assert got == [expected for *_, expected in cases]


class _Format(CheckpointFormat):
    """Stands in for a checkpoint format: saves nothing, or fails as a full disk does."""

    def __init__(self, error=None):
        self.error = error

    def save(self, checkpoint, names, header, parts, epoch, updates, is_master, prepare):
        if self.error is not None:
            raise self.error
        return [f"{checkpoint.save_dir}/{name}" for name in names]


def test_the_manager_keeps_the_newest_checked_save(tmp_path):
    manager = CheckpointManager(parse_train_args(["data-bin", "--save-dir", str(tmp_path)]).checkpoint)
    assert manager.last_checked_save is None
    manager.format = _Format()
    manager.save({}, {}, 1, 4, ["checkpoint_1_4.pt", "checkpoint_last.pt"])
    assert manager.last_checked_save == "checkpoint_1_4.pt of update 4"
    manager.save({}, {}, 1, 5, [])  # nothing due under its names: nothing saved
    assert manager.last_checked_save == "checkpoint_1_4.pt of update 4"
    manager.format = _Format(OSError(errno.ENOSPC, "No space left on device"))
    with pytest.raises(CheckpointError, match="of update 6"):
        manager.save({}, {}, 1, 6, ["checkpoint_1_6.pt"])
    assert manager.last_checked_save == "checkpoint_1_4.pt of update 4"  # a failed save is no checked one


def test_a_divergence_names_the_managers_checked_save():
    precision = Precision()

    def train_step(samples):
        precision.accept(torch.tensor(float("nan")), 6)

    run = types.SimpleNamespace(
        skip_batches=BatchWindows([]), metrics=types.SimpleNamespace(begin_update=lambda: None),
        trainer=types.SimpleNamespace(train_step=train_step),
        checkpoints=types.SimpleNamespace(last_checked_save="checkpoint_1_4.pt of update 4"))
    with pytest.raises(TrainingDivergedError) as info:
        loop.train_or_skip(run, [{}], epoch=1, position=1)
    text = str(info.value)
    assert text.startswith("The loss or gradient is NaN/inf at update 6; stopping before the weights are corrupted "
                           "(the last checkpoint this run saved, checkpoint_1_4.pt of update 4, was checked finite). ")
    assert text.endswith("(or pass over such updates with --skip-nan-updates N).")
    run.checkpoints.last_checked_save = None
    with pytest.raises(TrainingDivergedError, match=r"\(this run saved no checkpoint yet; if it resumed from one"):
        loop.train_or_skip(run, [{}], epoch=1, position=1)
