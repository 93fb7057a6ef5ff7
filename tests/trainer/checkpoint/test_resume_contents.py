"""What a resumed run takes from its checkpoint besides weights: the training time, and older layouts."""
import pytest
import torch

from shardtrain.cli import train
from st_testutils import json_records, make_space_data_bin, tiny_model_flags

TESTS_ROOM = "shardtrain.trainer.checkpoint"  # it drives the commands: its imports cannot say which room it tests

pytestmark = pytest.mark.slow  # every test here starts a process, a multi-rank group or a training run


def run_train(data_bin, save_dir, log, *extra):
    train.main([data_bin, *tiny_model_flags(), "--save-dir", save_dir, "--log-file", log, *extra])
    return log


def test_training_time_carries_over_to_stop_time_hours(tmp_path):
    """--stop-time-hours counts the time of the runs a checkpoint resumes: a checkpoint that
    has trained two hours stops a resumed run with a one-hour limit after its first update."""
    data_bin = make_space_data_bin(str(tmp_path / "data"), n_words=12, train_tokens=4000, valid_tokens=400,
                                   line_len=50, seed=1)
    save_dir = str(tmp_path / "run")
    run_train(data_bin, save_dir, str(tmp_path / "first.log"), "--max-update", "1")
    path = f"{save_dir}/checkpoint_last.pt"
    state = torch.load(path, weights_only=True)
    assert "prev_training_time" not in state["train_state"]  # the time is saved once, as training_seconds
    state["training_seconds"] = 2 * 3600.0
    # an older file's stale second copy of the time, and no meters: both still load
    state["train_state"]["prev_training_time"] = 5.0
    del state["meters"]
    torch.save(state, path)
    log = run_train(data_bin, save_dir, str(tmp_path / "resumed.log"), "--max-update", "5", "--stop-time-hours", "1")
    assert [int(r["num_updates"]) for r in json_records(log, "train_inner")] == [2]
    resumed = torch.load(path, weights_only=True)
    assert resumed["train_state"]["num_updates"] == 2
    assert resumed["training_seconds"] >= 2 * 3600.0
