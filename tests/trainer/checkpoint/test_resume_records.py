"""Records after a resume (issue 31, items 3 and 5): an epoch's ``train`` record covers that epoch only, whatever
the resume point, TensorBoard holds one value per step, and the --log-file holds the records under any
--log-format. Real single-process runs of a tiny model: a run resumed from a checkpoint is bit-exact with an
uninterrupted one on the CPU, so its records must equal the uninterrupted run's."""
import os
import sys
import time

import pytest

from shardtrain.cli import train
from st_testutils import json_records, make_space_data_bin, tiny_model_flags

TESTS_ROOM = "shardtrain.trainer.checkpoint"  # it drives the commands: its imports cannot say which room it tests

pytestmark = pytest.mark.slow  # every test here starts a process, a multi-rank group or a training run


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return make_space_data_bin(str(tmp_path_factory.mktemp("resume_records")), train_tokens=4000, valid_tokens=200)


def run(data, out, name, *extra):
    """One shard-train run into ``out/ck`` (TensorBoard ``out/tb``); returns its log file's path."""
    out.mkdir(exist_ok=True)
    log = str(out / f"{name}.log")
    train.main([data, *tiny_model_flags(), "--save-dir", str(out / "ck"), "--tensorboard-logdir", str(out / "tb"),
                "--log-file", log, "--save-interval-updates", "2", *extra])
    return log


def by_epoch(log):
    return {r["epoch"]: r for r in json_records(log, "train")}


def scalars(tb_dir, tag, key):
    """[(step, value)] of ``key`` under ``tag`` as TensorBoard's own reader shows them."""
    from tensorboard.backend.event_processing import event_accumulator

    acc = event_accumulator.EventAccumulator(os.path.join(tb_dir, tag))
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars(key)]


def test_train_records_after_every_kind_of_resume(data, tmp_path):
    whole = by_epoch(run(data, tmp_path / "A", "whole", "--max-epoch", "3"))
    u1 = int(whole[1]["train_num_updates"])  # updates per epoch
    assert sorted(whole) == [1, 2, 3] and whole[3]["train_num_updates"] == 3 * u1
    b = tmp_path / "B"
    first = by_epoch(run(data, b, "b1", "--max-epoch", "1"))  # stops at the epoch's end
    # Resumed at the epoch boundary with --max-update extended 4 updates into epoch 2; saves every 2 updates.
    time.sleep(1.1)  # TensorBoard reads event files in name order, whose first field is the creation second:
    # runs started by hand are seconds apart, these in-process ones may not be
    partial = by_epoch(run(data, b, "b2", "--max-update", str(u1 + 4)))
    # Resumed mid-epoch, with --max-epoch extended, from b2's save before its last (b2 went further).
    restored = u1 + 2 if u1 % 2 == 0 else u1 + 3
    time.sleep(1.1)  # as before b2
    rest = by_epoch(run(data, b, "b3", "--max-epoch", "3", "--restore-file", f"checkpoint_2_{restored}.pt"))
    assert first[1]["train_loss"] == pytest.approx(whole[1]["train_loss"], rel=1e-6)
    # The partial epoch 2 record covers its 4 updates only: not epoch 1's time (before the fix it held
    # epoch 1's train_wall plus its own, more than epoch 1's alone).
    assert partial[2]["train_num_updates"] == u1 + 4
    assert partial[2]["train_train_wall"] < first[1]["train_train_wall"]  # 4 updates against about 16
    # Mid-epoch, the meters restored from the checkpoint make epoch 2's record cover the whole epoch (fairseq).
    for epoch in (2, 3):
        assert rest[epoch]["train_num_updates"] == epoch * u1
        for key in ("train_loss", "train_wpb", "train_gnorm"):
            assert rest[epoch][key] == pytest.approx(whole[epoch][key], rel=1e-6), (epoch, key)
    # TensorBoard: one value per step (b2's updates after the restored save and its partial epoch record are superseded by b3's),
    # each equal to the uninterrupted run's.
    for tag, key in (("train_inner", "loss"), ("train", "loss"), ("valid", "loss")):
        resumed, expected = scalars(str(b / "tb"), tag, key), scalars(str(tmp_path / "A" / "tb"), tag, key)
        steps = [step for step, _ in resumed]
        assert steps == sorted(set(steps)), (tag, steps)
        assert steps == [step for step, _ in expected], tag
        assert [v for _, v in resumed] == pytest.approx([v for _, v in expected], rel=1e-6), tag
    assert [step for step, _ in scalars(str(b / "tb"), "train", "loss")] == [u1, 2 * u1, 3 * u1]


@pytest.mark.parametrize("log_format", ["tqdm", "none"])
def test_the_log_file_holds_the_records_whatever_the_console_format(log_format, data, tmp_path, monkeypatch, capsys):
    """A tqdm console shows a bar (on a terminal: stderr is made to look like one) and none shows nothing;
    the --log-file gets json lines of every record either way."""
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)  # else tqdm falls back to simple lines
    log = str(tmp_path / "train.log")
    train.main([data, *tiny_model_flags(), "--max-update", "3", "--save-dir", str(tmp_path / "ck"),
                "--log-format", log_format, "--log-file", log])
    inner, summary, valid = (json_records(log, tag) for tag in ("train_inner", "train", "valid"))
    assert [r["num_updates"] for r in inner] == [1, 2, 3]  # --log-interval 1
    assert [r["train_num_updates"] for r in summary] == [3] and [r["valid_num_updates"] for r in valid] == [3]
    console = capsys.readouterr().out
    assert '"num_updates"' not in console and "| train_inner |" not in console  # json lines went to the file only
    assert ("| train | epoch 001 |" in console) == (log_format == "tqdm")  # tqdm's console keeps its summaries
