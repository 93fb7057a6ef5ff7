"""What `shard-train --tensorboard-logdir` plots, through the real CLI, and sane first-record speeds."""
import os

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from shardtrain.cli import train
from st_testutils import json_records, make_space_data_bin, tiny_model_flags

TESTS_ROOM = "shardtrain.trainer.metrics"  # it drives the commands: its imports cannot say which room it tests

pytestmark = pytest.mark.slow  # every test here starts a process, a multi-rank group or a training run


@pytest.mark.flag_effect("--tensorboard-logdir", "--fp16")
def test_fp16_run_writes_every_curve_and_an_honest_first_speed(tmp_path):
    data_bin = make_space_data_bin(str(tmp_path / "data"))
    tb, log = str(tmp_path / "tb"), str(tmp_path / "train.log")
    train.main([data_bin, *tiny_model_flags(), "--fp16", "--max-update", "3", "--save-dir", str(tmp_path / "ck"),
                "--tensorboard-logdir", tb, "--log-file", log, "--validate-interval-updates", "3"])
    inner = EventAccumulator(os.path.join(tb, "train_inner"))
    inner.Reload()
    curves = set(inner.Tags()["scalars"])
    assert {"loss", "ppl", "lr", "gnorm", "loss_scale", "wps", "ups", "gb_rss", "param_gb", "optim_gb"} <= curves
    assert [e.step for e in inner.Scalars("loss_scale")] == [1, 2, 3]
    valid = EventAccumulator(os.path.join(tb, "valid"))
    valid.Reload()
    assert {"loss", "ppl"} <= set(valid.Tags()["scalars"])
    # the first window's speed includes its update (a meter made after it would divide by ~0 seconds)
    first = json_records(log, "train_inner")[0]
    assert 0 < float(first["ups"]) <= 1.0 / float(first["train_wall"]) * 1.05
