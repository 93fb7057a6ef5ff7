"""Tensorboard scalars, read back with tensorboard's own reader."""
import os

import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from shardtrain.trainer.metrics.progress import build_progress_bar
from shardtrain.trainer.metrics.tensorboard import TensorboardWriter


def _scalars(logdir, tag, key):
    acc = EventAccumulator(os.path.join(logdir, tag))
    acc.Reload()
    return acc, [(e.step, e.value) for e in acc.Scalars(key)]


def test_logged_and_printed_stats_reach_tensorboard(tmp_path):
    logdir = str(tmp_path)
    with TensorboardWriter(logdir) as tb:
        for epoch in (1, 2):  # two bars share the run's writers
            bar = build_progress_bar(range(10), log_format="simple", log_interval=5, epoch=epoch, tensorboard=tb)
            for i, _ in enumerate(bar):
                step = (epoch - 1) * 10 + i + 1
                stats = {"loss": float(step), "lr": torch.tensor(0.5), "num_updates": step, "note": "x"}
                bar.log(stats, tag="train_inner", step=step)
            bar.print({"loss": 10.0 * epoch, "best_loss": True}, tag="valid", step=epoch * 10)
            bar.close()

    acc, loss = _scalars(logdir, "train_inner", "loss")
    # num_updates is the step, strings and bools are not scalars
    assert sorted(acc.Tags()["scalars"]) == ["loss", "lr"]
    assert loss == [(5, 5.0), (10, 10.0), (15, 15.0), (20, 20.0)]  # only every log_interval
    _, lr = _scalars(logdir, "train_inner", "lr")
    assert lr == [(5, 0.5), (10, 0.5), (15, 0.5), (20, 0.5)]
    acc, valid = _scalars(logdir, "valid", "loss")
    assert acc.Tags()["scalars"] == ["loss"]
    assert valid == [(10, 10.0), (20, 20.0)]
    # one writer per tag for the whole run, not one per bar
    assert len(os.listdir(os.path.join(logdir, "train_inner"))) == 1
    assert sorted(os.listdir(logdir)) == ["train_inner", "valid"]


def test_none_format_still_writes_tensorboard(tmp_path):
    with TensorboardWriter(str(tmp_path)) as tb:
        bar = build_progress_bar(range(2), log_format="none", log_interval=1, tensorboard=tb)
        bar.print({"ppl": 8.0}, tag="train", step=7)
    _, ppl = _scalars(str(tmp_path), "train", "ppl")
    assert ppl == [(7, 8.0)]
