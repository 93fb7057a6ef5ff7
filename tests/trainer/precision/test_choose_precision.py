"""The one reading of the precision flags (shardtrain/trainer/precision/choose.py): which precision each set of
flags picks, the dtypes each has, the refusal of two that pick different ones (the same function reads the
inference commands' --fp16/--bf16), and --precision NAME. Expected values are written down here, never read
from the registry under test."""
import types

import pytest
import torch

from shardtrain.config.run_config import parse_train_args
from shardtrain.core.errors import ConfigError
from shardtrain.plan.options import flags_to_add, precisions
from shardtrain.trainer.precision.choose import chosen, conflict, given_flag, inference_dtype, run_dtypes

FLAGS = ("fp16", "bf16", "amp", "memory_efficient_fp16", "memory_efficient_bf16")


def common(precision=None, **on):
    return types.SimpleNamespace(precision=precision, **{f: on.get(f, False) for f in FLAGS})


@pytest.mark.parametrize("given, name, flag", [
    ({}, "fp32", "--precision fp32"),
    ({"bf16": True}, "bf16", "--bf16"),
    ({"fp16": True}, "fp16", "--fp16"),
    ({"amp": True}, "fp16", "--amp"),  # fairseq's --amp: fp16 compute, fp32 weights, a dynamic scale
    ({"amp": True, "fp16": True}, "fp16", "--fp16"),
    ({"memory_efficient_fp16": True}, "memory_efficient_fp16", "--memory-efficient-fp16"),
    ({"memory_efficient_fp16": True, "fp16": True}, "memory_efficient_fp16", "--memory-efficient-fp16"),  # implies
    ({"memory_efficient_bf16": True, "bf16": True}, "memory_efficient_bf16", "--memory-efficient-bf16"),
    ({"precision": "bf16"}, "bf16", "--precision bf16"),
    ({"precision": "bf16", "bf16": True}, "bf16", "--precision bf16"),  # the same precision twice
    ({"precision": "memory_efficient_fp16", "fp16": True}, "memory_efficient_fp16", "--precision memory_efficient_fp16"),
])
def test_which_precision_the_flags_pick(given, name, flag):
    c = common(**given)
    assert conflict(c) is None
    assert chosen(c).name == name and given_flag(c) == flag


@pytest.mark.parametrize("given, message", [
    ({"fp16": True, "bf16": True}, "--bf16 and --fp16 both pick the precision, and differently (bf16 vs fp16)."),
    ({"memory_efficient_fp16": True, "bf16": True},
     "--bf16 and --memory-efficient-fp16 both pick the precision, and differently (bf16 vs memory_efficient_fp16)."),
    ({"amp": True, "memory_efficient_bf16": True},
     "--amp and --memory-efficient-bf16 both pick the precision, and differently (fp16 vs memory_efficient_bf16)."),
    ({"precision": "fp32", "bf16": True},
     "--precision fp32 and --bf16 both pick the precision, and differently (fp32 vs bf16)."),
])
def test_two_flags_that_pick_different_precisions_are_refused_naming_both(given, message):
    expected = message + (" Use one (--precision NAME picks any of fp32, bf16, fp16, memory_efficient_bf16, "
                          "memory_efficient_fp16 by name).")
    assert conflict(common(**given)) == expected
    with pytest.raises(ConfigError) as refused:
        chosen(common(**given))
    assert str(refused.value) == expected


@pytest.mark.flag_effect("--precision")
@pytest.mark.parametrize("argv, compute, storage, policy", [
    ([], None, None, None),
    (["--precision", "bf16"], torch.bfloat16, None, torch.bfloat16),
    (["--precision", "fp16"], torch.float16, None, torch.float16),
    (["--precision", "memory_efficient_bf16"], torch.bfloat16, torch.bfloat16, torch.bfloat16),
    (["--precision", "memory_efficient_fp16"], torch.float16, torch.float16, torch.float16),
    (["--memory-efficient-bf16"], torch.bfloat16, torch.bfloat16, torch.bfloat16),
])
def test_each_precision_has_its_dtypes(argv, compute, storage, policy):
    dtypes = run_dtypes(parse_train_args(["data-bin", *argv]))
    assert (dtypes.compute, dtypes.storage, dtypes.policy.param_dtype) == (compute, storage, policy)
    assert dtypes.policy.reduce_dtype == (torch.float32 if compute else None)  # gradients reduced in fp32


def test_an_unknown_precision_lists_the_choices(capsys):
    with pytest.raises(SystemExit) as refused:
        parse_train_args(["data-bin", "--precision", "bf61"])
    err = " ".join(capsys.readouterr().err.split())
    assert refused.value.code != 0
    assert ("--precision: invalid choice: 'bf61' (choose from 'fp32', 'bf16', 'fp16', 'memory_efficient_bf16', "
            "'memory_efficient_fp16')") in err, err


@pytest.mark.parametrize("fp16, bf16, dtype", [(False, False, torch.float32), (True, False, torch.float16),
                                                (False, True, torch.bfloat16)])
def test_the_inference_commands_flags_are_read_by_the_same_function(fp16, bf16, dtype):
    assert inference_dtype(types.SimpleNamespace(fp16=fp16, bf16=bf16)) == dtype  # no --precision, no --amp there


def test_shard_plan_weighs_the_planned_precisions_each_picked_alone():
    picks = precisions()
    assert list(picks) == ["fp32", "bf16", "fp16"]  # the memory-efficient ones keep whole low-precision models
    cleared = {"common.precision": None, "common.bf16": False, "common.fp16": False, "common.amp": False,
               "common.memory_efficient_bf16": False, "common.memory_efficient_fp16": False}
    assert picks["fp32"] == cleared
    assert picks["bf16"] == {**cleared, "common.bf16": True}
    assert picks["fp16"] == {**cleared, "common.fp16": True}


def test_a_plan_prints_the_flags_that_switch_precision():
    from shardtrain.plan.options import Option
    base = parse_train_args(["data-bin", "--amp"])
    to_bf16 = Option("bf16", tuple(precisions()["bf16"].items()))
    assert flags_to_add(base, to_bf16) == ["--bf16", "(drop --amp)"]
    by_name = Option("by name", (("common.precision", "fp16"), ("common.amp", False)))
    assert flags_to_add(base, by_name) == ["--precision fp16", "(drop --amp)"]
