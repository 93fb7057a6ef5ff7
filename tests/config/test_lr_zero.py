"""--lr 0 is accepted (a run that cannot change the weights: --lr 0 --lr-scheduler fixed, as the HF round trip
in tests/trainer/checkpoint/test_hf_ranks.py runs); a negative or infinite --lr is still refused."""
import pytest

from shardtrain.config.run_config import parse_train_args
from shardtrain.core.errors import ConfigError


def test_lr_zero_is_accepted_and_negative_refused():
    assert list(parse_train_args(["data-bin", "--lr", "0", "--lr-scheduler", "fixed"]).optimization.lr) == [0.0]
    for bad in ("-0.1", "inf"):
        with pytest.raises(ConfigError, match="--lr must be a finite number >= 0"):
            parse_train_args(["data-bin", "--lr", bad])
