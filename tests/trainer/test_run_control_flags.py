"""Flags that steer a whole run, through shard-train: when it stops (--stop-min-lr), what a resume starts
afresh (--reset-lr-scheduler, --reset-meters) and which checkpoint is the best (--best-checkpoint-metric,
--maximize-best-checkpoint-metric). Expected values are worked out from the logged numbers by the
flags' documented rules, written here."""
import math
import shutil

import pytest
import torch

from shardtrain.cli import train
from st_testutils import json_records, make_space_data_bin, tiny_model_flags

TESTS_ROOM = "shardtrain.trainer.loop"  # it drives the commands: its imports cannot say which room it tests

pytestmark = pytest.mark.slow  # every test here starts a process, a multi-rank group or a training run


@pytest.fixture(scope="module")
def data_bin(tmp_path_factory):
    # about 4 updates per epoch, and nag at lr 0.05 lowers the valid loss every epoch (the plateau tests' data)
    return make_space_data_bin(str(tmp_path_factory.mktemp("control")), n_words=12, train_tokens=1000,
                               valid_tokens=300, line_len=50, seed=3)


def run(data_bin, save_dir, *flags):
    log = f"{save_dir}.log"
    train.main([data_bin, *tiny_model_flags(), "--save-dir", str(save_dir), "--log-file", log, *flags])
    return log


def last(save_dir, name="checkpoint_last.pt"):
    return torch.load(f"{save_dir}/{name}", weights_only=True)


@pytest.mark.flag_effect("--stop-min-lr")
def test_stop_min_lr_ends_the_run_once_the_lr_falls_to_it(data_bin, tmp_path):
    log = run(data_bin, tmp_path / "ck", "--optimizer", "nag", "--lr", "0.01", "--lr-scheduler", "polynomial_decay",
              "--total-num-update", "12", "--stop-min-lr", "0.004", "--max-epoch", "4", "--no-epoch-checkpoints")
    epochs = json_records(log, "train")
    per_epoch = int(epochs[0]["train_num_updates"])
    # after n updates the lr is 0.01 * (1 - n / 12): at most 0.004 from n >= 7.2, checked at each epoch's end
    expected = math.ceil(7.2 / per_epoch)
    assert 1 < expected < 4, per_epoch  # stopping early, and not at the first check
    assert [int(r["epoch"]) for r in epochs] == list(range(1, expected + 1))
    assert last(tmp_path / "ck")["train_state"]["num_updates"] == expected * per_epoch


# reduce_lr_on_plateau with the metric maximized while the loss falls: every epoch after the one that set
# the best is a bad one, and the second bad one in a row (--lr-patience 1) halves the lr
PLATEAU = ["--optimizer", "nag", "--lr", "0.05", "--lr-scheduler", "reduce_lr_on_plateau", "--lr-patience", "1",
           "--lr-shrink", "0.5", "--maximize-best-checkpoint-metric", "--no-epoch-checkpoints"]


@pytest.mark.flag_effect("--reset-lr-scheduler")
def test_reset_lr_scheduler_judges_the_plateau_afresh(data_bin, tmp_path):
    save = tmp_path / "ck"
    run(data_bin, save, *PLATEAU, "--max-epoch", "2")  # epoch 2 is bad; the uninterrupted run halves after 3
    log = run(data_bin, save, *PLATEAU, "--max-epoch", "4", "--reset-lr-scheduler")
    losses = {int(r["epoch"]): r["valid_loss"] for r in json_records(log, "valid")}
    assert losses[4] < losses[3]  # so epoch 3 is the fresh schedule's best and epoch 4 its only bad one
    resumed = {int(r["epoch"]): r["train_lr"] for r in json_records(log, "train") if int(r["epoch"]) > 2}
    assert resumed == pytest.approx({3: 0.05, 4: 0.05})
    state = last(save)["lr_scheduler"]
    assert state["optimizer_lr"] == pytest.approx(0.05)
    assert state["plateau"]["best"] == pytest.approx(losses[3], abs=2e-3)  # logged in base 2, rounded


@pytest.mark.flag_effect("--reset-meters")
def test_reset_meters_averages_only_the_updates_after_the_resume(data_bin, tmp_path):
    first = tmp_path / "first"
    run(data_bin, first, "--max-update", "2", "--disable-validation")  # mid-epoch 1
    counted = {}
    for name, flags in (("kept", []), ("reset", ["--reset-meters"])):
        shutil.copytree(first, tmp_path / name)
        run(data_bin, tmp_path / name, "--max-update", "3", "--disable-validation", *flags)
        meters = {m["key"]: m["state"] for m in last(tmp_path / name)["meters"]["epoch"]["meters"]}
        counted[name] = meters["bsz"]["weight"]  # one per update of this epoch the meters have seen
    assert counted == {"kept": 3.0, "reset": 1.0}


@pytest.mark.flag_effect("--best-checkpoint-metric", "--maximize-best-checkpoint-metric")
def test_best_checkpoint_metric_and_its_direction_pick_checkpoint_best(data_bin, tmp_path):
    save = tmp_path / "ck"
    log = run(data_bin, save, "--optimizer", "nag", "--lr", "0.05", "--lr-scheduler", "fixed", "--max-epoch", "3",
              "--best-checkpoint-metric", "ppl", "--maximize-best-checkpoint-metric", "--no-epoch-checkpoints")
    valid = json_records(log, "valid")
    ppl = [r["valid_ppl"] for r in valid]
    top, bottom = ppl.index(max(ppl)), ppl.index(min(ppl))
    assert top != bottom  # so minimizing would have picked another checkpoint
    assert [r["valid_best_ppl"] for r in valid] == [max(ppl[:i + 1]) for i in range(3)]  # the running highest
    best = last(save, "checkpoint_best.pt")["train_state"]
    assert best["num_updates"] == int(valid[top]["valid_num_updates"])  # saved at the highest's validation
    assert best["best"] == pytest.approx(ppl[top], abs=0.01)  # the metric kept is the ppl, not the loss
