"""--best-checkpoint-metric must name a metric validation logs (red-team item 7 of issue 16);
the built-in criterions declare exactly what their reduce_metrics logs."""
import logging
import os

import pytest

from shardtrain.cli import train
from shardtrain.data.collate import collate
from shardtrain.trainer.metrics.meters import MetricsLogger
from st_testutils import make_space_data_bin, tiny_model_flags
from small_trainer import blocks, make_trainer

TESTS_ROOM = "shardtrain.trainer.checkpoint"  # it drives the commands: its imports cannot say which room it tests

METRIC_PLUGIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "metric_plugin")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return make_space_data_bin(str(tmp_path_factory.mktemp("metric")), n_words=8, train_tokens=2000,
                               valid_tokens=200, line_len=40)


@pytest.mark.parametrize("flags", [[], ["--sentence-avg"], ["--criterion", "label_smoothed_cross_entropy"],
                                   ["--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
                                    "--sentence-avg"]])
def test_declared_metrics_are_what_validation_logs(data, flags):
    trainer, task = make_trainer(data, *flags)
    logs = trainer.valid_step(collate(blocks(task, range(4)), task.dictionary.pad()))
    metrics = MetricsLogger()
    trainer.criterion.reduce_metrics(logs, metrics)
    assert set(dict(metrics.smoothed_values())) == task.logged_metrics(trainer.criterion)


@pytest.mark.slow
def test_a_plugin_that_declares_nothing_is_trusted_with_a_warning(data, tmp_path, caplog):
    save = tmp_path / "ck"
    with caplog.at_level(logging.WARNING):
        train.main([data, *tiny_model_flags(), "--cpu", "--save-dir", str(save), "--max-update", "2",
                    "--user-dir", METRIC_PLUGIN, "--criterion", "accuracy_cross_entropy",
                    "--best-checkpoint-metric", "accuracy", "--maximize-best-checkpoint-metric"])
    assert "AccuracyCrossEntropyCriterion does not declare the metrics it logs" in caplog.text
    assert (save / "checkpoint_best.pt").exists()
