"""A flag check's refusal names the precision by the flag the user typed: never a --memory-efficient-* flag (or
--fp16) they did not type. Every message written by hand."""
import pytest

from shardtrain.config.checks import check_config
from shardtrain.config.run_config import parse_train_args
from shardtrain.core.errors import ConfigError


def refusal(*argv) -> str:
    with pytest.raises(ConfigError) as refused:
        check_config(parse_train_args(["data-bin", *argv]))
    return str(refused.value)


def test_skip_nan_updates_under_fp16_names_fp16_alone():
    assert refusal("--fp16", "--skip-nan-updates", "2") == (
        "--skip-nan-updates is for precisions without a loss scale (fp32, bf16, memory_efficient_bf16): with --fp16 "
        "the loss scaler already skips every update whose gradient overflows and lowers the scale (--min-loss-scale "
        "bounds it). Drop --skip-nan-updates.")
    assert "with --precision fp16 the loss scaler" in refusal("--precision", "fp16", "--skip-nan-updates", "2")


def test_a_precision_picked_by_name_is_named_as_typed():
    assert refusal("--precision", "memory_efficient_fp16", "--optimizer", "sgd").startswith(
        "--precision memory_efficient_fp16 stores the parameters in float16 and needs an optimizer that keeps fp32 "
        "state for them")
    assert refusal("--precision", "memory_efficient_bf16", "--ddp-backend", "fully_sharded").startswith(
        "--precision memory_efficient_bf16 stores the whole model in bfloat16, but --ddp-backend fully_sharded")
    assert refusal("--memory-efficient-bf16", "--ddp-backend", "fully_sharded").startswith(
        "--memory-efficient-bf16 stores the whole model in bfloat16")
