"""shard-plan traces the run's own criterion, so its peak follows --loss-chunks: the whole batch's logits, their
log-probabilities and their gradient (three logits' worth at once: the tracker files the log-probabilities, saved for
backward, as activations) unchunked, a few chunks' worth chunked."""
import os
import sys

import pytest

from shardtrain.plan.trace import traced_peak
from shardtrain.trainer.resolved import Components, build_task
from st_testutils import tiny_plan_cfg

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
from make_data import random_data_bin  # noqa: E402

BATCH, LENGTH = 4, 256


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return random_data_bin(str(tmp_path_factory.mktemp("chunked_plan")), vocab=8000, lines=20, line_len=50)


@pytest.mark.parametrize("backend", ["pytorch_ddp", "fully_sharded"])
def test_the_traced_peak_follows_loss_chunks(data, backend):
    def traced(chunks):
        cfg = tiny_plan_cfg(data, "--decoder-layers", "1", "--tokens-per-sample", str(LENGTH), "--batch-size",
                            str(BATCH), "--ddp-backend", backend, "--loss-chunks", chunks)
        task = build_task(cfg, Components.of(cfg))
        peak = traced_peak(cfg, task, 2)
        return peak["activations"] + peak["temporaries"], BATCH * LENGTH * len(task.dictionary) * 4

    whole, logits = traced("1")
    chunked, _ = traced("4")
    assert 3 * logits <= whole < 3.1 * logits  # the model's own activations are small beside them
    assert chunked < logits  # 4 chunks: a quarter of the logits each, a few at once
