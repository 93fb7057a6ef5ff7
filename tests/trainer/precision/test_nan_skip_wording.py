"""A skipped NaN/inf update says why it is skipped: the user's --skip-nan-updates count, or --spike-rollback
(which skips every such update to roll it back: no count of the user's, never 2**62 shown as one)."""
import logging

import torch

from shardtrain.config.run_config import parse_train_args
from shardtrain.trainer.precision.component import Precision, skip_nan

NAN = torch.tensor(float("nan"))


def _skipped(caplog, *flags) -> str:
    precision = Precision(skip_nan=skip_nan(parse_train_args(["data-bin", *flags])))
    with caplog.at_level(logging.WARNING, logger="shardtrain.trainer.precision.component"):
        assert precision.accept(NAN, 7) is False
    return caplog.records[-1].getMessage()


def test_a_rollback_s_skip_names_spike_rollback_not_a_count(caplog):
    assert _skipped(caplog, "--spike-rollback") == (
        "the loss or gradient is NaN/inf at update 7; skipping it (--spike-rollback rolls it back)")


def test_a_skip_nan_updates_skip_names_the_user_s_count(caplog):
    assert _skipped(caplog, "--skip-nan-updates", "3") == (
        "the loss or gradient is NaN/inf at update 7; skipping it (1 in a row, --skip-nan-updates 3)")
