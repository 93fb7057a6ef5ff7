"""reduce_lr_on_plateau through shard-train: it steps on each epoch's validation metric, and a run
resumed from checkpoint_last shrinks the lr at the same epochs as the uninterrupted run."""
import pytest
import torch

from shardtrain.cli import train
from st_testutils import json_records, make_space_data_bin, tiny_model_flags

TESTS_ROOM = "shardtrain.optim"  # it drives the commands: its imports cannot say which room it tests

pytestmark = pytest.mark.slow  # every test here starts a process, a multi-rank group or a training run


@pytest.fixture(scope="module")
def data_bin(tmp_path_factory):
    # about 4 updates per epoch
    return make_space_data_bin(str(tmp_path_factory.mktemp("plateau")), n_words=12, train_tokens=1000,
                               valid_tokens=300, line_len=50, seed=3)


# With the metric maximized while the loss falls, every epoch after the first is a bad one, so
# --lr-patience 1 shrinks after epochs 3 and 5: the count of bad epochs must survive the restart.
FLAGS = ["--optimizer", "nag", "--lr", "0.05", "--lr-scheduler", "reduce_lr_on_plateau", "--lr-patience", "1",
         "--lr-shrink", "0.5", "--maximize-best-checkpoint-metric", "--no-epoch-checkpoints"]


def run(data_bin, save_dir, log, max_epoch):
    train.main([data_bin, *tiny_model_flags(), "--save-dir", save_dir, "--log-file", log,
                "--max-epoch", str(max_epoch), *FLAGS])
    return log


def epoch_lrs(log):
    return {int(r["epoch"]): r["train_lr"] for r in json_records(log, "train")}


@pytest.mark.flag_effect("--max-epoch", "--lr-patience", "--lr-shrink", "--maximize-best-checkpoint-metric")
def test_plateau_steps_on_validation_and_resumes_exactly(data_bin, tmp_path):
    straight = run(data_bin, str(tmp_path / "straight"), str(tmp_path / "straight.log"), 5)
    lrs = epoch_lrs(straight)
    losses = [r["valid_loss"] for r in json_records(straight, "valid")]
    assert len(losses) == 5 and max(losses[1:]) < losses[0]  # below the first: maximizing sees no gain
    assert lrs == pytest.approx({1: 0.05, 2: 0.05, 3: 0.05, 4: 0.025, 5: 0.025})

    split = str(tmp_path / "split")
    run(data_bin, split, str(tmp_path / "first.log"), 2)
    resumed = run(data_bin, split, str(tmp_path / "resumed.log"), 5)
    assert epoch_lrs(resumed) == pytest.approx({3: 0.05, 4: 0.025, 5: 0.025})
    got = torch.load(f"{split}/checkpoint_last.pt", weights_only=True)
    want = torch.load(f"{tmp_path / 'straight'}/checkpoint_last.pt", weights_only=True)
    # saved after epoch 5's step: the next epoch would run at 0.0125
    assert got["lr_scheduler"]["optimizer_lr"] == want["lr_scheduler"]["optimizer_lr"] == pytest.approx(0.0125)
    for name, tensor in want["model"].items():
        torch.testing.assert_close(got["model"][name], tensor, rtol=0, atol=0)
